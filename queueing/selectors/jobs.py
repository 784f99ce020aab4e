"""Reads of queueing data, scoped to what an actor may see (the tenant choke-point)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet, TextField, prefetch_related_objects
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from queueing import validation as v
from queueing.errors import NotFound
from queueing.models import Job
from queueing.policy.states import JobState


def jobs_visible_to(*, actor: Any) -> QuerySet[Job]:
    """Jobs of the actor's teams; every job for staff. Every job list starts here."""
    qs = Job.objects.select_related("team", "gpu_type", "tier", "submitter")
    if actor.is_staff:
        return qs
    return qs.filter(team__memberships__user=actor)


def job_get_for_actor(*, actor: Any, job_id: int) -> Job:
    """The job if the actor may see it; NotFound (404) otherwise, never 403, so job ids
    of other teams are not disclosed."""
    job = jobs_visible_to(actor=actor).filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job



MAX_LABEL_FILTERS = 16


def label_filter_parse(items: list[str]) -> list[tuple[str, str]]:
    """The (key, value) pairs of `key=value` label filters (the API's `?label=` and the
    job list page's); ValueError naming the first one that is not a job's own label."""
    if len(items) > MAX_LABEL_FILTERS:
        raise ValueError(f"At most {MAX_LABEL_FILTERS} label filters.")
    pairs = []
    for item in items:
        key, sep, label = str(item).partition("=")
        if not sep or not v.LABEL_NAME_RE.match(key) or len(key) > v.MAX_LABEL_KEY_LEN \
                or len(label) > v.MAX_LABEL_VALUE_LEN or not v.LABEL_VALUE_RE.match(label):
            raise ValueError(f"Write label=key=value (a job's own label), not "
                             f"{str(item)[:80]!r}.")
        pairs.append((key, label))
    return pairs


def jobs_with_labels(qs: QuerySet[Job], pairs: list[tuple[str, str]]) -> QuerySet[Job]:
    """The jobs of `qs` carrying every (key, value) label (AND), on the `labels` JSON
    column (a key lookup: SQLite and PostgreSQL alike)."""
    for i, (key, label) in enumerate(pairs):
        alias = f"_label_{i}"
        # Cast: the text of the value, compared as text (a bare key transform would
        # compare as JSON, and SQLite's json_extract() refuses a plain string).
        text = Cast(KeyTextTransform(key, "labels"), output_field=TextField())
        qs = qs.alias(**{alias: text}).filter(**{alias: label})
    return qs


def no_jobs() -> QuerySet[Job]:
    """The empty job list (no team, a refused filter, schema generation)."""
    return Job.objects.none()


def team_job_list(*, actor: Any, team: Any, array_id: int | None,
                  labels: list[tuple[str, str]] | None) -> QuerySet[Job]:
    """The job list page's jobs: the team's that `actor` may see, of one array if
    `array_id`, carrying every label of `labels`; none without a team or with `labels`
    None (a refused label filter)."""
    if team is None or labels is None:
        return no_jobs()
    jobs = jobs_visible_to(actor=actor).filter(team=team)
    if array_id is not None:
        jobs = jobs.filter(array_id=array_id)
    return jobs_with_labels(jobs, labels)


def job_visible_get(*, actor: Any, job_id: int) -> Job:
    """The job `actor` may see, read again (Job.DoesNotExist otherwise)."""
    return jobs_visible_to(actor=actor).get(pk=job_id)


def job_with_events(*, job_id: int, related: bool = False) -> Job:
    """The job with its events prefetched (one more query); with `related`, its team,
    GPU type, tier and submitter in the same row."""
    qs = Job.objects.select_related("team", "gpu_type", "tier", "submitter") if related \
        else Job.objects
    return qs.prefetch_related("events").get(pk=job_id)


def job_events_prefetch(job: Job) -> Job:
    """`job` as loaded, its events read in one more query."""
    prefetch_related_objects([job], "events")
    return job


def job_events(job: Job) -> QuerySet[Any]:
    """Everything that happened to the job, in the events' order (oldest first)."""
    return job.events.all()


def job_events_with_actor(job: Job) -> list[Any]:
    """The job's events oldest first (by time, then id), each with its actor."""
    return list(job.events.select_related("actor").order_by("at", "id"))


def job_reload(*, job: Job) -> None:
    """Every field of `job` as stored now."""
    job.refresh_from_db()


def queued_job_ids_visible(*, actor: Any, teams: Any) -> list[int]:
    """The ids of `teams`' queued jobs that `actor` may see."""
    return list(jobs_visible_to(actor=actor).filter(
        status=JobState.QUEUED, team__in=teams).values_list("id", flat=True))


def jobs_with_team_and_tier(*, ids: list[int]) -> list[Job]:
    """The jobs of `ids`, each with its team, GPU type and tier."""
    return list(Job.objects.filter(pk__in=ids).select_related("team", "gpu_type", "tier"))
