"""What the Kubernetes backend reads from fairq's database, and `sync_cluster`.

Kept apart from the backend so the hot paths (statuses, nodes) never query: GPU types
are loaded through a TTL cache, quotas only when a namespace is first used or synced.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from .k8s_manifest import GpuTypeRef

if TYPE_CHECKING:
    from queueing.models import Tier

    from .kubernetes import KubernetesBackend, PriorityClassSpec


def gpu_type_refs() -> list[GpuTypeRef]:
    from queueing.models import GpuType

    return [GpuTypeRef(slug=g.slug, resource_name=g.resource_name,
                       node_labels={str(k): str(v) for k, v in (g.node_labels or {}).items()})
            for g in GpuType.objects.all()]


def team_gpu_limits(team: str) -> dict[str, int]:
    """Rule A1 as a ResourceQuota: per extended resource, the sum over the GPU types using
    it of `nominal + borrowing limit`; no entry (no limit) when any of those types is
    unlimited for the team (an empty borrowing limit, or no quota at all)."""
    from queueing.models import GpuType, Quota

    quotas = {q.gpu_type_id: q for q in Quota.objects.filter(team__slug=team)}
    limits: dict[str, int] = defaultdict(int)
    unlimited: set[str] = set()
    for g in GpuType.objects.all():
        q = quotas.get(g.pk)
        if q is None or q.borrowing_limit is None:
            unlimited.add(g.resource_name)
        else:
            limits[g.resource_name] += q.nominal + q.borrowing_limit
    return {r: n for r, n in limits.items() if r not in unlimited}


def preemption_policy(tier: Tier) -> str:
    """The PriorityClass's preemptionPolicy for a tier: always Never. fairq is the only
    preemptor (rules R1-R8: protection, minimum runtime, rate limits); kube-scheduler
    must not evict a fairq job behind its back. (A per-tier policy would need a Tier
    field; none exists.)"""
    return "Never"


def priority_class_specs() -> list[PriorityClassSpec]:
    from queueing.models import Tier

    from .kubernetes import PriorityClassSpec

    return [PriorityClassSpec(name=t.priority_class_name, value=t.priority_value,
                              preemption_policy=preemption_policy(t), tier=t.slug)
            for t in Tier.objects.order_by("rank")]


def sync_cluster(backend: KubernetesBackend | None = None) -> dict[str, Any]:
    """PriorityClasses for the tiers; a labelled namespace and ResourceQuota per team.
    Idempotent; returns what it did."""
    from accounts.models import Team

    if backend is None:
        from queueing.backends import get_backend

        from .kubernetes import KubernetesBackend

        got = get_backend()
        if not isinstance(got, KubernetesBackend):
            raise RuntimeError("sync_cluster needs FAIRQ_CLUSTER_BACKEND=kubernetes")
        backend = got
    report: dict[str, Any] = dict(backend.sync_priority_classes(priority_class_specs()))
    report["namespaces"] = [backend.ensure_namespace(t.slug, force=True,
                                                     run_as_non_root=t.run_as_non_root)
                            for t in Team.objects.order_by("slug")]
    return report
