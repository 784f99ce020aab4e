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

import json
import logging
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import F

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

from .jobs import job_transition, next_attempt
from .logs import workload_stop_keeping_logs
from .notices import idle_notices_send
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
    idle_notices_send(flagged=result.flagged, requeued=result.requeued, failed=result.failed)
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
    stops `result.workloads` after commit (`utilization_reclaimed_stop`).

    Built for 10,000 running jobs in well under a second (bench/bench_util.py): two
    reads with no parameter lists (the running jobs, their current attempts'
    summaries), and on PostgreSQL one INSERT and one UPDATE over arrays (`unnest`)."""
    result = IngestResult(readings=len(readings))
    minute = now.replace(second=0, microsecond=0)
    by_attempt = aggregate(readings)
    if not by_attempt:
        return result
    running = {(pk, attempt): tier_id for pk, attempt, tier_id in Job.objects.filter(
        status=JobState.RUNNING).values_list("pk", "attempt", "tier_id")}
    keys = [k for k in by_attempt if k in running]
    if not keys:
        return result
    rules = _rules()
    existing = {(row[1], row[2]): row for row in AttemptUtilization.objects.filter(
        job__status=JobState.RUNNING, attempt=F("job__attempt")).values_list(
        "pk", "job_id", "attempt", *_UPDATED)}
    samples: list[tuple[int, int, float, int]] = []
    created: list[tuple[Any, ...]] = []
    updated: list[tuple[Any, ...]] = []
    verdicts: dict[tuple[int, int], tuple[Verdict, IdleState, float]] = {}
    p95 = percentile_from_histogram
    for key in sorted(keys):
        reading = by_attempt[key]
        row = existing.get(key)
        if row is not None and row[3] >= minute:
            continue  # this minute is sampled already
        if row is None:
            last_at, n, sm_sum, mem_sum, hist, mem_max = None, 0, 0.0, 0.0, {}, 0
            below_since = idle_since = None
        else:
            (last_at, n, sm_sum, mem_sum, hist, _, _, _, _, _, mem_max, below_since,
             idle_since) = row[3:]
            hist = hist if isinstance(hist, dict) else {}
        sm, mem = reading.sm_percent, reading.mem_bytes
        bin_ = str(min(UTIL_HIST_BINS - 1, int(sm)))
        hist[bin_] = int(hist.get(bin_, 0)) + 1
        n, sm_sum, mem_sum = n + 1, sm_sum + sm, mem_sum + mem
        state, verdict = idle_step(IdleState(last_at, below_since, idle_since),
                                   minute=minute, sm_percent=sm, rule=rules[running[key]][1])
        if verdict != Verdict.NONE:
            verdicts[key] = (verdict, state, sm)
        values = (minute, n, sm_sum, mem_sum, hist, sm, sm_sum / n, p95(hist, 0.95), mem,
                  round(mem_sum / n), max(mem_max, mem), state.below_since, state.idle_since)
        samples.append((key[0], key[1], sm, mem))
        if row is None:
            created.append((key[0], key[1], minute, *values))
        else:
            updated.append((row[0], *values))
    result.sampled = len(samples)
    with transaction.atomic():
        _insert_samples(samples, minute=minute)
        _create_rows(created)
        _update_rows(updated)
        _apply_verdicts(verdicts, rules=rules, running=running, now=now, result=result)
    return result


def _insert_samples(rows: list[tuple[int, int, float, int]], *, minute: datetime) -> None:
    """The minute's samples (job, attempt, sm, memory); one already there is kept."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        UtilizationSample.objects.bulk_create(
            [UtilizationSample(job_id=j, attempt=a, minute=minute, sm=sm, mem_bytes=mem)
             for j, a, sm, mem in rows], batch_size=2000, ignore_conflicts=True)
        return
    job, attempt, sm, mem = (_pg_array(col) for col in zip(*rows, strict=True))
    table = connection.ops.quote_name(UtilizationSample._meta.db_table)
    with connection.cursor() as cur:
        cur.execute(
            f"INSERT INTO {table} (job_id, attempt, minute, sm, mem_bytes) "
            "SELECT j, a, %s, s, m FROM unnest(%s::bigint[], %s::integer[], "
            "%s::double precision[], %s::bigint[]) AS v(j, a, s, m) "
            "ON CONFLICT (job_id, attempt, minute) DO NOTHING",
            [minute, job, attempt, sm, mem])


# PostgreSQL types of _UPDATED's columns, for `unnest` (sm_hist goes as text, cast).
_PG_TYPES = ("timestamptz", "integer", "double precision", "double precision", "text",
             "double precision", "double precision", "double precision", "bigint", "bigint",
             "bigint", "timestamptz", "timestamptz")


def _create_rows(rows: list[tuple[Any, ...]]) -> None:
    """New summaries, rows of (job id, attempt, first_at, *_UPDATED): on PostgreSQL one
    INSERT over arrays per 5,000 rows."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        AttemptUtilization.objects.bulk_create(
            [AttemptUtilization(job_id=r[0], attempt=r[1], first_at=r[2],
                                **dict(zip(_UPDATED, r[3:], strict=True))) for r in rows],
            batch_size=2000)
        return
    concrete = {f.name: f for f in AttemptUtilization._meta.concrete_fields}
    quote = connection.ops.quote_name
    names = ["job_id", "attempt", "first_at", *(concrete[n].column or n for n in _UPDATED)]
    types = ("bigint", "integer", "timestamptz", *_PG_TYPES)
    select = ", ".join(f"v.{quote(n)}" + ("::jsonb" if n == "sm_hist" else "") for n in names)
    sql = (f"INSERT INTO {quote(AttemptUtilization._meta.db_table)} ("
           + ", ".join(quote(n) for n in names) + f") SELECT {select} FROM unnest("
           + ", ".join(f"%s::{t}[]" for t in types) + ") AS v("
           + ", ".join(quote(n) for n in names) + ")")
    hist_at = names.index("sm_hist")
    with connection.cursor() as cur:
        for start in range(0, len(rows), 5000):
            cols = [list(col) for col in zip(*rows[start:start + 5000], strict=True)]
            cols[hist_at] = [json.dumps(h, separators=(",", ":")) for h in cols[hist_at]]
            cur.execute(sql, [_pg_array(col) for col in cols])


def _update_rows(rows: list[tuple[Any, ...]]) -> None:
    """The summaries' new values, rows of (id, *_UPDATED). PostgreSQL: one UPDATE ...
    FROM unnest(arrays) per 5,000 rows; elsewhere one UPDATE per row (executemany)."""
    if not rows:
        return
    concrete = {f.name: f for f in AttemptUtilization._meta.concrete_fields}
    columns = [concrete[name].column or name for name in _UPDATED]
    quote = connection.ops.quote_name
    table = quote(AttemptUtilization._meta.db_table)
    hist_at = _UPDATED.index("sm_hist") + 1
    if connection.vendor != "postgresql":
        fields = [concrete[name] for name in _UPDATED]
        sql = (f"UPDATE {table} SET " + ", ".join(f"{quote(c)} = %s" for c in columns)
               + " WHERE id = %s")
        with connection.cursor() as cur:
            cur.executemany(sql, [[f.get_db_prep_save(v, connection) for f, v in zip(
                fields, row[1:], strict=True)] + [row[0]] for row in rows])
        return
    names = ["id", *columns]
    casts = ", ".join(f"%s::{t}[]" for t in ("bigint", *_PG_TYPES))
    sets = ", ".join(f"{quote(c)} = v.{quote(c)}" + ("::jsonb" if c == "sm_hist" else "")
                     for c in columns)
    sql = (f"UPDATE {table} AS t SET {sets} FROM unnest({casts}) AS v("
           + ", ".join(quote(n) for n in names) + ") WHERE t.id = v.id")
    with connection.cursor() as cur:
        for start in range(0, len(rows), 5000):
            chunk = rows[start:start + 5000]
            cols = [list(col) for col in zip(*chunk, strict=True)]
            cols[hist_at] = [json.dumps(h, separators=(",", ":")) for h in cols[hist_at]]
            cur.execute(sql, [_pg_array(col) for col in cols])


def _pg_array(values: Any) -> str:
    """A PostgreSQL array literal of numbers, aware datetimes, strings or None (NULL),
    cast by the query: psycopg's Python array dumper costs ~30 µs a value, this ~1."""
    def item(v: Any) -> str:
        if v is None:
            return "NULL"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, datetime):
            return '"' + v.isoformat() + '"'
        return repr(v)
    return "{" + ",".join(map(item, values)) + "}"


def _apply_verdicts(verdicts: dict[tuple[int, int], tuple[Verdict, IdleState, float]], *,
                    rules: dict[int, tuple[str, IdleRule]], running: dict[tuple[int, int], int],
                    now: datetime, result: IngestResult) -> None:
    """Rules U2-U4's events and U3's reclaims (inside the ingest's transaction)."""
    events: list[JobEvent] = []
    reclaim: list[tuple[tuple[int, int], Verdict, JobEvent]] = []
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
            reclaim.append((key, verdict, JobEvent(
                job_id=key[0], at=now, kind=JobEvent.Kind.IDLE, actor_label="scheduler",
                attempt=key[1], data={**data, "rule": "U3"},
                reason=f"reclaimed: idle for {rule.grace_minutes} minute(s) after its flag "
                       f"(rule U3, tier {slug}: {rule.action})")))
    JobEvent.objects.bulk_create(events, batch_size=2000)
    if not reclaim:
        return
    jobs = Job.objects.select_related("gpu_type").in_bulk([k[0] for k, _, _ in reclaim])
    # Charging locks the teams' accumulators: in team order, as preemption takes them.
    for (job_id, attempt), verdict, event in sorted(
            reclaim, key=lambda r: (jobs[r[0][0]].team_id if r[0][0] in jobs else 0,
                                    r[0][0])):
        job = jobs.get(job_id)
        if job is None or job.attempt != attempt or job.state != JobState.RUNNING:
            continue
        try:
            with transaction.atomic():  # one job's savepoint: its failure is its own
                if _reclaim(job, requeue=verdict == Verdict.REQUEUE, now=now):
                    event.save()
                    (result.requeued if verdict == Verdict.REQUEUE
                     else result.failed).append(job_id)
                    result.workloads.append(f"fq-{job_id}-{attempt}")
        except (OperationalError, InterfaceError):
            raise  # not this job's fault: the whole minute is retried
        except Exception:
            log.exception("utilization: reclaiming idle job %s failed; it stays flagged and "
                          "the next minute tries again", job_id)


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
            **next_attempt(job.attempt + 1))
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
