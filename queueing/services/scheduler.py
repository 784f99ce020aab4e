"""The scheduler cycle (docs/scheduling.md, "The cycle").

    1. reconcile  — read the cluster's workload statuses; move jobs ADMITTED → RUNNING →
                    SUCCEEDED | FAILED; charge finished attempts; stop workloads no job
                    owns; requeue admitted jobs whose workload vanished; fail running
                    jobs whose workload vanished.
    1a. clusters  — rule K5 (services/clusters.py): each cluster's reachability
                    recorded; an unreachable one's jobs kept for the grace, then
                    requeued; its admitted jobs never created there requeued at once.
                    Rule K8: a disabled cluster drains - read like the others while
                    jobs are there, its admitted jobs never created there requeued,
                    and recorded drained once none is left.
    1b. utilization — once a minute, the GPUs' readings of running jobs: per-minute
                    samples, idle jobs flagged and reclaimed per their tier (rules U1-U5,
                    services/utilization.py); reclaimed GPUs are free for this plan.
    2. snapshot   — nodes and free GPUs of every reachable cluster, quotas (Q1), the
                    live fair-share standings and priority weights (O1, F6), jobs
                    holding GPUs with their tier's protection (R3), the preemption
                    rate limit (R5) and the preemptors whose victims may still hold
                    GPUs (R8): a read,
                    `queueing.selectors.snapshot.build_snapshot`.
    3. decide     — `queueing.policy.admission.plan_admissions` (pure): admissions,
                    waits and preemptions.
    4. apply      — in one transaction: QUEUED → ADMITTED with a compare-and-swap per
                    job (on PostgreSQL all of them in one statement with their events,
                    `jobs.jobs_admit_batch`); each preemption's victims → PREEMPTED →
                    QUEUED (R6) with events on both jobs (R7).
    5. submit     — after commit, stop the victims' workloads, then hand the admitted
                    jobs to the cluster backend (concurrently, no transaction open;
                    idempotent by name `fq-<id>-<attempt>`) and mark them submitted.
                    A preemptor is admitted by a later cycle, once its victims' GPUs
                    are free (R8).
    6. notify     — right after step 4, publish this cycle's plan of the queue (its
                    admitted jobs left out) that answers "why does my job wait" for
                    every reader (queueing/selectors/queue_plan.py); when anything
                    moved, drop the pages' kept reads; and publish the cluster view
                    web processes read instead of the cluster (nodes, live workloads,
                    unprovisioned teams: queueing/selectors/cluster.py). After step 5,
                    the pages' kept reads computed again when anything moved (the
                    standings from the kept active jobs, `_STANDINGS_KEPT`).

Several clusters (docs/clusters.md): the cycle reads every enabled `Cluster` (and every
disabled one still draining, rule K8) as one `Fleet` (services/clusters.py): one
snapshot of all reachable clusters' nodes (named "<cluster>/<node>"; a draining one's
are there, closed: the plan offers them to no queued job, rule K8), one plan,
each admission written with its `Job.cluster` and the node names the cluster knows,
each workload created on its job's cluster. A cluster that cannot be read never stops
the others (rule K5). With no `Cluster` row the fleet is the one cluster of settings, as
before.

Only one cycle plans at a time (a PostgreSQL advisory lock; a process lock on SQLite,
which is single-process only); the compare-and-swap in step 4 means that even a stale
plan can never admit a job twice.

A cycle bounds its own work (`Budget`, FAIRQ_CYCLE_BUDGET_SECONDS, well inside the
task's time limits, so no limit cuts it half-way): step 1 handles the workloads whose
status moved until its share of the budget is spent, and stops at most
FAIRQ_CYCLE_STOP_BATCH workloads no job holds (their logs kept first); step 5 stops the
preemption victims and submits admitted jobs in chunks while the budget lasts, and on
until it has taken every admitted job waiting for its workload, for at most
`SUBMIT_SCALED_MAX` of the budget from the step's start however long steps 1-4 took
(victims
left running are stopped by the next cycle's step 1: their attempt is no longer their
job's). What is left is left as it is, for the next cycle, which is kicked at once
(`CycleResult.deferred`). Steps 2-4 always run whole: the plan is decided on the whole
queue and applied in one transaction, so an interrupted cycle has applied all of its
decisions or none.

One job never stops the cycle: each job's part of steps 1, 2, 4 and 5 runs on its own
(`_isolated`); an unexpected exception fails that job with a reason and an event and
the cycle goes on with the others. Cluster statuses are cleaned first
(`queueing.sanitize.clean_status`). Each cycle has an id (`CycleResult.cycle_id`) that
every log line about it carries.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.cache import cache
from django.db import InterfaceError, OperationalError, connection, connections, transaction
from django.db.models import QuerySet
from django.utils import timezone

from accounts.models import Team
from queueing.backends.base import (
    WAITING,
    ClusterBackend,
    LaunchSpec,
    Phase,
    SubmitRefused,
    SubmitRejected,
    SubmitRequeue,
    WorkloadStatus,
    workload_name,
)
from queueing.composition import get_utilization_source, kick
from queueing.logcontext import log_context
from queueing.models import Cluster, GpuType, Job, JobEvent, Tier, UsageRecord
from queueing.policy.admission import Plan, plan_admissions
from queueing.policy.fairshare import Standing
from queueing.policy.snapshot import NodeState
from queueing.policy.states import FINAL_STATES, HOLDING_STATES, JobState
from queueing.sanitize import clean_status, clean_text
from queueing.selectors.active_jobs import ActiveJobs, cycle_active_jobs
from queueing.selectors.checkpoints import newest_checkpoints
from queueing.selectors.cluster import largest_node_cpu_memory
from queueing.selectors.dashboard import page_reads_publish
from queueing.selectors.fairshare import fairshare_standings
from queueing.selectors.queue_plan import (
    plan_inputs_mark,
    queue_plan_forget,
    queue_plan_publish,
)
from queueing.selectors.snapshot import build_snapshot, unprovisioned_teams, unqualified_node

from .arrays import arrays_top_up
from .checkpoints import checkpoint_token, checkpoint_url, resume_note
from .cluster_view import cluster_view_publish
from .clusters import Fleet, clusters_drain, clusters_record, fleet_open
from .dependencies import dependencies_fail_never_met
from .jobs import (
    default_memory_bytes,
    job_transition,
    jobs_admit_batch,
    jobs_transition_batch,
    next_attempt,
    tier_grace_cap,
)
from .logs import LogsUnread, stopped_logs_keep_again, workloads_stop_keeping_logs
from .metrics import record_submit_error
from .preemption import Applied, preempted_workloads_stop, preemptions_apply
from .sessions import session_addresses_record, session_launch_fields
from .spot import spot_reclaimed_requeue
from .usage import usage_record_attempt, usage_record_attempts
from .utilization import utilization_cycle_step

log = logging.getLogger(__name__)

# An admitted job missing from the cluster's list is requeued only after this long, so a
# cycle whose status list predates another cycle's submit does not requeue it.
VANISHED_GRACE = timedelta(seconds=15)
_ADVISORY_LOCK_KEY = 0x66616972  # "fair"
_process_lock = threading.Lock()
# Errors that are not one job's fault (the database went away, a deadlock, the task's
# time limit): they fail the cycle, which is retried, rather than some innocent job.
NOT_A_JOB_FAULT: tuple[type[BaseException], ...] = (
    OperationalError, InterfaceError, SoftTimeLimitExceeded)


def new_cycle_id() -> str:
    return uuid.uuid4().hex[:12]


# The share of FAIRQ_CYCLE_BUDGET_SECONDS by which step 1 stops taking new workloads
# (steps 2-4 run whole after it; step 5 has the rest).
RECONCILE_SHARE = 0.4
# Step 1's own share for its status changes, counted from the start of the first chunk:
# a finished job holds its GPUs in the plan until step 1 records it, so a cycle whose
# listing and cleaning of workloads alone used step 1's share (a big fleet, a loaded
# machine) still records changes for this long instead of one chunk.
RECONCILE_FLOOR = 0.15
# Step 5's own share of the budget, counted from its start: admitted jobs hold their GPUs
# until their workloads exist, so a cycle whose plan alone used the budget (a long queue
# on a big fleet) still creates workloads for this long instead of one chunk (with
# `_SUBMIT_SCALED` off; on, the floor is `SUBMIT_SCALED_MAX`).
SUBMIT_FLOOR = 0.25
# Step 5's floor while admitted jobs wait: past the budget, chunks go on starting until
# every admitted job waiting for its workload has been taken (this cycle's and those
# earlier cycles left, the longest admitted first), for at most `SUBMIT_SCALED_MAX` of
# the budget from the step's start - an admitted job holds its GPUs and starts no end
# of its own until its workload exists, so a cycle that admits more than a quarter
# budget's worth of creates leaves them to pile up. The test comes only before a chunk
# that exists, so the step ends as soon as it has taken them all.
# (`_SUBMIT_SCALED` False: `SUBMIT_FLOOR` alone, the contract before.)
SUBMIT_SCALED_MAX = 1.5
_SUBMIT_SCALED = True
# No chunk of step 5 starts this long after the cycle's start, floor or not: the largest
# budget the setting allows, inside the cycle task's soft time limit (50 s).
SUBMIT_EDGE = 45.0


class Budget:
    """The time a cycle allows itself (FAIRQ_CYCLE_BUDGET_SECONDS from its start): its
    bounded steps take no new item once their share of it is spent."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = float(settings.FAIRQ_CYCLE_BUDGET_SECONDS if seconds is None
                             else seconds)
        self.started = time.perf_counter()

    def spent(self, share: float = 1.0) -> bool:
        """True once `share` of the budget is gone."""
        return time.perf_counter() - self.started >= self.seconds * share

    def reconcile_spent(self, chunks_started: float | None) -> bool:
        """Step 1's test before a new status change: `RECONCILE_SHARE` of the budget is
        spent and so is the step's floor (`RECONCILE_FLOOR` of the budget from
        `chunks_started`, a perf_counter time; None: no floor), or the cycle is
        `SUBMIT_EDGE` old."""
        now = time.perf_counter()
        if now - self.started >= SUBMIT_EDGE:
            return True
        return self.spent(RECONCILE_SHARE) and (
            chunks_started is None or now - chunks_started >= self.seconds * RECONCILE_FLOOR)

    def submit_spent(self, step_started: float) -> bool:
        """Step 5's test before a new chunk (so while admitted jobs wait for their
        workloads): the budget is spent and so is the step's floor, `SUBMIT_SCALED_MAX`
        of the budget from `step_started`, a perf_counter time (`SUBMIT_FLOOR` with
        `_SUBMIT_SCALED` off); or the cycle is `SUBMIT_EDGE` old."""
        now = time.perf_counter()
        if now - self.started >= SUBMIT_EDGE:
            return True
        floor = SUBMIT_SCALED_MAX if _SUBMIT_SCALED else SUBMIT_FLOOR
        return self.spent() and now - step_started >= self.seconds * floor


@dataclass
class CycleResult:
    ran: bool = True
    cycle_id: str = field(default_factory=new_cycle_id)
    admitted: list[int] = field(default_factory=list)
    started: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    orphans_stopped: list[str] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    # Workload names the cluster listed in step 1 (rule R8 reads it).
    workloads: set[str] = field(default_factory=set)
    submit_errors: dict[int, str] = field(default_factory=dict)
    # Jobs step 5 created a workload for (or found one of) and marked submitted: the ids
    # each mark's UPDATE named (its compare-and-swap leaves a job that moved on
    # meanwhile unmarked, still named here). The bench and tests read it.
    submitted: list[int] = field(default_factory=list)
    # Jobs an unexpected exception was isolated for (job id -> exception type); each was
    # failed with a reason, or skipped when even that failed.
    job_errors: dict[int, str] = field(default_factory=dict)
    plan: Plan | None = None
    timings: dict[str, float] = field(default_factory=dict)
    # Rule K5: the clusters that could not be read this cycle (names).
    unreachable: list[str] = field(default_factory=list)
    # Work left for the next cycle (kicked at once) by the budget, per step:
    # "reconcile" (workload statuses not handled), "stop" (workloads no job holds, not
    # stopped yet), "submit" (admitted jobs not submitted yet).
    deferred: dict[str, int] = field(default_factory=dict)
    # Workloads no job holds left running this cycle: the cluster did not answer for a
    # replica's log (services/logs.py, `LogsUnread`).
    logs_unread: list[str] = field(default_factory=list)


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


def scheduler_cycle(*, now: datetime | None = None, backend: ClusterBackend | None = None,
                    cycle_id: str | None = None,
                    backends: Mapping[str, ClusterBackend] | None = None) -> CycleResult:
    """Run steps 1-5 once. Returns what happened; does nothing if another cycle runs.
    An exception escapes only for what is not one job's fault (NOT_A_JOB_FAULT, or the
    one implicit cluster that cannot be read at all); the caller logs it with
    `cycle_id`. `backend`: the implicit cluster's (a test's); `backends`: per `Cluster`
    name, the backend to use instead of the one built from its row (tests)."""
    with cycle_lock() as got:
        if not got:
            _again_ask()
            return CycleResult(ran=False, cycle_id=cycle_id or new_cycle_id())
        _again_take()  # this cycle sees every change that asked for one before it
        result = CycleResult(cycle_id=cycle_id or new_cycle_id())
        now = now or timezone.now()
        budget = Budget()
        t0 = time.perf_counter()
        fleet = fleet_open(backend=backend, backends=backends)
        # (Uncounted: a deleted row misleads no one here; step 2's refresh counts.)
        reconcile(backend=fleet, now=now, result=result,
                  jobs=cycle_active_jobs(count=False), budget=budget)
        outages = clusters_record(fleet=fleet, now=now)
        result.requeued.extend(outages.requeued)
        result.requeued.extend(clusters_drain(fleet=fleet, now=now))  # rule K8
        result.unreachable = sorted(outages.since)
        backend = fleet
        _utilization(backend=fleet.plain(), now=now, result=result)
        # Arrays' members not yet written get rows as the plan may need them.
        arrays_top_up(now=now)
        t1 = time.perf_counter()
        odd_rows: dict[int, Exception] = {}
        # Again: the rows step 1 and others changed since (only those are read).
        jobs = cycle_active_jobs()
        unprovisioned = unprovisioned_teams(backend, jobs=jobs)
        snapshot = build_snapshot(backend=backend, now=now, live_workloads=result.workloads,
                                  unprovisioned=unprovisioned, odd_rows=odd_rows, jobs=jobs)
        for job_id, exc in odd_rows.items():
            _job_failed(job_id, exc, step="reading its row", now=now, result=result)
        t2 = time.perf_counter()
        plan = plan_admissions(snapshot)
        result.plan = plan
        t3 = time.perf_counter()
        with transaction.atomic():
            result.admitted = apply_plan(plan=plan, now=now, result=result,
                                         nodes=snapshot.nodes)
            applied = _preemptions_apply(plan=plan, now=now, result=result)
            # Rule D2: a job whose dependencies can never be met fails at once.
            result.finished.extend(dependencies_fail_never_met(never_met=plan.never_met, now=now))
        result.preempted = applied.preempted
        # Step 6's first part, as soon as the plan is applied: the plan the pages read
        # (rule P3), its admitted jobs shown as such; no web request plans the queue again.
        # A quiet cycle (nothing moved, no input of the plan changed) publishes nothing.
        quiet = not (plan.admissions or plan.preemptions or plan.never_met or result.admitted
                     or result.preempted or result.finished or result.requeued or odd_rows)
        mark = None if not quiet else plan_inputs_mark(
            snapshot, jobs_version=jobs.version, extra=(jobs.lookups, sorted(unprovisioned)))
        _published("queue plan's answers", lambda: queue_plan_publish(
            snapshot=snapshot, plan=plan, admitted=result.admitted, unprovisioned=unprovisioned,
            mark=mark), result=result)
        t4 = time.perf_counter()
        # After commit: the victims' GPUs come back (at once on the simulated cluster,
        # when the pods are gone on Kubernetes); their preemptors wait for that (R8).
        _victims_stop(backend=backend, names=applied.workloads, now=now, result=result,
                      budget=budget)
        t4a = time.perf_counter()
        submit_admitted(backend=backend, now=now, result=result, budget=budget)
        t4b = time.perf_counter()
        if result.deferred:
            log.info("cycle %s: left for the next cycle (budget %.0f s): %s", result.cycle_id,
                     budget.seconds, ", ".join(f"{k} {v}" for k, v in
                                               sorted(result.deferred.items())))
            kick()  # at once: the rest is the next cycle's first work
        moved = bool(result.admitted or result.started or result.finished or result.requeued
                     or result.preempted or result.job_errors)
        if moved:
            queue_plan_forget()  # readers of "why it waits" get the queue as it is now
        # What web processes know of the cluster (they are no cluster clients).
        cluster_view_publish(backend=backend, now=now, workloads=result.workloads,
                             unprovisioned=unprovisioned,
                             clusters=fleet.reachability(now=now, since=outages.since),
                             closed=snapshot.closed_clusters)
        # The fleet-wide reads every dashboard request shares (read from the view just
        # published), computed here, not in a request.
        _published("pages' kept reads", lambda: page_reads_publish(
            now=now, moved=moved, standings=_standings_after_steps(now) if _STANDINGS_KEPT
            else None), result=result)
        gc_after_cycle(len(jobs))
        t5 = time.perf_counter()
        result.timings = {"reconcile": t1 - t0, "snapshot": t2 - t1, "decide": t3 - t2,
                          "apply": t4 - t3, "submit": t5 - t4, "total": t5 - t0,
                          # Step 5's parts: the victims' stops, the creates, and what
                          # the cycle publishes after them.
                          "submit_stop": t4a - t4, "submit_create": t4b - t4a,
                          "submit_publish": t5 - t4b}
    if _again_take():
        kick()  # a cycle was asked for while this one ran: the change that asked is next
    return result


# The standings the pages keep (rules F1-F6) are the snapshot's as of `now` plus what
# steps 4 and 5 changed of their inputs: rule F6's entry penalty of every job admitted
# (no longer queued, not yet running), the victims' attempts no longer running and their
# usage charged (rules R6, F1), jobs failed or requeued. So they are not the snapshot's
# standings; they are computed again on the kept active jobs brought up to date (the
# rows those steps wrote, read once; the running intervals and penalties made again only
# for the teams whose jobs changed, `KeptHolding`), with the accumulators and teams read
# again (O(teams)): what `fairshare_standings(now=now)` reads from every row holding GPUs,
# to the bit (tests/test_standings_once.py). The rows this reads are not read again by
# the next cycle's refresh. (`_STANDINGS_KEPT` False: read afresh, the path before.)
_STANDINGS_KEPT = True


def _standings_after_steps(now: datetime) -> Callable[[], dict[str, Standing]]:
    """What gives the standings at `now` once steps 4 and 5 are written (above)."""
    def standings() -> dict[str, Standing]:
        # Uncounted: an active row deleted outside fairq stays until the next cycle's
        # snapshot, whose refresh counts (a count of a million queued rows is not paid
        # twice a cycle).
        return fairshare_standings(now=now, jobs=cycle_active_jobs(count=False))
    return standings


def _published(what: str, publish: Callable[[], object], *, result: CycleResult) -> None:
    """A read model the cycle publishes for the pages: one that fails is logged and left
    to the next cycle (the pages fall back, docs/scheduling.md rule P3), never the
    cycle's failure (its decisions are committed; step 5 still runs)."""
    try:
        publish()
    except Exception:
        log.exception("cycle %s: the %s were not published", result.cycle_id, what)


# --- the collector ------------------------------------------------------------------------

# At fleet size (docs/performance.md, "A fleet of 5,000 nodes: the cycle on PostgreSQL")
# what a worker keeps between cycles - the active jobs' rows and the policy's jobs built
# from them, the simulated cluster's workloads, reconcile's memory - is millions of
# objects, and each of the collector's full passes walks them all: seconds a cycle.
# After a cycle with at least GC_FREEZE_MIN_ACTIVE active jobs, the young generations are
# collected and what survived is frozen (`gc.freeze`: left out of later passes; freed as
# usual once nothing refers to it). Cyclic garbage frozen that way is found by a full
# pass every GC_THAW_EVERY such cycles (`gc.unfreeze`, `gc.collect`).
# (GC_FREEZE False: the collector as before, for bench/bench_fleet_cycle.py --gc-off.)
GC_FREEZE = True
GC_FREEZE_MIN_ACTIVE = 20_000
GC_THAW_EVERY = 200
_gc_frozen_cycles = 0


def gc_after_cycle(active: int) -> None:
    """What a cycle leaves for the collector (above); nothing below the size."""
    global _gc_frozen_cycles
    if active < GC_FREEZE_MIN_ACTIVE or not GC_FREEZE:
        if _gc_frozen_cycles:
            gc.unfreeze()
            _gc_frozen_cycles = 0
        return
    _gc_frozen_cycles += 1
    if _gc_frozen_cycles > GC_THAW_EVERY:
        gc.unfreeze()
        gc.collect()
        _gc_frozen_cycles = 1
    else:
        gc.collect(1)
    gc.freeze()


# A cycle asked for while another held the lock (the kick of a watch that saw a pod
# start, of a submit, the beat's) must not be lost: with two worker processes most kicks
# land during a cycle and would wait for the beat, then maybe find the lock held again.
# The refused cycle leaves a mark in the shared cache; the running one, once it has let
# the lock go, takes the mark and kicks the next, which starts after the change.
_AGAIN_KEY = "fairq:cycle:again"


def _again_ask() -> None:
    cache.set(_AGAIN_KEY, 1, timeout=600)


def _again_take() -> bool:
    return bool(cache.delete(_AGAIN_KEY))


# --- 1. reconcile -------------------------------------------------------------------------

@contextlib.contextmanager
def _isolated(job_id: int, *, step: str, now: datetime, result: CycleResult,
              team: str | None = None) -> Iterator[None]:
    """Run one job's part of a step: an unexpected exception fails that job (with a
    reason and an event) instead of the cycle. The body brings its own savepoint
    (`transaction.atomic`) around what it writes. Its log lines carry the job's id and,
    when the caller has it at hand, its team's slug."""
    with log_context(job_id=job_id, team=team):
        try:
            yield
        except NOT_A_JOB_FAULT:
            raise
        except Exception as exc:
            _job_failed(job_id, exc, step=step, now=now, result=result)


def _job_failed(job_id: int, exc: BaseException, *, step: str, now: datetime,
                result: CycleResult) -> None:
    """Fail a job fairq could not process: FAILED with the exception's type as the
    reason, charged up to now if it ran. When even that fails the job is skipped (and
    logged); the next cycle tries again."""
    result.job_errors[job_id] = type(exc).__name__
    log.error("cycle %s: job %s: unexpected %s while %s; failing the job",
              result.cycle_id, job_id, type(exc).__name__, step, exc_info=exc)
    reason = clean_text(f"fairq could not process this job while {step}: "
                        f"{type(exc).__name__}", max_length=500)
    try:
        with transaction.atomic():
            job = Job.objects.select_related("gpu_type").filter(pk=job_id).first()
            if job is None or job.state in FINAL_STATES:
                return
            ran_since = job.started_at if job.state == JobState.RUNNING else None
            if not job_transition(job, JobState.FAILED, now=now, finished_at=now,
                                  reason=reason, message=reason,
                                  data={"cycle": result.cycle_id,
                                        "error": type(exc).__name__}):
                return
            result.finished.append(job_id)
        if ran_since is not None:
            try:
                with transaction.atomic():
                    usage_record_attempt(job=job, start=ran_since, end=now)
            except NOT_A_JOB_FAULT:
                raise
            except Exception:
                log.exception("cycle %s: job %s: could not charge its last attempt",
                              result.cycle_id, job_id)
    except NOT_A_JOB_FAULT:
        raise
    except Exception:
        log.exception("cycle %s: job %s: could not be marked failed either; skipped",
                      result.cycle_id, job_id)


def _clean_statuses(raw: list[WorkloadStatus], result: CycleResult,
                    memo: dict[str, tuple[WorkloadStatus, WorkloadStatus]] | None = None
                    ) -> list[WorkloadStatus]:
    """Each status through `clean_status`, dropping (and logging) those that name no job.
    `memo` (workload name -> the raw status and its cleaned one, replaced by this call):
    a status equal to the one of the last cycle is not cleaned again (`clean_status` is a
    function of the status alone); only a backend's own `WorkloadStatus` is compared."""
    statuses = []
    seen: dict[str, tuple[WorkloadStatus, WorkloadStatus]] = {}
    for status in raw:
        if memo is not None and type(status) is WorkloadStatus and isinstance(status.name, str):
            last = memo.get(status.name)
            if last is not None and (last[0] is status or _same(last[0], status)):
                statuses.append(last[1])
                seen[status.name] = last
                continue
        clean = clean_status(status)
        if clean is not None and memo is not None and type(status) is WorkloadStatus \
                and isinstance(status.name, str):
            seen[status.name] = (status, clean)
        if clean is None:
            log.warning("cycle %s: ignored a workload status that names no job: %s",
                        result.cycle_id, clean_text(repr(status), max_length=300))
        else:
            statuses.append(clean)
    if memo is not None:
        memo.clear()
        memo.update(seen)
    return statuses


def _same(a: object, b: object) -> bool:
    """`a == b`, False when comparing raises (a status a backend filled with odd values).
    The same object is equal at once (a backend that keeps its statuses gives them again)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:
        return False


def reconcile(*, backend: ClusterBackend, now: datetime, result: CycleResult,
              jobs: ActiveJobs | None = None, budget: Budget | None = None) -> None:
    """Step 1. `jobs`: the active jobs, refreshed by the caller (else read here): the
    owners of the workloads come from them, not from a query per cycle. `budget`: the
    cycle's; once RECONCILE_SHARE of it is spent (and RECONCILE_FLOOR of it since the
    first chunk, `Budget.reconcile_spent`), the workloads whose status moved and are not
    handled yet are left for the next cycle (each job's change is its own
    savepoint, `_apply_statuses`: a job is moved whole or not at all), and at most
    FAIRQ_CYCLE_STOP_BATCH workloads no job holds are stopped (`_unowned_stop`).

    A workload whose status is the one handled in an earlier cycle, with its job's row
    as it was then (the same values in every column of `JobRow`), is not handled
    again: handling it would change nothing (every branch below depends only on the
    status and the row's values, and writes the row or an event it checks for first).
    Only when the rows are kept (PostgreSQL, no transaction open: `ActiveJobs.kept`); a workload
    no job holds, or one whose job hit an error, is handled every cycle."""
    jobs = jobs if jobs is not None else cycle_active_jobs()
    statuses = _clean_statuses(backend.statuses(now=now), result,
                               memo=jobs.cleaned if jobs.kept else None)
    seen = {s.name for s in statuses}
    result.workloads = seen
    # Rule K6 (services/spot.py): a workload whose spot node was reclaimed requeues its
    # job now (charged, not a failure); what is left is reconciled below.
    statuses = spot_reclaimed_requeue(backend=backend, statuses=statuses, now=now,
                                      result=result)
    # Sessions' servers: the addresses their backends report (docs/sessions.md).
    session_addresses_record(statuses)
    holding = jobs.holding
    before = jobs.reconciled if jobs.kept else {}
    handled: dict[str, tuple[WorkloadStatus, object]] = {}
    # Only a few columns for every workload; whole rows only for the few that move.
    owners: dict[int, _Owner] = {}
    todo: list[WorkloadStatus] = []
    for status in statuses:
        row = holding.get(status.job_id)
        last = before.get(status.name)
        if row is not None and last is not None and (last[1] is row or last[1] == row) \
                and (last[0] is status or last[0] == status):
            handled[status.name] = last
            continue
        if row is not None:
            owners[status.job_id] = _Owner(row.attempt, JobState(row.status), row.message,
                                           row.placement or [])
        todo.append(status)
    others = {s.job_id for s in todo} - set(owners)
    if others:  # a workload of a job not holding GPUs (finished, cancelled, gone)
        owners.update({pk: _Owner(attempt, JobState(st), message, placement or [])
                       for pk, attempt, st, message, placement in Job.objects.filter(
                           pk__in=others).values_list(
                           "pk", "attempt", "status", "message", "placement")})
    moving = []
    unowned: list[WorkloadStatus] = []
    pools_now = _PoolsNow(backend)
    # The attempts charged already, of the workloads no job holds that ran: one query,
    # not one per finished workload per cycle (`_charge_unowned_run`).
    ran_unowned = {s.job_id for s in todo if s.started_at is not None and (
        (o := owners.get(s.job_id)) is not None and (
            o.attempt != s.attempt or o.state not in HOLDING_STATES))}
    charged = set(UsageRecord.objects.filter(job_id__in=ran_unowned).values_list(
        "job_id", "attempt")) if ran_unowned else set()
    for status in todo:
        owner = owners.get(status.job_id)
        if owner is None or owner.attempt != status.attempt or \
                owner.state not in HOLDING_STATES:
            try:
                if _unowned_workload(backend=backend, status=status,
                                     owned=owner is not None, now=now, result=result,
                                     charged=(status.job_id, status.attempt) in charged):
                    unowned.append(status)
            except NOT_A_JOB_FAULT:
                raise
            except Exception as exc:  # retried by the next cycle: it is still unowned
                log.warning("cycle %s: could not end unowned workload %s: %s",
                            result.cycle_id, status.name, type(exc).__name__)
            continue
        handled[status.name] = (status, holding.get(status.job_id))
        if status.phase == Phase.PENDING:
            if owner.state == JobState.ADMITTED:
                with _isolated(status.job_id, step="recording why it waits", now=now,
                               result=result):
                    _waiting_reason(job_id=status.job_id, owner=owner, reason=status.reason,
                                    now=now)
            continue
        if status.phase == Phase.RUNNING and owner.state == JobState.RUNNING:
            with _isolated(status.job_id, step="recording its pods' changes", now=now,
                           result=result):
                _running_changes(job_id=status.job_id, owner=owner, status=status, now=now,
                                 pools_now=pools_now)
            continue  # nothing to record: no transaction for the common case
        moving.append(status)
    # The longest-waiting change first: what a budget left is handled first next cycle.
    # (Each chunk reads its own rows, locked: `_apply_statuses`.)
    moving.sort(key=_oldest_change)
    chunk = 1 if connection.vendor != "postgresql" else \
        STATUS_BATCH_CHUNK if _BATCHED_STATUSES else STATUS_CHUNK
    done = 0
    chunks_started = time.perf_counter()
    while done < len(moving):
        done += _apply_statuses(moving[done:done + chunk], None, first=done == 0,
                                budget=budget, now=now, result=result, pools_now=pools_now,
                                floor_from=chunks_started)
        if done < len(moving) and budget is not None and \
                budget.reconcile_spent(chunks_started):
            # The rest next cycle: not in `handled`, so it is looked at again.
            for later in moving[done:]:
                handled.pop(later.name, None)
            result.deferred["reconcile"] = len(moving) - done
            break
    _unowned_stop(backend=backend, statuses=unowned, now=now, result=result, budget=budget)
    # What stopped workloads wrote in their grace, kept once they are gone.
    try:
        stopped_logs_keep_again(backend=backend, listed=seen, now=now)
    except NOT_A_JOB_FAULT:
        raise
    except Exception:  # the kept copy stays as it was: never a reason to stop a cycle
        log.exception("cycle %s: keeping stopped workloads' logs again failed", result.cycle_id)
    # What the next cycle need not handle again; never a job that hit an error (a job
    # that could not even be failed is tried again).
    jobs.reconciled = {name: h for name, h in handled.items()
                       if h[0].job_id not in result.job_errors}

    # Jobs holding GPUs that the cluster does not list: a scan of the active jobs, full
    # rows only for the (rare) missing ones.
    grace_cutoff = now - VANISHED_GRACE
    # Rule K5: a cluster that could not be read lists nothing; its jobs are not missing.
    away = backend.unreachable_ids() if isinstance(backend, Fleet) else frozenset()
    # (A RUNNING row without started_at, an old row, counts from its last update.)
    missing = [
        pk for pk, row in holding.items()
        if workload_name(pk, row.attempt) not in seen and row.cluster_id not in away and (
            (row.status == JobState.ADMITTED and row.submitted_to_backend_at is not None
             and row.submitted_to_backend_at < grace_cutoff)
            or (row.status == JobState.RUNNING
                and (row.started_at or row.updated_at) < grace_cutoff))
    ]
    gone = Job.objects.select_related("gpu_type").in_bulk(missing)
    for job in (j for j in gone.values() if j.state == JobState.ADMITTED):
        with _isolated(job.pk, step="requeueing it", now=now, result=result), \
                transaction.atomic():
            if job_transition(
                job, JobState.QUEUED, now=now, reason="its cluster workload vanished before "
                "it ran; requeued", data={"ended_how": "node_lost"},
                **next_attempt(job.attempt + 1),
            ):
                result.requeued.append(job.pk)

    # A running job whose workload is gone (deleted outside fairq, or the simulated
    # cluster restarted) would otherwise hold its quota for ever: it fails, charged up
    # to now. The backend answers only once its view is complete (the Kubernetes one
    # waits for its watches to sync), so "missing" means missing.
    for job in (j for j in gone.values() if j.state == JobState.RUNNING):
        with _isolated(job.pk, step="failing its lost workload", now=now, result=result), \
                transaction.atomic():
            if job_transition(
                job, JobState.FAILED, now=now, finished_at=now,
                reason="its cluster workload disappeared while running (deleted outside "
                "fairq, or the cluster restarted)",
                message="workload lost", data={"ended_how": "node_lost"},
            ):
                usage_record_attempt(job=job, start=job.started_at or now, end=now)
                result.finished.append(job.pk)


# Workload status changes written per transaction in step 1 (`_apply_statuses`): one
# job at a time, and with a chunk's common changes written together (`_apply_common`).
STATUS_CHUNK = 100
STATUS_BATCH_CHUNK = 1000

# False: every status change of step 1 written by `_apply_status` (a compare-and-swap,
# an event, a usage record and the accumulator's charge per job), the reference the
# tests hold the batched write (`_apply_common`) to. SQLite always takes it.
_BATCHED_STATUSES = True


# The columns of a job step 1 moves (`_apply_statuses`): what `_apply_status`,
# `_apply_common` and the usage record read (any other is read when first used).
_MOVE_COLUMNS = ("id", "status", "attempt", "placement", "gpu_slots", "on_spot", "cluster_id",
                 "spot_pools", "started_at", "team", "gpu_type", "gpus_per_replica",
                 "replicas", "gpu_slices")


def _apply_statuses(statuses: Sequence[WorkloadStatus], moved: Mapping[int, Job] | None, *,
                    first: bool, budget: Budget | None, now: datetime, result: CycleResult,
                    pools_now: _PoolsNow, floor_from: float | None = None) -> int:
    """Each job's change (`_apply_status`) in a savepoint of its own, the chunk in one
    transaction: a job is still moved whole or not at all (an error rolls back its
    savepoint and fails it alone, `_isolated`), and one commit is paid, not one per
    job. The chunk's rows are locked first, in id order, as every writer of several jobs
    locks them (`jobs_lock_in_id_order`), so a bulk cancel cannot deadlock with it, and
    read by the same query (`moved` None; else the rows the caller read); then the
    changes go in `statuses`' order (the longest waiting first) until the budget's
    step-1 share is spent, and the step's floor from `floor_from` with it
    (`Budget.reconcile_spent`; one change at least when `first`). Returns how many of `statuses`
    were looked at. An error that is not one job's fault rolls back the chunk: its jobs
    are handled next cycle.

    On PostgreSQL (`_BATCHED_STATUSES`) the common changes of the chunk - a job starting
    on the nodes it was admitted to, a running job ending (`_common_change`) - are not
    written one by one but together at the end (`_apply_common`): one statement for the
    starts, one for the ends, one insert of the ends' usage records, one update of the
    teams' accumulators. They cost nothing until then, so the budget is checked only
    before the changes written one at a time (`_apply_status`)."""
    looked = 0
    batched = _BATCHED_STATUSES and connection.vendor == "postgresql"
    common: list[tuple[Job, WorkloadStatus]] = []
    with transaction.atomic():
        if moved is None:
            moved = {job.pk: job for job in Job.objects.select_for_update(of=("self",))
                     .select_related("gpu_type").only(*_MOVE_COLUMNS)
                     .filter(pk__in={s.job_id for s in statuses}).order_by("pk")}
        else:
            jobs_lock_in_id_order(s.job_id for s in statuses if s.job_id in moved)
        for status in statuses:
            job = moved.get(status.job_id)
            if job is not None and job.attempt != status.attempt:
                job = None
            common_change = job is not None and batched and \
                _common_change(job, status) is not None
            if not common_change and (looked or not first) and budget is not None and \
                    budget.reconcile_spent(floor_from):
                break
            looked += 1
            if job is None:
                continue
            if common_change:
                common.append((job, status))
                continue
            with _isolated(job.pk, step="recording its workload status", now=now,
                           result=result):
                _apply_status(job, status, now=now, result=result, pools_now=pools_now)
        if common:
            _apply_common(common, now=now, result=result, pools_now=pools_now)
    return looked


def _common_change(job: Job, status: WorkloadStatus) -> JobState | None:
    """The state `_apply_status` moves `job` to with `status` when that change is a
    common one `_apply_common` writes the same: an admitted job's pods running
    (RUNNING), a running job's workload ended (SUCCEEDED or FAILED). None for the rest:
    a job on spot nodes (rule C4's pools), one that started and ended between two
    cycles, one that failed before it ran, any other state."""
    if job.on_spot or job.attempt != status.attempt:
        return None
    if job.state == JobState.ADMITTED and status.phase == Phase.RUNNING:
        return JobState.RUNNING
    if job.state == JobState.RUNNING and status.phase in (Phase.SUCCEEDED, Phase.FAILED):
        return JobState.SUCCEEDED if status.phase == Phase.SUCCEEDED else JobState.FAILED
    return None


def _apply_common(changes: Sequence[tuple[Job, WorkloadStatus]], *, now: datetime,
                  result: CycleResult, pools_now: _PoolsNow) -> None:
    """What `_apply_status` writes for each of `changes` (all `_common_change`s), in a
    few statements for all of them (PostgreSQL): the starts' transitions with their
    events (`jobs_transition_batch`), the ends' likewise, the ends' usage records and
    their teams' accumulators (`usage_record_attempts`, rule F1), the webhook messages
    and the kick after commit. The compare-and-swap is per row (rule S1): a job moved
    meanwhile is neither moved nor charged. Should any of it fail, its savepoint is
    rolled back and every change goes through `_apply_status` one job at a time (an
    error then fails that job alone)."""
    starts: list[tuple[Job, JobState, str, dict[str, Any]]] = []
    ends: list[tuple[Job, JobState, str, dict[str, Any]]] = []
    for job, status in changes:
        target = _common_change(job, status)
        if target == JobState.RUNNING:
            placement = _placement(job.placement, status)
            starts.append((job, target, "running on " + (
                ", ".join(sorted(set(status.nodes))) or "the cluster"), {
                "started_at": status.started_at or now, "placement": placement,
                "message": "",
                # Rule H1: pods bound elsewhere than planned hold GPUs fairq does not know.
                "gpu_slots": [] if job.gpu_slots and placement != list(job.placement or [])
                else None}))
        elif target is not None:
            ends.append((job, target, status.reason or (
                "completed" if target == JobState.SUCCEEDED else "failed"), {
                "finished_at": status.finished_at or now, "exit_code": status.exit_code,
                "message": status.reason[:500]}))
    try:
        with transaction.atomic():
            started = jobs_transition_batch(starts, now=now)
            ended = jobs_transition_batch(ends, now=now)
            usage_record_attempts([(job, job.started_at or f["finished_at"], f["finished_at"])
                                   for job, _, _, f in ends if job.pk in ended])
    except NOT_A_JOB_FAULT:
        raise
    except Exception as exc:
        log.warning("cycle %s: writing %d status changes together failed (%s); writing "
                    "them one job at a time", result.cycle_id, len(changes),
                    type(exc).__name__)
        for job, status in changes:
            with _isolated(job.pk, step="recording its workload status", now=now,
                           result=result):
                _apply_status(job, status, now=now, result=result, pools_now=pools_now)
        return
    for job, target, _, fields in (*starts, *ends):
        if job.pk in (started if target == JobState.RUNNING else ended):
            job.status = target
            for name, value in fields.items():
                if value is not None or name != "gpu_slots":
                    setattr(job, name, value)
    result.started.extend(job.pk for job, *_ in starts if job.pk in started)
    result.finished.extend(job.pk for job, *_ in ends if job.pk in ended)
    if ended:
        transaction.on_commit(kick)


def _oldest_change(status: WorkloadStatus) -> tuple[float, str]:
    """When a moved workload's change happened (its end, else its start), for handling
    the longest-waiting first."""
    at = status.finished_at or status.started_at
    return (at.timestamp() if at is not None else float("inf"), status.name)


@dataclass(frozen=True, slots=True)
class _Owner:
    attempt: int
    state: JobState
    message: str
    placement: list[str]


def _unowned_workload(*, backend: ClusterBackend, status: WorkloadStatus, owned: bool,
                      now: datetime, result: CycleResult, charged: bool = False) -> bool:
    """A workload no job holds (cancelled, preempted, finished and recorded, decided
    before its pods came, or deleted). Pods that ran are charged to the job's team unless
    that attempt is charged already. A workload that succeeded is only forgotten (`stop`
    deletes nothing of a finished Job: its logs stay until its TTL, and the logs task
    keeps them). True when it is to be stopped with its logs kept first
    (`_unowned_stop`): any other end may still have pods that run - a replica whose
    peer failed - and the stop deletes them, the failed replica's with them. Not one
    the cluster is already removing. `charged`: the caller knows that attempt is
    charged already (no query)."""
    if owned and status.started_at is not None and not charged:
        try:
            _charge_unowned_run(status=status, now=now)
        except NOT_A_JOB_FAULT:
            raise
        except Exception:  # still stop it: a workload running for ever is the worse leak
            log.exception("cycle %s: could not charge unowned workload %s; stopping it anyway",
                          result.cycle_id, status.name)
    if status.stopping:
        return False
    if status.phase == Phase.SUCCEEDED:
        backend.stop(status.name, now=now)  # its pods stay until the TTL: the logs task reads them
        return False
    return True


def _unowned_stop(*, backend: ClusterBackend, statuses: Sequence[WorkloadStatus],
                  now: datetime, result: CycleResult, budget: Budget | None) -> None:
    """Stop workloads no job holds, every replica's log kept first (read concurrently,
    `workloads_stop_keeping_logs`, FAIRQ_LOG_READ_CONCURRENCY at a time), at most
    FAIRQ_CYCLE_STOP_BATCH per cycle and no chunk after the first once the cycle's
    step-1 share of its budget is spent (the rest next cycle: they are still unowned). One whose log
    the cluster does not answer for is left running for a later cycle (`LogsUnread`).
    Only workloads still running count as orphans in `orphans_stopped`, once: not a Job
    that finished with its attempt."""
    if not statuses:
        return
    batch = list(statuses[:int(settings.FAIRQ_CYCLE_STOP_BATCH)])
    chunk = max(1, int(settings.FAIRQ_LOG_READ_CONCURRENCY))
    failed: dict[str, Exception] = {}
    done = 0
    while done < len(batch):
        if done and budget is not None and budget.spent(RECONCILE_SHARE):
            break  # (the first chunk always: a failed replica's peer must not run on)
        names = [s.name for s in batch[done:done + chunk]]
        failed.update(workloads_stop_keeping_logs(backend=backend, names=names, now=now))
        done += len(names)
    now_, later = batch[:done], len(statuses) - done
    for status in now_:
        exc = failed.get(status.name)
        if exc is None:
            if status.phase != Phase.FAILED:
                result.orphans_stopped.append(status.name)
        elif isinstance(exc, NOT_A_JOB_FAULT):
            raise exc
        elif isinstance(exc, LogsUnread):  # not the budget's: no kick, the next cycle
            result.logs_unread.append(status.name)
            log.info("cycle %s: %s", result.cycle_id, exc)
        else:  # retried by the next cycle: it is still unowned
            log.warning("cycle %s: could not end unowned workload %s: %s",
                        result.cycle_id, status.name, type(exc).__name__)
    if later:
        result.deferred["stop"] = later


def _charge_unowned_run(*, status: WorkloadStatus, now: datetime) -> None:
    """Charge the run time of an attempt whose pods ran without fairq counting them (its
    job failed, was cancelled or preempted before they started), once per attempt."""
    if UsageRecord.objects.filter(job_id=status.job_id, attempt=status.attempt).exists():
        return
    job = Job.objects.select_related("gpu_type").filter(pk=status.job_id).first()
    if job is None or status.started_at is None:
        return
    with transaction.atomic():
        if usage_record_attempt(job=job, start=status.started_at,
                                end=status.finished_at or now, attempt=status.attempt):
            JobEvent.objects.create(
                job=job, at=now, kind=JobEvent.Kind.CHARGED, actor_label="scheduler",
                attempt=status.attempt,
                reason="pods of this attempt ran after fairq had decided; their run time "
                       "is charged and they are stopped",
                data={"workload": status.name, "start": status.started_at.isoformat(),
                      "end": (status.finished_at or now).isoformat()})


def _waiting_reason(*, job_id: int, owner: _Owner, reason: str, now: datetime) -> None:
    """Show why an admitted job waits on the cluster (a reason on the job, an event when
    it changes), and clear it once the cluster is no longer holding it up."""
    want = reason if reason.startswith(WAITING) else ""
    if owner.message == want or (not want and not owner.message.startswith(WAITING)):
        return
    with transaction.atomic():
        moved = Job.objects.filter(pk=job_id, attempt=owner.attempt,
                                   status=JobState.ADMITTED).update(message=want[:500])
        if moved and want:
            JobEvent.objects.create(job_id=job_id, at=now, kind=JobEvent.Kind.WAITING,
                                    actor_label="scheduler", reason=want[:500],
                                    attempt=owner.attempt)


def _placement(planned: list[str], status: WorkloadStatus) -> list[str]:
    """A running job's node per replica: where the cluster bound each replica's pod
    (`status.nodes`, replica order), the planned node for a replica not bound yet, so
    what the job holds is counted per replica (rules A3, R4) while its pods start."""
    return list(status.nodes) + list(planned[len(status.nodes):])


class _PoolsNow:
    """Rule C4: the `NodePool` of each node the clusters list now, read at most once per
    cycle and only when a spot attempt's pods are bound to other nodes than recorded
    (rare: the plan's placement is what the cluster is asked for)."""

    def __init__(self, backend: ClusterBackend) -> None:
        self.backend = backend
        self._pool: dict[tuple[int | None, str], str] | None = None

    def spot_pools(self, job: Job, placement: Sequence[str]) -> dict[str, int] | None:
        """`job`'s `spot_pools` for its pods on `placement` (its cluster's node names);
        None (keep what is recorded) when it is not on spot, in the one implicit cluster
        (no pools), or on a node the clusters do not list now."""
        if not job.on_spot or job.cluster_id is None:
            return None
        if self._pool is None:
            ids = dict(Cluster.objects.values_list("name", "id"))
            self._pool = {(ids.get(n.cluster), n.name): n.pool for n in self.backend.nodes()}
        pool_of: dict[str, str] = {}
        for node in placement:
            pool = self._pool.get((job.cluster_id, node))
            if pool is None:
                return None
            pool_of[node] = pool
        return spot_pools(placement, pool_of, gpus_per_replica=job.gpus_per_replica)


def _repool(job: Job, placement: list[str],
            pools_now: _PoolsNow | None) -> dict[str, Any]:
    """The `spot_pools` update (rule C4) of `job` bound to `placement`: {} when its pods
    are where it was admitted or the pools cannot be told."""
    if pools_now is None or not job.on_spot or set(placement) == set(job.placement or ()):
        return {}
    found = pools_now.spot_pools(job, placement)
    return {} if found is None or found == job.spot_pools else {"spot_pools": found}


def _running_changes(*, job_id: int, owner: _Owner, status: WorkloadStatus,
                     now: datetime, pools_now: _PoolsNow | None = None) -> None:
    """A running job's pods moved to other nodes (placement updated, with an event; a
    spot attempt's pools with it, rule C4), or restarted (an event per new count)."""
    nodes, placed = set(status.nodes), set(owner.placement)
    if nodes and nodes != placed and not nodes < placed:
        # (A strict subset is a replica between pods, not a move.)
        placement = _placement(owner.placement, status)
        job = Job.objects.filter(pk=job_id).only(
            "pk", "on_spot", "cluster_id", "gpus_per_replica", "placement", "spot_pools").first()
        repooled = _repool(job, placement, pools_now) if job is not None else {}
        with transaction.atomic():
            # Rule H1: on other nodes its GPUs are not the ones recorded.
            if Job.objects.filter(pk=job_id, attempt=owner.attempt, status=JobState.RUNNING
                                  ).update(placement=placement, gpu_slots=[], **repooled):
                JobEvent.objects.create(
                    job_id=job_id, at=now, kind=JobEvent.Kind.MOVED, actor_label="scheduler",
                    attempt=owner.attempt,
                    reason=f"its pods moved from {', '.join(sorted(placed)) or 'nowhere'} "
                           f"to {', '.join(sorted(nodes))}",
                    data={"from": sorted(placed), "to": sorted(nodes), **repooled})
    if status.restarts and not JobEvent.objects.filter(
            job_id=job_id, attempt=owner.attempt, kind=JobEvent.Kind.POD_RESTARTED,
            data__restarts=status.restarts).exists():
        JobEvent.objects.create(
            job_id=job_id, at=now, kind=JobEvent.Kind.POD_RESTARTED, actor_label="scheduler",
            attempt=owner.attempt, data={"restarts": status.restarts},
            reason=f"a pod failed and was replaced, or a container restarted "
                   f"({status.restarts} so far in this attempt)")


def _apply_status(job: Job, status: WorkloadStatus, *, now: datetime,
                  result: CycleResult, pools_now: _PoolsNow | None = None) -> None:
    with transaction.atomic():
        if status.phase == Phase.FAILED and status.started_at is None and \
                job.state == JobState.ADMITTED:
            # It never ran (image pull error, refused pods): no RUNNING event, no usage.
            job_transition(job, JobState.FAILED, now=now, finished_at=status.finished_at or now,
                           reason=status.reason or "failed before it started",
                           exit_code=status.exit_code, message=status.reason[:500])
            result.finished.append(job.pk)
            transaction.on_commit(kick)
            return
        if status.phase in (Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED) and \
                job.state == JobState.ADMITTED:
            started = status.started_at or now
            placement = _placement(job.placement, status)
            # Rule C4: a spot attempt bound elsewhere than planned is charged where it runs.
            repooled = _repool(job, placement, pools_now)
            # Rule H1: pods bound elsewhere than planned hold GPUs fairq does not know.
            moved: dict[str, Any] = ({"gpu_slots": []} if job.gpu_slots
                                     and placement != list(job.placement or []) else {})
            if job_transition(job, JobState.RUNNING, now=now,
                              reason="running on "
                                     + (", ".join(sorted(set(status.nodes))) or "the cluster"),
                              started_at=started, placement=placement, message="",
                              data=repooled or None, **repooled, **moved):
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
                transaction.on_commit(kick)


# --- 1b. utilization -------------------------------------------------------------------

def _utilization(*, backend: ClusterBackend, now: datetime, result: CycleResult) -> None:
    """Rules U1-U5 (services/utilization.py): its reclaims count as requeued or finished
    jobs of this cycle. An unexpected error is logged: it must not stop the cycle."""
    # Several clusters: their readings as one source that outlives this cycle's fleet.
    readable = backend.readings_source() if isinstance(backend, Fleet) else backend
    try:
        done = utilization_cycle_step(source=get_utilization_source(backend=readable),
                                      backend=backend, now=now)
    except NOT_A_JOB_FAULT:
        raise
    except Exception:
        log.exception("cycle %s: the utilization step failed; skipped", result.cycle_id)
        return
    result.requeued.extend(done.requeued)
    result.finished.extend(done.failed)
    if done.requeued or done.failed:
        transaction.on_commit(kick)


# --- 2. snapshot --------------------------------------------------------------------------

# A read: `build_snapshot` and `unprovisioned_teams` are in queueing/selectors/snapshot.py.


# --- 4. apply -----------------------------------------------------------------------------

def plan_job_ids(plan: Plan) -> list[int]:
    """Every job the apply step may write: admitted, preemptors, victims, never met."""
    ids = {a.job_id for a in plan.admissions} | set(plan.never_met)
    for p in plan.preemptions:
        ids.add(p.preemptor_id)
        ids.update(v.job_id for v in p.victims)
    return sorted(ids)


def jobs_lock_in_id_order(ids: Iterable[int]) -> None:
    """Row-lock the jobs `ids` in id order, in one statement, before any of them is
    written (rule L1, docs/scheduling.md "Lock order"). The plan admits in its own
    order (rule O1) and a bulk cancel (`arrays.array_cancel`) locks an array's members
    in id order: were the cycle to lock them as it admits, each could hold a row the
    other wants next and PostgreSQL would abort one as a deadlock. With both in id
    order one waits for the other. A job deleted meanwhile is simply not locked."""
    wanted = sorted(set(ids))
    if wanted:
        list(Job.objects.select_for_update().filter(pk__in=wanted).order_by("pk")
             .values_list("pk", flat=True))


# False: every admission written by `job_transition` (a compare-and-swap and an event
# per job), the reference the tests hold the batched write (`jobs.jobs_admit_batch`) to.
_BATCHED = True


def apply_plan(*, plan: Plan, now: datetime, result: CycleResult | None = None,
               nodes: Sequence[NodeState] = ()) -> list[int]:
    """QUEUED → ADMITTED for each admission, compare-and-swap per job, one transaction.
    A job another cycle already moved is skipped: it is never admitted twice. A spot
    admission records the pools of its nodes (rule C4: `Job.spot_pools`), read from
    `nodes` (the snapshot's; a node not there counts as in no pool).

    On PostgreSQL every admission is written by one statement (`jobs_admit_batch`): the
    compare-and-swap of all the rows (status QUEUED and the attempt read, per row) and
    the winners' events; elsewhere, and with `_BATCHED` off, one `job_transition` per
    job. All admissions go in one savepoint; if one raises, that savepoint is rolled
    back and they are applied again one savepoint each (`_isolated`), so the job that
    raised is failed and every other one is still admitted. The common case pays no
    savepoint per job. First every job the plan writes is row-locked in id order
    (`jobs_lock_in_id_order`), in the caller's transaction."""
    result = result if result is not None else CycleResult()
    # Held until the caller's transaction ends (the cycle's: preemptions and rule D2 too).
    jobs_lock_in_id_order(plan_job_ids(plan))
    if not plan.admissions:
        return []
    try:
        with transaction.atomic():
            return _admit(plan, now=now, result=result, isolate=False, snapshot_nodes=nodes,
                          batched=_BATCHED and connection.vendor == "postgresql")
    except NOT_A_JOB_FAULT:
        raise
    except Exception as exc:
        log.warning("cycle %s: an admission raised %s; admitting one job at a time",
                    result.cycle_id, type(exc).__name__)
    with transaction.atomic():
        return _admit(plan, now=now, result=result, isolate=True, snapshot_nodes=nodes)


@dataclass(slots=True)
class _Admission:
    """What admitting one job writes: its row's new values (`fields`, as
    `job_transition` takes them) and its event's reason and data."""

    job: Job
    reason: str
    data: dict[str, object]
    fields: dict[str, Any]


# The columns `_admission` reads of an admitted job (the batched path reads only these).
_ADMIT_COLUMNS = ("id", "status", "attempt", "gpu_types", "gpus_per_replica", "gpu_slices")


def _admit(plan: Plan, *, now: datetime, result: CycleResult, isolate: bool,
           snapshot_nodes: Sequence[NodeState], batched: bool = False) -> list[int]:
    admitted: list[int] = []
    ids = [a.job_id for a in plan.admissions]
    jobs = (Job.objects.only(*_ADMIT_COLUMNS).in_bulk(ids) if batched
            else Job.objects.in_bulk(ids))
    ctx = _AdmitContext(snapshot_nodes, any_spot=any(a.spot for a in plan.admissions))
    # A requeued job's new attempt resumes from its newest checkpoint (one query).
    resume_from = newest_checkpoints([j.pk for j in jobs.values() if j.attempt > 1])
    todo: list[_Admission] = []
    seen: set[int] = set()
    for a in plan.admissions:
        job = jobs.get(a.job_id)
        if job is None or job.state != JobState.QUEUED:
            continue
        with (_isolated(a.job_id, step="admitting it", now=now, result=result, team=a.team)
              if isolate
              else contextlib.nullcontext()), \
                (transaction.atomic() if isolate else contextlib.nullcontext()):
            one = _admission(a, job, ctx=ctx, result=result,
                             resume=resume_from.get(job.pk), now=now)
            if one is None:
                continue
            if not batched:
                if job_transition(job, JobState.ADMITTED, now=now, reason=one.reason,
                                  data=one.data, **one.fields):
                    admitted.append(job.pk)
            elif job.pk not in seen:  # (one plan admits a job once; a second is moot)
                seen.add(job.pk)
                todo.append(one)
    if batched:
        won = jobs_admit_batch([(one.job, one.reason, one.data, one.fields) for one in todo],
                               now=now)
        admitted = [one.job.pk for one in todo if one.job.pk in won]
    return admitted


class _AdmitContext:
    """What `_admission` looks up across a plan's admissions, each read once if needed."""

    def __init__(self, snapshot_nodes: Sequence[NodeState], *, any_spot: bool) -> None:
        # Rule C4: the pool of each node, only when a spot admission needs it.
        self.pool_of = {n.name: n.pool for n in snapshot_nodes} if any_spot else {}
        # Rule H1: the slices per GPU of the slice-packed nodes (an admission's event says
        # the GPU of each fraction).
        self.spg_of = {n.name: n.slices_per_gpu for n in snapshot_nodes
                       if n.slices_per_gpu > 1}
        self._cluster_ids: dict[str, int] | None = None
        self._type_ids: dict[str, int] | None = None

    def type_id(self, slug: str) -> int | None:
        if self._type_ids is None:
            self._type_ids = dict(GpuType.objects.values_list("slug", "id"))
        return self._type_ids.get(slug)

    def cluster_id(self, name: str) -> int | None:
        if self._cluster_ids is None:
            self._cluster_ids = dict(Cluster.objects.values_list("name", "id"))
        return self._cluster_ids.get(name)


def _admission(a: Any, job: Job, *, ctx: _AdmitContext, result: CycleResult,
               resume: Any, now: datetime) -> _Admission | None:
    """What admitting `job` by admission `a` writes, or None (logged) when the plan's
    admission cannot be applied (a type it does not accept, a gang across clusters, a
    cluster deleted since the snapshot)."""
    # A job accepting several GPU types runs on the one the plan chose: its
    # `gpu_type` from now on (usage, billing weight, prices, quotas, node selector).
    chosen: dict[str, Any] = {}
    if job.gpu_types:
        chosen_id = ctx.type_id(a.gpu_type)
        if a.gpu_type not in job.gpu_types or chosen_id is None:
            log.error("cycle %s: job %s planned on GPU type %r, which it does not "
                      "accept (%s); not admitted", result.cycle_id, a.job_id,
                      a.gpu_type, ", ".join(map(str, job.gpu_types)))
            return None
        chosen = {"gpu_type_id": chosen_id}
    cluster, nodes = admission_cluster(a.placement, a.cluster)
    if cluster is None:
        # Rule K1: never a gang across clusters (a plan that would is not applied).
        log.error("cycle %s: job %s planned across clusters (%s); not admitted",
                  result.cycle_id, a.job_id, ", ".join(a.placement))
        return None
    cluster_id: int | None = None
    if cluster:
        cluster_id = ctx.cluster_id(cluster)
        if cluster_id is None:
            return None  # a cluster deleted since the snapshot: the next plan places it
    where = f"{cluster}: " if cluster else ""
    data: dict[str, object] = {"placement": nodes}
    slots = {"gpu_slots": list(a.gpu_slots)} if a.gpu_slots else {}
    if slots:  # rule H1: the GPU(s) of each replica on a slice-packed type
        data.update(slots)
    if cluster:
        data["cluster"] = cluster
    pools = (spot_pools(a.placement, ctx.pool_of, gpus_per_replica=job.gpus_per_replica)
             if a.spot else {})
    if pools:
        data["spot_pools"] = pools
    reason = f"admitted on {where}{', '.join(sorted(set(nodes)))}"
    if slots:
        reason += gpu_slots_words(a.gpu_slots, job.gpu_slices,
                                  ctx.spg_of.get(a.placement[0], 1))
    resumes, resume_data = resume_note(resume)
    if resume_data:
        data["resumes_from"] = resume_data
    if chosen:
        data["gpu_type"] = a.gpu_type
        reason += (f" as {a.gpu_type} (accepts "
                   f"{', '.join(map(str, job.gpu_types))})")
    reason += resumes
    return _Admission(job=job, reason=reason, data=data, fields=dict(
        admitted_at=now, placement=nodes, cluster_id=cluster_id, on_spot=a.spot,
        spot_pools=pools, gpu_slots=list(a.gpu_slots), **chosen))


def gpu_slots_words(slots: Sequence[int], gpu_slices: int, slices_per_gpu: int) -> str:
    """Rule H1 in an admission's event: "; GPU 1 (2 slices of 4)" for a fraction, the
    GPU indexes for whole GPUs."""
    gpus = ", ".join(str(i) for i in dict.fromkeys(slots))
    plural = "s" if len(set(slots)) != 1 else ""
    if gpu_slices:
        return (f"; GPU{plural} {gpus} ({gpu_slices} slice{'s' if gpu_slices != 1 else ''} "
                f"of {slices_per_gpu} each)")
    return f"; GPU{plural} {gpus}"


def spot_pools(placement: Iterable[str], pool_of: Mapping[str, str], *,
               gpus_per_replica: int) -> dict[str, int]:
    """Rule C4: {pool name: GPUs} of an attempt on spot nodes, one replica per node of
    `placement` (names as `pool_of` has them); "" = nodes in no pool."""
    out: dict[str, int] = {}
    for node in placement:
        pool = pool_of.get(node, "")
        out[pool] = out.get(pool, 0) + gpus_per_replica
    return out


def admission_cluster(placement: tuple[str, ...], cluster: str = ""
                      ) -> tuple[str | None, list[str]]:
    """An admission's cluster and its nodes as that cluster names them (docs/clusters.md,
    "Naming": the policy's "<cluster>/<node>" names are stored unqualified, beside
    `Job.cluster`). `cluster`: the policy's `Admission.cluster` when it gives one, else
    read from the node names. None when the nodes are in several clusters (rule K1)."""
    split = [unqualified_node(n) for n in placement]
    found = {c for c, _ in split}
    if len(found) > 1 or (cluster and found and found != {cluster}):
        return None, []
    return (cluster or (found.pop() if found else "")), [n for _, n in split]


def _preemptions_apply(*, plan: Plan, now: datetime, result: CycleResult) -> Applied:
    """`preemptions_apply` in a savepoint: if it raises unexpectedly, this cycle makes
    no preemption (logged with the cycle id) and its admissions still commit."""
    if not plan.preemptions:
        return Applied()
    try:
        with transaction.atomic():
            return preemptions_apply(plan=plan, now=now)
    except NOT_A_JOB_FAULT:
        raise
    except Exception as exc:
        log.error("cycle %s: applying the preemptions of %s raised %s; none this cycle",
                  result.cycle_id, sorted(p.preemptor_id for p in plan.preemptions)[:20],
                  type(exc).__name__, exc_info=exc)
        return Applied()


# --- 5. submit ----------------------------------------------------------------------------

def _victims_stop(*, backend: ClusterBackend, names: Sequence[str], now: datetime,
                  result: CycleResult, budget: Budget) -> None:
    """Step 5's first half: the victims' workloads stopped, their logs kept first
    (`preempted_workloads_stop`), FAIRQ_LOG_READ_CONCURRENCY at a time; once the budget
    is spent the rest are left running for the next cycle, kicked at once, whose
    reconcile stops them as workloads no job holds (their attempt is no longer their
    job's). Their preemptors wait for them meanwhile (rule R8)."""
    chunk = max(1, int(settings.FAIRQ_LOG_READ_CONCURRENCY))
    for start in range(0, len(names), chunk):
        if start and budget.spent():
            result.deferred["stop"] = result.deferred.get("stop", 0) + len(names) - start
            return
        preempted_workloads_stop(backend=backend, names=list(names[start:start + chunk]),
                                 now=now)


def launch_spec(job: Job, *,
                node_topology: Mapping[str, Mapping[str, str]] | None = None) -> LaunchSpec:
    """What the backend runs for `job`'s attempt. `node_topology` (node -> level ->
    domain, from the backend's nodes) gives a required topology's domain (rule A7): the
    one of its planned nodes, pinned on the level's node label. Every pod has a memory
    limit and a preemptible tier's grace is capped (rule R10), a job queued before
    either rule included (`jobs.default_memory_bytes`, `jobs.tier_grace_cap`)."""
    level, label, domain = "", "", ""
    if job.topology_level and job.topology_mode == "required":
        label = next((str(lv.get("node_label")) for lv in job.gpu_type.topology_levels or ()
                      if isinstance(lv, dict) and lv.get("name") == job.topology_level), "")
        planned = list(job.placement or ())
        domains = {(node_topology or {}).get(n, {}).get(job.topology_level) for n in planned}
        if label and planned and len(domains) == 1 and None not in domains:
            level, domain = job.topology_level, str(domains.pop())
        else:
            label = ""  # the planned nodes are gone or not one domain: no pin to give
            log.warning("job %s: no %s domain known for its placement %s; not pinned",
                        job.pk, job.topology_level, planned)
    # A job queued before every pod had a memory limit, or before rule R10's cap (or
    # its tier's cap lowered since): the pod still gets both.
    memory = job.memory_bytes
    if memory is None:
        largest = largest_node_cpu_memory(job.gpu_type.slug)
        memory = default_memory_bytes(gpus_per_replica=job.gpus_per_replica,
                                      largest_node=None if largest is None else largest[1])
    # None: the backend's default (FAIRQ_K8S_TERMINATION_GRACE_SECONDS), unless above
    # the cap.
    grace, cap = job.termination_grace_seconds, tier_grace_cap(job.tier)
    if cap is not None and (grace if grace is not None
                            else settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS) > cap:
        grace = cap
    return LaunchSpec(
        name=job.backend_name, job_id=job.pk, attempt=job.attempt, team=job.team.slug,
        tier=job.tier.slug, priority_class_name=job.tier.priority_class_name,
        gpu_type=job.gpu_type.slug, resource_name=job.gpu_type.resource_name,
        node_labels=dict(job.gpu_type.node_labels or {}),
        gpus_per_replica=job.gpus_per_replica, replicas=job.replicas, image=job.image,
        command=list(job.command or []), args=list(job.args or []),
        env={str(k): str(v) for k, v in (job.env or {}).items()},
        max_runtime_seconds=job.max_runtime_seconds, placement=tuple(job.placement or ()),
        spot=job.on_spot, run_as_non_root=job.team.run_as_non_root,
        cpu_millicores=job.cpu_millicores, memory_bytes=memory,
        ephemeral_storage_bytes=job.ephemeral_storage_bytes, shm_size_bytes=job.shm_size_bytes,
        topology_level=level, topology_label=label, topology_domain=domain,
        volumes=tuple(job.volumes or ()), secrets=tuple(job.secrets or ()),
        image_pull_secret=job.image_pull_secret, working_dir=job.working_dir,
        labels=dict(job.labels or {}), annotations=dict(job.annotations or {}),
        termination_grace_seconds=grace,
        # Graceful stop: the signal first, then where and with what the attempt reports
        # its checkpoints ("" when FAIRQ_PUBLIC_URL is unset: not offered, env not set).
        stop_signal=job.stop_signal or "SIGTERM",
        checkpoint_url=(url := checkpoint_url(job.pk)),
        checkpoint_token=checkpoint_token(job_id=job.pk, attempt=job.attempt) if url else "",
        # Shared GPUs: its units of the type's resource per replica, and where a
        # fraction's slices were packed (docs/kubernetes.md, "Shared GPUs").
        units_per_replica=job.units_per_replica, gpu_slots=tuple(job.gpu_slots or ()),
        sharing=job.gpu_type.sharing, slices_per_gpu=job.gpu_type.slices_per_gpu,
        gpu_slices=job.gpu_slices,
        # A notebook session: its server's path and this attempt's token.
        **session_launch_fields(job),
    )


# Step 5 reads its rows and writes their marks per group of chunks, a group growing from
# one chunk to the whole chunks `SUBMIT_GROUP_MAX` rows hold (False: per chunk, the plain
# path). The creates still go a chunk at a time with the budget checked before each, as
# on the plain path.
_BATCHED_SUBMIT = True
SUBMIT_GROUP_MAX = 1024
# Columns no launch spec reads: left unread by the batched path (a failed create's
# bookkeeping that wants one reads it then).
_SUBMIT_UNREAD = ("gpu_types", "resources", "dependencies", "cluster_selector", "spot_pools",
                  "notify_url", "idempotency_key")


def submit_admitted(*, backend: ClusterBackend, now: datetime, result: CycleResult,
                    budget: Budget | None = None) -> None:
    """Submit every admitted job not yet marked submitted (this cycle's and any a killed
    worker left behind: the backend's create is idempotent by name), the longest
    admitted first, in chunks of FAIRQ_CYCLE_SUBMIT_CHUNK: once `budget` is spent and
    the step has had its floor, `SUBMIT_SCALED_MAX` of the budget (`Budget.submit_spent`),
    no new chunk starts, and the rest are the next cycle's (`result.deferred["submit"]`).

    The creates run on up to `backend.submit_concurrency` threads (most of a create is
    waiting on the API server); no transaction is open meanwhile. Then, in this thread,
    each job's outcome is handled by one call (`_submit_outcome`), and the jobs whose
    workload now exists are marked submitted in one UPDATE per attempt number: per chunk
    (`_BATCHED_SUBMIT` off), or per group of chunks read in one query (`_submit_groups`).
    A worker killed in between leaves them unmarked: the next cycle submits them again,
    and the backend adopts its own workloads. A job whose launch spec cannot be built,
    or whose bookkeeping raises, fails alone (`_isolated`)."""
    # The ids first (an index scan); the rows and launch specs a chunk (or a group) at a
    # time, so a budget spent early costs no spec of a job left for the next cycle.
    pending = Job.objects.filter(status=JobState.ADMITTED, submitted_to_backend_at__isnull=True)
    ids = list(pending.order_by("admitted_at", "id").values_list("pk", flat=True))
    step = _SubmitStep(backend=backend, now=now, result=result)
    chunk = max(1, int(settings.FAIRQ_CYCLE_SUBMIT_CHUNK))
    step_started = time.perf_counter()
    if _BATCHED_SUBMIT:
        _submit_groups(step, pending=pending, ids=ids, chunk=chunk, budget=budget,
                       step_started=step_started)
        return
    for start in range(0, len(ids), chunk):
        if start and budget is not None and budget.submit_spent(step_started):
            result.deferred["submit"] = len(ids) - start
            return
        rows = list(pending.filter(pk__in=ids[start:start + chunk]).order_by("admitted_at", "id"))
        step.related.attach(rows)
        _submit_marks(step.create(rows), now=now, result=result)


def _submit_groups(step: _SubmitStep, *, pending: QuerySet[Job], ids: list[int], chunk: int,
                   budget: Budget | None, step_started: float) -> None:
    """`submit_admitted`'s batched path: the rows of a group of chunks in one read (a
    group grows from one chunk to the whole chunks `SUBMIT_GROUP_MAX` rows hold, so a
    budget spent after the first chunk reads little more than it), each chunk's creates
    and outcomes as on the plain path, the budget checked before each chunk, then the
    group's marks in one UPDATE per attempt number (those of the chunks done when the
    budget stops it). An exception that ends the cycle leaves the group's earlier chunks unmarked, as a
    killed worker does: the next cycle submits them again and the backend adopts them."""
    start, size = 0, chunk
    while start < len(ids):
        rows = list(pending.filter(pk__in=ids[start:start + size]).defer(*_SUBMIT_UNREAD)
                    .order_by("admitted_at", "id"))
        step.related.attach(rows)
        # The rows as the plain path takes them: by the ids' chunks (a row gone from
        # the read, moved on since, takes no place of another's).
        where = {pk: k // chunk for k, pk in enumerate(ids[start:start + size])}
        parts: list[list[Job]] = [[] for _ in range(-(-min(size, len(ids) - start) // chunk))]
        for job in rows:
            parts[where[job.pk]].append(job)
        submitted: list[Job] = []
        for k, part in enumerate(parts):
            at = start + k * chunk
            if at and budget is not None and budget.submit_spent(step_started):
                _submit_marks(submitted, now=step.now, result=step.result)
                step.result.deferred["submit"] = len(ids) - at
                return
            submitted += step.create(part)
        _submit_marks(submitted, now=step.now, result=step.result)
        start += size
        # Whole chunks only: the chunks, and the budget's tests before them, are the
        # plain path's.
        size = min(size * 2, max(1, SUBMIT_GROUP_MAX // chunk) * chunk)


class _SubmitStep:
    """What step 5 keeps across its chunks: the related rows (`_Related`) and rule A7's
    node topology per target cluster (read once, when needed)."""

    def __init__(self, *, backend: ClusterBackend, now: datetime, result: CycleResult) -> None:
        self.backend, self.now, self.result = backend, now, result
        self.related = _Related()
        self.node_topology: dict[int, dict[str, Mapping[str, str]]] = {}

    def create(self, rows: Sequence[Job]) -> list[Job]:
        """One chunk: each job's launch spec and create, each outcome handled; the jobs
        whose workload now exists, to be marked submitted."""
        backend, now, result = self.backend, self.now, self.result
        jobs: list[Job] = []
        specs: list[LaunchSpec] = []
        targets: list[ClusterBackend] = []
        for job in rows:
            # Several clusters: each job is created on its own (`Job.cluster`); one whose
            # cluster is unreachable waits for rule K5, which requeues it.
            target = backend.backend_of(job.cluster_id) if isinstance(backend, Fleet) and \
                backend.several else backend
            if target is None:
                continue
            with _isolated(job.pk, step="building its workload", now=now, result=result,
                           team=job.team.slug):
                topology = None
                if job.topology_level and job.topology_mode == "required":
                    if id(target) not in self.node_topology:
                        self.node_topology[id(target)] = {n.name: n.topology
                                                          for n in target.nodes()}
                    topology = self.node_topology[id(target)]
                specs.append(launch_spec(job, node_topology=topology))
                jobs.append(job)
                targets.append(target)
        if not jobs:
            return []
        errors = _create_workloads(backend=backend, specs=specs, now=now, targets=targets)
        submitted: list[Job] = []
        for job, error in zip(jobs, errors, strict=True):
            with _isolated(job.pk, step="recording its submit", now=now, result=result,
                           team=job.team.slug):
                if _submit_outcome(job=job, error=error, now=now, result=result):
                    submitted.append(job)
        return submitted


class _Related:
    """The teams, tiers and GPU types of the jobs step 5 submits: a few rows, each read
    once per cycle and shared by its jobs (a join per job built three more model
    instances per job, a fifth of the step's own time)."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[int, Any]] = {"team": {}, "tier": {}, "gpu_type": {}}

    def attach(self, jobs: Sequence[Job]) -> None:
        for name, model in (("team", Team), ("tier", Tier), ("gpu_type", GpuType)):
            known = self._rows[name]
            missing = {getattr(j, f"{name}_id") for j in jobs} - known.keys()
            if missing:
                known.update(model.objects.in_bulk(missing))
            for job in jobs:
                setattr(job, name, known[getattr(job, f"{name}_id")])


def _submit_marks(submitted: Sequence[Job], *, now: datetime, result: CycleResult) -> None:
    """Mark `submitted` (their workloads exist) submitted: one UPDATE per attempt number,
    rule S1's compare-and-swap on status and attempt; a batch one row spoils is marked
    one job at a time, each isolated."""
    by_attempt: dict[int, list[Job]] = defaultdict(list)
    for job in submitted:
        by_attempt[job.attempt].append(job)
    for attempt, group in by_attempt.items():
        try:
            with transaction.atomic():
                Job.objects.filter(pk__in=[j.pk for j in group], status=JobState.ADMITTED,
                                   attempt=attempt).update(submitted_to_backend_at=now)
            result.submitted.extend(j.pk for j in group)
        except NOT_A_JOB_FAULT:
            raise
        except Exception:  # one row spoils the batch: mark them one by one, isolated
            for job in group:
                with _isolated(job.pk, step="marking it submitted", now=now, result=result), \
                        transaction.atomic():
                    Job.objects.filter(pk=job.pk, status=JobState.ADMITTED,
                                       attempt=attempt).update(submitted_to_backend_at=now)
                    result.submitted.append(job.pk)


def _create_workloads(*, backend: ClusterBackend, specs: list[LaunchSpec],
                      now: datetime, targets: list[ClusterBackend] | None = None
                      ) -> list[Exception | None]:
    """`submit` for each spec, in order, on a bounded pool of threads; per spec the
    exception it raised, or None. `targets`: per spec, the backend of its cluster (else
    `backend` for all). Backends without `submit_concurrency` (the simulated one) are
    called one after the other in this thread."""
    where = dict(zip((id(s) for s in specs), targets or (), strict=False))

    def create(spec: LaunchSpec) -> Exception | None:
        try:
            where.get(id(spec), backend).submit(spec, now=now)
        except Exception as exc:  # handled per job by _submit_outcome
            return exc
        finally:
            if threading.current_thread() is not main_thread:
                # A backend that reads the database (a team's quota, on its namespace's
                # first use) opened a connection in this pool thread: do not leak it.
                connections.close_all()
        return None

    main_thread = threading.current_thread()
    workers = min(int(getattr(backend, "submit_concurrency", 1) or 1), len(specs))
    if workers <= 1:
        return [create(spec) for spec in specs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fairq-submit") as pool:
        return list(pool.map(create, specs))


def _submit_outcome(*, job: Job, error: Exception | None, now: datetime,
                    result: CycleResult) -> bool:
    """Record what submitting one job came to; True when its workload exists (adopted
    or created) and the job is to be marked submitted."""
    if error is None:
        return True
    if isinstance(error, SubmitRequeue):
        # Its name is held by a workload on its way out: a new attempt gets a new name.
        with transaction.atomic():
            if job_transition(
                job, JobState.QUEUED, now=now, reason=f"{error}; requeued as a new attempt",
                **next_attempt(job.attempt + 1),
            ):
                result.requeued.append(job.pk)
        return False
    submit_failed(job=job, error=error, now=now, result=result)
    return False


# HTTP statuses on create that mean "refused until someone changes something" (a quota
# on Jobs, an RBAC denial), as opposed to a cluster that is briefly unwell.
REFUSALS = frozenset({403})


def submit_error_code(error: BaseException) -> int:
    """The HTTP status behind a submit error (the API exception it was raised from), 0
    when there is none (a timeout, a refused connection)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        status = getattr(current, "status", None)
        if isinstance(status, int) and status:
            return status
        current = current.__cause__ or current.__context__
    return 0


def submit_failed(*, job: Job, error: Exception, now: datetime, result: CycleResult) -> None:
    """What one failed create means for its job (the one place that classifies it):

    - SubmitRejected (400/422, an invalid spec): the job FAILS with the reason.
    - a refusal (403: an exhausted namespace quota on Jobs, an RBAC denial; or what the
      backend reports as one, `SubmitRefused`: a team namespace not or no longer
      provisioned, whatever the process knew of it before): the job stays
      ADMITTED showing why (its message, an event per distinct error, the metric
      `fairq_k8s_submit_errors_total{code}`); once the refusals have lasted
      FAIRQ_K8S_SUBMIT_REFUSED_SECONDS it FAILS, giving its GPUs back.
    - anything else (5xx, 404, timeouts, no connection) is transient: the same reason,
      event and metric, and the next cycle retries for as long as it takes.
    """


    text = str(error)
    result.submit_errors[job.pk] = text
    if isinstance(error, SubmitRejected):
        with transaction.atomic():
            job_transition(job, JobState.FAILED, now=now, reason=f"rejected: {text}",
                           finished_at=now, message=text[:500])
        return
    code = submit_error_code(error)
    label = str(code) if code else "none"
    record_submit_error(label)
    refusal = code in REFUSALS or isinstance(error, SubmitRefused)
    log.warning("cycle %s: submit of %s failed (%s), retrying next cycle: %s",
                result.cycle_id, job.backend_name, label, clean_text(text, max_length=300))
    reason = clean_text(f"{WAITING}Kubernetes {'refused' if refusal else 'did not take'} "
                        f"the Job ({label}): {text}", max_length=500)
    with transaction.atomic():
        events = JobEvent.objects.filter(job=job, attempt=job.attempt, kind=JobEvent.Kind.SUBMIT_ERROR)
        if not events.filter(reason=reason).exists():
            JobEvent.objects.create(job=job, at=now, kind=JobEvent.Kind.SUBMIT_ERROR,
                                    actor_label="scheduler", reason=reason,
                                    attempt=job.attempt,
                                    data={"code": code, "refusal": refusal})
        if job.message != reason:
            Job.objects.filter(pk=job.pk, attempt=job.attempt,
                               status=JobState.ADMITTED).update(message=reason)
        if not refusal:
            return
        since = events.filter(data__refusal=True).order_by("at").values_list(
            "at", flat=True).first() or now
        limit = settings.FAIRQ_K8S_SUBMIT_REFUSED_SECONDS
        if (now - since).total_seconds() >= limit:
            why = f"Kubernetes refused to create its Job for {limit} s ({label}): {text}"
            job_transition(job, JobState.FAILED, now=now, reason=why[:500],
                           finished_at=now, message=why[:500])
