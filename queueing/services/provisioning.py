"""Cluster provisioning: keep the cluster's namespaces, quotas and PriorityClasses in
step with fairq's teams, quotas and tiers (docs/kubernetes.md, "RBAC").

The service reads the database and drives a provisioner
(`backends.k8s_provisioner.KubernetesProvisioner`) it is handed: `manage.py
sync_cluster` (the provisioner's credentials) and `sync_cluster_task` (after a tier or
quota change) call it. `gpu_type_refs` and `team_gpu_limits` are the database reads the
Kubernetes backend itself needs; `QueueingConfig.ready()` hands them to the composition
root. The hot paths (statuses, nodes) never query: GPU types are read through a TTL
cache, quotas only when a namespace is first used or synced.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from accounts.models import Team
from queueing.backends.k8s_manifest import QUOTA_NAME, GpuTypeRef, ManifestError, namespace_for
from queueing.backends.k8s_provisioner import (
    KubernetesProvisioner,
    NamespaceNotBootstrapped,
    PriorityClassSpec,
    sync_failure,
)
from queueing.composition import get_backend, get_provisioner
from queueing.models import Cluster, ClusterBackendKind, GpuType, Quota, Tier

from .sessions import session_tier


def cluster_provisioners() -> list[tuple[str, KubernetesProvisioner]]:
    """Every Kubernetes cluster's provisioner, by name (docs/clusters.md): the enabled
    `Cluster` rows of kind kubernetes, each with the backend built from its row; with no
    `Cluster` row, the one implicit cluster of settings ("") when it is Kubernetes."""
    rows = list(Cluster.objects.filter(enabled=True).order_by("cost_rank", "name"))
    if not rows:
        implicit = get_provisioner()
        return [("", implicit)] if implicit is not None else []
    out = []
    for row in rows:
        if row.backend != ClusterBackendKind.KUBERNETES:
            continue
        provisioner = getattr(get_backend(row), "provisioner", None)
        if isinstance(provisioner, KubernetesProvisioner):
            out.append((row.name, provisioner))
    return out


def gpu_type_refs() -> list[GpuTypeRef]:
    """The GPU types as the backend needs them (extended resource, node labels)."""
    return [GpuTypeRef(slug=g.slug, resource_name=g.resource_name,
                       node_labels={str(k): str(v) for k, v in (g.node_labels or {}).items()},
                       topology_levels=tuple(
                           (str(lv["name"]), str(lv["node_label"]))
                           for lv in (g.topology_levels or ())
                           if isinstance(lv, dict) and {"name", "node_label"} <= set(lv)),
                       units_per_device=g.units_per_device)
            for g in GpuType.objects.all()]


def team_slugs() -> list[str]:
    """Every team's slug: the worker watches their namespaces (docs/kubernetes.md, "RBAC")."""
    return list(Team.objects.order_by("slug").values_list("slug", flat=True))


def team_gpu_limits(team: str) -> dict[str, int]:
    """Rule A1 as a ResourceQuota: per extended resource, the sum over the GPU types using
    it of `nominal + borrowing limit`; no entry (no limit) when any of those types is
    unlimited for the team (an empty borrowing limit, or no quota at all). Quotas are in
    devices; a time-sliced or MPS type's resource counts slices, so its quota counts
    `units_per_device` per GPU (shared GPUs)."""
    quotas = {q.gpu_type_id: q for q in Quota.objects.filter(team__slug=team)}
    limits: dict[str, int] = defaultdict(int)
    unlimited: set[str] = set()
    for g in GpuType.objects.all():
        q = quotas.get(g.pk)
        if q is None or q.borrowing_limit is None:
            unlimited.add(g.resource_name)
        else:
            limits[g.resource_name] += (q.nominal + q.borrowing_limit) * g.units_per_device
    return {r: n for r, n in limits.items() if r not in unlimited}


def preemption_policy(tier: Tier) -> str:
    """The PriorityClass's preemptionPolicy for a tier: always Never. fairq is the only
    preemptor (rules R1-R8: protection, minimum runtime, rate limits); kube-scheduler
    must not evict a fairq job behind its back. (A per-tier policy would need a Tier
    field; none exists.)"""
    return "Never"


def priority_class_specs() -> list[PriorityClassSpec]:
    """One per tier, the sessions' tier included: created here when absent
    (`sessions.session_tier`), so the sync that provisions a cluster makes its
    PriorityClass before the first session's pod needs it (docs/sessions.md); made
    without queueing another sync, as this one makes its class."""
    session_tier(in_sync=True)
    return [PriorityClassSpec(name=t.priority_class_name, value=t.priority_value,
                              preemption_policy=preemption_policy(t), tier=t.slug)
            for t in Tier.objects.order_by("rank")]


def sync_cluster(provisioner: KubernetesProvisioner) -> dict[str, Any]:
    """PriorityClasses for the tiers; a labelled namespace and ResourceQuota per team.
    Idempotent; returns what it did. Each object is made on its own: one that fails (a
    name the API server refuses, a 403, a timeout) is listed in `failed` (kind, name,
    HTTP status, error) and never stops the others."""
    report: dict[str, Any] = dict(provisioner.sync_priority_classes(priority_class_specs()))
    failed: list[dict[str, Any]] = report.setdefault("failed", [])
    report["namespaces"] = []
    # Teams whose namespace the cluster admin has not bootstrapped yet (`bootstrap`):
    # listed, not failures (the provisioner may not make them; docs/kubernetes.md, "RBAC").
    report["not_bootstrapped"] = []
    for slug, non_root in Team.objects.order_by("slug").values_list("slug", "run_as_non_root"):
        namespace = f"{provisioner.namespace_prefix}{slug}"
        try:
            namespace = provisioner.ensure_namespace(slug, force=True, quota=False,
                                                     run_as_non_root=non_root)
        except NamespaceNotBootstrapped:
            report["not_bootstrapped"].append(namespace)
            continue
        except Exception as exc:
            failed.append(sync_failure("Namespace", namespace, exc))
            continue
        report["namespaces"].append(namespace)
        if provisioner.team_quota is None:
            continue
        try:
            provisioner.apply_quota(namespace, provisioner.team_quota(slug))
        except Exception as exc:
            failed.append(sync_failure("ResourceQuota", f"{namespace}/{QUOTA_NAME}", exc))
    return report


def bootstrap(provisioner: KubernetesProvisioner) -> dict[str, Any]:
    """What the cluster admin applies (`manage.py sync_cluster --bootstrap | kubectl apply
    -f -`, with the admin's own rights) before the provisioner can provision a team: each
    team's labelled namespace and the provisioner's RoleBinding in it, as one `List`.
    Applying it again is harmless (the same objects)."""
    teams = Team.objects.order_by("slug").values_list("slug", "run_as_non_root")
    return {"apiVersion": "v1", "kind": "List",
            "items": provisioner.bootstrap_manifests(list(teams))}


def sync_quotas(provisioner: KubernetesProvisioner) -> dict[str, Any]:
    """What the scheduler itself keeps in step under FAIRQ_K8S_PROVISION=separate (after
    a quota change): the ResourceQuota of each provisioned team namespace, replaced in
    place (its RoleBinding allows that one object). Namespaces, RoleBindings and
    PriorityClasses are the provisioner's (`sync_cluster`); teams not provisioned yet
    are listed and left alone (their jobs wait with that reason)."""
    report: dict[str, Any] = {"updated": [], "not_provisioned": [], "failed": []}
    for team in Team.objects.order_by("slug").values_list("slug", flat=True):
        try:
            namespace = namespace_for(team, provisioner.namespace_prefix)
        except ManifestError:
            continue
        try:
            if not provisioner.namespace_ready(namespace):
                report["not_provisioned"].append(namespace)
                continue
            provisioner.apply_quota(namespace, team_gpu_limits(team), replace_only=True)
        except Exception as exc:  # one namespace's failure never stops the others
            report["failed"].append(sync_failure("ResourceQuota", f"{namespace}/{QUOTA_NAME}",
                                                 exc))
            continue
        report["updated"].append(namespace)
    return report
