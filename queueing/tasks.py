"""Celery tasks: thin wrappers that load ids and call one service."""

from __future__ import annotations

import logging
import random
import time

from celery import shared_task
from django.conf import settings

from accounts.services import idempotency_purge
from queueing.logcontext import log_context
from queueing.services.checkpoints import checkpoints_purge
from queueing.services.clusters import fleet_open
from queueing.services.costs import budgets_check
from queueing.services.demo import demo_submit_synthetic
from queueing.services.fairshare import fairshare_snapshot_take
from queueing.services.history import history_prune
from queueing.services.logs import job_logs_archive, job_logs_prune, workload_stop_keeping_logs
from queueing.services.metrics import record_cycle, record_cycle_failure
from queueing.services.provisioning import cluster_provisioners, sync_cluster, sync_quotas
from queueing.services.reports import usage_days_roll_up
from queueing.services.reservations import reservations_charge_unused
from queueing.services.scheduler import new_cycle_id, scheduler_cycle
from queueing.services.sessions import sessions_check
from queueing.services.webhooks import (
    webhook_attempt,
    webhook_deliveries_create,
    webhook_deliveries_purge,
    webhook_send_soon,
    webhooks_send_due,
)

log = logging.getLogger(__name__)


@shared_task(ignore_result=True, soft_time_limit=50, time_limit=60)
def scheduler_cycle_task() -> dict[str, int]:
    """One scheduler cycle (also sent by name, "queueing.tasks.scheduler_cycle_task", by
    composition.kick), counted (queueing/metrics.py) and logged with its id: a
    failed cycle is logged with the traceback and counted, never silent; a completed one
    gets one line with its timings (INFO when anything moved, DEBUG when idle)."""

    cycle_id = new_cycle_id()
    with log_context(cycle_id=cycle_id):  # on every line of the cycle (queueing/logcontext.py)
        return _scheduler_cycle_logged(cycle_id)


def _scheduler_cycle_logged(cycle_id: str) -> dict[str, int]:
    started = time.perf_counter()
    try:
        result = scheduler_cycle(cycle_id=cycle_id)
    except Exception as exc:
        record_cycle_failure(cycle_id)
        log.exception("cycle %s failed after %.3fs: %s", cycle_id,
                      time.perf_counter() - started, type(exc).__name__)
        return {"admitted": 0, "finished": 0, "failed": 1}
    record_cycle(result)
    if result.ran:
        moved = (result.admitted or result.started or result.finished or result.requeued
                 or result.preempted or result.job_errors)
        t = result.timings
        log.log(logging.INFO if moved else logging.DEBUG,
                "cycle %s ok in %.3fs (reconcile %.3f snapshot %.3f decide %.3f apply %.3f "
                "submit %.3f): admitted=%d started=%d finished=%d requeued=%d preempted=%d "
                "job_errors=%d", cycle_id, t.get("total", 0.0), t.get("reconcile", 0.0),
                t.get("snapshot", 0.0), t.get("decide", 0.0), t.get("apply", 0.0),
                t.get("submit", 0.0), len(result.admitted), len(result.started),
                len(result.finished), len(result.requeued), len(result.preempted),
                len(result.job_errors))
    return {"admitted": len(result.admitted), "finished": len(result.finished)}


@shared_task(ignore_result=True, autoretry_for=(Exception,), retry_backoff=True,
             max_retries=5, soft_time_limit=30, time_limit=45)
def stop_workload_task(name: str) -> None:
    from django.utils import timezone


    # Several clusters (docs/clusters.md): stopped on whichever runs it.
    workload_stop_keeping_logs(backend=fleet_open(), name=name, now=timezone.now())


@shared_task(ignore_result=True, soft_time_limit=40, time_limit=50)
def job_logs_archive_task() -> int:
    """The worker's copy of running jobs' logs, for web processes (services/logs.py).
    A run that stopped at its budget with work left queues the next at once: behind the
    cycles sent meanwhile, so on a one-process worker a cycle never waits for more than
    one budget of log reads, and the logs are still kept as fast as the worker can."""
    from django.utils import timezone


    result = job_logs_archive(backend=fleet_open(), now=timezone.now())
    if result.left:
        job_logs_archive_task.apply_async()
    return len(result.refreshed)


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def job_logs_prune_task() -> int:
    """Delete kept logs older than FAIRQ_LOG_RETENTION_DAYS (services/logs.py)."""
    from django.utils import timezone

    return job_logs_prune(now=timezone.now()).rows


@shared_task(ignore_result=True, soft_time_limit=20, time_limit=30)
def demo_load_task() -> int:
    """Demo only: keep a few jobs queued per demo team so the standings move."""
    if not settings.FAIRQ_DEMO_LOAD:
        return 0

    return demo_submit_synthetic(rng=random.Random())


@shared_task(ignore_result=True, soft_time_limit=50, time_limit=60)
def fairshare_snapshot_task() -> int:
    """Store the fair-share standings for charts (beat: FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS)."""
    from django.utils import timezone


    return len(fairshare_snapshot_take(now=timezone.now()).standings)


@shared_task(ignore_result=True, soft_time_limit=110, time_limit=120)
def budgets_check_task() -> int:
    """Give the budget warnings reached (rule B2; beat: every 5 minutes)."""
    from django.utils import timezone

    return len(budgets_check(now=timezone.now()))


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def usage_days_roll_up_task() -> int:
    """Add new usage records to the reports page's roll-up (beat: every 10 minutes)."""
    from django.utils import timezone

    return usage_days_roll_up(now=timezone.now())


@shared_task(ignore_result=True, soft_time_limit=3300, time_limit=3500)
def history_prune_task() -> int:
    """Archive, then delete, finished jobs, usage records and utilization samples older
    than their retention (services/history.py; beat: hourly). Returns the rows deleted."""
    from django.utils import timezone

    result = history_prune(now=timezone.now(), actor_label="beat")
    return sum(t.deleted for t in result.tables.values())


@shared_task(ignore_result=True, soft_time_limit=50, time_limit=60)
def sessions_check_task() -> dict[str, int]:
    """Rules N1-N4 on every running notebook session (beat: every minute): warn, stop
    the idle ones (docs/sessions.md)."""
    from django.utils import timezone

    result = sessions_check(now=timezone.now())
    if result.warned or result.culled:
        log.info("sessions: %d checked, %d warned, %d culled", result.checked,
                 len(result.warned), len(result.culled))
    return {"checked": result.checked, "unreadable": result.unreadable,
            "warned": len(result.warned), "culled": len(result.culled)}


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def checkpoints_purge_task() -> int:
    """Delete checkpoint rows older than FAIRQ_CHECKPOINT_RETENTION_DAYS, each job's
    newest kept (beat: hourly)."""
    from django.utils import timezone

    return checkpoints_purge(now=timezone.now(), days=settings.FAIRQ_CHECKPOINT_RETENTION_DAYS)


@shared_task(ignore_result=True, soft_time_limit=200, time_limit=230)
def reservations_charge_task() -> int:
    """docs/reservations.md, "Charging": the booked windows that ended, their unused
    GPU-hours charged once when FAIRQ_BOOKING_CHARGE_UNUSED is on (beat: every 5 min)."""
    return reservations_charge_unused()


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def idempotency_purge_task() -> int:
    """Forget Idempotency-Key records older than a day (beat: hourly)."""
    from django.utils import timezone


    return idempotency_purge(now=timezone.now())


@shared_task(ignore_result=True, autoretry_for=(Exception,), retry_backoff=True,
             max_retries=5, soft_time_limit=50, time_limit=60)
def sync_cluster_task() -> None:
    """After a tier or quota change, on every Kubernetes cluster (each enabled `Cluster`
    row of kind kubernetes, or the one implicit cluster): with
    FAIRQ_K8S_PROVISION=scheduler, PriorityClasses, namespaces and quotas; with
    "separate", only the provisioned namespaces' quotas (the worker may not do more; the
    provisioner runs `manage.py sync_cluster`). Nothing where no cluster is Kubernetes.
    One cluster's failure does not keep the others from being synced."""

    retry = False
    for name, provisioner in cluster_provisioners():
        where = name or "the cluster"
        if settings.FAIRQ_K8S_PROVISION == "scheduler":
            report = sync_cluster(provisioner)
        else:
            report = sync_quotas(provisioner)
            if report["not_provisioned"]:
                log.warning("%s: team namespaces not provisioned (run `manage.py "
                            "sync_cluster` as the provisioner): %s", where,
                            ", ".join(report["not_provisioned"]))
        failed = report.get("failed") or []
        if not failed:
            log.info("%s synced: %s", where, report)
            continue
        log.error("%s synced with failures: %s", where, failed)
        # No answer or a server error may pass: retry (autoretry_for). A refusal (4xx,
        # an invalid name) would be refused again: logged, not retried.
        retry = retry or any(f["status"] == 0 or f["status"] >= 500 for f in failed)
    if retry:
        raise RuntimeError("sync_cluster: objects failed on a cluster, retrying")


# --- webhooks (docs/webhooks.md; queueing/services/webhooks.py says the steps) ---------


@shared_task(ignore_result=True, soft_time_limit=50, time_limit=60)
def webhooks_dispatch_task(event_ids: list[int]) -> int:
    """Step 2, after a state change committed: write the deliveries of `event_ids` and
    queue a try of each (its own task: one slow receiver does not hold up the others)."""
    from django.utils import timezone

    created = webhook_deliveries_create(event_ids=event_ids, now=timezone.now())
    for delivery_id in created:
        webhook_send_soon(delivery_id)
    return len(created)


@shared_task(ignore_result=True, soft_time_limit=70, time_limit=80)
def webhook_deliver_task(delivery_id: int) -> None:
    """Step 3: one try; a failed one is queued again for when its retry is due (the
    `webhooks-due` sweep sends it too, should this message be lost)."""
    from django.utils import timezone

    attempt = webhook_attempt(delivery_id=delivery_id, now=timezone.now())
    if attempt is not None and attempt.next_retry_at is not None:
        webhook_deliver_task.apply_async((delivery_id,), eta=attempt.next_retry_at)


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def webhooks_due_task() -> int:
    """Step 4 (beat: FAIRQ_WEBHOOK_SWEEP_SECONDS): try every delivery that is due."""
    from django.utils import timezone

    return len(webhooks_send_due(now=timezone.now()))


@shared_task(ignore_result=True, soft_time_limit=240, time_limit=300)
def webhook_deliveries_purge_task() -> int:
    """Delete finished deliveries older than FAIRQ_WEBHOOK_LOG_RETENTION_DAYS (beat:
    hourly)."""
    from django.utils import timezone

    return webhook_deliveries_purge(now=timezone.now(),
                                    days=settings.FAIRQ_WEBHOOK_LOG_RETENTION_DAYS)
