from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from accounts.services import token_issue


class Command(BaseCommand):
    help = "Issue an API token for USERNAME and print it (the only time it is shown)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="cli")
        when = parser.add_mutually_exclusive_group()
        when.add_argument("--expires-days", type=int, default=None,
                          help="The token stops working after this many days (default: "
                               "FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS, as tokens made in the "
                               "dashboard or the API).")
        when.add_argument("--never-expires", action="store_true",
                          help="A token that never expires (revoke it when it is no "
                               "longer needed).")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user {options['username']!r}")
        days = options["expires_days"]
        if days is not None and days <= 0:
            raise CommandError("--expires-days must be a positive number of days")
        if days is None and not options["never_expires"]:
            days = settings.FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS or None  # 0: no default expiry
        expires = timezone.now() + timedelta(days=days) if days else None
        issued = token_issue(user=user, name=options["name"], expires_at=expires)
        self.stdout.write(issued.key)
        self.stderr.write(f"expires {expires:%Y-%m-%d %H:%M} UTC" if expires
                          else "never expires")
