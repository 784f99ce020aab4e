"""The graceful stop's pod spec against a real API server (docs/kubernetes.md, "Graceful
stop"): a job stopped with another signal than SIGTERM gets a preStop exec hook that the
server keeps as rendered, beside its grace and FAIRQ_STOP_SIGNAL; a SIGTERM job gets no
hook (server-side dry run, Kubernetes 1.20)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.envtest.cluster import envtest_required

if envtest_required():
    from kubernetes import client
else:
    client = pytest.importorskip("kubernetes.client")

pytestmark = [pytest.mark.k8s]


def _spec(**overrides: Any) -> Any:
    from queueing.backends.base import LaunchSpec

    values: dict[str, Any] = {
        "name": "fq-40-2", "job_id": 40, "attempt": 2, "team": "vision", "tier": "low",
        "priority_class_name": "fairq-low", "gpu_type": "h100",
        "resource_name": "nvidia.com/gpu", "node_labels": {"fairq.io/gpu-type": "h100"},
        "gpus_per_replica": 8, "replicas": 1, "image": "ghcr.io/acme/train:1",
        "command": ["python", "train.py"], "args": ["--checkpoints", "/ckpt/run"],
        "env": {}, "max_runtime_seconds": 3600,
        "volumes": ({"name": "ckpt", "pvc": "vision-checkpoints", "mount_path": "/ckpt"},),
        "termination_grace_seconds": 10,
        "checkpoint_url": "https://fairq.example/api/v1/jobs/40/checkpoints/",
        "checkpoint_token": "fqc.dry-run-token",
    }
    values.update(overrides)
    return LaunchSpec(**values)


def _dry_run(api: Any, namespace: str, spec: Any) -> Any:
    from queueing.backends.k8s_manifest import ManifestOptions, job_manifest

    body = job_manifest(spec, ManifestOptions(namespace=namespace))
    stored = client.BatchV1Api(api).create_namespaced_job(namespace, body, dry_run="All")
    return body["spec"]["template"]["spec"], stored.spec.template.spec


def test_a_sigusr1_job_keeps_its_prestop_hook_grace_and_env_as_rendered(
        k8s_api_client: Any, k8s_namespace: str) -> None:
    rendered, pod = _dry_run(k8s_api_client, k8s_namespace, _spec(stop_signal="SIGUSR1"))
    [container] = pod.containers
    hook = container.lifecycle.pre_stop
    assert hook._exec.command == rendered["containers"][0]["lifecycle"]["preStop"]["exec"][
        "command"]
    assert hook._exec.command[:2] == ["/bin/sh", "-c"]
    assert hook._exec.command[2].startswith("S=USR1; G=10; T=")
    assert pod.termination_grace_period_seconds == 10
    env = {e.name: e.value for e in container.env}
    assert env["FAIRQ_STOP_SIGNAL"] == "SIGUSR1"
    assert env["FAIRQ_CHECKPOINT_URL"] == "https://fairq.example/api/v1/jobs/40/checkpoints/"
    assert env["FAIRQ_CHECKPOINT_TOKEN"] == "fqc.dry-run-token"
    assert (env["FAIRQ_JOB_ID"], env["FAIRQ_ATTEMPT"]) == ("40", "2")


def test_a_sigterm_job_has_no_hook(k8s_api_client: Any, k8s_namespace: str) -> None:
    _, pod = _dry_run(k8s_api_client, k8s_namespace,
                      _spec(stop_signal="SIGTERM", checkpoint_url="", checkpoint_token=""))
    [container] = pod.containers
    assert container.lifecycle is None
    env = {e.name: e.value for e in container.env}
    assert env["FAIRQ_STOP_SIGNAL"] == "SIGTERM" and "FAIRQ_CHECKPOINT_TOKEN" not in env
