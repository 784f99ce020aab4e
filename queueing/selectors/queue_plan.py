"""Where every queued job stands and why it waits (rule P3), for everyone who asks: the
API's job detail, the CLI's `fairq prio`, the dashboard's queue and job pages, and the
submit form's preview of a job not submitted yet.

One admission plan of the whole queue (the scheduler's own snapshot and policy) answers
all of them, cached for `QUEUE_PLAN_TTL` seconds in the shared cache: planning costs
O(queue) and pollers ask about many jobs. A scheduler cycle that changed something drops
the cached plan, and a job missing from it (queued since) gets one fresh plan, so an
answer is at most one cycle old. The preview also needs the snapshot the plan was made
from: once a preview asks, it is kept beside the plan until the plan changes, in plain
rows (100,000 queued jobs pickle in 1.7 s as dataclasses, 0.17 s as rows).

A read fetches only the current plan's generation (a short string) from the shared cache;
each process keeps the last plan (and snapshot) it unpickled and reuses it while the
generation is the same. Unpickling the plan itself cost every read ~30 ms per 10,000
queued jobs (218 ms against `sprio`'s 10 ms); the generation key lives and dies
with the plan (same TTL, dropped together), so the local copy is never older than the
shared one. After a miss one process plans (it holds the build mark) and the readers of
the others wait for its plan, so a miss costs the cores one plan, not one per process.

A read model: the plan is made from the cycle's own snapshot (`selectors.snapshot`) and
the published cluster view, and nothing here writes fairq's state. `queue_plan_forget`
drops the cached plan and its snapshot; it lives here, beside the cache keys it deletes,
so the cycle and the front ends that call it never name them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db.models import QuerySet

from accounts.models import Team
from queueing.models import GpuType, Job
from queueing.policy.admission import plan_admissions
from queueing.policy.explain import PlanEntry, explain_queue, explain_queued
from queueing.policy.snapshot import FlavorFallback, QueuedJob, Snapshot
from queueing.policy.states import JobState

from .cluster import cluster_view
from .dashboard import LIST_DEFER, PAGE_CACHE_KEYS
from .fairshare import job_priority_breakdown
from .snapshot import build_snapshot, topology_of

QUEUE_PLAN_TTL = 3.0  # seconds: about one scheduler cycle
_PLAN_KEY = "fairq:queue-plan"
# The generation of the cached plan alone: what a read fetches to know its local copy is current.
_GEN_KEY = "fairq:queue-plan:generation"
# Set (add-if-absent) by the process planning the queue after a miss; the others wait for it.
_BUILD_KEY = "fairq:queue-plan:building"
PLAN_BUILD_WAIT = 10.0  # seconds a reader waits for another process's plan, then plans itself
# (plan generation, the snapshot it was made from): the preview places a candidate on it.
_SNAPSHOT_KEY = "fairq:queue-plan:snapshot"
_PREVIEW_KEY = "fairq:queue-plan:preview"


@dataclass(frozen=True)
class QueuePlan:
    """Rule P3 for the whole queue, from one admission plan. `entries`: job id ->
    `PlanEntry` (named tuples: see there)."""

    entries: dict[int, PlanEntry]
    queued: int
    error: str = ""
    generation: str = ""  # names one computed plan (and its snapshot) in the cache

    def position(self, job_id: int) -> int | None:
        e = self.entries.get(job_id)
        return None if e is None else e.position

    def reasons(self, job_id: int) -> list[dict[str, Any]]:
        e = self.entries.get(job_id)
        if e is None:
            return []
        return [r.as_dict() for r in e.reasons()]

    def brief(self, job_id: int) -> dict[str, Any] | None:
        """Rule E5: what a list shows of a queued job: `position`, `jobs_ahead` (of its GPU
        type, rule E1) and `reason` ({code, message, until?}); None when not in the plan."""
        e = self.entries.get(job_id)
        if e is None:
            return None
        reason = e.reason()
        return {"position": e.position, "jobs_ahead": e.ahead_same_gpu_type,
                "reason": reason.as_dict() if reason is not None else None}

    def team_order(self, team: str | None) -> list[int]:
        """The ids of `team`'s jobs in the plan (every team's: None) in queue order
        (rule P2's positions). Built for every team at once on the first ask and kept
        with this plan (per process: not pickled), so a page costs O(its team's jobs),
        not a walk and a sort of the whole queue; `team_order_reference` is the plain
        walk it is held to."""
        by_team: dict[str | None, list[int]] | None = self.__dict__.get("_by_team")
        if by_team is None:
            ordered = sorted(self.entries.items(), key=lambda kv: (kv[1].position, kv[0]))
            by_team = {None: [job_id for job_id, _ in ordered]}
            for job_id, e in ordered:
                by_team.setdefault(e.team, []).append(job_id)
            object.__setattr__(self, "_by_team", by_team)  # frozen: kept beside the fields
        return by_team.get(team, [])

    def team_order_reference(self, team: str | None) -> list[int]:
        """`team_order` the plain way: every entry walked and sorted (the reference path)."""
        return [job_id for _, job_id in sorted(
            (e.position, job_id) for job_id, e in self.entries.items()
            if team is None or e.team == team)]

    def __getstate__(self) -> dict[str, Any]:
        """The fields only: the team index is rebuilt by whoever reads the plan."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)

    def standing(self, job_id: int) -> dict[str, Any] | None:
        """The `queue` part of a job's detail: rule E5's `brief` (position, jobs_ahead,
        reason) and every reason, the jobs ahead of any type and the queue's length."""
        brief = self.brief(job_id)
        e = self.entries.get(job_id)
        if brief is None or e is None:
            return None
        return {**brief, "ahead": e.ahead, "ahead_same_gpu_type": e.ahead_same_gpu_type,
                "queued": self.queued, "reasons": self.reasons(job_id)}


class _Local:
    """This process's copy of the last plan (and snapshot) it read or made, by generation."""

    plan: QueuePlan | None = None
    snapshot: tuple[str, Snapshot] | None = None


def _plan_of(generation: str | None) -> QueuePlan | None:
    """The cached plan named `generation`: this process's copy when it has it, else the
    shared one (kept locally); None when there is none or the shared one is another."""
    if not generation:
        return None
    local = _Local.plan
    if local is not None and local.generation == generation:
        return local
    shared: QueuePlan | None = cache.get(_PLAN_KEY)
    if shared is None or shared.generation != generation:
        return None
    _Local.plan = shared
    return shared


def queue_plan(*, now: datetime, fresh: bool = False) -> QueuePlan:
    """The plan of the queue as it is (from the cache unless `fresh`). A cluster that does
    not answer gives an empty plan with `error` set, never a failed request."""
    if fresh:
        return _plan_compute(now=now)[0]
    cached = _plan_of(cache.get(_GEN_KEY))
    if cached is not None:
        return cached
    # A miss (a cycle moved a job, or the plan expired): one process plans, the readers of
    # the others wait for its plan instead of each planning the same queue on the same cores.
    mark = uuid.uuid4().hex
    if not cache.add(_BUILD_KEY, mark, timeout=PLAN_BUILD_WAIT):
        waited = _plan_of_another_process()
        if waited is not None:
            return waited
    try:
        return _plan_compute(now=now)[0]
    finally:
        if cache.get(_BUILD_KEY) == mark:
            cache.delete(_BUILD_KEY)


def _plan_of_another_process() -> QueuePlan | None:
    """The plan the process holding the build mark caches, once it does; None when it
    gives up (an error plan is not cached), dies (the mark expires) or takes longer than
    `PLAN_BUILD_WAIT`."""
    deadline = time.monotonic() + PLAN_BUILD_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.05)
        got = cache.get_many([_GEN_KEY, _BUILD_KEY])
        plan = _plan_of(got.get(_GEN_KEY))
        if plan is not None:
            return plan
        if got.get(_BUILD_KEY) is None:
            return None
    return None


def _plan_with_snapshot(*, now: datetime) -> tuple[QueuePlan, Snapshot | None]:
    """The cached plan and the snapshot it was made from, or a fresh pair, both kept, when
    either is missing or they are of different plans; no snapshot when the plan has an
    error."""
    local = _Local.snapshot
    generation: str | None = cache.get(_GEN_KEY)
    plan = _plan_of(generation)
    if plan is not None and local is not None and local[0] == plan.generation:
        return plan, local[1]
    kept = cache.get(_SNAPSHOT_KEY)
    if plan is not None and kept is not None and kept[0] == plan.generation:
        snapshot = _snapshot_unpack(kept[1])
        _Local.snapshot = (plan.generation, snapshot)
        return plan, snapshot
    return _plan_compute(now=now, keep_snapshot=True)


def _plan_compute(*, now: datetime,
                  keep_snapshot: bool = False) -> tuple[QueuePlan, Snapshot | None]:
    """One admission plan of the whole queue from the cycle's snapshot, cached (with the
    snapshot when `keep_snapshot`)."""
    view = cluster_view(now=now)
    if view.published_at is None and view.error:
        return QueuePlan({}, 0, error=view.error[:200]), None
    try:
        snapshot = build_snapshot(backend=view, now=now, live_workloads=set(view.workloads))
    except Exception as exc:  # a broken view must not break a page or a poll
        return QueuePlan({}, 0, error=str(exc)[:200]), None
    plan = plan_admissions(snapshot)
    by_id = {q.id: q for q in snapshot.queued}
    order = [by_id[i] for i in plan.order if i in by_id]  # the order the pass used (P2, F6)
    seen = {q.id for q in order}
    order += [q for q in snapshot.queued if q.id not in seen]
    admitted = {a.job_id for a in plan.admissions}
    waits: dict[int, tuple[str, str]] = {}
    until: dict[int, datetime] = {}
    for job_id, w in plan.waits.items():
        waits[job_id] = (str(w.reason), w.message or str(w.reason))
        if w.until is not None:
            until[job_id] = w.until
    explained = explain_queue(order, waits=waits, admitted=admitted, until=until)
    entries: dict[int, PlanEntry] = {}
    for q in order:
        x = explained[q.id]
        code, message = ("next_cycle", "") if q.id in admitted else waits.get(q.id, ("", ""))
        entries[q.id] = PlanEntry(x.position, x.ahead_same_gpu_type, q.team, q.gpu_type, code,
                                  message, until.get(q.id))
    # Jobs of teams whose namespace is not provisioned stay out of the plan: after the rest.
    if view.unprovisioned:
        waiting = Job.objects.filter(status=JobState.QUEUED,
                                     team__slug__in=view.unprovisioned).order_by("created_at", "id")
        for n, (pk, team, gpu_type) in enumerate(
                waiting.values_list("id", "team__slug", "gpu_type__slug"), start=len(order) + 1):
            entries[pk] = PlanEntry(n, 0, team, gpu_type, "namespace_not_provisioned",
                                    f"the Kubernetes namespace of team {team} is not provisioned "
                                    "for fairq yet (an admin runs `manage.py sync_cluster`)")
    result = QueuePlan(entries, len(entries), generation=uuid.uuid4().hex)
    values: dict[str, Any] = {_PLAN_KEY: result, _GEN_KEY: result.generation}
    if keep_snapshot:
        values[_SNAPSHOT_KEY] = (result.generation, _snapshot_pack(snapshot))
        _Local.snapshot = (result.generation, snapshot)
    cache.set_many(values, timeout=QUEUE_PLAN_TTL)
    _Local.plan = result
    return result, snapshot


def _snapshot_pack(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot's fields, each tuple of dataclasses (jobs, nodes) as its class and
    plain rows: several times faster to pickle and unpickle than the dataclasses."""
    out: dict[str, Any] = {}
    for f in fields(snapshot):
        value = getattr(snapshot, f.name)
        if isinstance(value, tuple) and value and is_dataclass(first := value[0]):
            cls = type(first)
            names = [g.name for g in fields(first)]
            if all(type(v) is cls for v in value):
                value = _Rows(cls, [tuple([getattr(v, n) for n in names]) for v in value])
        out[f.name] = value
    return out


def _snapshot_unpack(packed: dict[str, Any]) -> Snapshot:
    values: dict[str, Any] = {
        name: tuple(v.cls(*row) for row in v.rows) if isinstance(v, _Rows) else v
        for name, v in packed.items()}
    return Snapshot(**values)


@dataclass(frozen=True)
class _Rows:
    cls: Any
    rows: list[tuple[Any, ...]]


def queue_standing(*, job_id: int, now: datetime) -> dict[str, Any]:
    """Rule P3 for one queued job: its `QueuePlan.standing`, from the cached plan, or a
    fresh one when the job is newer than the cached plan; `cluster_unreachable` when the
    cluster does not answer."""
    plan = queue_plan(now=now)
    if job_id not in plan.entries and not plan.error:
        plan = queue_plan(now=now, fresh=True)
    if plan.error:
        unreachable = _unreachable(plan)
        return {"position": None, "jobs_ahead": None, "reason": unreachable, "ahead": None,
                "ahead_same_gpu_type": None, "queued": None, "reasons": [unreachable]}
    return plan.standing(job_id) or {
        "position": None, "jobs_ahead": None, "reason": None, "ahead": None,
        "ahead_same_gpu_type": None, "queued": plan.queued, "reasons": []}


def _unreachable(plan: QueuePlan) -> dict[str, str]:
    return {"code": "cluster_unreachable", "message": f"the cluster did not answer: {plan.error}"}


def queue_briefs(*, job_ids: Collection[int], now: datetime) -> dict[int, dict[str, Any]]:
    """Rule E5 for a page of queued jobs (`QueuePlan.brief` per job): one cached plan for
    all of them, planned again once when one is newer than the cached plan; a job the
    plan does not know (its team's namespace is not provisioned and the view says so
    later) gets nulls, and an unreachable cluster gives every job that reason."""
    if not job_ids:
        return {}
    plan = queue_plan(now=now)
    if not plan.error and any(i not in plan.entries for i in job_ids):
        plan = queue_plan(now=now, fresh=True)
    if plan.error:
        unreachable = _unreachable(plan)
        return {i: {"position": None, "jobs_ahead": None, "reason": unreachable}
                for i in job_ids}
    empty = {"position": None, "jobs_ahead": None, "reason": None}
    return {i: plan.brief(i) or dict(empty) for i in job_ids}


def queue_plan_forget() -> None:
    """Drop the cached plan, and the standings and quota forest the dashboard keeps
    (`dashboard.PAGE_CACHE_KEYS`): after a scheduler cycle changed something, or a
    submit or cancel from the web (whose next page should show it)."""
    # The generation key goes first: a process holding this plan locally stops using it.
    cache.delete_many([_GEN_KEY, _PLAN_KEY, _SNAPSHOT_KEY, *PAGE_CACHE_KEYS])


# --- readers of the plan ---------------------------------------------------------------------

@dataclass(frozen=True)
class QueueRow:
    job: Job
    position: int | None
    reason: str


def team_queue(*, team: Team | None, now: datetime, limit: int = 50
               ) -> tuple[list[QueueRow], int]:
    """The team's queued jobs (every team's: `team=None`, the staff's cluster view) in
    queue order with position and wait reason (the first `limit`), and how many are
    queued in all. Jobs queued since the plan was cached come last, without a position,
    until the next refresh."""
    plan = queue_plan(now=now)
    qs: QuerySet[Job] = Job.objects.filter(status=JobState.QUEUED)
    if team is not None:
        qs = qs.filter(team=team)
    total = qs.count()
    ids = plan.team_order(team.slug if team is not None else None)[:limit]
    found = qs.select_related("gpu_type", "tier", "team").defer(*LIST_DEFER).in_bulk(ids)
    jobs = [found[i] for i in ids if i in found]
    if len(jobs) < limit:
        # Queued after the plan was cached (or the plan is unavailable).
        jobs += list(qs.exclude(pk__in=ids).select_related("gpu_type", "tier", "team")
                     .defer(*LIST_DEFER).order_by("-tier__rank", "created_at", "id")
                     [: limit - len(jobs)])
    rows = []
    for j in jobs:
        reasons = plan.reasons(j.pk)
        rows.append(QueueRow(j, plan.position(j.pk), "; ".join(r["message"] for r in reasons)))
    return rows, total


@dataclass(frozen=True)
class Preview:
    position: int | None
    queued: int  # queued jobs now, before this one
    admitted_next: bool
    reason: str
    error: str = ""


def submit_preview(*, team: Team, gpu_type: GpuType, gpus_per_replica: int, replicas: int,
                   tier_rank: int, now: datetime, cpu_millicores: int | None = None,
                   memory_bytes: int | None = None,
                   topology: Mapping[str, str] | None = None,
                   gpu_types: Sequence[str] = (), flavor_fallback: str = "",
                   gpu_slices: int = 0) -> Preview:
    """Where a job would stand if submitted now: the candidate added in memory to the
    snapshot of the cached plan (the one "why it waits" reads) and planned with the same
    policy as the next cycle; nothing is written. The answer for one shape (team, GPU
    type, size, tier) is cached with the plan, so typing in the other fields of the form
    plans nothing. `gpu_types`: every type it would accept, most preferred first (()
    for one type), with `flavor_fallback` its team's or tier's setting. `gpu_slices`: a
    fraction of one GPU of a time-sliced or MPS type (rule H1: planned in its slices; a
    whole-GPU job of such a type in GPUs x its slices per GPU)."""
    plan, snapshot = _plan_with_snapshot(now=now)
    if snapshot is None:
        return Preview(None, 0, False, "", error=plan.error[:200])
    topo = topology_of((topology or {}).get("level", ""), (topology or {}).get("mode", ""))
    key = (f"{_PREVIEW_KEY}:{plan.generation}:{team.slug}:{gpu_type.slug}:"
           f"{gpus_per_replica}:{replicas}:{tier_rank}:{cpu_millicores}:{memory_bytes}:"
           f"{topo.level if topo else ''}:{topo.mode if topo else ''}:"
           f"{','.join(gpu_types)}:{flavor_fallback}:{gpu_slices}")
    cached: Preview | None = cache.get(key)
    if cached is not None:
        return cached
    several = tuple(gpu_types) if len(gpu_types) > 1 else ()
    units = gpus_per_replica * gpu_type.units_per_device  # rule H1
    if gpu_type.packs_slices:
        several = ()  # rule H7: its only type
        if gpu_slices:
            units = gpu_slices
    if several and flavor_fallback in {f.value for f in FlavorFallback}:
        snapshot = replace(snapshot, flavor_fallback={
            **snapshot.flavor_fallback, (team.slug, tier_rank): FlavorFallback(flavor_fallback)})
    preview = _preview_place(snapshot, QueuedJob(
        id=-1,  # no real job has a negative id
        team=team.slug, gpu_type=gpu_type.slug, gpus_per_replica=units,
        replicas=replicas, tier_rank=tier_rank, submitted_at=snapshot.now,
        cpu_millicores=cpu_millicores, memory_bytes=memory_bytes, topology=topo,
        gpu_types=several))
    cache.set(key, preview, timeout=QUEUE_PLAN_TTL)
    return preview


def _preview_place(snapshot: Snapshot, probe: QueuedJob) -> Preview:
    """Rule P3 for `probe` planned with the rest of `snapshot`'s queue."""
    snapshot = replace(snapshot, queued=(*snapshot.queued, probe))
    plan = plan_admissions(snapshot)
    by_id = {q.id: q for q in snapshot.queued}
    order = [by_id[i] for i in plan.order if i in by_id] if plan.order else list(snapshot.queued)
    seen = {q.id for q in order}
    order += [q for q in snapshot.queued if q.id not in seen]
    wait = plan.waits.get(probe.id)
    admitted = any(a.job_id == probe.id for a in plan.admissions)
    exp = explain_queued(probe.id, order, wait_code=str(wait.reason) if wait else None,
                         wait_message=wait.message if wait else None, admitted_next=admitted,
                         wait_until=wait.until if wait else None)
    if exp is None:
        return Preview(None, len(snapshot.queued) - 1, admitted, "")
    return Preview(exp.position, exp.queued - 1, admitted,
                   "; ".join(r.message for r in exp.reasons))


def job_explain(*, job: Job, now: datetime, with_queue: bool = True,
                standings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Rules P1-P3 for one job: its priority per factor (like `sprio`) and, while it is
    queued and `with_queue`, its place in the queue and why it waits (quota, capacity,
    gang that fits no node, jobs ahead of it).

    Reads only. The queue part comes from the plan of the whole queue that every reader
    shares (`queue_standing`: cached, at most one cycle old), not from planning again per
    job. A cluster that cannot be reached gives the reason `cluster_unreachable` rather
    than failing the request. `standings`: the fair-share standings to price it with
    (the web page's kept ones, `dashboard.standings_by_team`); the live ones otherwise.
    """
    # The published view: no call to the cluster (an unpublished one counts 0 GPUs, and
    # the queue part below says why).
    breakdown = job_priority_breakdown(job=job, now=now,
                                       cluster_gpus=cluster_view(now=now).total_gpus(),
                                       standings=standings)
    out: dict[str, Any] = {"priority": breakdown.as_dict(), "queue": None}
    if with_queue and job.state == JobState.QUEUED:
        out["queue"] = queue_standing(job_id=job.pk, now=now)
    return out
