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
  `queueing.tasks.scheduler_cycle_task`.

No prometheus-client multiprocess mode (PROMETHEUS_MULTIPROC_DIR) is needed: nothing is
kept in process memory, so gunicorn workers and Celery workers can be on different hosts.
"""

from __future__ import annotations

import hmac
import logging
import math
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
    """Count one scheduler cycle of `result.timings["total"]` seconds. Never raises: a
    metrics hiccup must not fail a cycle."""
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
        cache.set(f"{_CACHE_PREFIX}last", seconds, timeout=_CACHE_TIMEOUT)
    except Exception:  # pragma: no cover - the cache backend failed
        log.exception("could not record cycle metrics")


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
            kind="transition", to_status=JobState.ADMITTED).count())
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
        rows = (JobEvent.objects.filter(kind="preempted").values_list("data__rule")
                .annotate(n=Count("id")).order_by())
        for rule, n in rows:
            preemptions.add_metric([str(rule or "unknown")], n)
        yield preemptions

        yield self._cycle_histogram()

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
    when that setting is set."""
    token = settings.FAIRQ_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return HttpResponse("unauthorized\n", status=401, content_type="text/plain")
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)
