"""Shared GPUs on the real control plane (tests/envtest; docs/kubernetes.md, "Shared
GPUs"; docs/scheduling.md, "Shared GPUs"): a node of a time-sliced type advertises its
GPUs x 4 slices of `nvidia.com/gpu.shared` (as the NVIDIA device plugin does with
`renameByDefault`), and the real scheduler cycle packs fractions onto it. Read back from
the API server: two 0.5-GPU jobs' pods ask `nvidia.com/gpu.shared: 2` each, on the same
node with the same `fairq.io/gpu-slots`; a third half lands on another GPU; a whole GPU
of the type takes a GPU no fraction is on and a later half packs beside the third, not
on it; a MIG job's pod asks its profile resource and is charged its instances / 7.
The kube-scheduler binds each pod against the node's allocatable (extended resources
are counted as a kubelet admits them)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.envtest.test_k8s_backend import Kube, job, kube, submit, wait
from tests.factories import GpuTypeFactory, QuotaFactory

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]

SHARED = "nvidia.com/gpu.shared"


def _pod(kube: Kube, pk: int) -> dict[str, Any]:
    [pod] = kube.pods("vision", f"fq-{pk}-1")
    return pod


def _bound(kube: Kube, pk: int) -> dict[str, Any] | None:
    pods = kube.pods("vision", f"fq-{pk}-1")
    return pods[0] if pods and pods[0]["spec"].get("nodeName") else None


def test_halves_share_a_gpu_a_whole_gpu_never_does_and_mig_asks_its_profile(
    kube: Kube, world: Any, k8s_control_plane: Any,
) -> None:
    from queueing.models import GpuType, UsageRecord

    ts = GpuTypeFactory(slug="ts-a10", sharing="time-sliced", slices_per_gpu=4,
                        resource_name=SHARED, node_labels={"fairq.io/gpu-type": "ts-a10"})
    QuotaFactory(team=world.vision, gpu_type=ts, nominal=3, borrowing_limit=None)
    GpuType.objects.filter(slug="mig-1g-10gb").update(
        sharing="mig", slices_per_gpu=7, node_labels={"fairq.io/gpu-type": "mig-1g-10gb"})
    kube.backend._gpu_types_cache = None
    # 3 GPUs x 4 slices; 7 instances of the MIG profile (one A100).
    k8s_control_plane.add_gpu_node("ts-0", "ts-a10", 12, resource=SHARED)
    k8s_control_plane.add_gpu_node("mig-0", "mig-1g-10gb", 7,
                                   resource="nvidia.com/mig-1g.10gb")
    try:
        nodes = wait(lambda: {n.name: n for n in kube.backend.nodes()
                              if n.name in ("ts-0", "mig-0")} if len(
            [n for n in kube.backend.nodes() if n.name in ("ts-0", "mig-0")]) == 2 else None,
            cycle=False, what="the shared and MIG nodes in nodes()")
        assert nodes["ts-0"].capacity == 12  # slices: the allocatable as it is

        # Two halves: one GPU, two slices each.
        a = submit(world, gpu_type="ts-a10", gpus=0.5)
        b = submit(world, gpu_type="ts-a10", gpus=0.5)
        wait(lambda: _bound(kube, a) and _bound(kube, b), timeout=60,
             what="both halves' pods bound")
        pa, pb = _pod(kube, a), _pod(kube, b)
        for pod in (pa, pb):
            [c] = pod["spec"]["containers"]
            assert c["resources"]["limits"][SHARED] == "2"
            assert c["resources"]["requests"][SHARED] == "2"
            assert pod["metadata"]["annotations"]["fairq.io/gpu-slices"] == "2/4"
        assert pa["spec"]["nodeName"] == pb["spec"]["nodeName"] == "ts-0"
        slot_ab = pa["metadata"]["annotations"]["fairq.io/gpu-slots"]
        assert pb["metadata"]["annotations"]["fairq.io/gpu-slots"] == slot_ab
        assert job(a).gpu_slots == job(b).gpu_slots == [int(slot_ab)]

        # A third half: that GPU is full, another one.
        c3 = submit(world, gpu_type="ts-a10", gpus=0.5)
        wait(lambda: _bound(kube, c3), timeout=60, what="the third half's pod bound")
        slot_c = _pod(kube, c3)["metadata"]["annotations"]["fairq.io/gpu-slots"]
        assert slot_c != slot_ab

        # A whole GPU of the type: all 4 slices of the one GPU no fraction is on.
        whole = submit(world, gpu_type="ts-a10", gpus=1)
        wait(lambda: _bound(kube, whole), timeout=60, what="the whole GPU's pod bound")
        [cw] = _pod(kube, whole)["spec"]["containers"]
        assert cw["resources"]["limits"][SHARED] == "4"
        assert "fairq.io/gpu-slots" not in _pod(kube, whole)["metadata"]["annotations"]
        [slot_w] = job(whole).gpu_slots
        assert {str(slot_w), slot_ab, slot_c} == {"0", "1", "2"}

        # A last half packs beside the third (the GPU already shared), never on the
        # whole GPU's.
        last = submit(world, gpu_type="ts-a10", gpus=0.5)
        wait(lambda: _bound(kube, last), timeout=60, what="the last half's pod bound")
        assert _pod(kube, last)["metadata"]["annotations"]["fairq.io/gpu-slots"] == slot_c
        assert kube.backend.nodes() and next(
            n for n in kube.backend.nodes() if n.name == "ts-0").allocated == 12

        # MIG: its profile's resource, charged 2 of 7 instances of one GPU.
        mig = submit(world, gpu_type="mig-1g-10gb", gpus=2, env={"FAIRQ_SIM_SECONDS": "1"})
        wait(lambda: job(mig).status == "SUCCEEDED", timeout=60, what="the MIG job SUCCEEDED")
        [cm] = _pod(kube, mig)["spec"]["containers"]
        assert cm["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "2"
        assert SHARED not in cm["resources"]["limits"]
        assert "nvidia.com/gpu" not in cm["resources"]["limits"]
        assert _pod(kube, mig)["spec"]["nodeName"] == "mig-0"
        assert UsageRecord.objects.get(job_id=mig).gpus == pytest.approx(2 / 7)
    finally:
        kube.core.delete_node("ts-0")
        kube.core.delete_node("mig-0")
