"""Rule K4 on Kubernetes, spot capacity marked by a taint (docs/kubernetes.md, "Spot
nodes"; AKS taints every node of a spot pool `kubernetes.azure.com/scalesetpriority=
spot:NoSchedule`): a spot node whose only taints besides the GPU one are
`FAIRQ_SPOT_TOLERATIONS` is offered as spot capacity; a termination taint (rule K6) or
any other NoSchedule taint still hides it; and only the pods of an attempt placed on
spot tolerate those taints. Without a cluster: the manifest builder, and the backend's
`nodes()` over a filled watch cache. On a real control plane:
tests/envtest/test_k8s_spot.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from queueing.backends import k8s_api
from queueing.backends.k8s_api import parse_node_matches, spot_tolerations_problem
from queueing.backends.k8s_manifest import (
    GpuTypeRef,
    ManifestOptions,
    job_manifests,
    tolerations,
)

from .test_k8s_manifest import spec

AKS_SPOT = "kubernetes.azure.com/scalesetpriority"
AKS_TAINT = {"key": AKS_SPOT, "value": "spot", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists"}
AKS_TOLERATION = {"key": AKS_SPOT, "operator": "Equal", "value": "spot"}
SPOT_OPTS = ManifestOptions(
    namespace="fairq-vision",
    spot_tolerations=parse_node_matches(k8s_api.SPOT_TOLERATIONS, what="t"))


def _pod_tolerations(manifest: dict[str, Any]) -> list[dict[str, str]]:
    return list(manifest["spec"]["template"]["spec"]["tolerations"])


# --- the manifest -------------------------------------------------------------------------

def test_k4_a_spot_attempts_pods_tolerate_the_spot_taints() -> None:
    [job] = job_manifests(spec(spot=True), SPOT_OPTS)
    assert _pod_tolerations(job) == [GPU_TOLERATION, AKS_TOLERATION]


def test_k4_every_replica_of_a_spot_gang_tolerates_them() -> None:
    jobs = job_manifests(spec(spot=True, replicas=3, placement=("a", "b", "c")), SPOT_OPTS)
    assert len(jobs) == 3
    assert all(_pod_tolerations(j) == [GPU_TOLERATION, AKS_TOLERATION] for j in jobs)


def test_k4_an_on_demand_attempts_pods_tolerate_no_spot_taint() -> None:
    for s in (spec(), spec(spot=False, replicas=2, placement=("a", "b"))):
        assert all(_pod_tolerations(j) == [GPU_TOLERATION]
                   for j in job_manifests(s, SPOT_OPTS))


def test_k4_a_spot_taint_given_as_a_key_is_tolerated_with_any_value() -> None:
    opts = ManifestOptions(namespace="fairq-vision", spot_tolerations=parse_node_matches(
        ["example.com/spot", "example.com/capacity=interruptible"], what="t"))
    assert tolerations(spec(spot=True), opts) == [
        GPU_TOLERATION, {"key": "example.com/spot", "operator": "Exists"},
        {"key": "example.com/capacity", "operator": "Equal", "value": "interruptible"}]
    assert tolerations(spec(spot=True), ManifestOptions(namespace="x")) == [GPU_TOLERATION]


# --- the node reading (the backend's nodes(), over a filled watch cache) -----------------

L40S = GpuTypeRef("l40s", "nvidia.com/gpu", {"fairq.io/gpu-type": "l40s"})


def _node(name: str, labels: dict[str, str], taints: list[dict[str, str]]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"fairq.io/gpu-type": "l40s", **labels},
                         "resourceVersion": "1"},
            "spec": {"taints": taints},
            "status": {"allocatable": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _offered(nodes: list[dict[str, Any]], **options: Any) -> dict[str, bool]:
    """What `nodes()` offers of these nodes: name -> spot."""
    from kubernetes import client

    from queueing.backends.kubernetes import KubernetesBackend

    backend = KubernetesBackend(client.ApiClient(client.Configuration()), gpu_types=[L40S],
                                **options)
    for n in nodes:
        backend.nodes_informer._store[n["metadata"]["name"]] = n
    for informer in backend._informers:
        informer.synced.set()
    backend._started = True
    return {n.name: n.spot for n in backend.nodes()}


AKS = {AKS_SPOT: "spot"}


@pytest.mark.parametrize(("labels", "taints", "offered"), [
    # An AKS spot node as AKS makes it: spot capacity, offered.
    (AKS, [GPU_TAINT, AKS_TAINT], {"n": True}),
    (AKS, [AKS_TAINT], {"n": True}),
    (AKS, [{**AKS_TAINT, "effect": "NoExecute"}], {"n": True}),
    # Being reclaimed (rule K6): a termination taint hides it as before.
    (AKS, [GPU_TAINT, AKS_TAINT, {"key": "fairq.io/reclaim", "effect": "NoSchedule"}], {}),
    (AKS, [AKS_TAINT, {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}], {}),
    # Any other NoSchedule taint still hides it.
    (AKS, [AKS_TAINT, {"key": "example.com/maintenance", "effect": "NoSchedule"}], {}),
    (AKS, [{**AKS_TAINT, "value": "regular"}], {}),  # not the spot value
    # The spot taint on a node that is not spot (no spot label): its pods would be
    # on-demand ones, which do not tolerate it, so it is not offered.
    ({}, [GPU_TAINT, AKS_TAINT], {}),
    # A PreferNoSchedule taint never hid a node.
    ({}, [{"key": "example.com/x", "effect": "PreferNoSchedule"}], {"n": False}),
])
def test_k4_a_spot_node_with_only_its_spot_taint_is_offered_as_spot(
        labels: dict[str, str], taints: list[dict[str, str]], offered: dict[str, bool]) -> None:
    assert _offered([_node("n", labels, taints)]) == offered


def test_rule_c4_a_kubernetes_node_reports_its_labels_which_say_its_pool() -> None:
    from kubernetes import client

    from queueing.backends.kubernetes import KubernetesBackend
    from queueing.selectors.cluster import ClusterFacts, PoolFacts, node_pool

    backend = KubernetesBackend(client.ApiClient(client.Configuration()), gpu_types=[L40S])
    for zone in ("a", "b"):
        n = _node(f"n-{zone}", {**AKS, "topology.kubernetes.io/zone": zone}, [AKS_TAINT])
        backend.nodes_informer._store[n["metadata"]["name"]] = n
    for informer in backend._informers:
        informer.synced.set()
    backend._started = True
    facts = ClusterFacts(1, "cloud", True, 0, pools=(
        PoolFacts("spot-a", "l40s", True, {"topology.kubernetes.io/zone": "a"}),
        PoolFacts("spot-b", "l40s", True, {"topology.kubernetes.io/zone": "b"})))
    pools = {}
    for node in backend.nodes():
        pool = node_pool(facts, gpu_type=node.gpu_type, labels=node.labels)
        pools[node.name] = pool.name if pool else None
    assert pools == {"n-a": "spot-a", "n-b": "spot-b"}


def test_k4_without_spot_tolerations_a_spot_tainted_node_stays_hidden() -> None:
    assert _offered([_node("n", AKS, [AKS_TAINT])], spot_tolerations=()) == {}


def test_k4_a_spot_taint_that_is_also_a_termination_taint_is_refused() -> None:
    from kubernetes import client

    from queueing.backends.kubernetes import KubernetesBackend

    assert spot_tolerations_problem(
        parse_node_matches(k8s_api.SPOT_TOLERATIONS, what="t"),
        parse_node_matches(k8s_api.SPOT_TERMINATION_TAINTS, what="t")) is None
    with pytest.raises(ValueError, match=r"fairq\.io/reclaim is also a termination taint"):
        KubernetesBackend(client.ApiClient(client.Configuration()),
                          spot_tolerations=["fairq.io/reclaim=soon"])


def test_k4_the_spot_tolerations_setting_defaults_to_the_backends_default() -> None:
    import os

    from django.conf import settings

    if "FAIRQ_SPOT_TOLERATIONS" in os.environ:
        pytest.skip("the environment sets FAIRQ_SPOT_TOLERATIONS")
    assert tuple(settings.FAIRQ_SPOT_TOLERATIONS) == k8s_api.SPOT_TOLERATIONS


# --- the attempt's spec says whether it is on spot ---------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("on_spot", [True, False])
def test_k4_the_launch_spec_is_spot_exactly_when_the_attempt_is(on_spot: bool) -> None:
    from queueing.services.scheduler import launch_spec
    from tests.factories import JobFactory

    job = JobFactory(status="ADMITTED", on_spot=on_spot, placement=["n"], attempt=1)
    assert launch_spec(job).spot is on_spot
