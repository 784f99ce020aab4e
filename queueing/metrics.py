"""Prometheus metrics at `/metrics` (docs/metrics.md): a front end, like the web pages and
the API, over queueing/selectors/metrics.py.

Design: the web processes answer scrapes, the Celery worker runs the cycle, so no metric
lives in one process's memory.

- Gauges (queue depth per team and tier, fair-share factor per team, GPUs allocated per
  type) are read from the database at scrape time by `FairqCollector`.
- Counters of admissions and of preemptions by rule are counted from the job events in the
  database (a transition to ADMITTED; kind "preempted" with `data.rule`): monotonic as
  long as events are kept, the same from every web process, and right after a restart.
- Cycle durations are a histogram whose buckets live in the cache (Redis in production,
  shared by worker and web), counted by the worker (queueing/services/metrics.py). The
  same keys give the failure and per-job error counters, the last successful cycle's
  time, and `scheduler_health()` (`GET /healthz/scheduler`).

No prometheus-client multiprocess mode (PROMETHEUS_MULTIPROC_DIR) is needed: nothing is
kept in process memory, so gunicorn workers and Celery workers can be on different hosts.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from django.conf import settings
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

from queueing.selectors import metrics as read
from queueing.selectors.budgets import budget_statuses
from queueing.selectors.capacity import gpus_held_by_type
from queueing.selectors.clusters import DRAINED, cluster_summaries
from queueing.selectors.fairshare import fairshare_standings
from queueing.selectors.utilization import team_gpu_use


class FairqCollector:
    """Reads every metric at scrape time (see the module docstring)."""

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("fairq_queue_depth", "Queued jobs per team and tier.",
                                  labels=["team", "tier"])
        for team, tier, n in read.queue_depth():
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
        for gpu_type, held in sorted(gpus_held_by_type().items()):
            gpus.add_metric([gpu_type], held)
        yield gpus

        yield from self._clusters()
        yield from self._gpu_use()
        yield from self._budgets()

        waits = read.wait_histograms()
        if waits:
            wait = HistogramMetricFamily(
                "fairq_queue_wait_seconds",
                "Time from entering the queue (submit or requeue) to admission, per tier.",
                labels=["tier"])
            for tier, (buckets, total) in sorted(waits.items()):
                wait.add_metric([tier], buckets, total)
            yield wait

        admissions = CounterMetricFamily("fairq_admissions", "Jobs admitted (every attempt).")
        admissions.add_metric([], read.admissions_total())
        yield admissions

        submit_errors = CounterMetricFamily(
            "fairq_k8s_submit_errors", "Failed Kubernetes Job creates, by HTTP status.",
            labels=["code"])
        for code, count in read.submit_error_counts().items():
            submit_errors.add_metric([code], count)
        yield submit_errors

        preemptions = CounterMetricFamily("fairq_preemptions", "Jobs preempted, by rule.",
                                          labels=["rule"])
        for rule, n in read.preemptions_by_rule():
            preemptions.add_metric([rule], n)
        yield preemptions

        buckets, seconds = read.cycle_histogram()
        yield HistogramMetricFamily("fairq_cycle_duration_seconds", "Scheduler cycle duration.",
                                    buckets=buckets, sum_value=seconds)
        yield from self._cycle_health()

    def _clusters(self) -> Iterator[Metric]:
        """Rules K1-K8 (docs/metrics.md, "Clusters"): per cluster whether the scheduler
        reaches it (not for a drained one, which it reads no more); per cluster, GPU type
        and spot flag the GPUs and free GPUs of the published cluster view; per cluster
        and GPU type the GPUs fairq's jobs hold there; and the jobs requeued by spot
        reclamations (their events, like the other counters). The implicit cluster (no
        `Cluster` row) is cluster=""; `fairq_gpus_allocated{gpu_type}` stays the sum over
        all."""
        summaries, _ = cluster_summaries()
        reachable = GaugeMetricFamily(
            "fairq_cluster_reachable",
            "1 while the scheduler reaches the cluster, 0 since it could not (rule K5).",
            labels=["cluster"])
        capacity = GaugeMetricFamily("fairq_gpus_capacity",
                                     "GPUs on a cluster's nodes per GPU type (spot apart).",
                                     labels=["cluster", "gpu_type", "spot"])
        free = GaugeMetricFamily("fairq_gpus_free",
                                 "GPUs not allocated on a cluster's nodes per GPU type "
                                 "(spot apart).", labels=["cluster", "gpu_type", "spot"])
        held = GaugeMetricFamily("fairq_cluster_gpus_allocated",
                                 "GPUs held by admitted and running jobs placed in a cluster.",
                                 labels=["cluster", "gpu_type"])
        for c in summaries:
            # A drained cluster is read no more (rule K8): its reachability is not known.
            if not c.implicit and c.state != DRAINED:
                reachable.add_metric([c.name], 1 if c.reachable else 0)
            for g in c.gpu_types:
                for spot, total, idle in (("false", g.capacity - g.spot_capacity,
                                           g.free - g.spot_free),
                                          ("true", g.spot_capacity, g.spot_free)):
                    if spot == "true" and not total:
                        continue  # no spot series for a type without spot nodes
                    capacity.add_metric([c.name, g.gpu_type, spot], total)
                    free.add_metric([c.name, g.gpu_type, spot], idle)
                held.add_metric([c.name, g.gpu_type], g.held_by_jobs)
        yield from (reachable, capacity, free, held)
        reclaimed = CounterMetricFamily(
            "fairq_spot_reclaimed",
            "Jobs requeued because their spot node was reclaimed (rule K6).",
            labels=["cluster"])
        for cluster, n in sorted(read.spot_reclaimed_by_cluster().items()):
            reclaimed.add_metric([cluster], n)
        yield reclaimed

    def _gpu_use(self) -> Iterator[Metric]:
        """Per team: GPUs allocated, GPUs of running jobs flagged idle (rule U2), and the
        GPU-weighted SM activity of the measured ones (docs/scheduling.md, "Idle GPUs")."""
        allocated = GaugeMetricFamily("fairq_team_gpus_allocated",
                                      "GPUs held by a team's admitted and running jobs.",
                                      labels=["team"])
        idle = GaugeMetricFamily("fairq_team_gpus_idle",
                                 "GPUs of a team's running jobs flagged idle (rule U2).",
                                 labels=["team"])
        measured = GaugeMetricFamily("fairq_team_gpus_measured",
                                     "GPUs of a team's running jobs with a utilization reading.",
                                     labels=["team"])
        util = GaugeMetricFamily("fairq_team_gpu_utilization_ratio",
                                 "SM activity of a team's measured GPUs (0-1), GPU-weighted, "
                                 "last minute.", labels=["team"])
        for use in team_gpu_use():
            allocated.add_metric([use.team], use.allocated)
            idle.add_metric([use.team], use.idle)
            measured.add_metric([use.team], use.measured)
            if use.measured:
                util.add_metric([use.team], round(use.sm_mean / 100, 6))
        yield from (allocated, idle, measured, util)

    def _budgets(self) -> Iterator[Metric]:
        """Per team with a budget: this UTC month's cost over its monthly amount (rule B1;
        1 = reached)."""
        ratio = GaugeMetricFamily("fairq_team_budget_used_ratio",
                                  "A team's cost this UTC month / its monthly budget "
                                  "(rules B1-B2; 1 = reached).", labels=["team"])
        for status in budget_statuses(now=timezone.now()):
            ratio.add_metric([status.team], round(status.ratio, 6))
        yield ratio

    def _cycle_health(self) -> Iterator[Metric]:
        failed, isolated, last = read.cycle_health_counts()
        failures = CounterMetricFamily(
            "fairq_cycle_failures", "Scheduler cycles that raised (each logged with its id).")
        failures.add_metric([], failed)
        yield failures
        job_errors = CounterMetricFamily(
            "fairq_cycle_job_errors",
            "Jobs a cycle isolated after an unexpected exception (each failed with a reason).")
        job_errors.add_metric([], isolated)
        yield job_errors
        if last is not None:
            gauge = GaugeMetricFamily(
                "fairq_cycle_last_success_timestamp_seconds",
                "Unix time at which the last successful scheduler cycle ended.")
            gauge.add_metric([], last)
            yield gauge
        # What GET /healthz/scheduler calls "behind", for an alert: the longest time
        # between the ends of successful cycles in the stale window (the time since the
        # last one included), beside the limit it is held to.
        health = read.scheduler_health()
        if health["last_success_age_seconds"] is not None:
            gap = GaugeMetricFamily(
                "fairq_cycle_longest_gap_seconds",
                "Longest time between successful scheduler cycles in the last "
                "FAIRQ_SCHEDULER_STALE_CYCLES intervals, the time since the last included.")
            gap.add_metric([], max(health["longest_gap_seconds"] or 0.0,
                                   health["last_success_age_seconds"]))
            yield gap
        limit = GaugeMetricFamily(
            "fairq_cycle_behind_after_seconds",
            "FAIRQ_SCHEDULER_BEHIND_CYCLES x FAIRQ_CYCLE_INTERVAL_SECONDS: a longer gap "
            "between cycles is 'behind' (GET /healthz/scheduler).")
        limit.add_metric([], health["behind_after_seconds"])
        yield limit


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
