"""Shared GPUs on the backends (docs/kubernetes.md, "Shared GPUs"): a pod asks its GPU
type's resource in the type's units - a fraction's slices, whole GPUs of a time-sliced
type times its slices per GPU, a MIG profile's instances - carries the planned GPU
index, and an MPS pod gets its share of the GPU's threads; the simulated cluster counts
a time-sliced type's nodes in slices."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from queueing.backends.k8s_manifest import (
    A_GPU_SLICES,
    A_GPU_SLOTS,
    A_GPUS_PER_REPLICA,
    ManifestError,
    ManifestOptions,
    job_manifest,
    job_manifests,
)
from queueing.backends.simulated import SimulatedCluster, SimulatedClusterError
from tests.test_k8s_manifest import spec

OPTS = ManifestOptions(namespace="fairq-vision")
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _ts(**overrides: Any) -> Any:
    values: dict[str, Any] = {
        "gpu_type": "ts-a10", "resource_name": "nvidia.com/gpu.shared", "gpus_per_replica": 1,
        "units_per_replica": 2, "gpu_slices": 2, "gpu_slots": (1,), "sharing": "time-sliced",
        "slices_per_gpu": 4}
    values.update(overrides)
    return spec(**values)


def _container(m: dict[str, Any]) -> dict[str, Any]:
    return dict(m["spec"]["template"]["spec"]["containers"][0])


def _env(m: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in _container(m)["env"]}


def test_a_half_gpu_asks_two_slices_and_says_its_gpu() -> None:
    m = job_manifest(_ts(), OPTS)
    res = _container(m)["resources"]
    assert res["limits"]["nvidia.com/gpu.shared"] == "2"
    assert res["requests"]["nvidia.com/gpu.shared"] == "2"
    pod_annotations = m["spec"]["template"]["metadata"]["annotations"]
    assert pod_annotations[A_GPU_SLOTS] == "1"
    assert pod_annotations[A_GPU_SLICES] == "2/4"
    assert pod_annotations[A_GPUS_PER_REPLICA] == "2"  # in slices, as nodes count them
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in _env(m)


def test_whole_gpus_of_a_time_sliced_type_ask_all_their_slices() -> None:
    m = job_manifest(_ts(gpus_per_replica=2, units_per_replica=8, gpu_slices=0,
                         gpu_slots=()), OPTS)
    assert _container(m)["resources"]["limits"]["nvidia.com/gpu.shared"] == "8"
    assert A_GPU_SLOTS not in m["spec"]["template"]["metadata"]["annotations"]


def test_each_replica_of_a_fraction_gang_says_its_own_gpu() -> None:
    ms = job_manifests(_ts(replicas=2, placement=("n1", "n2"), gpu_slots=(0, 1)), OPTS)
    slots = [m["spec"]["template"]["metadata"]["annotations"][A_GPU_SLOTS] for m in ms]
    assert slots == ["0", "1"]


def test_a_mig_job_asks_its_profile_resource() -> None:
    m = job_manifest(spec(gpu_type="mig-1g-10gb", resource_name="nvidia.com/mig-1g.10gb",
                          gpus_per_replica=2, sharing="mig", slices_per_gpu=7), OPTS)
    limits = _container(m)["resources"]["limits"]
    assert limits["nvidia.com/mig-1g.10gb"] == "2"
    assert "nvidia.com/gpu" not in limits


def test_an_mps_fraction_gets_its_share_of_the_threads_and_no_host_path_by_default() -> None:
    m = job_manifest(_ts(sharing="mps", resource_name="nvidia.com/gpu", units_per_replica=1,
                         gpu_slices=1), OPTS)
    env = _env(m)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env  # the device plugin sets it on Allocate
    assert not any("hostPath" in v for v in m["spec"]["template"]["spec"].get("volumes", []))


def test_an_mps_pod_mounts_the_configured_daemon_directories() -> None:
    opts = dataclasses.replace(OPTS, mps_pipe_directory="/run/nvidia-mps",
                               mps_log_directory="/var/log/nvidia-mps")
    m = job_manifest(_ts(sharing="mps", units_per_replica=3, gpu_slices=3), opts)
    env = _env(m)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "75"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    assert env["CUDA_MPS_LOG_DIRECTORY"] == "/var/log/nvidia-mps"
    volumes = m["spec"]["template"]["spec"]["volumes"]
    assert {"name": "mps-pipe", "hostPath": {"path": "/run/nvidia-mps",
                                             "type": "Directory"}} in volumes
    mounts = _container(m)["volumeMounts"]
    assert {"name": "mps-log", "mountPath": "/var/log/nvidia-mps"} in mounts
    # Not on a time-sliced pod, whatever the settings.
    ts = job_manifest(_ts(), opts)
    assert "volumes" not in ts["spec"]["template"]["spec"]


def test_a_users_own_thread_percentage_on_an_mps_type_is_fairqs() -> None:
    m = job_manifest(_ts(sharing="mps", env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}),
                     OPTS)
    assert _env(m)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"


def test_a_relative_mps_directory_is_refused() -> None:
    opts = dataclasses.replace(OPTS, mps_pipe_directory="run/../mps")
    with pytest.raises(ManifestError):
        job_manifest(_ts(sharing="mps"), opts)


def _sim() -> SimulatedCluster:
    return SimulatedCluster.from_spec("1x2xts-a10,1x4xh100",
                                      units_per_gpu=lambda: {"ts-a10": 4})


def test_the_simulated_cluster_counts_a_time_sliced_node_in_slices() -> None:
    sim = _sim()
    by_type = {n.gpu_type: n for n in sim.nodes()}
    assert by_type["ts-a10"].capacity == 8  # 2 GPUs x 4 slices
    assert by_type["h100"].capacity == 4


def test_the_simulated_cluster_runs_fractions_until_its_slices_are_taken() -> None:
    sim = _sim()
    for i in range(4):  # four half GPUs: 2 slices each, 8 slices
        sim.submit(_ts(name=f"fq-{i}-1", job_id=i, placement=()), now=NOW)
    node = next(n for n in sim.nodes() if n.gpu_type == "ts-a10")
    assert (node.capacity, node.allocated) == (8, 8)
    with pytest.raises(SimulatedClusterError):
        sim.submit(_ts(name="fq-9-1", job_id=9, units_per_replica=1, gpu_slices=1,
                       placement=()), now=NOW)
    sim.stop("fq-0-1", now=NOW)
    node = next(n for n in sim.nodes() if n.gpu_type == "ts-a10")
    assert node.allocated == 6
