"""Who may use which tier (rule T1): staff grant closed tiers to teams."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction

from accounts.models import Team
from accounts.services import audit_record, team_update
from queueing.models import Tier, TierGrant

from .access import check_staff


@transaction.atomic
def team_tier_grants_set(*, actor: Any, team: Team, tiers: Iterable[Tier]) -> list[Tier]:
    """Make `team`'s explicit grants exactly `tiers` (rule T1); each grant added or removed
    is audited in the same transaction. Tiers open to every team need no grant, but a
    grant of one is kept (it holds if the tier is closed later). Returns the granted
    tiers, highest rank first. Concurrent calls for one team take turns (the team row
    is locked). Staff only (`actor=None`: fairq itself)."""
    if actor is not None:
        check_staff(actor=actor, doing="grant tiers")
    Team.objects.select_for_update().filter(pk=team.pk).first()
    wanted = {t.pk: t for t in tiers}
    current = {g.tier_id: g for g in TierGrant.objects.filter(team=team).select_related("tier")}
    for tier_id, grant in current.items():
        if tier_id not in wanted:
            audit_record(actor=actor, action="delete", instance=grant,
                         changes={"tier": [grant.tier.slug, None], "team": [team.slug, None]})
            grant.delete()
    for tier_id, tier in wanted.items():
        if tier_id not in current:
            grant = TierGrant.objects.create(tier=tier, team=team)
            audit_record(actor=actor, action="create", instance=grant,
                         changes={"tier": [None, tier.slug], "team": [None, team.slug]})
    return sorted(wanted.values(), key=lambda t: -t.rank)


@transaction.atomic
def team_change(*, actor: Any, team: Team, fields: dict[str, Any],
                grants: Iterable[Tier] | None) -> Team:
    """Change a team's fields (`team_update`) and, unless `grants` is None, make its
    tier grants exactly `grants` (rule T1): both or neither. With neither given, the
    team is saved as it is (`team_update` with no field)."""
    if fields or grants is None:
        team = team_update(actor=actor, team=team, **fields)
    if grants is not None:
        team_tier_grants_set(actor=actor, team=team, tiers=grants)
    return team


def team_granted_tier_slugs(team: Team) -> list[str]:
    """The slugs of the tiers granted to `team` (prefetch `tier_grants__tier` for lists)."""
    return sorted(g.tier.slug for g in team.tier_grants.all())
