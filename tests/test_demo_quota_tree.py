"""The demo seed's department (queueing/services/demo.py, `DEPARTMENTS`): `make demo`
shows a quota tree - research over vision and nlp, with a quota of its own that holds
theirs (rule Q8) - and the flat demo's fair shares (its weight is its teams')."""

from __future__ import annotations

import pytest
from django.utils import timezone

from accounts.models import Team
from queueing.models import Quota
from queueing.selectors.fairshare import fairshare_standings
from queueing.selectors.quota_tree import carve_problems, quota_forest
from queueing.services.demo import demo_history_seed, demo_seed

pytestmark = pytest.mark.django_db


def test_the_demo_seeds_a_department_with_two_teams_and_its_quota() -> None:
    demo_seed()
    demo_seed()  # twice: nothing changes
    research = Team.objects.get(slug="research")
    assert sorted(research.children.values_list("slug", flat=True)) == ["nlp", "vision"]
    assert Quota.objects.filter(team=research).count() == 1
    [h100] = quota_forest(gpu_type="h100").trees
    node = h100.by_team["research"]
    assert (node.is_department, node.has_row, node.nominal, node.borrowing_limit) == (
        True, True, 32, 16)
    assert [c.team for c in node.children] == ["nlp", "vision"]
    assert sum(c.nominal for c in node.children) == 24  # a pool of 8 for the two
    assert carve_problems(quota=("research", "h100", 32)) == []
    assert carve_problems(quota=("research", "h100", 23)) == [
        "The teams of research are guaranteed 24 h100, more than research's nominal 23."]


def test_the_demo_department_keeps_the_flat_shares() -> None:
    demo_seed()
    now = timezone.now()
    demo_history_seed(now=now, days=1)  # every team active (rule F2)
    standings = fairshare_standings(now=now)
    assert all(standings[t].active for t in ("vision", "nlp", "speech", "recsys"))
    shares = {t: round(s.share, 4) for t, s in standings.items()}
    # Rule F4: research's 5 of 7 split 3:2 - the flat demo's 3/7 and 2/7.
    assert shares["vision"] == round(3 / 7, 4) and shares["nlp"] == round(2 / 7, 4)
