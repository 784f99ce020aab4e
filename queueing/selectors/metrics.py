"""What /metrics and the scheduler health check read (docs/metrics.md): gauges and event
counts from the database, and the counters the worker keeps in the shared cache
(queueing/services/metrics.py writes them; the keys are named here, once)."""

from __future__ import annotations

import logging
import math
import time
from itertools import pairwise
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count

from queueing.models import Job, JobEvent, Tier
from queueing.policy.states import JobState

from .arrays import arrays_unwritten

log = logging.getLogger(__name__)

CYCLE_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                                    10.0, math.inf)
CYCLE_PREFIX = "fairq:metrics:cycle:"
SUBMIT_PREFIX = "fairq:metrics:submit_errors:"
# The `code` label of fairq_k8s_submit_errors_total: HTTP statuses worth telling apart,
# "none" for no answer (timeout, refused connection), "other" for the rest.
SUBMIT_ERROR_CODES: tuple[str, ...] = ("400", "401", "403", "404", "409", "422", "429",
                                       "500", "502", "503", "504", "none", "other")


def cycle_bucket_key(le: float) -> str:
    return f"{CYCLE_PREFIX}le:{'inf' if math.isinf(le) else le}"


# Queue wait per tier (fairq_queue_wait_seconds): from entering the queue (the submit, or
# the requeue of a later attempt) to admission, counted by the worker once per admission.
WAIT_BUCKETS: tuple[float, ...] = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
                                   3600.0, 7200.0, 21600.0, 86400.0, math.inf)
WAIT_PREFIX = "fairq:metrics:wait:"


def wait_bucket_key(tier: str, le: float) -> str:
    return f"{WAIT_PREFIX}{tier}:le:{'inf' if math.isinf(le) else le}"


def wait_histograms() -> dict[str, tuple[list[tuple[str, int]], float]]:
    """Per tier that counted an admission: cumulative (le label, admissions) per bucket
    and the sum of the waits in seconds."""
    tiers = list(Tier.objects.values_list("slug", flat=True))
    keys = {t: [wait_bucket_key(t, le) for le in WAIT_BUCKETS] for t in tiers}
    values = cache.get_many([k for ks in keys.values() for k in ks]
                            + [f"{WAIT_PREFIX}{t}:sum_us" for t in tiers])
    out = {}
    for tier in tiers:
        counts = [int(values.get(k, 0)) for k in keys[tier]]
        if counts[-1]:
            out[tier] = ([("+Inf" if math.isinf(le) else str(le), n)
                          for le, n in zip(WAIT_BUCKETS, counts, strict=True)],
                         int(values.get(f"{WAIT_PREFIX}{tier}:sum_us", 0)) / 1e6)
    return out


# --- from the database ----------------------------------------------------------------------

def queue_depth() -> list[tuple[str, str, int]]:
    """(team, tier, queued jobs) for every pair with queued jobs, array members not yet
    written as rows included."""
    rows = (Job.objects.filter(status=JobState.QUEUED)
            .values_list("team__slug", "tier__slug").annotate(n=Count("id")).order_by())
    depth: dict[tuple[str, str], int] = {(team, tier): n for team, tier, n in rows}
    for team, _, tier, n, _ in arrays_unwritten():
        depth[(team, tier)] = depth.get((team, tier), 0) + n
    return [(team, tier, n) for (team, tier), n in depth.items()]


def admissions_total() -> int:
    """Jobs admitted, every attempt: the transitions to ADMITTED among the job events."""
    return JobEvent.objects.filter(kind=JobEvent.Kind.TRANSITION, to_status=JobState.ADMITTED).count()


def preemptions_by_rule() -> list[tuple[str, int]]:
    """(rule, jobs preempted under it) from the "preempted" events; "unknown" when an
    event names no rule."""
    rows = (JobEvent.objects.filter(kind=JobEvent.Kind.PREEMPTED).values_list("data__rule")
            .annotate(n=Count("id")).order_by())
    return [(str(rule or "unknown"), n) for rule, n in rows]


# Rule K6's event kind (JobEvent.Kind.SPOT_RECLAIMED where spot reclamation is merged):
# one per job requeued because its spot node was reclaimed.
SPOT_RECLAIMED = "spot_reclaimed"


def spot_reclaimed_by_cluster() -> dict[str, int]:
    """Jobs requeued by a spot reclamation (rule K6) per cluster, from their
    `spot_reclaimed` events: the event's `data.cluster`, else the cluster of a qualified
    `data.node` ("<cluster>/<node>"), else "" (the implicit cluster). One grouped query
    (its groups are bounded by the nodes, not the events)."""
    rows = (JobEvent.objects.filter(kind=SPOT_RECLAIMED)
            .values_list("data__cluster", "data__node").annotate(n=Count("id")).order_by())
    out: dict[str, int] = {}
    for cluster, node, n in rows:
        name = str(cluster or "") or (str(node).partition("/")[0]
                                      if node and "/" in str(node) else "")
        out[name] = out.get(name, 0) + n
    return out


# --- from the shared cache ------------------------------------------------------------------

def submit_error_counts() -> dict[str, int]:
    """Failed Kubernetes Job creates per `code` label, only the codes that counted any."""
    counts = cache.get_many([f"{SUBMIT_PREFIX}{c}" for c in SUBMIT_ERROR_CODES])
    out = {}
    for code in SUBMIT_ERROR_CODES:
        count = counts.get(f"{SUBMIT_PREFIX}{code}")
        if count:
            out[code] = int(count)
    return out


def cycle_histogram() -> tuple[list[tuple[str, int]], float]:
    """The cycle duration histogram: cumulative (le label, cycles) per bucket, and the
    sum of the durations in seconds."""
    keys = [cycle_bucket_key(le) for le in CYCLE_BUCKETS]
    values = cache.get_many([*keys, f"{CYCLE_PREFIX}sum_us"])
    buckets = [("+Inf" if math.isinf(le) else str(le), int(values.get(k, 0)))
               for le, k in zip(CYCLE_BUCKETS, keys, strict=True)]
    return buckets, int(values.get(f"{CYCLE_PREFIX}sum_us", 0)) / 1e6


def cycle_health_counts() -> tuple[int, int, float | None]:
    """(cycles that raised, jobs cycles isolated, unix time of the last successful cycle
    or None)."""
    values = cache.get_many([f"{CYCLE_PREFIX}{k}" for k in (
        "failures", "job_errors", "last_success")])
    last = values.get(f"{CYCLE_PREFIX}last_success")
    return (int(values.get(f"{CYCLE_PREFIX}failures", 0)),
            int(values.get(f"{CYCLE_PREFIX}job_errors", 0)),
            None if last is None else float(last))


def scheduler_stale_after_seconds() -> float:
    """How old the last successful cycle may be before the scheduler counts as unhealthy:
    FAIRQ_SCHEDULER_STALE_CYCLES cycle intervals (docs/deployment.md)."""
    return float(settings.FAIRQ_SCHEDULER_STALE_CYCLES * settings.FAIRQ_CYCLE_INTERVAL_SECONDS)


def scheduler_behind_after_seconds() -> float:
    """How far apart successful cycles may come before the scheduler counts as behind:
    FAIRQ_SCHEDULER_BEHIND_CYCLES cycle intervals (docs/deployment.md)."""
    return float(settings.FAIRQ_SCHEDULER_BEHIND_CYCLES * settings.FAIRQ_CYCLE_INTERVAL_SECONDS)


def scheduler_health(*, now: float | None = None) -> dict[str, Any]:
    """The scheduler as the web sees it through the shared cache. `status` is "stale"
    when no successful cycle ended in the last `scheduler_stale_after_seconds()` (or none
    is recorded), "behind" when cycles fall behind their interval: the last success, or
    any gap between two successes within the stale window, is longer than
    `scheduler_behind_after_seconds()` (a worker busy with other work runs cycles now and
    then, a few at once, not every interval: one long pause keeps it "behind" for the
    window); else "ok". `healthy` is True only for "ok"."""
    now = time.time() if now is None else now
    limit = scheduler_stale_after_seconds()
    behind = scheduler_behind_after_seconds()
    try:
        values = cache.get_many([f"{CYCLE_PREFIX}{k}" for k in (
            "last_success", "last_success_id", "last_failure", "last_failure_id",
            "recent_successes")])
    except Exception:
        log.exception("could not read the scheduler's health from the cache")
        values = {}

    def when(key: str) -> float | None:
        value = values.get(f"{CYCLE_PREFIX}{key}")
        return float(value) if value is not None else None

    success, failure = when("last_success"), when("last_failure")
    age = None if success is None else max(0.0, now - success)
    recent = sorted(float(t) for t in values.get(f"{CYCLE_PREFIX}recent_successes") or [])
    gaps = [b - a for a, b in pairwise(recent) if b >= now - limit]
    gap = max(gaps, default=None)
    if age is None or age > limit:
        status = "stale"
    elif age > behind or (gap is not None and gap > behind):
        status = "behind"
    else:
        status = "ok"
    body: dict[str, Any] = {
        "healthy": status == "ok",
        "status": status,
        "last_success_age_seconds": None if age is None else round(age, 3),
        "last_success_cycle": values.get(f"{CYCLE_PREFIX}last_success_id"),
        "longest_gap_seconds": None if gap is None else round(gap, 3),
        "stale_after_seconds": limit,
        "behind_after_seconds": behind,
    }
    if failure is not None:
        body["last_failure_age_seconds"] = round(max(0.0, now - failure), 3)
        body["last_failure_cycle"] = values.get(f"{CYCLE_PREFIX}last_failure_id")
    return body
