"""Staff changes to the clusters and their node pools (docs/api.md, "Clusters";
docs/scheduling.md, rules K1-K8), audited like every configuration change: each create,
update and delete writes an AuditEntry (who, when, old -> new) in its transaction.

`cluster_config_problems` is the one set of rules a cluster's configuration must meet;
the API and the Django admin both refuse with its field messages.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, TypeVar

from django.db import transaction

from accounts.services import audit_record, model_changes
from queueing import validation as v
from queueing.backends.simulated import SimulatedClusterError, parse_node_spec
from queueing.errors import DomainError
from queueing.memo import forget_all
from queueing.models import Cluster, ClusterBackendKind, GpuType, NodePool

from .access import check_staff

INVALID_FIELDS = "The request has invalid fields."
CLUSTER_FIELDS = ("name", "backend", "kubeconfig", "context", "in_cluster", "sim_nodes",
                  "enabled", "labels", "cost_rank")
POOL_FIELDS = ("name", "gpu_type", "spot", "node_labels", "price_per_gpu_hour")
MAX_LABELS = 16


def labels_problem(labels: object, *, what: str = "label") -> str | None:
    """Why `labels` is not a flat {name: value} of Kubernetes-label-like strings (rule
    K3 matches a job's `cluster_selector` against a cluster's labels, and the CLI writes
    them as k=v: no '=' or ',' inside), or None."""
    if not isinstance(labels, Mapping):
        return f'Give {what}s as {{"name": "value"}}.'
    if len(labels) > MAX_LABELS:
        return f"At most {MAX_LABELS} {what}s."
    for key, value in labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return f"A {what}'s name and value are strings."
        if len(key) > v.MAX_LABEL_KEY_LEN or not v.LABEL_NAME_RE.match(key):
            return (f"{what.capitalize()} name {key[:63]!r}: at most {v.MAX_LABEL_KEY_LEN} "
                    "letters, digits, '-', '_' or '.', starting and ending with a letter or "
                    "digit.")
        if len(value) > v.MAX_LABEL_VALUE_LEN or not v.LABEL_VALUE_RE.match(value):
            return (f"{what.capitalize()} {key}'s value {value[:63]!r}: at most "
                    f"{v.MAX_LABEL_VALUE_LEN} letters, digits, '-', '_' or '.', starting "
                    "and ending with a letter or digit.")
    return None


def cluster_config_problems(values: Mapping[str, Any], *,
                            exclude_pk: int | None = None) -> dict[str, list[str]]:
    """Each field's refusal of a cluster's whole configuration `values` (CLUSTER_FIELDS):
    a backend fairq knows; a simulated cluster has nodes (`sim_nodes`, FAIRQ_SIM_NODES'
    grammar, of known GPU types) and no kubeconfig, context or in_cluster; a Kubernetes
    cluster has no `sim_nodes`, a kubeconfig that is an absolute path on the scheduler or
    `in_cluster` (not both), and at most one cluster is `in_cluster`; labels are
    Kubernetes-label-like."""
    problems: dict[str, list[str]] = {}
    backend = values.get("backend")
    kinds = [k.value for k in ClusterBackendKind]
    if backend not in kinds:
        problems["backend"] = [f"Unknown backend {str(backend)[:40]!r}; use one of: "
                               f"{', '.join(kinds)}."]
    kubeconfig = str(values.get("kubeconfig") or "")
    context = str(values.get("context") or "")
    in_cluster = bool(values.get("in_cluster"))
    sim_nodes = str(values.get("sim_nodes") or "")
    if backend == ClusterBackendKind.SIMULATED:
        simulated = ("A simulated cluster runs in the scheduler's process: it has no "
                     "{}; leave it empty (or use backend kubernetes).")
        if kubeconfig:
            problems["kubeconfig"] = [simulated.format("kubeconfig")]
        if context:
            problems["context"] = [simulated.format("kubeconfig context")]
        if in_cluster:
            problems["in_cluster"] = [simulated.format("service account (in_cluster)")]
        if not sim_nodes:
            problems["sim_nodes"] = ["A simulated cluster needs its nodes, as FAIRQ_SIM_NODES "
                                     "(e.g. 4x8xh100,2x8xa100)."]
        else:
            problem = _sim_nodes_problem(sim_nodes)
            if problem:
                problems["sim_nodes"] = [problem]
    elif backend == ClusterBackendKind.KUBERNETES:
        if sim_nodes:
            problems["sim_nodes"] = ["Only a simulated cluster has sim_nodes; a Kubernetes "
                                     "cluster's nodes are its own."]
        if in_cluster and kubeconfig:
            problems["kubeconfig"] = ["in_cluster uses the scheduler pod's service account: "
                                      "leave kubeconfig empty, or in_cluster off."]
        elif kubeconfig and not os.path.isabs(kubeconfig):
            problems["kubeconfig"] = ["An absolute path of a kubeconfig file on the "
                                      "scheduler (e.g. /etc/fairq/clusters/eu.kubeconfig)."]
        if in_cluster:
            others = Cluster.objects.filter(in_cluster=True)
            other = (others.exclude(pk=exclude_pk) if exclude_pk is not None else others).first()
            if other is not None:
                problems["in_cluster"] = [f"Cluster {other.name} already is the one fairq "
                                          "runs in (in_cluster); a pod has one service account."]
    problem = labels_problem(values.get("labels", {}))
    if problem:
        problems["labels"] = [problem]
    return problems


def _sim_nodes_problem(sim_nodes: str) -> str | None:
    try:
        pools = parse_node_spec(sim_nodes)
    except SimulatedClusterError as exc:
        return str(exc)
    if not pools:
        return "Give at least one pool, e.g. 4x8xh100."
    known = set(GpuType.objects.values_list("slug", flat=True))
    unknown = sorted({p.gpu_type for p in pools} - known)
    if unknown:
        return (f"Unknown GPU types: {', '.join(unknown)}; known: "
                f"{', '.join(sorted(known)) or 'none (an admin adds GPU types first)'}.")
    return None


def _audited_save(*, actor: Any, row: Cluster | NodePool, before: Any) -> None:
    row.full_clean()  # the model's own rules (name syntax, uniqueness): a 400 with fields
    row.save()
    changes = model_changes(before, row)
    if changes:
        audit_record(actor=actor, action="create" if before is None else "update",
                     instance=row, changes=changes)
    # The submit check's per-process facts (submit_cluster_facts) see the change at once here;
    # other processes within their few seconds.
    transaction.on_commit(forget_all)


@transaction.atomic
def cluster_create(*, actor: Any, values: Mapping[str, Any]) -> Cluster:
    """Add a cluster (staff). Its nodes join the next scheduler cycle's snapshot when it is
    enabled (rule K5: until the scheduler reaches it, it is not used)."""
    check_staff(actor=actor, doing="add clusters")
    merged = {"backend": ClusterBackendKind.SIMULATED, "labels": {}, **values}
    problems = cluster_config_problems(merged)
    if Cluster.objects.filter(name=merged.get("name")).exists():
        problems["name"] = [f"A cluster named {merged['name']} exists."]
    if problems:
        raise DomainError(INVALID_FIELDS, fields=problems)
    row = Cluster(**{k: merged[k] for k in CLUSTER_FIELDS if k in merged})
    _audited_save(actor=actor, row=row, before=None)
    return row


@transaction.atomic
def cluster_update(*, actor: Any, cluster: Cluster, values: Mapping[str, Any]) -> Cluster:
    """Change a cluster's configuration (staff); its name stays (workloads and events name
    it). `enabled: false` drains it (rule K8): nothing new is admitted or created there,
    what runs there runs on, is charged and ends as anywhere, and the scheduler records
    it drained once nothing is left. `enabled: true` makes it an ordinary cluster again
    (`Cluster.save` clears `drained_at`). Audited field by field."""
    check_staff(actor=actor, doing="change clusters")
    return _update(
        actor=actor, row=cluster, fields=CLUSTER_FIELDS, values=values,
        keeps_name="A cluster keeps its name (its workloads and events carry it): add a "
                   "new one and disable this one instead.",
        problems=lambda merged: cluster_config_problems(merged, exclude_pk=cluster.pk))


_Row = TypeVar("_Row", Cluster, NodePool)


def _update(*, actor: Any, row: _Row, fields: tuple[str, ...], values: Mapping[str, Any],
            keeps_name: str,
            problems: Callable[[dict[str, Any]], dict[str, list[str]]]) -> _Row:
    """A staff change of a cluster or a pool: the row locked; its name kept (`keeps_name`
    says why); `problems` of the row as it would be, all in one 400; then saved and
    audited field by field."""
    locked = type(row).objects.select_for_update().get(pk=row.pk)
    before = type(row).objects.get(pk=row.pk)
    if "name" in values and values["name"] != locked.name:
        raise DomainError(INVALID_FIELDS, fields={"name": [keeps_name]})
    found = problems({**{k: getattr(locked, k) for k in fields}, **values})
    if found:
        raise DomainError(INVALID_FIELDS, fields=found)
    for key in fields:
        if key in values:
            setattr(locked, key, values[key])
    _audited_save(actor=actor, row=locked, before=before)
    return locked


def _pool_problems(values: Mapping[str, Any]) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {}
    problem = labels_problem(values.get("node_labels", {}), what="node label")
    if problem:
        problems["node_labels"] = [problem]
    price = values.get("price_per_gpu_hour")
    if price is not None and Decimal(price) < 0:
        problems["price_per_gpu_hour"] = ["A price is at least 0 (null: the GPU type's "
                                          "price, rule C1)."]
    return problems


@transaction.atomic
def node_pool_create(*, actor: Any, cluster: Cluster, values: Mapping[str, Any]) -> NodePool:
    """Add a node pool of one GPU type to `cluster` (staff): `spot` pools are used by
    preemptible work and jobs that opt in (rule K4), at their own price."""
    check_staff(actor=actor, doing="change node pools")
    problems = _pool_problems(values)
    if NodePool.objects.filter(cluster=cluster, name=values.get("name")).exists():
        problems["name"] = [f"Cluster {cluster.name} has a pool named {values['name']}."]
    if problems:
        raise DomainError(INVALID_FIELDS, fields=problems)
    row = NodePool(cluster=cluster, **{k: values[k] for k in POOL_FIELDS if k in values})
    _audited_save(actor=actor, row=row, before=None)
    return row


@transaction.atomic
def node_pool_update(*, actor: Any, pool: NodePool, values: Mapping[str, Any]) -> NodePool:
    """Change a node pool (staff): GPU type, spot, node labels, price. Audited."""
    check_staff(actor=actor, doing="change node pools")
    return _update(actor=actor, row=pool, fields=POOL_FIELDS, values=values,
                   keeps_name="A pool keeps its name.", problems=_pool_problems)


@transaction.atomic
def node_pool_delete(*, actor: Any, pool: NodePool) -> None:
    """Remove a node pool (staff; its nodes stay in the cluster, as on-demand capacity
    of their GPU type). Audited with the values it had."""
    check_staff(actor=actor, doing="change node pools")
    audit_record(actor=actor, action="delete", instance=pool,
                 changes={k: [new, None] for k, (_, new) in model_changes(None, pool).items()})
    pool.delete()
    transaction.on_commit(forget_all)
