"""API v1: the quota tree (docs/api.md, "Quota tree"; docs/scheduling.md, "Quotas in a
tree"): per GPU type, departments with their teams and each node's figures. Figures
only, so every authenticated user may read it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueing.selectors.quota_tree import pruned, quota_forest
from queueing.selectors.reference import gpu_type_by_slug

from .fields import GpuAmountField

_IN_DEVICES = " In the type's devices as quotas are written (GPUs; a MIG type's instances)."


class QuotaTreeNodeSerializer(serializers.Serializer[Any]):
    team = serializers.CharField(help_text="The team's slug.")
    name = serializers.CharField()
    is_department = serializers.BooleanField(help_text="A team with teams under it.")
    has_quota_row = serializers.BooleanField(
        source="has_row", help_text="It has a quota row of this type; else its nominal is "
        "its children's sum (a department) or 0.")
    nominal = GpuAmountField(help_text="Its row's nominal, or its children's sum." + _IN_DEVICES)
    borrowing_limit = GpuAmountField(allow_null=True, help_text="null: unlimited.")
    lending_limit = GpuAmountField(allow_null=True, help_text="null: all its unused quota.")
    held = GpuAmountField(help_text="What its whole subtree's admitted and running jobs "
                                    "hold (a fraction of a shared GPU its share).")
    subtree_quota = GpuAmountField(help_text="What it can hand out to its subtree beyond "
                                             "its children's kept parts.")
    guaranteed = GpuAmountField(help_text="The part of its subtree quota it never lends "
                                          "(subtree quota - lending limit; 0 with none).")
    borrowing = GpuAmountField(help_text="What it takes from above: its usage beyond its "
                                         "subtree quota.")
    lent = GpuAmountField(help_text="What of its nominal others hold now (rule Q9).")
    available = GpuAmountField(allow_null=True, help_text="How many more its own jobs "
                               "may take now, borrowing included (null: unbounded).")

    def get_fields(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        fields = super().get_fields()
        # Nested as deep as the tree: built when read, so the class can name itself.
        fields["children"] = QuotaTreeNodeSerializer(
            many=True, read_only=True, help_text="The teams under it, by slug.")
        return fields

    def to_representation(self, instance: Any) -> Any:
        # null limits stay null (GpuAmountField would turn them into numbers).
        data = super().to_representation(instance)
        for key in ("borrowing_limit", "lending_limit", "available"):
            if getattr(instance, key) is None:
                data[key] = None
        return data




class QuotaTreeSerializer(serializers.Serializer[Any]):
    gpu_type = serializers.CharField()
    sharing = serializers.CharField()
    slices_per_gpu = serializers.IntegerField()
    capacity = GpuAmountField(help_text="The fleet's capacity of the type that takes new "
                                        "work (draining clusters' nodes left out, rule K8).")
    held = GpuAmountField(help_text="What every team's admitted and running jobs hold.")
    unassigned = GpuAmountField(help_text="The capacity no top-level team or department "
                                          "is given (negative: nominals pass capacity).")
    available = GpuAmountField(help_text="What the fleet has left for anyone to take.")
    teams = QuotaTreeNodeSerializer(many=True, source="roots", help_text=(
        "The top-level teams and departments, by slug, each with its `children`: only "
        "the nodes with a quota row of the type, or holding some of it, or above one."))


GPU_TYPE_PARAM = OpenApiParameter("gpu_type", str, description="A GPU type slug: only its "
                                  "tree (default: every type's).")


class QuotaTreeView(APIView):
    """The quota tree per GPU type (docs/scheduling.md, "Quotas in a tree")."""

    @extend_schema(parameters=[GPU_TYPE_PARAM], responses=QuotaTreeSerializer(many=True))
    def get(self, request: Request) -> Response:
        """Per GPU type, departments with their teams (nested) and each node's nominal,
        limits, held GPUs, subtree quota, guarantee, borrowing, lent and available.
        Figures only: readable by every authenticated user."""
        slug = request.query_params.get("gpu_type")
        if slug is not None and gpu_type_by_slug(slug=slug) is None:
            raise serializers.ValidationError({"gpu_type": [
                f"No GPU type {slug[:40]!r}: GET /api/v1/gpu-types/ lists them."]})
        forest = quota_forest(gpu_type=slug)
        for tree in forest.trees:
            tree.roots = [n for n in (pruned(r) for r in tree.roots) if n is not None]
        return Response(QuotaTreeSerializer(forest.trees, many=True).data)

