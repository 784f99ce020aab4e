"""`/api/v1/jobs/<id>/checkpoints/` (docs/api.md, "Checkpoints"): a running attempt
reports a checkpoint with its own token (FAIRQ_CHECKPOINT_TOKEN, `Authorization: Bearer`),
and people who may see the job list them, newest first.

The POST takes only a checkpoint token (services/checkpoints.py: signed per job and
attempt); a user's API token is authenticated as usual and then refused with 403, so the
answer says what to use. Reports are rate-limited per job (FAIRQ_CHECKPOINT_RATE), not
per client address: a cluster's pods share a few addresses."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    get_authorization_header,
)
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authentication import TokenAuthentication, token_key
from queueing.models import Checkpoint
from queueing.selectors.checkpoints import job_checkpoints
from queueing.services.access import check_job_access
from queueing.services.checkpoints import (
    CheckpointClaim,
    checkpoint_claim,
    checkpoint_report,
    is_checkpoint_token,
)

from .strict import StrictFieldsMixin
from .throttling import AnonymousRateThrottle, TokenRateThrottle, _FixedWindowThrottle

MAX_LISTED = 1000


class _Anonymous:
    """The request's user when a checkpoint token authenticated it: no person."""

    is_authenticated = False
    is_staff = False
    is_active = False
    pk = None

    def __str__(self) -> str:
        return "checkpoint token"


class CheckpointTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer fqc.<signed>`: the checkpoint token of one attempt
    (`request.auth` is its CheckpointClaim). Any other key is left to the API's own
    authentication; a checkpoint token that does not verify is 401."""

    def authenticate(self, request: Request) -> tuple[Any, CheckpointClaim] | None:
        key = token_key(get_authorization_header(request))
        if key is None or not is_checkpoint_token(key):
            return None
        claim = checkpoint_claim(key)
        if claim is None:
            raise exceptions.AuthenticationFailed("Invalid checkpoint token.")
        return _Anonymous(), claim

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class CheckpointRateThrottle(_FixedWindowThrottle):
    """FAIRQ_CHECKPOINT_RATE per job, for requests with a checkpoint token."""

    group = "fairq-api-checkpoint"

    def rate(self) -> str | None:
        rate = getattr(settings, "FAIRQ_CHECKPOINT_RATE", "")
        return str(rate) if rate else None

    def ident(self, request: Request) -> str | None:
        claim = request.auth
        return f"job-{claim.job_id}" if isinstance(claim, CheckpointClaim) else None


class _AnonymousRateThrottle(AnonymousRateThrottle):
    """The address's anonymous bucket, for requests with neither a user nor a
    checkpoint token."""

    def ident(self, request: Request) -> str | None:
        if isinstance(request.auth, CheckpointClaim):
            return None
        return super().ident(request)


class CheckpointSerializer(serializers.ModelSerializer[Checkpoint]):
    job = serializers.IntegerField(source="job_id", read_only=True)
    attempt = serializers.IntegerField(read_only=True)

    class Meta:
        model = Checkpoint
        fields = ["id", "job", "attempt", "created_at", "step", "progress", "path"]
        read_only_fields = fields


class CheckpointReportSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """The body of a report: all optional (schema only; the service checks them)."""

    step = serializers.IntegerField(required=False, allow_null=True, min_value=0,
                                    help_text="The training step it saved, e.g. 1200.")
    progress = serializers.FloatField(required=False, allow_null=True, min_value=0.0,
                                      max_value=1.0, help_text="How far the job is, 0..1.")
    path = serializers.CharField(required=False, allow_blank=True, max_length=1024,
                                 help_text='Where it wrote it, e.g. "/ckpt/step-1200.pt".')


_FIELDS = ("step", "progress", "path")


class JobCheckpointsView(APIView):
    authentication_classes = [CheckpointTokenAuthentication, TokenAuthentication,
                              SessionAuthentication]
    permission_classes: list[Any] = []  # each method says who may (below)
    throttle_classes = [CheckpointRateThrottle, TokenRateThrottle, _AnonymousRateThrottle]

    @extend_schema(
        parameters=[OpenApiParameter("limit", int, description=f"At most this many "
                                     f"(1..{MAX_LISTED}, default 100).")],
        responses=CheckpointSerializer(many=True))
    def get(self, request: Request, job_id: int) -> Response:
        """The job's checkpoints, every attempt's, newest first; for people who may see
        the job (404 otherwise), not for a checkpoint token."""
        if not request.user or not request.user.is_authenticated:
            raise exceptions.NotAuthenticated()
        job = check_job_access(actor=request.user, job_id=job_id)
        try:
            limit = int(request.query_params.get("limit", 100))
        except ValueError:
            raise exceptions.ValidationError({"limit": ["A whole number."]}) from None
        limit = min(MAX_LISTED, max(1, limit))
        return Response(CheckpointSerializer(job_checkpoints(job, limit=limit), many=True).data)

    @extend_schema(
        request=CheckpointReportSerializer,
        responses={201: CheckpointSerializer,
                   409: inline_serializer("CheckpointConflict", {
                       "error": serializers.DictField()})})
    def post(self, request: Request, job_id: int) -> Response:
        """Report a checkpoint of the attempt whose FAIRQ_CHECKPOINT_TOKEN is the bearer
        token: 201; 403 with a user's token or another job's; 409 for an attempt that
        is over (its grace after a preemption or cancel included); 400 for bad fields."""
        claim = request.auth if isinstance(request.auth, CheckpointClaim) else None
        if claim is None and not (request.user and request.user.is_authenticated):
            raise exceptions.NotAuthenticated(
                "Send the attempt's FAIRQ_CHECKPOINT_TOKEN as 'Authorization: Bearer <token>'.")
        if claim is None:  # a user's token: the service's 403 says what to use
            checkpoint_report(claim=None, job_id=job_id)
        body: Any = request.data if request.data else {}
        if not isinstance(body, dict):
            raise exceptions.ValidationError(
                {"non_field_errors": ['A JSON object: {"step": ..., "progress": ..., '
                                      '"path": ...} (all optional).']})
        unknown = sorted(str(k) for k in body if k not in _FIELDS)
        if unknown:
            raise exceptions.ValidationError(
                {k: [f"Unknown field; known: {', '.join(_FIELDS)}."] for k in unknown})
        checkpoint = checkpoint_report(claim=claim, job_id=job_id, step=body.get("step"),
                                       progress=body.get("progress"), path=body.get("path"))
        return Response(CheckpointSerializer(checkpoint).data, status=status.HTTP_201_CREATED)
