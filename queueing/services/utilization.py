"""GPU utilization of running jobs and idle GPUs (docs/scheduling.md, "Idle GPUs", rules
U1-U5), one step of the scheduler cycle (after reconcile, before the snapshot, so GPUs
reclaimed here are free for this cycle's plan).

    1. read      — one call to the utilization source for every fairq pod (Prometheus:
                   one instant query), at most once per minute of `now`.
    2. aggregate — per job attempt: SM activity averaged over its pods, memory summed.
    3. sample    — per RUNNING job attempt whose last sample is older than this minute:
                   its per-minute sample, its summary (rule U5) and rules U1-U4
                   (`queueing.policy.idle.idle_step`, pure).
    4. apply     — in one transaction: the samples, the summaries, an `idle` event per
                   flag (U2) and per job busy again (U4), and each reclaim (U3) through
                   `job_transition`: RUNNING → PREEMPTED → QUEUED (attempt + 1) or
                   RUNNING → FAILED with reason "idle", its GPU time charged.
    5. stop      — after commit, the reclaimed workloads are stopped (their logs kept),
                   the way a preemption's are.

A source that fails is logged and skipped: no readings is never idleness.
"""

from __future__ import annotations

import logging
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from queueing.backends.base import ClusterBackend, PodReading, UtilizationSource
from queueing.models import (
    UTIL_HIST_BINS,
    AttemptUtilization,
    Job,
    JobEvent,
    Tier,
    UtilizationSample,
)
from queueing.policy.idle import (
    IdleRule,
    IdleState,
    Verdict,
    idle_step,
    percentile_from_histogram,
)
from queueing.policy.states import JobState

from .jobs import job_transition
from .logs import workload_stop_keeping_logs
from .usage import usage_record_attempt

log = logging.getLogger(__name__)

# The summary columns `_update_rows` writes, in order (then the row id).
_UPDATED = ("last_at", "samples", "sm_sum", "mem_sum", "sm_hist", "sm_last", "sm_mean",
            "sm_p95", "mem_last_bytes", "mem_mean_bytes", "mem_max_bytes", "below_since",
            "idle_since")


@dataclass
class IngestResult:
    read: bool = False  # the source was asked (not already this minute)
    readings: int = 0
    sampled: int = 0  # job attempts that got this minute's sample
    flagged: list[int] = field(default_factory=list)
    busy_again: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    workloads: list[str] = field(default_factory=list)  # reclaimed: stopped after commit
    error: str = ""


@dataclass(frozen=True, slots=True)
class AttemptReading:
    """One job attempt's GPUs this minute (rule U5): SM activity, mean over its pods (each
    replica has the same GPUs); frame buffer bytes, summed."""

    sm_percent: float
    mem_bytes: int


def aggregate(readings: list[PodReading]) -> dict[tuple[int, int], AttemptReading]:
    pods: dict[tuple[int, int], list[PodReading]] = defaultdict(list)
    for r in readings:
        pods[(r.job_id, r.attempt)].append(r)
    return {key: AttemptReading(sum(p.sm_percent for p in ps) / len(ps),
                                sum(p.fb_used_bytes for p in ps))
            for key, ps in pods.items()}


# The minute each source was last read in (per process): a minute is sampled once.
_last_read_minute: weakref.WeakKeyDictionary[Any, datetime] = weakref.WeakKeyDictionary()


def utilization_cycle_step(*, source: UtilizationSource | None, backend: ClusterBackend,
                           now: datetime) -> IngestResult:
    """The cycle's step (steps 1-5 above), at most one read of `source` per minute of
    `now` in this process; nothing without a source. Never raises for the source."""
    if source is None:
        return IngestResult()
    minute = now.replace(second=0, microsecond=0)
    if _last_read_minute.get(source) == minute:
        return IngestResult()
    try:
        readings = source.readings(now=now)
    except Exception as exc:  # a source that cannot answer: no data, not idleness (U1)
        log.warning("utilization: the source did not answer: %s: %s", type(exc).__name__, exc)
        return IngestResult(error=f"{type(exc).__name__}: {exc}"[:300])
    _last_read_minute[source] = minute
    result = utilization_ingest(readings=readings, now=now)
    result.read = True
    utilization_reclaimed_stop(backend=backend, result=result, now=now)
    return result


def utilization_reclaimed_stop(*, backend: ClusterBackend, result: IngestResult,
                               now: datetime) -> None:
    """Step 5: stop the reclaimed workloads (their logs kept). A stop that fails is
    retried by the next cycle's reconcile: the workload no longer matches its job's
    attempt or state, so it is stopped as an orphan."""
    for name in result.workloads:
        try:
            workload_stop_keeping_logs(backend=backend, name=name, now=now)
        except Exception:
            log.warning("stopping idle workload %s failed; the next cycle retries", name,
                        exc_info=True)


def _rules() -> dict[int, tuple[str, IdleRule]]:
    return {pk: (slug, IdleRule(float(thr), int(window), str(action), int(grace)))
            for pk, slug, thr, window, action, grace in Tier.objects.values_list(
                "pk", "slug", "idle_threshold_percent", "idle_window_minutes", "idle_action",
                "idle_grace_minutes")}


def utilization_ingest(*, readings: list[PodReading], now: datetime) -> IngestResult:
    """Steps 2-4 for `readings` taken at `now` (the minute of `now` is the sample's).
    Readings of jobs not RUNNING in that attempt are ignored; an attempt with a sample
    for this minute already is left alone (idempotent). Returns what it did; the caller
    stops `result.workloads` after commit (`utilization_reclaimed_stop`)."""
    result = IngestResult(readings=len(readings))
    minute = now.replace(second=0, microsecond=0)
    by_attempt = aggregate(readings)
    if not by_attempt:
        return result
    running = {(pk, attempt): tier_id for pk, attempt, tier_id in Job.objects.filter(
        pk__in={job for job, _ in by_attempt}, status=JobState.RUNNING).values_list(
        "pk", "attempt", "tier_id")}
    if not running:
        return result
    rules = _rules()
    existing = {(row[1], row[2]): row for row in AttemptUtilization.objects.filter(
        job_id__in={job for job, _ in running}).values_list("pk", "job_id", "attempt",
                                                             *_UPDATED)}
    samples: list[UtilizationSample] = []
    created: list[AttemptUtilization] = []
    updated: list[tuple[Any, ...]] = []
    verdicts: dict[tuple[int, int], tuple[Verdict, IdleState, float]] = {}
    for key, tier_id in running.items():
        reading = by_attempt.get(key)
        if reading is None:
            continue
        row = existing.get(key)
        if row is not None and row[3] >= minute:
            continue  # this minute is sampled already
        values = dict(zip(_UPDATED, row[3:], strict=True)) if row is not None else {
            "samples": 0, "sm_sum": 0.0, "mem_sum": 0.0, "sm_hist": [], "mem_max_bytes": 0,
            "below_since": None, "idle_since": None, "last_at": None}
        hist = list(values["sm_hist"] or [])
        if len(hist) != UTIL_HIST_BINS:
            hist = [0] * UTIL_HIST_BINS
        sm, mem = reading.sm_percent, reading.mem_bytes
        hist[min(UTIL_HIST_BINS - 1, int(sm))] += 1
        n = values["samples"] + 1
        rule = rules[tier_id][1]
        state, verdict = idle_step(
            IdleState(values["last_at"], values["below_since"], values["idle_since"]),
            minute=minute, sm_percent=sm, rule=rule)
        if verdict != Verdict.NONE:
            verdicts[key] = (verdict, state, sm)
        new = {"last_at": minute, "samples": n, "sm_sum": values["sm_sum"] + sm,
               "mem_sum": values["mem_sum"] + mem, "sm_hist": hist, "sm_last": sm,
               "sm_mean": (values["sm_sum"] + sm) / n,
               "sm_p95": percentile_from_histogram(hist, 0.95), "mem_last_bytes": mem,
               "mem_mean_bytes": round((values["mem_sum"] + mem) / n),
               "mem_max_bytes": max(values["mem_max_bytes"], mem),
               "below_since": state.below_since, "idle_since": state.idle_since}
        samples.append(UtilizationSample(job_id=key[0], attempt=key[1], minute=minute, sm=sm,
                                         mem_bytes=mem))
        if row is None:
            created.append(AttemptUtilization(job_id=key[0], attempt=key[1], first_at=minute,
                                              **new))
        else:
            updated.append((*(new[f] for f in _UPDATED), row[0]))
    result.sampled = len(samples)
    with transaction.atomic():
        UtilizationSample.objects.bulk_create(samples, batch_size=2000, ignore_conflicts=True)
        AttemptUtilization.objects.bulk_create(created, batch_size=2000)
        _update_rows(updated)
        _apply_verdicts(verdicts, rules=rules, running=running, now=now, result=result)
    return result


def _update_rows(rows: list[tuple[Any, ...]]) -> None:
    """One UPDATE per row, sent in one batch (psycopg pipelines `executemany`): far
    cheaper than the ORM's bulk_update, whose CASE per column grows with the batch."""
    if not rows:
        return
    concrete = {f.name: f for f in AttemptUtilization._meta.concrete_fields}
    fields = [concrete[name] for name in _UPDATED]
    quote = connection.ops.quote_name
    sql = (f"UPDATE {quote(AttemptUtilization._meta.db_table)} SET "
           + ", ".join(f"{quote(f.column or f.name)} = %s" for f in fields)
           + f" WHERE {quote('id')} = %s")
    prepared = [[f.get_db_prep_save(v, connection) for f, v in zip(fields, row[:-1],
                                                                   strict=True)] + [row[-1]]
                for row in rows]
    with connection.cursor() as cur:
        cur.executemany(sql, prepared)


def _apply_verdicts(verdicts: dict[tuple[int, int], tuple[Verdict, IdleState, float]], *,
                    rules: dict[int, tuple[str, IdleRule]], running: dict[tuple[int, int], int],
                    now: datetime, result: IngestResult) -> None:
    """Rules U2-U4's events and U3's reclaims (inside the ingest's transaction)."""
    events: list[JobEvent] = []
    reclaim: list[tuple[tuple[int, int], Verdict]] = []
    for key, (verdict, state, sm) in sorted(verdicts.items()):
        slug, rule = rules[running[key]]
        data: dict[str, Any] = {"sm_percent": round(sm, 1), "tier": slug,
                                "threshold_percent": rule.threshold_percent,
                                "window_minutes": rule.window_minutes,
                                "action": rule.action, "grace_minutes": rule.grace_minutes}
        if verdict == Verdict.FLAG:
            assert state.below_since is not None
            then = ("only flagged" if rule.action == "flag" else
                    f"{'requeued' if rule.action == 'requeue' else 'failed'} after "
                    f"{rule.grace_minutes} more minute(s) below it")
            events.append(JobEvent(
                job_id=key[0], at=now, kind=JobEvent.Kind.IDLE, actor_label="scheduler",
                attempt=key[1], data={**data, "rule": "U2",
                                      "below_since": state.below_since.isoformat()},
                reason=f"idle: its GPUs' SM activity has been below "
                       f"{rule.threshold_percent:g}% for {rule.window_minutes} minute(s) "
                       f"(rule U2); tier {slug}: {then}"))
            result.flagged.append(key[0])
        elif verdict == Verdict.BUSY_AGAIN:
            events.append(JobEvent(
                job_id=key[0], at=now, kind=JobEvent.Kind.IDLE, actor_label="scheduler",
                attempt=key[1], data={**data, "rule": "U4"},
                reason=f"busy again: SM activity {sm:.0f}% (rule U4); no longer idle"))
            result.busy_again.append(key[0])
        else:
            reclaim.append((key, verdict))
            events.append(JobEvent(
                job_id=key[0], at=now, kind=JobEvent.Kind.IDLE, actor_label="scheduler",
                attempt=key[1], data={**data, "rule": "U3"},
                reason=f"reclaimed: idle for {rule.grace_minutes} minute(s) after its flag "
                       f"(rule U3, tier {slug}: {rule.action})"))
    JobEvent.objects.bulk_create(events, batch_size=2000)
    if not reclaim:
        return
    jobs = Job.objects.select_related("gpu_type").in_bulk([k[0] for k, _ in reclaim])
    # Charging locks the teams' accumulators: in team order, as preemption takes them.
    for (job_id, attempt), verdict in sorted(
            reclaim, key=lambda kv: (jobs[kv[0][0]].team_id if kv[0][0] in jobs else 0,
                                     kv[0][0])):
        job = jobs.get(job_id)
        if job is None or job.attempt != attempt or job.state != JobState.RUNNING:
            continue
        with transaction.atomic():
            if _reclaim(job, requeue=verdict == Verdict.REQUEUE, now=now):
                (result.requeued if verdict == Verdict.REQUEUE else result.failed).append(
                    job_id)
                result.workloads.append(f"fq-{job_id}-{attempt}")


def _reclaim(job: Job, *, requeue: bool, now: datetime) -> bool:
    """Rule U3 for one job, through the one state-change path (rule S1): its attempt is
    charged up to now; requeue = PREEMPTED → QUEUED as attempt + 1 (submit time kept),
    else FAILED with reason "idle". False when the job moved meanwhile."""
    started = job.started_at or now
    data = {"rule": "U3", "workload": job.backend_name}
    if requeue:
        if not job_transition(job, JobState.PREEMPTED, now=now, data=data,
                              reason="idle: reclaimed (rule U3); its GPUs are freed"):
            return False
        usage_record_attempt(job=job, start=started, end=now)
        return job_transition(
            job, JobState.QUEUED, now=now, data=data,
            reason="requeued after it was reclaimed idle; keeps its submit time",
            attempt=job.attempt + 1, placement=[], admitted_at=None, started_at=None,
            submitted_to_backend_at=None)
    if not job_transition(job, JobState.FAILED, now=now, data=data, finished_at=now,
                          reason="idle: its GPUs stayed idle; failed (rule U3)",
                          message="idle"):
        return False
    usage_record_attempt(job=job, start=started, end=now)
    return True


def utilization_purge(*, now: datetime, days: float) -> int:
    """Delete per-minute samples older than `days` (the summaries are kept)."""
    deleted, _ = UtilizationSample.objects.filter(
        minute__lt=now - timedelta(days=days)).delete()
    return deleted
