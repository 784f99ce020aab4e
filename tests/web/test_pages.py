"""The web pages with the Django test client: tenancy (404 across teams), the submit
form (the API's validation, inline), job actions, the team page and the quota board."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import ApiToken, AuditEntry, Membership, Role
from queueing.models import Job, Quota
from queueing.policy.states import JobState
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World
from tests.factories import JobFactory, MembershipFactory


def login(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def form_body(**overrides: Any) -> dict[str, Any]:
    body = {"team": "vision", "name": "resnet-sweep-3", "image": "ghcr.io/acme/train:1.4",
            "command": "python train.py", "args": "--epochs 10", "env": "SEED=1\nLR=0.1",
            "gpu_type": "h100", "gpus": "2", "replicas": "1", "tier": "normal",
            "max_runtime_seconds": "3600"}
    body.update(overrides)
    return body


@pytest.fixture
def vision_job(world: World) -> Job:
    return JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                      submitter=world.member, name="vision-train")


class TestAccess:
    def test_anonymous_gets_the_landing_page_and_login_redirects(self, world: World) -> None:
        c = Client()
        r = c.get("/")
        assert r.status_code == 200
        assert b"Log in" in r.content
        assert c.get("/jobs/").status_code == 302
        assert c.get("/jobs/new/").url.startswith("/accounts/login/")

    def test_login_page_and_logout(self, world: World) -> None:
        c = Client()
        r = c.post("/accounts/login/", {"username": "dave", "password": "pw"})
        assert r.status_code == 302
        assert c.get("/").status_code == 200
        r = c.post("/accounts/logout/")
        assert r.status_code == 302
        assert b"Log in" in c.get("/").content

    def test_healthz_still_answers(self, world: World) -> None:
        assert Client().get("/healthz").json() == {"status": "ok"}

    def test_dashboard_shows_queue_running_capacity_and_standings(self, world: World) -> None:
        JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal, name="q-one",
                   gpus_per_replica=8, replicas=4)
        r = login(world.member).get("/")
        html = r.content.decode()
        assert r.status_code == 200
        assert "q-one" in html
        assert "Cluster capacity" in html and "h100" in html
        assert "Fair-share standings" in html and "vision" in html
        assert 'id="usage-history"' in html

    def test_dashboard_htmx_request_gets_only_the_live_fragment(self, world: World) -> None:
        r = login(world.member).get("/", HTTP_HX_REQUEST="true")
        assert r.status_code == 200
        assert b"<html" not in r.content
        assert b"Fair-share standings" in r.content

    def test_outsider_gets_404_for_another_teams_job(self, world: World, vision_job: Job) -> None:
        c = login(world.outsider)
        for url in (f"/jobs/{vision_job.pk}/",):
            r = c.get(url)
            assert r.status_code == 404
            assert b"Page not found" in r.content
        assert c.post(f"/jobs/{vision_job.pk}/cancel/").status_code == 404
        assert c.post(f"/jobs/{vision_job.pk}/resubmit/").status_code == 404
        assert c.get(f"/jobs/new/?from={vision_job.pk}").content.count(b"vision-train") == 0
        vision_job.refresh_from_db()
        assert vision_job.status == JobState.QUEUED

    def test_outsider_job_list_and_dashboard_do_not_show_other_teams_jobs(
            self, world: World, vision_job: Job) -> None:
        c = login(world.outsider)
        assert b"vision-train" not in c.get("/jobs/").content
        assert b"vision-train" not in c.get("/").content

    def test_outsider_cannot_open_another_teams_page(self, world: World) -> None:
        assert login(world.outsider).get("/teams/vision/").status_code == 404
        assert login(world.outsider).get("/teams/no-such-team/").status_code == 404

    def test_team_switcher_changes_the_current_team(self, world: World) -> None:
        MembershipFactory(user=world.member, team=world.nlp, role=Role.MEMBER)
        JobFactory(team=world.nlp, gpu_type=world.a100, tier=world.normal, name="nlp-job")
        c = login(world.member)
        assert b"nlp-job" in c.get("/jobs/").content  # the first team by name
        r = c.post("/team/switch/", {"team": "vision", "next": "/jobs/"})
        assert r.status_code == 302 and r.url == "/jobs/"
        assert b"nlp-job" not in c.get("/jobs/").content
        assert c.post("/team/switch/", {"team": "speech"}).status_code == 404

    def test_switch_rejects_offsite_next(self, world: World) -> None:
        r = login(world.member).post("/team/switch/", {"team": "vision", "next": "//evil.example"})
        assert r.url == "/"


class TestSubmit:
    def test_form_has_defaults_from_the_users_own_last_job(self, world: World) -> None:
        JobFactory(team=world.vision, gpu_type=world.a100, tier=world.high,
                   image="ghcr.io/acme/last:2", gpus_per_replica=4, submitter=world.member)
        html = login(world.member).get("/jobs/new/").content.decode()
        assert 'value="ghcr.io/acme/last:2"' in html
        assert 'value="python train.py"' in html  # the last job's command
        assert '<option value="a100" selected>' in html
        assert '<option value="high" selected>' in html

    def test_a_valid_form_queues_the_job_through_the_service(self, world: World) -> None:
        r = login(world.member).post("/jobs/new/", form_body(idempotency_key="k1"))
        assert r.status_code == 302
        job = Job.objects.get(name="resnet-sweep-3")
        assert r.url == f"/jobs/{job.pk}/"
        assert job.command == ["python", "train.py"] and job.args == ["--epochs", "10"]
        assert job.env == {"SEED": "1", "LR": "0.1"} and job.submitter == world.member
        assert job.events.get().reason == "submitted"
        # The same idempotency key (a double click) does not queue a second job.
        login(world.member).post("/jobs/new/", form_body(idempotency_key="k1"))
        assert Job.objects.filter(name="resnet-sweep-3").count() == 1

    @pytest.mark.parametrize(("field", "value", "message"), [
        ("name", "Bad_Name", "lower-case letters"),
        ("image", "not an image", "container image"),
        ("gpus", "9", "No h100 node holds 9 GPUs"),
        ("env", "FAIRQ_X=1", "reserved"),
        ("env", "no-equals-sign", "NAME=value"),
        ("team", "nlp", "Select a valid choice"),
        ("gpus", "0", "Ask at least one GPU, or a fraction of one above 0"),
    ])
    def test_invalid_fields_are_reported_inline(self, world: World, field: str, value: str,
                                                message: str) -> None:
        r = login(world.member).post("/jobs/new/check/", form_body(**{field: value}))
        html = r.content.decode()
        assert r.status_code == 200
        assert message in html, html
        assert 'aria-invalid="true"' in html or field == "team"
        assert not Job.objects.exists()

    def test_the_inline_check_leaves_untouched_empty_fields_alone(self, world: World) -> None:
        r = login(world.member).post("/jobs/new/check/", form_body(image="", name="Bad_Name"))
        html = r.content.decode()
        assert "lower-case letters" in html
        assert "This field is required" not in html
        assert login(world.member).post("/jobs/new/", form_body(image="")).status_code == 400

    def test_a_posted_invalid_form_is_400_with_errors(self, world: World) -> None:
        r = login(world.member).post("/jobs/new/", form_body(name="Bad_Name"))
        assert r.status_code == 400
        assert b"lower-case letters" in r.content
        assert not Job.objects.exists()

    def test_check_previews_where_the_job_would_stand(self, world: World) -> None:
        r = login(world.member).post("/jobs/new/check/", form_body())
        assert b"If submitted now" in r.content
        assert b"the next scheduling cycle admits it" in r.content
        # Fill the h100s: a new job now waits behind the queue.
        for i in range(3):
            JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal,
                       gpus_per_replica=8, name=f"big-{i}")
        scheduler_cycle()
        JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal,
                   gpus_per_replica=8, name="waiting")
        r = login(world.member).post("/jobs/new/check/", form_body(gpus="8"))
        # vision is under its nominal h100 quota, nlp borrows: vision would go first and
        # reclaim its GPUs (rules R1-R2), and the preview says so.
        html = r.content.decode()
        assert "position 1 of 3 in the queue" in html, html
        assert "preempting 1 job(s)" in html

    def test_edit_and_resubmit_prefills_from_a_visible_job(self, world: World,
                                                           vision_job: Job) -> None:
        html = login(world.member).get(f"/jobs/new/?from={vision_job.pk}").content.decode()
        assert 'value="vision-train"' in html


class TestJobDetail:
    def test_detail_shows_timeline_priority_and_permalink(self, world: World) -> None:
        c = login(world.member)
        c.post("/jobs/new/", form_body())
        job = Job.objects.get()
        html = c.get(f"/jobs/{job.pk}/").content.decode()
        assert "Timeline" in html and "submitted" in html
        assert "Fair share (team vision)" in html and "Total" in html
        assert f"http://testserver/jobs/{job.pk}/" in html
        assert "Position" in html

    def test_preemption_event_names_the_preemptor_and_rule(self, world: World,
                                                           vision_job: Job) -> None:
        now = timezone.now()
        vision_job.events.create(
            at=now, kind="transition", from_status="RUNNING", to_status="PREEMPTED",
            actor_label="scheduler", reason="preempted by job #99 of team nlp (tier high) under rule R2",
            data={"rule": "R2", "preemptor": 99, "preemptor_team": "nlp", "preemptor_tier": "high"})
        html = login(world.member).get(f"/jobs/{vision_job.pk}/").content.decode()
        assert "preempted by job #99 of team nlp (tier high)" in html
        assert "rule R2" in html

    def test_dashboard_lists_recent_preemptions_with_the_preemptor(self, world: World,
                                                                   vision_job: Job) -> None:
        vision_job.events.create(
            at=timezone.now(), kind="preempted", actor_label="scheduler", reason="preempted",
            data={"rule": "R2-reclaim", "preemptor": 99, "preemptor_team": "nlp",
                  "preemptor_tier": "high"})
        html = login(world.member).get("/").content.decode()
        assert "Preempted in the last 24 h" in html
        assert "by job #99 of team nlp (high), rule R2-reclaim" in html

    def test_cancel_and_resubmit(self, world: World, vision_job: Job) -> None:
        c = login(world.member)
        r = c.post(f"/jobs/{vision_job.pk}/cancel/")
        assert r.status_code == 302
        vision_job.refresh_from_db()
        assert vision_job.status == JobState.CANCELLED
        assert b"cancelled" in c.get(r.url).content
        # A second cancel is refused with a message, not a crash.
        r = c.post(f"/jobs/{vision_job.pk}/cancel/", follow=True)
        assert b"cannot be cancelled" in r.content
        r = c.post(f"/jobs/{vision_job.pk}/resubmit/")
        new = Job.objects.exclude(pk=vision_job.pk).get()
        assert r.url == f"/jobs/{new.pk}/"
        assert new.name == vision_job.name and new.status == JobState.QUEUED

    def test_resubmit_applies_todays_rules_to_the_copy(self, world: World, vision_job: Job,
                                                       settings: Any) -> None:
        """A registry banned since the job ran is banned for its copy too."""
        settings.FAIRQ_REGISTRY_ALLOWLIST = ["registry.internal"]
        r = login(world.member).post(f"/jobs/{vision_job.pk}/resubmit/", follow=True)
        assert Job.objects.count() == 1
        assert b"cannot be resubmitted" in r.content and b"image" in r.content

    def test_polling_stops_once_the_job_is_final(self, world: World, vision_job: Job) -> None:
        c = login(world.member)
        assert c.get(f"/jobs/{vision_job.pk}/", HTTP_HX_REQUEST="true").status_code == 200
        c.post(f"/jobs/{vision_job.pk}/cancel/")
        r = c.get(f"/jobs/{vision_job.pk}/", HTTP_HX_REQUEST="true")
        assert r.status_code == 286 and b"CANCELLED" in r.content

    def test_running_job_shows_logs_and_node(self, world: World) -> None:
        c = login(world.member)
        c.post("/jobs/new/", form_body())
        job = Job.objects.get()
        scheduler_cycle()
        scheduler_cycle(now=timezone.now() + timedelta(seconds=2))
        job.refresh_from_db()
        assert job.status == JobState.RUNNING
        html = c.get(f"/jobs/{job.pk}/").content.decode()
        assert "running on" in html
        assert c.get("/").content.decode().count(f"#{job.pk} resnet-sweep-3") == 1


class TestJobList:
    def test_pages_with_a_keyset_and_filters_by_status(self, world: World) -> None:
        for i in range(60):
            JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal, name=f"j-{i}",
                       status=JobState.SUCCEEDED if i % 2 else JobState.QUEUED)
        c = login(world.member)
        html = c.get("/jobs/").content.decode()
        assert "j-59" in html and "j-9<" not in html and "Older" in html
        oldest_shown = Job.objects.order_by("-id")[49].pk
        html = c.get(f"/jobs/?before={oldest_shown}").content.decode()
        assert "j-9<" in html and "Older" not in html
        html = c.get("/jobs/?status=SUCCEEDED").content.decode()
        assert "j-59" in html and "j-58" not in html

    def test_empty_state(self, world: World) -> None:
        assert b"No jobs yet" in login(world.member).get("/jobs/").content


class TestTeamPage:
    def test_member_sees_members_quotas_but_cannot_manage(self, world: World) -> None:
        c = login(world.member)
        html = c.get("/teams/vision/").content.decode()
        assert "alice" in html and "Team admins manage members" in html
        assert "Nominal" in html and "unlimited" in html
        r = c.post("/teams/vision/members/", {"username": "bob", "role": "member"})
        assert r.status_code == 403
        m = Membership.objects.get(user=world.admin, team=world.vision)
        assert c.post(f"/teams/vision/members/{m.pk}/", {"action": "remove"}).status_code == 403

    def test_team_admin_adds_changes_and_removes_members_audited(self, world: World) -> None:
        c = login(world.admin)
        r = c.post("/teams/vision/members/", {"username": "bob", "role": "member"})
        assert r.status_code == 302
        m = Membership.objects.get(user=world.outsider, team=world.vision)
        c.post(f"/teams/vision/members/{m.pk}/", {"action": "role", "role": "team-admin"})
        m.refresh_from_db()
        assert m.role == Role.TEAM_ADMIN
        c.post(f"/teams/vision/members/{m.pk}/", {"action": "remove"})
        assert not Membership.objects.filter(pk=m.pk).exists()
        assert AuditEntry.objects.filter(object_type="accounts.Membership").count() == 3
        r = c.post("/teams/vision/members/", {"username": "nobody", "role": "member"})
        assert r.status_code == 400 and b"No active user with this name" in r.content

    def test_team_admin_cannot_manage_another_teams_members(self, world: World) -> None:
        m = Membership.objects.get(user=world.outsider, team=world.nlp)
        c = login(world.admin)
        assert c.post(f"/teams/nlp/members/{m.pk}/", {"action": "remove"}).status_code == 404
        assert c.post(f"/teams/vision/members/{m.pk}/", {"action": "remove"}).status_code == 404
        assert Membership.objects.filter(pk=m.pk).exists()

    def test_token_is_shown_once_and_can_be_revoked(self, world: World) -> None:
        c = login(world.member)
        r = c.post("/teams/vision/tokens/", {"name": "ci", "idempotency_key": "form-1"})
        assert r.status_code == 200  # the secret is in this answer, and nowhere else
        html = r.content.decode()
        token = ApiToken.objects.get(user=world.member, name="ci")
        assert f"fq_{token.prefix}_" in html and "shown only once" in html
        assert f"fq_{token.prefix}_" not in c.get("/teams/vision/").content.decode()
        # A reload re-posts the form: the token exists, no second one, no secret.
        again = c.post("/teams/vision/tokens/", {"name": "ci", "idempotency_key": "form-1"})
        assert again.status_code == 200
        assert f"fq_{token.prefix}_" not in again.content.decode()
        assert "shown once" in again.content.decode()
        assert ApiToken.objects.filter(user=world.member, name="ci").count() == 1
        c.post(f"/teams/vision/tokens/{token.pk}/revoke/")
        token.refresh_from_db()
        assert token.revoked_at is not None
        c.post("/teams/vision/tokens/", {"name": "short", "expires_in_days": "7"})
        short = ApiToken.objects.get(user=world.member, name="short")
        assert short.expires_at is not None
        assert 6 < (short.expires_at - timezone.now()).days + 1 <= 7
        other = ApiToken.objects.create(user=world.admin, name="x", prefix="abcd1234", key_hash="0")
        assert c.post(f"/teams/vision/tokens/{other.pk}/revoke/").status_code == 404


class TestQuotaBoard:
    def test_only_platform_admins_see_it(self, world: World) -> None:
        assert login(world.admin).get("/quotas/").status_code == 404
        assert login(world.admin).post("/quotas/vision/h100/", {"nominal": 1}).status_code == 404
        r = login(world.staff).get("/quotas/")
        assert r.status_code == 200
        assert b"vision h100 nominal" in r.content

    def test_edit_in_place_saves_and_audits_old_to_new(self, world: World) -> None:
        c = login(world.staff)
        r = c.post("/quotas/vision/h100/", {"nominal": "4", "borrowing_limit": "",
                                            "lending_limit": "2"}, HTTP_HX_REQUEST="true")
        html = r.content.decode()
        assert r.status_code == 200 and "saved" in html
        q = Quota.objects.get(team=world.vision, gpu_type=world.h100)
        assert (q.nominal, q.borrowing_limit, q.lending_limit) == (4, None, 2)
        entry = AuditEntry.objects.get(object_type="queueing.Quota")
        assert entry.actor == world.staff
        assert entry.changes["nominal"] == [8, 4]
        assert entry.changes["borrowing_limit"] == [8, None]
        assert 'id="quota-audit" hx-swap-oob="true"' in html and "nominal: 8 → 4" in html

    def test_invalid_values_are_refused_in_the_cell(self, world: World) -> None:
        c = login(world.staff)
        r = c.post("/quotas/vision/h100/", {"nominal": "2", "lending_limit": "5"},
                   HTTP_HX_REQUEST="true")
        assert "Cannot lend more than the nominal 2" in r.content.decode()
        r = c.post("/quotas/vision/h100/", {"nominal": "-1"}, HTTP_HX_REQUEST="true")
        assert "greater than or equal to 0" in r.content.decode()
        assert Quota.objects.get(team=world.vision, gpu_type=world.h100).nominal == 8
        assert not AuditEntry.objects.filter(object_type="queueing.Quota").exists()

    def test_warns_when_guaranteed_quotas_exceed_capacity(self, world: World) -> None:
        c = login(world.staff)
        # 3 teams x 8 h100 nominal = 24 > 16 h100s in the test cluster.
        html = c.get("/quotas/").content.decode()
        assert "Guaranteed h100 quotas (24 GPUs) exceed the cluster&#x27;s 16 h100 GPUs" in html
        r = c.post("/quotas/nlp/h100/", {"nominal": "0"}, HTTP_HX_REQUEST="true")
        r = c.post("/quotas/speech/h100/", {"nominal": "0"}, HTTP_HX_REQUEST="true")
        assert "Guaranteed h100" not in r.content.decode()

    def test_creates_a_missing_quota(self, world: World) -> None:
        r = login(world.staff).post("/quotas/vision/mig-1g-10gb/", {"nominal": "3"})
        assert r.status_code == 302
        assert Quota.objects.get(team=world.vision, gpu_type=world.mig).nominal == 3


def test_404_page_has_the_layout(world: World) -> None:
    r = login(world.member).get("/no/such/page/")
    assert r.status_code == 404
    assert b"Page not found" in r.content and b"fairq" in r.content
