"""Reads of accounts: which teams a user may see and act for, their members, tokens,
users by name and the audit entries the pages show."""

from __future__ import annotations

import hmac
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q, QuerySet

from queueing import rawsql

from .models import ApiToken, AuditEntry, Membership, Role, Team


def teams_for_user(*, user: Any, slug: str | None = None) -> QuerySet[Team]:
    """Teams `user` belongs to; every team for staff. With `slug`, only that one (empty
    when it is none of them)."""
    teams = Team.objects.all() if user.is_staff else Team.objects.filter(
        memberships__user=user)
    return teams.filter(slug=slug) if slug else teams


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



def api_token_for_key(*, prefix: str, digest: str) -> ApiToken | None:
    """The token with this prefix if its key hashes to `digest` (`ApiToken.hash_key`),
    its user loaded; None otherwise. The hashes are compared in constant time, so a
    stored hash cannot be probed byte by byte."""
    token = api_token_with_user(prefix=prefix)
    if token is None or not hmac.compare_digest(token.key_hash, digest):
        return None
    return token


def all_teams() -> QuerySet[Team]:
    """Every team: the choices of a serializer's `team` or `parent` field (its
    validation reads one row per value)."""
    return Team.objects.all()


def team_by_slug(*, slug: str) -> Team | None:
    """The team with this slug, whoever asks (staff pages and checks); None without one."""
    return Team.objects.filter(slug=slug).first()


def team_slug_taken(*, slug: str) -> bool:
    return Team.objects.filter(slug=slug).exists()


def team_reload(*, team: Team) -> None:
    """`team` as stored now (after a refused change left the object edited)."""
    team.refresh_from_db()


def teams_for_user_by_slug(*, user: Any) -> QuerySet[Team]:
    """`teams_for_user`, by slug: the team switcher's order."""
    return teams_for_user(user=user).order_by("slug")


def first_team_for_user(*, user: Any) -> Team | None:
    """The first of the user's teams by slug (the current team when none is picked)."""
    return teams_for_user_by_slug(user=user).first()


def team_switcher_teams(*, user: Any) -> list[Team]:
    """The user's teams by slug, their slugs and names only: the switcher's and the
    reports page's (staff: every team, whose other fields cost more to load than either
    page uses)."""
    return list(teams_for_user_by_slug(user=user).only("slug", "name"))


def teams_with_grants_for_user(*, user: Any) -> QuerySet[Team]:
    """`teams_for_user` with each team's parent and tier grants loaded (the team list)."""
    return teams_for_user(user=user).select_related("parent").prefetch_related(
        "tier_grants__tier")


def roles_of_user(*, user: Any) -> dict[int, str]:
    """{team id: the user's role in it}."""
    return dict(Membership.objects.filter(user=user).values_list("team_id", "role"))


def active_user_by_username(*, username: str) -> Any | None:
    """The active user with this name; None without one (or when inactive)."""
    return get_user_model().objects.filter(username=username, is_active=True).first()


def users_by_username(*, username: str) -> QuerySet[Any]:
    """Users with this name (at most one): the sign-on's match of a claim."""
    return get_user_model().objects.filter(username=username)


def membership_of_team(*, team: Team, membership_id: int) -> Membership | None:
    """The team's membership with this id, its user and team loaded; None otherwise."""
    return Membership.objects.filter(team=team, pk=membership_id).select_related(
        "user", "team").first()


def membership_of_team_by_username(*, team: Team, username: str) -> Membership | None:
    return memberships_of_team(team=team).filter(user__username=username).first()


def token_of_user(*, user: Any, token_id: int) -> ApiToken | None:
    """One of the user's own tokens; None for another's, so callers answer 404."""
    return tokens_of_user(user=user).filter(pk=token_id).first()


QUOTA_AUDIT_LIMIT = 30


def quota_audit_entries() -> list[AuditEntry]:
    """The quota board's recent changes, newest first: quotas, and team weights and
    parents (the Team entries that changed `weight` or `parent`)."""
    entries = list(AuditEntry.objects.filter(
        Q(object_type="queueing.Quota")
        | Q(object_type="accounts.Team", changes__has_key="weight")
        | Q(object_type="accounts.Team", changes__has_key="parent"))
        .select_related("actor").order_by("-at", "-id")[:QUOTA_AUDIT_LIMIT])
    # A parent is recorded by its id; the board names it (not saved back).
    ids = {i for e in entries for i in (e.changes.get("parent") or []) if isinstance(i, int)}
    slugs = dict(Team.objects.filter(pk__in=ids).values_list("pk", "slug")) if ids else {}
    for e in entries:
        if e.changes.get("parent"):
            e.changes = {**e.changes, "parent": [slugs.get(i, i) for i in e.changes["parent"]]}
    return entries
