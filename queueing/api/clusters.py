"""API v1: the clusters fairq schedules onto and their node pools (docs/api.md,
"Clusters"; docs/scheduling.md, rules K1-K8). Everyone reads them with their capacity;
staff add, change and disable (drain, rule K8) them, audited."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueing.errors import DomainError
from queueing.models import Cluster, NodePool
from queueing.selectors.clusters import (
    CLUSTER_STATES,
    ClusterSummary,
    cluster_get,
    cluster_summaries,
    node_pool_get,
    node_pools_of,
)
from queueing.selectors.lookups import gpu_types_by_slug
from queueing.services.access import check_staff
from queueing.services.cluster_admin import (
    INVALID_FIELDS,
    cluster_create,
    cluster_update,
    node_pool_create,
    node_pool_delete,
    node_pool_update,
)

from .idempotency import IdempotentPostMixin
from .location import location
from .strict import StrictFieldsMixin

# --- answers -----------------------------------------------------------------------------


class ClusterGpuTypeSerializer(serializers.Serializer[Any]):
    gpu_type = serializers.CharField()
    nodes = serializers.IntegerField(help_text="Its nodes in the published cluster view.")
    capacity = serializers.IntegerField(help_text="GPUs on them.")
    free = serializers.IntegerField(help_text="GPUs not allocated, as the cluster reports.")
    spot_capacity = serializers.IntegerField(
        help_text="Of `capacity`, GPUs on spot (interruptible) nodes (rule K4).")
    spot_free = serializers.IntegerField(help_text="Of `free`, GPUs on spot nodes.")
    held_by_jobs = serializers.IntegerField(
        help_text="GPUs of fairq's admitted and running jobs placed in this cluster.")


class NodePoolSerializer(serializers.ModelSerializer[NodePool]):
    gpu_type = serializers.CharField(source="gpu_type.slug")
    price_per_gpu_hour = serializers.DecimalField(
        max_digits=12, decimal_places=4, allow_null=True,
        help_text="Its own price (rule C1's currency); null: the GPU type's price.")

    class Meta:
        model = NodePool
        fields = ["name", "gpu_type", "spot", "node_labels", "price_per_gpu_hour"]
        read_only_fields = fields


class ClusterSerializer(serializers.Serializer[Any]):
    """A cluster and its capacity. `kubeconfig`, `kube_context`, `in_cluster`, `sim_nodes`
    (how fairq reaches it) are for staff only: absent for others."""

    name = serializers.CharField(allow_null=True, help_text=(
        "Its name (null for the implicit cluster, which has no URL of its own)."))
    implicit = serializers.BooleanField(
        help_text="True for the one cluster configured by settings, listed when no "
                  "cluster is configured (FAIRQ_CLUSTER_BACKEND, FAIRQ_SIM_NODES, ...).")
    backend = serializers.CharField(help_text="simulated or kubernetes.")
    labels = serializers.DictField(child=serializers.CharField(),
                                   help_text="What a job's `cluster_selector` matches (K3).")
    enabled = serializers.BooleanField(help_text=(
        "False: it drains (rule K8) - nothing new is admitted there; its jobs run on."))
    state = serializers.ChoiceField(choices=CLUSTER_STATES, help_text=(
        "Rule K8: `enabled`; `draining` - disabled, its `running_jobs` still run there "
        "(read, charged, ending as anywhere) and nothing new goes there; `drained` - "
        "disabled, the scheduler found no job left there (`drained_at`) and reads it no "
        "more."))
    drained_at = serializers.DateTimeField(allow_null=True, help_text=(
        "When the scheduler found this disabled cluster with no job left (rule K8); null "
        "while it is enabled or draining."))
    reachable = serializers.BooleanField(
        help_text="False while the scheduler cannot reach it (rule K5).")
    unreachable_since = serializers.DateTimeField(allow_null=True)
    last_seen_at = serializers.DateTimeField(allow_null=True,
                                             help_text="When the scheduler last read it.")
    cost_rank = serializers.IntegerField(
        help_text="Rule K2: among clusters where a job fits, the lowest goes first.")
    capacity = serializers.IntegerField(help_text=(
        "GPUs of every type (while `draining` too: its real capacity, none of it for new "
        "work, rule K8)."))
    free = serializers.IntegerField(help_text="GPUs not allocated.")
    spot_capacity = serializers.IntegerField(help_text="GPUs on spot nodes.")
    running_jobs = serializers.IntegerField(
        help_text="fairq's admitted and running jobs placed there (while `draining`: the "
                  "jobs it waits for).")
    gpu_types = ClusterGpuTypeSerializer(many=True)
    pools = NodePoolSerializer(many=True, help_text="Its node pools (rule K4: spot pools).")
    kubeconfig = serializers.CharField(required=False, help_text="Staff only.")
    kube_context = serializers.CharField(source="context", required=False,
                                         help_text="Staff only: the kubeconfig context.")
    in_cluster = serializers.BooleanField(required=False, help_text="Staff only.")
    sim_nodes = serializers.CharField(required=False, help_text="Staff only.")

    def to_representation(self, instance: Any) -> Any:
        data = super().to_representation(instance)
        if data.get("implicit"):
            data["name"] = None  # not a name a URL could take (clusters/{name}/)
        request = self.context.get("request")
        if request is None or not request.user.is_staff:
            for name in _STAFF_ONLY:
                data.pop(name, None)
        return data


_STAFF_ONLY = ("kubeconfig", "kube_context", "in_cluster", "sim_nodes")


def _one(name: str) -> ClusterSummary:
    summaries, _ = cluster_summaries()
    for s in summaries:
        if s.name == name and not s.implicit:
            return s
    cluster_get(name=name)  # NotFound
    raise AssertionError("unreachable")  # pragma: no cover


# --- writes ------------------------------------------------------------------------------


def _labels_field(help_text: str) -> serializers.DictField:
    return serializers.DictField(child=serializers.CharField(max_length=63, allow_blank=True),
                                 required=False, help_text=help_text)


class ClusterWriteSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """A cluster as staff post it; a PATCH gives only the fields it changes (not `name`)."""

    name = serializers.CharField(max_length=40, help_text=(
        "1-40 lower-case letters, digits or '-' (it becomes part of Kubernetes names)."))
    backend = serializers.CharField(max_length=16, required=False, help_text=(
        "simulated (default; `sim_nodes` say its nodes) or kubernetes (`kubeconfig` and "
        "`kube_context`, or `in_cluster`)."))
    kubeconfig = serializers.CharField(max_length=500, required=False, allow_blank=True,
                                       help_text="Absolute path of a kubeconfig file on the "
                                                 "scheduler (kubernetes only).")
    kube_context = serializers.CharField(
        source="context", max_length=200, required=False, allow_blank=True,
        help_text="The kubeconfig's context (empty: its current one).")
    in_cluster = serializers.BooleanField(required=False, help_text=(
        "Use the scheduler pod's service account (at most one cluster)."))
    sim_nodes = serializers.CharField(max_length=500, required=False, allow_blank=True,
                                      help_text="simulated only: FAIRQ_SIM_NODES' grammar, "
                                                "e.g. 4x8xh100,2x8xa100.")
    enabled = serializers.BooleanField(required=False, help_text=(
        "false drains it (rule K8): nothing new is admitted there, what runs there runs "
        "on to its end; true makes it an ordinary cluster again."))
    labels = _labels_field('e.g. {"region": "eu-west", "cost": "cloud"}.')
    cost_rank = serializers.IntegerField(required=False, min_value=-1_000_000,
                                         max_value=1_000_000,
                                         help_text="Rule K2: lower ranks are chosen first.")


class ClusterPatchSerializer(ClusterWriteSerializer):
    name = serializers.CharField(max_length=40, required=False,
                                 help_text="Unchangeable: a cluster keeps its name.")


class NodePoolWriteSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """A node pool as staff post it; a PATCH gives only the fields it changes."""

    name = serializers.CharField(max_length=40, help_text="Unique in its cluster.")
    gpu_type = serializers.CharField(max_length=40, help_text="A GPU type's slug.")
    spot = serializers.BooleanField(required=False, help_text=(
        "Interruptible capacity: used by preemptible tiers and jobs with allow_spot (K4)."))
    node_labels = _labels_field("The labels its nodes carry besides the GPU type's.")
    price_per_gpu_hour = serializers.DecimalField(
        max_digits=12, decimal_places=4, required=False, allow_null=True,
        help_text="Its own price per GPU-hour; null: the GPU type's (rule C1).")


class NodePoolPatchSerializer(NodePoolWriteSerializer):
    name = serializers.CharField(max_length=40, required=False,
                                 help_text="Unchangeable: a pool keeps its name.")
    gpu_type = serializers.CharField(max_length=40, required=False)


def _valid(serializer_class: type[serializers.Serializer[Any]], data: Any) -> dict[str, Any]:
    s = serializer_class(data=data)
    s.is_valid(raise_exception=True)
    return dict(s.validated_data)


@contextmanager
def _api_names() -> Iterator[None]:
    """The service's refusals under the API's field names (`context` is `kube_context`
    here: a serializer's `context` is DRF's own)."""
    try:
        yield
    except DomainError as exc:
        if "context" not in exc.fields:
            raise
        fields = {("kube_context" if k == "context" else k): m for k, m in exc.fields.items()}
        raise DomainError(exc.message, fields=fields) from None


def _with_gpu_type(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with its `gpu_type` slug as the row; a 400 naming the known ones."""
    if "gpu_type" in values:
        types = gpu_types_by_slug()
        row = types.get(values["gpu_type"])
        if row is None:
            raise DomainError(INVALID_FIELDS, fields={"gpu_type": [
                f"Unknown GPU type {values['gpu_type']!r}; known: {', '.join(sorted(types))}."]})
        values["gpu_type"] = row
    return values


# --- views -------------------------------------------------------------------------------


class ClusterListView(IdempotentPostMixin, APIView):
    """The clusters, lowest cost rank first (rule K2), with their capacity; staff POST to
    add one."""

    @extend_schema(responses=ClusterSerializer(many=True))
    def get(self, request: Request) -> Response:
        """Every cluster (everyone): labels, enabled, reachable (rule K5), cost rank, and
        per GPU type its capacity, free and spot GPUs from the published cluster view.
        With no cluster configured, one entry: the implicit cluster (`implicit`, name "")."""
        summaries, _ = cluster_summaries()
        return Response(ClusterSerializer(summaries, many=True,
                                          context={"request": request}).data)

    @extend_schema(request=ClusterWriteSerializer, responses={201: ClusterSerializer})
    def post(self, request: Request) -> Response:
        """Add a cluster (staff): 201 with `Location`; 400 naming every refused field
        (an unknown backend, a kubeconfig for a simulated cluster, bad labels, ...).
        Audited."""
        check_staff(actor=request.user, doing="add clusters")
        with _api_names():
            row = cluster_create(actor=request.user,
                                 values=_valid(ClusterWriteSerializer, request.data))
        return Response(ClusterSerializer(_one(row.name), context={"request": request}).data,
                        status=status.HTTP_201_CREATED,
                        headers=location("cluster-detail", name=row.name))


# A cluster's (and a pool's) name in the path is a slug, never empty: the implicit
# cluster, listed as "", has no detail URL.
_NAME = OpenApiParameter("name", str, OpenApiParameter.PATH, pattern=r"^[-a-zA-Z0-9_]+$",
                         description="The cluster's name.")
_POOL = OpenApiParameter("pool", str, OpenApiParameter.PATH, pattern=r"^[-a-zA-Z0-9_]+$",
                         description="The node pool's name.")


@extend_schema(parameters=[_NAME])
class ClusterDetailView(IdempotentPostMixin, APIView):
    @extend_schema(responses=ClusterSerializer)
    def get(self, request: Request, name: str) -> Response:
        """One cluster with its capacity and node pools."""
        return Response(ClusterSerializer(_one(name), context={"request": request}).data)

    @extend_schema(request=ClusterPatchSerializer, responses=ClusterSerializer)
    def patch(self, request: Request, name: str) -> Response:
        """Change a cluster (staff): `{"enabled": false}` drains it (rule K8: its jobs run
        on, nothing new goes there; `state` says `draining`, then `drained`);
        `{"enabled": true}` makes it an ordinary cluster again. Audited."""
        cluster = cluster_get(name=name)
        check_staff(actor=request.user, doing="change clusters")
        with _api_names():
            cluster_update(actor=request.user, cluster=cluster,
                           values=_valid(ClusterPatchSerializer, request.data))
        return Response(ClusterSerializer(_one(name), context={"request": request}).data)


@extend_schema(parameters=[_NAME])
class NodePoolListView(IdempotentPostMixin, APIView):
    @extend_schema(responses=NodePoolSerializer(many=True))
    def get(self, request: Request, name: str) -> Response:
        """A cluster's node pools."""
        cluster = cluster_get(name=name)
        return Response(NodePoolSerializer(
            node_pools_of(cluster=cluster), many=True).data)

    @extend_schema(request=NodePoolWriteSerializer, responses={201: NodePoolSerializer})
    def post(self, request: Request, name: str) -> Response:
        """Add a node pool (staff): 201 with `Location`. Audited."""
        cluster = cluster_get(name=name)
        check_staff(actor=request.user, doing="change node pools")
        values = _with_gpu_type(_valid(NodePoolWriteSerializer, request.data))
        pool = node_pool_create(actor=request.user, cluster=cluster, values=values)
        return Response(NodePoolSerializer(pool).data, status=status.HTTP_201_CREATED,
                        headers=location("nodepool-detail", name=name, pool=pool.name))


@extend_schema(parameters=[_NAME, _POOL])
class NodePoolDetailView(IdempotentPostMixin, APIView):
    def _pool(self, name: str, pool: str) -> NodePool:
        cluster: Cluster = cluster_get(name=name)
        return node_pool_get(cluster=cluster, name=pool)

    @extend_schema(responses=NodePoolSerializer)
    def get(self, request: Request, name: str, pool: str) -> Response:
        """One node pool."""
        return Response(NodePoolSerializer(self._pool(name, pool)).data)

    @extend_schema(request=NodePoolPatchSerializer, responses=NodePoolSerializer)
    def patch(self, request: Request, name: str, pool: str) -> Response:
        """Change a node pool (staff). Audited."""
        row = self._pool(name, pool)
        check_staff(actor=request.user, doing="change node pools")
        values = _with_gpu_type(_valid(NodePoolPatchSerializer, request.data))
        row = node_pool_update(actor=request.user, pool=row, values=values)
        return Response(NodePoolSerializer(node_pool_get(cluster=row.cluster,
                                                         name=row.name)).data)

    @extend_schema(request=None, responses={204: None})
    def delete(self, request: Request, name: str, pool: str) -> Response:
        """Remove a node pool (staff). Audited."""
        row = self._pool(name, pool)
        check_staff(actor=request.user, doing="change node pools")
        node_pool_delete(actor=request.user, pool=row)
        return Response(status=status.HTTP_204_NO_CONTENT)
