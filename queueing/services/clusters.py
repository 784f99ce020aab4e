"""Several clusters under one scheduler (docs/clusters.md, rules K1-K8): the cycle's
clusters as one backend (`Fleet`), rule K5, a cluster the scheduler cannot read, and
rule K8, a disabled cluster that drains.

With no `Cluster` row there is one implicit cluster, from settings, exactly as before:
the fleet has one member named "" and node names are the cluster's own. With rows, every
enabled cluster is a member, built from its row (`composition.get_backend`); node names
are qualified "<cluster>/<node>" in the policy (selectors/snapshot.py), and a job's
`cluster` says where its attempt runs.

Rule K5 (docs/scheduling.md, "Clusters and spot capacity"): a cluster whose statuses or
nodes cannot be read this cycle is unreachable. Its nodes leave the snapshot; the other
clusters' cycles go on. Its running jobs are kept (they hold their quota and are charged)
for FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS, then requeued (attempt + 1, reason
`cluster_unreachable`, charged up to when the cluster was last seen, not a failure); its
admitted jobs whose workload was never created go back to the queue at once. When it
answers again, reconcile stops the workloads of attempts fairq has moved on from (they
are unowned), so nothing runs twice. Each cluster's outage and return is an audit entry
(accounts.AuditEntry on the `Cluster` row: readable in the admin's audit log with the
other configuration changes, no table of its own); each affected job gets a
`cluster_unreachable` event.

Rule K8: a disabled cluster drains, as `kubectl drain` does a node: while fairq's jobs
are there it stays a member (`Member.draining`), read every cycle like the others - its
workloads reconciled, its nodes listed, its jobs charged, finishing, failing, requeued
by rules K5, K6 and U3 - but nothing is created there (`clusters_drain` requeues an
admitted job whose workload was never created). That its nodes are offered to no queued
job is the policy's, once (`Snapshot.closed_clusters`, `Snapshot.open_nodes`): the fleet
reports them, so the pages, the API and /metrics show its real capacity and use while
it drains. The cycle that finds no job left there records it drained
(`Cluster.drained_at`, an audit entry `action = "drained"`); from then on it is read no
more. Enabling it again makes it an ordinary member.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar, cast

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Q

from accounts.services import audit_record
from queueing.backends.base import (
    ClusterBackend,
    LaunchSpec,
    NodeInfo,
    Phase,
    PodReading,
    WorkloadStatus,
)
from queueing.composition import get_backend
from queueing.models import Cluster, ClusterBackendKind, Job, JobEvent
from queueing.policy.states import HOLDING_STATES, JobState
from queueing.sanitize import clean_text
from queueing.selectors.cluster import (
    ClusterFacts,
    Reachability,
    clusters_facts,
    node_of_cluster,
)

from .jobs import job_transition, next_attempt
from .usage import usage_record_attempt

log = logging.getLogger(__name__)

UNREACHABLE = "cluster_unreachable"  # the reason word of rule K5 (events, requeues)
# As the cycle's NOT_A_JOB_FAULT (services/scheduler.py): the cycle fails and is retried.
NOT_ONE_JOBS_FAULT: tuple[type[BaseException], ...] = (
    OperationalError, InterfaceError, SoftTimeLimitExceeded)


@dataclass
class Member:
    """One cluster of the cycle: its backend and whether it answered this cycle.
    `draining` (rule K8): disabled, read for the jobs still there but given no new work;
    `live` its workloads listed this cycle that have not ended (counted only for a
    draining member); `drained`: this cycle recorded it drained (read no more, its nodes
    not even for the view this cycle publishes)."""

    name: str  # "" for the one implicit cluster
    backend: ClusterBackend
    facts: ClusterFacts | None = None
    error: str = ""  # why it could not be read this cycle ("" = it answered)
    draining: bool = False
    live: int = 0
    drained: bool = False

    @property
    def reachable(self) -> bool:
        return not self.error


class Fleet:
    """The cycle's clusters as one `ClusterBackend`: what reconcile, the snapshot, the
    utilization step and the cluster view read, merged over the members that answer.

    - `statuses` and `nodes` ask each member; one that raises is unreachable for the
      rest of the cycle (rule K5), recorded, and left out: it never stops the others.
      Nodes carry their `cluster` and, from the node or its pool, `spot` (rule K4).
    - `stop` goes to the cluster that listed the workload this cycle (else to every
      reachable one: a stop of an unknown name is a no-op); `logs` likewise.
    - `submit` is per cluster: `backend_of(cluster_id)` gives the member's backend.
    - A draining member (rule K8: disabled, jobs still there) is read like the others
      (statuses, nodes, K5, readings, stops, logs): its nodes are in `nodes`, with their
      real capacity and use, and the policy offers them to no queued job
      (`Snapshot.closed_clusters`: K8 is applied there, once). Nothing new is created
      there: it is asked about no namespace and nothing is submitted to it. Once this
      cycle recorded it drained (`Member.drained`) it is read no more.
    """

    in_process: ClassVar[bool] = False
    provisions: ClassVar[bool] = False

    def __init__(self, members: Iterable[Member]) -> None:
        self.members: dict[str, Member] = {m.name: m for m in members}
        self._where: dict[str, str] = {}  # workload name -> cluster that listed it
        self._lock = threading.Lock()

    def readings_source(self) -> ClusterBackend:
        """The utilization readings of these clusters as one source that outlives the
        cycle (the utilization step reads a source once a minute, and knows it by
        identity; each cycle opens a new fleet): one per set of backends, per process,
        reading the members the latest fleet found reachable."""
        key = tuple((name, id(m.backend)) for name, m in self.members.items())
        with _sources_lock:
            source = _sources.get(key)
            if source is None:
                source = _sources[key] = _Readings()
            source.fleet = self
        return cast(ClusterBackend, source)

    def plain(self) -> ClusterBackend:
        """The one implicit cluster's own backend, as before there were several (its
        capabilities, e.g. no utilization readings); else this fleet."""
        if not self.several and len(self.members) == 1:
            return next(iter(self.members.values())).backend
        return self

    @property
    def several(self) -> bool:
        """True when the clusters are `Cluster` rows (node names are qualified)."""
        return any(m.facts is not None for m in self.members.values())

    @property
    def submit_concurrency(self) -> int:
        return max((int(getattr(m.backend, "submit_concurrency", 1) or 1)
                    for m in self.members.values()), default=1)

    def reachable(self) -> list[Member]:
        return [m for m in self.members.values() if m.reachable]

    def unreachable(self) -> list[Member]:
        return [m for m in self.members.values() if not m.reachable]

    def unreachable_ids(self) -> frozenset[int]:
        return frozenset(m.facts.id for m in self.unreachable() if m.facts is not None)

    def _failed(self, member: Member, exc: Exception, what: str) -> None:
        """Rule K5: a `Cluster` member is unreachable for the rest of the cycle. The one
        implicit cluster's error escapes, as before there were several: the cycle fails
        and is retried."""
        if member.facts is None:
            raise exc
        member.error = clean_text(f"{what}: {type(exc).__name__}: {exc}", max_length=300)
        log.warning("cluster %s unreachable (%s)", member.name or "default", member.error)

    def backend_of(self, cluster_id: int | None) -> ClusterBackend | None:
        """The backend a job whose `cluster` is `cluster_id` is submitted to; None when
        that cluster is unreachable, draining (rule K8: nothing new is created there) or
        not a member (disabled and drained, or none recorded while there are several)."""
        for m in self.members.values():
            if (m.facts.id if m.facts is not None else None) == cluster_id:
                return m.backend if m.reachable and not m.draining else None
        return None

    def draining(self) -> list[Member]:
        """Rule K8: the disabled members still read for the jobs they hold."""
        return [m for m in self.members.values() if m.draining]

    def statuses(self, *, now: datetime) -> list[WorkloadStatus]:
        out: list[WorkloadStatus] = []
        where: dict[str, str] = {}
        for m in self.reachable():
            try:
                got = list(m.backend.statuses(now=now))
            except NOT_ONE_JOBS_FAULT:
                raise
            except Exception as exc:  # rule K5: this cluster only
                self._failed(m, exc, "listing its workloads")
                continue
            if len(self.members) > 1:
                for s in got:
                    try:  # a status is cluster input: cleaned later, never trusted here
                        name = s.name
                    except Exception:
                        continue
                    if isinstance(name, str):
                        where[name] = m.name
            if m.draining:
                m.live = sum(1 for s in got if _not_ended(s))
            out.extend(got)
        with self._lock:
            self._where = where
        return out

    def nodes(self) -> list[NodeInfo]:
        """Every reachable member's nodes, a draining one's too (rule K8 is the policy's:
        `Snapshot.open_nodes`); not those of a member drained this cycle."""
        out: list[NodeInfo] = []
        for m in self.reachable():
            if m.drained:  # rule K8: drained, read no more
                continue
            try:
                got = m.backend.nodes()
            except NOT_ONE_JOBS_FAULT:
                raise
            except Exception as exc:  # rule K5: this cluster only
                self._failed(m, exc, "listing its nodes")
                continue
            out.extend(_node_of(m, n) for n in got)
        return out

    def _route(self, name: str) -> list[Member]:
        with self._lock:
            at = self._where.get(name)
        if at is not None and at in self.members:
            return [self.members[at]]
        return self.reachable()

    def stop(self, name: str, *, now: datetime) -> None:
        """Stop `name` where it runs; not knowing where, on every reachable cluster
        (each is asked even when one raises; the first error is raised after, so the
        caller's retry covers a cluster that did not answer)."""
        error: Exception | None = None
        for m in self._route(name):
            try:
                m.backend.stop(name, now=now)
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def submit(self, spec: LaunchSpec, *, now: datetime) -> None:
        """Only for the one implicit cluster: with several, a job goes to its own
        (`backend_of`)."""
        if len(self.members) != 1:
            raise RuntimeError("submit on a fleet of several clusters: use backend_of()")
        next(iter(self.members.values())).backend.submit(spec, now=now)

    def logs(self, name: str, *, tail: int = 100) -> str:
        """`name`'s logs from the cluster that has them ("" when none has; an error only
        when no cluster answered)."""
        error: Exception | None = None
        answered = False
        for m in self._route(name):
            try:
                text = m.backend.logs(name, tail=tail)
            except Exception as exc:
                error = error or exc
                continue
            answered = True
            if text:
                return text
        if error is not None and not answered:
            raise error
        return ""

    def readings(self, *, now: datetime) -> list[PodReading]:
        """The utilization readings of the members that give them (rules U1-U5)."""
        out: list[PodReading] = []
        for m in self.reachable():
            read = getattr(m.backend, "readings", None)
            if callable(read):
                out.extend(read(now=now))
        return out

    def unprovisioned_teams(self, teams: Iterable[str]) -> set[str]:
        """Teams whose namespace is missing on any reachable member that provisions."""
        wanted, out = set(teams), set()
        for m in self.reachable():
            if m.draining:  # rule K8: no queued job goes there
                continue
            ask = getattr(m.backend, "unprovisioned_teams", None)
            if ask is not None:
                out |= set(ask(wanted))
        return out

    def reachability(self, *, now: datetime,
                     since: Mapping[str, datetime] | None = None) -> list[Reachability]:
        """Per member, for the published cluster view (rule K5); `since`: when each
        unreachable one went away (`Outages.since`), else now."""
        return [Reachability(m.name, m.reachable,
                             None if m.reachable else (since or {}).get(m.name, now),
                             now if m.reachable else None, m.error)
                for m in self.members.values() if m.facts is not None]


class _Readings:
    """`Fleet.readings_source`'s object: the latest fleet's readings."""

    fleet: Fleet | None = None

    def readings(self, *, now: datetime) -> list[PodReading]:
        return self.fleet.readings(now=now) if self.fleet is not None else []


_sources_lock = threading.Lock()
_sources: dict[tuple[tuple[str, int], ...], _Readings] = {}


def _node_of(member: Member, node: NodeInfo) -> NodeInfo:
    """A member's node as the fleet reports it (`node_of_cluster`); the one implicit
    cluster's as its backend does."""
    if member.facts is None:
        return node
    return node_of_cluster(node, cluster=member.name, facts=member.facts)


def cycle_clusters() -> list[Cluster]:
    """The `Cluster` rows the cycle reads, by rule K2's order (cost rank, then name): the
    enabled ones and the disabled ones not drained yet (rule K8); [] = the one implicit
    cluster of settings."""
    return list(Cluster.objects.filter(Q(enabled=True) | Q(drained_at__isnull=True))
                .order_by("cost_rank", "name"))


def fleet_open(*, backend: ClusterBackend | None = None,
               backends: Mapping[str, ClusterBackend] | None = None,
               in_process_only: bool = False) -> Fleet:
    """This cycle's clusters. No `Cluster` row to read: the implicit cluster, `backend`
    (a test's) or the configured one. Else every enabled row, and every disabled one
    not drained yet as a draining member (rule K8), with the backend `backends` names
    for it (tests) or the one built from the row. `in_process_only`: only the simulated
    clusters (a web process, which is no cluster client, reading the in-process ones'
    logs)."""
    rows = cycle_clusters()
    if not rows:
        return Fleet([Member("", backend or get_backend())])
    if in_process_only:
        rows = [r for r in rows if r.backend == ClusterBackendKind.SIMULATED]
    facts = clusters_facts()
    given = backends or {}
    return Fleet(Member(row.name, given.get(row.name) or get_backend(row), facts[row.pk],
                        draining=not row.enabled)
                 for row in rows)


def _not_ended(status: object) -> bool:
    """Whether a (raw) workload status is of a workload still running or starting: not
    finished and not on its way out. A status that cannot be read counts as running."""
    try:
        return (getattr(status, "finished_at", None) is None
                and getattr(status, "phase", None) not in (Phase.SUCCEEDED, Phase.FAILED)
                and not getattr(status, "stopping", False))
    except Exception:
        return True


# --- rule K5 ---------------------------------------------------------------------------------

@dataclass
class Outages:
    """What rule K5 did this cycle."""

    requeued: list[int] = field(default_factory=list)
    # Per unreachable cluster's name, when it was first found unreachable.
    since: dict[str, datetime] = field(default_factory=dict)


def clusters_record(*, fleet: Fleet, now: datetime) -> Outages:
    """Step 1c of the cycle (after reconcile read every member): each cluster's
    `last_seen_at` / `unreachable_since`, with an audit entry when one goes away or comes
    back and a `cluster_unreachable` event on each job it holds when it goes away; then
    rule K5's requeues. Returns the unreachable clusters (since when) and the requeued
    jobs."""
    out = Outages()
    if not fleet.several:
        return out
    seen = [m.facts.id for m in fleet.reachable() if m.facts is not None]
    if seen:
        for row in Cluster.objects.filter(pk__in=seen, unreachable_since__isnull=False):
            with transaction.atomic():
                if Cluster.objects.filter(pk=row.pk, unreachable_since=row.unreachable_since
                                          ).update(unreachable_since=None, last_seen_at=now):
                    audit_record(actor=None, action="reachable", instance=row, changes={
                        "unreachable_since": [row.unreachable_since.isoformat()
                                              if row.unreachable_since else None, None]})
                    log.info("cluster %s answers again (unreachable since %s)", row.name,
                             row.unreachable_since)
        Cluster.objects.filter(pk__in=seen).update(last_seen_at=now)
    for m in fleet.unreachable():
        assert m.facts is not None  # several clusters: every member is a row
        row = Cluster.objects.get(pk=m.facts.id)
        if row.unreachable_since is None:
            with transaction.atomic():
                if Cluster.objects.filter(pk=row.pk, unreachable_since__isnull=True).update(
                        unreachable_since=now):
                    audit_record(actor=None, action="unreachable", instance=row, changes={
                        "unreachable_since": [None, now.isoformat()],
                        "error": [None, m.error]})
                    _tell_jobs(row, since=now, error=m.error)
            row.unreachable_since = now
        out.since[row.name] = row.unreachable_since
        out.requeued.extend(_requeue_from(row, now=now))
    return out


def _tell_jobs(cluster: Cluster, *, since: datetime, error: str) -> None:
    """A `cluster_unreachable` event on every job the cluster holds, once per outage."""
    grace = settings.FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS
    JobEvent.objects.bulk_create(
        JobEvent(job_id=pk, at=since, kind=JobEvent.Kind.CLUSTER_UNREACHABLE,
                 actor_label="scheduler", attempt=attempt,
                 reason=clean_text(f"cluster {cluster.name} cannot be read since "
                                   f"{since.isoformat()}; this job is kept for {grace} s, "
                                   "then requeued", max_length=500),
                 data={"cluster": cluster.name, "since": since.isoformat(), "error": error})
        for pk, attempt in Job.objects.filter(
            cluster=cluster, status__in=(JobState.ADMITTED, JobState.RUNNING)
        ).values_list("pk", "attempt"))


def _requeue_from(cluster: Cluster, *, now: datetime) -> list[int]:
    """Rule K5 for one unreachable cluster: its admitted jobs never created there go back
    at once; past the grace, every job it holds goes back, charged up to when it was
    last seen. Each job in its own savepoint (one that cannot move stays for the next
    cycle)."""
    since = cluster.unreachable_since or now
    grace = timedelta(seconds=settings.FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS)
    holding = Job.objects.filter(cluster=cluster,
                                 status__in=(JobState.ADMITTED, JobState.RUNNING))
    if now - since < grace:
        holding = holding.filter(status=JobState.ADMITTED,
                                 submitted_to_backend_at__isnull=True)
    last_seen = cluster.last_seen_at or since
    requeued: list[int] = []
    for job in holding.select_related("gpu_type").order_by("id"):
        ran_since = job.started_at if job.state == JobState.RUNNING else None
        created = job.submitted_to_backend_at is not None
        why = (f"its cluster {cluster.name} cannot be read since {since.isoformat()} "
               + (f"(more than {int(grace.total_seconds())} s)" if created
                  else "and its workload was never created there"))
        data = {"ended_how": UNREACHABLE, "cluster": cluster.name, "since": since.isoformat()}
        try:
            with transaction.atomic():
                if ran_since is not None:
                    # Rule S1's path for a running job: RUNNING -> PREEMPTED -> QUEUED
                    # (as rule U3's reclaim); charged up to when the cluster was last
                    # seen, what fairq knows ran. Not a failure: no retry is spent.
                    if not job_transition(job, JobState.PREEMPTED, now=now, data=data,
                                          reason=why):
                        continue
                    usage_record_attempt(job=job, start=ran_since,
                                         end=max(ran_since, last_seen))
                if not job_transition(
                    job, JobState.QUEUED, now=now, reason=f"{why}; requeued", data=data,
                    **next_attempt(job.attempt + 1),
                ):
                    continue
                JobEvent.objects.create(
                    job=job, at=now, kind=JobEvent.Kind.CLUSTER_UNREACHABLE,
                    actor_label="scheduler", attempt=job.attempt,
                    reason=clean_text(f"{why}; requeued as attempt {job.attempt}",
                                      max_length=500),
                    data={**data, "requeued": True,
                          "charged_until": last_seen.isoformat() if ran_since else None})
            requeued.append(job.pk)
        except NOT_ONE_JOBS_FAULT:
            raise
        except Exception:  # this job stays for the next cycle; the others move
            log.exception("cluster %s: could not requeue job %s", cluster.name, job.pk)
    return requeued



# --- rule K8 ---------------------------------------------------------------------------------

DISABLED = "cluster_disabled"  # the reason word of rule K8 (requeues)


def clusters_drain(*, fleet: Fleet, now: datetime) -> list[int]:
    """Step 1d of the cycle (after reconcile and rule K5): rule K8 for each draining
    member (a disabled cluster not drained yet). Its admitted jobs whose workload was
    never created there go back to the queue at once (creating it would be new work
    there). Then, when no job holds it any more and it lists no workload still running
    (or it cannot be read: its workloads cannot be checked, and no job is left to wait
    for), it is drained: `drained_at` set, with an audit entry (`action = "drained"`),
    once per disable (the row must still be disabled and not drained); from the next
    cycle on it is read no more. Returns the requeued jobs."""
    requeued: list[int] = []
    if fleet.several:
        # An enabled cluster is never drained: `Cluster.save` clears `drained_at` when one
        # is enabled; this catches a bulk `update()` before it is disabled again.
        Cluster.objects.filter(enabled=True, drained_at__isnull=False).update(drained_at=None)
    for m in fleet.draining():
        assert m.facts is not None  # several clusters: every member is a row
        requeued.extend(_requeue_uncreated(m, now=now))
        if m.reachable and m.live:
            continue  # a workload of an ended job still stops (reconcile stopped it)
        if Job.objects.filter(cluster_id=m.facts.id,
                              status__in=sorted(HOLDING_STATES)).exists():
            continue
        with transaction.atomic():
            if Cluster.objects.filter(pk=m.facts.id, enabled=False,
                                      drained_at__isnull=True).update(drained_at=now):
                changes: dict[str, list[object]] = {"drained_at": [None, now.isoformat()]}
                if m.error:  # drained unread: its last jobs were requeued by rule K5
                    changes["error"] = [None, m.error]
                audit_record(actor=None, action="drained",
                             instance=Cluster.objects.get(pk=m.facts.id), changes=changes)
                log.info("cluster %s drained: disabled, no job left there", m.name)
                m.drained = True
    return requeued


def _requeue_uncreated(member: Member, *, now: datetime) -> list[int]:
    """Rule K8: a draining cluster's admitted jobs whose workload was never created there
    back to the queue as their next attempt (reason `cluster_disabled`; nothing ran, so
    nothing is charged), each in its own savepoint (one that cannot move stays for the
    next cycle)."""
    assert member.facts is not None
    requeued: list[int] = []
    for job in Job.objects.filter(cluster_id=member.facts.id, status=JobState.ADMITTED,
                                  submitted_to_backend_at__isnull=True).order_by("id"):
        why = (f"its cluster {member.name} is disabled (rule K8: it takes no new work) and "
               "its workload was never created there; requeued")
        try:
            with transaction.atomic():
                if job_transition(job, JobState.QUEUED, now=now, reason=why,
                                  data={"ended_how": DISABLED, "cluster": member.name},
                                  **next_attempt(job.attempt + 1)):
                    requeued.append(job.pk)
        except NOT_ONE_JOBS_FAULT:
            raise
        except Exception:  # this job stays for the next cycle; the others move
            log.exception("cluster %s: could not requeue job %s", member.name, job.pk)
    return requeued
