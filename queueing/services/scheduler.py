"""The scheduler cycle (docs/scheduling.md, "The cycle").

    1. reconcile  — read the cluster's workload statuses; move jobs ADMITTED → RUNNING →
                    SUCCEEDED | FAILED; charge finished attempts; stop workloads no job
                    owns; requeue admitted jobs whose workload vanished; fail running
                    jobs whose workload vanished.
    2. snapshot   — nodes and free GPUs, quotas (Q1), the live fair-share standings and
                    priority weights (O1, F6), jobs holding GPUs with their tier's
                    protection (R3), the preemption rate limit (R5) and the preemptors
                    whose victims may still hold GPUs (R8).
    3. decide     — `queueing.policy.admission.plan_admissions` (pure): admissions,
                    waits and preemptions.
    4. apply      — in one transaction: QUEUED → ADMITTED with a compare-and-swap per
                    job; each preemption's victims → PREEMPTED → QUEUED (R6) with
                    events on both jobs (R7).
    5. submit     — after commit, stop the victims' workloads, then hand each admitted
                    job to the cluster backend (idempotent by name `fq-<id>-<attempt>`)
                    and mark it submitted. A preemptor is admitted by a later cycle, once
                    its victims' GPUs are free (R8).
    6. notify     — when anything moved, drop the shared plan of the queue that answers
                    "why does my job wait" (queueing/services/queue_plan.py).

Only one cycle plans at a time (a PostgreSQL advisory lock; a process lock on SQLite,
which is single-process only); the compare-and-swap in step 4 means that even a stale
plan can never admit a job twice.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from queueing.backends import get_backend
from queueing.backends.base import (
    ClusterBackend,
    LaunchSpec,
    Phase,
    SubmitRejected,
    WorkloadStatus,
)
from queueing.models import GpuType, Job, Quota
from queueing.policy.admission import Plan, plan_admissions
from queueing.policy.fairshare import FairShareState
from queueing.policy.snapshot import NodeState, QueuedJob, QuotaLimit, RunningJob, Snapshot
from queueing.policy.states import HOLDING_STATES, JobState

from .fairshare import priority_weights
from .jobs import job_transition
from .preemption import (
    nominated_preemptors,
    preempted_workloads_stop,
    preemption_settings,
    preemptions_apply,
)
from .queue_plan import queue_plan_forget
from .usage import entry_penalty_interval_seconds, fairshare_standings, usage_record_attempt

log = logging.getLogger(__name__)

# An admitted job missing from the cluster's list is requeued only after this long, so a
# cycle whose status list predates another cycle's submit does not requeue it.
VANISHED_GRACE = timedelta(seconds=15)
_ADVISORY_LOCK_KEY = 0x66616972  # "fair"
_process_lock = threading.Lock()


@dataclass
class CycleResult:
    ran: bool = True
    admitted: list[int] = field(default_factory=list)
    started: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    orphans_stopped: list[str] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    # Workload names the cluster listed in step 1 (rule R8 reads it).
    workloads: set[str] = field(default_factory=set)
    submit_errors: dict[int, str] = field(default_factory=dict)
    plan: Plan | None = None
    timings: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def cycle_lock() -> Iterator[bool]:
    """Yield True when this process holds the scheduler lock, False when another does."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", [_ADVISORY_LOCK_KEY])
            got = bool(cur.fetchone()[0])
        try:
            yield got
        finally:
            if got:
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", [_ADVISORY_LOCK_KEY])
    else:
        got = _process_lock.acquire(blocking=False)
        try:
            yield got
        finally:
            if got:
                _process_lock.release()


def scheduler_cycle(*, now: datetime | None = None,
                    backend: ClusterBackend | None = None) -> CycleResult:
    """Run steps 1-5 once. Returns what happened; does nothing if another cycle runs."""
    backend = backend or get_backend()
    with cycle_lock() as got:
        if not got:
            return CycleResult(ran=False)
        result = CycleResult()
        now = now or timezone.now()
        t0 = time.perf_counter()
        reconcile(backend=backend, now=now, result=result)
        t1 = time.perf_counter()
        snapshot = build_snapshot(backend=backend, now=now, live_workloads=result.workloads)
        t2 = time.perf_counter()
        plan = plan_admissions(snapshot)
        result.plan = plan
        t3 = time.perf_counter()
        with transaction.atomic():
            result.admitted = apply_plan(plan=plan, now=now)
            applied = preemptions_apply(plan=plan, now=now)
        result.preempted = applied.preempted
        t4 = time.perf_counter()
        # After commit: the victims' GPUs come back (at once on the simulated cluster,
        # when the pods are gone on Kubernetes); their preemptors wait for that (R8).
        preempted_workloads_stop(backend=backend, names=applied.workloads, now=now)
        submit_admitted(backend=backend, now=now, result=result)
        if (result.admitted or result.started or result.finished or result.requeued
                or result.preempted):
            queue_plan_forget()  # readers of "why it waits" get the queue as it is now
        t5 = time.perf_counter()
        result.timings = {"reconcile": t1 - t0, "snapshot": t2 - t1, "decide": t3 - t2,
                          "apply": t4 - t3, "submit": t5 - t4, "total": t5 - t0}
        return result


# --- 1. reconcile -------------------------------------------------------------------------

def reconcile(*, backend: ClusterBackend, now: datetime, result: CycleResult) -> None:
    statuses = backend.statuses(now=now)
    seen = {s.name for s in statuses}
    result.workloads = seen
    # Only (attempt, status) for every workload; whole rows only for the few that move.
    owners = {pk: (attempt, JobState(st)) for pk, attempt, st in Job.objects.filter(
        pk__in={s.job_id for s in statuses}).values_list("pk", "attempt", "status")}
    moving = []
    for status in statuses:
        owner = owners.get(status.job_id)
        if owner is None or owner[0] != status.attempt or owner[1] not in HOLDING_STATES:
            # No job owns this workload any more (cancelled, preempted, finished and
            # recorded, or deleted): end it so its GPUs come back.
            backend.stop(status.name, now=now)
            result.orphans_stopped.append(status.name)
            continue
        if status.phase == Phase.PENDING or (
                status.phase == Phase.RUNNING and owner[1] == JobState.RUNNING):
            continue  # nothing to record: no transaction for the common case
        moving.append(status)
    jobs = Job.objects.select_related("gpu_type").in_bulk({s.job_id for s in moving})
    for status in moving:
        job = jobs.get(status.job_id)
        if job is not None and job.attempt == status.attempt:
            _apply_status(job, status, now=now, result=result)

    # Jobs holding GPUs that the cluster does not list: one narrow scan, full rows only
    # for the (rare) missing ones.
    grace_cutoff = now - VANISHED_GRACE
    missing = [
        pk for pk, attempt, state, submitted, started in Job.objects.filter(
            status__in=[JobState.ADMITTED, JobState.RUNNING]).values_list(
            "pk", "attempt", "status", "submitted_to_backend_at", "started_at")
        if f"fq-{pk}-{attempt}" not in seen and (
            (state == JobState.ADMITTED and submitted is not None and submitted < grace_cutoff)
            or (state == JobState.RUNNING and started is not None and started < grace_cutoff))
    ]
    gone = Job.objects.select_related("gpu_type").in_bulk(missing)
    for job in (j for j in gone.values() if j.state == JobState.ADMITTED):
        with transaction.atomic():
            if job_transition(
                job, JobState.QUEUED, now=now, reason="its cluster workload vanished before "
                "it ran; requeued", attempt=job.attempt + 1, placement=[], admitted_at=None,
                submitted_to_backend_at=None,
            ):
                result.requeued.append(job.pk)

    # A running job whose workload is gone (deleted outside fairq, or the simulated
    # cluster restarted) would otherwise hold its quota for ever: it fails, charged up
    # to now. The backend answers only once its view is complete (the Kubernetes one
    # waits for its watches to sync), so "missing" means missing.
    for job in (j for j in gone.values() if j.state == JobState.RUNNING):
        with transaction.atomic():
            if job_transition(
                job, JobState.FAILED, now=now, finished_at=now,
                reason="its cluster workload disappeared while running (deleted outside "
                "fairq, or the cluster restarted)",
                message="workload lost",
            ):
                usage_record_attempt(job=job, start=job.started_at or now, end=now)
                result.finished.append(job.pk)


def _apply_status(job: Job, status: WorkloadStatus, *, now: datetime,
                  result: CycleResult) -> None:
    with transaction.atomic():
        if status.phase == Phase.FAILED and status.started_at is None and \
                job.state == JobState.ADMITTED:
            # It never ran (image pull error, refused pods): no RUNNING event, no usage.
            job_transition(job, JobState.FAILED, now=now, finished_at=status.finished_at or now,
                           reason=status.reason or "failed before it started",
                           exit_code=status.exit_code, message=status.reason[:500])
            result.finished.append(job.pk)
            transaction.on_commit(_kick)
            return
        if status.phase in (Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED) and \
                job.state == JobState.ADMITTED:
            started = status.started_at or now
            if job_transition(job, JobState.RUNNING, now=now,
                              reason=f"running on {', '.join(status.nodes) or 'the cluster'}",
                              started_at=started, placement=list(status.nodes) or job.placement):
                result.started.append(job.pk)
        if status.phase in (Phase.SUCCEEDED, Phase.FAILED) and job.state == JobState.RUNNING:
            target = JobState.SUCCEEDED if status.phase == Phase.SUCCEEDED else JobState.FAILED
            end = status.finished_at or now
            if job_transition(job, target, now=now,
                              reason=status.reason or ("completed" if target ==
                                                       JobState.SUCCEEDED else "failed"),
                              finished_at=end, exit_code=status.exit_code,
                              message=status.reason[:500]):
                usage_record_attempt(job=job, start=job.started_at or end, end=end)
                result.finished.append(job.pk)
                transaction.on_commit(_kick)


def _kick() -> None:
    from queueing.tasks import kick_scheduler

    kick_scheduler()


# --- 2. snapshot --------------------------------------------------------------------------

def build_snapshot(*, backend: ClusterBackend, now: datetime,
                   live_workloads: set[str] | None = None) -> Snapshot:
    """Step 2: everything the policy needs, read once (a handful of queries)."""
    holding = list(
        Job.objects.filter(status__in=list(HOLDING_STATES)).values(
            "id", "team__slug", "gpu_type__slug", "gpus_per_replica", "replicas",
            "tier__rank", "tier__preemptible", "tier__min_runtime_seconds", "started_at",
            "placement", "submitted_to_backend_at",
        )
    )
    # The cluster counts what it runs; jobs admitted but not yet submitted hold their
    # planned placement on top of that.
    pending_alloc: dict[str, int] = defaultdict(int)
    for h in holding:
        if h["submitted_to_backend_at"] is None:
            for node in h["placement"] or []:
                pending_alloc[node] += h["gpus_per_replica"]
    nodes = tuple(
        NodeState(n.name, n.gpu_type, n.capacity,
                  max(0, n.capacity - n.allocated - pending_alloc[n.name]))
        for n in backend.nodes()
    )
    running = tuple(
        RunningJob(
            id=h["id"], team=h["team__slug"], gpu_type=h["gpu_type__slug"],
            gpus_per_replica=h["gpus_per_replica"], replicas=h["replicas"],
            tier_rank=h["tier__rank"], preemptible=h["tier__preemptible"],
            started_at=h["started_at"], min_runtime_seconds=h["tier__min_runtime_seconds"],
            nodes=tuple(h["placement"] or ()),
        )
        for h in holding
    )
    queued = tuple(
        QueuedJob(id=q["id"], team=q["team__slug"], gpu_type=q["gpu_type__slug"],
                  gpus_per_replica=q["gpus_per_replica"], replicas=q["replicas"],
                  tier_rank=q["tier__rank"], submitted_at=q["created_at"])
        for q in Job.objects.filter(status=JobState.QUEUED).values(
            "id", "team__slug", "gpu_type__slug", "gpus_per_replica", "replicas",
            "tier__rank", "created_at")
    )
    quotas = {
        (q["team__slug"], q["gpu_type__slug"]): QuotaLimit(
            q["nominal"], q["borrowing_limit"], q["lending_limit"])
        for q in Quota.objects.values("team__slug", "gpu_type__slug", "nominal",
                                      "borrowing_limit", "lending_limit")
    }
    standings = fairshare_standings(now=now)
    interval = entry_penalty_interval_seconds()
    return Snapshot(
        now=now, nodes=nodes, queued=queued, running=running, quotas=quotas,
        fair_share={team: s.factor for team, s in standings.items()},
        fair_share_state=FairShareState.from_standings(standings),
        priority_weights=priority_weights(),
        billing_weights=dict(GpuType.objects.values_list("slug", "billing_weight")),
        interval_seconds=interval,
        # Rule R8 must see the workloads the cluster lists; callers other than the cycle
        # (explain, dashboard, preview) pass none, so ask the cluster rather than assume
        # every victim is gone.
        nominated=nominated_preemptors(
            now=now, live_workloads=live_workloads if live_workloads is not None
            else {s.name for s in backend.statuses(now=now)}),
        preemption=preemption_settings(now=now),
    )


# --- 4. apply -----------------------------------------------------------------------------

def apply_plan(*, plan: Plan, now: datetime) -> list[int]:
    """QUEUED → ADMITTED for each admission, compare-and-swap per job, one transaction.
    A job another cycle already moved is skipped: it is never admitted twice."""
    admitted: list[int] = []
    if not plan.admissions:
        return admitted
    jobs = Job.objects.in_bulk([a.job_id for a in plan.admissions])
    with transaction.atomic():
        for a in plan.admissions:
            job = jobs.get(a.job_id)
            if job is None or job.state != JobState.QUEUED:
                continue
            if job_transition(job, JobState.ADMITTED, now=now,
                              reason=f"admitted on {', '.join(sorted(set(a.placement)))}",
                              admitted_at=now, placement=list(a.placement),
                              data={"placement": list(a.placement)}):
                admitted.append(job.pk)
    return admitted


# --- 5. submit ----------------------------------------------------------------------------

def launch_spec(job: Job) -> LaunchSpec:
    return LaunchSpec(
        name=job.backend_name, job_id=job.pk, attempt=job.attempt, team=job.team.slug,
        tier=job.tier.slug, priority_class_name=job.tier.priority_class_name,
        gpu_type=job.gpu_type.slug, resource_name=job.gpu_type.resource_name,
        node_labels=dict(job.gpu_type.node_labels or {}),
        gpus_per_replica=job.gpus_per_replica, replicas=job.replicas, image=job.image,
        command=list(job.command or []), args=list(job.args or []),
        env={str(k): str(v) for k, v in (job.env or {}).items()},
        max_runtime_seconds=job.max_runtime_seconds, placement=tuple(job.placement or ()),
        run_as_non_root=job.team.run_as_non_root,
    )


def submit_admitted(*, backend: ClusterBackend, now: datetime, result: CycleResult) -> None:
    """Submit every admitted job not yet marked submitted (this cycle's and any a killed
    worker left behind: the backend's create is idempotent by name)."""
    pending = Job.objects.filter(
        status=JobState.ADMITTED, submitted_to_backend_at__isnull=True
    ).select_related("team", "tier", "gpu_type").order_by("admitted_at", "id")
    for job in pending:
        try:
            backend.submit(launch_spec(job), now=now)
        except SubmitRejected as exc:
            with transaction.atomic():
                job_transition(job, JobState.FAILED, now=now, reason=f"rejected: {exc}",
                               finished_at=now, message=str(exc)[:500])
            result.submit_errors[job.pk] = str(exc)
            continue
        except Exception as exc:  # transient: retried next cycle
            log.warning("submit of %s failed, retrying next cycle: %s", job.backend_name, exc)
            result.submit_errors[job.pk] = str(exc)
            continue
        Job.objects.filter(pk=job.pk, status=JobState.ADMITTED, attempt=job.attempt).update(
            submitted_to_backend_at=now
        )
