"""Rule Q8 under concurrent writes (PostgreSQL; skipped on SQLite): two quota changes
that each fit a department alone but not together. Quota and parent changes take turns
(`accounts.services.hierarchy_lock`), so the second sees the first and is refused."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from accounts.models import Team
from queueing.models import GpuType, Quota
from queueing.services import quotas as quota_services
from tests.api.test_quota_tree_api import three_level_tree
from tests.conftest import World
from tests.test_concurrency import run_in_threads

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_rule_q8_two_changes_that_fit_alone_but_not_together(
        world: World, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    three_level_tree(world, settings)  # research 64: vision 16 + lang 32, 16 to spare
    checked = quota_services.carve_problems

    def slow_check(**kwargs: Any) -> list[str]:
        out = checked(**kwargs)
        time.sleep(0.5)  # checked; not yet saved nor committed
        return out

    monkeypatch.setattr(quota_services, "carve_problems", slow_check)
    outcomes: dict[str, str] = {}

    def raise_by_ten(slug: str, delay: float) -> Callable[[], None]:
        def run() -> None:
            time.sleep(delay)
            team, h100 = Team.objects.get(slug=slug), GpuType.objects.get(slug="h100")
            nominal = Quota.objects.get(team=team, gpu_type=h100).nominal + 10
            try:
                quota_services.quota_set(actor=None, team=team, gpu_type=h100,
                                         nominal=nominal)
                outcomes[slug] = "saved"
            except ValidationError as exc:
                outcomes[slug] = exc.message_dict["nominal"][0]
        return run

    changes = [raise_by_ten("vision", 0.0), raise_by_ten("speech", 0.2)]
    run_in_threads(lambda: changes.pop(0)())
    assert outcomes == {"vision": "saved", "speech": (
        "The teams of research are guaranteed 68 h100, more than research's nominal 64.")}
    nominals = dict(Quota.objects.filter(gpu_type__slug="h100").values_list("team__slug",
                                                                            "nominal"))
    assert (nominals["vision"], nominals["speech"]) == (26, 24)
