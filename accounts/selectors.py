"""Reads of accounts: which teams a user may see and act for."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import QuerySet

from queueing import rawsql

from .models import ApiToken, Membership, Role, Team


def teams_for_user(*, user: Any) -> QuerySet[Team]:
    """Teams `user` belongs to; every team for staff."""
    if user.is_staff:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user)


def is_team_admin(*, user: Any, team: Team) -> bool:
    if user.is_staff:
        return True
    return Membership.objects.filter(user=user, team=team, role=Role.TEAM_ADMIN).exists()


def team_get_for_user(*, user: Any, slug: str) -> Team | None:
    """The team if `user` may see it (a member, or staff); None otherwise, so callers
    answer 404 whether the team exists or not."""
    return teams_for_user(user=user).filter(slug=slug).first()


def memberships_of_team(*, team: Team) -> QuerySet[Membership]:
    return Membership.objects.filter(team=team).select_related("user").order_by("user__username")


def tokens_of_user(*, user: Any) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


def api_token_with_user(*, prefix: str) -> ApiToken | None:
    """The token with this (unique) prefix, its user loaded, in one round trip; None when
    there is none. Runs on every API request: plain SQL, not the ORM's query compiler
    (queueing/rawsql.py says why)."""
    user_model = get_user_model()
    sql = (f"SELECT {rawsql.select_list(ApiToken, 't')}, {rawsql.select_list(user_model, 'u')} "
           f"FROM {rawsql.table(ApiToken)} t JOIN {rawsql.table(user_model)} u "
           f"ON u.id = t.user_id WHERE t.prefix = %s")
    with connection.cursor() as cur:
        cur.execute(sql, [prefix])
        row = cur.fetchone()
    if row is None:
        return None
    token, at = rawsql.from_row(ApiToken, row)
    token.user, _ = rawsql.from_row(user_model, row, at)
    return token

