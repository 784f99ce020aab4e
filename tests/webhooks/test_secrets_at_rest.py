"""Signing secrets at rest (docs/webhooks.md, "Secrets at rest"): the endpoints' and
notify secrets are stored encrypted (Fernet, FAIRQ_WEBHOOK_SECRET_KEYS: the first key
encrypts, all decrypt), still sign what a real receiver verifies, survive a key rotation
with `manage.py reencrypt_webhook_secrets`, and rows written in clear before are
encrypted by migration 0026."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection

from queueing.models import TeamNotifySecret, WebhookAttempt, WebhookEndpoint

from .receiver import receiver
from .test_deliveries import _endpoint, _submit

KEY_1, KEY_2, KEY_3 = (Fernet.generate_key().decode() for _ in range(3))


def _stored(table: str) -> list[str]:
    with connection.cursor() as cur:
        cur.execute(f"SELECT secret FROM {table} ORDER BY id")
        return [row[0] for row in cur.fetchall()]


@pytest.mark.django_db
def test_signing_secrets_are_stored_encrypted_and_still_sign(
    world, settings, django_capture_on_commit_callbacks
):
    settings.FAIRQ_WEBHOOK_SECRET_KEYS = [KEY_1]
    admin = world.client(world.admin)
    notify = admin.post("/api/v1/teams/vision/webhooks/notify-secret/").json()["secret"]
    with receiver() as rx:
        created = _endpoint(admin, rx.url)
        rx.secret = created["secret"]
        [stored] = _stored("queueing_webhookendpoint")
        [stored_notify] = _stored("queueing_teamnotifysecret")
        for clear, row in ((created["secret"], stored), (notify, stored_notify)):
            assert clear.startswith("whsec_") and clear[6:] not in row and not row.startswith("whsec_")
            assert Fernet(KEY_1.encode()).decrypt(row.encode()).decode() == clear
        _submit(admin, django_capture_on_commit_callbacks)
    assert rx.received[0].verified is not None  # signed with the decrypted secret
    # Never shown again in clear: not in the list, the detail, nor the notify status.
    pages = "".join(admin.get(u).content.decode() for u in (
        "/api/v1/teams/vision/webhooks/", f"/api/v1/teams/vision/webhooks/{created['id']}/",
        "/api/v1/teams/vision/webhooks/notify-secret/"))
    assert created["secret"] not in pages and notify not in pages and stored not in pages


@pytest.mark.django_db
def test_a_new_key_first_then_reencrypt_then_the_old_key_can_go(
    world, settings, django_capture_on_commit_callbacks
):
    settings.FAIRQ_WEBHOOK_SECRET_KEYS = [KEY_1]
    admin = world.client(world.admin)
    with receiver() as rx:
        rx.secret = _endpoint(admin, rx.url)["secret"]
        admin.post("/api/v1/teams/vision/webhooks/notify-secret/")
        before = _stored("queueing_webhookendpoint") + _stored("queueing_teamnotifysecret")

        settings.FAIRQ_WEBHOOK_SECRET_KEYS = [KEY_2, KEY_1]  # the new key first
        _submit(admin, django_capture_on_commit_callbacks)  # the old rows still open
        call_command("reencrypt_webhook_secrets")
        after = _stored("queueing_webhookendpoint") + _stored("queueing_teamnotifysecret")
        assert all(a != b for a, b in zip(before, after, strict=True))
        for row in after:
            Fernet(KEY_2.encode()).decrypt(row.encode())  # encrypted with the new key

        settings.FAIRQ_WEBHOOK_SECRET_KEYS = [KEY_2]  # the old key dropped
        _submit(admin, django_capture_on_commit_callbacks)
    assert len(rx.received) == 2 and all(g.verified is not None for g in rx.received)

    settings.FAIRQ_WEBHOOK_SECRET_KEYS = [KEY_3]  # a key that never encrypted them
    with pytest.raises(CommandError, match="opens this secret"):
        call_command("reencrypt_webhook_secrets")


@pytest.mark.django_db
def test_a_secret_no_key_opens_fails_the_try_and_is_tried_again(
    world, settings, django_capture_on_commit_callbacks
):
    settings.FAIRQ_WEBHOOK_SECRET_KEYS = [KEY_1]
    admin = world.client(world.admin)
    with receiver() as rx:
        _endpoint(admin, rx.url)
        settings.FAIRQ_WEBHOOK_SECRET_KEYS = [KEY_3]  # KEY_1 dropped before re-encrypting
        job = _submit(admin, django_capture_on_commit_callbacks)
    assert rx.received == []
    attempt = WebhookAttempt.objects.get(delivery__job_id=job["id"])
    assert attempt.error.startswith("cannot sign: no key of FAIRQ_WEBHOOK_SECRET_KEYS opens")
    assert attempt.next_retry_at is not None


@pytest.mark.django_db(transaction=True)
def test_the_migration_encrypts_the_secrets_stored_in_clear(settings) -> None:
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    settings.FAIRQ_WEBHOOK_SECRET_KEYS = [KEY_1]
    before = [("queueing", "0025_job_spot_pools")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        apps = executor.loader.project_state(before).apps
        team = apps.get_model("accounts", "Team").objects.create(slug="old", name="Old")
        now = timezone.now()
        apps.get_model("queueing", "WebhookEndpoint").objects.create(
            team=team, url="https://ci.example.com/h", secret="whsec_Y2xlYXIgaW4gdGhlIGRi",
            secret_rotated_at=now, created_at=now, updated_at=now)
        apps.get_model("queueing", "TeamNotifySecret").objects.create(
            team=team, secret="whsec_bm90aWZ5IGluIGNsZWFy", rotated_at=now)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    [endpoint] = _stored("queueing_webhookendpoint")
    [notify] = _stored("queueing_teamnotifysecret")
    fernet = Fernet(KEY_1.encode())
    assert fernet.decrypt(endpoint.encode()) == b"whsec_Y2xlYXIgaW4gdGhlIGRi"
    assert fernet.decrypt(notify.encode()) == b"whsec_bm90aWZ5IGluIGNsZWFy"
    assert WebhookEndpoint.objects.count() == TeamNotifySecret.objects.count() == 1
