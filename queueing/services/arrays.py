"""Array jobs as a whole: cancelling the members that have not ended (`DELETE
/api/v1/arrays/{id}/`, `fairq cancel --array ID`). Submitting one is
`services.jobs.jobs_submit_array`."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from queueing import rawsql
from queueing.composition import stop_workload_soon
from queueing.models import Job, JobArray, JobEvent
from queueing.policy.states import FINAL_STATES, HOLDING_STATES, JobState
from queueing.sanitize import clean_text
from queueing.selectors.arrays import array_get_for_actor
from queueing.selectors.queue_plan import queue_plan_forget

from .jobs import job_transition
from .usage import usage_record_attempt
from .webhooks import webhooks_events_written

_REASON_MAX = JobEvent._meta.get_field("reason").max_length or 500
_LABEL_MAX = JobEvent._meta.get_field("actor_label").max_length or 100


def _cancel_queued(array: JobArray, *, now: datetime, user: Any, label: str, reason: str) -> list[int]:
    """QUEUED -> CANCELLED for every queued member of `array`, each with its transition
    event (rule S1), the compare-and-swap on the state in the UPDATE itself. On PostgreSQL
    one statement (a data-modifying WITH: the UPDATE's rows feed the events' INSERT);
    elsewhere an UPDATE and a bulk INSERT of the ids locked first."""
    data = {"array": array.pk}
    if connection.vendor == "postgresql":
        job_t, event_t = rawsql.table(Job), rawsql.table(JobEvent)
        with connection.cursor() as cur:
            cur.execute(
                f"WITH c AS (UPDATE {job_t} SET status = %s, finished_at = %s, updated_at = %s "
                "WHERE array_id = %s AND status = %s RETURNING id, attempt) "
                f"INSERT INTO {event_t} (job_id, at, kind, from_status, to_status, actor_id, "
                "actor_label, reason, attempt, data) "
                "SELECT id, %s, %s, %s, %s, %s, %s, %s, attempt, %s::jsonb FROM c "
                "RETURNING job_id",
                [
                    JobState.CANCELLED.value,
                    now,
                    now,
                    array.pk,
                    JobState.QUEUED.value,
                    now,
                    JobEvent.Kind.TRANSITION.value,
                    JobState.QUEUED.value,
                    JobState.CANCELLED.value,
                    user.pk if user is not None else None,
                    label,
                    reason,
                    json.dumps(data),
                ],
            )
            return [row[0] for row in cur.fetchall()]
    queued = list(
        Job.objects.select_for_update()
        .filter(array=array, status=JobState.QUEUED)
        .values_list("pk", "attempt")
    )
    ids = [pk for pk, _ in queued]
    Job.objects.filter(pk__in=ids, status=JobState.QUEUED).update(
        status=JobState.CANCELLED, finished_at=now, updated_at=now
    )
    JobEvent.objects.bulk_create(
        [
            JobEvent(
                job_id=pk,
                at=now,
                kind=JobEvent.Kind.TRANSITION,
                from_status=JobState.QUEUED,
                to_status=JobState.CANCELLED,
                actor=user,
                actor_label=label,
                reason=reason,
                attempt=attempt,
                data=data,
            )
            for pk, attempt in queued
        ],
        batch_size=2000,
    )
    return ids


@transaction.atomic
def array_cancel(*, actor: Any, array: JobArray, now: datetime | None = None) -> list[int]:
    """Cancel every member of `array` that has not ended, in one transaction, each with its
    transition event (NotFound unless `actor` may see the array). Queued members are
    cancelled in bulk (`_cancel_queued`: one statement on PostgreSQL); members holding GPUs
    one by one,
    their GPU time charged and their workloads stopped after commit, like `job_cancel`.
    Returns the ids cancelled; members that ended meanwhile are left alone."""
    now = now or timezone.now()
    if actor is not None:
        array = array_get_for_actor(actor=actor, array_id=array.pk)
    reason = clean_text(f"cancelled by {actor} (array {array.pk})", max_length=_REASON_MAX)
    user = actor if getattr(actor, "is_authenticated", False) else None
    label = clean_text(str(actor), max_length=_LABEL_MAX)
    cancelled = _cancel_queued(array, now=now, user=user, label=label, reason=reason)
    # The bulk path writes its events itself: they go to the webhooks as `job_transition`'s
    # do (after commit, one message), when the team or the members have a receiver.
    if cancelled and (array.team.webhooks.filter(enabled=True).exists()
                      or Job.objects.filter(array=array).exclude(notify_url="").exists()):
        webhooks_events_written(JobEvent.objects.filter(
            job_id__in=cancelled, kind=JobEvent.Kind.TRANSITION,
            to_status=JobState.CANCELLED).values_list("pk", flat=True))
    # The members holding GPUs (and preempted ones on their way back to the queue): few,
    # one by one, as `job_cancel` does.
    members = list(
        Job.objects.select_for_update()
        .filter(array=array)
        .exclude(status__in=[*(s.value for s in FINAL_STATES), JobState.QUEUED.value])
        .order_by("id")
    )
    for job in members:
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
    # A preempted member that a cycle requeued meanwhile is queued now: cancel it too.
    cancelled += _cancel_queued(array, now=now, user=user, label=label, reason=reason)
    transaction.on_commit(queue_plan_forget)
    return sorted(cancelled)
