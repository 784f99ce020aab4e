"""Step 2 of the cycle (queueing/services/scheduler.py): everything the policy needs,
read once into its `Snapshot`. The cycle builds it from its backend; web processes, for
the cached queue plan (queueing/selectors/queue_plan.py), from the published cluster
view. Reads only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, F

from accounts.models import Team
from queueing.backends.base import ClusterBackend
from queueing.models import GpuType, Job, JobArray, Quota
from queueing.policy.dependencies import Counts, Dependency, parse_dependencies
from queueing.policy.fairshare import FairShareState
from queueing.policy.settings import PolicySettings
from queueing.policy.snapshot import (
    FlavorFallback,
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
    Topology,
    TopologyMode,
)
from queueing.policy.states import JobState
from queueing.policy.workspace import replica_slots

from . import active_jobs
from .active_jobs import ActiveJobs, JobRow, Lookups, TierFacts, gc_paused
from .cluster import ClusterFacts, ClusterView
from .fairshare import (
    entry_penalty_interval_seconds,
    fairshare_standings,
    half_life_hours,
    priority_weights,
)
from .preemption import nominations, preemption_policy, preemption_settings
from .reservations import snapshot_bookings

log = logging.getLogger(__name__)


def policy_settings() -> PolicySettings:
    """The one settings object of the policy (queueing/policy/settings.py) as the service
    runs it: its defaults overridden by the FAIRQ_* settings, billing weights per GPU type
    from the database. What the simulator takes to replay this service."""
    return PolicySettings(
        half_life_hours=half_life_hours(),
        interval_seconds=entry_penalty_interval_seconds(),
        cycle_seconds=float(settings.FAIRQ_CYCLE_INTERVAL_SECONDS),
        priority=priority_weights(),
        billing_weights=dict(GpuType.objects.values_list("slug", "billing_weight")),
        preemption=preemption_policy(),
    )


def unprovisioned_teams(backend: ClusterBackend | ClusterView, *,
                        jobs: ActiveJobs | None = None) -> set[str]:
    """Teams with queued jobs whose namespace is not provisioned (FAIRQ_K8S_PROVISION=
    separate): their jobs stay out of the plan and wait with that reason. A backend
    without the notion (the simulated cluster) provisions nothing. `jobs`: the active
    jobs already read (the cycle's), else the teams are queried."""
    ask = getattr(backend, "unprovisioned_teams", None)
    if ask is None:
        return set()
    if jobs is not None:
        names = jobs.lookups.teams
        teams = {names.get(r.team_id, "") for r in jobs.queued.values()} - {""}
    else:
        teams = set(Job.objects.filter(status=JobState.QUEUED)
                    .values_list("team__slug", flat=True).distinct())
    return set(ask(teams)) if teams else set()


def build_snapshot(*, backend: ClusterBackend | ClusterView, now: datetime,
                   live_workloads: set[str] | None = None,
                   unprovisioned: set[str] | None = None,
                   odd_rows: dict[int, Exception] | None = None,
                   jobs: ActiveJobs | None = None) -> Snapshot:
    """Step 2: everything the policy needs, read once (a handful of queries). Web
    processes pass the published `ClusterView` as the backend
    (queueing/selectors/cluster.py). `jobs`: the active jobs, refreshed by the caller
    (the cycle keeps them between cycles: queueing/selectors/active_jobs.py); without
    them every active job is read here.

    A job row the policy cannot take (a placement that is not a list of node names, no
    GPUs) is left out and reported in `odd_rows` (job id -> why), never raised: the
    cycle fails those jobs, other callers just do without them."""
    odd = odd_rows if odd_rows is not None else {}
    if jobs is None:
        jobs = ActiveJobs()
        jobs.refresh()
    if unprovisioned is None:
        unprovisioned = unprovisioned_teams(backend, jobs=jobs)
    if live_workloads is None:
        live_workloads = (set(backend.workloads) if isinstance(backend, ClusterView)
                          else {s.name for s in backend.statuses(now=now)})
    queued_all, running = policy_jobs(jobs, odd)
    # The cluster counts what it runs; jobs admitted but not yet submitted hold their
    # planned placement on top of that.
    pending_alloc: dict[str, int] = defaultdict(int)
    pending_cpu: dict[str, int] = defaultdict(int)
    pending_memory: dict[str, int] = defaultdict(int)
    holding = jobs.holding
    for r in running:
        if holding[r.id].submitted_to_backend_at is None:
            for node in r.nodes:
                pending_alloc[node] += r.gpus_per_replica
                pending_cpu[node] += r.cpu_millicores or 0
                pending_memory[node] += r.memory_bytes or 0
    lookups = jobs.lookups
    infos = backend.nodes()
    gpu_free: dict[str, tuple[int, ...]] = {}
    if lookups.units:
        packed = {qualified_node(n.cluster, n.name): (n.capacity, lookups.units[n.gpu_type][1])
                  for n in infos if lookups.packs_slices(n.gpu_type)}
        if packed:
            if active_jobs.LEGACY:
                running, gpu_free = packed_gpus(running, packed)
            else:  # the same, kept between cycles (held to `packed_gpus` by a test)
                if jobs.packed is None:
                    jobs.packed = KeptPackedGpus()
                running, gpu_free = jobs.packed(running, packed)
    nodes = tuple(
        NodeState(name, n.gpu_type, n.capacity,
                  max(0, n.capacity - n.allocated - pending_alloc[name]),
                  cpu_free=_minus(n.cpu_free, pending_cpu[name]),
                  memory_free=_minus(n.memory_free, pending_memory[name]),
                  topology=n.topology, cpu_allocatable=n.cpu_millicores,
                  memory_allocatable=n.memory_bytes, cluster=n.cluster, spot=n.spot,
                  pool=n.pool,
                  slices_per_gpu=lookups.units[n.gpu_type][1] if name in gpu_free else 1,
                  gpu_free=gpu_free.get(name, ()))
        for n in infos
        for name in (qualified_node(n.cluster, n.name),)
    )
    queued = (tuple(q for q in queued_all if q.team not in unprovisioned) if unprovisioned
              else queued_all)
    if odd:
        log.warning("snapshot: left out %d job rows the policy cannot take: %s", len(odd),
                    ", ".join(str(pk) for pk in sorted(odd)[:20]))
    quotas = {
        (q["team__slug"], q["gpu_type__slug"]): quota_in_units(
            q["nominal"], q["borrowing_limit"], q["lending_limit"],
            lookups.units_per_device(q["gpu_type__slug"]))
        for q in Quota.objects.values("team__slug", "gpu_type__slug", "nominal",
                                      "borrowing_limit", "lending_limit")
    }
    standings = fairshare_standings(now=now, jobs=jobs)
    interval = entry_penalty_interval_seconds()
    # Rule R8 must see the workloads the cluster lists: the cycle's own, or for the web
    # (explain, dashboard, preview) the ones the last cycle published.
    nominated, placements = nominations(now=now, live_workloads=live_workloads)
    # Rule K2's ranks, for a policy that takes them (`Snapshot.cluster_ranks`;
    # docs/clusters.md); a policy without the field places ignoring them.
    ranks: dict[str, Any] = {}
    if jobs.lookups.clusters and "cluster_ranks" in getattr(Snapshot, "__dataclass_fields__",
                                                            {}):
        ranks["cluster_ranks"] = {c.name: c.cost_rank for c in jobs.lookups.clusters.values()}
    return Snapshot(
        now=now, nodes=nodes, queued=queued, running=running, quotas=quotas,
        fair_share={team: s.factor for team, s in standings.items()},
        fair_share_state=FairShareState.from_standings(standings),
        priority_weights=priority_weights(),
        billing_weights=dict(GpuType.objects.values_list("slug", "billing_weight")),
        interval_seconds=interval,
        nominated=nominated,
        nominated_placement=placements,
        preemption=tier_preemption(preemption_settings(now=now), jobs.lookups),
        dependency_counts=dependency_counts(d for q in queued for d in q.dependencies),
        array_limits=array_limits({q.array_id for q in queued} - {None}),
        closed_clusters=closed_clusters(jobs.lookups.clusters),
        flavor_fallback=flavor_fallbacks(queued, jobs.lookups),
        flavor_fallback_default=FlavorFallback.BORROW,
        units_per_gpu={t: s for t, (_, s) in lookups.units.items()},
        team_parent=team_parents(),
        # Booked GPUs (docs/reservations.md): the live reservations' windows within
        # FAIRQ_BOOKING_HORIZON_HOURS, in the type's units, and rule W4's lending tiers.
        bookings=snapshot_bookings(now=now),
        lend_tiers=frozenset(t.rank for t in lookups.tiers.values() if t.preemptible),
        **ranks,
    )


def team_parents() -> dict[str, str | None]:
    """Every team's parent (its department) by slug, None at the top level: the forest
    of rule F4 that the quota tree reads too (rules Q3-Q7). One query."""
    return dict(Team.objects.values_list("slug", "parent__slug"))


def quota_in_units(nominal: int, borrowing: int | None, lending: int | None,
                   per_device: int) -> QuotaLimit:
    """Rule H4: a quota row (in devices: GPUs, MIG instances) in the policy's units."""
    if per_device == 1:
        return QuotaLimit(nominal, borrowing, lending)
    return QuotaLimit(nominal * per_device,
                      None if borrowing is None else borrowing * per_device,
                      None if lending is None else lending * per_device)


def packed_gpus(running: tuple[RunningJob, ...], nodes: Mapping[str, tuple[int, int]]
                ) -> tuple[tuple[RunningJob, ...], dict[str, tuple[int, ...]]]:
    """Rule H1: each slice-packed node's free slices per GPU (`nodes`: name -> (capacity
    in slices, slices per GPU)), less what the running (and admitted) jobs hold there: a
    fraction its slices on the GPU its `gpu_slots` name, whole GPUs all of theirs. A
    job whose GPUs are not recorded (admitted before they were, or its pods moved) is
    put where the plan would put it - a fraction on the shared GPU with the fewest free
    slices that holds it, whole GPUs on the lowest wholly free ones - and the running
    jobs are returned with those GPUs, so a preemption frees them where they are taken
    to be (rule H6). The node's own free count still bounds its GPUs
    (`policy/workspace.py::per_gpu_free`)."""
    free = {name: [s] * (cap // s) for name, (cap, s) in nodes.items()}
    unknown: list[tuple[int, int, int, str]] = []  # (-units, job index, replica, node)
    per_job: dict[int, list[tuple[int, ...]]] = {}
    for index, r in enumerate(running):
        if not any(n in free for n in r.nodes):
            continue
        per = per_job[index] = replica_slots(r.gpu_slots, len(r.nodes))
        for k, name in enumerate(r.nodes):
            if name not in free:
                continue
            s = nodes[name][1]
            if not per[k]:
                unknown.append((-r.gpus_per_replica, index, k, name))
                continue
            each = r.gpus_per_replica if r.gpus_per_replica < s else s
            for i in per[k]:
                if 0 <= i < len(free[name]):
                    free[name][i] = max(0, free[name][i] - each)
    for neg, index, k, name in sorted(unknown):
        per_job[index][k] = _take_gpus(free[name], nodes[name][1], -neg)
    return _with_slots(running, per_job), {name: tuple(f) for name, f in free.items()}


def _with_slots(running: Sequence[RunningJob],
                per_job: Mapping[int, list[tuple[int, ...]]]) -> tuple[RunningJob, ...]:
    """`running` with the slots found per replica (`per_job`, by index) written where every
    replica got as many as the others."""
    out = list(running)
    for index, per in per_job.items():
        r = running[index]
        slots = tuple(i for replica in per for i in replica)
        if slots != r.gpu_slots and all(per) and len({len(x) for x in per}) == 1:
            out[index] = dataclasses.replace(r, gpu_slots=slots)
    return tuple(out)


class KeptPackedGpus:
    """`packed_gpus` kept between cycles (`ActiveJobs.packed`): the slices each running
    job whose GPUs are recorded takes on each GPU, summed per GPU, and brought up to
    date from the jobs that changed - a job's `RunningJob` is the same object until its
    row changes (`policy_jobs`' memo), so one identity check a job is the whole cost of
    an unchanged one. A sum per GPU, not the running difference: `packed_gpus`' free
    slices `max(0, max(0, s - a) - b)` are `max(0, s - (a + b))`. The jobs whose GPUs
    are not recorded are placed anew every call, as `packed_gpus` places them. Held to
    `packed_gpus` by tests/test_cycle_fleet.py."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[int, int]] = {}
        self.used: dict[str, list[int]] = {}
        # job id -> (its RunningJob, the (node, GPU, slices) it takes, its replicas whose
        # GPUs are not recorded as (-units, replica, node))
        self.took: dict[int, tuple[RunningJob, tuple[tuple[str, int, int], ...],
                                   tuple[tuple[int, int, str], ...]]] = {}

    def __call__(self, running: tuple[RunningJob, ...], nodes: Mapping[str, tuple[int, int]]
                 ) -> tuple[tuple[RunningJob, ...], dict[str, tuple[int, ...]]]:
        if nodes != self.nodes:
            self.nodes = dict(nodes)
            self.used = {name: [0] * (cap // s) for name, (cap, s) in nodes.items()}
            self.took = {}
        used, old = self.used, self.took
        took: dict[int, Any] = {}
        unknown: list[tuple[int, int, int, str]] = []  # (-units, job index, replica, node)
        for index, r in enumerate(running):
            entry = old.pop(r.id, None)
            if entry is None or entry[0] is not r:
                if entry is not None:
                    self._take(entry[1], -1)
                entry = self._parts(r)
                self._take(entry[1], 1)
            took[r.id] = entry
            for neg, k, name in entry[2]:
                unknown.append((neg, index, k, name))
        for entry in old.values():  # no longer running
            self._take(entry[1], -1)
        self.took = took
        free = {name: [s - u if u < s else 0 for u in used[name]]
                for name, (_, s) in self.nodes.items()}
        if not unknown:
            return running, {name: tuple(f) for name, f in free.items()}
        per_job: dict[int, list[tuple[int, ...]]] = {}
        for neg, index, k, name in sorted(unknown):
            r = running[index]
            per = per_job.get(index)
            if per is None:
                per = per_job[index] = replica_slots(r.gpu_slots, len(r.nodes))
            per[k] = _take_gpus(free[name], nodes[name][1], -neg)
        return _with_slots(running, per_job), {name: tuple(f) for name, f in free.items()}

    def _parts(self, r: RunningJob) -> tuple[RunningJob, tuple[tuple[str, int, int], ...],
                                              tuple[tuple[int, int, str], ...]]:
        used = self.used
        if not any(n in used for n in r.nodes):
            return r, (), ()
        per = replica_slots(r.gpu_slots, len(r.nodes))
        parts: list[tuple[str, int, int]] = []
        unknown: list[tuple[int, int, str]] = []
        for k, name in enumerate(r.nodes):
            if name not in used:
                continue
            s = self.nodes[name][1]
            if not per[k]:
                unknown.append((-r.gpus_per_replica, k, name))
                continue
            each = r.gpus_per_replica if r.gpus_per_replica < s else s
            parts.extend((name, i, each) for i in per[k] if 0 <= i < len(used[name]))
        return r, tuple(parts), tuple(unknown)

    def _take(self, parts: tuple[tuple[str, int, int], ...], sign: int) -> None:
        used = self.used
        for name, i, each in parts:
            used[name][i] += sign * each


def _take_gpus(free: list[int], s: int, units: int) -> tuple[int, ...]:
    """Rule H3's choice for a replica of `units` slices whose GPUs are not recorded,
    taken off `free`: its GPU indexes (() when nothing holds it: the node's free count
    says the rest)."""
    if units < s:
        fit = [(f == s, f, i) for i, f in enumerate(free) if units <= f]
        if not fit:
            return ()
        i = min(fit)[2]
        free[i] -= units
        return (i,)
    whole = [i for i, f in enumerate(free) if f >= s][:-(-units // s)]
    if len(whole) < -(-units // s):
        return ()
    for i in whole:
        free[i] = 0
    return tuple(whole)


def flavor_fallbacks(queued: Iterable[QueuedJob], lookups: Lookups
                     ) -> dict[tuple[str, int], FlavorFallback]:
    """`Snapshot.flavor_fallback` for the queued jobs accepting several GPU types: per
    (team, tier rank), the team's setting when it has one, else the tier's."""
    by_rank = {t.rank: t.flavor_fallback for t in lookups.tiers.values()}
    out: dict[tuple[str, int], FlavorFallback] = {}
    for q in queued:
        key = (q.team, q.tier_rank)
        if not q.gpu_types or key in out:
            continue
        chosen = lookups.team_fallbacks.get(q.team) or by_rank.get(q.tier_rank, "")
        try:
            out[key] = FlavorFallback(chosen)
        except ValueError:
            out[key] = FlavorFallback.BORROW
    return out


def accepted_types(row: JobRow, lookups: Lookups) -> tuple[str, tuple[str, ...]]:
    """A queued job's GPU type and `QueuedJob.gpu_types`: its accepted types still known
    (a type deleted since is left out), most preferred first, the first as its type; ()
    for one type. A job of one type (or whose list is gone) keeps its row's type. The
    row's `gpu_type` of a requeued job is the type its last attempt ran on: the plan
    starts again from the first accepted."""
    own = lookups.gpu_types[row.gpu_type_id]
    listed = row.gpu_types if isinstance(row.gpu_types, list) else []
    if len(listed) < 2:
        return own, ()
    known = set(lookups.gpu_types.values())
    types = tuple(t for t in listed if isinstance(t, str) and t in known)
    if not types:
        return own, ()
    return types[0], (types if len(types) > 1 else ())


def qualified_node(cluster: str, node: str) -> str:
    """A node's name in the policy (docs/clusters.md, "Naming"): "<cluster>/<node>" when
    it belongs to a `Cluster` row, so names are unique across clusters; as the cluster
    names it for the one implicit cluster ("")."""
    return f"{cluster}/{node}" if cluster else node


def unqualified_node(name: str) -> tuple[str, str]:
    """`qualified_node` undone: (cluster, node); ("", name) for the implicit cluster.
    (A cluster name is a slug, never a "/"; a Kubernetes node name never has one.)"""
    cluster, sep, node = name.partition("/")
    return (cluster, node) if sep else ("", name)


def allowed_clusters(row: JobRow, clusters: Mapping[int, ClusterFacts]
                     ) -> frozenset[str] | None:
    """Rule K3: the clusters a queued job may run in: its pin (`requested_cluster`),
    enabled or not, else the enabled clusters carrying every label of its
    `cluster_selector`; None (any) with no `Cluster` row, or with neither a pin nor a
    selector. A pin on a disabled cluster stays its one cluster, so its wait can say the
    cluster is disabled (rule K8: `Snapshot.closed_clusters`); an empty set means none
    can take it (a selector no enabled cluster matches, or a pin whose cluster does not
    carry the selector): it waits."""
    if not clusters:
        return None
    selector = row.cluster_selector if isinstance(row.cluster_selector, dict) else {}
    if row.requested_cluster_id is None and not selector:
        return None
    if row.requested_cluster_id is not None:
        candidates = [c for c in clusters.values() if c.id == row.requested_cluster_id]
    else:
        candidates = [c for c in clusters.values() if c.enabled]
    return frozenset(c.name for c in candidates
                     if c.carries({str(k): str(v) for k, v in selector.items()}))


def closed_clusters(clusters: Mapping[int, ClusterFacts]) -> frozenset[str]:
    """Rule K8: the names of the clusters that take no new work (the disabled ones)."""
    return frozenset(c.name for c in clusters.values() if not c.enabled)


def dependency_counts(deps: Iterable[Dependency]) -> dict[tuple[str, int], Counts]:
    """Rules D1-D2: the states of the jobs and arrays `deps` name, counted per state (three
    queries at most; an array of 10,000 members is a few rows). An array's members not
    yet written as rows count as QUEUED, as CANCELLED once cancelled: "every
    member" is not met while one is unwritten."""
    jobs: set[int] = set()
    arrays: set[int] = set()
    for d in deps:
        if d.array is not None:
            arrays.add(d.array)
        elif d.job is not None:
            jobs.add(d.job)
    out: dict[tuple[str, int], dict[str, int]] = {}
    if jobs:
        for pk, state in Job.objects.filter(pk__in=jobs).values_list("pk", "status"):
            out[("job", pk)] = {state: 1}
    if arrays:
        for array_id, state, n in (Job.objects.order_by().filter(array_id__in=arrays)
                                   .values_list("array_id", "status")
                                   .annotate(n=Count("id")).values_list("array_id", "status", "n")):
            out.setdefault(("array", array_id), {})[state] = n
        for array_id, count, written, rest_cancelled in (
                JobArray.objects.filter(pk__in=arrays, materialized__lt=F("count"))
                .values_list("pk", "count", "materialized", "rest_cancelled_at")):
            state = JobState.QUEUED if rest_cancelled is None else JobState.CANCELLED
            counts = out.setdefault(("array", array_id), {})
            counts[state.value] = counts.get(state.value, 0) + count - written
    return dict(out)


def array_limits(array_ids: set[Any]) -> dict[int, int]:
    """Rule A8: the concurrency limit of each of these arrays that has one."""
    if not array_ids:
        return {}
    return {pk: n for pk, n in JobArray.objects.filter(pk__in=array_ids,
                                                       max_running__isnull=False)
            .values_list("pk", "max_running") if n is not None}


def policy_jobs(jobs: ActiveJobs, odd: dict[int, Exception]
                ) -> tuple[tuple[QueuedJob, ...], tuple[RunningJob, ...]]:
    """The policy's queued and running jobs of `jobs`; a row it cannot take goes to
    `odd`. Each is built once per version of its row (`jobs.memo`; all again when a
    team, GPU type or tier the rows point at changed)."""
    memo = jobs.memo
    if memo.get(_LOOKUPS) != jobs.lookups:
        memo.clear()
        memo[_LOOKUPS] = jobs.lookups
    queued: list[QueuedJob] = []
    running: list[RunningJob] = []
    with gc_paused():
        return _policy_jobs(jobs, odd, memo, queued, running)


def _policy_jobs(jobs: ActiveJobs, odd: dict[int, Exception], memo: dict[int, Any],
                 queued: list[QueuedJob], running: list[RunningJob]
                 ) -> tuple[tuple[QueuedJob, ...], tuple[RunningJob, ...]]:
    lookups = jobs.lookups
    for rows, build, out in ((jobs.queued, _queued_job, queued),
                             (jobs.holding, _running_job, running)):
        for pk, row in rows.items():
            made = memo.get(pk)
            if made is None:
                try:
                    made = build(row, lookups, jobs)
                except (ValueError, KeyError) as exc:
                    made = exc if isinstance(exc, ValueError) else ValueError(
                        f"it points at a row that is gone: {exc}")
                memo[pk] = made
            if isinstance(made, Exception):
                odd[pk] = made
            else:
                out.append(made)  # type: ignore[arg-type]  # the builder of this kind
    return tuple(queued), tuple(running)


_LOOKUPS = -1  # the memo's key for the lookups its entries were built with (ids are > 0)


def _queued_job(row: JobRow, lookups: Lookups, jobs: ActiveJobs) -> QueuedJob:
    _check_size(row)
    gpu_type, gpu_types = accepted_types(row, lookups)
    if lookups.units and lookups.packs_slices(gpu_type):
        gpu_types = ()  # rule H7: a slice-packed type is its only type
    return QueuedJob(id=row.id, team=lookups.teams[row.team_id],
                     gpu_type=gpu_type, gpu_types=gpu_types,
                     gpus_per_replica=units_per_replica(row, gpu_type, lookups),
                     replicas=row.replicas,
                     tier_rank=lookups.tiers[row.tier_id].rank, submitted_at=row.created_at,
                     queued_at=jobs.queued_at.get(row.id),
                     cpu_millicores=row.cpu_millicores, memory_bytes=row.memory_bytes,
                     topology=topology_of(row.topology_level, row.topology_mode),
                     dependencies=(parse_dependencies(row.dependencies) if row.dependencies
                                   else ()),
                     array_id=row.array_id, max_runtime_seconds=row.max_runtime_seconds,
                     clusters=allowed_clusters(row, lookups.clusters),
                     # Rule K4: spot nodes for preemptible tiers, or a job that opts in.
                     spot_ok=lookups.tiers[row.tier_id].preemptible or bool(row.allow_spot))


def _running_job(row: JobRow, lookups: Lookups, jobs: ActiveJobs) -> RunningJob:
    placement = _placement(row.placement)
    _check_size(row)
    tier = lookups.tiers[row.tier_id]
    # Its cluster's name qualifies its nodes as the snapshot's nodes are (K1).
    facts = lookups.clusters.get(row.cluster_id) if row.cluster_id is not None else None
    cluster = facts.name if facts is not None else ""
    gpu_type = lookups.gpu_types[row.gpu_type_id]
    return RunningJob(
        id=row.id, team=lookups.teams[row.team_id], gpu_type=gpu_type,
        gpus_per_replica=units_per_replica(row, gpu_type, lookups), replicas=row.replicas,
        tier_rank=tier.rank, preemptible=tier.preemptible,
        started_at=row.started_at, min_runtime_seconds=tier.min_runtime_seconds,
        nodes=tuple(qualified_node(cluster, n) for n in placement),
        cpu_millicores=row.cpu_millicores,
        memory_bytes=row.memory_bytes, preemptions=jobs.preemptions.get(row.id, 0),
        array_id=row.array_id, max_runtime_seconds=row.max_runtime_seconds, cluster=cluster,
        checkpointed_at=row.checkpointed_at,
        grace_seconds=grace_seconds(row.termination_grace_seconds, tier),
        gpu_slots=gpu_slots_of(row, gpu_type, lookups),
    )


def units_per_replica(row: JobRow, gpu_type: str, lookups: Lookups) -> int:
    """Rule H1: a job row's replica in the policy's units of `gpu_type`: its slices when
    it asks a fraction of a slice-packed type, else its devices × the type's units per
    device (`Job.units_per_replica`)."""
    if not lookups.units:
        return row.gpus_per_replica
    if row.gpu_slices and lookups.packs_slices(gpu_type):
        return int(row.gpu_slices)
    return row.gpus_per_replica * lookups.units_per_device(gpu_type)


def gpu_slots_of(row: JobRow, gpu_type: str, lookups: Lookups) -> tuple[int, ...]:
    """Rule H1: the GPU indexes a running job of a slice-packed type holds, as recorded;
    () when none are, or not a list of indexes (then the snapshot places it as
    `packed_node` says)."""
    slots = row.gpu_slots
    if not slots or not lookups.units or not lookups.packs_slices(gpu_type):
        return ()
    if not isinstance(slots, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in slots):
        return ()
    return tuple(slots)


def grace_seconds(own: int | None, tier: TierFacts) -> int:
    """The grace its pods get (what the launch spec gives): its own, else
    FAIRQ_K8S_TERMINATION_GRACE_SECONDS, cut to its tier's cap (rule R10)."""
    grace = int(settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS) if own is None else own
    cap = tier.max_termination_grace_seconds
    if cap is None and tier.preemptible:
        cap = int(settings.FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS)
    return grace if cap is None else min(grace, cap)


def tier_preemption(settings_: PreemptionSettings, lookups: Lookups) -> PreemptionSettings:
    """Rules R9 and R11 per tier, from the Tier rows: `lost_per_wait_by_tier` (a tier's own
    ratio; -1: None, no R9 check; a tier without one is absent: the global ratio) and
    `owed_waits_tiers` (the ranks whose owed claims wait)."""
    ratios: dict[int, float | None] = {}
    waits: set[int] = set()
    for t in lookups.tiers.values():
        if t.preemption_lost_per_wait is not None:
            ratios[t.rank] = None if t.preemption_lost_per_wait < 0 else t.preemption_lost_per_wait
        if not t.owed_preempts_at_once:
            waits.add(t.rank)
    if not ratios and not waits:
        return settings_
    return dataclasses.replace(settings_, lost_per_wait_by_tier=ratios,
                               owed_waits_tiers=frozenset(waits))


def _minus(free: int | None, pending: int) -> int | None:
    return None if free is None else max(0, free - pending)


def topology_of(level: str, mode: str) -> Topology | None:
    """A job row's topology request (rule A7); None when it asks none. A mode the policy
    does not know (a row older than the validation) counts as `preferred`: it never
    makes a job wait for ever."""
    if not level:
        return None
    try:
        return Topology(level, TopologyMode(mode))
    except ValueError:
        return Topology(level, TopologyMode.PREFERRED)


def _placement(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise ValueError(f"placement is not a list of node names: {type(value).__name__}")
    return value


def _check_size(row: JobRow) -> None:
    for name in ("gpus_per_replica", "replicas"):
        n = getattr(row, name)
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} is {n!r}")
