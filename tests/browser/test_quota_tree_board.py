"""The quota tree in a real browser (docs/dashboard.md, "Quota board" and "Quota
standing"): staff see departments with their teams indented and subtotalled, a change
that would overfill a department refused in the cell with rule Q8's message, a
department's quota raised and a team moved under it from its parent menu (the board
redrawn); a team member sees their team's standing at each level up to the fleet.

The tree is tests/api/test_quota_tree_api.py's (research 64 h100 > vision 16, lang >
nlp 8, speech 24; ops 40). Screenshots in test-artifacts/screenshots/."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from accounts.models import Team
from queueing.models import Quota
from tests.api.test_quota_tree_api import three_level_tree
from tests.conftest import World

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_rule_q8_staff_edit_the_tree_on_the_quota_board(
        page: Any, world: World, settings: Any, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    three_level_tree(world, settings)
    login(page, "root")
    page.goto("/quotas/")
    rows = page.locator("table.quota-grid tbody tr[data-team]")
    expect(rows).to_have_count(6)
    order = [(r.get_attribute("data-team"), r.get_attribute("data-depth"))
             for r in rows.all()]
    assert order == [("ops", "0"), ("research", "0"), ("lang", "1"), ("nlp", "2"),
                     ("speech", "2"), ("vision", "1")]
    expect(page.get_by_label("lang parent")).to_have_value("research")
    expect(page.get_by_label("nlp parent")).to_have_value("lang")
    expect(page.get_by_label("ops parent")).to_have_value("")
    # Never itself or a team below it (rule F4): research's menu has neither lang nor nlp.
    assert page.get_by_label("research parent").locator("option").all_inner_texts() == [
        "— top level", "ops"]
    research = page.locator("#cell-research-h100")
    expect(research).to_contain_text("teams 48 of 64 · subtree holds 32")
    expect(research).to_contain_text("lent 6")
    expect(page.locator("#cell-lang-h100")).to_contain_text("teams 32 (no row: their sum)")
    expect(page.locator("#cell-nlp-h100")).to_contain_text("borrowing 12")
    expect(page.locator("#cell-speech-h100")).to_contain_text("lent 12")
    expect(page.locator("#cap-h100")).to_contain_text("104 guaranteed")  # 64 + 40, once
    shoot(page, "quota-board-tree")

    # vision 33: research's teams 33 + 32 = 65 > 64, refused in the cell.
    nominal = page.get_by_label("vision h100 nominal")
    nominal.fill("33")
    nominal.press("Enter")
    cell = page.locator("#cell-vision-h100")
    expect(cell.get_by_role("alert")).to_have_text(
        "The teams of research are guaranteed 65 h100, more than research's nominal 64.")
    expect(page.get_by_label("vision h100 nominal")).to_have_attribute("aria-invalid", "true")
    assert Quota.objects.get(team=world.vision, gpu_type=world.h100).nominal == 16
    shoot(page, "quota-board-q8-refused")

    # ops under research: 48 + 40 = 88 > 64, refused in ops's parent menu ...
    page.get_by_label("ops parent").select_option("research")
    menu = page.locator("#parent-ops")
    expect(menu.get_by_role("alert")).to_have_text(
        "The teams of research are guaranteed 88 h100, more than research's nominal 64.")
    assert Team.objects.get(slug="ops").parent is None
    shoot(page, "quota-board-parent-refused")
    # ... until research's own quota holds it: 88, then the move redraws the board.
    research_nominal = page.get_by_label("research h100 nominal")
    research_nominal.fill("88")
    research_nominal.press("Enter")
    expect(page.locator("#cell-research-h100 .saved")).to_have_text("saved")
    # A team's quota saved: the departments above it say their new subtotals at once.
    speech = page.get_by_label("speech h100 nominal")
    speech.fill("30")
    speech.press("Enter")
    expect(page.locator("#cell-speech-h100 .saved")).to_have_text("saved")
    expect(page.locator("#cell-lang-h100")).to_contain_text("teams 38 (no row: their sum)")
    expect(page.locator("#cell-research-h100")).to_contain_text("teams 54 of 88")
    speech = page.get_by_label("speech h100 nominal")
    speech.fill("24")
    speech.press("Enter")
    expect(page.locator("#cell-research-h100")).to_contain_text("teams 48 of 88")
    page.goto("/quotas/")
    page.get_by_label("ops parent").select_option("research")
    expect(page.locator("tr[data-team=ops]")).to_have_attribute("data-depth", "1")
    expect(page.locator("#cell-research-h100")).to_contain_text(
        "teams 88 of 88 · subtree holds 102")
    expect(page.locator("#quota-audit")).to_contain_text("parent: ∅ → research")
    assert Team.objects.get(slug="ops").parent == Team.objects.get(slug="research")
    shoot(page, "quota-board-team-moved")


def test_rule_q9_a_member_sees_their_standing_at_each_level(
        page: Any, world: World, settings: Any, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    three_level_tree(world, settings)
    login(page, "bob")  # nlp's team admin: nlp < lang < research < the fleet
    page.goto("/")
    h100 = page.locator("#tree-standing [data-gpu-type=h100]")
    expect(h100).to_have_text(
        "nlp: 20 of 8 h100 nominal (borrowing 12 from lang) · lang: 30 of 32 · "
        "research: 32 of 64 (lending 6) · fleet: 102 of 128 in use")
    expect(h100.locator(".level.over")).to_have_count(1)  # nlp, past its nominal
    shoot(page, "dashboard-quota-standing-nlp")
    page.context.clear_cookies()
    login(page, "dave")  # vision's member
    page.goto("/")
    expect(page.locator("#tree-standing [data-gpu-type=h100]")).to_have_text(
        "vision: 2 of 16 h100 nominal · research: 32 of 64 (lending 6) · "
        "fleet: 102 of 128 in use")
    expect(page.locator("#tree-standing [data-gpu-type=a100]")).to_have_text(
        "vision: 0 of 8 a100 nominal · research: 0 of 24 · fleet: 0 of 16 in use")
    shoot(page, "dashboard-quota-standing")
