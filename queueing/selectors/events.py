"""Reads of job events for the watchers (queueing/api/watch.py): a job's long poll and a
team's server-sent event stream, each an indexed read per poll."""

from __future__ import annotations

from django.db.models import Max

from queueing.models import Job, JobEvent


def last_event_id(job_id: int) -> int:
    """The id of the job's newest event (0 without one)."""
    return JobEvent.objects.filter(job_id=job_id).aggregate(m=Max("id"))["m"] or 0


def newest_event_id() -> int:
    """The id of the newest event of any job (0 without one)."""
    return JobEvent.objects.aggregate(m=Max("id"))["m"] or 0


def job_has_event_after(*, job_id: int, event_id: int) -> bool:
    return JobEvent.objects.filter(job_id=job_id, id__gt=event_id).exists()


def job_watched_fields_reload(*, job: Job) -> None:
    """The fields a long poll watches (`updated_at`, `status`, `attempt`), read again."""
    job.refresh_from_db(fields=["updated_at", "status", "attempt"])


def team_events_after(*, team_ids: list[int], after: int, skip: set[int],
                      limit: int) -> list[JobEvent]:
    """The teams' job events with an id above `after`, not in `skip`, oldest first, at
    most `limit`, each with its job and team."""
    return list(JobEvent.objects.filter(job__team_id__in=team_ids, id__gt=after)
                .exclude(id__in=skip).select_related("job", "job__team").order_by("id")
                [:limit])
