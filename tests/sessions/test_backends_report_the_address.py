"""Backends report, services decide (docs/sessions.md, "The pod"): the Kubernetes
backend's workload status carries replica 0's running pod IP; the token reaches the pod
as JUPYTER_TOKEN and never in the spec's repr; the sanitizer keeps only an address."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from queueing.backends.base import LaunchSpec, Phase, WorkloadStatus, workload_env
from queueing.backends.k8s_manifest import replica0_address
from queueing.sanitize import clean_status


def pod(ip: str, *, replica: str = "0", phase: str = "Running",
        created: str = "2026-12-07T01:00:00Z", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": {"fairq.io/replica": replica}, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T01:05:00Z"
    return {"metadata": meta, "status": {"phase": phase, "podIP": ip}}


def test_replica0_address_is_the_newest_running_pod_of_replica_0() -> None:
    assert replica0_address([]) == ""
    assert replica0_address([pod("10.0.3.7")]) == "10.0.3.7"
    assert replica0_address([pod("10.0.3.7"), pod("10.0.3.9", created="2026-12-07T01:02:00Z")]) \
        == "10.0.3.9"
    assert replica0_address([pod("10.0.3.8", replica="1")]) == ""
    assert replica0_address([pod("10.0.3.7", phase="Pending")]) == ""
    assert replica0_address([pod("10.0.3.7", deleting=True)]) == ""


def spec(**over: Any) -> LaunchSpec:
    base: dict[str, Any] = {
        "name": "fq-9-1", "job_id": 9, "attempt": 1, "team": "vision", "tier": "interactive",
        "priority_class_name": "fairq-interactive", "gpu_type": "a100",
        "resource_name": "nvidia.com/gpu", "node_labels": {}, "gpus_per_replica": 1,
        "replicas": 1, "image": "quay.io/jupyter/base-notebook",
        "command": ["jupyter", "lab"], "args": [], "env": {}, "max_runtime_seconds": 3600}
    base.update(over)
    return LaunchSpec(**base)


def test_the_token_reaches_the_pod_env_only() -> None:
    s = spec(notebook_prefix="/sessions/9/lab/", notebook_token="t0k3n" * 8)
    env = workload_env(s, replica=0, master_addr="")
    assert env["JUPYTER_TOKEN"] == "t0k3n" * 8
    assert "t0k3n" not in repr(s)
    assert "JUPYTER_TOKEN" not in workload_env(spec(), replica=0, master_addr="")


def test_the_sanitizer_keeps_an_address_and_a_port_only() -> None:
    at = datetime(2026, 12, 7, tzinfo=UTC)
    ok = clean_status(WorkloadStatus("fq-9-1", 9, 1, Phase.RUNNING, started_at=at,
                                     address="fd00::7", port=40123))
    assert ok is not None and (ok.address, ok.port) == ("fd00::7", 40123)
    bad = clean_status(WorkloadStatus("fq-9-1", 9, 1, Phase.RUNNING, started_at=at,
                                      address="evil.example/@x", port=70000))
    assert bad is not None and (bad.address, bad.port) == ("", None)
