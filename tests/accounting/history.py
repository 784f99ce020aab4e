"""A small accounting history written straight to the models: attempts that ended one
way or another, with usage records, their ending transitions and utilization."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from queueing.models import AttemptUtilization, Job, JobEvent, UsageRecord
from queueing.policy.states import JobState
from tests.factories import JobFactory


def finished_attempt(*, job: Job, attempt: int, start: datetime, hours: float,
                     ended: str, reason: str = "", sm_mean: float | None = None) -> UsageRecord:
    """Charge attempt `attempt` of `job` for `hours` from `start` and write the
    transition that ended it (RUNNING -> `ended`)."""
    end = start + timedelta(hours=hours)
    gpus = job.gpus_per_replica * job.replicas
    record = UsageRecord.objects.create(
        team=job.team, gpu_type=job.gpu_type, job=job, attempt=attempt, gpus=gpus,
        billing_weight=job.gpu_type.billing_weight, start=start, end=end,
        gpu_seconds=gpus * hours * 3600)
    JobEvent.objects.create(job=job, at=start, kind=JobEvent.Kind.TRANSITION,
                            from_status="ADMITTED", to_status="RUNNING", attempt=attempt)
    JobEvent.objects.create(job=job, at=end, kind=JobEvent.Kind.TRANSITION,
                            from_status="RUNNING", to_status=ended, attempt=attempt,
                            reason=reason)
    if sm_mean is not None:
        utilization(job=job, attempt=attempt, start=start, minutes=int(hours * 60),
                    sm_mean=sm_mean)
    return record


def utilization(*, job: Job, attempt: int, start: datetime, minutes: int,
                sm_mean: float) -> AttemptUtilization:
    return AttemptUtilization.objects.create(
        job=job, attempt=attempt, first_at=start,
        last_at=start + timedelta(minutes=max(0, minutes - 1)), samples=minutes,
        sm_sum=sm_mean * minutes, sm_mean=sm_mean, sm_p95=sm_mean)


def job(**fields: Any) -> Job:
    fields.setdefault("status", JobState.SUCCEEDED)
    return JobFactory(**fields)  # type: ignore[no-any-return]
