"""Lookups on the submit path, kept to one query each or none.

GPU types and tiers are a handful of rows that change rarely (staff, in the admin): each
process keeps them for `REFERENCE_TTL` seconds (queueing/memo.py), so a submit pays no
round trip for them. A renamed or added type is visible within that time.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from accounts.models import Membership, Team
from queueing import rawsql
from queueing.memo import ttl_memo
from queueing.models import BudgetPolicy, GpuType, TeamBudget, Tier

REFERENCE_TTL = 10


@ttl_memo(REFERENCE_TTL)
def gpu_types_by_slug() -> dict[str, GpuType]:
    return {row.slug: row for row in GpuType.objects.all()}


@ttl_memo(REFERENCE_TTL)
def tiers_by_slug() -> dict[str, Tier]:
    return {row.slug: row for row in Tier.objects.all()}


def team_for_submitter(*, user: Any, slug: str) -> Team | None:
    """The team if `user` may submit to it (a member, or staff), in one round trip; None
    whether it does not exist or the user is not in it. Runs on every submit: plain SQL,
    not the ORM's query compiler (queueing/rawsql.py says why). The team carries
    `has_downgrade_budget` (an annotation, read in the same statement): whether rule B3
    may apply, so `budget_downgrade_tier` needs no query of its own for the many teams
    without such a budget."""
    sql = (f"SELECT {rawsql.select_list(Team, 't')}, EXISTS (SELECT 1 FROM "
           f"{rawsql.table(TeamBudget)} b WHERE b.team_id = t.id AND b.policy = %s) "
           f"FROM {rawsql.table(Team)} t WHERE t.slug = %s")
    params: list[Any] = [BudgetPolicy.DOWNGRADE.value, slug]
    if not user.is_staff:
        sql += (f" AND EXISTS (SELECT 1 FROM {rawsql.table(Membership)} m "
                "WHERE m.team_id = t.id AND m.user_id = %s)")
        params.append(user.pk)
    with connection.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    if row is None:
        return None
    team, end = rawsql.from_row(Team, row)
    team.has_downgrade_budget = bool(row[end])  # type: ignore[attr-defined]
    return team
