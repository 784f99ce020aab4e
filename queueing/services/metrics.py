"""The counters the worker keeps for /metrics (docs/metrics.md), in the shared cache
(Redis in production, shared by worker and web): `record_cycle(result)` once per cycle
(`queueing.tasks.scheduler_cycle_task`), `record_cycle_failure(cycle_id)` once per cycle
that raised, `record_submit_error(code)` once per failed Job create. The web reads them
through queueing/selectors/metrics.py. None of them ever raises: a metrics hiccup must
not fail a cycle."""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Max

from queueing.models import Job, JobEvent
from queueing.policy.states import JobState
from queueing.selectors.metrics import (
    CYCLE_BUCKETS,
    CYCLE_PREFIX,
    SUBMIT_ERROR_CODES,
    SUBMIT_PREFIX,
    WAIT_BUCKETS,
    WAIT_PREFIX,
    cycle_bucket_key,
    wait_bucket_key,
)

log = logging.getLogger(__name__)

_CACHE_TIMEOUT = None  # keep until evicted: counters must not reset every few minutes


def _incr(key: str, by: int = 1) -> None:
    try:
        cache.incr(key, by)
    except ValueError:  # absent: the first cycle since the cache was emptied
        if not cache.add(key, by, timeout=_CACHE_TIMEOUT):
            cache.incr(key, by)


RECENT_SUCCESSES_MAX = 512


def recent_successes_kept(times: list[float], now: float) -> list[float]:
    """The end times worth keeping: those within the stale window
    (FAIRQ_SCHEDULER_STALE_CYCLES intervals) and the one just before it, at most
    RECENT_SUCCESSES_MAX."""
    window = settings.FAIRQ_SCHEDULER_STALE_CYCLES * settings.FAIRQ_CYCLE_INTERVAL_SECONDS
    inside = [t for t in times if t >= now - window]
    before = [t for t in times if t < now - window][-1:]
    return (before + inside)[-RECENT_SUCCESSES_MAX:]


def record_cycle(result: Any) -> None:
    """Count one scheduler cycle of `result.timings["total"]` seconds that completed,
    the jobs it had to isolate, when it ended (wall clock: the health check compares it
    with the web's clock) and how long after the previous successful one. Never raises:
    a metrics hiccup must not fail a cycle."""
    try:
        if not getattr(result, "ran", True):
            _incr(f"{CYCLE_PREFIX}skipped")
            return
        seconds = float(getattr(result, "timings", {}).get("total", 0.0))
        for le in CYCLE_BUCKETS:
            if seconds <= le:
                _incr(cycle_bucket_key(le))
        # The sum in microseconds: cache.incr takes integers.
        _incr(f"{CYCLE_PREFIX}sum_us", round(seconds * 1_000_000))
        job_errors = len(getattr(result, "job_errors", {}) or {})
        if job_errors:
            _incr(f"{CYCLE_PREFIX}job_errors", job_errors)
        admitted = list(getattr(result, "admitted", []) or [])
        if admitted:
            record_queue_waits(admitted)
        # When the recent successful cycles ended: /healthz/scheduler says "behind" when
        # two of them came further apart than FAIRQ_SCHEDULER_BEHIND_CYCLES intervals.
        now = time.time()
        recent = recent_successes_kept(cache.get(f"{CYCLE_PREFIX}recent_successes") or [], now)
        cache.set_many({f"{CYCLE_PREFIX}last": seconds,
                        f"{CYCLE_PREFIX}recent_successes": [*recent, now],
                        f"{CYCLE_PREFIX}last_success": now,
                        f"{CYCLE_PREFIX}last_success_id": str(getattr(result, "cycle_id", ""))},
                       timeout=_CACHE_TIMEOUT)
    except Exception:  # pragma: no cover - the cache backend failed
        log.exception("could not record cycle metrics")


def record_cycle_failure(cycle_id: str) -> None:
    """Count one scheduler cycle that raised. Never raises."""
    try:
        _incr(f"{CYCLE_PREFIX}failures")
        cache.set_many({f"{CYCLE_PREFIX}last_failure": time.time(),
                        f"{CYCLE_PREFIX}last_failure_id": cycle_id}, timeout=_CACHE_TIMEOUT)
    except Exception:  # pragma: no cover - the cache backend failed
        log.exception("could not record a cycle failure")


def record_submit_error(code: str) -> None:
    """Count one failed Job create by HTTP status (shared cache, like the cycle
    histogram: the worker counts, the web answers scrapes). Never raises."""
    try:
        _incr(f"{SUBMIT_PREFIX}{code if code in SUBMIT_ERROR_CODES else 'other'}")
    except Exception:  # pragma: no cover - the cache backend failed
        log.exception("could not record a submit error")


def record_queue_waits(job_ids: list[int]) -> None:
    """Count the queue wait of each just-admitted job in its tier's histogram: from its
    last transition to QUEUED (the submit, or the requeue of this attempt) to its
    admission. Two queries per cycle that admitted anything. Never raises."""
    try:
        admitted = {pk: (tier, at) for pk, tier, at in Job.objects.filter(
            pk__in=job_ids, admitted_at__isnull=False).values_list(
            "pk", "tier__slug", "admitted_at")}
        queued = dict(JobEvent.objects.filter(
            job_id__in=admitted, kind=JobEvent.Kind.TRANSITION, to_status=JobState.QUEUED)
            .values("job_id").annotate(at=Max("at")).values_list("job_id", "at"))
        for pk, (tier, at) in admitted.items():
            since = queued.get(pk)
            if since is None:
                continue
            seconds = max(0.0, (at - since).total_seconds())
            for le in WAIT_BUCKETS:
                if seconds <= le:
                    _incr(wait_bucket_key(tier, le))
            _incr(f"{WAIT_PREFIX}{tier}:sum_us", round(seconds * 1_000_000))
    except Exception:  # pragma: no cover - the cache or the database failed
        log.exception("could not record queue waits")
