"""Reads of accounts: which teams a user may see and act for."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from .models import Membership, Role, Team


def teams_for_user(*, user: Any) -> QuerySet[Team]:
    """Teams `user` belongs to; every team for staff."""
    if user.is_staff:
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user)


def is_team_admin(*, user: Any, team: Team) -> bool:
    if user.is_staff:
        return True
    return Membership.objects.filter(user=user, team=team, role=Role.TEAM_ADMIN).exists()
