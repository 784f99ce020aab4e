"""Notebook sessions (docs/api.md, "Notebook sessions"; docs/sessions.md):

- `POST /api/v1/sessions/` starts one (201 with the session; 400 naming the fields),
- `GET /api/v1/sessions/` lists the caller's (`?all=true`: every session of their teams),
- `GET /api/v1/sessions/{id}/` one of their teams' (404 otherwise),
- `DELETE /api/v1/sessions/{id}/` stops it (its owner, a team admin, staff; 403 else).

A session is a job too: `/api/v1/jobs/{id}/` shows it with its events. The server's
token is never in an answer: `url` is fairq's own proxy path, which checks who opens it.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueing.errors import DomainError
from queueing.selectors.sessions import session_row, session_rows, sessions_visible_to
from queueing.services.sessions import session_get_for_actor, session_start, session_stop

from .fields import GpuAmountField
from .strict import StrictFieldsMixin

MAX_LISTED = 200


class SessionStartSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """What a session asks for; every field may be left out."""

    team = serializers.CharField(required=False, max_length=63,
                                 help_text="Your team; may be left out when you are in one.")
    name = serializers.CharField(required=False, max_length=63, default="notebook")
    image = serializers.CharField(required=False, max_length=512,
                                  help_text="Default FAIRQ_NOTEBOOK_IMAGE (a Jupyter image).")
    gpu_type = serializers.CharField(
        required=False, max_length=40,
        help_text="Default: the first type that shares GPUs in slices (a fraction), else "
                  "the first type.")
    gpus = serializers.IntegerField(required=False, min_value=1, max_value=64,
                                    help_text="Whole GPUs (or MIG instances).")
    gpu_fraction = serializers.CharField(
        required=False, max_length=20,
        help_text="A fraction of one GPU of a time-sliced or MPS type: k/S or its decimal "
                  "(0.25 on a type of 4 slices). No memory isolation: the GPU's memory is "
                  "shared with other sessions and jobs. Default on such a type: 1 slice.")
    pvc = serializers.CharField(required=False, max_length=253,
                                help_text="A PVC of the team, mounted as the notebook's root "
                                          "(its files outlive the session).")
    volumes = serializers.ListField(child=serializers.DictField(), required=False,
                                    help_text="More volumes, as a job's.")
    secrets = serializers.ListField(child=serializers.DictField(), required=False,
                                    help_text="Secrets, as a job's.")
    idle_minutes = serializers.IntegerField(
        required=False, min_value=1,
        help_text="Stopped after this many idle minutes (rule N3); default "
                  "FAIRQ_SESSION_IDLE_MINUTES.")
    max_runtime_seconds = serializers.IntegerField(
        required=False, min_value=1,
        help_text="Its time limit; default FAIRQ_SESSION_DEFAULT_HOURS.")

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if isinstance(data, dict) and isinstance(data.get("gpu_fraction"), int | float) \
                and not isinstance(data.get("gpu_fraction"), bool):
            value["gpu_fraction"] = str(data["gpu_fraction"])
        return value


class SessionSerializer(serializers.Serializer[Any]):
    """A session as listed."""

    id = serializers.IntegerField(help_text="Its job's id.")
    team = serializers.CharField()
    name = serializers.CharField()
    owner = serializers.CharField(allow_null=True)
    state = serializers.CharField(help_text="Its job's state.")
    message = serializers.CharField()
    image = serializers.CharField()
    gpu_type = serializers.CharField()
    gpus = GpuAmountField(help_text="Whole GPUs, or the fraction of one GPU (0.25), as a "
                                    "job's gpus.")
    gpu_slices = serializers.IntegerField(help_text="0: whole GPUs; k: k slices of one GPU.")
    slices_per_gpu = serializers.IntegerField()
    gpu_share = serializers.FloatField(help_text="GPU-equivalents it holds (0.25 for 1/4).")
    gpu = serializers.CharField(help_text="'1/4 t4-shared' or '1 a100'.")
    sharing = serializers.CharField()
    memory_isolated = serializers.BooleanField()
    url = serializers.CharField(allow_null=True,
                                help_text="Its JupyterLab through fairq, while it runs.")
    page = serializers.CharField()
    ready = serializers.BooleanField(help_text="Its server has an address.")
    root_dir = serializers.CharField()
    volumes = serializers.ListField(child=serializers.CharField())
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    age_seconds = serializers.IntegerField()
    idle_minutes = serializers.IntegerField()
    idle_since = serializers.DateTimeField(allow_null=True)
    idle_limit_minutes = serializers.IntegerField()
    warn_minutes = serializers.IntegerField()
    warned_at = serializers.DateTimeField(allow_null=True)
    stops_at = serializers.DateTimeField(allow_null=True,
                                         help_text="When it is stopped unless used.")
    time_limit_at = serializers.DateTimeField(allow_null=True)
    max_runtime_seconds = serializers.IntegerField(allow_null=True)
    last_activity_at = serializers.DateTimeField(allow_null=True)
    last_checked_at = serializers.DateTimeField(allow_null=True)
    check_error = serializers.CharField()
    culled_at = serializers.DateTimeField(allow_null=True)
    gpu_hours = serializers.FloatField()
    cost = serializers.CharField(allow_null=True)
    currency = serializers.CharField()


class SessionListView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("all", bool, description="Every session of your teams "
                                                               "(staff: every one), not only "
                                                               "yours.")],
        responses=SessionSerializer(many=True))
    def get(self, request: Request) -> Response:
        """Your sessions, newest first (at most 200)."""
        every = request.query_params.get("all", "false")
        if every not in ("true", "false"):
            raise DomainError("all is true or false.", fields={"all": ["true or false."]})
        mine = every == "false"
        jobs = list(sessions_visible_to(actor=request.user, mine=mine)[:MAX_LISTED])
        return Response(SessionSerializer(session_rows(jobs, now=timezone.now()),
                                          many=True).data)

    @extend_schema(request=SessionStartSerializer, responses={201: SessionSerializer})
    def post(self, request: Request) -> Response:
        """Start a notebook session: it queues like a job of the session tier."""
        s = SessionStartSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        job = session_start(actor=request.user, **s.validated_data)
        job = session_get_for_actor(actor=request.user, job_id=job.pk)
        return Response(SessionSerializer(session_row(job, now=timezone.now())).data,
                        status=status.HTTP_201_CREATED)


class SessionDetailView(APIView):
    @extend_schema(responses=SessionSerializer)
    def get(self, request: Request, session_id: int) -> Response:
        """One session of your teams."""
        job = session_get_for_actor(actor=request.user, job_id=session_id)
        return Response(SessionSerializer(session_row(job, now=timezone.now())).data)

    @extend_schema(responses=SessionSerializer)
    def delete(self, request: Request, session_id: int) -> Response:
        """Stop it (a cancel): its pod goes, its PVC and files stay."""
        job = session_get_for_actor(actor=request.user, job_id=session_id)
        session_stop(actor=request.user, job=job)
        job = session_get_for_actor(actor=request.user, job_id=session_id)
        return Response(SessionSerializer(session_row(job, now=timezone.now())).data)
