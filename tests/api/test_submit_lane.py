"""The submit lane (queueing/api/lane.py): a plain token submit runs through the
middleware that applies to it and the fast path; everything it does not decide, and every
other request, is the whole application's, with the same answer; the INSERT is prepared
once per connection (queueing/rawsql.py::statement_cursor).

The lane is a WSGI wrapper (config/wsgi.py), which Django's test client does not go
through: these tests call the WSGI application with the environ the client would send."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from django.test import RequestFactory

from accounts.services import token_issue
from queueing.api.lane import SubmitLane, lane_middleware
from queueing.models import Job, JobEvent
from queueing.rawsql import statement_cursor
from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db


@contextmanager
def _in_test_transaction() -> Iterator[None]:
    """As Django's test client does: the request signals must not close the connection
    that holds the test's transaction."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


class Answer:
    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status_code = int(status.split()[0])
        self.headers = dict(headers)
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def _call(app: Any, key: str, body: Any = None, *, raw: bytes | None = None,
          path: str = "/api/v1/jobs/", method: str = "post", scheme: str = "Token",
          **extra: Any) -> Answer:
    data = raw if raw is not None else json.dumps(job_body() if body is None else body)
    if method == "get":
        request = RequestFactory().get(path, HTTP_AUTHORIZATION=f"{scheme} {key}", **extra)
    else:
        request = RequestFactory().post(path, data=data, content_type="application/json",
                                        HTTP_AUTHORIZATION=f"{scheme} {key}", **extra)
    environ = request.environ
    if method == "post":  # the request above read its copy: the application reads this one
        environ["wsgi.input"] = io.BytesIO(data if isinstance(data, bytes) else data.encode())
    started: list[Any] = []
    with _in_test_transaction():
        result = app(environ, lambda status, headers, exc=None: started.append((status, headers)))
        body_out = b"".join(result)
        getattr(result, "close", lambda: None)()
    return Answer(started[0][0], started[0][1], body_out)


@pytest.fixture
def apps() -> tuple[SubmitLane, list[str]]:
    """The lane around Django's application, and the paths that application served: what
    the lane itself answered never reaches it."""
    plain, served = WSGIHandler(), []

    def application(environ: dict[str, Any], start_response: Any) -> Any:
        served.append(environ["PATH_INFO"])
        return plain(environ, start_response)

    return SubmitLane(application), served


@pytest.fixture
def key(world: World) -> str:
    return token_issue(user=world.member, name="lane").key


def test_the_lanes_answer_is_the_applications(apps: Any, key: str) -> None:
    """Same status, headers (the security middleware's included) and body as the whole
    application, which the Idempotency-Key sends through every middleware and DRF."""
    lane, served = apps
    fast = _call(lane, key)
    assert served == []  # the lane answered it, not the whole application
    full = _call(lane, key, HTTP_IDEMPOTENCY_KEY="k-1")
    assert served == ["/api/v1/jobs/"]
    assert fast.status_code == full.status_code == 201, fast.body
    skip = {"Location", "Content-Length"}
    assert {k: v for k, v in fast.headers.items() if k not in skip} == \
        {k: v for k, v in full.headers.items() if k not in skip}
    for name in ("X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy",
                 "Cross-Origin-Opener-Policy", "Vary", "Allow"):
        assert fast.headers.get(name), name
    assert fast.headers["Location"] == f"/api/v1/jobs/{fast.json()['id']}/"
    differ = {"id", "created_at", "updated_at", "events", "idempotency_key"}
    assert {k: v for k, v in fast.json().items() if k not in differ} == \
        {k: v for k, v in full.json().items() if k not in differ}
    assert Job.objects.count() == 2
    assert JobEvent.objects.filter(job_id=fast.json()["id"], reason="submitted").count() == 1


def test_a_body_the_fast_path_does_not_decide_is_the_applications_400(
        apps: Any, key: str, settings: Any) -> None:
    """Handed over: the body rewound for DRF, its 400 names the field, nothing written, and
    the request is counted once against the rate (the next two fit a rate of 3)."""
    settings.FAIRQ_API_RATE = "3/min"
    lane, served = apps
    r = _call(lane, key, job_body(gpus=0))
    assert served == ["/api/v1/jobs/"]  # handed over
    assert r.status_code == 400, r.body
    assert "gpus" in r.json()["error"]["fields"]
    assert Job.objects.count() == 0
    assert _call(lane, key).status_code == 201
    assert _call(lane, key).status_code == 201
    r = _call(lane, key)
    assert r.status_code == 429, r.body
    assert Job.objects.count() == 2


def test_a_refused_token_is_the_applications_401(apps: Any, world: World) -> None:
    lane, _ = apps
    r = _call(lane, "not-a-token")
    assert r.status_code == 401, r.body
    assert Job.objects.count() == 0


def test_a_bearer_token_is_submitted_by_the_lane(apps: Any, key: str) -> None:
    """`Authorization: Bearer <key>` is the lane's as `Token <key>` is: answered by the
    fast path (the application never sees it), 201."""
    lane, served = apps
    for scheme in ("Bearer", "bearer", "Token"):
        r = _call(lane, key, scheme=scheme)
        assert r.status_code == 201, (scheme, r.body)
    assert served == []
    assert Job.objects.count() == 3


def test_bad_tokens_from_one_address_never_lock_out_a_valid_token_in_the_lane(
        apps: Any, key: str) -> None:
    """The default failure limit (20/min) and one address for everyone (a proxy, with
    FAIRQ_TRUSTED_PROXY_COUNT=0): 25 bad tokens are refused, 401 then 429, and a valid
    token from the same address still submits through the fast path, `Token` or
    `Bearer`."""
    lane, served = apps
    answers = [_call(lane, "fq_nosuch_secret", REMOTE_ADDR="10.9.9.9").status_code
               for _ in range(25)]
    assert answers == [401] * 20 + [429] * 5
    served.clear()
    for scheme in ("Token", "Bearer"):
        r = _call(lane, key, scheme=scheme, REMOTE_ADDR="10.9.9.9")
        assert r.status_code == 201, (scheme, r.body)
    assert served == []  # the fast path answered: no hand-over to a lockout
    assert _call(lane, "fq_nosuch_secret", scheme="Bearer", REMOTE_ADDR="10.9.9.9"
                 ).status_code == 429
    assert Job.objects.count() == 2


def test_the_lanes_middleware_still_refuse(apps: Any, key: str, settings: Any) -> None:
    """The host check, the NUL and size refusals and the HTTPS redirect are the same
    middleware's in the lane."""
    lane, _ = apps
    assert _call(lane, key, HTTP_HOST="evil.example").status_code == 400
    r = _call(lane, key, HTTP_X_TRACE="a\x00b")
    assert r.status_code == 400 and "NUL" in r.json()["error"]["message"], r.body
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    assert _call(lane, key).status_code == 413
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
    settings.SECURE_SSL_REDIRECT = True
    r = _call(SubmitLane(WSGIHandler()), key)
    assert r.status_code == 301 and r.headers["Location"].startswith("https://"), r.headers
    assert Job.objects.count() == 0


def test_the_location_carries_the_script_prefix(apps: Any, key: str) -> None:
    """Behind a proxy that mounts fairq under a path (SCRIPT_NAME), Location has it, as
    `reverse` gives it."""
    lane, _ = apps
    r = _call(lane, key, SCRIPT_NAME="/fq")
    assert r.status_code == 201, r.body
    assert r.headers["Location"] == f"/fq/api/v1/jobs/{r.json()['id']}/"
    r = _call(lane, key)
    assert r.headers["Location"] == f"/api/v1/jobs/{r.json()['id']}/"


def test_other_requests_are_the_applications(apps: Any, key: str) -> None:
    lane, _ = apps
    assert _call(lane, key).status_code == 201
    r = _call(lane, key, method="get", path="/api/v1/jobs/")
    assert r.status_code == 200, r.body
    listed = r.json()
    assert len(listed.get("results", listed)) == 1, listed


def test_the_lane_runs_the_middleware_not_skipped_for_a_reason(settings: Any) -> None:
    """Every MIDDLEWARE entry is in the lane or skipped with a reason; a middleware with
    view hooks cannot be in the lane: it refuses to start rather than drop them."""
    skips = settings.FAIRQ_SUBMIT_LANE_SKIPS
    lane = lane_middleware()
    assert lane == [m for m in settings.MIDDLEWARE if m not in skips]
    assert "django.middleware.security.SecurityMiddleware" in lane
    assert "django.middleware.common.CommonMiddleware" in lane
    assert all(isinstance(reason, str) and reason for reason in skips.values())
    settings.FAIRQ_SUBMIT_LANE_SKIPS = {k: v for k, v in skips.items()
                                        if k != "django.middleware.csrf.CsrfViewMiddleware"}
    with pytest.raises(ImproperlyConfigured, match="CsrfViewMiddleware has process_view"):
        SubmitLane(WSGIHandler())


def test_fast_submit_off_sends_every_submit_to_the_application(
        apps: Any, key: str, settings: Any) -> None:
    settings.FAIRQ_FAST_SUBMIT = False
    lane, _ = apps
    assert _call(lane, key).status_code == 201
    assert Job.objects.count() == 1


def _prepared() -> list[str]:
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cur.fetchall()]


def test_the_submit_insert_is_prepared_once_per_connection(apps: Any, key: str) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements: PostgreSQL only")
    lane, _ = apps
    assert _call(lane, key).status_code == 201
    before = _prepared()
    assert [s for s in before if 'INSERT INTO "queueing_job"' in s]
    for _ in range(3):
        assert _call(lane, key).status_code == 201
    assert _prepared() == before  # the same statement, executed again
    # Another shape of job (other NULLs in the text) is a statement of its own, also right.
    body = {k: v for k, v in job_body(working_dir="/w").items() if k != "max_runtime_seconds"}
    r = _call(lane, key, body)
    assert r.status_code == 201, r.body
    job = Job.objects.get(pk=r.json()["id"])
    assert (job.max_runtime_seconds, job.working_dir) == (None, "/w")
    assert Job.objects.count() == 5


def test_prepare_off_is_djangos_own_cursor(settings: Any) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements: PostgreSQL only")
    import psycopg

    with statement_cursor() as cur:
        assert not isinstance(cur.cursor, psycopg.ClientCursor)  # binds on the server
    settings.FAIRQ_DB_PREPARE = False
    with statement_cursor() as cur:
        assert isinstance(cur.cursor, psycopg.ClientCursor)  # Django's default


def test_a_rule_refusal_handed_over_by_the_lane_counts_once(
        apps: Any, key: str, settings: Any) -> None:
    """A body the fast path shapes but a submit rule refuses (an unknown GPU type): the
    lane counted it, the application answers the 400 without trying the fast path again,
    so the request is counted once (the next two fit a rate of 3) and decided once."""
    settings.FAIRQ_API_RATE = "3/min"
    lane, served = apps
    r = _call(lane, key, job_body(gpu_type="no-such-gpu"))
    assert served == ["/api/v1/jobs/"]  # handed over
    assert r.status_code == 400, r.body
    assert "gpu_type" in r.json()["error"]["fields"]
    assert _call(lane, key).status_code == 201
    assert _call(lane, key).status_code == 201
    r = _call(lane, key)
    assert r.status_code == 429, r.body
    assert Job.objects.count() == 2
