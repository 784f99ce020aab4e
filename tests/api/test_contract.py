"""Cross-cutting API behaviour: Idempotency-Key on every POST, per-user throttling,
ETags for polling, the one error shape, bulk array jobs."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from accounts.models import IdempotencyRecord, Membership, Team
from accounts.services import KEY_SHOWN_ONCE
from queueing.models import Job, JobEvent
from queueing.selectors.queue_plan import queue_plan_forget
from tests.conftest import World, job_body
from tests.factories import JobFactory


def _post(client: APIClient, url: str, body: Any, key: str | None = None) -> Any:
    extra = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(url, body, format="json", **extra)


# --- Idempotency-Key -------------------------------------------------------------------


def test_a_retried_job_submit_returns_the_first_job(world: World) -> None:
    c = world.client(world.member)
    first = _post(c, "/api/v1/jobs/", job_body(), key="k1")
    again = _post(c, "/api/v1/jobs/", job_body(), key="k1")
    assert first.status_code == 201
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1


@pytest.mark.parametrize(("url", "body", "count"), [
    ("/api/v1/tokens/", {"name": "ci"}, lambda w: w.member.api_tokens.count()),
    ("/api/v1/jobs/bulk/", job_body(count=4), lambda w: Job.objects.count()),
])
def test_every_post_is_idempotent(world: World, url: str, body: dict[str, Any],
                                  count: Any) -> None:
    c = world.client(world.member)
    before = count(world)
    r1 = _post(c, url, body, key="same")
    r2 = _post(c, url, body, key="same")
    assert r1.status_code == 201
    assert r2.status_code == 200
    expected = r1.json()
    if "tokens" in url:  # a token's secret is in the first answer only (docs/api.md)
        expected = {**expected, "key": None, "message": KEY_SHOWN_ONCE}
    assert r2.json() == expected
    assert count(world) == before + (1 if "tokens" in url else 4)


def test_a_retried_cancel_replays_the_answer(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     submitter=world.member)
    c = world.client(world.member)
    r1 = _post(c, f"/api/v1/jobs/{job.pk}/cancel/", None, key="c1")
    r2 = _post(c, f"/api/v1/jobs/{job.pk}/cancel/", None, key="c1")
    r3 = _post(c, f"/api/v1/jobs/{job.pk}/cancel/", None, key="c2")
    assert (r1.status_code, r2.status_code, r3.status_code) == (200, 200, 409)
    assert r3.json()["error"]["code"] == "invalid_transition"


def test_the_same_key_for_a_different_request_is_422(world: World) -> None:
    c = world.client(world.member)
    assert _post(c, "/api/v1/jobs/", job_body(), key="k").status_code == 201
    r = _post(c, "/api/v1/jobs/", job_body(name="other"), key="k")
    assert r.status_code == 422
    assert r.json()["error"]["code"] == "idempotency_key_reused"


def test_keys_are_per_user(world: World) -> None:
    a = _post(world.client(world.member), "/api/v1/tokens/", {"name": "x"}, key="k")
    b = _post(world.client(world.admin), "/api/v1/tokens/", {"name": "x"}, key="k")
    assert a.status_code == b.status_code == 201
    assert a.json()["id"] != b.json()["id"]


def test_a_key_still_in_progress_is_409(world: World) -> None:
    c = world.client(world.member)
    body = {"name": "x"}
    first = _post(c, "/api/v1/tokens/", body, key="busy")
    record = IdempotencyRecord.objects.get(key="busy")
    IdempotencyRecord.objects.filter(pk=record.pk).update(status_code=None)  # as if running
    r = _post(c, "/api/v1/tokens/", body, key="busy")
    assert first.status_code == 201
    assert r.status_code == 409


def test_validation_errors_are_replayed_too_but_5xx_are_not_stored(
    world: World, monkeypatch: Any
) -> None:
    c = world.client(world.member)
    bad = _post(c, "/api/v1/jobs/bulk/", job_body(gpus=0, count=2), key="bad")
    assert bad.status_code == 400
    again = _post(c, "/api/v1/jobs/bulk/", job_body(gpus=0, count=2), key="bad")
    assert (again.status_code, again["Idempotent-Replayed"]) == (400, "true")
    assert IdempotencyRecord.objects.get(key="bad").status_code == 400
    # A server error is not an answer to keep: the key stays free for the retry.
    from queueing.api import views

    def boom(**_: Any) -> Any:
        raise RuntimeError("database went away")

    monkeypatch.setattr(views, "jobs_submit_array", boom)
    c.raise_request_exception = False
    assert _post(c, "/api/v1/jobs/bulk/", job_body(count=2), key="flaky").status_code == 500
    assert not IdempotencyRecord.objects.filter(key="flaky").exists()
    monkeypatch.undo()
    assert _post(c, "/api/v1/jobs/bulk/", job_body(count=2), key="flaky").status_code == 201


def test_a_job_submit_has_one_idempotency_layer_the_key_on_the_job(
    world: World, monkeypatch: Any
) -> None:
    """`POST /jobs/` keeps its key on the job only (one layer): a refused submit
    stores nothing, so the corrected retry with the same key is created; a server error
    stores nothing either; the replay of a created job says it is one."""
    c = world.client(world.member)
    bad = _post(c, "/api/v1/jobs/", job_body(gpus=0), key="run-1")
    assert bad.status_code == 400
    from queueing.api import views

    def boom(**_: Any) -> Any:
        raise RuntimeError("database went away")

    monkeypatch.setattr(views, "job_submit_with_event", boom)
    c.raise_request_exception = False
    assert _post(c, "/api/v1/jobs/", job_body(), key="run-1").status_code == 500
    monkeypatch.undo()
    first = _post(c, "/api/v1/jobs/", job_body(), key="run-1")
    again = _post(c, "/api/v1/jobs/", job_body(), key="run-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again["Idempotent-Replayed"] == "true" and again.json()["id"] == first.json()["id"]
    assert not IdempotencyRecord.objects.exists()
    assert Job.objects.get().idempotency_key == "run-1"


def test_records_older_than_a_day_are_purged_and_a_retry_then_claims_afresh(
        world: World) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from accounts.services import idempotency_purge
    from queueing.tasks import idempotency_purge_task

    c = world.client(world.member)
    for key in ("old-1", "old-2", "new"):
        assert _post(c, "/api/v1/tokens/", {"name": key}, key=key).status_code == 201
    now = timezone.now()
    IdempotencyRecord.objects.filter(key__startswith="old").update(
        created_at=now - timedelta(days=1, seconds=1))
    assert idempotency_purge(now=now, batch=1) == 2  # in batches of one
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["new"]
    assert idempotency_purge_task() == 0
    # The purged key is free again: a new request with it does new work.
    assert _post(c, "/api/v1/tokens/", {"name": "old-1b"}, key="old-1").status_code == 201


def test_an_overlong_key_is_400(world: World) -> None:
    r = _post(world.client(world.member), "/api/v1/tokens/", {"name": "x"}, key="k" * 201)
    assert r.status_code == 400
    assert "Idempotency-Key" in r.json()["error"]["fields"]


# --- throttling ------------------------------------------------------------------------


@override_settings(FAIRQ_API_RATE="3/hour")
def test_throttling_is_per_user(world: World) -> None:
    a = world.client(world.member)
    codes = [a.get("/api/v1/tiers/").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = a.get("/api/v1/tiers/")
    assert r.json()["error"]["code"] == "throttled"
    assert int(r["Retry-After"]) > 0
    # Another token of the same user shares the bucket (tests/security/test_limits.py).
    assert world.client(world.member).get("/api/v1/tiers/").status_code == 429


@override_settings(FAIRQ_API_ANON_RATE="2/hour")
def test_anonymous_requests_are_throttled_by_address(world: World) -> None:
    c = APIClient()
    codes = [c.get("/api/v1/schema/").status_code for _ in range(3)]
    assert codes == [200, 200, 429]


# --- ETag / updated_at -----------------------------------------------------------------


def test_job_detail_has_an_etag_and_answers_304_until_it_changes(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     status="RUNNING", submitter=world.member)
    c = world.client(world.member)
    r = c.get(f"/api/v1/jobs/{job.pk}/")
    etag = r["ETag"]
    assert etag
    assert c.get(f"/api/v1/jobs/{job.pk}/", HTTP_IF_NONE_MATCH=etag).status_code == 304
    c.post(f"/api/v1/jobs/{job.pk}/cancel/")
    r2 = c.get(f"/api/v1/jobs/{job.pk}/", HTTP_IF_NONE_MATCH=etag)
    assert r2.status_code == 200
    assert r2.json()["status"] == "CANCELLED"


def test_a_queued_job_is_not_304_once_its_place_in_the_queue_moves(world: World) -> None:
    """A queued job's own row does not change when a job lands ahead of it; its answer
    does, and so does its (content) ETag."""
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    c = world.client(world.member)
    r = c.get(f"/api/v1/jobs/{job.pk}/")
    assert r.json()["queue"]["position"] == 1
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.high)  # goes ahead of it
    queue_plan_forget()  # the shared plan is refreshed (a cycle, or QUEUE_PLAN_TTL later)
    r2 = c.get(f"/api/v1/jobs/{job.pk}/", HTTP_IF_NONE_MATCH=r["ETag"])
    assert r2.status_code == 200
    assert r2.json()["queue"]["position"] == 2


def test_updated_after_lists_only_changed_jobs(world: World) -> None:
    old = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    c = world.client(world.member)
    stamp = c.get(f"/api/v1/jobs/{old.pk}/").json()["updated_at"]
    time.sleep(0.01)
    new = c.post("/api/v1/jobs/", job_body(), format="json").json()
    r = c.get("/api/v1/jobs/", {"updated_after": stamp})
    assert [j["id"] for j in r.json()["results"]] == [new["id"]]


# --- the one error shape ---------------------------------------------------------------


@pytest.mark.parametrize(("method", "url", "status", "code"), [
    ("get", "/api/v1/jobs/999999/", 404, "not_found"),
    ("get", "/api/v1/jobs/abc/", 404, "not_found"),
    ("get", "/api/v1/teams/nope/", 404, "not_found"),
    ("post", "/api/v1/jobs/", 400, "invalid"),
    ("delete", "/api/v1/tiers/", 405, "method_not_allowed"),
    ("get", "/api/v1/usage/?bucket=week", 400, "invalid"),
    ("get", "/api/v1/usage/?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", 400, "invalid"),
    ("get", "/api/v1/jobs/?status=NOPE", 400, "invalid"),
])
def test_errors_have_one_shape(world: World, method: str, url: str, status: int,
                               code: str) -> None:
    r = getattr(world.client(world.member), method)(url, {}, format="json") \
        if method != "get" else world.client(world.member).get(url)
    assert r.status_code == status, r.content
    error = r.json()["error"]
    assert error["status"] == status
    assert error["code"] == code
    assert isinstance(error["message"], str)


def test_anonymous_gets_401_in_the_error_shape(world: World) -> None:
    r = APIClient().get("/api/v1/jobs/")
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "not_authenticated"


# --- bulk array jobs -------------------------------------------------------------------


def test_bulk_queues_an_array_of_named_indexed_jobs(world: World) -> None:
    r = _post(world.client(world.member), "/api/v1/jobs/bulk/",
              job_body(name="sweep", count=3))
    assert r.status_code == 201
    ids = r.json()["ids"]
    jobs = list(Job.objects.filter(pk__in=ids).order_by("pk"))
    assert [j.name for j in jobs] == ["sweep-0", "sweep-1", "sweep-2"]
    assert [j.env["FAIRQ_ARRAY_INDEX"] for j in jobs] == ["0", "1", "2"]
    assert {j.env["FAIRQ_ARRAY_SIZE"] for j in jobs} == {"3"}
    assert JobEvent.objects.filter(job__in=jobs, to_status="QUEUED").count() == 3
    assert {j.submitter_id for j in jobs} == {world.member.pk}


@pytest.mark.parametrize(("overrides", "field"), [
    ({"count": 10_001}, "count"),
    ({"count": 0}, "count"),
    ({"count": 10, "name": "n" * 62}, "name"),
    ({"count": 2, "gpus": 99}, "gpus"),
])
def test_bulk_validates_once_for_all(world: World, overrides: dict[str, Any], field: str) -> None:
    r = _post(world.client(world.member), "/api/v1/jobs/bulk/", job_body(**overrides))
    assert r.status_code == 400
    assert field in r.json()["error"]["fields"]
    assert Job.objects.count() == 0


def test_bulk_of_ten_thousand_queues_every_job_with_its_event(world: World) -> None:
    """The largest array job: all 10,000 queued, the first ARRAY_SUBMIT_WINDOW written as
    jobs with their events, the rest as the cycle needs them (every member
    run to its end: tests/arrays/test_compact_arrays.py). How fast is
    bench/bench_vs_slurm.py's (vs_slurm_array_ratio, goal <= 5), not a timed test here."""
    from queueing.services.jobs import ARRAY_SUBMIT_WINDOW

    c = world.client(world.member)
    r = _post(c, "/api/v1/jobs/bulk/", job_body(name="big", count=10_000))
    assert r.status_code == 201
    ids, window = r.json()["ids"], ARRAY_SUBMIT_WINDOW
    assert r.json()["count"] == 10_000
    assert len(ids) == len(set(ids)) == Job.objects.count() == JobEvent.objects.count() == window
    last = Job.objects.get(pk=ids[-1])
    assert last.name == f"big-{window - 1}" and last.env["FAIRQ_ARRAY_SIZE"] == "10000"
    assert c.get(f"/api/v1/arrays/{r.json()['array_id']}/").json()["counts"]["QUEUED"] == 10_000


# --- memberships and teams through the API --------------------------------------------


def test_team_admin_adds_and_removes_a_member(world: World) -> None:
    c = world.client(world.admin)
    r = _post(c, "/api/v1/teams/vision/members/", {"username": "bob", "role": "member"})
    assert r.status_code == 201
    assert Membership.objects.filter(team=world.vision, user=world.outsider).exists()
    # bob now sees vision's jobs
    assert world.client(world.outsider).get("/api/v1/teams/vision/").status_code == 200
    assert c.delete("/api/v1/teams/vision/members/bob/").status_code == 204
    assert world.client(world.outsider).get("/api/v1/teams/vision/").status_code == 404


def test_adding_an_unknown_user_is_400(world: World) -> None:
    r = _post(world.client(world.admin), "/api/v1/teams/vision/members/", {"username": "ghost"})
    assert r.status_code == 400
    assert "username" in r.json()["error"]["fields"]


def test_staff_creates_a_team_and_sets_its_quota(world: World) -> None:
    c = world.client(world.staff)
    assert _post(c, "/api/v1/teams/", {"slug": "robotics", "name": "Robotics",
                                       "weight": 2}).status_code == 201
    r = _post(c, "/api/v1/quotas/", {"team": "robotics", "gpu_type": "h100", "nominal": 4,
                                     "borrowing_limit": None})
    assert r.status_code == 201
    r2 = _post(c, "/api/v1/quotas/", {"team": "robotics", "gpu_type": "h100", "nominal": 6})
    assert r2.status_code == 200
    assert r2.json()["nominal"] == 6
    assert Team.objects.get(slug="robotics").quotas.get().nominal == 6


def test_a_model_rule_broken_inside_a_service_is_a_400_not_a_500(world: World,
                                                                monkeypatch: Any) -> None:
    """Django's ValidationError (a service's full_clean) maps to the one error shape."""
    from django.core.exceptions import ValidationError as DjangoValidationError

    from queueing.api import resources

    def refuse(**_: Any) -> None:
        raise DjangoValidationError({"nominal": ["Too many GPUs for this cluster."]})

    monkeypatch.setattr(resources, "quota_set", refuse)
    quota = world.vision.quotas.first()
    r = world.client(world.staff).patch(f"/api/v1/quotas/{quota.pk}/", {"nominal": 3},
                                        format="json")
    assert r.status_code == 400, r.content
    assert r.json()["error"]["fields"] == {"nominal": ["Too many GPUs for this cluster."]}


@pytest.mark.parametrize("page_size", ["null", "0", "-3", "2.5", "ten", "٣"])
def test_a_page_size_that_is_not_a_whole_number_of_at_least_one_is_a_400(
        world: World, page_size: str) -> None:
    r = world.client(world.member).get("/api/v1/jobs/", {"page_size": page_size})
    assert r.status_code == 400
    assert "page_size" in r.json()["error"]["fields"]


def test_a_page_size_above_the_maximum_is_cut_to_it(world: World) -> None:
    for _ in range(3):
        JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    r = world.client(world.member).get("/api/v1/jobs/", {"page_size": "100000"})
    assert r.status_code == 200 and len(r.json()["results"]) == 3
    r = world.client(world.member).get("/api/v1/jobs/", {"page_size": "2"})
    assert len(r.json()["results"]) == 2 and r.json()["next"]
