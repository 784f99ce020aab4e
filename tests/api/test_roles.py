"""Every endpoint × role: member and team admin of vision, an outsider (nlp), staff and
anonymous. Objects belong to vision; the outsider must see nothing of them (404)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import ApiToken
from accounts.services import token_issue
from queueing.models import Quota
from tests.conftest import World, job_body
from tests.factories import JobFactory

ROLES = ["member", "admin", "outsider", "staff", "anon"]

Setup = Callable[[World], tuple[str, dict[str, Any] | None]]


def _job(w: World) -> int:
    return JobFactory(team=w.vision, gpu_type=w.h100, tier=w.normal).pk


def _quota(w: World) -> int:
    return Quota.objects.get(team=w.vision, gpu_type=w.h100).pk


def _own_token(w: World, user: Any) -> int:
    return token_issue(user=user, name="other").token.pk


# (id, method, setup -> (url, body), {role: status})
CASES: list[tuple[str, str, Callable[..., tuple[str, Any]], dict[str, int]]] = [
    ("jobs-list", "get", lambda w, u: ("/api/v1/jobs/", None),
     {"member": 200, "admin": 200, "outsider": 200, "staff": 200, "anon": 401}),
    ("jobs-create", "post", lambda w, u: ("/api/v1/jobs/", job_body()),
     {"member": 201, "admin": 201, "outsider": 400, "staff": 201, "anon": 401}),
    ("jobs-bulk", "post", lambda w, u: ("/api/v1/jobs/bulk/", job_body(count=3)),
     {"member": 201, "admin": 201, "outsider": 400, "staff": 201, "anon": 401}),
    ("jobs-detail", "get", lambda w, u: (f"/api/v1/jobs/{_job(w)}/", None),
     {"member": 200, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    # A job no one of these submitted: a plain member may not cancel it (docs/api.md,
    # "Who may cancel"; tests/api/test_cancel_permissions.py has the whole table).
    ("jobs-cancel", "post", lambda w, u: (f"/api/v1/jobs/{_job(w)}/cancel/", None),
     {"member": 403, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    ("jobs-events", "get", lambda w, u: (f"/api/v1/jobs/{_job(w)}/events/", None),
     {"member": 200, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    ("jobs-logs", "get", lambda w, u: (f"/api/v1/jobs/{_job(w)}/logs/", None),
     {"member": 200, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    ("teams-list", "get", lambda w, u: ("/api/v1/teams/", None),
     {"member": 200, "admin": 200, "outsider": 200, "staff": 200, "anon": 401}),
    ("teams-create", "post", lambda w, u: ("/api/v1/teams/", {"slug": "robotics", "name": "R"}),
     {"member": 403, "admin": 403, "outsider": 403, "staff": 201, "anon": 401}),
    ("teams-detail", "get", lambda w, u: ("/api/v1/teams/vision/", None),
     {"member": 200, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    ("teams-update", "patch", lambda w, u: ("/api/v1/teams/vision/", {"weight": 4}),
     {"member": 403, "admin": 403, "outsider": 404, "staff": 200, "anon": 401}),
    ("teams-cancel-rule", "patch",
     lambda w, u: ("/api/v1/teams/vision/", {"any_member_may_cancel": True}),
     {"member": 403, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    ("members-list", "get", lambda w, u: ("/api/v1/teams/vision/members/", None),
     {"member": 200, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    ("members-add", "post",
     lambda w, u: ("/api/v1/teams/vision/members/", {"username": "bob", "role": "member"}),
     {"member": 403, "admin": 201, "outsider": 404, "staff": 201, "anon": 401}),
    ("members-detail", "get", lambda w, u: ("/api/v1/teams/vision/members/dave/", None),
     {"member": 200, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    ("members-role", "patch",
     lambda w, u: ("/api/v1/teams/vision/members/dave/", {"role": "team-admin"}),
     {"member": 403, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    ("members-remove", "delete", lambda w, u: ("/api/v1/teams/vision/members/dave/", None),
     {"member": 403, "admin": 204, "outsider": 404, "staff": 204, "anon": 401}),
    ("tokens-list", "get", lambda w, u: ("/api/v1/tokens/", None),
     {"member": 200, "admin": 200, "outsider": 200, "staff": 200, "anon": 401}),
    ("tokens-create", "post", lambda w, u: ("/api/v1/tokens/", {"name": "ci"}),
     {"member": 201, "admin": 201, "outsider": 201, "staff": 201, "anon": 401}),
    ("tokens-revoke-own", "delete",
     lambda w, u: (f"/api/v1/tokens/{_own_token(w, u or w.member)}/", None),
     {"member": 200, "admin": 200, "outsider": 200, "staff": 200, "anon": 401}),
    ("tokens-revoke-other", "delete",
     lambda w, u: (f"/api/v1/tokens/{_own_token(w, w.speech_user)}/", None),
     {"member": 404, "admin": 404, "outsider": 404, "staff": 404, "anon": 401}),
    ("quotas-list", "get", lambda w, u: ("/api/v1/quotas/", None),
     {"member": 200, "admin": 200, "outsider": 200, "staff": 200, "anon": 401}),
    ("quotas-set", "post",
     lambda w, u: ("/api/v1/quotas/", {"team": "vision", "gpu_type": "mig-1g-10gb", "nominal": 2}),
     {"member": 403, "admin": 403, "outsider": 403, "staff": 201, "anon": 401}),
    ("quotas-detail", "get", lambda w, u: (f"/api/v1/quotas/{_quota(w)}/", None),
     {"member": 200, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    ("quotas-update", "patch", lambda w, u: (f"/api/v1/quotas/{_quota(w)}/", {"nominal": 4}),
     {"member": 403, "admin": 403, "outsider": 404, "staff": 200, "anon": 401}),
    ("tiers", "get", lambda w, u: ("/api/v1/tiers/", None),
     {"member": 200, "admin": 200, "outsider": 200, "staff": 200, "anon": 401}),
    ("gpu-types", "get", lambda w, u: ("/api/v1/gpu-types/", None),
     {"member": 200, "admin": 200, "outsider": 200, "staff": 200, "anon": 401}),
    ("usage", "get", lambda w, u: ("/api/v1/usage/?bucket=hour", None),
     {"member": 200, "admin": 200, "outsider": 200, "staff": 200, "anon": 401}),
    ("usage-team", "get", lambda w, u: ("/api/v1/usage/?team=vision&bucket=day", None),
     {"member": 200, "admin": 200, "outsider": 404, "staff": 200, "anon": 401}),
    ("capacity", "get", lambda w, u: ("/api/v1/capacity/", None),
     {"member": 200, "admin": 200, "outsider": 200, "staff": 200, "anon": 401}),
    ("fairshare", "get", lambda w, u: ("/api/v1/fairshare/", None),
     {"member": 200, "admin": 200, "outsider": 200, "staff": 200, "anon": 401}),
]


def _user(world: World, role: str) -> Any:
    return None if role == "anon" else getattr(world, role)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("name", "method", "setup", "expected"), CASES, ids=[c[0] for c in CASES])
def test_endpoint_answers_each_role(world: World, role: str, name: str, method: str,
                                    setup: Callable[..., tuple[str, Any]],
                                    expected: dict[str, int]) -> None:
    from tests.factories import UserFactory

    world.speech_user = UserFactory(username="carol")  # type: ignore[attr-defined]
    user = _user(world, role)
    client = world.client(user) if user is not None else APIClient()
    url, body = setup(world, user)
    response = getattr(client, method)(url, body, format="json")
    assert response.status_code == expected[role], response.content
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["status"] == response.status_code
        assert error["code"]
        assert error["message"]


def test_outsider_sees_no_vision_jobs_in_lists(world: World) -> None:
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    body = world.client(world.outsider).get("/api/v1/jobs/").json()
    assert body["results"] == []


def test_token_list_never_shows_secrets(world: World) -> None:
    client = world.client(world.member)
    created = client.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    assert created["key"].startswith("fq_")
    listed = client.get("/api/v1/tokens/").json()
    assert all("key" not in t and "key_hash" not in t for t in listed)
    assert ApiToken.objects.filter(prefix=created["prefix"]).exists()


def test_revoked_token_stops_working(world: World) -> None:
    client = world.client(world.member)
    created = client.post("/api/v1/tokens/", {"name": "ci"}, format="json").json()
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Token {created['key']}")
    assert other.get("/api/v1/tiers/").status_code == 200
    assert client.delete(f"/api/v1/tokens/{created['id']}/").json()["active"] is False
    assert other.get("/api/v1/tiers/").status_code == 401
