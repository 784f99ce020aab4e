"""Two real control planes at once (several clusters): the session's first one
(`k8s_control_plane`, DEFAULT_GPU_NODES) and a second (`k8s_second_control_plane`,
SECOND_GPU_NODES), each with its own ports, temp dir, etcd, CA and fake kubelet. Each
answers on its own, holds only its own nodes, runs a GPU pod on its own, and one frozen
leaves the other answering. No Django, no fairq imports.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.envtest.cluster import (
    DEFAULT_GPU_NODES,
    GPU_TAINT,
    SECOND_GPU_NODES,
    ControlPlane,
    envtest_required,
    wait_for,
)

try:
    from kubernetes import client
except ImportError:
    if envtest_required():
        raise
    pytest.skip("the 'kubernetes' Python package is not installed", allow_module_level=True)

pytestmark = pytest.mark.k8s


def _gpu_nodes(core: Any) -> dict[str, str]:
    return {n.metadata.name: n.metadata.labels["fairq.io/gpu-type"]
            for n in core.list_node(_request_timeout=10).items}


def test_two_control_planes_answer_each_with_its_own_nodes(
        k8s_control_plane: ControlPlane, k8s_second_control_plane: ControlPlane,
        k8s_api_client: Any, k8s_second_api_client: Any) -> None:
    first, second = k8s_control_plane, k8s_second_control_plane
    assert first.server != second.server and first.workdir != second.workdir
    assert first.token != second.token
    assert not set(first.pids().values()) & set(second.pids().values())
    assert len(second.pids()) == 4  # etcd, apiserver, controller manager, scheduler
    assert _gpu_nodes(client.CoreV1Api(k8s_api_client)) == {
        name: gpu for name, gpu, _ in DEFAULT_GPU_NODES}
    assert _gpu_nodes(client.CoreV1Api(k8s_second_api_client)) == {
        name: gpu for name, gpu, _ in SECOND_GPU_NODES}
    # Other GPU types: l40s only on the second, a100 only on the first.
    assert "l40s" in {g for _, g, _ in SECOND_GPU_NODES} - {g for _, g, _ in DEFAULT_GPU_NODES}


def test_the_second_control_plane_runs_a_gpu_pod_on_its_own_node(
        k8s_second_api_client: Any) -> None:
    core = client.CoreV1Api(k8s_second_api_client)
    namespace = f"t-second-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="l40s-pod"),
            spec=client.V1PodSpec(
                restart_policy="Never",
                node_selector={"fairq.io/gpu-type": "l40s"},
                tolerations=[client.V1Toleration(key=GPU_TAINT["key"], operator="Exists")],
                containers=[client.V1Container(
                    name="main", image="busybox",
                    env=[client.V1EnvVar(name="FAIRQ_SIM_SECONDS", value="1")],
                    resources=client.V1ResourceRequirements(
                        requests={"nvidia.com/gpu": "2"}, limits={"nvidia.com/gpu": "2"}))]))
        core.create_namespaced_pod(namespace, pod)
        done = wait_for(lambda: (p := core.read_namespaced_pod("l40s-pod", namespace))
                        .status.phase == "Succeeded" and p, timeout=60,
                        what="the pod to succeed on the second control plane")
        assert done.spec.node_name == "gpu-b-l40s-0"
    finally:
        core.delete_namespace(namespace, propagation_policy="Background")


def test_a_frozen_control_plane_leaves_the_other_answering(
        k8s_control_plane: ControlPlane, k8s_second_control_plane: ControlPlane,
        k8s_api_client: Any, k8s_second_api_client: Any) -> None:
    first = client.CoreV1Api(k8s_api_client)
    second = client.CoreV1Api(k8s_second_api_client)
    with k8s_second_control_plane.frozen("kube-apiserver"):
        assert set(_gpu_nodes(first)) == {name for name, _, _ in DEFAULT_GPU_NODES}
        with pytest.raises(Exception):  # noqa: B017  (a timeout, whichever urllib3 raises)
            second.list_node(_request_timeout=2)
    with k8s_control_plane.frozen("kube-apiserver"):
        assert set(wait_for(lambda: _gpu_nodes(second), timeout=30,
                            what="the thawed second apiserver")) == \
            {name for name, _, _ in SECOND_GPU_NODES}
    assert set(_gpu_nodes(first)) == {name for name, _, _ in DEFAULT_GPU_NODES}
