"""Reads of queueing data, scoped to what an actor may see (the tenant choke-point)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

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

