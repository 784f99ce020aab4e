"""The fake kubelet's exec mode (tests/envtest/README.md, "Exec mode"): a pod's program
runs as a local process with the pod's env and its PVC mapped to a directory; deleting
the pod sends it FAIRQ_STOP_SIGNAL, waits for it within the deletion's grace (SIGKILL
after), and the pod goes once it has exited, its output kept. No Django, no fairq."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.envtest.cluster import envtest_required

try:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
except ImportError:
    if envtest_required():
        raise
    pytest.skip("the 'kubernetes' Python package is not installed", allow_module_level=True)

pytestmark = pytest.mark.k8s

PROGRAM = """
import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
print("started; writing to", sys.argv[1], flush=True)
while not got:
    time.sleep(0.05)
with open(os.path.join(sys.argv[1], "saved"), "w") as f:
    f.write(os.environ["MARK"])
print("got SIGUSR1; saved", flush=True)
sys.exit(int(os.environ.get("CODE", "0")))
"""


def wait_until(predicate: Callable[[], Any], *, timeout: float = 30.0, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def _pod(name: str, *, program: str, code: str = "0", grace: int = 10) -> Any:
    env = [client.V1EnvVar(name=k, value=v) for k, v in (
        ("FAIRQ_SIM_EXEC", "1"), ("FAIRQ_STOP_SIGNAL", "SIGUSR1"), ("MARK", name),
        ("CODE", code))]
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name="gpu-a100-0", restart_policy="Never",
            termination_grace_period_seconds=grace,
            volumes=[client.V1Volume(name="ckpt", persistent_volume_claim=client.
                                     V1PersistentVolumeClaimVolumeSource(claim_name="ckpt"))],
            containers=[client.V1Container(
                name="main", image="registry.invalid/fairq/exec:1", env=env,
                command=[Path(sys.executable).name, "-c", program], args=["/ckpt/run"],
                volume_mounts=[client.V1VolumeMount(name="ckpt", mount_path="/ckpt")])]))


def _gone(core: Any, namespace: str, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as exc:
        return exc.status == 404
    return False


def test_a_deleted_exec_pod_gets_its_stop_signal_saves_and_goes_when_it_exits(
    k8s_control_plane: Any, k8s_api_client: Any, k8s_namespace: str, tmp_path: Path,
) -> None:
    kubelet = k8s_control_plane.kubelet
    (tmp_path / "run").mkdir()
    kubelet.exec_claims["ckpt"] = str(tmp_path)
    core = client.CoreV1Api(k8s_api_client)
    core.create_namespaced_pod(k8s_namespace, _pod("saver", program=PROGRAM, code="3"))
    wait_until(lambda: "started" in (kubelet.pod_log(k8s_namespace, "saver") or ""),
               what="the program started")
    assert core.read_namespaced_pod("saver", k8s_namespace).status.phase == "Running"
    assert f"writing to {tmp_path}/run" in kubelet.pod_log(k8s_namespace, "saver")
    core.delete_namespaced_pod("saver", k8s_namespace)  # the pod's own grace: 10 s
    wait_until(lambda: _gone(core, k8s_namespace, "saver"), timeout=10, what="the pod gone")
    assert (tmp_path / "run" / "saved").read_text() == "saver"
    assert "got SIGUSR1; saved" in kubelet.pod_log(k8s_namespace, "saver")


def test_a_program_that_ignores_its_signal_is_killed_at_the_end_of_the_grace(
    k8s_control_plane: Any, k8s_api_client: Any, k8s_namespace: str, tmp_path: Path,
) -> None:
    kubelet = k8s_control_plane.kubelet
    kubelet.exec_claims["ckpt"] = str(tmp_path)
    stubborn = "import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); " \
               "print('up', flush=True); time.sleep(600)"
    core = client.CoreV1Api(k8s_api_client)
    core.create_namespaced_pod(k8s_namespace, _pod("stubborn", program=stubborn, grace=2))
    wait_until(lambda: "up" in (kubelet.pod_log(k8s_namespace, "stubborn") or ""),
               what="the program started")
    started = time.monotonic()
    core.delete_namespaced_pod("stubborn", k8s_namespace)
    wait_until(lambda: _gone(core, k8s_namespace, "stubborn"), timeout=15, what="the pod gone")
    assert time.monotonic() - started >= 1.5  # held for its grace, then killed
