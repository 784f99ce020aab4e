"""Proof that the envtest harness is a real control plane, not a mock.

Each test drives a behaviour fairq's Kubernetes backend will lean on through
the real kube-apiserver, kube-scheduler and kube-controller-manager, with the
fake kubelet standing in for nodes. No Django, no fairq imports.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.envtest.cluster import DEFAULT_GPU_NODES, envtest_required

try:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
except ImportError:
    if envtest_required():
        raise
    pytest.skip("the 'kubernetes' Python package is not installed", allow_module_level=True)

pytestmark = pytest.mark.k8s

H100_NODES = {name for name, gpu_type, _ in DEFAULT_GPU_NODES if gpu_type == "h100"}
A100_NODES = {name for name, gpu_type, _ in DEFAULT_GPU_NODES if gpu_type == "a100"}


def wait_until(predicate: Callable[[], Any], *, timeout: float = 30.0, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def gpu_container(
    *,
    gpus: int,
    sim_seconds: float | None = None,
    exit_code: int | None = None,
    resource: str = "nvidia.com/gpu",
) -> Any:
    env = []
    if sim_seconds is not None:
        env.append(client.V1EnvVar(name="FAIRQ_SIM_SECONDS", value=str(sim_seconds)))
    if exit_code is not None:
        env.append(client.V1EnvVar(name="FAIRQ_SIM_EXIT_CODE", value=str(exit_code)))
    # Extended resources must be in limits (requests default to them).
    res = {"cpu": "1", "memory": "1Gi", resource: str(gpus)}
    return client.V1Container(
        name="main",
        image="registry.invalid/fairq/train:latest",
        env=env or None,
        resources=client.V1ResourceRequirements(limits=res, requests=res),
    )


def pod_spec(container: Any, *, gpu_type: str, priority_class: str | None = None) -> Any:
    return client.V1PodSpec(
        containers=[container],
        restart_policy="Never",
        node_selector={"fairq.io/gpu-type": gpu_type},
        # The fake GPU nodes carry the nvidia.com/gpu:NoSchedule taint.
        tolerations=[client.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
        priority_class_name=priority_class,
        termination_grace_period_seconds=30,
    )


def make_job(name: str, spec: Any, *, parallelism: int = 1, ttl: int | None = None) -> Any:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "fairq-envtest"}),
        spec=client.V1JobSpec(
            parallelism=parallelism,
            completions=parallelism,
            backoff_limit=0,
            ttl_seconds_after_finished=ttl,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "fairq-envtest", "fairq.io/job": name}),
                spec=spec,
            ),
        ),
    )


def job_condition(batch: Any, namespace: str, name: str, cond_type: str) -> Any:
    job = batch.read_namespaced_job_status(name, namespace)
    for cond in job.status.conditions or ():
        if cond.type == cond_type and cond.status == "True":
            return cond
    return None


def job_pods(core: Any, namespace: str, name: str) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items)


@pytest.fixture
def core(k8s_api_client: Any) -> Any:
    return client.CoreV1Api(k8s_api_client)


@pytest.fixture
def batch(k8s_api_client: Any) -> Any:
    return client.BatchV1Api(k8s_api_client)


@pytest.fixture
def priority_classes(k8s_api_client: Any) -> Iterator[Callable[..., str]]:
    """Factory for cluster-scoped PriorityClasses, deleted after the test."""
    sched = client.SchedulingV1Api(k8s_api_client)
    created: list[str] = []

    def make(value: int, *, preemption_policy: str = "PreemptLowerPriority") -> str:
        name = f"envtest-{value}-{uuid.uuid4().hex[:6]}"
        sched.create_priority_class(
            client.V1PriorityClass(
                metadata=client.V1ObjectMeta(name=name),
                value=value,
                preemption_policy=preemption_policy,
                description="fairq envtest smoke test",
            )
        )
        created.append(name)
        return name

    yield make
    for name in created:
        sched.delete_priority_class(name)


def test_it_serves_gpu_nodes_that_are_ready(core: Any) -> None:
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) >= {name for name, _, _ in DEFAULT_GPU_NODES}
    for name, gpu_type, gpus in DEFAULT_GPU_NODES:
        node = nodes[name]
        assert node.metadata.labels["fairq.io/gpu-type"] == gpu_type
        assert node.status.allocatable["nvidia.com/gpu"] == str(gpus)
        ready = {c.type: c.status for c in node.status.conditions}
        assert ready["Ready"] == "True"
        assert not any(t.key.startswith("node.kubernetes.io/") for t in node.spec.taints or ())


def test_it_creates_and_reads_a_priority_class(
    k8s_api_client: Any, priority_classes: Callable[..., str]
) -> None:
    name = priority_classes(100000)
    pc = client.SchedulingV1Api(k8s_api_client).read_priority_class(name)
    assert pc.value == 100000
    assert pc.preemption_policy == "PreemptLowerPriority"


def test_it_schedules_runs_and_completes_a_gpu_job(
    core: Any, batch: Any, k8s_namespace: str, priority_classes: Callable[..., str]
) -> None:
    prio = priority_classes(1000)
    spec = pod_spec(gpu_container(gpus=2, sim_seconds=2), gpu_type="h100", priority_class=prio)
    batch.create_namespaced_job(k8s_namespace, make_job("train", spec))

    pod = wait_until(lambda: next(iter(job_pods(core, k8s_namespace, "train")), None), what="the Job's pod")
    name = pod.metadata.name
    assert pod.spec.priority == 1000  # Priority admission resolved the class

    phases: list[str] = []

    def phase() -> str:
        p = core.read_namespaced_pod_status(name, k8s_namespace)
        if not phases or phases[-1] != p.status.phase:
            phases.append(p.status.phase)
        return str(p.status.phase)

    wait_until(lambda: phase() == "Running", what="pod Running")
    running = core.read_namespaced_pod(name, k8s_namespace)
    assert running.spec.node_name in H100_NODES
    assert running.status.start_time is not None
    assert running.status.container_statuses[0].state.running.started_at is not None

    wait_until(lambda: phase() == "Succeeded", what="pod Succeeded")
    assert phases[-2:] == ["Running", "Succeeded"]
    done = core.read_namespaced_pod(name, k8s_namespace)
    term = done.status.container_statuses[0].state.terminated
    assert term.exit_code == 0 and term.reason == "Completed"
    assert 1.5 <= (term.finished_at - term.started_at).total_seconds() <= 4

    cond = wait_until(lambda: job_condition(batch, k8s_namespace, "train", "Complete"), what="Job Complete")
    assert cond.status == "True"
    assert batch.read_namespaced_job_status("train", k8s_namespace).status.succeeded == 1


def test_it_fails_a_job_whose_pod_exits_non_zero(core: Any, batch: Any, k8s_namespace: str) -> None:
    spec = pod_spec(gpu_container(gpus=1, sim_seconds=1, exit_code=3), gpu_type="h100")
    batch.create_namespaced_job(k8s_namespace, make_job("crash", spec))

    cond = wait_until(lambda: job_condition(batch, k8s_namespace, "crash", "Failed"), what="Job Failed")
    assert cond.reason == "BackoffLimitExceeded"
    [pod] = job_pods(core, k8s_namespace, "crash")
    assert pod.status.phase == "Failed"
    term = pod.status.container_statuses[0].state.terminated
    assert term.exit_code == 3 and term.reason == "Error"


def test_a_high_priority_pod_preempts_a_low_priority_pod(
    core: Any, k8s_namespace: str, priority_classes: Callable[..., str]
) -> None:
    low = priority_classes(10)
    high = priority_classes(1000)
    [a100] = sorted(A100_NODES)

    def pod(name: str, prio: str) -> Any:
        # 8 GPUs: the whole A100 node, so the two cannot run side by side.
        spec = pod_spec(gpu_container(gpus=8), gpu_type="a100", priority_class=prio)
        return client.V1Pod(metadata=client.V1ObjectMeta(name=name), spec=spec)

    core.create_namespaced_pod(k8s_namespace, pod("low", low))
    wait_until(
        lambda: core.read_namespaced_pod_status("low", k8s_namespace).status.phase == "Running",
        what="low-priority pod Running",
    )
    low_uid = core.read_namespaced_pod("low", k8s_namespace).metadata.uid

    core.create_namespaced_pod(k8s_namespace, pod("high", high))

    def low_gone() -> bool:
        try:
            core.read_namespaced_pod("low", k8s_namespace)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_until(low_gone, timeout=30, what="the low-priority pod to be preempted and deleted")
    # kube-scheduler backs off after preempting before it binds the preemptor.
    wait_until(
        lambda: core.read_namespaced_pod_status("high", k8s_namespace).status.phase == "Running",
        timeout=45,
        what="high-priority pod Running",
    )
    assert core.read_namespaced_pod("high", k8s_namespace).spec.node_name == a100

    events = core.list_namespaced_event(k8s_namespace, field_selector=f"involvedObject.uid={low_uid}").items
    assert any(e.reason == "Preempted" for e in events), [(e.reason, e.message) for e in events]


@pytest.mark.parametrize("propagation", ["Foreground", "Background"])
def test_deleting_a_job_removes_its_pods(core: Any, batch: Any, k8s_namespace: str, propagation: str) -> None:
    # No FAIRQ_SIM_SECONDS: the pods run until deleted.
    spec = pod_spec(gpu_container(gpus=1), gpu_type="h100")
    batch.create_namespaced_job(k8s_namespace, make_job("long", spec, parallelism=2))
    wait_until(
        lambda: [p.status.phase for p in job_pods(core, k8s_namespace, "long")] == ["Running", "Running"],
        what="both pods Running",
    )

    batch.delete_namespaced_job("long", k8s_namespace, propagation_policy=propagation)

    def job_gone() -> bool:
        try:
            batch.read_namespaced_job("long", k8s_namespace)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_until(lambda: not job_pods(core, k8s_namespace, "long"), what=f"pods removed ({propagation})")
    wait_until(job_gone, what=f"job removed ({propagation})")


def test_resource_quota_admission_limits_gpus(core: Any, k8s_namespace: str) -> None:
    core.create_namespaced_resource_quota(
        k8s_namespace,
        client.V1ResourceQuota(
            metadata=client.V1ObjectMeta(name="gpus"),
            spec=client.V1ResourceQuotaSpec(hard={"requests.nvidia.com/gpu": "2"}),
        ),
    )
    # The quota controller must compute status.used before admission enforces it.
    wait_until(
        lambda: (
            (core.read_namespaced_resource_quota("gpus", k8s_namespace).status.used or {}).get(
                "requests.nvidia.com/gpu"
            )
            == "0"
        ),
        what="quota status computed",
    )
    spec = pod_spec(gpu_container(gpus=4), gpu_type="h100")

    def refused() -> ApiException | None:
        # Admission reads the quota from its own informer, which can trail the status
        # just read on a loaded machine: a pod let through is deleted and tried again.
        try:
            core.create_namespaced_pod(
                k8s_namespace, client.V1Pod(metadata=client.V1ObjectMeta(name="big"), spec=spec)
            )
        except ApiException as exc:
            return exc if exc.status != 409 else None  # 409: the one let through still there
        core.delete_namespaced_pod("big", k8s_namespace, grace_period_seconds=0)
        return None

    exc = wait_until(refused, what="admission refusing the pod over quota")
    assert exc.status == 403
    assert "exceeded quota" in str(exc.body)


def test_ttl_after_finished_deletes_a_finished_job(core: Any, batch: Any, k8s_namespace: str) -> None:
    spec = pod_spec(gpu_container(gpus=1, sim_seconds=0.5), gpu_type="h100")
    batch.create_namespaced_job(k8s_namespace, make_job("short", spec, ttl=0))

    def job_gone() -> bool:
        try:
            batch.read_namespaced_job("short", k8s_namespace)
        except ApiException as exc:
            return bool(exc.status == 404)
        return False

    wait_until(job_gone, timeout=45, what="the TTL controller to delete the finished Job")
