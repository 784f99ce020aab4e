"""The submit fast path (queueing/api/jobs.py) keeps every check of the DRF
view: its shapes are DRF's own or it hands the body over; a revoked token is refused at
the next request; the rate limit counts a handed-over request once; the answer is the
DRF view's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.exceptions import ValidationError

from accounts.services import token_issue, token_revoke
from queueing.api.jobs import lean_shaped
from queueing.api.serializers import JobCreateSerializer, shaped
from queueing.models import Job
from queueing.services.cluster_rules import CLUSTER_SUBMIT_FIELDS
from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db

_ODD_VALUES: list[Any] = [
    None, "", " ", " x ", "x", "ü", "\ud800", "a" * 64, "a" * 5000, 0, 1, -1, 2, 10**30,
    1.0, 1.5, True, False, [], ["a"], ["a", 1], [""], ["a" * 5000], {}, {"A": "1"},
    {"A": 1}, {"A": ""}, {"A": None}, "4", "null",
]


def _bodies() -> list[Any]:
    """Valid bodies, each field of the serializer set to odd values, fields left out,
    unknown fields, and bodies that are not objects."""
    base = job_body()
    out: list[Any] = [base, job_body(tier=None), job_body(notify_url="", working_dir="")]
    for name in JobCreateSerializer().fields:
        for value in _ODD_VALUES:
            out.append({**base, name: value})
        out.append({k: v for k, v in base.items() if k != name})
    out += [{**base, "privileged": True}, [], "job", None, 3, {}]
    out += [{**base, "command": ["x"] * n} for n in (0, 1, 1000, 1001)]
    return out


def test_lean_shapes_are_drfs_or_hand_over() -> None:
    """`lean_shaped` gives exactly what `shaped` gives, or None; never a value for a body
    DRF refuses."""
    decided = 0
    for body in _bodies():
        lean = lean_shaped(JobCreateSerializer, body)
        try:
            drf: dict[str, Any] | None = shaped(JobCreateSerializer, body)
        except ValidationError:
            drf = None
        if lean is not None:
            decided += 1
            assert drf is not None, body
            assert lean == drf, body
    assert decided > 100  # the plain bodies are the fast path's, not all handed over


def _submit(client: Any, **overrides: Any) -> Any:
    return client.post("/api/v1/jobs/", job_body(**overrides), format="json")


def test_a_token_revoked_is_refused_at_the_next_submit(
        world: World, django_capture_on_commit_callbacks: Any) -> None:
    issued = token_issue(user=world.member, name="ci")
    from rest_framework.test import APIClient

    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {issued.key}")
    assert _submit(c).status_code == 201
    assert _submit(c).status_code == 201  # remembered by this process now
    with django_capture_on_commit_callbacks(execute=True):
        token_revoke(token=issued.token, actor=world.member)
    r = _submit(c)
    assert r.status_code == 401, r.content
    assert r.json()["error"]["message"] == "Token revoked or expired."


def test_a_user_deactivated_is_refused_at_the_next_submit(
        world: World, django_capture_on_commit_callbacks: Any) -> None:
    c = world.client(world.member)
    assert _submit(c).status_code == 201
    assert _submit(c).status_code == 201
    with django_capture_on_commit_callbacks(execute=True):
        world.member.is_active = False
        world.member.save()
    r = _submit(c)
    assert r.status_code == 401, r.content


def test_a_remembered_token_is_refused_once_it_expires(world: World, monkeypatch: Any) -> None:
    issued = token_issue(user=world.member, name="ci",
                         expires_at=timezone.now() + timedelta(hours=1))
    from rest_framework.test import APIClient

    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {issued.key}")
    assert _submit(c).status_code == 201
    assert _submit(c).status_code == 201
    later = timezone.now() + timedelta(hours=2)
    monkeypatch.setattr(timezone, "now", lambda: later)
    r = _submit(c)
    assert r.status_code == 401, r.content


def test_a_refused_submit_counts_once_against_the_rate(world: World, settings: Any) -> None:
    """A rule's refusal is answered by the DRF view after the fast path counted the
    request: counted once, so the next two fit a rate of 3."""
    settings.FAIRQ_API_RATE = "3/min"
    c = world.client(world.member)
    r = _submit(c, gpu_type="no-such-gpu")
    assert r.status_code == 400, r.content
    assert "gpu_type" in r.json()["error"]["fields"]
    assert _submit(c).status_code == 201
    assert _submit(c).status_code == 201
    r = _submit(c)
    assert r.status_code == 429, r.content
    assert Job.objects.count() == 2


def test_the_fast_answer_is_the_drf_views(world: World) -> None:
    """Same status, body shape and headers as the DRF view (an Idempotency-Key sends the
    submit there)."""
    c = world.client(world.member)
    fast = _submit(c)
    drf = c.post("/api/v1/jobs/", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert fast.status_code == drf.status_code == 201
    for name in ("Content-Type", "Vary", "Allow", "X-Frame-Options",
                 "X-Content-Type-Options"):
        assert fast.headers.get(name) == drf.headers.get(name), name
    assert fast["Location"] == f"/api/v1/jobs/{fast.json()['id']}/"
    assert set(fast.json()) == set(drf.json())
    skip = {"id", "created_at", "updated_at", "events", "idempotency_key"}
    assert {k: v for k, v in fast.json().items() if k not in skip} == \
        {k: v for k, v in drf.json().items() if k not in skip}


@pytest.mark.parametrize(("body", "field"), [
    (job_body(gpus=0), "gpus"), (job_body(name=""), "name"), (job_body(privileged=True),
                                                               "privileged"),
    (job_body(team="nlp"), "team"), (job_body(gpus="2", tier="gold"), "tier"),
])
def test_refusals_are_the_drf_views(world: World, body: dict[str, Any], field: str) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 400, r.content
    assert field in r.json()["error"]["fields"]
    assert Job.objects.count() == 0


def test_every_lean_kind_is_checked() -> None:
    """The serializer's plain fields are decided by the fast path (not all handed over):
    a new plain field slots in without code here."""
    from queueing.api.jobs import _fields_of

    checked = {name for name, (check, _, _) in _fields_of(JobCreateSerializer).items()
               if check is not None}
    assert {"team", "name", "image", "command", "args", "env", "gpu_type", "gpus",
            "replicas", "tier", "max_runtime_seconds", "notify_url", "labels"} <= checked
    # Nested serializers are DRF's.
    assert not checked & {"resources", "topology", "volumes", "dependencies"}


def test_a_team_change_holds_from_the_next_submit(
        world: World, django_capture_on_commit_callbacks: Any) -> None:
    """The team row remembered by the fast path is read again once the team changes: its
    new default CPU applies to the very next job."""
    c = world.client(world.member)
    assert _submit(c).status_code == 201
    first = _submit(c)
    assert first.status_code == 201
    assert Job.objects.get(pk=first.json()["id"]).cpu_millicores is None
    with django_capture_on_commit_callbacks(execute=True):
        world.vision.default_cpu_millicores = 4000
        world.vision.save()
    r = _submit(c)
    assert r.status_code == 201, r.content
    assert Job.objects.get(pk=r.json()["id"]).cpu_millicores == 4000


def test_a_member_removed_is_refused_at_the_next_submit(
        world: World, django_capture_on_commit_callbacks: Any) -> None:
    from accounts.models import Membership

    c = world.client(world.member)
    assert _submit(c).status_code == 201
    assert _submit(c).status_code == 201
    with django_capture_on_commit_callbacks(execute=True):
        Membership.objects.get(user=world.member, team=world.vision).delete()
    r = _submit(c)
    assert r.status_code == 400, r.content
    assert r.json()["error"]["fields"]["team"] == ["Unknown team 'vision', or you are not in it."]


def test_an_address_over_the_failure_limit_still_submits_with_a_good_token(
        world: World, settings: Any) -> None:
    """A token that authenticates is never refused by the failed-authentication limit of
    its address (docs/api.md, "Authentication"): the fast path does not read the count,
    and bad tokens from the address are still refused (401, then 429)."""
    settings.FAIRQ_API_AUTH_FAILURE_RATE = "2/min"
    good = world.client(world.member)
    assert _submit(good).status_code == 201
    from rest_framework.test import APIClient

    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token fq_nosuch_secret")
    assert [_submit(bad).status_code for _ in range(3)] == [401, 401, 429]
    r = _submit(good)
    assert r.status_code == 201, r.content
    assert _submit(bad).status_code == 429
    assert Job.objects.count() == 2


def test_the_cluster_fields_are_decided_on_the_fast_path_as_in_the_drf_view(
        world: World, monkeypatch: Any) -> None:
    """Rules K3-K4's fields go through the fast path: set on the job, refused
    with the DRF view's field messages, nothing written on a refusal."""
    from queueing.api import jobs as fast
    from tests.api.test_clusters import three_clusters

    three_clusters(world)
    decided: list[dict[str, Any]] = []
    real = fast.job_input_of  # the fast path's own call of the one job-input path
    monkeypatch.setattr(fast, "job_input_of", lambda **kw: decided.append(
        {k: kw["fields"].get(k) for k in CLUSTER_SUBMIT_FIELDS}) or real(**kw))
    c = world.client(world.member)
    r = _submit(c, requested_cluster="cloud", cluster_selector={"cost": "cloud"},
                allow_spot=True, tier="critical")
    assert r.status_code == 201, r.content
    assert decided == [{"requested_cluster": "cloud", "cluster_selector": {"cost": "cloud"},
                        "allow_spot": True}]
    job = Job.objects.get(pk=r.json()["id"])
    assert job.requested_cluster is not None and job.requested_cluster.name == "cloud"
    assert job.cluster_selector == {"cost": "cloud"} and job.allow_spot
    refused = _submit(c, requested_cluster="mars")
    assert refused.status_code == 400, refused.content
    assert "Unknown cluster 'mars'" in str(refused.json()["error"]["fields"]["requested_cluster"])
    assert Job.objects.count() == 1
