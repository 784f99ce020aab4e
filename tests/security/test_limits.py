"""The client address behind trusted proxies, per-user API buckets and the
limit on failed token authentication (docs/api.md, "Rate limits")."""

from __future__ import annotations

import pytest
from django.test import RequestFactory, override_settings
from rest_framework.test import APIClient

from accounts.client_ip import client_ip
from accounts.services import token_issue
from tests.conftest import World

# --- one client address ---------------------------------------------------------------


@pytest.mark.parametrize(("count", "xff", "expected"), [
    (0, "", "10.0.0.9"),
    (0, "1.2.3.4", "10.0.0.9"),                      # no trusted proxy: the header is noise
    (1, "1.2.3.4", "1.2.3.4"),                       # the ingress appended the client
    (1, "6.6.6.6, 1.2.3.4", "1.2.3.4"),              # a forged left part is ignored
    (2, "6.6.6.6, 1.2.3.4, 10.1.1.1", "1.2.3.4"),    # two proxies: second from the right
    (2, "1.2.3.4", "10.0.0.9"),                      # fewer entries than proxies: not via them
    (1, "not-an-address", "10.0.0.9"),               # garbage: the peer's address
    (1, "2001:DB8::1", "2001:db8::1"),               # normalized
    (1, "1.2.3.4\x00", "10.0.0.9"),
])
def test_client_ip_trusts_only_the_configured_proxies(count: int, xff: str, expected: str) -> None:
    extra = {"HTTP_X_FORWARDED_FOR": xff} if xff else {}
    request = RequestFactory().get("/", REMOTE_ADDR="10.0.0.9", **extra)
    with override_settings(FAIRQ_TRUSTED_PROXY_COUNT=count):
        assert client_ip(request) == expected


# Rates per hour, not per minute: the buckets are fixed windows, and a test that counts
# requests must not straddle a window's edge (with "2/min" the third request of a run
# that crossed a minute boundary was let through: a flaky CI failure).
@override_settings(FAIRQ_API_ANON_RATE="2/hour")
def test_a_forged_x_forwarded_for_does_not_reset_the_anonymous_limit(world: World) -> None:
    c = APIClient()
    codes = [c.get("/api/v1/schema/", HTTP_X_FORWARDED_FOR=f"9.9.9.{i}").status_code
             for i in range(3)]
    assert codes == [200, 200, 429]


@override_settings(FAIRQ_API_ANON_RATE="2/hour", FAIRQ_TRUSTED_PROXY_COUNT=1)
def test_behind_one_proxy_each_client_address_has_its_bucket(world: World) -> None:
    c = APIClient()

    def get(client: str) -> int:
        return c.get("/api/v1/schema/", REMOTE_ADDR="10.0.0.2",
                     HTTP_X_FORWARDED_FOR=f"6.6.6.6, {client}").status_code

    assert [get("1.1.1.1") for _ in range(3)] == [200, 200, 429]
    assert get("2.2.2.2") == 200


# --- one bucket per user ---------------------------------------------------------------


@override_settings(FAIRQ_API_RATE="3/hour")
def test_throttling_is_one_bucket_per_user_across_tokens(world: World) -> None:
    a = world.client(world.member)
    b = world.client(world.member)  # another token of the same user: the same bucket
    assert [a.get("/api/v1/tiers/").status_code for _ in range(2)] == [200, 200]
    assert b.get("/api/v1/tiers/").status_code == 200
    r = b.get("/api/v1/tiers/")
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "throttled"
    assert world.client(world.admin).get("/api/v1/tiers/").status_code == 200


# --- failed token authentication -------------------------------------------------------


def _bad(c: APIClient, ip: str = "10.0.0.7") -> object:
    return c.get("/api/v1/tiers/", HTTP_AUTHORIZATION="Token fq_nope_guess", REMOTE_ADDR=ip)


def test_bad_tokens_from_one_address_never_lock_out_a_valid_token(world: World) -> None:
    """The default limit (20/min): 25 bad tokens from the address every client shares
    (a proxy with FAIRQ_TRUSTED_PROXY_COUNT=0) are refused, 401 then 429; a valid token
    from that address still works, as `Token` and as `Bearer`, and is not counted."""
    key = token_issue(user=world.member).key
    c = APIClient()
    answers = [_bad(c, ip="10.0.0.1").status_code for _ in range(25)]  # type: ignore[attr-defined]
    assert answers == [401] * 20 + [429] * 5
    for scheme in ("Token", "Bearer", "bearer"):
        r = c.get("/api/v1/tiers/", HTTP_AUTHORIZATION=f"{scheme} {key}",
                  REMOTE_ADDR="10.0.0.1")
        assert r.status_code == 200, (scheme, r.content)
    assert _bad(c, ip="10.0.0.1").status_code == 429  # type: ignore[attr-defined]
    r = c.get("/api/v1/tiers/", HTTP_AUTHORIZATION="Bearer fq_nope_guess", REMOTE_ADDR="10.0.0.1")
    assert r.status_code == 429  # a bad Bearer token is counted and refused alike


@override_settings(FAIRQ_API_AUTH_FAILURE_RATE="3/hour")
def test_failed_token_authentication_is_limited_per_client_address(world: World) -> None:
    c = APIClient()
    assert [_bad(c).status_code for _ in range(3)] == [401, 401, 401]  # type: ignore[attr-defined]
    r = _bad(c)
    assert r.status_code == 429  # type: ignore[attr-defined]
    body = r.json()  # type: ignore[attr-defined]
    assert body["error"]["code"] == "throttled" and body["error"]["status"] == 429
    assert int(r["Retry-After"]) > 0  # type: ignore[index]
    # Over the limit a right token from that address still works (it is checked before
    # the address's count applies)...
    good = world.client(world.member)
    assert good.get("/api/v1/tiers/", REMOTE_ADDR="10.0.0.7").status_code == 200
    assert _bad(c).status_code == 429  # type: ignore[attr-defined]
    # ...and other addresses are not affected.
    assert good.get("/api/v1/tiers/", REMOTE_ADDR="10.0.0.8").status_code == 200
    assert _bad(c, ip="10.0.0.8").status_code == 401  # type: ignore[attr-defined]


@override_settings(FAIRQ_API_AUTH_FAILURE_RATE="3/hour")
def test_successful_token_requests_do_not_count_as_failures(world: World) -> None:
    good = world.client(world.member)
    for _ in range(5):
        assert good.get("/api/v1/tiers/", REMOTE_ADDR="10.0.0.7").status_code == 200
    assert _bad(APIClient()).status_code == 401  # type: ignore[attr-defined]


@override_settings(FAIRQ_API_AUTH_FAILURE_RATE="2/hour", FAIRQ_TRUSTED_PROXY_COUNT=1)
def test_the_failure_limit_uses_the_client_address_behind_the_proxy(world: World) -> None:
    c = APIClient()

    def bad(client: str) -> int:
        return c.get("/api/v1/tiers/", HTTP_AUTHORIZATION="Token fq_nope_guess",
                     REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=client).status_code

    assert [bad("1.1.1.1") for _ in range(3)] == [401, 401, 429]
    assert bad("2.2.2.2") == 401


# --- audit records carry the client address -----------------------------------------------


@override_settings(FAIRQ_TRUSTED_PROXY_COUNT=1)
def test_audit_entries_record_the_client_address(world: World) -> None:
    from accounts.models import AuditEntry

    r = world.client(world.staff).patch("/api/v1/teams/vision/", {"weight": 5.0}, format="json",
                                        REMOTE_ADDR="10.0.0.2",
                                        HTTP_X_FORWARDED_FOR="6.6.6.6, 1.2.3.4")
    assert r.status_code == 200, r.content
    entry = AuditEntry.objects.get(object_type="accounts.Team", action="update")
    assert entry.ip == "1.2.3.4"
    assert entry.changes["weight"] == [3.0, 5.0]


def test_a_bearer_token_authenticates_as_a_token_does(world: World) -> None:
    """`Authorization: Bearer <key>` (RFC 6750) on the DRF path: reads, and a submit the
    fast path leaves to DRF (an Idempotency-Key); a bad one is a 401 as with `Token`."""
    from tests.conftest import job_body

    key = token_issue(user=world.member).key
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    assert c.get("/api/v1/tiers/").status_code == 200
    r = c.post("/api/v1/jobs/", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="bearer-1")
    assert r.status_code == 201, r.content
    assert r.json()["submitter"] == world.member.username
    r = APIClient().get("/api/v1/tiers/", HTTP_AUTHORIZATION="Bearer fq_nope_guess")
    assert r.status_code == 401
    assert r.json()["error"]["message"] == "Invalid token."
