"""API v1 jobs: submit, validation, idempotency, tenancy, cancel."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import IdempotencyRecord
from queueing.models import Job, JobEvent
from queueing.policy.states import JobState

from .conftest import World, job_body
from .factories import JobFactory

pytestmark = pytest.mark.django_db


def test_it_queues_a_job_as_pipelines_post_it(world: World) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201, r.json()
    body = r.json()
    assert body["status"] == "QUEUED"
    assert body["team"] == "vision" and body["gpus"] == 2 and body["replicas"] == 1
    assert body["total_gpus"] == 2 and body["attempt"] == 1
    assert body["created_at"] and body["submitter"] == "dave"
    assert [e["to_status"] for e in body["events"]] == ["QUEUED"]
    job = Job.objects.get(pk=body["id"])
    assert job.command == ["python", "train.py"] and job.env == {"SEED": "1"}


def test_it_applies_defaults_for_fields_not_shown(world: World) -> None:
    body = {"team": "vision", "name": "tiny", "image": "busybox", "gpu_type": "a100", "gpus": 1}
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["tier"] == "normal" and r.json()["replicas"] == 1
    assert r.json()["command"] == [] and r.json()["max_runtime_seconds"] is None


BAD_INPUTS: list[tuple[dict[str, Any], str]] = [
    ({"name": None}, "name"),
    ({"image": ""}, "image"),
    ({"image": "UPPER/Case Image"}, "image"),
    ({"gpu_type": "tpu-v5"}, "gpu_type"),
    ({"tier": "platinum"}, "tier"),
    ({"gpus": 0}, "gpus"),
    ({"gpus": -2}, "gpus"),
    ({"gpus": 9}, "gpus"),  # no h100 node holds 9 GPUs (test cluster: 8-GPU nodes)
    ({"gpu_type": "mig-1g-10gb", "gpus": 8}, "gpus"),
    ({"replicas": 0}, "replicas"),
    ({"team": "nlp"}, "team"),  # exists, caller not in it
    ({"team": "no-such-team"}, "team"),
    ({"name": "Resnet_Sweep"}, "name"),
    ({"name": "x" * 64}, "name"),
    ({"command": ["x" * 5000]}, "command[0]"),
    ({"args": ["a"] * 300}, "args"),
    ({"env": {"BAD NAME": "1"}}, "env"),
    ({"env": {"FAIRQ_TOKEN": "1"}}, "env"),
    ({"env": {f"V{i}": "x" for i in range(200)}}, "env"),
    ({"env": {"A": "x" * 40000}}, "env.A"),
    ({"env": {f"V{i}": "x" * 30000 for i in range(8)}}, "non_field_errors"),
    ({"max_runtime_seconds": 0}, "max_runtime_seconds"),
    ({"gpus": "two"}, "gpus"),
]


@pytest.mark.parametrize(("override", "field"), BAD_INPUTS)
def test_it_rejects_bad_input_with_field_messages_and_creates_nothing(
    world: World, override: dict[str, Any], field: str
) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**override), format="json")
    assert r.status_code == 400, r.json()
    err = r.json()["error"]
    assert err["status"] == 400 and err["code"] == "invalid"
    assert field in err["fields"], err
    assert all(isinstance(m, str) and m for m in err["fields"][field])
    assert Job.objects.count() == 0 and JobEvent.objects.count() == 0


def test_a_missing_required_field_is_named(world: World) -> None:
    body = job_body()
    del body["image"], body["gpus"]
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 400
    assert set(r.json()["error"]["fields"]) == {"image", "gpus"}


@pytest.mark.parametrize("url", ["/api/v1/jobs/", "/api/v1/jobs/bulk/"])
def test_shape_errors_and_rule_errors_are_named_in_one_answer(world: World, url: str) -> None:
    body = {**job_body(name="Bad_Name", gpus=0, team="nlp", env={"LD_PRELOAD": "x"}),
            "privileged": True}
    if url.endswith("bulk/"):
        body["count"] = 2
    r = world.client(world.member).post(url, body, format="json")
    assert r.status_code == 400
    assert set(r.json()["error"]["fields"]) == {"name", "gpus", "team", "env", "privileged"}
    assert r.json()["error"]["message"] == "The request has invalid fields."


def test_the_same_idempotency_key_returns_the_first_job_and_creates_nothing(world: World) -> None:
    c = world.client(world.member)
    first = c.post("/api/v1/jobs/", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="run-42")
    again = c.post("/api/v1/jobs/", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="run-42")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["name"] == "resnet-sweep-3"
    assert Job.objects.count() == 1 and JobEvent.objects.count() == 1


def test_idempotency_keys_are_per_team(world: World) -> None:
    world.client(world.member).post("/api/v1/jobs/", job_body(), format="json",
                                    HTTP_IDEMPOTENCY_KEY="k")
    r = world.client(world.outsider).post("/api/v1/jobs/", job_body(team="nlp"), format="json",
                                          HTTP_IDEMPOTENCY_KEY="k")
    assert r.status_code == 201 and Job.objects.count() == 2


def test_a_team_key_never_returns_another_members_job(world: World) -> None:
    """Keys are unique per team in the database; a team mate who happens to send the same
    key (two pipelines counting runs from 1) gets a 422, not the other's job."""
    first = world.client(world.member).post("/api/v1/jobs/", job_body(), format="json",
                                            HTTP_IDEMPOTENCY_KEY="run-1")
    r = world.client(world.admin).post("/api/v1/jobs/", job_body(), format="json",
                                       HTTP_IDEMPOTENCY_KEY="run-1")
    assert first.status_code == 201
    assert r.status_code == 422 and r.json()["error"]["code"] == "idempotency_key_reused"
    assert set(r.json()) == {"error"}  # nothing of the first job
    assert Job.objects.count() == 1


@pytest.mark.parametrize(("changed", "status"), [({}, 200), ({"gpus": 1}, 422),
                                                  ({"env": {"SEED": "2"}}, 422)])
def test_a_team_key_outlives_the_day_of_replays_and_still_checks_the_job(
        world: World, changed: dict[str, Any], status: int) -> None:
    """After a day the per-user replay record is gone; the team's key on the job still
    answers: the same job again is the first job, a different one is refused."""
    c = world.client(world.member)
    first = c.post("/api/v1/jobs/", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="run-7")
    IdempotencyRecord.objects.all().delete()  # as if a day had passed
    r = c.post("/api/v1/jobs/", job_body(**changed), format="json",
               HTTP_IDEMPOTENCY_KEY="run-7")
    assert r.status_code == status and Job.objects.count() == 1
    if status == 200:
        assert r.json()["id"] == first.json()["id"]


def test_a_member_lists_only_jobs_of_their_teams(world: World) -> None:
    mine = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal)
    r = world.client(world.member).get("/api/v1/jobs/")
    assert r.status_code == 200
    assert [j["id"] for j in r.json()["results"]] == [mine.pk]


def test_staff_see_every_job(world: World) -> None:
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal)
    assert len(world.client(world.staff).get("/api/v1/jobs/").json()["results"]) == 2


def test_the_list_filters_by_status_and_team(world: World) -> None:
    a = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal, status=JobState.RUNNING)
    c = world.client(world.staff)
    ids = [j["id"] for j in c.get("/api/v1/jobs/?status=QUEUED").json()["results"]]
    assert ids == [a.pk]
    assert c.get("/api/v1/jobs/?team=nlp").json()["results"] == []


@pytest.mark.parametrize(("method", "path"), [
    ("get", "/api/v1/jobs/{id}/"),
    ("post", "/api/v1/jobs/{id}/cancel/"),
])
def test_an_outsider_gets_404_on_every_job_endpoint(world: World, method: str, path: str) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    r = getattr(world.client(world.outsider), method)(path.format(id=job.pk))
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
    job.refresh_from_db()
    assert job.status == JobState.QUEUED
    # ...and the answer is the same as for a job that does not exist at all.
    r2 = getattr(world.client(world.outsider), method)(path.format(id=999999))
    assert r2.status_code == 404 and r2.json()["error"]["code"] == "not_found"


def test_an_outsider_does_not_see_the_job_in_lists(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    r = world.client(world.outsider).get(f"/api/v1/jobs/?team=vision&name={job.name}")
    assert r.json()["results"] == []


def test_anonymous_callers_are_refused(world: World) -> None:
    r = APIClient().get("/api/v1/jobs/")
    assert r.status_code in (401, 403)
    assert "error" in r.json()


def test_a_bad_token_is_refused(world: World) -> None:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION="Token fq_deadbeef_not-a-real-secret")
    assert c.get("/api/v1/jobs/").status_code == 401


def test_a_member_cancels_a_queued_job_and_the_event_says_who(world: World) -> None:
    job_id = world.client(world.member).post("/api/v1/jobs/", job_body(), format="json").json()["id"]
    r = world.client(world.admin).post(f"/api/v1/jobs/{job_id}/cancel/")
    assert r.status_code == 200, r.json()
    assert r.json()["status"] == "CANCELLED"
    last = r.json()["events"][-1]
    assert (last["from_status"], last["to_status"], last["actor"]) == ("QUEUED", "CANCELLED", "alice")


def test_cancelling_a_finished_job_is_a_conflict_and_changes_nothing(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     status=JobState.SUCCEEDED, submitter=world.member)
    r = world.client(world.member).post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert r.status_code == 409 and r.json()["error"]["code"] == "invalid_transition"
    job.refresh_from_db()
    assert job.status == JobState.SUCCEEDED and job.events.count() == 0


def test_session_auth_works_for_the_browser(world: World) -> None:
    c = APIClient()
    assert c.login(username="dave", password="pw")
    assert c.get("/api/v1/jobs/").status_code == 200


def test_revoked_and_expired_tokens_are_refused(world: World) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from accounts.services import token_issue, token_revoke

    issued = token_issue(user=world.member)
    token_revoke(token=issued.token, actor=world.member)
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {issued.key}")
    assert c.get("/api/v1/jobs/").status_code == 401
    expired = token_issue(user=world.member, expires_at=timezone.now() - timedelta(seconds=1))
    c.credentials(HTTP_AUTHORIZATION=f"Token {expired.key}")
    assert c.get("/api/v1/jobs/").status_code == 401


def test_tokens_are_stored_hashed(world: World) -> None:
    from accounts.models import ApiToken
    from accounts.services import token_issue

    issued = token_issue(user=world.member)
    row = ApiToken.objects.get(pk=issued.token.pk)
    assert issued.key not in (row.key_hash, row.prefix) and len(row.key_hash) == 64


def test_a_service_account_token_submits_for_its_team(world: World) -> None:
    from accounts.services import service_account_create

    sa = service_account_create(team=world.vision, name="pipeline")
    r = world.client(sa.user).post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201
    assert world.client(sa.user).post("/api/v1/jobs/", job_body(team="nlp"),
                                      format="json").status_code == 400
