"""fairq's Kubernetes backend against a real control plane (tests/envtest): jobs go in
through the API, the scheduler cycle runs as the worker would, and what the API server,
kube-scheduler, the Job controller and the fake kubelet do comes back as job states and
usage.

Each test gets its own namespace prefix (so its team namespaces are its own) and a fresh
backend with its watch threads, closed afterwards. The database is real and committed
(`transaction=True`): the backend's threads are not inside the test's transaction.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import pytest
from django.test import override_settings

from tests.envtest.cluster import DEFAULT_GPU_NODES, envtest_required

if envtest_required():
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
else:
    client = pytest.importorskip("kubernetes.client")
    ApiException = pytest.importorskip("kubernetes.client.exceptions").ApiException

from tests.conftest import job_body

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]

H100_NODES = {n for n, t, _ in DEFAULT_GPU_NODES if t == "h100"}
A100_NODES = {n for n, t, _ in DEFAULT_GPU_NODES if t == "a100"}


@dataclass
class Kube:
    backend: Any
    core: Any
    batch: Any
    prefix: str

    def ns(self, team: str) -> str:
        return f"{self.prefix}{team}"

    def jobs(self, team: str, job_id: int | None = None) -> list[dict[str, Any]]:
        selector = "app.kubernetes.io/managed-by=fairq"
        if job_id is not None:
            selector += f",fairq.io/job-id={job_id}"
        resp = self.batch.list_namespaced_job(self.ns(team), label_selector=selector,
                                              _preload_content=False)
        return list(json.loads(resp.data)["items"])

    def pods(self, team: str, workload: str) -> list[dict[str, Any]]:
        resp = self.core.list_namespaced_pod(self.ns(team), _preload_content=False,
                                             label_selector=f"fairq.io/workload={workload}")
        return list(json.loads(resp.data)["items"])

    def job_exists(self, team: str, name: str) -> bool:
        try:
            self.batch.read_namespaced_job(name, self.ns(team))
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True


def wait(predicate: Callable[[], Any], *, timeout: float = 30.0, what: str,
         cycle: bool = True) -> Any:
    """Run scheduler cycles (as the worker does) until `predicate` holds."""
    from queueing.services.scheduler import scheduler_cycle

    deadline = time.monotonic() + timeout
    while True:
        if cycle:
            scheduler_cycle()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)


def job(pk: int) -> Any:
    from queueing.models import Job

    return Job.objects.select_related("team", "tier", "gpu_type").get(pk=pk)


def _empty_namespace(kube: Kube, namespace: str) -> None:
    try:
        kube.batch.delete_collection_namespaced_job(namespace, propagation_policy="Background")
    except ApiException as exc:
        if exc.status != 404:
            raise
    deadline = time.monotonic() + 60
    while kube.core.list_namespaced_pod(namespace).items and time.monotonic() < deadline:
        kube.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        time.sleep(0.3)
    kube.core.delete_namespace(namespace, propagation_policy="Background")


@pytest.fixture
def kube(k8s_control_plane: Any, settings: Any, world: Any) -> Iterator[Kube]:
    from queueing.backends.kubernetes import KubernetesBackend
    from queueing.composition import get_backend, reset_backends
    from queueing.models import GpuType
    from queueing.services.provisioning import sync_cluster

    prefix = f"k{uuid.uuid4().hex[:6]}-"
    settings.FAIRQ_CLUSTER_BACKEND = "kubernetes"
    settings.FAIRQ_KUBECONFIG = str(k8s_control_plane.kubeconfig_path)
    settings.FAIRQ_KUBE_CONTEXT = ""
    settings.FAIRQ_KUBE_NAMESPACE_PREFIX = prefix
    settings.FAIRQ_K8S_RESYNC_SECONDS = 30
    settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS = 5
    settings.FAIRQ_PREEMPTION_TERMINATION_GRACE_SECONDS = 2
    # The test world's GPU types, selecting the envtest nodes by their labels.
    GpuType.objects.filter(slug="h100").update(node_labels={"fairq.io/gpu-type": "h100"})
    GpuType.objects.filter(slug="a100").update(node_labels={"fairq.io/gpu-type": "a100"})
    reset_backends()
    backend = get_backend()
    assert isinstance(backend, KubernetesBackend)
    sync_cluster(backend.provisioner)
    backend.wait_synced(30)
    with k8s_control_plane.api_client() as api:
        k = Kube(backend, client.CoreV1Api(api), client.BatchV1Api(api), prefix)
        try:
            yield k
        finally:
            k.backend.close()
            reset_backends()
            for team in ("vision", "nlp", "speech"):
                _empty_namespace(k, k.ns(team))


def submit(world: Any, user: Any = None, **overrides: Any) -> int:
    r = world.client(user or world.member).post("/api/v1/jobs/", job_body(**overrides),
                                                format="json")
    assert r.status_code == 201, r.content
    return int(r.json()["id"])


def container_times(pod: dict[str, Any]) -> tuple[datetime, datetime | None]:
    from queueing.backends.k8s_manifest import parse_time

    state = pod["status"]["containerStatuses"][0]["state"]
    if "terminated" in state:
        return (parse_time(state["terminated"]["startedAt"]),  # type: ignore[return-value]
                parse_time(state["terminated"]["finishedAt"]))
    return parse_time(state["running"]["startedAt"]), None  # type: ignore[return-value]


# --- the life of a job ---------------------------------------------------------------------

def test_a_job_becomes_a_job_in_its_team_namespace_runs_succeeds_and_is_charged(
    kube: Kube, world: Any,
) -> None:
    from queueing.models import UsageRecord

    pk = submit(world, gpus=2, env={"FAIRQ_SIM_SECONDS": "3"}, tier="high")
    wait(lambda: job(pk).submitted_to_backend_at is not None, what="the job submitted")

    [k8s_job] = kube.jobs("vision", pk)
    meta, spec = k8s_job["metadata"], k8s_job["spec"]
    assert meta["name"] == f"fq-{pk}-1"
    assert meta["labels"]["fairq.io/team"] == "vision"
    assert meta["labels"]["fairq.io/tier"] == "high"
    assert meta["labels"]["fairq.io/job-id"] == str(pk)
    assert meta["labels"]["fairq.io/attempt"] == "1"
    assert spec["parallelism"] == spec["completions"] == 1
    assert spec["activeDeadlineSeconds"] == 3600
    pod_spec = spec["template"]["spec"]
    assert pod_spec["priorityClassName"] == world.high.priority_class_name
    assert pod_spec["nodeSelector"] == {"fairq.io/gpu-type": "h100"}
    # The GPUs, and the memory every pod is limited to (docs/kubernetes.md, "Memory,
    # /dev/shm and CPU": the platform's FAIRQ_DEFAULT_MEMORY_PER_GPU, 2 x 32Gi).
    assert pod_spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2",
                                                                 "memory": "64Gi"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod_spec["tolerations"]
    pc = client.SchedulingV1Api(kube.backend.api).read_priority_class(
        world.high.priority_class_name)
    assert pc.value == world.high.priority_value and pc.preemption_policy == "Never"
    ns = kube.core.read_namespace(kube.ns("vision"))
    assert ns.metadata.labels["app.kubernetes.io/managed-by"] == "fairq"

    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING")
    [pod] = kube.pods("vision", f"fq-{pk}-1")
    assert pod["spec"]["nodeName"] in H100_NODES
    assert pod["spec"]["priority"] == world.high.priority_value
    start, _ = container_times(pod)
    assert job(pk).started_at == start

    wait(lambda: job(pk).status == "SUCCEEDED", timeout=30, what="the job SUCCEEDED")
    [pod] = kube.pods("vision", f"fq-{pk}-1")
    start, end = container_times(pod)
    done = job(pk)
    assert (done.started_at, done.finished_at, done.exit_code) == (start, end, 0)
    [usage] = UsageRecord.objects.filter(job_id=pk)
    assert usage.gpus == 2
    assert usage.gpu_seconds == pytest.approx(2 * (end - start).total_seconds())  # type: ignore[operator]
    assert (end - start).total_seconds() >= 2  # type: ignore[operator]


def test_a_gang_runs_all_its_replicas_on_the_planned_nodes(kube: Kube, world: Any) -> None:
    from queueing.models import UsageRecord

    pk = submit(world, gpus=8, replicas=2, env={"FAIRQ_SIM_SECONDS": "2"})
    wait(lambda: job(pk).status == "RUNNING", what="the gang RUNNING")
    # One Job per replica (docs/kubernetes.md, "Replicas that rendezvous").
    k8s_jobs = kube.jobs("vision", pk)
    assert sorted(j["metadata"]["name"] for j in k8s_jobs) == [f"fq-{pk}-1", f"fq-{pk}-1-1"]
    assert all(j["spec"]["parallelism"] == j["spec"]["completions"] == 1 for j in k8s_jobs)
    pods = kube.pods("vision", f"fq-{pk}-1")
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(H100_NODES)
    assert sorted(job(pk).placement) == sorted(H100_NODES)
    wait(lambda: job(pk).status == "SUCCEEDED", what="the gang SUCCEEDED")
    assert UsageRecord.objects.get(job_id=pk).gpus == 16


def test_a_mig_job_asks_for_its_mig_resource_and_runs_on_a_mig_node(
    kube: Kube, world: Any, k8s_control_plane: Any,
) -> None:
    from queueing.models import GpuType

    GpuType.objects.filter(slug="mig-1g-10gb").update(
        node_labels={"fairq.io/gpu-type": "mig-1g-10gb"})
    kube.backend._gpu_types_cache = None
    k8s_control_plane.add_gpu_node("mig-0", "mig-1g-10gb", 7,
                                   resource="nvidia.com/mig-1g.10gb")
    try:
        wait(lambda: "mig-0" in {n.name for n in kube.backend.nodes()}, cycle=False,
             what="the MIG node in nodes()")
        pk = submit(world, gpus=1, gpu_type="mig-1g-10gb", env={"FAIRQ_SIM_SECONDS": "1"})
        wait(lambda: job(pk).status == "SUCCEEDED", what="the MIG job SUCCEEDED")
        [k8s_job] = kube.jobs("vision", pk)
        [c] = k8s_job["spec"]["template"]["spec"]["containers"]
        assert c["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1", "memory": "32Gi"}
        [pod] = kube.pods("vision", f"fq-{pk}-1")
        assert pod["spec"]["nodeName"] == "mig-0"
    finally:
        kube.core.delete_node("mig-0")


def test_a_failing_pod_fails_the_job_with_its_exit_code(kube: Kube, world: Any) -> None:
    pk = submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "1", "FAIRQ_SIM_EXIT_CODE": "3"})
    wait(lambda: job(pk).status == "FAILED", timeout=40, what="the job FAILED")
    failed = job(pk)
    assert failed.exit_code == 3 and "exit code 3" in failed.message


def test_a_job_past_its_max_runtime_fails_with_deadline_exceeded(kube: Kube, world: Any) -> None:
    pk = submit(world, gpus=1, max_runtime_seconds=2)  # runs until stopped
    wait(lambda: job(pk).status == "FAILED", timeout=40, what="the job FAILED")
    assert job(pk).message.startswith("DeadlineExceeded")
    wait(lambda: not kube.pods("vision", f"fq-{pk}-1"), cycle=False, what="its pods gone")


def test_a_job_whose_pods_a_quota_refuses_fails_with_the_controllers_message(
    kube: Kube, world: Any,
) -> None:
    # A quota edited by hand below what fairq admits: the Job controller cannot create pods.
    kube.core.patch_namespaced_resource_quota(
        "fairq-gpus", kube.ns("vision"), {"spec": {"hard": {"requests.nvidia.com/gpu": "0"}}})
    wait(lambda: (kube.core.read_namespaced_resource_quota("fairq-gpus", kube.ns("vision"))
                  .status.hard or {}).get("requests.nvidia.com/gpu") == "0",
         cycle=False, what="the quota in force")
    kube.backend.pod_create_timeout_seconds = 3
    pk = submit(world, gpus=1)
    wait(lambda: job(pk).status == "FAILED", what="the job FAILED")
    assert job(pk).message.startswith("no pod could be created in 3 s")
    assert "exceeded quota" in job(pk).message


def test_cancel_removes_the_pods_and_frees_the_gpus_only_when_they_are_gone(
    kube: Kube, world: Any,
) -> None:
    pk = submit(world, gpus=8, gpu_type="a100")  # runs until stopped
    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING")
    name = f"fq-{pk}-1"
    [a100] = [n for n in kube.backend.nodes() if n.name in A100_NODES]
    assert a100.allocated == 8

    r = world.client(world.member).post(f"/api/v1/jobs/{pk}/cancel/")
    assert r.status_code == 200, r.content
    assert job(pk).status == "CANCELLED"
    wait(lambda: not kube.pods("vision", name), cycle=False, what="the pods gone")
    wait(lambda: not kube.job_exists("vision", name), cycle=False, what="the Job gone")
    wait(lambda: [n.allocated for n in kube.backend.nodes() if n.name in A100_NODES] == [0],
         cycle=False, what="the GPUs free in nodes()")


def test_a_worker_killed_between_job_created_and_status_saved_creates_no_second_job(
    kube: Kube, world: Any, settings: Any,
) -> None:
    from queueing.composition import get_backend, reset_backends
    from queueing.services.scheduler import launch_spec, scheduler_cycle

    class KilledAfterCreate:
        """The backend, with a worker that dies right after the API server said 201."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def submit(self, spec: Any, *, now: datetime) -> None:
            self.inner.submit(spec, now=now)
            raise RuntimeError("worker killed")

    pk = submit(world, gpus=1)
    result = scheduler_cycle(backend=KilledAfterCreate(kube.backend))
    assert pk in result.admitted and pk in result.submit_errors
    assert job(pk).status == "ADMITTED" and job(pk).submitted_to_backend_at is None
    [first] = kube.jobs("vision", pk)

    # A new worker process: a new backend whose cache has not seen the Job (the create
    # is answered 409 and adopted).
    kube.backend.close()
    reset_backends()
    fresh = get_backend()
    fresh.submit(launch_spec(job(pk)), now=job(pk).admitted_at)  # 409: adopted
    kube.backend = fresh  # closed by the fixture
    scheduler_cycle(backend=fresh)
    # The next cycle either marks it submitted or, its pod already running, RUNNING.
    assert job(pk).submitted_to_backend_at is not None or job(pk).status == "RUNNING"
    [again] = kube.jobs("vision", pk)
    assert again["metadata"]["uid"] == first["metadata"]["uid"]
    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING")
    assert len(kube.jobs("vision", pk)) == 1


def test_an_orphan_job_is_deleted_and_reported(kube: Kube, world: Any) -> None:
    from queueing.backends.base import LaunchSpec
    from queueing.services.scheduler import scheduler_cycle

    orphan = LaunchSpec(
        name="fq-999999-1", job_id=999999, attempt=1, team="vision", tier="low",
        priority_class_name=world.low.priority_class_name, gpu_type="h100",
        resource_name="nvidia.com/gpu", node_labels={"fairq.io/gpu-type": "h100"},
        gpus_per_replica=1, replicas=1, image="ghcr.io/acme/train:1", command=[], args=[],
        env={}, max_runtime_seconds=None)
    kube.backend.submit(orphan, now=datetime.now().astimezone())
    wait(lambda: any(p["status"].get("phase") == "Running"
                     for p in kube.pods("vision", orphan.name)),
         cycle=False, what="the orphan's pod Running")
    stopped = wait(lambda: orphan.name in scheduler_cycle().orphans_stopped,
                   cycle=False, what="the orphan reported")
    assert stopped
    wait(lambda: not kube.pods("vision", orphan.name), cycle=False, what="its pods gone")
    wait(lambda: not kube.job_exists("vision", orphan.name), cycle=False, what="its Job gone")


# Rule R9 off: this test is about how preemption is carried out on the cluster, and its
# victim started before its preemptor was submitted, so at the default ratio (lost work at
# most the preemptor's GPUs x its wait) the preemptor would wait for the victim to end.
@override_settings(FAIRQ_PREEMPTION_LOST_PER_WAIT=-1)
def test_a_high_tier_job_preempts_a_low_tier_one_and_the_low_one_is_requeued(
    kube: Kube, world: Any,
) -> None:
    from queueing.models import JobEvent, Quota

    # Rule Q2: another team's higher tier takes only what a team borrows, so vision is
    # guaranteed no A100s here (its low job borrows the whole node).
    Quota.objects.filter(team=world.vision, gpu_type=world.a100).update(nominal=0)
    low = submit(world, gpus=8, gpu_type="a100", tier="low")  # the whole A100 node
    wait(lambda: job(low).status == "RUNNING", what="the low job RUNNING")
    low_name = f"fq-{low}-1"

    high = submit(world, world.outsider, team="nlp", gpus=8, gpu_type="a100", tier="high")
    wait(lambda: job(low).attempt == 2, timeout=30, what="the low job preempted")
    assert job(low).status == "QUEUED"
    assert JobEvent.objects.filter(job_id=low, to_status="PREEMPTED").exists()
    wait(lambda: not kube.job_exists("vision", low_name), cycle=False, timeout=30,
         what="the low Job deleted")
    wait(lambda: job(high).status == "RUNNING", timeout=60, what="the high job RUNNING")
    [pod] = kube.pods("nlp", f"fq-{high}-1")
    assert pod["spec"]["nodeName"] in A100_NODES
    assert job(low).status == "QUEUED"


def test_a_hostile_job_body_puts_no_such_field_in_the_created_job(
    kube: Kube, world: Any,
) -> None:
    hostile = {
        "privileged": True, "hostPath": "/", "hostNetwork": True, "hostPID": True,
        "serviceAccountName": "cluster-admin", "securityContext": {"privileged": True},
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}], "nodeName": "gpu-h100-0",
        "tolerations": [{"operator": "Exists"}], "spec": {"hostNetwork": True},
    }
    r = world.client(world.member).post("/api/v1/jobs/", job_body(gpus=1, **hostile),
                                        format="json")
    assert r.status_code == 400, r.content  # refused by name, not half-applied
    # (`volumes` is a job field (docs/kubernetes.md, "Volumes"): its hostPath is refused by name, and its
    # missing mount path.)
    assert set(r.json()["error"]["fields"]) == set(hostile) - {"volumes"} | {
        "volumes[0].hostPath", "volumes[0].mount_path"}
    r = world.client(world.member).post("/api/v1/jobs/", job_body(gpus=1), format="json")
    assert r.status_code == 201, r.content
    pk = int(r.json()["id"])
    wait(lambda: job(pk).submitted_to_backend_at is not None, what="the job submitted")
    [k8s_job] = kube.jobs("vision", pk)
    text = json.dumps(k8s_job)
    pod = k8s_job["spec"]["template"]["spec"]
    assert "hostPath" not in text and "cluster-admin" not in text and "volumes" not in pod
    assert not pod.get("hostNetwork") and not pod.get("hostPID")
    assert "serviceAccountName" not in pod and "nodeName" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert pod["containers"][0]["securityContext"] == {
        "privileged": False, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True}  # the team's setting (a new team's default)


# --- capacity, logs, sync --------------------------------------------------------------------

def test_nodes_come_from_the_cluster_and_a_cordoned_node_leaves(kube: Kube) -> None:
    nodes = {n.name: n for n in kube.backend.nodes()}
    for name, gpu_type, gpus in DEFAULT_GPU_NODES:
        assert (nodes[name].gpu_type, nodes[name].capacity) == (gpu_type, gpus)
    [a100] = sorted(A100_NODES)
    # Someone else's pod holding 3 GPUs counts against the node too.
    other = kube.ns("speech")
    kube.core.create_namespaced_pod(other, {
        "metadata": {"name": "not-fairq"},
        "spec": {"restartPolicy": "Never", "nodeSelector": {"fairq.io/gpu-type": "a100"},
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                 "containers": [{"name": "c", "image": "x", "resources": {
                     "limits": {"nvidia.com/gpu": "3"}}}]}})
    wait(lambda: {n.name: n.allocated for n in kube.backend.nodes()}[a100] == 3,
         cycle=False, what="the other pod's GPUs counted")
    kube.core.delete_namespaced_pod("not-fairq", other, grace_period_seconds=0)
    wait(lambda: {n.name: n.allocated for n in kube.backend.nodes()}[a100] == 0,
         cycle=False, what="its GPUs free again")
    kube.core.patch_node(a100, {"spec": {"unschedulable": True}})
    try:
        wait(lambda: a100 not in {n.name for n in kube.backend.nodes()}, cycle=False,
             what="the cordoned node gone from nodes()")
    finally:
        kube.core.patch_node(a100, {"spec": {"unschedulable": False}})
    wait(lambda: a100 in {n.name for n in kube.backend.nodes()}, cycle=False,
         what="the node back")


def test_logs_answer_with_a_readable_error_when_the_node_has_none(kube: Kube, world: Any) -> None:
    pk = submit(world, gpus=1)
    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING")
    r = world.client(world.member).get(f"/api/v1/jobs/{pk}/logs/?tail=5")
    assert r.status_code == 200 and r.json()["lines"] == []  # the worker copied none yet
    from django.utils import timezone

    from queueing.services.logs import job_logs_archive

    job_logs_archive(backend=kube.backend, now=timezone.now())  # the worker's beat task
    r = world.client(world.member).get(f"/api/v1/jobs/{pk}/logs/?tail=5")
    assert r.status_code == 200, r.content
    lines = r.json()["lines"]
    assert lines and lines[0].startswith("[fairq] no logs from pod fq-")
    assert kube.backend.logs("fq-0-1") == ""


def test_sync_cluster_keeps_priority_classes_and_quotas_in_step(
    kube: Kube, world: Any, settings: Any,
) -> None:
    from queueing.models import Quota
    from queueing.services.provisioning import sync_cluster

    # FAIRQ_K8S_PROVISION=separate: a quota change is applied by the worker (the signal
    # queues sync_cluster_task, eager here, after commit) to the provisioned namespace ...
    quota_row = Quota.objects.get(team=world.vision, gpu_type=world.a100)
    quota_row.borrowing_limit = 0
    quota_row.save()
    quota = kube.core.read_namespaced_resource_quota("fairq-gpus", kube.ns("vision"))
    assert quota.spec.hard == {"requests.nvidia.com/gpu": "24"}  # h100 8+8, a100 8+0
    # ... a tier change waits for the provisioner: the worker may not touch PriorityClasses.
    sched = client.SchedulingV1Api(kube.backend.api)
    world.low.priority_value = 5
    world.low.save()
    assert sched.read_priority_class(world.low.priority_class_name).value != 5
    report = sync_cluster(kube.backend.provisioner)
    assert report["replaced"] == [world.low.priority_class_name]
    assert sched.read_priority_class(world.low.priority_class_name).value == 5
    report = sync_cluster(kube.backend.provisioner)
    assert world.low.priority_class_name in report["unchanged"]
    assert report["created"] == report["replaced"] == report["deleted"] == []
    # FAIRQ_K8S_PROVISION=scheduler: the worker provisions all of it on the change.
    settings.FAIRQ_K8S_PROVISION = "scheduler"
    world.low.priority_value = 6
    world.low.save()
    assert sched.read_priority_class(world.low.priority_class_name).value == 6

    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("sync_cluster", stdout=out)
    assert sorted(json.loads(out.getvalue())["namespaces"]) == [
        kube.ns("nlp"), kube.ns("speech"), kube.ns("vision")]


def test_a_running_job_whose_job_is_deleted_outside_fairq_fails_with_a_reason(
    kube: Kube, world: Any,
) -> None:
    pk = submit(world, gpus=1)
    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING")
    kube.batch.delete_namespaced_job(f"fq-{pk}-1", kube.ns("vision"),
                                     propagation_policy="Background")
    wait(lambda: job(pk).status == "FAILED", what="the job FAILED")
    assert "deleted outside fairq" in job(pk).message


def test_an_admitted_job_whose_job_vanished_is_requeued_with_an_event(
    kube: Kube, world: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from datetime import timedelta

    from queueing.models import JobEvent
    from queueing.services import scheduler
    from queueing.services.scheduler import scheduler_cycle

    monkeypatch.setattr(scheduler, "VANISHED_GRACE", timedelta(seconds=1))

    class DeletedRightAway:
        """The Job is created, then deleted by someone before any pod ran."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def submit(self, spec: Any, *, now: datetime) -> None:
            # Its pods can never be placed, so none runs before the deletion.
            self.inner.submit(replace(spec, node_labels={"fairq.io/gpu-type": "nowhere"}),
                              now=now)
            kube.batch.delete_namespaced_job(spec.name, kube.ns(spec.team),
                                             propagation_policy="Foreground")

    pk = submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "1"})
    scheduler_cycle(backend=DeletedRightAway(kube.backend))
    assert job(pk).status == "ADMITTED"
    wait(lambda: job(pk).attempt == 2, what="the job requeued as attempt 2")
    assert JobEvent.objects.filter(job_id=pk, to_status="QUEUED",
                                   reason__contains="vanished").exists()
    wait(lambda: job(pk).status == "SUCCEEDED", what="attempt 2 SUCCEEDED")
    assert kube.jobs("vision", pk)[0]["metadata"]["name"] == f"fq-{pk}-2"
