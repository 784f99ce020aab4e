"""The web's rough edges (styled error pages, standings of inactive
teams, the demo's history, GPU sizes written one way, durations, env, submit defaults,
runtimes like `2h`, tier names, token expiry, filters without navigation on change) and
the staff's cluster view with team weights on the quota board."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest
from django.test import Client

from accounts.models import ApiToken, AuditEntry
from queueing.models import Job
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


FORM = {
    "team": "vision",
    "name": "resnet-a",
    "image": "ghcr.io/acme/train:1.4",
    "command": "python train.py",
    "args": "",
    "env": "SEED=1",
    "gpu_type": "h100",
    "gpus": "4",
    "replicas": "2",
    "tier": "normal",
    "max_runtime_seconds": "2h",
}


class TestGpusWaitingEnvTiers:
    def test_gpus_are_written_replicas_times_gpus_type_on_every_page(self, world: World) -> None:
        job = JobFactory(
            team=world.vision,
            gpu_type=world.h100,
            tier=world.normal,
            replicas=2,
            gpus_per_replica=4,
            name="big",
        )
        c = login(world.member)
        for url in ("/", "/jobs/", f"/jobs/{job.pk}/"):
            html = c.get(url).content.decode()
            assert "2 × 4 h100" in html, url
            assert "2×4" not in html, url

    def test_waiting_is_a_duration_not_a_time_ago(self, world: World) -> None:
        from datetime import timedelta

        from django.utils import timezone

        JobFactory(
            team=world.vision,
            gpu_type=world.h100,
            tier=world.normal,
            created_at=timezone.now() - timedelta(hours=2, minutes=3),
        )
        html = login(world.member).get("/").content.decode()
        assert re.search(r">2h 0[34]m</td>", html)
        assert "hours ago" not in html

    def test_the_job_page_shows_env_and_tier_names(self, world: World) -> None:
        world.normal.name = "Normal priority"
        world.normal.save()
        job = JobFactory(
            team=world.vision, gpu_type=world.h100, tier=world.normal, env={"SEED": "7", "LR": "0.1"}
        )
        html = login(world.member).get(f"/jobs/{job.pk}/").content.decode()
        env = re.search(r'id="job-env">(.*?)</dd>', html, re.S)[1]
        assert "<code>SEED=7</code>" in env and "<code>LR=0.1</code>" in env
        assert "<dt>Tier</dt><dd>Normal priority" in html
        assert "Normal priority" in login(world.member).get("/jobs/").content.decode()
        form = login(world.member).get("/jobs/new/").content.decode()
        assert '<option value="normal" selected>Normal priority</option>' in form


class TestSubmitForm:
    @pytest.mark.parametrize(
        ("text", "seconds"),
        [
            ("2h", 7200),
            ("90m", 5400),
            ("1h30m", 5400),
            ("3600", 3600),
            ("1:30:00", 5400),
            ("1d", 86400),
        ],
    )
    def test_max_runtime_takes_durations_as_people_write_them(
        self, world: World, text: str, seconds: int
    ) -> None:
        r = login(world.member).post("/jobs/new/", {**FORM, "max_runtime_seconds": text})
        assert r.status_code == 302, r.content.decode()[:2000]
        assert Job.objects.get(name="resnet-a").max_runtime_seconds == seconds

    @pytest.mark.parametrize("text", ["2 hours", "h2", "1h-30m", "0", "31d"])
    def test_a_bad_runtime_is_refused_on_its_field(self, world: World, text: str) -> None:
        r = login(world.member).post("/jobs/new/", {**FORM, "max_runtime_seconds": text})
        assert r.status_code == 400
        errors = re.search(r'id="id_max_runtime_seconds".*?</div>', r.content.decode(), re.S)
        assert errors and "errorlist" in r.content.decode()
        assert not Job.objects.filter(name="resnet-a").exists()

    def test_the_cli_reads_the_same_durations(self) -> None:
        from fairq_cli.durations import format_duration, parse_duration
        from fairq_cli.main import UsageError, duration_seconds

        assert duration_seconds("1h30m") == parse_duration("1h30m") == 5400
        assert format_duration(5400) == "1h30m" and parse_duration(format_duration(93784)) == 93784
        with pytest.raises(UsageError, match="1h30m"):
            duration_seconds("soon")

    def test_defaults_come_from_the_users_own_last_web_submission(self, world: World) -> None:
        c = login(world.member)
        assert c.post("/jobs/new/", {**FORM, "max_runtime_seconds": "90m"}).status_code == 302
        # Later jobs of the team by someone else (a pipeline) and by the user through the
        # API do not change what the form offers.
        JobFactory(
            team=world.vision,
            gpu_type=world.a100,
            tier=world.high,
            submitter=world.admin,
            image="ghcr.io/acme/pipeline:9",
        )
        JobFactory(
            team=world.vision,
            gpu_type=world.a100,
            tier=world.low,
            submitter=world.member,
            image="ghcr.io/acme/api:3",
        )
        html = c.get("/jobs/new/").content.decode()
        assert 'value="ghcr.io/acme/train:1.4"' in html
        assert '<option value="h100" selected>' in html and 'value="1h30m"' in html
        # Another browser session of the user: their own last job, not the pipeline's.
        html = login(world.member).get("/jobs/new/").content.decode()
        assert 'value="ghcr.io/acme/api:3"' in html and "pipeline:9" not in html


class TestTokensAndFilters:
    def test_the_token_form_defaults_to_an_expiry(self, world: World, settings: Any) -> None:
        html = login(world.member).get("/teams/vision/").content.decode()
        assert re.search(r'name="expires_in_days" value="90"', html)
        settings.FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS = 30
        html = login(world.member).get("/teams/vision/").content.decode()
        assert re.search(r'name="expires_in_days" value="30"', html)

    def test_the_api_gives_a_token_without_a_lifetime_the_default_expiry(self, world: World) -> None:
        from django.utils import timezone

        api = world.client(world.member)
        r = api.post("/api/v1/tokens/", {"name": "ci"}, format="json")
        assert r.status_code == 201
        token = ApiToken.objects.get(pk=r.json()["id"])
        days = (token.expires_at - timezone.now()).total_seconds() / 86400
        assert 89.9 < days <= 90
        r = api.post("/api/v1/tokens/", {"name": "forever", "expires_in_days": None}, format="json")
        assert r.status_code == 201
        assert ApiToken.objects.get(pk=r.json()["id"]).expires_at is None

    def test_no_select_navigates_on_change_wcag_3_2_2(self, world: World) -> None:
        from tests.factories import MembershipFactory

        MembershipFactory(user=world.member, team=world.nlp)
        c = login(world.member)
        for url in ("/", "/jobs/", "/reports/"):
            html = c.get(url).content.decode()
            assert "onchange" not in html, url
            for form in re.findall(r"<form[^>]*>.*?</form>", html, re.S):
                if "<select" in form:
                    assert 'type="submit"' in form, (url, form[:200])


HX = {"HTTP_HX_REQUEST": "true"}


class TestQuotaBoard:
    def test_the_cluster_row_updates_after_a_save(self, world: World) -> None:
        c = login(world.staff)
        page = c.get("/quotas/").content.decode()
        assert re.search(r'id="cap-h100">.*?24 guaranteed', page, re.S)  # 3 teams × 8
        r = c.post(
            "/quotas/vision/h100/", {"nominal": "20", "borrowing_limit": "", "lending_limit": ""}, **HX
        )
        assert r.status_code == 200
        html = r.content.decode()
        footer = re.search(r'<div id="cap-h100" hx-swap-oob="true">(.*?)</div>', html, re.S)
        assert footer and "36 guaranteed" in footer[1]

    def test_staff_edit_a_teams_weight_in_place_audited(self, world: World) -> None:
        c = login(world.staff)
        page = c.get("/quotas/").content.decode()
        assert 'aria-label="vision fair-share weight"' in page
        r = c.post("/weights/vision/", {"weight": "5"}, **HX)
        assert r.status_code == 200
        world.vision.refresh_from_db()
        assert world.vision.weight == 5.0
        html = r.content.decode()
        assert "saved" in html and 'id="quota-audit" hx-swap-oob="true"' in html
        entry = AuditEntry.objects.get(object_type="accounts.Team", action="update")
        assert entry.actor == world.staff and entry.changes["weight"] == [3.0, 5.0]
        assert "weight: 3.0 → 5.0" in html  # in the board's list of changes
        # The standings use it at once (rule F2: 5 / (5 + 2) with vision and nlp active).
        JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
        JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal)
        assert _shares(c.get("/").content.decode())["vision"] == (True, 71.4)

    @pytest.mark.parametrize("value", ["0", "-1", "abc", ""])
    def test_a_bad_weight_is_refused_and_nothing_changes(self, world: World, value: str) -> None:
        r = login(world.staff).post("/weights/vision/", {"weight": value}, **HX)
        assert r.status_code == 200  # htmx swaps 2xx only: the error is in the cell
        assert 'aria-invalid="true"' in r.content.decode()
        world.vision.refresh_from_db()
        assert world.vision.weight == 3.0
        assert not AuditEntry.objects.filter(object_type="accounts.Team").exists()

    def test_only_staff_may_change_a_weight(self, world: World) -> None:
        for user in (world.admin, world.member):
            assert login(user).post("/weights/vision/", {"weight": "9"}).status_code == 404
        world.vision.refresh_from_db()
        assert world.vision.weight == 3.0

    def test_without_javascript_the_weight_form_posts_and_redirects(self, world: World) -> None:
        r = login(world.staff).post("/weights/nlp/", {"weight": "4"})
        assert r.status_code == 302 and r.url == "/quotas/"
        world.nlp.refresh_from_db()
        assert world.nlp.weight == 4.0


class TestDemoHistory:
    def test_the_demo_seeds_a_few_days_of_usage_and_snapshots_once(self, db: None) -> None:
        import json
        from datetime import timedelta

        from django.contrib.auth import get_user_model
        from django.utils import timezone

        from queueing.models import FairShareSnapshot, UsageRecord
        from queueing.services.demo import DEPARTMENTS, demo_history_seed, demo_seed

        demo_seed()
        now = timezone.now()
        n = demo_history_seed(now=now).jobs
        assert n > 20 and UsageRecord.objects.count() == n
        assert UsageRecord.objects.order_by("start").first().start < now - timedelta(days=3)
        snaps = FairShareSnapshot.objects.order_by("at")
        assert snaps.count() >= 40  # 4 days, one every 2 hours
        first, last = snaps.first().standings, snaps.last().standings
        assert last["vision"][0] > first["vision"][0] > 0  # decayed GPU-hours grew
        assert demo_history_seed(now=now).jobs == 0  # a second seed adds nothing
        assert UsageRecord.objects.count() == n
        # The dashboard's chart has the days at once, every team above 0 by the end.
        admin = get_user_model().objects.get(username="admin")
        html = login(admin).get("/").content.decode()
        history = json.loads(re.search(r'id="usage-history"[^>]*>(.*?)</script>', html, re.S)[1])
        assert len(history["t"]) > 40 and history["t"][0] < now.timestamp() - 3 * 86400
        assert all(v[-1] and v[-1] > 0 for v in history["series"].values())
        shares = _shares(html)
        assert all(active for active, _ in shares.values())
        # The teams add up to 100%; a department's share is its teams' together (rule F4).
        departments = {slug: teams for slug, *_, teams in DEPARTMENTS}
        assert sum(p for t, (_, p) in shares.items() if t not in departments) == \
            pytest.approx(100.0, abs=0.2)
        for dept, teams in departments.items():
            assert shares[dept][1] == pytest.approx(sum(shares[t][1] for t in teams), abs=0.2)


class TestClusterView:
    def test_only_staff_see_it(self, world: World) -> None:
        for user in (world.admin, world.member, world.outsider):
            assert login(user).get("/cluster/").status_code == 404
            assert 'href="/cluster/"' not in login(user).get("/").content.decode()
        assert 'href="/cluster/"' in login(world.staff).get("/").content.decode()

    def test_every_teams_queue_running_jobs_and_usage_on_one_page(self, world: World) -> None:
        from django.utils import timezone

        from queueing.policy.states import JobState

        JobFactory(
            team=world.vision,
            gpu_type=world.h100,
            tier=world.normal,
            name="vision-wait",
            replicas=2,
            gpus_per_replica=4,
        )
        JobFactory(team=world.nlp, gpu_type=world.a100, tier=world.high, name="nlp-wait")
        JobFactory(
            team=world.speech,
            gpu_type=world.a100,
            tier=world.normal,
            name="speech-run",
            status=JobState.RUNNING,
            gpus_per_replica=2,
            started_at=timezone.now(),
            admitted_at=timezone.now(),
        )
        c = login(world.staff)
        html = c.get("/cluster/").content.decode()
        queue = re.search(r'id="cqueue-h".*?</section>', html, re.S)[0]
        assert "vision-wait" in queue and "nlp-wait" in queue and "2 waiting" in queue
        assert "2 × 4 h100" in queue
        running = re.search(r'id="crun-h".*?</section>', html, re.S)[0]
        assert "speech-run" in running and "1 × 2 a100" in running and "speech" in running
        teams = re.search(r'id="teams-h".*?</section>', html, re.S)[0]
        rows = {
            m[0]: m[1]
            for m in re.findall(r'<tr><td><a href="/teams/([\w-]+)/">.*?</td>(.*?)</tr>', teams, re.S)
        }
        assert set(rows) == {"vision", "nlp", "speech"}
        cells = {t: re.findall(r'<td class="num"[^>]*>(.*?)</td>', r, re.S) for t, r in rows.items()}
        # weight, share, queued, running, GPU-h, factor
        assert cells["vision"][2:4] == ["1", "0"] and cells["speech"][2:4] == ["0", "1"]
        assert "2 a100" in rows["speech"] and "8 h100" in rows["vision"]
        shares = _shares(teams)
        assert sum(p for _, p in shares.values()) == pytest.approx(100.0, abs=0.2)
        # The live refresh answers the fragment.
        frag = c.get("/cluster/", HTTP_HX_REQUEST="true").content.decode()
        assert "<html" not in frag and "vision-wait" in frag

    def test_its_queries_do_not_grow_with_the_jobs(
        self, world: World, django_assert_max_num_queries: Any
    ) -> None:
        for i in range(30):
            JobFactory(
                team=[world.vision, world.nlp, world.speech][i % 3], gpu_type=world.h100, tier=world.normal
            )
        c = login(world.staff)
        c.get("/cluster/")  # the plan and the caches warm
        # 27: one of them reads the booked windows of the capacity card (one query
        # whatever the jobs; docs/reservations.md), one the queued GPUs per set of
        # accepted types (docs/api.md, "Several GPU types").
        with django_assert_max_num_queries(27):
            assert c.get("/cluster/").status_code == 200
