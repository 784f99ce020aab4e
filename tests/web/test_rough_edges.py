"""Issue 17, item 3: the web's rough edges (styled error pages, standings of inactive
teams, the demo's history, GPU sizes written one way, durations, env, submit defaults,
runtimes like `2h`, tier names, token expiry, filters without navigation on change) and
the staff's cluster view with team weights on the quota board."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.test import Client

from tests.conftest import World


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
