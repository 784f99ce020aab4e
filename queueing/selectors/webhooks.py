"""Reads of webhooks (docs/webhooks.md): a team's endpoints and their delivery log."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from accounts.models import Team
from queueing.errors import NotFound
from queueing.models import TeamNotifySecret, WebhookAttempt, WebhookDelivery, WebhookEndpoint


def webhook_endpoints_of_team(*, team: Team) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(team=team).order_by("id")


def webhook_endpoint_get(*, team: Team, endpoint_id: int) -> WebhookEndpoint:
    """The team's endpoint; NotFound for another team's or none (no disclosure)."""
    endpoint = WebhookEndpoint.objects.select_related("team").filter(team=team, pk=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"webhook {endpoint_id} not found")
    return endpoint


def webhook_deliveries(
    *, team: Team, endpoint: WebhookEndpoint | None = None, notify_only: bool = False, limit: int = 50
) -> list[WebhookDelivery]:
    """The newest deliveries of `team` (of one endpoint, or to jobs' notify_url), each
    with its tries (`attempt_log`) in order."""
    rows = WebhookDelivery.objects.filter(team=team)
    if endpoint is not None:
        rows = rows.filter(endpoint=endpoint)
    elif notify_only:
        rows = rows.filter(endpoint__isnull=True)
    return list(
        rows.select_related("endpoint")
        .prefetch_related(Prefetch("attempt_log", queryset=WebhookAttempt.objects.order_by("number")))
        .order_by("-id")[:limit]
    )


def webhook_delivery_with_tries(*, delivery_id: int) -> WebhookDelivery:
    """The delivery with its tries (`attempt_log`)."""
    return WebhookDelivery.objects.prefetch_related("attempt_log").get(pk=delivery_id)


def team_notify_secret_row(*, team: Team) -> TeamNotifySecret | None:
    """The team's notify secret row (when it was made; never shown), None without one."""
    return TeamNotifySecret.objects.filter(team=team).first()
