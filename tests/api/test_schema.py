"""The OpenAPI schema: the committed docs/openapi.yaml matches the code, and the API
keeps it (schemathesis: no 5xx, documented status codes, bodies matching the schema)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from django.core.management import call_command
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from django.test import override_settings
from hypothesis import HealthCheck, settings
from rest_framework.test import APIClient
from schemathesis.config import SchemathesisConfig

from accounts.services import token_issue
from tests.conftest import World

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
REGENERATE = ("manage.py spectacular --file docs/openapi.yaml --settings=config.settings.test")


def _generated() -> str:
    out = io.StringIO()
    call_command("spectacular", stdout=out, settings="config.settings.test")
    return out.getvalue()


def test_committed_schema_is_up_to_date() -> None:
    committed = SCHEMA_FILE.read_text()
    assert yaml.safe_load(_generated()) == yaml.safe_load(committed), (
        f"docs/openapi.yaml is out of date: run `.venv/bin/python {REGENERATE}` and commit it")


def test_schema_and_swagger_ui_are_served_without_a_cdn(db: None) -> None:
    c = APIClient()
    r = c.get("/api/v1/schema/")
    assert r.status_code == 200
    assert b"openapi: 3" in r.content
    html = c.get("/api/v1/docs/").content.decode()
    assert "swagger-ui" in html
    assert "cdn.jsdelivr.net" not in html
    assert "unpkg.com" not in html
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html


def test_every_post_documents_idempotency_key_and_the_error_shape() -> None:
    doc = yaml.safe_load(SCHEMA_FILE.read_text())
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method == "post":
                names = [p["name"] for p in op.get("parameters", [])]
                assert "Idempotency-Key" in names, path
            assert "401" in op["responses"], (method, path)


# --- schemathesis --------------------------------------------------------------------
#
# Every check schemathesis has (its defaults: server errors, status codes, content types,
# headers and bodies against the schema, positive and negative data, missing required
# headers, unsupported methods, Allow headers, ignored auth, use after free, resource
# availability, object-level authorization), in two phases and two identities:
#
# * per operation (`api.parametrize()`): examples, coverage and fuzzing of each operation;
# * stateful (`api.as_state_machine()`): chains of calls following the links schemathesis
#   infers from the schema (create a team, then read, patch and list its members ...).
#
# Three settings differ from the defaults, each for a documented behaviour:
# * `positive_data_acceptance` also expects 400 and 422. A schema-valid body may name a
#   team, GPU type, tier or user that does not exist (the schema cannot list them), rightly
#   a 400 with the field; generated requests may send one `Idempotency-Key` with two
#   different bodies, rightly a 422.
# * `use_after_free` is off for /tokens/{token_id}/ only: DELETE revokes a token, which
#   stays listed with `active: false` (docs/api.md), so a GET after it answers 200.
# * The limit on failed token authentication is off (FAIRQ_API_AUTH_FAILURE_RATE=""):
#   `ignored_auth` sends invalid `Token` and `Bearer` credentials to every operation from
#   one address, rightly 429 past 20 a minute (tests/security/test_limits.py proves that
#   limit), where the check expects 401.
#
# Budget (2 cores shared, CI): per-operation 6 examples as staff and 3 as a member; the
# stateful phase 25 chains of at most 8 calls per identity (~170 calls). 65-100 s in all on
# a shared 2-core machine, the stateful part ~12 s of it.

POSITIVE_DATA_STATUSES = ["2xx", "3xx", "400", "401", "403", "404", "409", "422", "429"]

api = schemathesis.openapi.from_dict(
    yaml.safe_load(SCHEMA_FILE.read_text()),
    config=SchemathesisConfig.from_dict({
        "checks": {"positive_data_acceptance": {"expected-statuses": POSITIVE_DATA_STATUSES}},
        "operations": [{"include-path": "/api/v1/tokens/{token_id}/",
                        "checks": {"use_after_free": {"enabled": False}}}],
    }),
)
api.app = get_wsgi_application()  # pytest-django has configured Django by import time

# The user of the running test, for the auth provider below.
_IDENTITY: dict[str, Any] = {}


@api.auth(refresh_interval=None)
class _TestIdentity:
    """The running test's token as schemathesis' own auth, so it knows the credentials
    are real (and the `ignored_auth` check can probe without them). The stateful phase
    may revoke that very token (DELETE /tokens/{id}/): the next call gets a fresh one."""

    def get(self, case: Any, ctx: Any) -> str:
        token = _IDENTITY.get("token")
        if token is None:
            return "Token (no test running)"  # collection asks too
        token.token.refresh_from_db(fields=["revoked_at"])
        if token.token.revoked_at is not None:
            token = _IDENTITY["token"] = token_issue(user=_IDENTITY["user"])
        return f"Token {token.key}"

    def set(self, case: Any, data: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": data}


@pytest.fixture
def _keep_test_connection() -> Iterator[None]:
    """The WSGI app fires request_started/finished, whose close_old_connections would
    close the test's PostgreSQL connection mid-transaction; Django's own test client
    disconnects it the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _as(user: Any) -> Iterator[None]:
    _IDENTITY.update(user=user, token=token_issue(user=user))
    with override_settings(FAIRQ_API_AUTH_FAILURE_RATE=""):
        yield
    _IDENTITY.clear()


@pytest.fixture
def as_staff(world: World, _keep_test_connection: None) -> Iterator[None]:
    yield from _as(world.staff)


@pytest.fixture
def as_member(world: World, _keep_test_connection: None) -> Iterator[None]:
    yield from _as(world.member)


SETTINGS = {"deadline": None, "derandomize": True, "suppress_health_check": list(HealthCheck)}


@api.parametrize()
@settings(max_examples=6, **SETTINGS)
def test_api_keeps_its_schema_for_staff(case: Any, as_staff: None) -> None:
    case.call_and_validate()


@api.parametrize()
@settings(max_examples=3, **SETTINGS)
def test_api_keeps_its_schema_for_a_member(case: Any, as_member: None) -> None:
    case.call_and_validate()


STATEFUL = settings(max_examples=25, stateful_step_count=8, **SETTINGS)


def _call_chains() -> Any:
    class CallChains(api.as_state_machine()):  # type: ignore[misc]
        """Every chain starts from the same database (a savepoint, rolled back after it):
        Hypothesis replays chains, and one that found the team it created already there
        (a 400 instead of a 201) would follow other links ("inconsistent data")."""

        def setup(self) -> None:
            super().setup()
            self._savepoint = transaction.savepoint()
            self._identity = dict(_IDENTITY)

        def teardown(self) -> None:
            transaction.savepoint_rollback(self._savepoint)
            _IDENTITY.update(self._identity)
            super().teardown()

    return CallChains


def test_api_keeps_its_schema_through_call_chains_for_staff(as_staff: None) -> None:
    _call_chains().run(settings=STATEFUL)


def test_api_keeps_its_schema_through_call_chains_for_a_member(as_member: None) -> None:
    _call_chains().run(settings=STATEFUL)
