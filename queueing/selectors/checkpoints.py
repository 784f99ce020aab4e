"""Reads of checkpoints (docs/api.md, "Checkpoints and graceful stop"): a job's, newest
first; the newest of many jobs in one query. The writes are services/checkpoints.py's."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import OuterRef, QuerySet, Subquery

from queueing.models import Checkpoint, Job


def job_checkpoints(job: Job, *, limit: int | None = None) -> QuerySet[Checkpoint]:
    """The job's checkpoints, every attempt's, newest first."""
    qs = Checkpoint.objects.filter(job=job).order_by("-created_at", "-id")
    return qs[:limit] if limit is not None else qs


def newest_checkpoint(job: Job) -> Checkpoint | None:
    """The job's newest checkpoint (any attempt), or None (one index scan)."""
    return job_checkpoints(job).first()


def newest_checkpoints(job_ids: Iterable[int]) -> dict[int, Checkpoint]:
    """Job id -> its newest checkpoint (any attempt), for those that have one: one query,
    each job's newest found by a subquery over the (job, created_at) index."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    newest = Checkpoint.objects.filter(job=OuterRef("job")).order_by("-created_at", "-id")
    rows = Checkpoint.objects.filter(job_id__in=ids, pk=Subquery(newest.values("pk")[:1]))
    return {c.job_id: c for c in rows}
