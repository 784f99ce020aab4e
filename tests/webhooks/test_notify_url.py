"""A job's own notify_url (docs/webhooks.md): accepted only under the team's
allowed_notify_url_prefixes (set by team admins in the workload policy) and with a notify
secret; delivered signed with that secret."""

from __future__ import annotations

import pytest

from accounts.models import AuditEntry
from queueing.models import WebhookDelivery
from tests.conftest import job_body

from .receiver import receiver

pytestmark = pytest.mark.django_db


def _allow(client, prefixes):
    return client.patch(
        "/api/v1/teams/vision/workload-policy/", {"allowed_notify_url_prefixes": prefixes}, format="json"
    )


def test_a_notify_url_not_allowlisted_is_refused_with_a_field_message(world):
    admin = world.client(world.admin)
    r = admin.post("/api/v1/jobs/", job_body(notify_url="https://ci.example.com/hooks/1"), format="json")
    assert r.status_code == 400
    assert "allowed_notify_url_prefixes" in r.json()["error"]["fields"]["notify_url"][0]
    assert _allow(admin, ["https://ci.example.com/hooks/"]).status_code == 200
    # A look-alike host does not pass a prefix that ends with '/'.
    r = admin.post("/api/v1/jobs/", job_body(notify_url="https://ci.example.com.evil.net/x"), format="json")
    assert r.status_code == 400 and r.json()["error"]["fields"]["notify_url"]
    # Allowed, but no notify secret yet: still refused, saying how to make one.
    r = admin.post("/api/v1/jobs/", job_body(notify_url="https://ci.example.com/hooks/1"), format="json")
    assert r.status_code == 400 and "notify-secret" in r.json()["error"]["fields"]["notify_url"][0]
    assert admin.post("/api/v1/teams/vision/webhooks/notify-secret/").status_code == 200
    r = admin.post("/api/v1/jobs/", job_body(notify_url="https://ci.example.com/hooks/1"), format="json")
    assert r.status_code == 201 and r.json()["notify_url"] == "https://ci.example.com/hooks/1"


@pytest.mark.parametrize(
    "prefixes",
    [
        ["https://ci.example.com"],
        ["ftp://ci.example.com/"],
        ["https://ci.example.com/?a=1/"],
        "https://x.com/",
        ["https://a.example.com/", "https://a.example.com/"],
    ],
)
def test_bad_prefixes_are_refused(world, prefixes):
    r = _allow(world.client(world.admin), prefixes)
    assert r.status_code == 400 and r.json()["error"]["fields"]["allowed_notify_url_prefixes"]


def test_members_cannot_set_the_prefixes_and_changes_are_audited(world):
    assert _allow(world.client(world.member), ["https://ci.example.com/"]).status_code == 403
    admin = world.client(world.admin)
    assert _allow(admin, ["https://ci.example.com/"]).status_code == 200
    assert admin.get("/api/v1/teams/vision/workload-policy/").json()["allowed_notify_url_prefixes"] == [
        "https://ci.example.com/"
    ]
    entry = AuditEntry.objects.filter(object_type="accounts.Team").latest("id")
    assert entry.changes["allowed_notify_url_prefixes"] == [[], ["https://ci.example.com/"]]


def test_the_notify_url_gets_each_change_signed_with_the_notify_secret(
    world, django_capture_on_commit_callbacks
):
    admin = world.client(world.admin)
    with receiver() as rx:
        assert _allow(admin, [rx.url]).status_code == 200
        answer = admin.post("/api/v1/teams/vision/webhooks/notify-secret/").json()
        assert answer["secret"].startswith("whsec_")
        assert "secret" not in admin.get("/api/v1/teams/vision/webhooks/notify-secret/").json()
        rx.secret = answer["secret"]
        with django_capture_on_commit_callbacks(execute=True):
            r = admin.post("/api/v1/jobs/", job_body(notify_url=f"{rx.url}job"), format="json")
        assert r.status_code == 201
        with django_capture_on_commit_callbacks(execute=True):
            admin.post(f"/api/v1/jobs/{r.json()['id']}/cancel/")
    assert [g.path for g in rx.received] == ["/hooks/job", "/hooks/job"]
    assert [g.verified["type"] for g in rx.received] == ["job.queued", "job.cancelled"]
    log = admin.get("/api/v1/teams/vision/webhooks/notify-deliveries/").json()
    assert {d["status"] for d in log} == {"succeeded"} and len(log) == 2
    assert all(d["endpoint"] is None for d in log)
    assert WebhookDelivery.objects.filter(endpoint__isnull=True).count() == 2
