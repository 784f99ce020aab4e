"""Spot reclamation, rule K6 (docs/scheduling.md, "Clusters and spot capacity").

Backends report, this service decides: a backend reports a workload whose spot node was
reclaimed under it (the node deleted, or a termination taint or label appearing on it:
FAIRQ_SPOT_TERMINATION_TAINTS) as FAILED with `base.spot_reclaimed_reason` and the
reclamation as its `finished_at`. Called from the cycle's reconcile
(services/scheduler.py) before it reads the statuses, `spot_reclaimed_requeue` turns that
into a requeue, the way preemption requeues (rule R6), and not into a failure:

    1. in one savepoint per job: RUNNING/ADMITTED → PREEMPTED → QUEUED as attempt + 1
       (its submit time kept, its placement and cluster cleared), the GPU time of the
       attempt up to the reclamation charged to its team (a usage record, as for any
       ended attempt), and a `spot_reclaimed` event with the node and the GPU-seconds
       charged. Webhooks see the two transitions. No `failed` state, no retry spent.
    2. after commit: the old workload is stopped (its logs kept), so nothing runs twice.

A status whose attempt its job no longer holds is left to reconcile (an unowned workload:
charged once if it ran, and stopped).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from django.db import InterfaceError, OperationalError, transaction

from queueing.backends.base import (
    SPOT_RECLAIMED,
    ClusterBackend,
    WorkloadStatus,
    spot_reclaimed_node,
)
from queueing.composition import kick
from queueing.models import Job, JobEvent
from queueing.policy.states import HOLDING_STATES, JobState

from .jobs import job_transition, next_attempt
from .logs import workload_stop_keeping_logs
from .usage import usage_record_attempt

log = logging.getLogger(__name__)


class _Requeued(Protocol):
    """What the cycle's result keeps of this step (scheduler.CycleResult)."""

    cycle_id: str
    requeued: list[int]


def spot_reclaimed_requeue(*, backend: ClusterBackend, statuses: Sequence[WorkloadStatus],
                           now: datetime, result: _Requeued) -> list[WorkloadStatus]:
    """Rule K6 for every reclaimed workload among `statuses` whose job holds that
    attempt: requeued, charged, its workload stopped (see the module docstring). Returns
    the statuses left for reconcile (all the others). A job that cannot be requeued
    for an unexpected reason is logged and skipped: its status is kept out of
    reconcile (which would fail the job) and the next cycle tries again."""
    reclaimed = {s.job_id: s for s in statuses if spot_reclaimed_node(s) is not None}
    if not reclaimed:
        return list(statuses)
    jobs = Job.objects.select_related("team", "gpu_type", "cluster").in_bulk(list(reclaimed))
    taken: set[str] = set()
    stop: list[str] = []
    for job_id, status in sorted(reclaimed.items()):
        job = jobs.get(job_id)
        if job is None or job.attempt != status.attempt or job.state not in HOLDING_STATES:
            continue  # not its job's attempt any more: an unowned workload for reconcile
        taken.add(status.name)
        try:
            with transaction.atomic():
                if _requeue(job, status, now=now):
                    result.requeued.append(job.pk)
                    stop.append(status.name)
                    transaction.on_commit(kick)
        except (OperationalError, InterfaceError):
            raise  # not this job's fault: the cycle fails and is retried
        except Exception:
            log.exception("cycle %s: job %s: requeueing it after its spot node was "
                          "reclaimed failed; the next cycle tries again", result.cycle_id,
                          job_id)
    for name in stop:
        _stop(backend=backend, name=name, now=now)
    return [s for s in statuses if s.name not in taken]


def _requeue(job: Job, status: WorkloadStatus, *, now: datetime) -> bool:
    """Step 1 for one job; False when another cycle moved it first."""
    node = spot_reclaimed_node(status) or ""
    # An admitted job's pods may have started before fairq saw them run: the backend's
    # start counts then.
    ran_since = (job.started_at if job.state == JobState.RUNNING else None) or \
        status.started_at
    # The attempt ends at the reclamation (the backend's word), never after now.
    end = min(status.finished_at or now, now)
    data = {"rule": "K6", "reason": SPOT_RECLAIMED, "node": node,
            "cluster": job.cluster.name if job.cluster is not None else "",
            "workload": status.name, "ended_how": SPOT_RECLAIMED}
    if not job_transition(job, JobState.PREEMPTED, now=now, data=data,
                          reason=f"{status.reason}: its spot node was reclaimed (rule K6)"):
        return False
    gpu_seconds = 0.0
    if ran_since is not None:
        record = usage_record_attempt(job=job, start=ran_since, end=max(end, ran_since))
        gpu_seconds = record.gpu_seconds if record is not None else 0.0
    JobEvent.objects.create(
        job=job, at=now, kind=JobEvent.Kind.SPOT_RECLAIMED, actor_label="scheduler",
        attempt=job.attempt,
        reason=f"spot node {node} was reclaimed ({status.reason}); requeued as attempt "
               f"{job.attempt + 1}, {gpu_seconds:.0f} GPU-seconds charged, not a failure",
        data={**data, "gpu_seconds": gpu_seconds, "reclaimed_at": end.isoformat()})
    return job_transition(
        job, JobState.QUEUED, now=now, data=data,
        reason="requeued after its spot node was reclaimed; keeps its submit time",
        message="", **next_attempt(job.attempt + 1))


def _stop(*, backend: ClusterBackend, name: str, now: datetime) -> None:
    """Step 2: the old workload stopped, its logs kept; called with the requeue committed
    (reconcile runs with no transaction open). A stop that fails is retried by a later
    reconcile: the workload's attempt is no longer its job's, so it is stopped as an
    orphan."""
    try:
        workload_stop_keeping_logs(backend=backend, name=name, now=now)
    except Exception:
        log.warning("stopping reclaimed workload %s failed; the next cycle retries", name,
                    exc_info=True)
