"""Rules A6 and A7 end to end: submit refuses a replica larger than any node's CPU or
memory; the simulated cluster's nodes report CPU, memory and topology domains; a job
needing more CPU than is free waits (and explain says why) while GPUs are free, then runs
when the CPU frees; a topology request is validated, stored, carried by resubmit and
pinned in the manifest."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.backends.base import NodeInfo
from queueing.backends.k8s_manifest import GpuTypeRef, capacity, job_manifest
from queueing.backends.simulated import (
    SimulatedCluster,
    SimulatedClusterError,
    parse_node_spec,
)
from queueing.composition import get_backend, reset_backends
from queueing.models import Job, Quota
from queueing.policy.admission import WaitReason
from queueing.selectors.cluster import ClusterView
from queueing.services.jobs import job_input_build, job_spec
from queueing.services.scheduler import launch_spec, scheduler_cycle

from .conftest import World, job_body
from .test_k8s_manifest import OPTS

pytestmark = pytest.mark.django_db
GI = 2**30
RACKS = [{"name": "rack", "node_label": "topology.kubernetes.io/rack"}]


def post(world: World, **overrides: Any) -> Any:
    return world.client(world.member).post("/api/v1/jobs/", job_body(**overrides),
                                           format="json")


def fields(r: Any) -> dict[str, Any]:
    """The refused fields of a 400 (docs/api.md, "Errors")."""
    assert r.status_code == 400, r.content
    return dict(r.json()["error"]["fields"])


def submit(world: World, **overrides: Any) -> int:
    r = post(world, **overrides)
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def status(job_id: int) -> str:
    return Job.objects.get(pk=job_id).status


# --- simulated nodes (FAIRQ_SIM_NODES) ----------------------------------------------------

def test_rule_a6_simulated_pools_default_to_12_cpus_and_128gi_per_gpu() -> None:
    (pool,) = parse_node_spec("2x8xh100")
    assert (pool.cpu_millicores, pool.memory_bytes) == (96_000, 1024 * GI)
    (mig,) = parse_node_spec("1x7xmig-1g-10gb")
    assert (mig.cpu_millicores, mig.memory_bytes) == (84_000, 896 * GI)


def test_rule_a6_a7_a_pool_may_say_its_cpus_memory_and_domains() -> None:
    (pool,) = parse_node_spec("4x8xh100:64c:512Gi@rack=2@nvlink=1")
    assert (pool.count, pool.gpus, pool.gpu_type) == (4, 8, "h100")
    assert (pool.cpu_millicores, pool.memory_bytes) == (64_000, 512 * GI)
    assert pool.domains == (("rack", 2), ("nvlink", 1))
    nodes = SimulatedCluster.from_spec("4x8xh100:64c:512Gi@rack=2").nodes()
    assert [n.topology["rack"] for n in nodes] == ["h100-rack-0", "h100-rack-0",
                                                   "h100-rack-1", "h100-rack-1"]
    assert {(n.cpu_millicores, n.memory_bytes) for n in nodes} == {(64_000, 512 * GI)}


@pytest.mark.parametrize("spec", ["4x8xh100:96", "4x8xh100:96c:lots", "4x8xh100@rack=0",
                                  "4x8xh100@rack=2@rack=3", "4x8xh100:0c", "0x8xh100"])
def test_a_bad_simulated_pool_is_refused_at_start_up(spec: str) -> None:
    from config.settings.clusters import _check_sim_nodes

    with pytest.raises(SimulatedClusterError):
        parse_node_spec(spec)
    with pytest.raises(Exception, match="FAIRQ_SIM_NODES"):
        _check_sim_nodes(spec)


# --- Kubernetes nodes ---------------------------------------------------------------------

def _node(name: str, rack: str | None = None) -> dict[str, Any]:
    labels = {"fairq.io/gpu-type": "h100"}
    if rack:
        labels["topology.kubernetes.io/rack"] = rack
    return {"metadata": {"name": name, "labels": labels},
            "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "95500m",
                                       "memory": "1056318356Ki"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(node: str, cpu: str, memory: str, phase: str = "Running",
         init_cpu: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node, "containers": [
        {"resources": {"requests": {"cpu": cpu, "memory": memory}}},
        {"resources": {"limits": {"cpu": "500m"}}}]}
    if init_cpu:
        spec["initContainers"] = [{"resources": {"requests": {"cpu": init_cpu}}}]
    return {"metadata": {"name": f"p-{node}-{cpu}"}, "spec": spec, "status": {"phase": phase}}


def test_rule_a6_a7_kubernetes_nodes_report_allocatable_minus_pod_requests_and_labels() -> None:
    h100 = GpuTypeRef("h100", "nvidia.com/gpu", {"fairq.io/gpu-type": "h100"},
                      topology_levels=(("rack", "topology.kubernetes.io/rack"),))
    pods = [_pod("n0", "4", "16Gi"), _pod("n0", "8", "1Gi", phase="Succeeded"),
            _pod("n1", "1", "1Gi", init_cpu="10")]
    n0, n1 = capacity([_node("n0", rack="r7"), _node("n1")], pods, [h100])
    assert (n0.cpu_millicores, n0.memory_bytes) == (95_500, 1056318356 * 1024)
    assert n0.cpu_allocated == 4_500 and n0.memory_allocated == 16 * GI  # not the finished pod
    assert n1.cpu_allocated == 10_000  # the init container's 10 CPUs beat 1.5
    assert n0.topology == {"rack": "r7"} and n1.topology == {}
    assert n0.cpu_free == 91_000


def test_a_cluster_view_keeps_cpu_memory_and_topology_and_reads_an_old_one() -> None:
    node = NodeInfo("n0", "h100", 8, 2, cpu_millicores=96_000, cpu_allocated=1_000,
                    memory_bytes=GI, memory_allocated=0, topology={"rack": "r1"})
    view = ClusterView(node_list=(node,), published_at=timezone.now())
    assert ClusterView.from_dict(view.to_dict()).node_list == (node,)
    old = ClusterView.from_dict({"nodes": [["n0", "h100", 8, 2]], "published_at": None})
    assert old.node_list == (NodeInfo("n0", "h100", 8, 2),) and old.nodes()[0].cpu_free is None


# --- A6: submit, explain, the cycle -------------------------------------------------------

def test_rule_a6_submit_refuses_a_replica_larger_than_any_nodes_cpu_or_memory(
        world: World) -> None:
    r = post(world, resources={"cpu": "97", "memory": "2Ti"})
    assert fields(r) == {"resources.cpu": ["No h100 node has 97 CPUs (the largest can "
                                          "allocate 96)."],
                        "resources.memory": ["No h100 node has 2Ti of memory (the largest "
                                             "can allocate 1Ti)."]}
    assert not Job.objects.exists()
    assert post(world, resources={"cpu": "96", "memory": "1Ti"}).status_code == 201


def test_rule_a6_a_job_waits_for_cpu_while_gpus_are_free_then_runs(world: World) -> None:
    """h100 nodes have 96 CPUs each. Two 1-GPU jobs take 80 CPUs on each node; a 4-GPU
    job of 32 CPUs then waits (GPUs free, CPU not) with the reason explain shows; it runs
    once one of them finishes."""
    t0 = timezone.now() - timedelta(minutes=10)
    hogs = [submit(world, gpus=1, name=f"hog-{i}", resources={"cpu": "80"},
                   env={"FAIRQ_SIM_SECONDS": "30"}) for i in range(2)]
    scheduler_cycle(now=t0)
    assert [status(h) for h in hogs] == ["ADMITTED", "ADMITTED"]
    job = submit(world, gpus=4, name="needs-cpu", resources={"cpu": "32", "memory": "256Gi"})
    r = scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert r.plan is not None and r.admitted == []
    wait = r.plan.waits[job]
    assert wait.reason is WaitReason.CPU_MEMORY
    assert sum(n.free for n in get_backend().nodes() if n.gpu_type == "h100") == 14
    body = world.client(world.member).get(f"/api/v1/jobs/{job}/").json()
    first = body["queue"]["reasons"][0]
    assert first["code"] == "cpu_memory"
    assert first["message"].startswith("no h100 node has 32 CPUs and 256Gi memory free "
                                       "beside 4 GPUs")
    scheduler_cycle(now=t0 + timedelta(seconds=31))  # the hogs finish
    assert [status(h) for h in hogs] == ["SUCCEEDED", "SUCCEEDED"]
    assert status(job) == "ADMITTED"
    node = Job.objects.get(pk=job).placement[0]
    (info,) = [n for n in get_backend().nodes() if n.name == node]
    assert info.cpu_allocated == 32_000 and info.memory_allocated == 256 * GI


# --- A7: the request, the cycle, the manifest ---------------------------------------------

@pytest.fixture
def racks(world: World, settings: Any) -> World:
    settings.FAIRQ_SIM_NODES = "4x8xh100@rack=2,2x8xa100"
    reset_backends()
    world.h100.topology_levels = RACKS
    world.h100.save()
    Quota.objects.filter(gpu_type=world.h100).update(borrowing_limit=None)
    return world


def test_rule_a7_the_topology_level_must_exist_on_the_gpu_type(racks: World) -> None:
    r = post(racks, topology={"level": "row"})
    assert fields(r) == {"topology.level": ["GPU type h100 has no topology level 'row'; its "
                                            "levels: rack."]}
    r = post(racks, gpu_type="a100", topology={"level": "rack"})
    assert "it has none" in fields(r)["topology.level"][0]
    r = post(racks, topology={"level": "rack", "mode": "always"})
    assert fields(r) == {"topology.mode": ['"always" is not a valid choice.']}
    r = post(racks, topology={"level": "rack", "colour": "red"})
    assert fields(r) == {"topology.colour": ["Unknown field."]}
    assert not Job.objects.exists()


def test_rule_a7_the_request_is_stored_shown_and_resubmitted(racks: World) -> None:
    r = post(racks, topology={"level": "rack"})
    assert r.status_code == 201 and r.json()["topology"] == {"level": "rack", "mode": "required"}
    job = Job.objects.get(pk=r.json()["id"])
    assert (job.topology_level, job.topology_mode) == ("rack", "required")
    spec = job_spec(job)
    assert spec["topology"] == {"level": "rack", "mode": "required"}
    again = job_input_build(actor=racks.member, **spec)
    assert (again.topology_level, again.topology_mode) == ("rack", "required")
    assert post(racks, name="plain").json()["topology"] is None


def test_rule_a7_a_required_gang_runs_in_one_rack_pinned_by_affinity(racks: World) -> None:
    """Racks of 2 nodes; one 8-GPU job fills sim-h100-000 (rack 0). A gang of 2 × 8
    with rack required goes to rack 1 whole, and its manifest pins that rack."""
    t0 = timezone.now() - timedelta(minutes=5)
    one = submit(racks, gpus=8, name="one")
    scheduler_cycle(now=t0)
    assert Job.objects.get(pk=one).placement == ["sim-h100-000"]
    gang = submit(racks, gpus=8, replicas=2, name="gang", topology={"level": "rack"},
                  tier="high")
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    job = Job.objects.get(pk=gang)
    assert job.status == "ADMITTED"
    assert sorted(job.placement) == ["sim-h100-002", "sim-h100-003"]
    nodes = {n.name: n.topology for n in get_backend().nodes()}
    spec = launch_spec(job, node_topology=nodes)
    assert (spec.topology_label, spec.topology_domain) == ("topology.kubernetes.io/rack",
                                                           "h100-rack-1")
    affinity = job_manifest(spec, OPTS)["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"] == {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/rack", "operator": "In",
                               "values": ["h100-rack-1"]}]}]}
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"]  # the per-node hint


def test_rule_a7_a_required_gang_waits_when_no_rack_has_room(racks: World) -> None:
    """Four 8-GPU jobs fill the four nodes (best fit: in node order); the ones on
    sim-h100-001 (rack 0) and sim-h100-003 (rack 1) finish. Two nodes are free, but in two
    racks: the gang of 2 × 8 waits with the topology reason, explain says so, and a
    4-GPU job behind it is admitted (A4)."""
    t0 = timezone.now() - timedelta(minutes=5)
    fills = [submit(racks, gpus=8, name=f"fill-{i}",
                    env={"FAIRQ_SIM_SECONDS": "10" if i % 2 else "600"}) for i in range(4)]
    scheduler_cycle(now=t0)
    assert [Job.objects.get(pk=f).placement for f in fills] == [
        [f"sim-h100-00{i}"] for i in range(4)]
    scheduler_cycle(now=t0 + timedelta(seconds=11))
    assert [status(f) for f in fills] == ["RUNNING", "SUCCEEDED", "RUNNING", "SUCCEEDED"]
    gang = submit(racks, gpus=8, replicas=2, name="gang", topology={"level": "rack"})
    r = scheduler_cycle(now=t0 + timedelta(seconds=12))
    assert r.plan is not None and r.plan.waits[gang].reason is WaitReason.TOPOLOGY
    reason = racks.client(racks.member).get(f"/api/v1/jobs/{gang}/").json()["queue"]["reasons"][0]
    assert reason["code"] == "topology"
    # (Every job has memory: 8 GPUs x FAIRQ_DEFAULT_MEMORY_PER_GPU, docs/kubernetes.md.)
    assert reason["message"].startswith(
        "no rack has room for all 2 replicas of 8 GPUs and 256Gi memory of h100")
    small = submit(racks, gpus=4, name="small")
    scheduler_cycle(now=t0 + timedelta(seconds=13))
    assert status(gang) == "QUEUED" and status(small) == "ADMITTED"


def test_rule_a7_preferred_is_not_pinned(racks: World) -> None:
    t0 = timezone.now() - timedelta(minutes=5)
    gang = submit(racks, gpus=8, replicas=2, topology={"level": "rack", "mode": "preferred"})
    scheduler_cycle(now=t0)
    job = Job.objects.get(pk=gang)
    assert job.status == "ADMITTED"
    spec = launch_spec(job, node_topology={n.name: n.topology for n in get_backend().nodes()})
    assert spec.topology_label == ""
    pod = job_manifest(spec, OPTS)["spec"]["template"]["spec"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["nodeAffinity"]


@pytest.mark.parametrize(("levels", "message"), [
    ({"name": "rack"}, "Write a list"),
    ([{"name": "rack"}], 'want exactly "name" and "node_label"'),
    ([{"name": "Rack!", "node_label": "x"}], "lower-case letters"),
    ([{"name": "rack", "node_label": "not a label"}], "not a Kubernetes label key"),
    ([{"name": "rack", "node_label": "a/b"}, {"name": "rack", "node_label": "c"}],
     "appears twice"),
    ([{"name": "a", "node_label": "x"}, {"name": "b", "node_label": "x"}], "appears twice"),
])
def test_rule_a7_a_gpu_types_topology_levels_are_validated(
        world: World, levels: Any, message: str) -> None:
    from django.core.exceptions import ValidationError

    world.h100.topology_levels = levels
    with pytest.raises(ValidationError, match=message):
        world.h100.full_clean()


def test_rule_a7_the_gpu_type_api_shows_the_levels(racks: World) -> None:
    body = racks.client(racks.member).get("/api/v1/gpu-types/").json()
    (h100,) = [g for g in body if g["slug"] == "h100"]
    assert h100["topology_levels"] == RACKS


def test_rule_a6_the_submit_preview_counts_cpu_and_memory(world: World) -> None:
    from queueing.selectors import queue_plan as qp

    t0 = timezone.now() - timedelta(minutes=1)
    for i in range(2):
        submit(world, gpus=1, name=f"hog-{i}", resources={"cpu": "80"})
    scheduler_cycle(now=t0)
    now = timezone.now()
    plain = qp.submit_preview(team=world.vision, gpu_type=world.h100, gpus_per_replica=4,
                              replicas=1, tier_rank=100, now=now)
    asks = qp.submit_preview(team=world.vision, gpu_type=world.h100, gpus_per_replica=4,
                             replicas=1, tier_rank=100, now=now, cpu_millicores=32_000)
    assert plain.admitted_next and not asks.admitted_next
    assert "no h100 node has 32 CPUs free beside 4 GPUs" in asks.reason
