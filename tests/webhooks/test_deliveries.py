"""Webhooks end to end (docs/webhooks.md): a real HTTP receiver on 127.0.0.1 verifies
every POST with the `standardwebhooks` package; the Celery tasks run for real (eager),
and the retry schedule is driven by the test's clock (`_tick`: what beat's `webhooks-due`
finds due at a test instant, tried as `webhook_deliver_task` tries it, at that instant)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from accounts.models import AuditEntry
from queueing.models import Job, WebhookAttempt, WebhookDelivery
from queueing.services import webhooks as wh
from tests.conftest import job_body

from .receiver import receiver

pytestmark = pytest.mark.django_db


def _tick(now: Any) -> list[WebhookAttempt]:
    """The tries due at `now` (the test's clock), made at `now`."""
    tried = [wh.webhook_attempt(delivery_id=i, now=now) for i in wh.webhooks_due(now=now)]
    return [a for a in tried if a is not None]


def _endpoint(client: Any, url: str, **extra: Any) -> dict[str, Any]:
    r = client.post("/api/v1/teams/vision/webhooks/", {"url": url, **extra}, format="json")
    assert r.status_code == 201, r.content
    return r.json()


def _submit(client: Any, capture: Any, **overrides: Any) -> dict[str, Any]:
    with capture(execute=True):
        r = client.post("/api/v1/jobs/", job_body(**overrides), format="json")
    assert r.status_code == 201, r.content
    return r.json()


def test_it_retries_after_a_500_and_logs_both_tries(world, django_capture_on_commit_callbacks):
    admin = world.client(world.admin)
    with receiver(answers=[500]) as rx:
        created = _endpoint(admin, rx.url, description="CI")
        rx.secret = created["secret"]
        job = _submit(admin, django_capture_on_commit_callbacks)

        # The first try ran after the submit committed: the receiver verified it and said 500.
        assert [g.answered for g in rx.received] == [500]
        delivery = WebhookDelivery.objects.get(job_id=job["id"])
        assert delivery.status == WebhookDelivery.Status.PENDING
        first = WebhookAttempt.objects.get(delivery=delivery)
        assert first.next_retry_at == first.at + timedelta(seconds=10)

        # Not due before its time; due 10 s later by the test's clock.
        assert _tick(first.at + timedelta(seconds=9)) == []
        tried = _tick(first.at + timedelta(seconds=10))
        assert [a.number for a in tried] == [2]

    assert [g.answered for g in rx.received] == [500, 200]
    assert all(g.verified is not None for g in rx.received), [g.error for g in rx.received]
    first_msg, second_msg = rx.received
    # One message, tried twice: same webhook-id and body, each try signed at its own time.
    assert first_msg.headers["webhook-id"] == second_msg.headers["webhook-id"] == delivery.message_id
    assert first_msg.body == second_msg.body
    assert int(second_msg.headers["webhook-timestamp"]) - int(first_msg.headers["webhook-timestamp"]) == 10
    payload = second_msg.verified
    assert payload["type"] == "job.queued"
    assert payload["data"] == {
        "job_id": job["id"],
        "name": "resnet-sweep-3",
        "team": "vision",
        "status": "QUEUED",
        "from_status": None,
        "attempt": 1,
        "reason": "submitted",
        # FAIRQ_PUBLIC_URL is unset in the tests: no link rather than a relative one a
        # receiver would resolve against its own host.
        "url": None,
    }

    log = admin.get(f"/api/v1/teams/vision/webhooks/{created['id']}/deliveries/").json()
    assert len(log) == 1 and log[0]["status"] == "succeeded" and log[0]["job"] == job["id"]
    assert [(a["number"], a["status_code"], a["error"]) for a in log[0]["attempts"]] == [
        (1, 500, "HTTP 500"),
        (2, 200, ""),
    ]
    assert log[0]["attempts"][0]["next_retry_at"] is not None
    assert log[0]["attempts"][1]["next_retry_at"] is None
    assert '"ok":' in log[0]["attempts"][1]["response_excerpt"]


@pytest.mark.parametrize("base", ["https://fairq.example.com", "https://example.com/fairq/"])
def test_the_payload_links_the_job_page_absolutely_from_the_public_url(
    world, settings, django_capture_on_commit_callbacks, base
):
    settings.FAIRQ_PUBLIC_URL = base
    admin = world.client(world.admin)
    with receiver() as rx:
        rx.secret = _endpoint(admin, rx.url)["secret"]
        job = _submit(admin, django_capture_on_commit_callbacks)
    assert rx.received[0].verified["data"]["url"] == f"{base.rstrip('/')}/jobs/{job['id']}/"


def test_each_state_change_is_posted_with_from_and_to(world, django_capture_on_commit_callbacks):
    admin = world.client(world.admin)
    with receiver() as rx:
        rx.secret = _endpoint(admin, rx.url)["secret"]
        job = _submit(admin, django_capture_on_commit_callbacks)
        with django_capture_on_commit_callbacks(execute=True):
            r = admin.post(f"/api/v1/jobs/{job['id']}/cancel/")
        assert r.status_code == 200
    kinds = [(g.verified["type"], g.verified["data"]["from_status"]) for g in rx.received]
    assert kinds == [("job.queued", None), ("job.cancelled", "QUEUED")]
    assert rx.received[1].verified["data"]["reason"].startswith("cancelled by")


def test_an_endpoint_gets_only_the_event_types_it_takes(world, django_capture_on_commit_callbacks):
    admin = world.client(world.admin)
    with receiver() as rx:
        rx.secret = _endpoint(admin, rx.url, event_types=["job.cancelled"])["secret"]
        job = _submit(admin, django_capture_on_commit_callbacks)
        assert rx.received == []
        with django_capture_on_commit_callbacks(execute=True):
            admin.post(f"/api/v1/jobs/{job['id']}/cancel/")
    assert [g.verified["type"] for g in rx.received] == ["job.cancelled"]


def test_unknown_event_types_are_refused_with_a_field_message(world):
    r = world.client(world.admin).post(
        "/api/v1/teams/vision/webhooks/",
        {"url": "https://ci.example.com/x", "event_types": ["job.exploded"]},
        format="json",
    )
    assert r.status_code == 400
    assert "job.exploded" in json.dumps(r.json()["error"]["fields"]["event_types"])


@pytest.mark.parametrize(
    "url", ["ftp://ci.example.com/x", "https://user:pw@ci.example.com/", "not a url", "https:///nohost"]
)
def test_bad_endpoint_urls_are_refused(world, url):
    r = world.client(world.admin).post("/api/v1/teams/vision/webhooks/", {"url": url}, format="json")
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["url"]


def test_it_gives_up_after_the_configured_retries(world, settings, django_capture_on_commit_callbacks):
    settings.FAIRQ_WEBHOOK_RETRY_SECONDS = [1.0, 2.0]
    admin = world.client(world.admin)
    with receiver(answers=[503, 503, 503, 503]) as rx:
        rx.secret = _endpoint(admin, rx.url)["secret"]
        job = _submit(admin, django_capture_on_commit_callbacks)
        delivery = WebhookDelivery.objects.get(job_id=job["id"])
        t = WebhookAttempt.objects.get(delivery=delivery).at
        assert [a.number for a in _tick(t + timedelta(seconds=1))] == [2]
        assert [a.number for a in _tick(t + timedelta(seconds=3))] == [3]
        assert _tick(t + timedelta(hours=3)) == []
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.FAILED and delivery.attempts == 3
    assert delivery.next_attempt_at is None and delivery.finished_at is not None
    assert len(rx.received) == 3


def test_redirects_are_not_followed(world, django_capture_on_commit_callbacks):
    admin = world.client(world.admin)
    with receiver(answers=[302]) as rx:
        rx.secret = _endpoint(admin, rx.url)["secret"]
        job = _submit(admin, django_capture_on_commit_callbacks)
    attempt = WebhookAttempt.objects.get(delivery__job_id=job["id"])
    assert attempt.status_code == 302 and attempt.error == "redirects are not followed"
    assert attempt.next_retry_at is not None
    assert len(rx.received) == 1


def test_link_local_addresses_are_refused_without_a_retry(
    world, settings, django_capture_on_commit_callbacks
):
    admin = world.client(world.admin)
    _endpoint(admin, "http://169.254.169.254/latest/meta-data/")
    job = _submit(admin, django_capture_on_commit_callbacks)
    delivery = WebhookDelivery.objects.get(job_id=job["id"])
    assert delivery.status == WebhookDelivery.Status.FAILED
    attempt = delivery.attempt_log.get()
    assert attempt.error.startswith("refused: 169.254.169.254 is link-local")
    assert attempt.next_retry_at is None and attempt.status_code is None


@pytest.mark.parametrize(
    ("address", "allow_private", "refused"),
    [
        ("169.254.169.254", True, True),
        ("fe80::1", True, True),
        ("0.0.0.0", True, True),
        ("::ffff:169.254.169.254", True, True),
        ("127.0.0.1", True, False),
        ("127.0.0.1", False, True),
        ("10.1.2.3", False, True),
        ("192.168.0.9", False, True),
        ("::1", False, True),
        ("8.8.8.8", False, False),
        ("2606:4700::1111", False, False),
    ],
)
def test_address_rules(address, allow_private, refused):
    assert (wh.address_problem(address, allow_private=allow_private) is not None) is refused


def test_private_addresses_are_refused_unless_allowed(world, settings, django_capture_on_commit_callbacks):
    settings.FAIRQ_WEBHOOK_ALLOW_PRIVATE = False
    admin = world.client(world.admin)
    with receiver() as rx:
        _endpoint(admin, rx.url)
        job = _submit(admin, django_capture_on_commit_callbacks)
    assert rx.received == []
    attempt = WebhookAttempt.objects.get(delivery__job_id=job["id"])
    assert "private address" in attempt.error


def test_a_broker_that_is_down_never_breaks_the_state_change(
    world, monkeypatch, caplog, django_capture_on_commit_callbacks
):
    admin = world.client(world.admin)
    _endpoint(admin, "https://ci.example.com/hooks/")

    def broker_down(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("broker down")

    monkeypatch.setattr(wh.app, "signature", broker_down)
    job = _submit(admin, django_capture_on_commit_callbacks)
    assert Job.objects.get(pk=job["id"]).status == "QUEUED"
    assert "could not queue 1 event(s)" in caplog.text


def test_a_rolled_back_change_sends_nothing(world, django_capture_on_commit_callbacks):
    from django.db import transaction

    from queueing.policy.states import JobState
    from queueing.services.jobs import job_transition

    admin = world.client(world.admin)
    with receiver() as rx:
        rx.secret = _endpoint(admin, rx.url)["secret"]
        job = _submit(admin, django_capture_on_commit_callbacks)
        row = Job.objects.get(pk=job["id"])

        def cancel_then_fail() -> None:
            with transaction.atomic():
                assert job_transition(row, JobState.CANCELLED, now=timezone.now())
                raise RuntimeError("rolled back")

        with django_capture_on_commit_callbacks(execute=True) as callbacks, pytest.raises(RuntimeError):
            cancel_then_fail()
        assert callbacks == []
    assert [g.verified["type"] for g in rx.received] == ["job.queued"]


def test_several_changes_in_one_transaction_are_one_message(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    from django.db import transaction

    from queueing.policy.states import JobState
    from queueing.services.jobs import job_transition
    from tests.factories import JobFactory

    sent: list[list[int]] = []
    monkeypatch.setattr(wh, "webhooks_dispatch_soon", sent.append)
    jobs = [JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal) for _ in range(3)]
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        for job in jobs:
            assert job_transition(job, JobState.CANCELLED, now=timezone.now())
    assert len(sent) == 1 and len(sent[0]) == 3


@pytest.mark.postgres
def test_a_submit_sends_a_message_only_when_someone_listens(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    """No endpoint and no notify_url: nothing would be delivered, so no message (issue
    20: a Celery message per submit); an enabled endpoint of the team gets it again."""
    sent: list[list[int]] = []
    monkeypatch.setattr(wh, "webhooks_dispatch_soon", sent.append)
    admin = world.client(world.admin)
    _submit(admin, django_capture_on_commit_callbacks)
    assert sent == []
    created = _endpoint(admin, "https://ci.example.com/hooks/")
    job = _submit(admin, django_capture_on_commit_callbacks)
    assert len(sent) == 1 and len(sent[0]) == 1
    assert sent[0][0] == job["events"][0]["id"]
    r = admin.patch(f"/api/v1/teams/vision/webhooks/{created['id']}/", {"enabled": False},
                    format="json")
    assert r.status_code == 200, r.content
    _submit(admin, django_capture_on_commit_callbacks)
    assert len(sent) == 1


def test_the_test_endpoint_sends_a_signed_test_message(world, django_capture_on_commit_callbacks):
    admin = world.client(world.admin)
    with receiver() as rx:
        created = _endpoint(admin, rx.url, enabled=False)
        rx.secret = created["secret"]
        with django_capture_on_commit_callbacks(execute=True):
            r = admin.post(f"/api/v1/teams/vision/webhooks/{created['id']}/test/")
        assert r.status_code == 202
    assert [g.verified["type"] for g in rx.received] == ["webhook.test"]
    log = admin.get(f"/api/v1/teams/vision/webhooks/{created['id']}/deliveries/").json()
    assert log[0]["event_type"] == "webhook.test" and log[0]["status"] == "succeeded"


def test_secret_is_shown_once_and_rotation_replaces_it(world, django_capture_on_commit_callbacks):
    admin = world.client(world.admin)
    r = admin.post(
        "/api/v1/teams/vision/webhooks/",
        {"url": "https://ci.example.com/h"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    created = r.json()
    assert created["secret"].startswith("whsec_")
    replay = admin.post(
        "/api/v1/teams/vision/webhooks/",
        {"url": "https://ci.example.com/h"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k1",
    )
    assert replay.json()["id"] == created["id"] and replay.json()["secret"] is None
    listed = admin.get("/api/v1/teams/vision/webhooks/").content.decode()
    detail = admin.get(f"/api/v1/teams/vision/webhooks/{created['id']}/").content.decode()
    assert created["secret"] not in listed + detail and 'secret"' not in listed + detail
    rotated = admin.post(f"/api/v1/teams/vision/webhooks/{created['id']}/rotate-secret/").json()
    assert rotated["secret"].startswith("whsec_") and rotated["secret"] != created["secret"]
    # Audited, without the secret's value.
    audit = AuditEntry.objects.filter(object_type="queueing.WebhookEndpoint")
    assert [a.action for a in audit.order_by("id")] == ["create", "update"]
    assert all(
        created["secret"] not in json.dumps(a.changes) and rotated["secret"] not in json.dumps(a.changes)
        for a in audit
    )

    # A message signed with the new secret does not verify with the old one.
    with receiver() as rx:
        admin.patch(f"/api/v1/teams/vision/webhooks/{created['id']}/", {"url": rx.url}, format="json")
        rx.secret = created["secret"]
        _submit(admin, django_capture_on_commit_callbacks)
    assert rx.received[0].verified is None
    body, headers = rx.received[0].body, rx.received[0].headers
    assert Webhook(rotated["secret"]).verify(body, headers)["type"] == "job.queued"
    with pytest.raises(WebhookVerificationError):
        Webhook(created["secret"]).verify(body, headers)


WEBHOOK_URLS = [
    "/api/v1/teams/vision/webhooks/",
    "/api/v1/teams/vision/webhooks/{id}/",
    "/api/v1/teams/vision/webhooks/{id}/deliveries/",
    "/api/v1/teams/vision/webhooks/notify-deliveries/",
    "/api/v1/teams/vision/webhooks/notify-secret/",
]
WEBHOOK_POSTS = [
    "/api/v1/teams/vision/webhooks/",
    "/api/v1/teams/vision/webhooks/{id}/test/",
    "/api/v1/teams/vision/webhooks/{id}/rotate-secret/",
    "/api/v1/teams/vision/webhooks/notify-secret/",
]


@pytest.mark.parametrize(("who", "code"), [("member", 403), ("outsider", 404)])
def test_only_team_admins_reach_webhooks(world, who, code):
    hook = _endpoint(world.client(world.admin), "https://ci.example.com/h")
    client = world.client(getattr(world, who))
    for url in WEBHOOK_URLS:
        assert client.get(url.format(id=hook["id"])).status_code == code, url
    for url in WEBHOOK_POSTS:
        r = client.post(url.format(id=hook["id"]), {"url": "https://x.example.com/"}, format="json")
        assert r.status_code == code, url
    assert (
        client.patch(
            f"/api/v1/teams/vision/webhooks/{hook['id']}/", {"enabled": False}, format="json"
        ).status_code
        == code
    )
    assert client.delete(f"/api/v1/teams/vision/webhooks/{hook['id']}/").status_code == code
    assert "whsec_" not in client.get("/api/v1/teams/vision/webhooks/").content.decode()


def test_another_teams_endpoint_is_not_found(world):
    hook = _endpoint(world.client(world.admin), "https://ci.example.com/h")
    nlp_admin = world.client(world.outsider)  # team admin of nlp
    assert nlp_admin.get(f"/api/v1/teams/nlp/webhooks/{hook['id']}/").status_code == 404
    assert nlp_admin.get(f"/api/v1/teams/nlp/webhooks/{hook['id']}/deliveries/").status_code == 404


def test_deleting_an_endpoint_is_audited(world):
    admin = world.client(world.admin)
    hook = _endpoint(admin, "https://ci.example.com/h")
    assert admin.delete(f"/api/v1/teams/vision/webhooks/{hook['id']}/").status_code == 204
    assert admin.get("/api/v1/teams/vision/webhooks/").json() == []
    assert AuditEntry.objects.filter(object_type="queueing.WebhookEndpoint", action="delete").count() == 1


def test_the_sweep_sends_a_delivery_whose_message_was_lost(world):
    from queueing.tasks import webhooks_due_task

    with receiver() as rx:
        created = wh.webhook_endpoint_create(actor=world.admin, team=world.vision, url=rx.url)
        rx.secret = created.secret
        lost = WebhookDelivery.objects.create(
            team=world.vision,
            endpoint=created.endpoint,
            url=rx.url,
            message_id="msg_lost",
            event_type="webhook.test",
            payload={"type": "webhook.test"},
            next_attempt_at=timezone.now() - timedelta(minutes=1),
            created_at=timezone.now(),
        )
        assert webhooks_due_task() == 1  # the beat task, run for real (eager)
    assert [g.headers["webhook-id"] for g in rx.received] == ["msg_lost"]
    assert rx.received[0].verified == {"type": "webhook.test"}
    lost.refresh_from_db()
    assert lost.status == WebhookDelivery.Status.SUCCEEDED and lost.attempts == 1


def test_a_rolled_back_savepoint_drops_its_events_and_keeps_the_rest(
    world, monkeypatch, django_capture_on_commit_callbacks
):
    from django.db import transaction

    from queueing.policy.states import JobState
    from queueing.services.jobs import job_transition
    from tests.factories import JobFactory

    sent: list[list[int]] = []
    monkeypatch.setattr(wh, "webhooks_dispatch_soon", sent.append)
    first, second = (JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal) for _ in range(2))

    def cancel_then_fail() -> None:
        with transaction.atomic():
            assert job_transition(first, JobState.CANCELLED, now=timezone.now())
            raise RuntimeError("savepoint rolled back")

    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        with pytest.raises(RuntimeError):
            cancel_then_fail()
        assert job_transition(second, JobState.CANCELLED, now=timezone.now())
    from queueing.models import JobEvent

    assert sent == [[JobEvent.objects.get(job=second, to_status="CANCELLED").pk]]


def test_an_array_job_is_posted_once_per_member(world, django_capture_on_commit_callbacks):
    admin = world.client(world.admin)
    with receiver() as rx:
        rx.secret = _endpoint(admin, rx.url)["secret"]
        with django_capture_on_commit_callbacks(execute=True):
            r = admin.post("/api/v1/jobs/bulk/", {**job_body(name="sweep"), "count": 3}, format="json")
        assert r.status_code == 201
    got = sorted((g.verified["data"]["job_id"], g.verified["type"]) for g in rx.received)
    assert got == [(i, "job.queued") for i in r.json()["ids"]]


def test_the_scheduler_cycle_posts_admitted_and_running(world, django_capture_on_commit_callbacks):
    from queueing.services.scheduler import scheduler_cycle

    admin = world.client(world.admin)
    with receiver() as rx:
        rx.secret = _endpoint(admin, rx.url, event_types=["job.admitted", "job.running"])["secret"]
        job = _submit(admin, django_capture_on_commit_callbacks, env={"FAIRQ_SIM_SECONDS": "600"})
        t0 = timezone.now()
        with django_capture_on_commit_callbacks(execute=True):
            scheduler_cycle(now=t0)
        with django_capture_on_commit_callbacks(execute=True):
            scheduler_cycle(now=t0 + timedelta(seconds=1))
    got = [
        (g.verified["type"], g.verified["data"]["from_status"], g.verified["data"]["job_id"])
        for g in rx.received
    ]
    assert got == [("job.admitted", "QUEUED", job["id"]), ("job.running", "ADMITTED", job["id"])]


def test_old_finished_deliveries_are_purged_and_pending_ones_kept(world):
    endpoint = wh.webhook_endpoint_create(
        actor=None, team=world.vision, url="https://ci.example.com/h"
    ).endpoint
    now = timezone.now()

    def delivery(status: str, age_days: float) -> WebhookDelivery:
        d = WebhookDelivery.objects.create(
            team=world.vision,
            endpoint=endpoint,
            url=endpoint.url,
            message_id=f"msg_{status}_{age_days}",
            event_type="webhook.test",
            payload={},
            status=status,
            created_at=now - timedelta(days=age_days),
        )
        WebhookAttempt.objects.create(delivery=d, number=1, at=d.created_at)
        return d

    old_ok, old_failed = delivery("succeeded", 31), delivery("failed", 40)
    old_pending, young = delivery("pending", 31), delivery("succeeded", 29)
    assert wh.webhook_deliveries_purge(now=now, days=30, batch=1) == 2
    left = set(WebhookDelivery.objects.values_list("pk", flat=True))
    assert left == {old_pending.pk, young.pk}
    assert not WebhookAttempt.objects.filter(delivery_id__in=[old_ok.pk, old_failed.pk]).exists()
    assert wh.webhook_deliveries_purge(now=now, days=0) == 0


def test_cancelling_an_array_posts_each_member_cancelled(world, django_capture_on_commit_callbacks):
    """DELETE /arrays/{id}/ cancels the queued members in bulk (one statement on
    PostgreSQL): their transitions reach the webhooks as a single job's do."""
    admin = world.client(world.admin)
    with receiver() as rx:
        rx.secret = _endpoint(admin, rx.url, event_types=["job.cancelled"])["secret"]
        with django_capture_on_commit_callbacks(execute=True):
            r = admin.post("/api/v1/jobs/bulk/", {**job_body(name="sweep"), "count": 3}, format="json")
        assert r.status_code == 201
        with django_capture_on_commit_callbacks(execute=True):
            d = admin.delete(f"/api/v1/arrays/{r.json()['array_id']}/")
        assert d.status_code == 200, d.content
    got = sorted((g.verified["data"]["job_id"], g.verified["type"]) for g in rx.received)
    assert got == [(i, "job.cancelled") for i in r.json()["ids"]]
