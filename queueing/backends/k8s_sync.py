"""What the Kubernetes backend reads from fairq's database, and `sync_cluster`.

Kept apart from the backend so the hot paths (statuses, nodes) never query: GPU types
are loaded through a TTL cache, quotas only when a namespace is first used or synced.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from .k8s_manifest import QUOTA_NAME, GpuTypeRef

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
    Idempotent; returns what it did. Each object is made on its own: one that fails (a
    name the API server refuses, a 403, a timeout) is listed in `failed` (kind, name,
    HTTP status, error) and never stops the others."""
    from accounts.models import Team

    from .kubernetes import sync_failure

    if backend is None:
        from queueing.composition import get_backend

        from .kubernetes import KubernetesBackend

        got = get_backend()
        if not isinstance(got, KubernetesBackend):
            raise RuntimeError("sync_cluster needs FAIRQ_CLUSTER_BACKEND=kubernetes")
        backend = got
    report: dict[str, Any] = dict(backend.sync_priority_classes(priority_class_specs()))
    failed: list[dict[str, Any]] = report.setdefault("failed", [])
    report["namespaces"] = []
    for slug, non_root in Team.objects.order_by("slug").values_list("slug", "run_as_non_root"):
        namespace = f"{backend.namespace_prefix}{slug}"
        try:
            namespace = backend.ensure_namespace(slug, force=True, quota=False,
                                                 run_as_non_root=non_root)
        except Exception as exc:
            failed.append(sync_failure("Namespace", namespace, exc))
            continue
        report["namespaces"].append(namespace)
        if backend.team_quota is None:
            continue
        try:
            backend.apply_quota(namespace, backend.team_quota(slug))
        except Exception as exc:
            failed.append(sync_failure("ResourceQuota", f"{namespace}/{QUOTA_NAME}", exc))
    return report


def sync_quotas(backend: KubernetesBackend) -> dict[str, Any]:
    """What the scheduler itself keeps in step under FAIRQ_K8S_PROVISION=separate (after
    a quota change): the ResourceQuota of each provisioned team namespace, replaced in
    place (its RoleBinding allows that one object). Namespaces, RoleBindings and
    PriorityClasses are the provisioner's (`sync_cluster`); teams not provisioned yet
    are listed and left alone (their jobs wait with that reason)."""
    from accounts.models import Team

    from .k8s_manifest import ManifestError, namespace_for
    from .kubernetes import sync_failure

    report: dict[str, Any] = {"updated": [], "not_provisioned": [], "failed": []}
    for team in Team.objects.order_by("slug").values_list("slug", flat=True):
        try:
            namespace = namespace_for(team, backend.namespace_prefix)
        except ManifestError:
            continue
        try:
            if not backend.namespace_ready(namespace):
                report["not_provisioned"].append(namespace)
                continue
            backend.apply_quota(namespace, team_gpu_limits(team), replace_only=True)
        except Exception as exc:  # one namespace's failure never stops the others
            report["failed"].append(sync_failure("ResourceQuota", f"{namespace}/{QUOTA_NAME}",
                                                 exc))
            continue
        report["updated"].append(namespace)
    return report
