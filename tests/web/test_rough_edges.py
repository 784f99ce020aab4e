"""Issue 17, item 3: the web's rough edges (styled error pages, standings of inactive
teams, the demo's history, GPU sizes written one way, durations, env, submit defaults,
runtimes like `2h`, tier names, token expiry, filters without navigation on change) and
the staff's cluster view with team weights on the quota board."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest
from django.test import Client

from tests.conftest import World
from tests.factories import JobFactory


def login(user: Any, **kwargs: Any) -> Client:
    c = Client(**kwargs)
    c.force_login(user)
    return c


class TestErrorPages:
    def test_the_demo_runs_without_debug_so_it_serves_the_styled_pages(self) -> None:
        demo = importlib.import_module("config.settings.demo")
        assert demo.DEBUG is False

    def test_404_is_the_styled_page_without_the_url_list(self, world: World) -> None:
        r = login(world.member).get("/no/such/page/")
        assert r.status_code == 404
        assert "404.html" in [t.name for t in r.templates]
        assert b"Page not found" in r.content
        assert b"URLconf" not in r.content and b"api/v1/" not in r.content
        assert b'name="viewport"' in r.content  # the layout, fit for a phone

    def test_403_is_the_styled_page(self, world: World) -> None:
        r = login(world.member).post("/teams/vision/members/", {"username": "bob", "role": "member"})
        assert r.status_code == 403
        assert "403.html" in [t.name for t in r.templates]
        assert b"Not allowed" in r.content

    def test_500_is_the_static_page(self, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
        def boom(**_: Any) -> Any:
            raise RuntimeError("kaboom")

        monkeypatch.setattr("queueing.web.views.dash.job_page", boom)
        r = login(world.member, raise_request_exception=False).get("/jobs/")
        assert r.status_code == 500
        assert b"Something went wrong" in r.content
        assert b"kaboom" not in r.content and b"Traceback" not in r.content


def _shares(html: str) -> dict[str, tuple[bool, float]]:
    """The standings table's share cells: team -> (active, percent)."""
    out = {}
    for team, cell in re.findall(r'data-share="([\w-]+)">(.*?)</td>', html, re.S):
        out[team] = ("would get" not in cell, float(re.search(r"([\d.]+)%", cell)[1]))
    return out


class TestStandingsInactive:
    def test_a_fresh_install_marks_every_team_inactive_with_the_share_it_would_get(
        self, world: World
    ) -> None:
        html = login(world.staff).get("/").content.decode()
        shares = _shares(html)
        assert set(shares) == {"vision", "nlp", "speech"}
        assert all(not active and pct == 100.0 for active, pct in shares.values())
        assert html.count(">inactive</span>") == 3

    def test_rule_F2_active_shares_add_to_100_and_idle_teams_say_what_they_would_get(
        self, world: World
    ) -> None:
        JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
        JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal)
        html = login(world.staff).get("/").content.decode()
        shares = _shares(html)
        assert shares["vision"] == (True, 60.0) and shares["nlp"] == (True, 40.0)
        assert shares["speech"] == (False, 16.7)  # 1 / (3 + 2 + 1): its share once active
        assert sum(p for active, p in shares.values() if active) == pytest.approx(100.0)
        assert html.count(">inactive</span>") == 1

    def test_the_team_page_says_an_idle_team_is_inactive(self, world: World) -> None:
        html = login(world.member).get("/teams/vision/").content.decode()
        assert "on becoming active (inactive now: rule F2)" in html
        JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
        html = login(world.member).get("/teams/vision/").content.decode()
        assert "inactive now" not in html and "share 100.0%" in html
