"""The Kubernetes backend's pure parts: LaunchSpec → Job manifest (and nothing else from
the user), names and labels, the registry allow-list, Job/Pod → WorkloadStatus, and
capacity from nodes and pods. No cluster; the API tests use the test database."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queueing.backends.base import (
    RENDEZVOUS_PORT,
    LaunchSpec,
    Phase,
    parse_workload_name,
    workload_name,
)
from queueing.backends.k8s_manifest import (
    GpuTypeRef,
    ManifestError,
    ManifestOptions,
    capacity,
    is_replica_job,
    job_manifest,
    job_manifests,
    master_addr,
    namespace_for,
    orphan_pods_status,
    pods_finished,
    priority_class_manifest,
    replica_nodes,
    resource_quota_manifest,
    service_manifest,
    unbound_demand,
    workload_finished,
    workload_status,
)
from queueing.validation import image_registry_path, registry_problem

from .conftest import job_body

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
# `privileged` appears once, as fairq's own `False`, and `capabilities` as fairq's
# `drop: [ALL]`: checked separately.
FORBIDDEN_KEYS = {"hostPath", "hostNetwork", "hostPID", "hostIPC",
                  "serviceAccountName", "serviceAccount", "volumes", "volumeMounts",
                  "runAsUser", "valueFrom", "envFrom", "hostPort",
                  "initContainers", "nodeName", "imagePullSecrets", "dnsPolicy"}


def spec(**overrides: Any) -> LaunchSpec:
    values: dict[str, Any] = {
        "name": "fq-12-1", "job_id": 12, "attempt": 1, "team": "vision", "tier": "normal",
        "priority_class_name": "fairq-normal", "gpu_type": "h100", "resource_name": "nvidia.com/gpu",
        "node_labels": {"fairq.io/gpu-type": "h100"}, "gpus_per_replica": 2, "replicas": 1,
        "image": "ghcr.io/acme/train:1.4", "command": ["python", "train.py"], "args": ["--epochs", "3"],
        "env": {"SEED": "1"}, "max_runtime_seconds": 3600, "placement": ("gpu-h100-0",),
    }
    values.update(overrides)
    return LaunchSpec(**values)


OPTS = ManifestOptions(namespace="fairq-vision", backoff_limit=0, ttl_seconds_after_finished=600)


def all_keys(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in all_keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in all_keys(v)}
    return set()


def test_it_builds_a_job_with_priority_limits_selector_toleration_and_labels() -> None:
    m = job_manifest(spec(), OPTS)
    assert m["apiVersion"] == "batch/v1" and m["kind"] == "Job"
    assert m["metadata"]["name"] == "fq-12-1"
    assert m["metadata"]["namespace"] == "fairq-vision"
    labels = m["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "fairq"
    assert labels["fairq.io/job-id"] == "12" and labels["fairq.io/attempt"] == "1"
    assert labels["fairq.io/team"] == "vision" and labels["fairq.io/tier"] == "normal"
    assert m["metadata"]["annotations"]["fairq.io/job-id"] == "12"
    js = m["spec"]
    assert js["parallelism"] == js["completions"] == 1
    assert js["activeDeadlineSeconds"] == 3600
    assert js["backoffLimit"] == 0 and js["ttlSecondsAfterFinished"] == 600
    assert "completionMode" not in js  # not served by the 1.20 default options
    pod = js["template"]["spec"]
    assert js["template"]["metadata"]["labels"] == labels
    assert pod["priorityClassName"] == "fairq-normal"
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"fairq.io/gpu-type": "h100"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert pod["automountServiceAccountToken"] is False
    [c] = pod["containers"]
    assert c["image"] == "ghcr.io/acme/train:1.4"
    assert c["command"] == ["python", "train.py"] and c["args"] == ["--epochs", "3"]
    assert c["env"] == [{"name": "FAIRQ_ATTEMPT", "value": "1"},
                        {"name": "FAIRQ_JOB_ID", "value": "12"},
                        {"name": "FAIRQ_STOP_SIGNAL", "value": "SIGTERM"},
                        {"name": "SEED", "value": "1"}]
    assert "lifecycle" not in c  # SIGTERM: the kubelet's own, no preStop hook
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "2"},
                              "requests": {"nvidia.com/gpu": "2"}}
    assert c["securityContext"] == {"privileged": False, "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                    "seccompProfile": {"type": "RuntimeDefault"},
                                    "runAsNonRoot": True}


def test_a_single_replica_job_is_indexed_where_served() -> None:
    m = job_manifest(spec(), ManifestOptions(namespace="ns", indexed=True))
    assert m["spec"]["parallelism"] == m["spec"]["completions"] == 1
    assert m["spec"]["completionMode"] == "Indexed"
    assert "hostname" not in m["spec"]["template"]["spec"]
    assert "subdomain" not in m["spec"]["template"]["spec"]


def test_a_multi_replica_job_is_one_job_per_replica_with_stable_hostnames() -> None:
    ms = job_manifests(spec(replicas=4, placement=("a", "a", "b", "b")),
                       ManifestOptions(namespace="ns", indexed=True, backoff_limit=3))
    assert [m["metadata"]["name"] for m in ms] == ["fq-12-1", "fq-12-1-1", "fq-12-1-2",
                                                   "fq-12-1-3"]
    for i, m in enumerate(ms):
        js, pod_spec = m["spec"], m["spec"]["template"]["spec"]
        assert js["parallelism"] == js["completions"] == 1
        assert js["backoffLimit"] == 0  # a replaced replica would join a broken rendezvous
        assert "completionMode" not in js  # explicit hostnames, the same on 1.20 and later
        assert pod_spec["hostname"] == f"fq-12-1-{i}"
        assert pod_spec["subdomain"] == "fq-12-1"
        for labels in (m["metadata"]["labels"], js["template"]["metadata"]["labels"]):
            assert labels["fairq.io/workload"] == "fq-12-1"
            assert labels["fairq.io/replica"] == str(i)
        assert m["metadata"]["annotations"]["fairq.io/replicas"] == "4"
        assert m["metadata"]["annotations"]["fairq.io/placement"] == "a,a,b,b"
        terms = pod_spec["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"]
        # Each replica prefers the node planned for it (one value per field selector).
        assert [t["preference"]["matchFields"][0]["values"] for t in terms] == \
            [["a" if i < 2 else "b"]]
        assert not all_keys(m) & FORBIDDEN_KEYS
    assert not is_replica_job(ms[0]) and all(is_replica_job(m) for m in ms[1:])
    assert job_manifest(spec(replicas=4), OPTS, replica=2) == \
        job_manifests(spec(replicas=4), OPTS)[2]
    with pytest.raises(ManifestError):
        job_manifest(spec(replicas=2), OPTS, replica=2)


def env_of(m: dict[str, Any]) -> dict[str, str]:
    [c] = m["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in c["env"]}


def test_each_replica_gets_the_rendezvous_env_naming_replica_0s_stable_host() -> None:
    ms = job_manifests(spec(replicas=2, gpus_per_replica=4, attempt=3, name="fq-12-3"), OPTS)
    for i, m in enumerate(ms):
        assert env_of(m) == {
            "SEED": "1", "FAIRQ_JOB_ID": "12", "FAIRQ_ATTEMPT": "3",
            "FAIRQ_STOP_SIGNAL": "SIGTERM",
            "MASTER_ADDR": "fq-12-3-0.fq-12-3", "MASTER_PORT": str(RENDEZVOUS_PORT),
            "WORLD_SIZE": "2", "NODE_RANK": str(i), "NPROC_PER_NODE": "4"}
    assert RENDEZVOUS_PORT == 29500
    assert master_addr("fq-12-3") == "fq-12-3-0.fq-12-3"


def test_a_single_replica_job_gets_its_job_id_and_attempt_and_no_rendezvous() -> None:
    [m] = job_manifests(spec(attempt=2), OPTS)
    assert env_of(m) == {"SEED": "1", "FAIRQ_JOB_ID": "12", "FAIRQ_ATTEMPT": "2",
                         "FAIRQ_STOP_SIGNAL": "SIGTERM"}


@pytest.mark.parametrize("name", ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK",
                                  "NPROC_PER_NODE", "FAIRQ_JOB_ID", "FAIRQ_ATTEMPT",
                                  "FAIRQ_STOP_SIGNAL", "FAIRQ_CHECKPOINT_URL",
                                  "FAIRQ_CHECKPOINT_TOKEN"])
def test_the_manifest_refuses_a_users_own_rendezvous_or_attempt_env(name: str) -> None:
    with pytest.raises(ManifestError, match="reserved"):
        job_manifests(spec(replicas=2, env={name: "x"}), OPTS)


def test_the_headless_service_selects_the_workloads_pods_and_is_owned_by_its_job() -> None:
    owner = {"metadata": {"name": "fq-12-1", "uid": "u-1", "namespace": "ns"}}
    svc = service_manifest(spec(replicas=2), "ns", owner=owner)
    assert svc["apiVersion"] == "v1" and svc["kind"] == "Service"
    assert svc["metadata"]["name"] == "fq-12-1" and svc["metadata"]["namespace"] == "ns"
    assert svc["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "fq-12-1", "uid": "u-1"}]
    assert svc["metadata"]["labels"]["fairq.io/workload"] == "fq-12-1"
    assert svc["spec"]["clusterIP"] == "None"  # headless: DNS names, no virtual IP
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"app.kubernetes.io/managed-by": "fairq",
                                       "fairq.io/workload": "fq-12-1"}
    assert svc["spec"]["ports"] == [{"name": "rendezvous", "port": 29500,
                                     "targetPort": 29500, "protocol": "TCP"}]
    assert "type" not in svc["spec"] and "externalIPs" not in svc["spec"]


def test_a_mig_type_asks_for_its_own_resource_and_no_deadline_when_unlimited() -> None:
    m = job_manifest(spec(resource_name="nvidia.com/mig-1g.10gb", node_labels={},
                          gpus_per_replica=1, max_runtime_seconds=None, placement=()), OPTS)
    pod = m["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert "nodeSelector" not in pod and "affinity" not in pod
    assert "activeDeadlineSeconds" not in m["spec"]


def test_the_manifest_is_deterministic() -> None:
    assert json.dumps(job_manifest(spec(), OPTS), sort_keys=True) == \
        json.dumps(job_manifest(spec(), OPTS), sort_keys=True)


@pytest.mark.parametrize("env", [{"BAD NAME": "x"}, {"1X": "x"}, {"A=B": "x"}, {"": "x"}])
def test_it_refuses_invalid_env_names(env: dict[str, str]) -> None:
    with pytest.raises(ManifestError):
        job_manifest(spec(env=env), OPTS)


def test_env_values_are_literal_never_value_from() -> None:
    m = job_manifest(spec(env={"TOKEN": '{"valueFrom": {"secretKeyRef": {"name": "x"}}}'}), OPTS)
    [c] = m["spec"]["template"]["spec"]["containers"]
    assert c["env"] == [{"name": "FAIRQ_ATTEMPT", "value": "1"},
                        {"name": "FAIRQ_JOB_ID", "value": "12"},
                        {"name": "FAIRQ_STOP_SIGNAL", "value": "SIGTERM"},
                        {"name": "TOKEN",
                         "value": '{"valueFrom": {"secretKeyRef": {"name": "x"}}}'}]


def test_names_and_namespaces() -> None:
    assert parse_workload_name("fq-12-3") == (12, 3)
    assert workload_name(12, 3) == "fq-12-3"
    assert parse_workload_name(workload_name(7, 1)) == (7, 1)
    assert parse_workload_name("fq-x-3") is None and parse_workload_name("other") is None
    assert parse_workload_name("fq-12-3\n") is None
    assert namespace_for("vision", "fairq-") == "fairq-vision"
    with pytest.raises(ManifestError):
        namespace_for("x" * 70, "fairq-")


def test_quota_and_priority_class_manifests() -> None:
    q = resource_quota_manifest("fairq-vision", {"nvidia.com/gpu": 16})
    assert q["spec"]["hard"] == {"requests.nvidia.com/gpu": "16"}
    pc = priority_class_manifest(name="fairq-high", value=2000, preemption_policy="Never",
                                 tier="high")
    assert pc["value"] == 2000 and pc["preemptionPolicy"] == "Never"
    assert pc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "fairq"


# --- hostile job bodies through the API --------------------------------------------------

HOSTILE_EXTRAS: dict[str, Any] = {
    "privileged": True, "hostPath": "/", "hostNetwork": True, "hostPID": True,
    "serviceAccountName": "cluster-admin", "securityContext": {"privileged": True},
    "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    "spec": {"hostNetwork": True}, "nodeName": "gpu-h100-0", "tolerations": [{"operator": "Exists"}],
    "initContainers": [{"name": "x", "image": "evil"}], "resources": {"limits": {"nvidia.com/gpu": "64"}},
    "envFrom": [{"secretRef": {"name": "db"}}], "priorityClassName": "system-cluster-critical",
}


@pytest.mark.django_db
def test_a_hostile_job_body_reaches_the_job_without_any_extra_field(world: Any) -> None:
    from queueing.models import Job
    from queueing.services.scheduler import launch_spec

    client = world.client(world.member)
    r = client.post("/api/v1/jobs/", job_body(**HOSTILE_EXTRAS), format="json")
    # The API refuses fields it does not know, each by name (queueing/api/strict.py) ...
    assert r.status_code == 400, r.content
    # (`resources` and `volumes` are job fields: their unknown keys are what is refused,
    # and the volume's missing mount path.)
    assert set(r.json()["error"]["fields"]) == set(HOSTILE_EXTRAS) - {"resources", "volumes"} | {
        "resources.limits", "volumes[0].hostPath", "volumes[0].mount_path"}
    assert not Job.objects.exists()
    # ... and the job's real fields alone make a manifest with nothing of them.
    r = client.post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201, r.content
    job = Job.objects.select_related("team", "tier", "gpu_type").get(pk=r.json()["id"])
    m = job_manifest(launch_spec(job), OPTS)
    assert not all_keys(m) & FORBIDDEN_KEYS, all_keys(m) & FORBIDDEN_KEYS
    pod = m["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == job.tier.priority_class_name
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    # The GPUs, and the memory every pod has (2 GPUs x FAIRQ_DEFAULT_MEMORY_PER_GPU).
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2",
                                                           "memory": "64Gi"}
    assert pod["containers"][0]["securityContext"] == {
        "privileged": False, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True}
    assert json.dumps(m).count('"privileged"') == 1
    assert "hostNetwork" not in json.dumps(m) and "cluster-admin" not in json.dumps(m)


@pytest.mark.django_db
@pytest.mark.parametrize("env", [{"BAD NAME": "1"}, {"LD_PRELOAD=x": "1"}, {"FAIRQ_TOKEN": "x"}])
def test_the_api_refuses_bad_env_names(world: Any, env: dict[str, str]) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(env=env), format="json")
    assert r.status_code == 400


# --- registry allow-list -----------------------------------------------------------------

@pytest.mark.parametrize(("image", "full"), [
    ("ubuntu", "docker.io/library/ubuntu"),
    ("ubuntu:22.04", "docker.io/library/ubuntu"),
    ("acme/train:1", "docker.io/acme/train"),
    ("ghcr.io/acme/train:1.4", "ghcr.io/acme/train"),
    ("registry.example.com:5000/team/x@sha256:" + "a" * 64, "registry.example.com:5000/team/x"),
    ("localhost/x", "localhost/x"),
])
def test_image_registry_path(image: str, full: str) -> None:
    assert image_registry_path(image) == full


@pytest.mark.parametrize(("image", "ok"), [
    ("ghcr.io/acme/train:1", True),
    ("ghcr.io/acme-evil/train:1", False),
    ("ghcr.io/acmex", False),
    ("registry.example.com/anything/here:2", True),
    ("ubuntu", False),
    ("evil.io/ghcr.io/acme/x", False),
])
def test_registry_allow_list(image: str, ok: bool) -> None:
    allow = ["ghcr.io/acme", "registry.example.com"]
    assert (registry_problem(image, allow) is None) is ok
    assert registry_problem(image, []) is None


@pytest.mark.django_db
def test_the_api_enforces_the_registry_allow_list(world: Any, settings: Any) -> None:
    settings.FAIRQ_REGISTRY_ALLOWLIST = ["registry.example.com/ml"]
    c = world.client(world.member)
    r = c.post("/api/v1/jobs/", job_body(image="ghcr.io/acme/train:1.4"), format="json")
    assert r.status_code == 400 and "allowed registry" in json.dumps(r.json())
    r = c.post("/api/v1/jobs/", job_body(image="registry.example.com/ml/train:2"), format="json")
    assert r.status_code == 201, r.content


# --- Job and pods → WorkloadStatus ------------------------------------------------------

def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def k8s_job(conditions: list[dict[str, str]] | None = None, **meta: Any) -> dict[str, Any]:
    m = job_manifest(spec(), OPTS)
    m["metadata"].update(meta)
    m["status"] = {"conditions": conditions or []}
    return m


def pod(phase: str, *, start: datetime | None = None, end: datetime | None = None,
        exit_code: int = 0, reason: str = "", waiting: str = "", node: str = "gpu-h100-0",
        created: datetime = T0, gpus: int = 2, deleting: bool = False) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": "pull access denied"}}
    elif end is not None:
        state = {"terminated": {"startedAt": iso(start or T0), "finishedAt": iso(end),
                                "exitCode": exit_code, "reason": reason}}
    elif start is not None:
        state = {"running": {"startedAt": iso(start)}}
    meta: dict[str, Any] = {"name": f"p-{phase}", "namespace": "ns", "uid": f"u-{phase}",
                            "creationTimestamp": iso(created)}
    if deleting:
        meta["deletionTimestamp"] = iso(T0)
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [
            {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase, "containerStatuses": [{"name": "main", "state": state}]},
    }


def test_a_job_with_no_pod_running_is_pending() -> None:
    s = workload_status(k8s_job(), [pod("Pending")], now=T0)
    assert s is not None and s.phase == Phase.PENDING
    assert (s.job_id, s.attempt, s.name) == (12, 1, "fq-12-1")


def test_running_from_the_pods_with_their_start_time() -> None:
    s = workload_status(k8s_job(), [pod("Running", start=T0 + timedelta(seconds=5))], now=T0)
    assert s is not None and s.phase == Phase.RUNNING
    assert s.started_at == T0 + timedelta(seconds=5) and s.nodes == ("gpu-h100-0",)


def test_succeeded_uses_the_pods_real_start_and_end() -> None:
    job = k8s_job([{"type": "Complete", "status": "True"}],)
    s = workload_status(job, [pod("Succeeded", start=T0, end=T0 + timedelta(seconds=42))],
                        now=T0 + timedelta(minutes=5))
    assert s is not None and s.phase == Phase.SUCCEEDED and s.exit_code == 0
    assert (s.finished_at - s.started_at) == timedelta(seconds=42)  # type: ignore[operator]


@pytest.mark.parametrize(("term_reason", "code", "expect"), [
    ("OOMKilled", 137, "OOMKilled"),
    ("Error", 3, "exit code 3 (Error)"),
])
def test_failed_has_a_readable_reason(term_reason: str, code: int, expect: str) -> None:
    job = k8s_job([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}])
    s = workload_status(job, [pod("Failed", start=T0, end=T0 + timedelta(seconds=1),
                                  exit_code=code, reason=term_reason)], now=T0)
    assert s is not None and s.phase == Phase.FAILED and s.exit_code == code
    assert expect in s.reason


def test_deadline_exceeded_is_named() -> None:
    job = k8s_job([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                    "lastTransitionTime": iso(T0)}])
    s = workload_status(job, [], now=T0)
    assert s is not None and s.phase == Phase.FAILED and s.reason.startswith("DeadlineExceeded")


def test_an_image_pull_error_fails_only_after_the_timeout() -> None:
    p = pod("Pending", waiting="ImagePullBackOff", created=T0)
    early = workload_status(k8s_job(), [p], now=T0 + timedelta(seconds=10),
                            image_pull_timeout_seconds=60)
    late = workload_status(k8s_job(), [p], now=T0 + timedelta(seconds=61),
                           image_pull_timeout_seconds=60)
    assert early is not None and early.phase == Phase.PENDING
    assert late is not None and late.phase == Phase.FAILED
    assert "ImagePullBackOff" in late.reason


def test_a_job_without_any_pod_past_the_create_timeout_fails_with_the_controllers_message() -> None:
    job = k8s_job(creationTimestamp=iso(T0))
    early = workload_status(job, [], now=T0 + timedelta(seconds=5), pod_create_timeout_seconds=60)
    late = workload_status(job, [], now=T0 + timedelta(seconds=60), pod_create_timeout_seconds=60,
                           create_error="Error creating: exceeded quota")
    assert early is not None and early.phase == Phase.PENDING
    assert late is not None and late.phase == Phase.FAILED
    assert late.reason == "no pod could be created in 60 s: Error creating: exceeded quota"
    with_pod = workload_status(job, [pod("Pending")], now=T0 + timedelta(hours=1),
                               pod_create_timeout_seconds=60)
    assert with_pod is not None and with_pod.phase == Phase.PENDING


def test_a_job_without_any_pod_and_no_refusal_only_waits_however_long() -> None:
    """A slow Job controller is not a refusal."""
    job = k8s_job(creationTimestamp=iso(T0))
    late = workload_status(job, [], now=T0 + timedelta(hours=1), pod_create_timeout_seconds=60)
    assert late is not None and late.phase == Phase.PENDING
    assert late.reason.startswith("waiting for the cluster: no pod created in 60 s")
    retrying = workload_status(job, [], now=T0 + timedelta(seconds=5),
                               pod_create_timeout_seconds=60, create_error="exceeded quota")
    assert retrying is not None and retrying.phase == Phase.PENDING
    assert retrying.reason == ("waiting for the cluster: the Job controller cannot create "
                               "pods yet: exceeded quota")


def test_pods_that_all_ended_are_finished_before_the_jobs_condition() -> None:
    done = pod("Succeeded", start=T0, end=T0 + timedelta(seconds=5))
    assert pods_finished([done]) == T0 + timedelta(seconds=5)
    assert pods_finished([done, pod("Running", start=T0)]) is None
    assert pods_finished([]) is None


def replica_pod(i: int, phase: str, **kw: Any) -> dict[str, Any]:
    p = pod(phase, **kw)
    p["metadata"]["name"] = f"fq-12-1-{i}-x"
    p["metadata"]["uid"] = f"u-{i}"
    p["metadata"]["labels"] = {"fairq.io/workload": "fq-12-1", "fairq.io/replica": str(i)}
    return p


def rendezvous_job(conditions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    m = job_manifests(spec(replicas=2), OPTS)[0]
    m["status"] = {"conditions": conditions or []}
    return m


def test_a_failed_replica_fails_the_whole_attempt_with_a_reason_naming_it() -> None:
    # Replica 1's pod failed; replica 0 still runs and its Job has no condition.
    pods = [replica_pod(0, "Running", start=T0),
            replica_pod(1, "Failed", start=T0, end=T0 + timedelta(seconds=9), exit_code=3,
                        reason="Error")]
    s = workload_status(rendezvous_job(), pods, now=T0 + timedelta(seconds=10))
    assert s is not None and s.phase == Phase.FAILED and s.exit_code == 3
    assert s.reason == "replica 1 failed: exit code 3 (Error)"
    # Still running: stop() deletes it (and the other replicas) rather than forget it.
    assert workload_finished(rendezvous_job(), pods) is None


def test_replica_0_finishing_alone_does_not_finish_a_multi_replica_attempt() -> None:
    done = replica_pod(0, "Succeeded", start=T0, end=T0 + timedelta(seconds=5))
    running = replica_pod(1, "Running", start=T0)
    job = rendezvous_job([{"type": "Complete", "status": "True"}])
    s = workload_status(job, [done, running], now=T0 + timedelta(seconds=6))
    assert s is not None and s.phase == Phase.RUNNING
    assert workload_finished(job, [done, running]) is None
    other = replica_pod(1, "Succeeded", start=T0, end=T0 + timedelta(seconds=7))
    s = workload_status(job, [done, other], now=T0 + timedelta(seconds=8))
    assert s is not None and s.phase == Phase.SUCCEEDED
    assert s.finished_at == T0 + timedelta(seconds=7)
    assert workload_finished(job, [done, other]) == T0 + timedelta(seconds=7)


def test_a_multi_replica_attempt_past_its_deadline_fails() -> None:
    job = rendezvous_job([{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}])
    s = workload_status(job, [replica_pod(0, "Running", start=T0),
                              replica_pod(1, "Running", start=T0)], now=T0)
    assert s is not None and s.phase == Phase.FAILED
    assert s.reason.startswith("DeadlineExceeded")


def test_unbound_replicas_of_a_multi_replica_workload_hold_their_planned_nodes() -> None:
    job = job_manifests(spec(replicas=2, placement=("a", "b")), OPTS)[0]
    assert unbound_demand(job, []) == {"a": 2, "b": 2}
    bound = replica_pod(0, "Running", start=T0, node="a")
    assert unbound_demand(job, [bound]) == {"b": 2}


def test_pods_without_their_job_end_the_attempt() -> None:
    labelled = k8s_job()["spec"]["template"]["metadata"]
    running = pod("Running", start=T0)
    running["metadata"].update(labelled)
    now = T0 + timedelta(seconds=30)
    s = orphan_pods_status("fq-12-1", [running], now=now)
    assert s is not None and (s.job_id, s.attempt, s.phase) == (12, 1, Phase.FAILED)
    assert (s.started_at, s.finished_at) == (T0, now)
    assert "deleted outside fairq" in s.reason
    never = pod("Pending")
    never["metadata"].update(labelled)
    assert orphan_pods_status("fq-12-1", [never], now=now) is None


def test_a_job_without_fairq_identity_is_ignored() -> None:
    job = {"metadata": {"name": "someone-else", "labels": {}}, "spec": {}, "status": {}}
    assert workload_status(job, [], now=T0) is None


# --- capacity ----------------------------------------------------------------------------

H100 = GpuTypeRef("h100", "nvidia.com/gpu", {"fairq.io/gpu-type": "h100"})
ANY_GPU = GpuTypeRef("a100", "nvidia.com/gpu", {})
MIG = GpuTypeRef("mig-1g-10gb", "nvidia.com/mig-1g.10gb", {})


def node(name: str, labels: dict[str, str], alloc: dict[str, str], *, ready: str = "True",
         unschedulable: bool = False, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"unschedulable": unschedulable, "taints": taints or []},
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": ready}]}}


def test_capacity_matches_gpu_types_and_counts_pods_including_terminating() -> None:
    nodes = [
        node("h0", {"fairq.io/gpu-type": "h100"}, {"nvidia.com/gpu": "8"},
             taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        node("a0", {"fairq.io/gpu-type": "a100"}, {"nvidia.com/gpu": "8"}),
        node("m0", {}, {"nvidia.com/mig-1g.10gb": "7"}),
        node("cpu", {}, {"cpu": "64"}),
        node("down", {"fairq.io/gpu-type": "h100"}, {"nvidia.com/gpu": "8"}, ready="False"),
        node("cordoned", {"fairq.io/gpu-type": "h100"}, {"nvidia.com/gpu": "8"},
             unschedulable=True),
        node("tainted", {"fairq.io/gpu-type": "h100"}, {"nvidia.com/gpu": "8"},
             taints=[{"key": "maintenance", "effect": "NoSchedule"}]),
    ]
    pods = [pod("Running", node="h0", gpus=2), pod("Running", node="h0", gpus=1, deleting=True),
            pod("Succeeded", node="h0", gpus=4), pod("Pending", node="a0", gpus=3)]
    got = {n.name: n for n in capacity(nodes, pods, [H100, ANY_GPU, MIG])}
    assert set(got) == {"h0", "a0", "m0"}
    assert (got["h0"].gpu_type, got["h0"].capacity, got["h0"].allocated) == ("h100", 8, 3)
    assert (got["a0"].gpu_type, got["a0"].allocated) == ("a100", 3)
    assert (got["m0"].gpu_type, got["m0"].capacity) == ("mig-1g-10gb", 7)


def test_unbound_replicas_hold_their_planned_nodes() -> None:
    job = job_manifest(spec(replicas=3, placement=("h0", "h0", "h1")), OPTS)
    job["status"] = {}
    bound = [pod("Running", node="h0")]
    assert unbound_demand(job, bound) == {"h0": 2, "h1": 2}
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert unbound_demand(job, bound) == {}


# --- the informer: list, watch from the version, relist after 410 and errors --------------

class _Resp:
    def __init__(self, body: Any = None, lines: list[dict[str, Any]] | None = None) -> None:
        self.data = json.dumps(body).encode() if body is not None else b""
        self._lines = lines or []

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        for line in self._lines:
            yield (json.dumps(line) + "\n").encode()

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


def _obj(name: str, rv: str, phase: str = "Pending") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
            "status": {"phase": phase}}


def test_the_informer_lists_watches_from_the_version_and_relists_after_gone_and_errors() -> None:
    from queueing.backends.k8s_cache import Informer

    calls: list[dict[str, Any]] = []
    lists = iter([
        _Resp({"metadata": {"resourceVersion": "10"}, "items": [_obj("a", "9"), _obj("b", "9")]}),
        _Resp({"metadata": {"resourceVersion": "30"}, "items": [_obj("a", "25", "Running")]}),
        _Resp({"metadata": {"resourceVersion": "40"}, "items": [_obj("c", "40")]}),
    ])
    watches = iter([
        [{"type": "MODIFIED", "object": _obj("a", "11", "Running")},
         {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}}],
        [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}],
        "boom",
    ])
    done = threading.Event()

    def list_func(**kw: Any) -> Any:
        calls.append(kw)
        if kw.get("watch"):
            nxt = next(watches, None)
            if nxt == "boom":
                raise ConnectionError("apiserver went away")
            if nxt is None:
                done.set()
                time.sleep(0.05)
                return _Resp(lines=[])
            return _Resp(lines=nxt)  # type: ignore[arg-type]
        return next(lists)

    changes: list[tuple[str, str]] = []
    inf = Informer("t", list_func, label_selector="x=y", resync_seconds=3600,
                   on_change=lambda k, o, n: changes.append((k, ((n or o) or {})["metadata"]["name"])))
    inf.start()
    assert done.wait(10)
    inf.stop()
    watch_calls = [c for c in calls if c.get("watch")]
    assert watch_calls[0]["resource_version"] == "10"
    assert watch_calls[1]["resource_version"] == "12"  # the bookmark moved it on
    assert watch_calls[2]["resource_version"] == "30"  # relisted after 410 Gone
    assert all(c["label_selector"] == "x=y" for c in calls)
    assert inf.relists == 3 and inf.errors == 1  # the error relisted too, after a pause
    assert {o["metadata"]["name"] for o in inf.items()} == {"c"}
    assert ("DELETED", "b") in changes and ("MODIFIED", "a") in changes
    assert ("ADDED", "c") in changes and ("DELETED", "a") in changes


@pytest.mark.django_db
def test_sync_cluster_refuses_to_run_without_the_kubernetes_backend() -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="not 'kubernetes' and no enabled Cluster row is"):
        call_command("sync_cluster")


@pytest.mark.django_db
@pytest.mark.parametrize(("backend", "expected"), [("simulated", []),
                                                   ("kubernetes", ["sync", "sync"])])
def test_a_tier_or_quota_change_queues_a_sync_only_with_the_kubernetes_backend(
    world: Any, monkeypatch: pytest.MonkeyPatch, settings: Any,
    django_capture_on_commit_callbacks: Any, backend: str, expected: list[str],
) -> None:
    from queueing import tasks

    settings.FAIRQ_CLUSTER_BACKEND = backend
    sent: list[str] = []
    monkeypatch.setattr(tasks.sync_cluster_task, "delay", lambda: sent.append("sync"))
    with django_capture_on_commit_callbacks(execute=True):  # the sync is sent on commit
        world.low.priority_value = 1
        world.low.save()
    with django_capture_on_commit_callbacks(execute=True):
        world.vision.quotas.first().delete()
    assert sent == expected


def test_a_forked_backend_starts_over_with_its_own_pool_and_informers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from kubernetes import client

    from queueing.backends.kubernetes import KubernetesBackend

    backend = KubernetesBackend(client.ApiClient(client.Configuration()))
    api, jobs = backend.api, backend.jobs
    backend._started = True  # as if the parent had started its watches
    monkeypatch.setattr(os, "getpid", lambda: -1)
    backend._after_fork()
    assert backend.api is not api and backend.jobs is not jobs
    assert backend._started is False


def test_jobs_of_another_fairq_on_the_same_cluster_are_not_ours() -> None:
    from kubernetes import client

    from queueing.backends.k8s_manifest import sign_job
    from queueing.backends.kubernetes import KubernetesBackend

    backend = KubernetesBackend(client.ApiClient(client.Configuration()),
                                namespace_prefix="fairq-")
    theirs = job_manifest(spec(), ManifestOptions(namespace="staging-vision"))
    mine = sign_job(job_manifest(spec(name="fq-13-1", job_id=13), OPTS), backend.owner_key)
    for j in (theirs, mine):
        j["metadata"]["resourceVersion"] = "1"
        backend.jobs._store[f"{j['metadata']['namespace']}/{j['metadata']['name']}"] = j
        backend._job_changed("ADDED", None, j)
    for informer in backend._informers:
        informer.synced.set()
    backend._started = True
    backend._probe_ok_at = time.monotonic()  # its API server answered just now (rule K5)
    assert [s.name for s in backend.statuses(now=T0)] == ["fq-13-1"]
    assert backend._namespace_of("fq-12-1") is None
    assert backend._namespace_of("fq-13-1") == "fairq-vision"


def test_a_job_deleted_before_fairq_saw_its_end_is_still_reported() -> None:
    from kubernetes import client

    from queueing.backends.k8s_manifest import sign_job
    from queueing.backends.kubernetes import KubernetesBackend

    backend = KubernetesBackend(client.ApiClient(client.Configuration()))
    for informer in backend._informers:
        informer.synced.set()
    backend._started = True
    backend._probe_ok_at = time.monotonic()  # its API server answered just now (rule K5)
    done = sign_job(k8s_job([{"type": "Complete", "status": "True"}]), backend.owner_key)
    p = pod("Succeeded", start=T0, end=T0 + timedelta(seconds=5))
    p["metadata"]["labels"] = {"fairq.io/workload": "fq-12-1"}
    p["metadata"]["namespace"] = "fairq-vision"
    backend.pods._store["fairq-vision/p"] = p
    backend._pod_changed("ADDED", None, p)  # as its informer does
    backend._job_changed("DELETED", done, None)  # the TTL controller was quicker
    [s] = backend.statuses(now=T0)
    assert (s.name, s.phase, s.finished_at) == ("fq-12-1", Phase.SUCCEEDED,
                                                T0 + timedelta(seconds=5))
    never_ran = k8s_job()
    never_ran["metadata"]["name"] = "fq-14-1"
    never_ran["metadata"]["labels"]["fairq.io/job-id"] = "14"
    backend._job_changed("DELETED", sign_job(never_ran, backend.owner_key), None)
    assert [s.name for s in backend.statuses(now=T0)] == ["fq-12-1"]


def test_kicks_are_throttled_to_one_a_second_but_the_last_one_is_never_dropped() -> None:
    import itertools

    from queueing.composition import KickThrottle

    now = [0.0]

    class Cache:  # shared by the processes: key → (value, when it expires)
        keys: dict[str, tuple[float, float]] = {}
        calls: list[str] = []  # every round trip

        def add(self, key: str, value: float, timeout: int) -> bool:
            self.calls.append("add")
            if self._live(key) is not None:
                return False
            self.keys[key] = (value, now[0] + timeout)
            return True

        def get(self, key: str) -> float | None:
            self.calls.append("get")
            return self._live(key)

        def _live(self, key: str) -> float | None:
            value, until = self.keys.get(key, (0.0, -1.0))
            return value if until > now[0] else None

        def set(self, key: str, value: float, timeout: int) -> None:
            self.calls.append("set")
            self.keys[key] = (value, now[0] + timeout)

    sent: list[tuple[float, float]] = []  # (when, countdown)

    def process() -> KickThrottle:  # each process has its own memory
        return KickThrottle(lambda countdown: sent.append((now[0], countdown)),
                            cache=Cache(), clock=lambda: now[0])

    kick = process()
    for _ in range(10):
        kick()
        now[0] += 0.05
    due = [at + countdown for at, countdown in sent]
    assert sent[0] == (0.0, 0.0) and due[1:] == [pytest.approx(1.0)]  # at once; at the window's end
    last_kick = now[0] - 0.05
    assert due[1] > last_kick  # ... due after the last kick of the burst
    process()()  # another process within the second: the shared keys hold it back
    assert len(sent) == 2
    other, ops = process(), len(Cache.calls)
    for _ in range(5):  # ... and it stops asking the cache until that request is due
        other()
    assert len(sent) == 2 and len(Cache.calls) - ops == 3
    now[0] = 1.5  # after the trailing request ran: a kick waits a second after it
    process()()
    assert sent[2][0] == 1.5 and sent[2][0] + sent[2][1] == pytest.approx(2.0)
    due = [at + countdown for at, countdown in sent]
    assert all(b - a >= 1.0 - 1e-9 for a, b in itertools.pairwise(due))  # one a second
    now[0] = 10.0
    kick()
    assert sent[3] == (10.0, 0.0)  # a quiet second later: at once


def test_kick_sends_nothing_while_fairq_kick_scheduler_is_off(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queueing import composition

    sent: list[float] = []
    monkeypatch.setattr(composition, "_throttle", lambda: sent.append(1.0))
    settings.FAIRQ_KICK_SCHEDULER = False
    composition.kick()
    assert sent == []
    settings.FAIRQ_KICK_SCHEDULER = True
    composition.kick()
    assert sent == [1.0]


def test_logs_of_a_gang_have_a_header_per_pod_and_a_readable_line_for_a_pod_without_logs() -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from queueing.backends import kubernetes as k8s

    backend = k8s.KubernetesBackend(client.ApiClient(client.Configuration()))

    class Core:
        def list_pod_for_all_namespaces(self, **kw: Any) -> Any:
            assert kw["label_selector"] == "fairq.io/workload=fq-12-1"
            return _Resp({"items": [{"metadata": {"name": n, "namespace": "fairq-vision"}}
                                    for n in ("fq-12-1-b", "fq-12-1-a")]})

        def read_namespaced_pod_log(self, name: str, namespace: str, **kw: Any) -> str:
            assert kw["container"] == "main" and kw["tail_lines"] == 2
            if name.endswith("b"):
                raise ApiException(status=400, reason="Bad Request")
            return "one\ntwo\n"

    backend.core = Core()  # type: ignore[assignment]
    text = backend.logs("fq-12-1", tail=2)
    assert text.splitlines() == [
        "==> fq-12-1-a <==", "one", "two",
        "==> fq-12-1-b <==", "[fairq] no logs from pod fq-12-1-b (400): Bad Request",
    ]


def _replica_pod(replica: int, node: str, *, created: datetime = T0) -> dict[str, Any]:
    p = pod("Running", start=T0, node=node, created=created)
    p["metadata"]["labels"] = {"fairq.io/replica": str(replica)}
    return p


def test_replica_nodes_name_a_shared_node_once_per_replica() -> None:
    """Two replicas on one node hold its GPUs twice: `nodes` (what the scheduler keeps as
    the job's placement, rules A3/R4) names the node for each, in replica order; an
    unbound replica is left out, and a replica's newest pod counts."""
    pods = [_replica_pod(1, "gpu-a"), _replica_pod(0, "gpu-a")]
    assert replica_nodes(pods) == ("gpu-a", "gpu-a")
    assert replica_nodes([*pods, _replica_pod(2, "gpu-b")]) == ("gpu-a", "gpu-a", "gpu-b")
    unbound = _replica_pod(1, "gpu-b")
    unbound["spec"].pop("nodeName")
    assert replica_nodes([_replica_pod(0, "gpu-a"), unbound]) == ("gpu-a",)
    retried = [pod("Failed", node="gpu-old", created=T0),
               pod("Running", node="gpu-new", created=T0 + timedelta(seconds=30))]
    assert replica_nodes(retried) == ("gpu-new",)


# --- rule K5: the API server itself is asked (the watch caches answer from memory) ---------


class _VersionServer:
    """An HTTP server on 127.0.0.1 answering GET /version with `status`."""

    def __init__(self, status: int) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        answer = status

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b'{"major": "1", "minor": "30"}'
                self.send_response(answer)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _backend_at(host: str) -> Any:
    from kubernetes import client

    from queueing.backends.kubernetes import KubernetesBackend

    config = client.Configuration()
    config.host = host
    return KubernetesBackend(client.ApiClient(config), namespace_prefix="fairq-")


@pytest.mark.parametrize("status", [200, 403])
def test_k5_an_api_server_that_answers_is_reachable_whatever_it_answers(status: int) -> None:
    server = _VersionServer(status)
    try:
        backend = _backend_at(server.url)
        backend.check_reachable()
        assert backend._probe_ok_at is not None
    finally:
        server.close()


def test_k5_an_api_server_that_does_not_answer_is_unreachable_at_once() -> None:
    import socket

    from queueing.backends.k8s_api import KubernetesBackendError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = _backend_at(f"http://127.0.0.1:{port}")
    backend.probe_timeout_seconds = 1.0
    started = time.monotonic()
    with pytest.raises(KubernetesBackendError, match="does not answer"):
        backend.check_reachable()
    assert time.monotonic() - started < 3.0, "no client retries"
    with pytest.raises(KubernetesBackendError):  # and again, until a probe succeeds
        backend.check_reachable()
