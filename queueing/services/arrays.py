"""Array jobs as a whole: the cycle's top-up of each array's queued window (docs/scheduling.md "Arrays",
docs/scheduling.md "Arrays": members are written as Job rows as they are needed, like
Slurm's one record per array), and cancelling the members that have not ended
(`DELETE /api/v1/arrays/{id}/`, `fairq cancel --array ID`), the rest never written.
Submitting one is `services.jobs.jobs_submit_array`."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, F
from django.utils import timezone

from queueing import rawsql
from queueing.composition import stop_workload_soon
from queueing.errors import PermissionDenied
from queueing.models import GpuType, Job, JobArray, JobEvent
from queueing.policy.states import FINAL_STATES, HOLDING_STATES, JobState
from queueing.sanitize import clean_text
from queueing.selectors.arrays import array_get_for_actor
from queueing.selectors.cluster import cluster_view
from queueing.selectors.queue_plan import queue_plan_forget

from .access import cancel_refused_message, may_cancel
from .jobs import array_member_indices, array_members_notify, array_members_write, job_transition
from .usage import usage_record_attempt
from .webhooks import webhooks_events_written

_REASON_MAX = JobEvent._meta.get_field("reason").max_length or 500
_LABEL_MAX = JobEvent._meta.get_field("actor_label").max_length or 100

# The least number of queued rows the cycle keeps for an array that has unwritten
# members (docs/scheduling.md, "Arrays"); more when the cluster has more GPUs of the
# array's type than that many tasks use (`array_window`).
ARRAY_WINDOW = 64


def array_window(*, gpus_of_type: int, task_gpus: int, max_running: int | None) -> int:
    """How many of an array's members the cycle keeps queued as rows: enough
    that one plan could admit as many as fit on every GPU of the array's type (so the
    window never holds the array back: a plan admits at most that many), at least
    ARRAY_WINDOW, and no more than rule A8's limit lets hold GPUs at once."""
    need = max(ARRAY_WINDOW, gpus_of_type // max(task_gpus, 1))
    return min(need, max_running) if max_running is not None else need


def arrays_top_up(*, now: datetime) -> dict[int, list[int]]:
    """The cycle's one call before its snapshot: for every array with members
    not yet written, write the next ones (in index order) as QUEUED Job rows with their
    first event, until its queued rows reach `array_window` (the GPUs of its type from
    the cluster view the previous cycle published). Each array in its own transaction,
    its row locked (a cancel of the rest waits, then finds `materialized` final). Returns
    {array id: new job ids}; two queries when no array has members left to write."""
    pending = list(JobArray.objects.filter(rest_cancelled_at__isnull=True,
                                           materialized__lt=F("count"))
                   .order_by("pk").values_list("pk", flat=True))
    if not pending:
        return {}
    queued = dict(Job.objects.order_by().filter(array_id__in=pending, status=JobState.QUEUED)
                  .values_list("array_id").annotate(n=Count("id")).values_list("array_id", "n"))
    gpus: dict[str, int] = {}
    for node in cluster_view().open_nodes():  # rule K8: a draining cluster's take no new work
        gpus[node.gpu_type] = gpus.get(node.gpu_type, 0) + node.capacity
    slugs = dict(GpuType.objects.values_list("pk", "slug"))
    written: dict[int, list[int]] = {}
    for pk in pending:
        with transaction.atomic():
            array = (JobArray.objects.select_for_update().select_related("team")
                     .filter(pk=pk).first())
            if array is None or array.unmaterialized == 0:
                continue  # cancelled, or topped up by another cycle, meanwhile
            spec = array.spec
            window = array_window(
                gpus_of_type=gpus.get(slugs.get(spec.get("gpu_type_id"), ""), 0),
                task_gpus=int(spec.get("gpus_per_replica") or 1) * int(spec.get("replicas") or 1),
                max_running=array.max_running)
            add = min(array.unmaterialized, window - queued.get(pk, 0))
            if add <= 0:
                continue
            start = array.materialized
            ids = array_members_write(array, range(start, start + add), now=now)
            JobArray.objects.filter(pk=pk).update(materialized=start + add)
            array_members_notify(array, ids)
            written[pk] = ids
    if written:  # "why it waits" plans the rows: the new ones are in the queue now
        queue_plan_forget()
    return written


def _cancel_rest(array: JobArray, *, now: datetime, label: str, reason: str) -> int:
    """The members never written as rows are cancelled without ever getting one: the
    array records when and by whom (its "cancelled" event); they count as CANCELLED from
    then on. The caller holds the array's row lock. Returns how many."""
    rest = array.unmaterialized
    if rest == 0:
        return 0
    array.rest_cancelled_at = now
    # Their array indices (Slurm's `--array=0-40:2` has others than the positions).
    first, last = (array_member_indices(array, range(i, i + 1))[0]
                   for i in (array.materialized, array.count - 1))
    array.events = [*array.events, {
        "at": now.isoformat(), "kind": "cancelled", "actor": label,
        "reason": f"{reason}: {rest} tasks not yet queued as jobs cancelled "
                  f"(indices {first}..{last})",
        "data": {"from_index": first, "tasks": rest}}]
    array.save(update_fields=["rest_cancelled_at", "events"])
    return rest


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
def array_cancel(*, actor: Any, array: JobArray,
                 now: datetime | None = None) -> tuple[list[int], int]:
    """Cancel every member of `array` that has not ended, in one transaction, each with its
    transition event (NotFound unless `actor` may see the array; PermissionDenied unless
    it may cancel it, as `job_cancel`: its submitter, a team admin, staff, or a member
    when the team's `any_member_may_cancel` is on). The members not yet
    written as rows are cancelled on the array (`_cancel_rest`: no row is ever written
    for them, the array's "cancelled" event says so); queued members are cancelled in
    bulk (`_cancel_queued`: one statement on PostgreSQL); members holding GPUs one by
    one, their GPU time charged and their workloads stopped after commit, like
    `job_cancel`. Returns the ids cancelled and how many members were cancelled with no
    row; members that ended meanwhile are left alone."""
    now = now or timezone.now()
    if actor is not None:
        array = array_get_for_actor(actor=actor, array_id=array.pk)
        if not may_cancel(actor=actor, team=array.team, submitter_id=array.created_by_id):
            raise PermissionDenied(cancel_refused_message(array.team))
    reason = clean_text(f"cancelled by {actor} (array {array.pk})", max_length=_REASON_MAX)
    user = actor if getattr(actor, "is_authenticated", False) else None
    label = clean_text(str(actor), max_length=_LABEL_MAX)
    # The array's row first, as the cycle's top-up does: no member is written after this.
    array = JobArray.objects.select_for_update().select_related("team").get(pk=array.pk)
    # Then every member that has not ended, in id order, before any is written (rule L1,
    # docs/scheduling.md "Lock order"): the cycle locks the jobs it writes in id order
    # too (`scheduler.jobs_lock_in_id_order`), so the two wait for each other instead of
    # deadlocking. The UPDATE below alone locks the queued members in physical order.
    list(Job.objects.select_for_update().filter(array=array)
         .exclude(status__in=[s.value for s in FINAL_STATES]).order_by("id")
         .values_list("pk", flat=True))
    not_written = _cancel_rest(array, now=now, label=label, reason=reason)
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
    return sorted(cancelled), not_written
