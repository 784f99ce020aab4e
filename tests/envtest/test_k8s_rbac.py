"""platform/k8s/rbac.yaml is enough, and no more than enough: the backend runs its whole
job life (priority classes, namespace and quota, submit, watch, capacity, logs, stop) as
the fairq-scheduler service account, and the fairq-web account can read but not write.

The envtest API server authorizes with RBAC; the admin impersonates the service
accounts. No database.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.envtest.cluster import envtest_required

if envtest_required():
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
else:
    client = pytest.importorskip("kubernetes.client")
    ApiException = pytest.importorskip("kubernetes.client.exceptions").ApiException

pytestmark = pytest.mark.k8s

RBAC = Path(__file__).resolve().parents[2] / "platform" / "k8s" / "rbac.yaml"


def _apply(api: Any, doc: dict[str, Any]) -> None:
    kind = doc["kind"]
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    create: dict[str, Callable[[], Any]] = {
        "Namespace": lambda: core.create_namespace(doc),
        "ServiceAccount": lambda: core.create_namespaced_service_account(
            doc["metadata"]["namespace"], doc),
        "ClusterRole": lambda: rbac.create_cluster_role(doc),
        "ClusterRoleBinding": lambda: rbac.create_cluster_role_binding(doc),
    }
    try:
        create[kind]()
    except ApiException as exc:
        if exc.status != 409:
            raise
        if kind == "ClusterRole":
            rbac.replace_cluster_role(doc["metadata"]["name"], doc)


@pytest.fixture(scope="module")
def rbac_applied(k8s_api_client: Any) -> None:
    import yaml

    for doc in yaml.safe_load_all(RBAC.read_text()):
        if doc:
            _apply(k8s_api_client, doc)


def backend_as(cp: Any, account: str, prefix: str) -> Any:
    from queueing.backends.k8s_manifest import GpuTypeRef
    from queueing.backends.kubernetes import KubernetesBackend, api_client_from_config

    api = api_client_from_config(kubeconfig=str(cp.kubeconfig_path))
    api.set_default_header("Impersonate-User", f"system:serviceaccount:fairq-system:{account}")
    return KubernetesBackend(
        api, namespace_prefix=prefix,
        gpu_types=[GpuTypeRef("h100", "nvidia.com/gpu", {"fairq.io/gpu-type": "h100"})],
        team_quota=lambda team: {"nvidia.com/gpu": 16})


@pytest.fixture
def prefix(k8s_api_client: Any) -> Iterator[str]:
    p = f"r{uuid.uuid4().hex[:6]}-"
    yield p
    core, batch = client.CoreV1Api(k8s_api_client), client.BatchV1Api(k8s_api_client)
    ns = f"{p}team"
    try:
        batch.delete_collection_namespaced_job(ns, propagation_policy="Background")
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        core.delete_namespace(ns)
    except ApiException as exc:
        if exc.status != 404:
            raise


def launch(name: str) -> Any:
    from queueing.backends.base import LaunchSpec

    return LaunchSpec(
        name=name, job_id=int(name.split("-")[1]), attempt=1, team="team", tier="rbac",
        priority_class_name="", gpu_type="h100", resource_name="nvidia.com/gpu",
        node_labels={"fairq.io/gpu-type": "h100"}, gpus_per_replica=1, replicas=1,
        image="registry.invalid/x:1", command=[], args=[], env={}, max_runtime_seconds=None)


def until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


def test_the_scheduler_account_can_run_a_jobs_whole_life(
    rbac_applied: None, k8s_control_plane: Any, k8s_api_client: Any, prefix: str,
) -> None:
    from queueing.backends.base import Phase
    from queueing.backends.kubernetes import PriorityClassSpec

    backend = backend_as(k8s_control_plane, "fairq-scheduler", prefix)
    try:
        sched = client.SchedulingV1Api(k8s_api_client)
        # Keep every fairq class as it is (other tests use them) and add one, then change it.
        keep = [PriorityClassSpec(p.metadata.name, p.value, p.preemption_policy or "Never",
                                  (p.metadata.labels or {}).get("fairq.io/tier", ""))
                for p in sched.list_priority_class().items
                if (p.metadata.labels or {}).get("app.kubernetes.io/managed-by") == "fairq"]
        mine = f"rbac-{prefix.rstrip('-')}"
        assert mine in backend.sync_priority_classes(
            [*keep, PriorityClassSpec(mine, 7, "Never", "rbac")])["created"]
        assert mine in backend.sync_priority_classes(
            [*keep, PriorityClassSpec(mine, 8, "Never", "rbac")])["replaced"]

        assert backend.ensure_namespace("team") == f"{prefix}team"
        backend.ensure_namespace("team", force=True)  # patch labels, replace the quota
        quota = client.CoreV1Api(k8s_api_client).read_namespaced_resource_quota(
            "fairq-gpus", f"{prefix}team")
        assert quota.spec.hard == {"requests.nvidia.com/gpu": "16"}

        name = f"fq-{800000 + int(uuid.uuid4().int % 1000)}-1"
        backend.submit(launch(name), now=datetime.now(UTC))
        backend.submit(launch(name), now=datetime.now(UTC))  # idempotent
        until(lambda: any(s.name == name and s.phase == Phase.RUNNING
                          for s in backend.statuses(now=datetime.now(UTC))), "RUNNING")
        assert any(n.allocated >= 1 for n in backend.nodes())
        assert "[fairq] no logs from pod" in backend.logs(name)  # not a 403
        client.CoreV1Api(backend.api).list_namespaced_event(f"{prefix}team")  # FailedCreate
        backend.stop(name, now=datetime.now(UTC))
        until(lambda: name not in {s.name for s in backend.statuses(now=datetime.now(UTC))},
              "the Job gone")
        sched.delete_priority_class(mine)
    finally:
        backend.close()


def test_the_web_account_reads_but_cannot_write(
    rbac_applied: None, k8s_control_plane: Any, prefix: str,
) -> None:
    from queueing.backends.kubernetes import KubernetesBackendError

    web = backend_as(k8s_control_plane, "fairq-web", prefix)
    try:
        web.wait_synced(30)
        assert {n.gpu_type for n in web.nodes()} == {"h100"}
        web.statuses(now=datetime.now(UTC))
        assert web.logs("fq-1-1") == ""
        with pytest.raises(ApiException) as denied:
            web.ensure_namespace("team")
        assert denied.value.status == 403
        web._known_namespaces.add(f"{prefix}team")  # as if it existed
        with pytest.raises(KubernetesBackendError, match="403"):
            web.submit(launch("fq-2-1"), now=datetime.now(UTC))
        with pytest.raises(ApiException) as denied:
            client.CoreV1Api(web.api).list_namespaced_secret("fairq-system")
        assert denied.value.status == 403
        assert json.loads(denied.value.body)["reason"] == "Forbidden"
    finally:
        web.close()
