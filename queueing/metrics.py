"""Prometheus metrics at `/metrics` (docs/metrics.md).

Design: the web processes answer scrapes, the Celery worker runs the cycle, so no metric
lives in one process's memory.

- Gauges (queue depth per team and tier, fair-share factor per team, GPUs allocated per
  type) are read from the database at scrape time by `FairqCollector`.
- Counters of admissions and of preemptions by rule are counted from the job events in the
  database (a transition to ADMITTED; kind "preempted" with `data.rule`): monotonic as
  long as events are kept, the same from every web process, and right after a restart.
- Cycle durations are a histogram whose buckets live in the cache (Redis in production,
  shared by worker and web): `record_cycle(result)` is called once per cycle by
  `queueing.tasks.scheduler_cycle_task`, `record_cycle_failure(cycle_id)` once per cycle
  that raised. The same keys give the failure and per-job error counters, the last
  successful cycle's time, and `scheduler_health()` (`GET /healthz/scheduler`).

No prometheus-client multiprocess mode (PROMETHEUS_MULTIPROC_DIR) is needed: nothing is
kept in process memory, so gunicorn workers and Celery workers can be on different hosts.
"""

from __future__ import annotations

import hmac
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

CYCLE_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                                    10.0, math.inf)
_CACHE_PREFIX = "fairq:metrics:cycle:"
_CACHE_TIMEOUT = None  # keep until evicted: counters must not reset every few minutes


def _bucket_key(le: float) -> str:
    return f"{_CACHE_PREFIX}le:{'inf' if math.isinf(le) else le}"


def _incr(key: str, by: int = 1) -> None:
    try:
        cache.incr(key, by)
    except ValueError:  # absent: the first cycle since the cache was emptied
        if not cache.add(key, by, timeout=_CACHE_TIMEOUT):
            cache.incr(key, by)


def record_cycle(result: Any) -> None:
    """Count one scheduler cycle of `result.timings["total"]` seconds that completed,
    the jobs it had to isolate, and when it ended (wall clock: the health check compares
    it with the web's clock). Never raises: a metrics hiccup must not fail a cycle."""
    try:
        if not getattr(result, "ran", True):
            _incr(f"{_CACHE_PREFIX}skipped")
            return
        seconds = float(getattr(result, "timings", {}).get("total", 0.0))
        for le in CYCLE_BUCKETS:
            if seconds <= le:
                _incr(_bucket_key(le))
        # The sum in microseconds: cache.incr takes integers.
        _incr(f"{_CACHE_PREFIX}sum_us", round(seconds * 1_000_000))
        job_errors = len(getattr(result, "job_errors", {}) or {})
        if job_errors:
            _incr(f"{_CACHE_PREFIX}job_errors", job_errors)
        cache.set_many({f"{_CACHE_PREFIX}last": seconds,
                        f"{_CACHE_PREFIX}last_success": time.time(),
                        f"{_CACHE_PREFIX}last_success_id": str(getattr(result, "cycle_id", ""))},
                       timeout=_CACHE_TIMEOUT)
    except Exception:  # pragma: no cover - the cache backend failed
        log.exception("could not record cycle metrics")


def record_cycle_failure(cycle_id: str) -> None:
    """Count one scheduler cycle that raised. Never raises."""
    try:
        _incr(f"{_CACHE_PREFIX}failures")
        cache.set_many({f"{_CACHE_PREFIX}last_failure": time.time(),
                        f"{_CACHE_PREFIX}last_failure_id": cycle_id}, timeout=_CACHE_TIMEOUT)
    except Exception:  # pragma: no cover - the cache backend failed
        log.exception("could not record a cycle failure")


def scheduler_stale_after_seconds() -> float:
    """How old the last successful cycle may be before the scheduler counts as unhealthy:
    FAIRQ_SCHEDULER_STALE_CYCLES cycle intervals (docs/deployment.md)."""
    return float(settings.FAIRQ_SCHEDULER_STALE_CYCLES * settings.FAIRQ_CYCLE_INTERVAL_SECONDS)


def scheduler_health(*, now: float | None = None) -> dict[str, Any]:
    """The scheduler as the web sees it through the shared cache: `healthy` is True when
    the last successful cycle ended less than `scheduler_stale_after_seconds()` ago."""
    now = time.time() if now is None else now
    limit = scheduler_stale_after_seconds()
    try:
        values = cache.get_many([f"{_CACHE_PREFIX}{k}" for k in (
            "last_success", "last_success_id", "last_failure", "last_failure_id")])
    except Exception:
        log.exception("could not read the scheduler's health from the cache")
        values = {}

    def when(key: str) -> float | None:
        value = values.get(f"{_CACHE_PREFIX}{key}")
        return float(value) if value is not None else None

    success, failure = when("last_success"), when("last_failure")
    age = None if success is None else max(0.0, now - success)
    body: dict[str, Any] = {
        "healthy": age is not None and age <= limit,
        "last_success_age_seconds": None if age is None else round(age, 3),
        "last_success_cycle": values.get(f"{_CACHE_PREFIX}last_success_id"),
        "stale_after_seconds": limit,
    }
    if failure is not None:
        body["last_failure_age_seconds"] = round(max(0.0, now - failure), 3)
        body["last_failure_cycle"] = values.get(f"{_CACHE_PREFIX}last_failure_id")
    return body


_SUBMIT_PREFIX = "fairq:metrics:submit_errors:"
# The `code` label of fairq_k8s_submit_errors_total: HTTP statuses worth telling apart,
# "none" for no answer (timeout, refused connection), "other" for the rest.
SUBMIT_ERROR_CODES: tuple[str, ...] = ("400", "401", "403", "404", "409", "422", "429",
                                       "500", "502", "503", "504", "none", "other")


def record_submit_error(code: str) -> None:
    """Count one failed Job create by HTTP status (shared cache, like the cycle
    histogram: the worker counts, the web answers scrapes). Never raises."""
    try:
        _incr(f"{_SUBMIT_PREFIX}{code if code in SUBMIT_ERROR_CODES else 'other'}")
    except Exception:  # pragma: no cover - the cache backend failed
        log.exception("could not record a submit error")


class FairqCollector:
    """Reads every metric at scrape time (see the module docstring)."""

    def collect(self) -> Iterator[Metric]:
        from queueing.models import JobEvent
        from queueing.policy.states import JobState
        from queueing.reports import gpus_allocated_by_type, queue_depth
        from queueing.services.usage import fairshare_standings

        depth = GaugeMetricFamily("fairq_queue_depth", "Queued jobs per team and tier.",
                                  labels=["team", "tier"])
        for team, tier, n in queue_depth():
            depth.add_metric([team, tier], n)
        yield depth

        factor = GaugeMetricFamily("fairq_fair_share_factor",
                                   "Fair-share factor F = 2^(-U/S) per team (rule F3).",
                                   labels=["team"])
        for standing in fairshare_standings(now=timezone.now()).values():
            factor.add_metric([standing.team], standing.factor)
        yield factor

        gpus = GaugeMetricFamily("fairq_gpus_allocated",
                                 "GPUs held by admitted and running jobs per GPU type.",
                                 labels=["gpu_type"])
        for gpu_type, n in sorted(gpus_allocated_by_type().items()):
            gpus.add_metric([gpu_type], n)
        yield gpus

        admissions = CounterMetricFamily("fairq_admissions", "Jobs admitted (every attempt).")
        admissions.add_metric([], JobEvent.objects.filter(
            kind=JobEvent.Kind.TRANSITION, to_status=JobState.ADMITTED).count())
        yield admissions

        submit_errors = CounterMetricFamily(
            "fairq_k8s_submit_errors", "Failed Kubernetes Job creates, by HTTP status.",
            labels=["code"])
        counts = cache.get_many([f"{_SUBMIT_PREFIX}{c}" for c in SUBMIT_ERROR_CODES])
        for code in SUBMIT_ERROR_CODES:
            count = counts.get(f"{_SUBMIT_PREFIX}{code}")
            if count:
                submit_errors.add_metric([code], int(count))
        yield submit_errors

        preemptions = CounterMetricFamily("fairq_preemptions", "Jobs preempted, by rule.",
                                          labels=["rule"])
        rows = (JobEvent.objects.filter(kind=JobEvent.Kind.PREEMPTED).values_list("data__rule")
                .annotate(n=Count("id")).order_by())
        for rule, n in rows:
            preemptions.add_metric([str(rule or "unknown")], n)
        yield preemptions

        yield self._cycle_histogram()
        yield from self._cycle_health()

    def _cycle_health(self) -> Iterator[Metric]:
        values = cache.get_many([f"{_CACHE_PREFIX}{k}" for k in (
            "failures", "job_errors", "last_success")])
        failures = CounterMetricFamily(
            "fairq_cycle_failures", "Scheduler cycles that raised (each logged with its id).")
        failures.add_metric([], int(values.get(f"{_CACHE_PREFIX}failures", 0)))
        yield failures
        job_errors = CounterMetricFamily(
            "fairq_cycle_job_errors",
            "Jobs a cycle isolated after an unexpected exception (each failed with a reason).")
        job_errors.add_metric([], int(values.get(f"{_CACHE_PREFIX}job_errors", 0)))
        yield job_errors
        last = values.get(f"{_CACHE_PREFIX}last_success")
        if last is not None:
            gauge = GaugeMetricFamily(
                "fairq_cycle_last_success_timestamp_seconds",
                "Unix time at which the last successful scheduler cycle ended.")
            gauge.add_metric([], float(last))
            yield gauge

    def _cycle_histogram(self) -> Metric:
        keys = [_bucket_key(le) for le in CYCLE_BUCKETS]
        values = cache.get_many([*keys, f"{_CACHE_PREFIX}sum_us"])
        buckets = [("+Inf" if math.isinf(le) else str(le), int(values.get(k, 0)))
                   for le, k in zip(CYCLE_BUCKETS, keys, strict=True)]
        return HistogramMetricFamily(
            "fairq_cycle_duration_seconds", "Scheduler cycle duration.",
            buckets=buckets, sum_value=int(values.get(f"{_CACHE_PREFIX}sum_us", 0)) / 1e6,
        )


def registry() -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(FairqCollector())
    return reg


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition; needs `Authorization: Bearer <FAIRQ_METRICS_TOKEN>`
    when that setting is set. Unset: 403 when FAIRQ_METRICS_REQUIRE_TOKEN (production),
    open otherwise (development, tests)."""
    token = settings.FAIRQ_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            response = HttpResponse("unauthorized\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="fairq-metrics"'
            return response
    elif settings.FAIRQ_METRICS_REQUIRE_TOKEN:
        return HttpResponse("metrics are disabled: set FAIRQ_METRICS_TOKEN\n", status=403,
                            content_type="text/plain")
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
