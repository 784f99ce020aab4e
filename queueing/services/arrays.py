"""Array jobs as a whole: cancelling the members that have not ended (`DELETE
/api/v1/arrays/{id}/`, `fairq cancel --array ID`). Submitting one is
`services.jobs.jobs_submit_array`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from queueing.composition import stop_workload_soon
from queueing.models import Job, JobArray, JobEvent
from queueing.policy.states import FINAL_STATES, HOLDING_STATES, JobState
from queueing.sanitize import clean_text
from queueing.selectors.arrays import array_get_for_actor
from queueing.selectors.queue_plan import queue_plan_forget

from .jobs import job_transition
from .usage import usage_record_attempt

_REASON_MAX = JobEvent._meta.get_field("reason").max_length or 500


@transaction.atomic
def array_cancel(*, actor: Any, array: JobArray, now: datetime | None = None) -> list[int]:
    """Cancel every member of `array` that has not ended, in one transaction, each with its
    transition event (NotFound unless `actor` may see the array). Queued members are
    cancelled in bulk (one UPDATE, one INSERT of events); members holding GPUs one by one,
    their GPU time charged and their workloads stopped after commit, like `job_cancel`.
    Returns the ids cancelled; members that ended meanwhile are left alone."""
    now = now or timezone.now()
    if actor is not None:
        array = array_get_for_actor(actor=actor, array_id=array.pk)
    reason = clean_text(f"cancelled by {actor} (array {array.pk})", max_length=_REASON_MAX)
    members = list(
        Job.objects.select_for_update()
        .filter(array=array)
        .exclude(status__in=[s.value for s in FINAL_STATES])
        .order_by("id")
    )
    cancelled: list[int] = []
    queued = [j for j in members if j.state == JobState.QUEUED]
    if queued:
        ids = [j.pk for j in queued]
        # Locked above: no cycle moves them between the SELECT and this UPDATE.
        Job.objects.filter(pk__in=ids, status=JobState.QUEUED).update(
            status=JobState.CANCELLED, finished_at=now, updated_at=now
        )
        user = actor if getattr(actor, "is_authenticated", False) else None
        JobEvent.objects.bulk_create(
            [
                JobEvent(
                    job_id=j.pk,
                    at=now,
                    kind=JobEvent.Kind.TRANSITION,
                    from_status=JobState.QUEUED,
                    to_status=JobState.CANCELLED,
                    actor=user,
                    actor_label=str(actor)[:100],
                    reason=reason,
                    attempt=j.attempt,
                    data={"array": array.pk},
                )
                for j in queued
            ],
            batch_size=2000,
        )
        cancelled += ids
    for job in (j for j in members if j.state != JobState.QUEUED):
        held = job.state in HOLDING_STATES
        if not job_transition(
            job,
            JobState.CANCELLED,
            now=now,
            actor=actor,
            reason=reason,
            finished_at=now,
            data={"array": array.pk},
        ):
            continue
        cancelled.append(job.pk)
        if held:
            if job.started_at is not None:
                usage_record_attempt(job=job, start=job.started_at, end=now)
            name = job.backend_name
            transaction.on_commit(lambda name=name: stop_workload_soon(name))  # type: ignore[misc]
    transaction.on_commit(queue_plan_forget)
    return sorted(cancelled)
