"""A submitted job's cluster fields (docs/scheduling.md, rules K3 and K4), in one place
for every front end: `requested_cluster` (a pin, by name), `cluster_selector` (labels
the cluster must carry) and `allow_spot` (a non-preemptible tier's opt-in to spot
nodes).

`job_input_with_clusters` checks them and sets them on a JobInput built by
`job_input_build`, answering every refused field at once with the others'. A submit
naming no cluster and no selector reads nothing (the fast path stays as it is).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from queueing.errors import DomainError
from queueing.models import Cluster
from queueing.selectors.cluster import gang_room
from queueing.selectors.clusters import SubmitClusterFacts, submit_cluster_facts
from queueing.selectors.lookups import gpu_types_by_slug

from .cluster_admin import labels_problem
from .jobs import INVALID_FIELDS, JobInput

# The submit fields of this module, as the API, the CLI and the web form name them.
CLUSTER_SUBMIT_FIELDS = ("requested_cluster", "cluster_selector", "allow_spot")


def allowed_clusters(facts: Mapping[str, SubmitClusterFacts], *, requested_cluster: str | None,
                     cluster_selector: Mapping[str, str]) -> list[SubmitClusterFacts]:
    """Rule K3: the enabled clusters a job may run in - its pin, if any, and those carrying
    every label of its selector - in name order."""
    return [f for name, f in sorted(facts.items())
            if f.enabled and (not requested_cluster or name == requested_cluster)
            and all(f.labels.get(k) == val for k, val in cluster_selector.items())]


def cluster_field_problems(*, gpu_type: str | None, requested_cluster: str | None,
                           cluster_selector: Mapping[str, Any] | None
                           ) -> dict[str, list[str]]:
    """Rule K3 at submit: each cluster field's refusal. A pin names an enabled cluster; a
    selector is labels some enabled cluster (the pinned one, with a pin) carries; and
    one of the allowed clusters has nodes of the job's GPU type (not checked for a GPU
    type that does not exist: that field says so)."""
    selector = dict(cluster_selector or {})
    if not requested_cluster and not selector:
        return {}
    problems: dict[str, list[str]] = {}
    problem = labels_problem(selector, what="label")
    if problem:
        return {"cluster_selector": [problem]}
    facts = submit_cluster_facts()
    if not facts:
        field = "requested_cluster" if requested_cluster else "cluster_selector"
        return {field: ["fairq runs on one cluster here (no clusters are configured): "
                        "leave this out."]}
    enabled = sorted(name for name, f in facts.items() if f.enabled)
    if requested_cluster:
        pinned = facts.get(requested_cluster)
        if pinned is None:
            problems["requested_cluster"] = [
                f"Unknown cluster {requested_cluster[:40]!r}; enabled: "
                f"{', '.join(enabled) or 'none'}."]
        elif not pinned.enabled:
            problems["requested_cluster"] = [
                f"Cluster {requested_cluster} is disabled (nothing new runs there); enabled: "
                f"{', '.join(enabled) or 'none'}."]
    if problems:
        return problems
    allowed = allowed_clusters(facts, requested_cluster=requested_cluster,
                               cluster_selector=selector)
    if selector and not allowed:
        where = f"cluster {requested_cluster}" if requested_cluster else "no enabled cluster"
        carried = "; ".join(f"{f.name}: {_labels_text(f.labels)}" for name, f in
                            sorted(facts.items()) if f.enabled and
                            (not requested_cluster or name == requested_cluster))
        return {"cluster_selector": [
            f"{where[0].upper()}{where[1:]} carries {_labels_text(selector)}"
            f"{' (it does not)' if requested_cluster else ''}; the enabled clusters' labels: "
            f"{carried or 'none'}."]}
    if gpu_type and gpu_type in gpu_types_by_slug() \
            and not any(gpu_type in f.gpu_types for f in allowed):
        having = sorted(f.name for f in facts.values() if f.enabled and gpu_type in f.gpu_types)
        field = "requested_cluster" if requested_cluster else "cluster_selector"
        problems[field] = [
            f"No {gpu_type} nodes in {_clusters_text(allowed)}; clusters with {gpu_type} "
            f"nodes: {', '.join(having) or 'none'}."]
    return problems


def _each_type_problems(types: list[str], *, requested_cluster: str | None,
                        cluster_selector: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """Rule K3 for a job accepting several GPU types: `cluster_field_problems` of each,
    on `gpu_types` (a type the allowed clusters have no nodes of can never run it)."""
    messages = [m for gt in types
                for ms in cluster_field_problems(gpu_type=gt, requested_cluster=requested_cluster,
                                                 cluster_selector=cluster_selector).values()
                for m in ms]
    return {"gpu_types": messages} if messages else {}


def _labels_text(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={val}" for k, val in sorted(labels.items())) or "no labels"


def _clusters_text(allowed: list[SubmitClusterFacts] | list[str]) -> str:
    names = [f if isinstance(f, str) else f.name for f in allowed]
    return f"cluster {names[0]}" if len(names) == 1 else \
        f"the allowed clusters ({', '.join(names)})"


def _refuse_larger_than_fleet(data: JobInput, *, requested_cluster: str | None,
                              cluster_selector: Mapping[str, Any] | None,
                              allow_spot: bool) -> None:
    """Rules A3, K1, K3, K4, K8 at submit: a job whose replicas no one pool it may use (one
    cluster that takes new work, spot or not) could hold even with every node empty would
    wait forever, whatever the quotas (raising one cannot help): DomainError on
    `replicas` naming the most that fit, or on `gpus` when no node it may use holds one
    replica. An array is checked on its template (each member is such a job). Nothing
    is refused while the cluster view does not know (`gang_room` None: not published,
    or a cluster the job may use unread, rule K5)."""
    types = data.gpu_types or [data.gpu_type.slug]
    refused: list[DomainError] = []
    for gt in types:
        try:
            _refuse_type_larger_than_fleet(
                data, gt, requested_cluster=requested_cluster,
                cluster_selector=cluster_selector, allow_spot=allow_spot)
        except DomainError as exc:
            refused.append(exc)
    if not refused:
        return
    if len(refused) == len(types):
        raise refused[0]  # no accepted type can ever hold it: as for one type
    # Some accepted types could never hold it: the job names them, or lists fewer.
    raise DomainError(INVALID_FIELDS, fields={"gpu_types": [
        message for exc in refused for messages in (exc.fields or {}).values()
        for message in messages]})


def _refuse_type_larger_than_fleet(data: JobInput, gt: str, *, requested_cluster: str | None,
                                   cluster_selector: Mapping[str, Any] | None,
                                   allow_spot: bool) -> None:
    """`_refuse_larger_than_fleet` for one GPU type `gt` the job accepts."""
    gpus, replicas = data.gpus_per_replica, data.replicas
    # Nodes are counted in the type's units (shared GPUs: slices of a time-sliced or MPS
    # type; such a type is accepted alone, so it is `data.gpu_type`).
    per_gpu = data.gpu_type.units_per_device if data.gpu_type.slug == gt else 1
    units = data.gpu_slices or gpus * per_gpu
    selector = dict(cluster_selector or {})
    facts = submit_cluster_facts()
    clusters = None
    expected = frozenset(name for name, f in facts.items() if f.enabled)
    if requested_cluster or selector:
        clusters = expected = frozenset(f.name for f in allowed_clusters(
            facts, requested_cluster=requested_cluster, cluster_selector=selector))
    spot_ok = data.tier.preemptible or allow_spot
    room = gang_room(gt, units, clusters=clusters, spot_ok=spot_ok, expected=expected)
    if room is None or replicas <= room.replicas:
        return
    # What is said counts GPUs: a packed type's nodes report slices.
    room = dataclasses.replace(room, gpus=room.gpus // per_gpu,
                               largest_node=room.largest_node // per_gpu)
    where = ("" if clusters is None else
             f" of {_clusters_text(sorted(clusters))}" if clusters else " of no cluster")
    if room.replicas == 0:
        raise DomainError(INVALID_FIELDS, fields={"gpus": [
            f"No {gt} node{where} that takes new work holds {gpus} GPUs (the largest has "
            f"{room.largest_node})." if room.largest_node else
            f"No {gt} node{where} takes new work (rule K8): the largest possible is 0 GPUs."]})
    if room.cluster:
        scope = (f"in one cluster{where} even when empty (rules A3, K1: the most in "
                 f"cluster {room.cluster}{' on its spot nodes' if room.spot else ''}, "
                 f"{room.gpus} {gt} GPUs that take new work)")
    else:
        scope = (f"on the {gt} {'spot ' if room.spot else ''}nodes even when empty "
                 f"(rule A3: {room.gpus} GPUs that take new work)")
    kind = ""
    if not spot_ok:
        anywhere = gang_room(gt, units, clusters=clusters, spot_ok=True, expected=expected)
        if anywhere is not None and anywhere.replicas > room.replicas:
            kind = (" (not counting spot nodes: a non-preemptible tier uses them only with "
                    "allow_spot, rule K4)")
    raise DomainError(INVALID_FIELDS, fields={"replicas": [
        f"At most {room.replicas} replicas of {gpus} {gt} GPUs fit {scope}{kind}; "
        f"this job asks {replicas} ({replicas * gpus} GPUs). The largest possible "
        f"is {room.replicas} replicas ({room.replicas * gpus} GPUs)."]})


def job_input_with_clusters(
    build: Callable[[], JobInput], *, gpu_type: str | None,
    requested_cluster: str | None = None, cluster_selector: Mapping[str, Any] | None = None,
    allow_spot: bool | None = False,
) -> JobInput:
    """`build()` (a `job_input_build` call) with the job's cluster pin, selector and spot
    opt-in set, checked by rule K3 (`cluster_field_problems`); DomainError (400) naming
    every refused field at once, `build`'s and these."""
    problems = cluster_field_problems(gpu_type=gpu_type, requested_cluster=requested_cluster,
                                      cluster_selector=cluster_selector)
    try:
        data = build()
    except DomainError as exc:
        if problems and exc.fields:
            raise DomainError(exc.message, fields={**exc.fields, **problems}) from None
        raise
    if not problems and data.gpu_types:
        # Several accepted types: the allowed clusters must have nodes of each one (the
        # first was `gpu_type` unless only `gpu_types` named it).
        problems = _each_type_problems(data.gpu_types, requested_cluster=requested_cluster,
                                       cluster_selector=cluster_selector)
    if problems:
        raise DomainError(INVALID_FIELDS, fields=problems)
    _refuse_larger_than_fleet(data, requested_cluster=requested_cluster,
                              cluster_selector=cluster_selector, allow_spot=bool(allow_spot))
    pinned = Cluster.objects.get(name=requested_cluster) if requested_cluster else None
    if pinned is None and not cluster_selector and not allow_spot:
        return data
    return dataclasses.replace(data, requested_cluster=pinned,
                               cluster_selector=dict(cluster_selector or {}),
                               allow_spot=bool(allow_spot))
