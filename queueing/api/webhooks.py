"""API v1: a team's webhooks (docs/webhooks.md). Team admins and staff only: members get
403, everyone else 404 (the team's existence is not disclosed). Secrets appear once, in
the answer that created or rotated them; an Idempotency-Key replay of that answer has
`secret: null`."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import Team
from queueing import validation as v
from queueing.api.idempotency import IdempotentPostMixin
from queueing.api.strict import StrictFieldsMixin
from queueing.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from queueing.selectors.webhooks import (
    team_notify_secret_row,
    webhook_deliveries,
    webhook_delivery_with_tries,
    webhook_endpoint_get,
    webhook_endpoints_of_team,
)
from queueing.services.access import check_team_admin, check_team_member
from queueing.services.webhooks import (
    EVENT_TYPES,
    SECRET_SHOWN_ONCE,
    team_notify_secret_rotate,
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_test,
    webhook_endpoint_update,
    webhook_secret_rotate,
)

SECRET_SHOWN_NOW = "Copy the secret now: it is shown only in this answer."


def _team_for_admin(request: Request, slug: str) -> Team:
    team = check_team_member(actor=request.user, slug=slug)
    check_team_admin(actor=request.user, team=team)
    return team


class WebhookEndpointSerializer(serializers.ModelSerializer[WebhookEndpoint]):
    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "url",
            "description",
            "enabled",
            "event_types",
            "secret_rotated_at",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class WebhookEndpointWithSecretSerializer(WebhookEndpointSerializer):
    secret = serializers.CharField(
        allow_null=True,
        help_text="The signing secret (whsec_...): in this answer only; null in an Idempotency-Key replay.",
    )
    message = serializers.CharField()

    class Meta(WebhookEndpointSerializer.Meta):
        fields = [*WebhookEndpointSerializer.Meta.fields, "secret", "message"]
        read_only_fields = fields


_EVENT_TYPES_HELP = f"Event types it takes, of: {', '.join(EVENT_TYPES)}; empty or not given: every one."


class WebhookEndpointCreateSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    url = serializers.CharField(
        max_length=v.MAX_WEBHOOK_URL_LEN, help_text="An http:// or https:// URL (redirects are not followed)."
    )
    description = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    enabled = serializers.BooleanField(required=False, default=True)
    event_types = serializers.ListField(
        child=serializers.CharField(max_length=40),
        max_length=len(EVENT_TYPES),
        required=False,
        default=list,
        help_text=_EVENT_TYPES_HELP,
    )


class WebhookEndpointUpdateSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    url = serializers.CharField(max_length=v.MAX_WEBHOOK_URL_LEN, required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    enabled = serializers.BooleanField(required=False)
    event_types = serializers.ListField(
        child=serializers.CharField(max_length=40),
        max_length=len(EVENT_TYPES),
        required=False,
        help_text=_EVENT_TYPES_HELP,
    )


class WebhookAttemptSerializer(serializers.ModelSerializer[WebhookAttempt]):
    class Meta:
        model = WebhookAttempt
        fields = ["number", "at", "status_code", "response_excerpt", "error", "duration_ms", "next_retry_at"]
        read_only_fields = fields


class WebhookDeliverySerializer(serializers.ModelSerializer[WebhookDelivery]):
    attempts = WebhookAttemptSerializer(
        source="attempt_log", many=True, read_only=True, help_text="Every try, first first."
    )
    job = serializers.IntegerField(source="job_id", allow_null=True, read_only=True)
    status = serializers.CharField(
        read_only=True, help_text="pending (a next try is due at next_attempt_at), succeeded or failed."
    )
    endpoint = serializers.IntegerField(
        source="endpoint_id", allow_null=True, read_only=True, help_text="null: the job's own notify_url."
    )

    class Meta:
        model = WebhookDelivery
        fields = [
            "id",
            "message_id",
            "event_type",
            "endpoint",
            "url",
            "job",
            "status",
            "next_attempt_at",
            "created_at",
            "finished_at",
            "payload",
            "attempts",
        ]
        read_only_fields = fields


def _with_secret(endpoint: WebhookEndpoint, secret: str) -> dict[str, Any]:
    return {**WebhookEndpointSerializer(endpoint).data, "secret": secret, "message": SECRET_SHOWN_NOW}


class _SecretReplayMixin(IdempotentPostMixin):
    def idempotent_body(self, data: Any, status_code: int) -> Any:
        """A replay of an answer holding a secret: the same without it."""
        if isinstance(data, dict) and "secret" in data:
            return {**data, "secret": None, "message": SECRET_SHOWN_ONCE}
        return data


class WebhookListView(_SecretReplayMixin, APIView):
    """The team's webhook endpoints; POST registers one (its secret is in the answer,
    only there)."""

    @extend_schema(responses=WebhookEndpointSerializer(many=True))
    def get(self, request: Request, slug: str) -> Response:
        """The team's webhook endpoints (team admins), without their secrets."""
        team = _team_for_admin(request, slug)
        return Response(WebhookEndpointSerializer(webhook_endpoints_of_team(team=team), many=True).data)

    @extend_schema(
        request=WebhookEndpointCreateSerializer, responses={201: WebhookEndpointWithSecretSerializer}
    )
    def post(self, request: Request, slug: str) -> Response:
        """Register an endpoint: 201 with its signing secret, shown in this answer only
        (a replay with the same Idempotency-Key answers without it)."""
        team = _team_for_admin(request, slug)
        s = WebhookEndpointCreateSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        created = webhook_endpoint_create(actor=request.user, team=team, **s.validated_data)
        return Response(_with_secret(created.endpoint, created.secret), status=status.HTTP_201_CREATED)


class WebhookDetailView(_SecretReplayMixin, APIView):
    """One endpoint: read, change (PATCH), delete (with its delivery log)."""

    @extend_schema(responses=WebhookEndpointSerializer)
    def get(self, request: Request, slug: str, webhook_id: int) -> Response:
        """One endpoint of the team, without its secret."""
        team = _team_for_admin(request, slug)
        return Response(
            WebhookEndpointSerializer(webhook_endpoint_get(team=team, endpoint_id=webhook_id)).data
        )

    @extend_schema(request=WebhookEndpointUpdateSerializer, responses=WebhookEndpointSerializer)
    def patch(self, request: Request, slug: str, webhook_id: int) -> Response:
        """Change an endpoint's URL, description, event types or enabled (audited)."""
        team = _team_for_admin(request, slug)
        endpoint = webhook_endpoint_get(team=team, endpoint_id=webhook_id)
        s = WebhookEndpointUpdateSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        endpoint = webhook_endpoint_update(actor=request.user, endpoint=endpoint, **s.validated_data)
        return Response(WebhookEndpointSerializer(endpoint).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, slug: str, webhook_id: int) -> Response:
        """Delete an endpoint and its delivery log (audited); nothing more is sent to it."""
        team = _team_for_admin(request, slug)
        webhook_endpoint_delete(
            actor=request.user, endpoint=webhook_endpoint_get(team=team, endpoint_id=webhook_id)
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookRotateSecretView(_SecretReplayMixin, APIView):
    """A new signing secret for the endpoint, in this answer only; the old one stops
    signing at once."""

    @extend_schema(request=None, responses={200: WebhookEndpointWithSecretSerializer})
    def post(self, request: Request, slug: str, webhook_id: int) -> Response:
        team = _team_for_admin(request, slug)
        rotated = webhook_secret_rotate(
            actor=request.user, endpoint=webhook_endpoint_get(team=team, endpoint_id=webhook_id)
        )
        return Response(_with_secret(rotated.endpoint, rotated.secret))


class WebhookTestView(IdempotentPostMixin, APIView):
    """Send a `webhook.test` message to the endpoint now (after this answer); it shows in
    the delivery log like the others."""

    @extend_schema(request=None, responses={202: WebhookDeliverySerializer})
    def post(self, request: Request, slug: str, webhook_id: int) -> Response:
        team = _team_for_admin(request, slug)
        delivery = webhook_endpoint_test(
            actor=request.user, endpoint=webhook_endpoint_get(team=team, endpoint_id=webhook_id)
        )
        delivery = webhook_delivery_with_tries(delivery_id=delivery.pk)
        return Response(WebhookDeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)


class WebhookDeliveryListView(APIView):
    """The endpoint's newest 50 deliveries, each with every try."""

    @extend_schema(responses=WebhookDeliverySerializer(many=True))
    def get(self, request: Request, slug: str, webhook_id: int) -> Response:
        team = _team_for_admin(request, slug)
        endpoint = webhook_endpoint_get(team=team, endpoint_id=webhook_id)
        return Response(
            WebhookDeliverySerializer(webhook_deliveries(team=team, endpoint=endpoint), many=True).data
        )


class NotifyDeliveryListView(APIView):
    """The newest 50 deliveries to the team's jobs' own notify_url, each with every try."""

    @extend_schema(responses=WebhookDeliverySerializer(many=True))
    def get(self, request: Request, slug: str) -> Response:
        team = _team_for_admin(request, slug)
        return Response(
            WebhookDeliverySerializer(webhook_deliveries(team=team, notify_only=True), many=True).data
        )


class NotifySecretSerializer(serializers.Serializer[Any]):
    exists = serializers.BooleanField()
    rotated_at = serializers.DateTimeField(allow_null=True)
    secret = serializers.CharField(required=False, allow_null=True, help_text="In the answer of POST only.")
    message = serializers.CharField(required=False)


class NotifySecretView(_SecretReplayMixin, APIView):
    """The secret that signs the POSTs to the team's jobs' notify_url: GET says whether
    there is one, POST creates or replaces it (shown in that answer only)."""

    @extend_schema(responses=NotifySecretSerializer)
    def get(self, request: Request, slug: str) -> Response:
        """Whether the team has a notify secret, and when it was made (never the secret)."""
        team = _team_for_admin(request, slug)
        row = team_notify_secret_row(team=team)
        data = dict(NotifySecretSerializer(
            {"exists": row is not None, "rotated_at": row.rotated_at if row is not None else None}
        ).data)
        data.pop("secret", None)  # never in a GET, not even as null
        return Response(data)

    @extend_schema(request=None, responses={200: NotifySecretSerializer})
    def post(self, request: Request, slug: str) -> Response:
        """Create or replace the notify secret: shown in this answer only; the old one
        stops signing at once."""
        team = _team_for_admin(request, slug)
        secret = team_notify_secret_rotate(actor=request.user, team=team)
        row = team_notify_secret_row(team=team)
        assert row is not None  # just written by the rotation
        return Response(NotifySecretSerializer(
            {"exists": True, "rotated_at": row.rotated_at, "secret": secret, "message": SECRET_SHOWN_NOW}
        ).data)
