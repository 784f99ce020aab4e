from __future__ import annotations

from django.apps import AppConfig


class QueueingConfig(AppConfig):
    name = "queueing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, signals  # noqa: F401  (checks registers on import)
        from .composition import DatabaseReads, provide_database_reads
        from .services.provisioning import gpu_type_refs, team_gpu_limits, team_slugs

        signals.connect()
        provide_database_reads(DatabaseReads(gpu_types=gpu_type_refs, team_quota=team_gpu_limits,
                                             teams=team_slugs))
