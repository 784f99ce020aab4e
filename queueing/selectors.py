"""Reads of queueing data, scoped to what an actor may see (the tenant choke-point)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from .errors import NotFound
from .models import Job


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


def teams_in_standings_for(*, actor: Any) -> set[str] | None:
    """Slugs of the teams whose fair-share standing, usage and GPUs held `actor` may see:
    the teams they are in. None means every team: staff, or FAIRQ_FAIRSHARE_PUBLIC
    (docs/api.md, "Who sees which team"). The API's /fairshare/, the CLI's `share` and
    the dashboard all go through here."""
    from django.conf import settings

    from accounts.models import Team

    if actor.is_staff or settings.FAIRQ_FAIRSHARE_PUBLIC:
        return None
    return set(Team.objects.filter(memberships__user=actor).values_list("slug", flat=True))
