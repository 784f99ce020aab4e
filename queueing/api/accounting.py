"""API v1: accounting like `sacct` (GET /api/v1/accounting/)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import remove_query_param, replace_query_param
from rest_framework.views import APIView

from queueing.selectors.accounting import ATTEMPT_STATES, AccountingFilter, accounting_page

from .fields import GpuAmountField, InstantField
from .scope import teams_asked

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


class AccountingQuerySerializer(serializers.Serializer[Any]):
    team = serializers.CharField(required=False, max_length=40)
    user = serializers.CharField(required=False, max_length=150)
    from_ = InstantField(required=False)
    to = InstantField(required=False)
    state = serializers.ListField(child=serializers.CharField(max_length=20), required=False)
    gpu_type = serializers.CharField(required=False, max_length=40)
    offset = serializers.IntegerField(required=False, min_value=0, default=0)
    page_size = serializers.IntegerField(required=False, min_value=1, max_value=MAX_PAGE_SIZE,
                                         default=PAGE_SIZE)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["from"] = self.fields.pop("from_")  # `from` is a keyword

    def to_internal_value(self, data: Any) -> Any:
        # `state` repeated (?state=A&state=B) or comma-separated (?state=A,B).
        if hasattr(data, "getlist"):
            states = [s.strip().upper() for v in data.getlist("state") for s in v.split(",")]
            data = {k: data.get(k) for k in data if k != "state"}
            if states:
                data["state"] = states
        return super().to_internal_value(data)

    def validate_state(self, value: list[str]) -> list[str]:
        bad = sorted(set(value) - set(ATTEMPT_STATES))
        if bad:
            raise serializers.ValidationError(
                f"Unknown state(s) {', '.join(bad)}; one of {', '.join(ATTEMPT_STATES)}.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # The field is declared as `from_` (its source) and exposed as `from`.
        attrs["from"] = attrs.pop("from_", None) or attrs.get("from")
        start, end = attrs["from"], attrs.get("to")
        if start is not None and end is not None and start >= end:
            raise serializers.ValidationError({"from": ["Must be before 'to'."]})
        return attrs


class AccountingRowSerializer(serializers.Serializer[Any]):
    job_id = serializers.IntegerField()
    attempt = serializers.IntegerField()
    name = serializers.CharField()
    user = serializers.CharField(allow_null=True)
    team = serializers.CharField()
    gpu_type = serializers.CharField()
    tier = serializers.CharField()
    gpus = GpuAmountField(help_text="GPUs the attempt held (a fraction of a shared GPU: "
                                    "its share, 0.25)")
    start = serializers.DateTimeField()
    end = serializers.DateTimeField(allow_null=True, help_text="null while running")
    elapsed_seconds = serializers.IntegerField()
    gpu_hours = serializers.FloatField()
    state = serializers.ChoiceField(choices=ATTEMPT_STATES, help_text=(
        "RUNNING now, or how the attempt ended: its job's state then (REQUEUED: the "
        "cluster lost an admitted attempt and fairq queued the job again)"))
    exit_code = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField(help_text="the reason of the transition that ended it")
    sm_mean = serializers.FloatField(allow_null=True, help_text="mean SM activity, percent")
    efficiency = serializers.FloatField(allow_null=True, help_text="sm_mean / 100")


class AccountingView(APIView):
    """Job attempts that held GPUs, like Slurm's `sacct`: running ones first, then
    finished ones, newest start first. Team members see their teams' attempts; staff
    every team's. `from`/`to` keep attempts that overlap the range."""

    @extend_schema(
        parameters=[
            OpenApiParameter("team", str), OpenApiParameter("user", str),
            OpenApiParameter("from", str, description="ISO 8601 instant with an offset"),
            OpenApiParameter("to", str, description="ISO 8601 instant with an offset"),
            OpenApiParameter("state", str, many=True, enum=list(ATTEMPT_STATES)),
            OpenApiParameter("gpu_type", str),
            OpenApiParameter("offset", int), OpenApiParameter("page_size", int),
        ],
        responses=inline_serializer("AccountingPage", {
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": AccountingRowSerializer(many=True),
        }),
    )
    def get(self, request: Request) -> Response:
        q = AccountingQuerySerializer(data=request.query_params)
        q.is_valid(raise_exception=True)
        d = q.validated_data
        teams = teams_asked(user=request.user, slug=d.get("team"))
        f = AccountingFilter(teams=teams, user=d.get("user"), start=d.get("from"),
                             end=d.get("to"), states=tuple(d.get("state") or ()),
                             gpu_type=d.get("gpu_type"))
        offset, size = d["offset"], d["page_size"]
        rows, more = accounting_page(f, now=timezone.now(), offset=offset, limit=size)
        url = request.build_absolute_uri()
        previous = None
        if offset > 0:
            back = max(0, offset - size)
            previous = (replace_query_param(url, "offset", back) if back
                        else remove_query_param(url, "offset"))
        return Response({
            "next": replace_query_param(url, "offset", offset + size) if more else None,
            "previous": previous,
            "results": AccountingRowSerializer(rows, many=True).data,
        })
