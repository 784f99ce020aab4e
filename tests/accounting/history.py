"""A small accounting history written straight to the models: attempts that ended one
way or another, with usage records, their ending transitions and utilization."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from queueing.models import AttemptUtilization, Job, JobEvent, UsageRecord
from queueing.policy.states import JobState
from queueing.services.usage import accumulator_add
from tests.factories import JobFactory

T0 = datetime(2026, 10, 1, tzinfo=UTC)


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
    accumulator_add(team_id=job.team_id, rate=gpus * job.gpu_type.billing_weight, start=start,
                    end=end)  # as usage_record_attempt does (rule F1)
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


def seed(world: Any) -> dict[str, Any]:
    """Four jobs: vision's j1 (alice; preempted, then succeeded), j2 (dave; failed)
    and j4 (dave; running now), nlp's j3 (bob)."""
    j1 = job(team=world.vision, submitter=world.admin, gpu_type=world.h100, gpus_per_replica=2,
             tier=world.normal, attempt=2, exit_code=0, name="resnet")
    finished_attempt(job=j1, attempt=1, start=T0, hours=2, ended="PREEMPTED",
                     reason="preempted by job 99")
    finished_attempt(job=j1, attempt=2, start=T0 + timedelta(hours=3), hours=3,
                     ended="SUCCEEDED", sm_mean=80.0)
    j2 = job(team=world.vision, submitter=world.member, gpu_type=world.a100, tier=world.low,
             status="FAILED", exit_code=137, name="oom")
    finished_attempt(job=j2, attempt=1, start=T0 + timedelta(days=1), hours=1, ended="FAILED",
                     reason="exit code 137")
    j3 = job(team=world.nlp, submitter=world.outsider, gpu_type=world.h100, tier=world.normal,
             name="bert")
    finished_attempt(job=j3, attempt=1, start=T0 + timedelta(hours=1), hours=1,
                     ended="SUCCEEDED", sm_mean=40.0)
    started = timezone.now() - timedelta(minutes=30)
    j4 = job(team=world.vision, submitter=world.member, gpu_type=world.a100, tier=world.normal,
             status="RUNNING", started_at=started, name="live")
    utilization(job=j4, attempt=1, start=started, minutes=30, sm_mean=3.0)
    return {"j1": j1, "j2": j2, "j3": j3, "j4": j4}
