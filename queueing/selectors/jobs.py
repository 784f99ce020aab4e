"""Reads of queueing data, scoped to what an actor may see (the tenant choke-point)."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import QuerySet

from queueing import rawsql
from queueing.errors import NotFound
from queueing.models import Job, Tier, TierGrant


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


def tier_allowed_for_team(*, tier_id: int, team_id: int) -> bool:
    """Rule T1: the tier is open to every team, or granted to this one. Read from the
    database on every call, never from a memo, so closing a tier or revoking a grant
    holds from the next submit on; one round trip in plain SQL (it runs on every submit,
    queueing/rawsql.py says why)."""
    sql = (f"SELECT 1 FROM {rawsql.table(Tier)} t WHERE t.id = %s AND (t.open_to_all_teams "
           f"OR EXISTS (SELECT 1 FROM {rawsql.table(TierGrant)} g "
           "WHERE g.tier_id = t.id AND g.team_id = %s))")
    with connection.cursor() as cur:
        cur.execute(sql, [tier_id, team_id])
        return cur.fetchone() is not None
