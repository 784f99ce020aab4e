"""Reads of checkpoints (docs/api.md, "Checkpoints and graceful stop"): a job's, newest
first; the newest of many jobs in one query. The writes are services/checkpoints.py's."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection
from django.db.models import QuerySet

from queueing.models import Checkpoint, Job


def job_checkpoints(job: Job, *, limit: int | None = None) -> QuerySet[Checkpoint]:
    """The job's checkpoints, every attempt's, newest first."""
    qs = Checkpoint.objects.filter(job=job).order_by("-created_at", "-id")
    return qs[:limit] if limit is not None else qs


def newest_checkpoint(job: Job) -> Checkpoint | None:
    """The job's newest checkpoint (any attempt), or None (one index scan)."""
    return job_checkpoints(job).first()


def newest_checkpoints(job_ids: Iterable[int]) -> dict[int, Checkpoint]:
    """Job id -> its newest checkpoint (any attempt), for those that have one: one query
    (DISTINCT ON on PostgreSQL, over the (job, created_at) index)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    qs = Checkpoint.objects.filter(job_id__in=ids)
    if connection.vendor == "postgresql":
        rows = qs.order_by("job_id", "-created_at", "-id").distinct("job_id")
        return {c.job_id: c for c in rows}
    out: dict[int, Checkpoint] = {}
    for c in qs.order_by("job_id", "-created_at", "-id"):
        out.setdefault(c.job_id, c)
    return out
