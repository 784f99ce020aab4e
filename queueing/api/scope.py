"""Which teams a read is about: the one its `team` parameter names, or every team the
caller may see. One rule for the usage, accounting and cost reads."""

from __future__ import annotations

from typing import Any

from accounts.selectors import team_get_for_user, teams_for_user
from queueing.errors import NotFound


def teams_asked(*, user: Any, slug: str | None) -> Any:
    """[the team `slug`] when the caller may see it, NotFound (404) when not (another
    team's name tells nothing); with no `slug` the caller's teams (staff: every team)."""
    if slug:
        team = team_get_for_user(user=user, slug=slug)
        if team is None:
            raise NotFound(f"team {slug} not found")
        return [team]
    return teams_for_user(user=user)
