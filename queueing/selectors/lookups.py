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
from queueing.models import GpuType, Tier

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
    not the ORM's query compiler (queueing/rawsql.py says why)."""
    sql = f"SELECT {rawsql.select_list(Team, 't')} FROM {rawsql.table(Team)} t WHERE t.slug = %s"
    params: list[Any] = [slug]
    if not user.is_staff:
        sql += (f" AND EXISTS (SELECT 1 FROM {rawsql.table(Membership)} m "
                "WHERE m.team_id = t.id AND m.user_id = %s)")
        params.append(user.pk)
    with connection.cursor() as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    return None if row is None else rawsql.from_row(Team, row)[0]
