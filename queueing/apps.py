from __future__ import annotations

from django.apps import AppConfig


class QueueingConfig(AppConfig):
    name = "queueing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, signals  # noqa: F401  (checks registers on import)

        signals.connect()
