"""Reads of accounts: which teams a user may see and act for."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

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
