"""Celery tasks: thin wrappers that load ids and call one service."""

from __future__ import annotations

import logging
import random
import time

from celery import shared_task
from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)


@shared_task(ignore_result=True, soft_time_limit=50, time_limit=60)
def scheduler_cycle_task() -> dict[str, int]:
    from queueing.metrics import record_cycle
    from queueing.services.scheduler import scheduler_cycle

    result = scheduler_cycle()
    record_cycle(result)
    if result.ran and (result.admitted or result.finished or result.requeued):
        log.info("cycle: admitted=%d started=%d finished=%d requeued=%d in %.3fs",
                 len(result.admitted), len(result.started), len(result.finished),
                 len(result.requeued), result.timings.get("total", 0.0))
    return {"admitted": len(result.admitted), "finished": len(result.finished)}


_last_kick = 0.0  # time.monotonic() of this process's last kick


def kick_scheduler() -> None:
    """Ask for a cycle soon (after a submit or a finish); at most one request a second
    across all processes (a Redis key), and no cache round trip at all when this process
    asked less than a second ago (a pipeline's burst of submits costs one)."""
    global _last_kick
    if not settings.FAIRQ_KICK_SCHEDULER:
        return
    now = time.monotonic()
    if now - _last_kick < 1.0:
        return
    _last_kick = now
    if cache.add("fairq:kick", 1, timeout=1):
        scheduler_cycle_task.apply_async(expires=10)


@shared_task(ignore_result=True, autoretry_for=(Exception,), retry_backoff=True,
             max_retries=5, soft_time_limit=30, time_limit=45)
def stop_workload_task(name: str) -> None:
    from django.utils import timezone

    from queueing.backends import get_backend

    get_backend().stop(name, now=timezone.now())


@shared_task(ignore_result=True, soft_time_limit=20, time_limit=30)
def demo_load_task() -> int:
    """Demo only: keep a few jobs queued per demo team so the standings move."""
    if not settings.FAIRQ_DEMO_LOAD:
        return 0
    from queueing.services.demo import demo_submit_synthetic

    return demo_submit_synthetic(rng=random.Random())


@shared_task(ignore_result=True, soft_time_limit=50, time_limit=60)
def fairshare_snapshot_task() -> int:
    """Store the fair-share standings for charts (beat: FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS)."""
    from django.utils import timezone

    from queueing.services.fairshare import fairshare_snapshot_take

    return len(fairshare_snapshot_take(now=timezone.now()).standings)


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def idempotency_purge_task() -> int:
    """Forget Idempotency-Key records older than a day (beat: hourly)."""
    from django.utils import timezone

    from accounts.services import idempotency_purge

    return idempotency_purge(now=timezone.now())


@shared_task(ignore_result=True, autoretry_for=(Exception,), retry_backoff=True,
             max_retries=5, soft_time_limit=50, time_limit=60)
def sync_cluster_task() -> None:
    """PriorityClasses, namespaces and quotas on the Kubernetes cluster (after a tier or
    quota change); nothing with another backend."""
    if settings.FAIRQ_CLUSTER_BACKEND != "kubernetes":
        return
    from queueing.backends.k8s_sync import sync_cluster

    report = sync_cluster()
    failed = report.get("failed") or []
    if not failed:
        log.info("cluster synced: %s", report)
        return
    log.error("cluster synced with failures: %s", failed)
    if any(f["status"] == 0 or f["status"] >= 500 for f in failed):
        # No answer or a server error may pass: retry (autoretry_for). A refusal (4xx,
        # an invalid name) would be refused again: logged, not retried.
        raise RuntimeError(f"sync_cluster: {len(failed)} object(s) failed, retrying")
