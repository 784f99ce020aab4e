"""Reads of queueing data, scoped to what an actor may see (the tenant choke-point)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from queueing import validation as v
from queueing.errors import NotFound
from queueing.models import Job


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
