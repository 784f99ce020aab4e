"""Who may cancel a job (docs/api.md, "Who may cancel"; Slurm's scancel: the owner and
operators): its submitter, a team admin of its team and staff; every member of the team
when the team's `any_member_may_cancel` is on (team admins and staff set it: the API, the
team page, the Django admin). Applied on every cancel path - the API's single cancel,
the array cancel, the web page's button - as a 403 with a clear message (another team's
job stays a 404: its existence is no business of the caller); every cancel is an event."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils.html import escape

from accounts.models import AuditEntry, Membership, Role
from queueing.models import Job, JobArray, JobEvent
from tests.conftest import World, job_body
from tests.factories import UserFactory
from tests.web.test_pages import login

pytestmark = pytest.mark.django_db

REFUSED = ("Only its submitter, a team admin of vision or staff may cancel this job (a team "
           "admin may let every member of vision cancel the team's jobs: the team's "
           "any_member_may_cancel).")

# (who, setting off, setting on): the HTTP status of the API's cancel.
TABLE = [
    ("submitter", 200, 200),
    ("other_member", 403, 200),
    ("team_admin", 200, 200),
    ("staff", 200, 200),
    ("outsider", 404, 404),  # a team admin of another team: not even shown the job
]


def _actor(world: World, who: str) -> Any:
    if who == "other_member":
        user = UserFactory(username="erin")
        Membership.objects.create(user=user, team=world.vision, role=Role.MEMBER)
        return user
    return {"submitter": world.member, "team_admin": world.admin, "staff": world.staff,
            "outsider": world.outsider}[who]


def _setting(world: World, on: bool) -> None:
    world.vision.any_member_may_cancel = on
    world.vision.save(update_fields=["any_member_may_cancel"])


def _submitted(world: World) -> int:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def _cancel_events(job_id: int) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job_id=job_id, kind=JobEvent.Kind.TRANSITION,
                                        to_status="CANCELLED"))


@pytest.mark.parametrize("on", [False, True], ids=["setting-off", "setting-on"])
@pytest.mark.parametrize(("who", "off_status", "on_status"), TABLE)
def test_who_may_cancel_a_job_through_the_api(world: World, who: str, off_status: int,
                                              on_status: int, on: bool) -> None:
    _setting(world, on)
    job_id = _submitted(world)
    actor = _actor(world, who)
    r = world.client(actor).post(f"/api/v1/jobs/{job_id}/cancel/")
    expected = on_status if on else off_status
    assert r.status_code == expected, r.json()
    events = _cancel_events(job_id)
    if expected == 200:
        assert Job.objects.get(pk=job_id).status == "CANCELLED"
        assert len(events) == 1 and events[0].actor == actor
    else:
        assert Job.objects.get(pk=job_id).status == "QUEUED" and events == []
    if expected == 403:
        assert r.json()["error"] == {"status": 403, "code": "permission_denied",
                                     "message": REFUSED}


@pytest.mark.parametrize("on", [False, True], ids=["setting-off", "setting-on"])
@pytest.mark.parametrize(("who", "off_status", "on_status"), TABLE)
def test_who_may_cancel_an_array(world: World, who: str, off_status: int, on_status: int,
                                 on: bool) -> None:
    _setting(world, on)
    r = world.client(world.member).post("/api/v1/jobs/bulk/", {**job_body(), "count": 3},
                                        format="json")
    assert r.status_code == 201, r.json()
    array_id, ids = r.json()["array_id"], r.json()["ids"]
    r = world.client(_actor(world, who)).delete(f"/api/v1/arrays/{array_id}/")
    expected = on_status if on else off_status
    assert r.status_code == expected, r.json()
    cancelled = set(Job.objects.filter(pk__in=ids).values_list("status", flat=True))
    if expected == 200:
        assert cancelled == {"CANCELLED"} and all(len(_cancel_events(i)) == 1 for i in ids)
    else:
        assert cancelled == {"QUEUED"} and JobArray.objects.filter(pk=array_id).exists()
        assert all(_cancel_events(i) == [] for i in ids)
    if expected == 403:
        assert r.json()["error"]["message"] == REFUSED


@pytest.mark.parametrize("on", [False, True], ids=["setting-off", "setting-on"])
@pytest.mark.parametrize(("who", "off_status", "on_status"), TABLE)
def test_the_web_cancel_button_shows_only_to_who_may_cancel(
        world: World, who: str, off_status: int, on_status: int, on: bool) -> None:
    _setting(world, on)
    job_id = _submitted(world)
    client = login(_actor(world, who))
    expected = on_status if on else off_status
    page = client.get(f"/jobs/{job_id}/")
    if expected == 404:
        assert page.status_code == 404
    else:
        assert page.status_code == 200
        assert ("Cancel job</button>" in page.content.decode()) is (expected == 200)
    r = client.post(f"/jobs/{job_id}/cancel/")
    assert r.status_code == {200: 302, 403: 403, 404: 404}[expected]
    assert Job.objects.get(pk=job_id).status == ("CANCELLED" if expected == 200 else "QUEUED")
    assert len(_cancel_events(job_id)) == (1 if expected == 200 else 0)
    if expected == 403:
        assert escape(REFUSED) in r.content.decode()


@pytest.mark.parametrize(("who", "status"), [
    ("team_admin", 200), ("staff", 200), ("submitter", 403), ("outsider", 404)])
def test_team_admins_and_staff_set_who_may_cancel_in_the_api_audited(
        world: World, who: str, status: int) -> None:
    client = world.client(_actor(world, who))
    r = client.patch("/api/v1/teams/vision/", {"any_member_may_cancel": True}, format="json")
    assert r.status_code == status, r.json()
    world.vision.refresh_from_db()
    assert world.vision.any_member_may_cancel is (status == 200)
    if status == 200:
        assert r.json()["any_member_may_cancel"] is True
        assert AuditEntry.objects.filter(action="update", object_type__icontains="team",
                                         changes__has_key="any_member_may_cancel").exists()


def test_a_team_admin_may_not_change_a_staff_field_with_it(world: World) -> None:
    r = world.client(world.admin).patch("/api/v1/teams/vision/",
                                        {"any_member_may_cancel": True, "weight": 9},
                                        format="json")
    assert r.status_code == 403
    world.vision.refresh_from_db()
    assert world.vision.any_member_may_cancel is False and world.vision.weight == 3.0


def test_members_see_the_setting_and_it_is_off_by_default(world: World) -> None:
    r = world.client(world.member).get("/api/v1/teams/vision/")
    assert r.json()["any_member_may_cancel"] is False


def test_the_team_page_sets_who_may_cancel(world: World) -> None:
    page = login(world.member).get("/teams/vision/").content.decode()
    assert "A job's submitter, the team admins and staff." in page
    assert 'name="any_member_may_cancel"' not in page  # a member sees, does not set
    assert login(world.member).post("/teams/vision/cancel-rule/",
                                    {"any_member_may_cancel": "on"}).status_code == 403
    admin = login(world.admin)
    assert 'name="any_member_may_cancel"' in admin.get("/teams/vision/").content.decode()
    assert admin.post("/teams/vision/cancel-rule/",
                      {"any_member_may_cancel": "on"}).status_code == 302
    world.vision.refresh_from_db()
    assert world.vision.any_member_may_cancel is True
    assert "Every member of vision." in login(world.member).get("/teams/vision/").content.decode()
    admin.post("/teams/vision/cancel-rule/", {})
    world.vision.refresh_from_db()
    assert world.vision.any_member_may_cancel is False


def test_the_django_admin_edits_the_setting(world: World) -> None:
    page = login(world.staff.__class__.objects.create_superuser(
        "su", "su@example.com", "pw")).get(f"/admin/accounts/team/{world.vision.pk}/change/")
    assert page.status_code == 200
    assert 'name="any_member_may_cancel"' in page.content.decode()
