"""`manage.py reencrypt_webhook_secrets`: re-encrypt every stored webhook and notify
signing secret with the first key of FAIRQ_WEBHOOK_SECRET_KEYS (docs/webhooks.md,
"Secrets at rest"). Run it after putting a new key first, before dropping the old one.
Idempotent; the secrets themselves do not change (receivers need nothing)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from queueing.sealing import SealError
from queueing.services.webhooks import webhook_secrets_reencrypt


class Command(BaseCommand):
    help = "Re-encrypt the stored webhook signing secrets with the first FAIRQ_WEBHOOK_SECRET_KEYS key."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            count = webhook_secrets_reencrypt()
        except SealError as exc:
            raise CommandError(
                f"{exc}: keep the key that encrypted it in FAIRQ_WEBHOOK_SECRET_KEYS "
                "(after the new one) and run this again") from exc
        self.stdout.write(f"{count} signing secrets re-encrypted with the first key.")
