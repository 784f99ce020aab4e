"""fairq's own `manage.py check --deploy` warnings (docs/deployment.md)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Tags, Warning, register


@register(Tags.security, deploy=True)
def metrics_token_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if settings.FAIRQ_METRICS_REQUIRE_TOKEN and not settings.FAIRQ_METRICS_TOKEN:
        return [Warning(
            "FAIRQ_METRICS_TOKEN is unset: /metrics answers 403 to every scrape.",
            hint="Set FAIRQ_METRICS_TOKEN and give Prometheus the same bearer token "
                 "(platform/prometheus/scrape-fairq.yml).",
            id="fairq.W001")]
    return []
