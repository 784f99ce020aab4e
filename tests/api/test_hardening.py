"""Hardening: a token's secret exists only in the answer that creates it; array
jobs are bounded in what they write; hostile input answers 4xx in the one error shape,
never 500; unknown fields in a write body are refused by name."""

from __future__ import annotations

import json
import pickle
from typing import Any

import pytest
from django.contrib.sessions.models import Session
from django.core.cache import caches
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import ApiToken, AuditEntry, IdempotencyRecord
from queueing.models import Job
from tests.conftest import World, job_body


def _post(client: APIClient, url: str, body: Any, key: str | None = None) -> Any:
    extra = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(url, body, format="json", **extra)


def _assert_error_shape(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.content[:300])
    assert r["Content-Type"].startswith("application/json"), r["Content-Type"]
    error: dict[str, Any] = r.json()["error"]
    assert error["status"] == status
    return error


# --- 12.2 secrets at rest --------------------------------------------------------------------


def cache_blobs() -> list[bytes]:
    """Every value in this test run's cache, raw (Redis: our key prefix only)."""
    backend: Any = caches["default"]
    if "redis" in type(backend).__module__:
        client = backend.client.get_client()
        prefix = backend.key_prefix
        return [client.get(k) or b"" for k in client.scan_iter(match=f"{prefix}*")]
    return [pickle.dumps(v) if not isinstance(v, bytes) else v
            for v in backend._cache.values()]


def assert_secret_nowhere(secret: str) -> None:
    """Not in the idempotency table, a decoded session, the cache or the audit log."""
    assert secret.startswith("fq_")
    for record in IdempotencyRecord.objects.all():
        assert secret not in json.dumps(record.body), record.key
        assert secret not in record.key
    for session in Session.objects.all():
        assert secret not in json.dumps(session.get_decoded(), default=str)
    for blob in cache_blobs():
        assert secret.encode() not in blob
    for entry in AuditEntry.objects.all():
        assert secret not in json.dumps(entry.changes)


@pytest.mark.parametrize("key", [None, "tok-1"])
def test_a_new_tokens_secret_is_kept_nowhere(world: World, key: str | None) -> None:
    c = world.client(world.member)
    r = _post(c, "/api/v1/tokens/", {"name": "ci"}, key=key)
    assert r.status_code == 201
    secret = r.json()["key"]
    token = ApiToken.objects.get(user=world.member, name="ci")
    assert secret.startswith(f"fq_{token.prefix}_")
    assert_secret_nowhere(secret)


def test_a_replayed_token_creation_says_the_secret_was_shown_once(world: World) -> None:
    c = world.client(world.member)
    first = _post(c, "/api/v1/tokens/", {"name": "ci"}, key="tok-1")
    again = _post(c, "/api/v1/tokens/", {"name": "ci"}, key="tok-1")
    assert first.status_code == 201
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    body = again.json()
    secret = first.json()["key"]
    assert secret not in again.content.decode()
    assert body["key"] is None
    assert "shown once" in body["message"]
    assert body["id"] == first.json()["id"]
    assert world.member.api_tokens.filter(name="ci").count() == 1
    assert_secret_nowhere(secret)


def test_a_web_tokens_secret_is_shown_in_the_answer_and_kept_nowhere(world: World) -> None:
    c = Client()
    c.force_login(world.member)
    r = c.post("/teams/vision/tokens/", {"name": "web"})
    token = ApiToken.objects.get(user=world.member, name="web")
    html = r.content.decode()
    assert r.status_code == 200
    start = html.index(f"fq_{token.prefix}_")
    secret = html[start:].split("<", 1)[0].split('"', 1)[0].strip()
    assert ApiToken.hash_key(secret) == token.key_hash
    assert "no-store" in r.get("Cache-Control", "")
    assert_secret_nowhere(secret)
    assert secret not in c.get("/teams/vision/").content.decode()


# --- 12.5 amplification --------------------------------------------------------------------


def test_an_array_job_may_not_multiply_a_large_spec(world: World) -> None:
    """120 KB of env × 1,000 members wrote 124 MB; the product is bounded."""
    from queueing.services.jobs import MAX_ARRAY_BYTES

    env = {f"V{i}": "x" * 30_000 for i in range(4)}  # ~120 KB, under MAX_SPEC_BYTES
    r = _post(world.client(world.member), "/api/v1/jobs/bulk/",
              job_body(env=env, count=1000, name="amp"))
    error = _assert_error_shape(r, 400)
    assert "count" in error["fields"]
    assert f"{MAX_ARRAY_BYTES // (1024 * 1024)} MiB" in error["fields"]["count"][0]
    assert Job.objects.count() == 0


def test_the_array_bound_counts_volumes_secrets_labels_and_annotations(world: World) -> None:
    """A small env but 8 KiB of annotations (the most one job may carry) × 10,000 members
    would store 80 MB: refused on `count`."""
    from accounts.models import Team

    Team.objects.filter(pk=world.vision.pk).update(allowed_secrets=["s"])
    body = job_body(count=10_000, name="amp",
                    annotations={f"k{i}": "x" * 500 for i in range(16)},
                    secrets=[{"secret": "s", "key": "k", "env": f"S{i}"} for i in range(32)])
    r = _post(world.client(world.member), "/api/v1/jobs/bulk/", body)
    error = _assert_error_shape(r, 400)
    assert "count" in error["fields"] and "annotations" in error["fields"]["count"][0]
    assert Job.objects.count() == 0


def test_the_array_bound_holds_in_the_service_too(world: World) -> None:
    from queueing.errors import DomainError
    from queueing.services.jobs import JobInput, jobs_submit_bulk

    data = JobInput(team=world.vision, name="amp", image="ghcr.io/acme/train:1", command=[],
                    args=[], env={"V": "x" * 30_000}, gpu_type=world.h100, gpus_per_replica=1,
                    replicas=1, tier=world.normal, max_runtime_seconds=None)
    with pytest.raises(DomainError) as exc:
        jobs_submit_bulk(actor=world.member, data=data, count=1000)
    assert "count" in exc.value.fields
    assert Job.objects.count() == 0


def test_an_array_job_within_the_bound_is_queued(world: World) -> None:
    from queueing.services.jobs import ARRAY_SUBMIT_WINDOW, MAX_ARRAY_BYTES

    env = {"V": "x" * 30_000}
    count = MAX_ARRAY_BYTES // 31_000 - 10
    r = _post(world.client(world.member), "/api/v1/jobs/bulk/",
              job_body(env=env, count=count, name="ok"))
    assert r.status_code == 201, r.content[:300]
    assert r.json()["count"] == count  # its first members are jobs now, the rest later
    assert Job.objects.count() == len(r.json()["ids"]) == min(count, ARRAY_SUBMIT_WINDOW)


# --- 12.6 no 500s ----------------------------------------------------------------------------


def test_deeply_nested_json_is_a_400(world: World) -> None:
    c = world.client(world.member)
    deep = "[" * 100_000 + "]" * 100_000
    for url in ("/api/v1/jobs/", "/api/v1/tokens/"):
        r = c.post(url, deep, content_type="application/json")
        _assert_error_shape(r, 400)
    r = c.post("/api/v1/jobs/", '{"env": ' + "{\"a\": " * 50_000 + "1" + "}" * 50_001,
               content_type="application/json")
    _assert_error_shape(r, 400)


@pytest.mark.parametrize("url", [
    "/api/v1/jobs/?team=%00",
    "/api/v1/jobs/?name=a%00b",
    "/api/v1/jobs/?submitter=%00",
    "/api/v1/quotas/?team=%00",
    "/api/v1/usage/?team=%00",
    "/api/v1/teams/vision/members/%00/",
    "/api/v1/teams/vision%00/",
])
def test_nul_in_query_and_path_is_a_400(world: World, url: str) -> None:
    r = world.client(world.staff).get(url)
    _assert_error_shape(r, 400)


@pytest.mark.parametrize(("method", "url", "body"), [
    ("post", "/api/v1/quotas/", {"team": "\x00", "gpu_type": "h100", "nominal": 1}),
    ("post", "/api/v1/quotas/", {"team": "vision", "gpu_type": "h\x00", "nominal": 1}),
    ("patch", "/api/v1/teams/vision/", {"parent": "\x00"}),
    ("post", "/api/v1/teams/", {"slug": "x", "name": "x", "parent": "n\x00lp"}),
    ("post", "/api/v1/teams/vision/members/", {"username": "\x00"}),
    ("post", "/api/v1/jobs/", job_body(env={"A": "b\x00"})),
])
def test_nul_in_a_json_body_is_a_400(world: World, method: str, url: str,
                                     body: dict[str, Any]) -> None:
    r = getattr(world.client(world.staff), method)(url, body, format="json")
    _assert_error_shape(r, 400)


def test_nul_in_a_form_body_is_refused(world: World) -> None:
    r = world.client(world.staff).post("/api/v1/tokens/", {"name": "a\x00"}, format="multipart")
    assert r.status_code in {400, 415}
    r = world.client(world.staff).post("/api/v1/quotas/", "team=%00&gpu_type=h100&nominal=1",
                                       content_type="application/x-www-form-urlencoded")
    _assert_error_shape(r, 415)


@pytest.mark.parametrize("fmt", ["multipart", "form"])
def test_the_api_takes_json_bodies_only(world: World, fmt: str) -> None:
    """A blank form field read as an omitted one: `name=` made a token named 'default'."""
    c = world.client(world.member)
    before = world.member.api_tokens.count()
    if fmt == "multipart":
        r = c.post("/api/v1/tokens/", {"name": ""}, format="multipart")
    else:
        r = c.post("/api/v1/tokens/", "name=", content_type="application/x-www-form-urlencoded")
    assert _assert_error_shape(r, 415)["code"] == "unsupported_media_type"
    assert world.member.api_tokens.count() == before


@pytest.mark.parametrize("url", [
    "/api/v1/jobs/?updated_after=2026-01-05T08:00:00%2B16:00",
    "/api/v1/jobs/?updated_after=2026-01-05T08:00:00-23:59",
    "/api/v1/fairshare/?at=2099-01-05T08:00:00%2B20:00",
    "/api/v1/usage/?from=2026-01-05T08:00:00%2B20:00",
])
def test_offsets_postgres_refuses_are_normalized(world: World, url: str) -> None:
    r = world.client(world.staff).get(url)
    assert r.status_code == 200, r.content[:300]


@pytest.mark.parametrize("url", [
    "/api/v1/jobs/?updated_after=0001-01-01T00:00:00%2B20:00",
    "/api/v1/jobs/?updated_after=9999-12-31T23:59:59-20:00",
    "/api/v1/fairshare/?at=0001-01-01T00:00:00%2B20:00",
    "/api/v1/fairshare/?at=9999-12-31T23:59:59-20:00",
    "/api/v1/jobs/?updated_after=2026-01-05T08:00:00",
    "/api/v1/jobs/?updated_after=",  # present but empty: not an instant (schema: date-time)
    "/api/v1/fairshare/?at=",
    "/api/v1/usage/?from=",
])
def test_instants_out_of_range_or_naive_are_a_400(world: World, url: str) -> None:
    error = _assert_error_shape(world.client(world.staff).get(url), 400)
    assert error["fields"]


def test_a_body_over_the_size_limit_gets_the_json_error_shape(
        world: World, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = job_body(env={"A": "x" * 20_000})
    c = world.client(world.member)
    _assert_error_shape(_post(c, "/api/v1/jobs/", body), 413)
    _assert_error_shape(_post(c, "/api/v1/jobs/", body, key="big"), 413)
    assert not IdempotencyRecord.objects.exists()


# --- unknown fields ---------------------------------------------------------------------------


# (`volumes` is a job field (docs/kubernetes.md, "Volumes and secrets"): its hostPath is refused by name in
# tests/api/test_hostile_specs.py.)
@pytest.mark.parametrize("field", ["privileged", "hostNetwork", "hostPath", "securityContext"])
def test_unknown_job_fields_are_refused_by_name(world: World, field: str) -> None:
    c = world.client(world.member)
    for url, body in (("/api/v1/jobs/", job_body()), ("/api/v1/jobs/bulk/", job_body(count=2))):
        r = _post(c, url, {**body, field: True})
        error = _assert_error_shape(r, 400)
        assert error["fields"][field] == ["Unknown field."]
    assert Job.objects.count() == 0


@pytest.mark.parametrize(("method", "url", "body"), [
    ("post", "/api/v1/tokens/", {"name": "x", "scope": "admin"}),
    ("post", "/api/v1/teams/", {"slug": "x", "name": "x", "owner": "root"}),
    ("patch", "/api/v1/teams/vision/", {"weight": 2, "slug": "other"}),
    ("post", "/api/v1/teams/vision/members/", {"username": "bob", "is_staff": True}),
    ("patch", "/api/v1/teams/vision/members/dave/", {"role": "member", "team": "nlp"}),
    ("post", "/api/v1/quotas/", {"team": "vision", "gpu_type": "h100", "nominal": 1, "x": 1}),
    ("post", "/api/v1/quotas/", {"team": "vision", "gpu_type": "h100", "nominal": 1, "id": 7}),
])
def test_every_write_serializer_refuses_unknown_fields(world: World, method: str, url: str,
                                                       body: dict[str, Any]) -> None:
    r = getattr(world.client(world.staff), method)(url, body, format="json")
    error = _assert_error_shape(r, 400)
    known = {"name", "slug", "weight", "username", "role", "team", "gpu_type", "nominal"}
    assert [f for f in error["fields"] if f not in known] == [k for k in body if k not in known]


def test_the_schema_closes_every_request_body() -> None:
    import yaml

    from tests.api.test_schema import SCHEMA_FILE

    doc = yaml.safe_load(SCHEMA_FILE.read_text())
    schemas = doc["components"]["schemas"]
    seen = 0
    for item in doc["paths"].values():
        for op in item.values():
            body = op.get("requestBody") if isinstance(op, dict) else None
            if not body:
                continue
            for media in body["content"].values():
                name = media["schema"]["$ref"].rsplit("/", 1)[1]
                assert schemas[name].get("additionalProperties") is False, name
                seen += 1
    assert seen >= 8


def test_nul_in_a_header_is_a_400(world: World) -> None:
    c = world.client(world.member)
    r = c.post("/api/v1/tokens/", {"name": "x"}, format="json", HTTP_IDEMPOTENCY_KEY="a\x00b")
    assert _assert_error_shape(r, 400)["fields"] == {"Idempotency-Key": [
        "NUL characters are not allowed."]}
    assert not IdempotencyRecord.objects.exists()
