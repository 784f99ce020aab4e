"""API v1: quotas (read; staff write), tiers, GPU types, usage and cluster capacity."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.selectors import all_teams, teams_for_user
from queueing.errors import NotFound
from queueing.models import GPU_SHARING_CHOICES, GpuType, Quota, Tier
from queueing.selectors.capacity import capacity_by_gpu_type
from queueing.selectors.reference import (
    all_gpu_types,
    all_tiers,
    gpu_type_by_slug,
    quota_of_teams,
    quotas_of_teams,
)
from queueing.selectors.usage import BUCKETS, MAX_BUCKETS, usage_buckets
from queueing.services.access import check_staff
from queueing.services.quotas import gpu_type_sharing_set, quota_set

from .fields import GpuAmountField, InstantField
from .idempotency import IdempotentPostMixin
from .location import location
from .scope import teams_asked
from .strict import StrictFieldsMixin


class QuotaSerializer(StrictFieldsMixin, serializers.ModelSerializer[Quota]):
    team = serializers.SlugRelatedField(slug_field="slug", queryset=all_teams())
    gpu_type = serializers.SlugRelatedField(slug_field="slug", queryset=all_gpu_types())
    nominal = serializers.IntegerField(min_value=0, max_value=1_000_000)
    borrowing_limit = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False,
                                               allow_null=True)
    lending_limit = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False,
                                             allow_null=True)

    class Meta:
        model = Quota
        fields = ["id", "team", "gpu_type", "nominal", "borrowing_limit", "lending_limit"]
        read_only_fields = ["id"]
        validators: list[Any] = []  # quota_set upserts: (team, gpu_type) may exist


class QuotaUpdateSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    nominal = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False)
    borrowing_limit = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False,
                                               allow_null=True)
    lending_limit = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False,
                                             allow_null=True)


TEAM_PARAM = OpenApiParameter("team", str, description="A team slug (one of yours).")


class QuotaListView(IdempotentPostMixin, APIView):
    """Quotas of the caller's teams (every team for staff). Staff POST to create or update
    the quota of a (team, GPU type)."""

    @extend_schema(parameters=[TEAM_PARAM], responses=QuotaSerializer(many=True))
    def get(self, request: Request) -> Response:
        """List the quotas of the caller's teams (every team for staff): nominal,
        borrowing and lending limits per GPU type (rule Q1)."""
        slug = request.query_params.get("team")
        teams = teams_for_user(user=request.user, slug=slug or None)
        quotas = quotas_of_teams(teams=teams)
        return Response(QuotaSerializer(quotas, many=True).data)

    @extend_schema(request=QuotaSerializer, responses={201: QuotaSerializer, 200: QuotaSerializer})
    def post(self, request: Request) -> Response:
        """Set the quota of a (team, GPU type) (staff): 201 new with `Location`, 200
        changed. Audited."""
        check_staff(actor=request.user, doing="change quotas")
        s = QuotaSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        d = s.validated_data
        extra = {k: d[k] for k in ("borrowing_limit", "lending_limit") if k in d}
        quota, created = quota_set(actor=request.user, team=d["team"], gpu_type=d["gpu_type"],
                                   nominal=d["nominal"], **extra)
        return Response(QuotaSerializer(quota).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
                        headers=location("quota-detail", quota_id=quota.pk) if created else None)


class QuotaDetailView(IdempotentPostMixin, APIView):
    def _quota(self, request: Request, quota_id: int) -> Quota:
        quota = quota_of_teams(quota_id=quota_id, teams=teams_for_user(user=request.user))
        if quota is None:
            raise NotFound(f"quota {quota_id} not found")
        return quota

    @extend_schema(responses=QuotaSerializer)
    def get(self, request: Request, quota_id: int) -> Response:
        """Read one quota of the caller's teams (any team's for staff)."""
        return Response(QuotaSerializer(self._quota(request, quota_id)).data)

    @extend_schema(request=QuotaUpdateSerializer, responses=QuotaSerializer)
    def patch(self, request: Request, quota_id: int) -> Response:
        """Change one quota (staff): nominal, borrowing limit, lending limit (at most
        the nominal). Audited."""
        quota = self._quota(request, quota_id)
        check_staff(actor=request.user, doing="change quotas")
        s = QuotaUpdateSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        quota, _ = quota_set(actor=request.user, team=quota.team, gpu_type=quota.gpu_type,
                             **s.validated_data)
        return Response(QuotaSerializer(quota).data)


class TierSerializer(serializers.ModelSerializer[Tier]):
    preemption_lost_per_wait = serializers.FloatField(
        read_only=True, allow_null=True,
        help_text="Rule R9 for this tier's jobs: the most GPU-hours a preemption may lose per "
                  "GPU-hour the preemptor waited; null: FAIRQ_PREEMPTION_LOST_PER_WAIT; -1: "
                  "no R9 check for this tier.")
    owed_preempts_at_once = serializers.BooleanField(
        read_only=True,
        help_text="A job of this tier owed its GPUs (rule R11) preempts at once; false: it "
                  "waits by the ordinary rules, R9 included.")

    class Meta:
        model = Tier
        fields = ["slug", "name", "rank", "priority_class_name", "priority_value",
                  "preemptible", "min_runtime_seconds", "max_termination_grace_seconds",
                  "open_to_all_teams", "idle_threshold_percent", "idle_window_minutes",
                  "idle_action", "idle_grace_minutes", "flavor_fallback",
                  "preemption_lost_per_wait", "owed_preempts_at_once"]
        read_only_fields = fields


class GpuTypeSerializer(serializers.ModelSerializer[GpuType]):
    topology_levels = serializers.ListField(
        child=serializers.DictField(child=serializers.CharField()), read_only=True,
        help_text='Rule A7, narrow to wide: [{"name": "rack", "node_label": '
                  '"topology.kubernetes.io/rack"}]; a job\'s `topology.level` names one.')

    class Meta:
        model = GpuType
        fields = ["slug", "name", "resource_name", "billing_weight", "topology_levels",
                  "sharing", "slices_per_gpu"]
        extra_kwargs = {
            "sharing": {"help_text": (
                "How one GPU is shared: exclusive (whole GPUs), mig (each device an "
                "isolated instance of one MIG profile), time-sliced or mps (the device "
                "plugin's replicas of a GPU: NO memory isolation between the jobs sharing "
                "it). A job on a time-sliced or mps type may ask a fraction of one GPU "
                "(gpus 0.25).")},
            "slices_per_gpu": {"help_text": (
                "exclusive: 1; mig: instances of the profile per GPU; time-sliced and mps: "
                "replicas per GPU (a fraction is a multiple of 1/slices_per_gpu).")},
        }
        read_only_fields = fields


class TierListView(APIView):
    """Service tiers, highest rank (scheduled first) first."""

    @extend_schema(responses=TierSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(TierSerializer(all_tiers(), many=True).data)


class GpuTypeListView(APIView):
    @extend_schema(responses=GpuTypeSerializer(many=True))
    def get(self, request: Request) -> Response:
        """List the GPU types: billing weight (rule F1), topology levels (rule A7), and
        how one GPU is shared (sharing, slices_per_gpu; time-sliced and mps: no memory
        isolation)."""
        return Response(GpuTypeSerializer(all_gpu_types(), many=True).data)


class GpuTypeSharingSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    sharing = serializers.ChoiceField(
        choices=[c for c, _ in GPU_SHARING_CHOICES], required=False,
        help_text="exclusive, mig, time-sliced or mps (time-sliced and mps: NO memory "
                  "isolation between the jobs sharing a GPU).")
    slices_per_gpu = serializers.IntegerField(
        required=False, min_value=1, max_value=64,
        help_text="exclusive: 1; mig, time-sliced, mps: 2-64.")


class GpuTypeDetailView(APIView):
    @extend_schema(responses=GpuTypeSerializer)
    def get(self, request: Request, slug: str) -> Response:
        """Read one GPU type."""
        return Response(GpuTypeSerializer(self._gpu_type(slug)).data)

    @extend_schema(request=GpuTypeSharingSerializer, responses=GpuTypeSerializer)
    def patch(self, request: Request, slug: str) -> Response:
        """Change how one GPU of the type is shared (staff): `sharing` and
        `slices_per_gpu`, checked together (exclusive: 1; mig, time-sliced, mps: 2-64),
        refused while jobs of the type are queued, admitted or running. Audited."""
        gpu_type = self._gpu_type(slug)
        check_staff(actor=request.user, doing="change GPU types")
        s = GpuTypeSharingSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        row = gpu_type_sharing_set(actor=request.user, gpu_type=gpu_type, **s.validated_data)
        return Response(GpuTypeSerializer(row).data)

    def _gpu_type(self, slug: str) -> GpuType:
        row = gpu_type_by_slug(slug=slug)
        if row is None:
            raise NotFound(f"GPU type {slug[:40]!r} not found")
        return row


class UsageQuerySerializer(serializers.Serializer[Any]):
    team = serializers.CharField(required=False, max_length=40)
    from_ = InstantField(required=False)
    to = InstantField(required=False)
    bucket = serializers.ChoiceField(choices=sorted(BUCKETS), default="day")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["from"] = self.fields.pop("from_")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        step = BUCKETS[attrs["bucket"]]
        end: datetime = attrs.get("to") or timezone.now()
        # The field is declared as `from_` (a keyword) and exposed as `from`.
        given = attrs.pop("from_", None) or attrs.get("from")
        start: datetime = given or end - (step * 24 if step < timedelta(days=1) else step * 30)
        if start >= end:
            raise serializers.ValidationError({"from": ["Must be before 'to'."]})
        if (end - start) / step > MAX_BUCKETS:
            raise serializers.ValidationError(
                {"from": [f"At most {MAX_BUCKETS} {attrs['bucket']} buckets per request."]})
        attrs["from"], attrs["to"] = start, end
        return attrs


class UsageBucketSerializer(serializers.Serializer[Any]):
    team = serializers.CharField()
    gpu_type = serializers.CharField()
    start = serializers.DateTimeField()
    gpu_hours = serializers.FloatField()
    weighted_gpu_hours = serializers.FloatField(help_text="GPU-hours × the type's billing weight")


class UsageView(APIView):
    """GPU-hours of finished attempt intervals per team, GPU type and hour or day (UTC)."""

    @extend_schema(
        parameters=[
            TEAM_PARAM,
            OpenApiParameter("from", datetime, description="Start (default: 24 buckets ago "
                             "for hours, 30 for days)."),
            OpenApiParameter("to", datetime, description="End, exclusive (default: now)."),
            OpenApiParameter("bucket", str, enum=sorted(BUCKETS), default="day"),
        ],
        responses=inline_serializer("Usage", {
            "from": serializers.DateTimeField(), "to": serializers.DateTimeField(),
            "bucket": serializers.CharField(),
            "buckets": UsageBucketSerializer(many=True),
        }),
    )
    def get(self, request: Request) -> Response:
        q = UsageQuerySerializer(data=request.query_params)
        q.is_valid(raise_exception=True)
        d = q.validated_data
        teams = teams_asked(user=request.user, slug=d.get("team"))
        rows = usage_buckets(teams=teams, start=d["from"], end=d["to"], bucket=d["bucket"])
        return Response({"from": d["from"], "to": d["to"], "bucket": d["bucket"],
                         "buckets": UsageBucketSerializer(rows, many=True).data})


class CapacityNodeSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    gpu_type = serializers.CharField()
    capacity = GpuAmountField()
    allocated = GpuAmountField(help_text="GPUs in use as the cluster reports it")
    free = GpuAmountField()
    draining = serializers.BooleanField(help_text=(
        "A node of a disabled cluster still draining (rule K8): its jobs run on, but its "
        "free GPUs take no new work."))


class CapacitySerializer(serializers.Serializer[Any]):
    gpu_type = serializers.CharField()
    nodes = serializers.IntegerField()
    sharing = serializers.CharField(help_text=(
        "How one GPU is shared: exclusive, mig, time-sliced or mps (time-sliced and mps: "
        "no memory isolation between the jobs on a GPU)."))
    slices_per_gpu = serializers.IntegerField()
    capacity = GpuAmountField(help_text="GPUs (a MIG type: instances)")
    capacity_slices = serializers.IntegerField(help_text=(
        "A time-sliced or MPS type: its nodes' slices (GPUs x slices_per_gpu); else 0."))
    allocated_slices = serializers.IntegerField(help_text=(
        "A time-sliced or MPS type: the slices in use as the cluster reports them."))
    allocated = GpuAmountField(help_text="GPUs in use as the cluster reports it (a "
                                         "time-sliced or MPS type: its slices in use / "
                                         "slices_per_gpu, e.g. 2.25)")
    free = GpuAmountField()
    held_by_jobs = GpuAmountField(help_text="GPUs of admitted and running jobs (a fraction "
                                            "counts its share: 0.25), each under the type "
                                            "it was admitted on")
    queued_demand = GpuAmountField(
        help_text="GPUs asked for by queued jobs that accept this type only")
    queued_any_of = GpuAmountField(help_text=(
        "GPUs asked for by queued jobs that accept this type or others (`gpu_types`): "
        "such a job counts under each type it accepts, so the sum over types counts it "
        "once per type; it runs on one of them"))
    by_node = CapacityNodeSerializer(many=True, help_text=(
        "Each node of the type, by name, as the cluster reports it: its free GPUs are the "
        "largest block one replica can get there (docs/scheduling.md, rule E3), unless it "
        "is `draining` (rule K8)."))


class CapacityView(APIView):
    """Cluster capacity per GPU type, as the cluster and fairq each see it, with each
    node's free GPUs (`by_node`)."""

    @extend_schema(responses=CapacitySerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response(CapacitySerializer(capacity_by_gpu_type()[0], many=True).data)
