"""Rule K8 on the cycle (docs/scheduling.md, "Clusters and spot capacity"; docs/clusters.md,
"Disabling a cluster"): a disabled cluster drains, as `kubectl drain` does a node. Its
jobs run on - read, charged, ending as on any cluster (K5 and K6 too) - nothing new is
admitted, created or placed there, and the cycle that finds no job left records it
drained (`Cluster.drained_at`, an audit entry) and reads it no more. Enabling it again
makes it an ordinary cluster.

Time is the cycle's `now`. Each job's GPU type exists in one cluster only where the test
is not about the choice between them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import AuditEntry
from queueing.models import Cluster, Job, JobEvent, UsageRecord
from queueing.policy.admission import WaitReason
from queueing.policy.states import JobState
from queueing.selectors.active_jobs import ActiveJobs
from queueing.selectors.snapshot import build_snapshot
from queueing.services.clusters import fleet_open
from queueing.services.jobs import job_cancel
from queueing.services.scheduler import CycleResult, scheduler_cycle
from tests.conftest import World

from .conftest import (
    Flaky,
    MakeCluster,
    admitted_never_created,
    backend_of,
    live,
    queued,
    spot_pool,
)

pytestmark = pytest.mark.django_db

URL = "/api/v1/clusters/"


def fresh(job: Job) -> Job:
    return Job.objects.select_related("cluster").get(pk=job.pk)


def disable(world: World, name: str, *, enabled: bool = False) -> dict[str, Any]:
    """Staff PATCH the cluster (the API's answer)."""
    r = world.client(world.staff).patch(f"{URL}{name}/", {"enabled": enabled}, format="json")
    assert r.status_code == 200, r.json()
    return r.json()


def api_cluster(world: World, name: str) -> dict[str, Any]:
    return world.client(world.member).get(f"{URL}{name}/").json()


def drained_entries(cluster: Cluster) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(object_type="queueing.Cluster",
                                          object_id=str(cluster.pk), action="drained"))


def running_on(world: World, make_cluster: MakeCluster, *, seconds: int = 600,
               sim_nodes: str = "1x8xa100", **fields: Any) -> tuple[Cluster, Job, datetime]:
    """On-premises h100s and a cloud of a100s; an a100 job RUNNING in the cloud."""
    make_cluster("onprem", "1x8xh100", cost_rank=0)
    cloud = make_cluster("cloud", sim_nodes, cost_rank=10)
    t0 = timezone.now() - timedelta(hours=1)
    job = queued(world, gpu_type=world.a100, seconds=seconds, at=t0 - timedelta(seconds=5),
                 **fields)
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    job = fresh(job)
    assert (job.status, job.cluster) == (JobState.RUNNING, cloud)
    return cloud, job, t0


def test_k8_a_job_on_a_disabled_cluster_runs_on_is_charged_and_completes_then_it_drains(
        world: World, make_cluster: MakeCluster) -> None:
    cloud, job, t0 = running_on(world, make_cluster, seconds=600)

    body = disable(world, "cloud")
    assert (body["enabled"], body["state"], body["running_jobs"]) == (False, "draining", 1)
    for second in (30, 200, 400):  # well past reconcile's 15 s grace for missing jobs
        r = scheduler_cycle(now=t0 + timedelta(seconds=second))
        assert job.pk not in r.finished
    job = fresh(job)
    assert (job.status, job.attempt, job.cluster) == (JobState.RUNNING, 1, cloud)
    assert live(backend_of(cloud), t0 + timedelta(seconds=400)) == {job.backend_name}
    assert not drained_entries(cloud)
    # Still in the snapshot as a job holding GPUs (quota, fair share), on its nodes; the
    # plan offers them to no queued job (the cluster is closed).
    fleet = fleet_open()
    fleet.statuses(now=t0)
    jobs = ActiveJobs()
    jobs.refresh()
    snapshot = build_snapshot(backend=fleet, now=t0, jobs=jobs)
    assert [r.id for r in snapshot.running] == [job.pk]
    assert {n.cluster for n in snapshot.nodes} == {"onprem", "cloud"}
    assert {n.cluster for n in snapshot.open_nodes()} == {"onprem"}
    assert snapshot.closed_clusters == frozenset({"cloud"})
    assert api_cluster(world, "cloud")["state"] == "draining"

    end = t0 + timedelta(seconds=601)  # it ran from t0 + 1 for its 600 s
    r = scheduler_cycle(now=end + timedelta(seconds=5))

    job = fresh(job)
    assert job.pk in r.finished
    assert (job.status, job.exit_code) == (JobState.SUCCEEDED, 0)
    (usage,) = UsageRecord.objects.filter(job=job)
    assert (usage.gpu_seconds, usage.cluster) == (8 * 600, cloud)
    cloud.refresh_from_db()
    assert cloud.drained_at == end + timedelta(seconds=5)
    (entry,) = drained_entries(cloud)
    assert entry.actor is None
    assert entry.changes == {"drained_at": [None, cloud.drained_at.isoformat()]}
    body = api_cluster(world, "cloud")
    assert (body["state"], body["running_jobs"]) == ("drained", 0)
    assert body["drained_at"] is not None
    # Drained: read no more, and recorded once.
    assert "cloud" not in fleet_open().members
    scheduler_cycle(now=end + timedelta(seconds=10))
    assert len(drained_entries(cloud)) == 1


def test_k8_nothing_new_is_admitted_or_placed_on_a_draining_cluster(
        world: World, make_cluster: MakeCluster) -> None:
    # Two a100 nodes in the cloud: one stays free while it drains.
    cloud, job, t0 = running_on(world, make_cluster, sim_nodes="2x8xa100", seconds=3600)
    disable(world, "cloud")
    newcomer = queued(world, gpu_type=world.a100, team=world.nlp, seconds=60)

    r = scheduler_cycle(now=t0 + timedelta(seconds=60))

    assert r.admitted == [] and fresh(newcomer).status == JobState.QUEUED
    assert fresh(job).status == JobState.RUNNING
    assert live(backend_of(cloud), t0 + timedelta(seconds=60)) == {job.backend_name}
    assert r.plan is not None
    wait = r.plan.waits[newcomer.pk]
    assert "cloud" not in wait.message  # "why it waits" never says it fits there
    # The published view shows the draining cluster's nodes, and offers them to no one.
    from queueing.selectors.cluster import cluster_view

    view = cluster_view()
    assert {n.cluster for n in view.nodes()} == {"onprem", "cloud"}
    assert view.closed == frozenset({"cloud"})
    assert {n.cluster for n in view.open_nodes()} == {"onprem"}


def test_k8_a_job_requeued_from_a_draining_cluster_is_not_placed_there_again(
        world: World, make_cluster: MakeCluster) -> None:
    """Rule K6 reclaims the spot node a low-tier job runs on while its cluster drains: it
    is requeued (charged, not failed) and waits, though the cluster's other node is free;
    nothing is left there, so the same cycle records the cluster drained."""
    make_cluster("onprem", "1x8xh100", cost_rank=0)
    cloud = make_cluster("cloud", "2x8xa100", cost_rank=10)
    spot_pool(cloud, world.a100)
    t0 = timezone.now() - timedelta(hours=1)
    job = queued(world, gpu_type=world.a100, tier=world.low, seconds=3600)
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    job = fresh(job)
    assert (job.status, job.cluster, job.on_spot) == (JobState.RUNNING, cloud, True)
    disable(world, "cloud")
    scheduler_cycle(now=t0 + timedelta(seconds=30))
    (node,) = job.placement
    backend_of(cloud).reclaim_node(node, now=t0 + timedelta(seconds=100))  # type: ignore[attr-defined]

    r = scheduler_cycle(now=t0 + timedelta(seconds=101))

    job = fresh(job)
    assert job.pk in r.requeued and job.pk not in r.admitted
    assert (job.status, job.attempt, job.cluster) == (JobState.QUEUED, 2, None)
    assert JobEvent.objects.filter(job=job, kind=JobEvent.Kind.SPOT_RECLAIMED).exists()
    assert UsageRecord.objects.get(job=job, attempt=1).gpu_seconds == 8 * 100  # from t0
    assert live(backend_of(cloud), t0 + timedelta(seconds=101)) == set()
    cloud.refresh_from_db()
    assert cloud.drained_at == t0 + timedelta(seconds=101)
    r = scheduler_cycle(now=t0 + timedelta(seconds=102))
    assert fresh(job).status == JobState.QUEUED and r.admitted == []


def test_k8_a_queued_job_pinned_to_a_disabled_cluster_is_told_it_is_disabled(
        world: World, make_cluster: MakeCluster) -> None:
    """A pin made before the cluster was disabled (the submit check refuses new ones):
    "why is my job pending" says the cluster is disabled, not that the job does not fit
    (here no a100 is left anywhere else, the words of a job that fits no node)."""
    make_cluster("onprem", "1x8xh100")
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10)
    cluster_disabled = queued(world, gpu_type=world.a100, requested_cluster=cloud)
    disable(world, "cloud")

    r = scheduler_cycle(now=timezone.now())

    assert r.plan is not None and r.admitted == []
    wait = r.plan.waits[cluster_disabled.pk]
    assert wait.reason is WaitReason.CLUSTER
    assert wait.message == ("its cluster cloud is disabled: it takes no new work (rule K8); "
                            "this job waits until it is enabled again")
    body = world.client(world.member).get(f"/api/v1/jobs/{cluster_disabled.pk}/").json()
    assert body["queue"]["reason"] == {"code": "cluster", "message": wait.message}


def test_k8_an_admitted_job_never_created_on_a_disabled_cluster_goes_back_at_once(
        world: World, make_cluster: MakeCluster) -> None:
    stuck = admitted_never_created(world, make_cluster)
    onprem, cloud, flaky = stuck.onprem, stuck.cloud, stuck.flaky
    job, t0 = stuck.job, stuck.at
    backends = {"cloud": flaky}

    # Disabled before its workload could be created; on-premises has a100s now.
    disable(world, "cloud")
    onprem.sim_nodes = "1x8xh100,1x8xa100"
    onprem.save()
    flaky.refuse_submit = False  # it would take it now: still nothing new goes there
    r = scheduler_cycle(now=t0 + timedelta(seconds=5), backends=backends)

    job = fresh(job)
    assert job.pk in r.requeued and job.pk in r.admitted
    requeue = job.events.get(to_status=JobState.QUEUED, attempt=2)
    assert requeue.data == {"ended_how": "cluster_disabled", "cluster": "cloud"}
    assert (job.attempt, job.cluster, job.status) == (2, onprem, JobState.ADMITTED)
    assert not UsageRecord.objects.filter(job=job).exists()
    assert live(flaky, t0) == set()
    cloud.refresh_from_db()
    assert cloud.drained_at == t0 + timedelta(seconds=5)


def test_k8_a_cancelled_jobs_workload_on_a_draining_cluster_is_stopped_before_it_drains(
        world: World, make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel's stop that did not reach the cluster: the next cycle still reads the
    draining cluster, stops the workload as one no job owns, and only then records it
    drained."""
    cloud, job, t0 = running_on(world, make_cluster, seconds=3600)
    disable(world, "cloud")
    monkeypatch.setattr("queueing.services.jobs.stop_workload_soon", lambda name: None)
    job_cancel(actor=world.admin, job=job, now=t0 + timedelta(seconds=50))  # a team admin
    assert fresh(job).status == JobState.CANCELLED
    assert live(backend_of(cloud), t0 + timedelta(seconds=50)) == {job.backend_name}

    r = scheduler_cycle(now=t0 + timedelta(seconds=60))

    assert r.orphans_stopped == [job.backend_name]
    assert live(backend_of(cloud), t0 + timedelta(seconds=60)) == set()
    cloud.refresh_from_db()
    assert cloud.drained_at is None  # it listed a running workload this cycle
    scheduler_cycle(now=t0 + timedelta(seconds=61))
    cloud.refresh_from_db()
    assert cloud.drained_at == t0 + timedelta(seconds=61)


def test_k8_a_draining_cluster_that_cannot_be_read_keeps_its_job_then_k5_requeues_it(
        world: World, make_cluster: MakeCluster, settings: Any) -> None:
    """Rule K5 on a draining cluster, as on any: its running job is kept for the grace,
    then requeued (charged up to when it was last seen); then nothing holds it and it is
    drained without being read (the audit entry says why)."""
    grace = settings.FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS
    make_cluster("onprem", "1x8xh100", cost_rank=0)
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10)
    flaky = Flaky(backend_of(cloud))
    backends = {"cloud": flaky}
    t0 = timezone.now() - timedelta(hours=1)
    job = queued(world, gpu_type=world.a100, seconds=7200)
    scheduler_cycle(now=t0, backends=backends)
    scheduler_cycle(now=t0 + timedelta(seconds=10), backends=backends)
    disable(world, "cloud")
    scheduler_cycle(now=t0 + timedelta(seconds=20), backends=backends)  # last seen
    flaky.down = True
    t1 = t0 + timedelta(seconds=100)

    r = scheduler_cycle(now=t1, backends=backends)
    assert r.unreachable == ["cloud"]
    assert fresh(job).status == JobState.RUNNING
    assert JobEvent.objects.filter(job=job, kind=JobEvent.Kind.CLUSTER_UNREACHABLE).exists()

    r = scheduler_cycle(now=t1 + timedelta(seconds=grace), backends=backends)

    job = fresh(job)
    assert job.pk in r.requeued and (job.status, job.attempt) == (JobState.QUEUED, 2)
    # Up to t0 + 20, when the draining cluster was last read.
    assert UsageRecord.objects.get(job=job, attempt=1).gpu_seconds == 8 * 20
    cloud.refresh_from_db()
    assert cloud.drained_at == t1 + timedelta(seconds=grace)
    (entry,) = drained_entries(cloud)
    assert "connection refused" in entry.changes["error"][1]


def test_k8_re_enabling_a_draining_cluster_makes_it_an_ordinary_cluster_again(
        world: World, make_cluster: MakeCluster) -> None:
    cloud, job, t0 = running_on(world, make_cluster, sim_nodes="2x8xa100", seconds=3600)
    disable(world, "cloud")
    scheduler_cycle(now=t0 + timedelta(seconds=30))
    newcomer = queued(world, gpu_type=world.a100, team=world.nlp, seconds=60)
    assert scheduler_cycle(now=t0 + timedelta(seconds=40)).admitted == []

    body = disable(world, "cloud", enabled=True)
    assert (body["state"], body["drained_at"]) == ("enabled", None)
    r = scheduler_cycle(now=t0 + timedelta(seconds=50))

    assert r.admitted == [newcomer.pk] and fresh(newcomer).cluster == cloud
    assert fresh(job).status == JobState.RUNNING and fresh(job).attempt == 1
    assert not drained_entries(cloud)


def test_k8_re_enabling_a_drained_cluster_clears_drained_and_a_new_disable_drains_again(
        world: World, make_cluster: MakeCluster) -> None:
    make_cluster("onprem", "1x8xh100")
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10)
    t0 = timezone.now()
    disable(world, "cloud")
    scheduler_cycle(now=t0)  # nothing ran there: drained at once
    cloud.refresh_from_db()
    assert cloud.drained_at == t0 and len(drained_entries(cloud)) == 1

    disable(world, "cloud", enabled=True)
    cloud.refresh_from_db()
    assert cloud.drained_at is None
    update = AuditEntry.objects.filter(object_type="queueing.Cluster", object_id=str(cloud.pk),
                                       action="update").latest("id")
    assert update.changes["enabled"] == [False, True]
    assert update.changes["drained_at"] == [t0.isoformat(), None]
    job = queued(world, gpu_type=world.a100)
    r: CycleResult = scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert r.admitted == [job.pk] and fresh(job).cluster == cloud

    disable(world, "cloud")
    scheduler_cycle(now=t0 + timedelta(seconds=2))
    assert fresh(job).status in (JobState.ADMITTED, JobState.RUNNING)
    assert len(drained_entries(cloud)) == 1  # not drained while its job is there


def test_k8_the_fleet_lists_a_draining_clusters_nodes_with_their_use_and_the_plan_closes_them(
        world: World, make_cluster: MakeCluster) -> None:
    """Rule K8 is applied once, in the policy: the fleet lists a draining cluster's nodes
    like any member's (their real capacity, the running job's GPUs allocated), the
    snapshot has them with the job on them, and only the plan's `open_nodes` leaves them
    out - so a newcomer that would fit on its free node is not placed there."""
    _, _, t0 = running_on(world, make_cluster, sim_nodes="2x8xa100", seconds=3600)
    disable(world, "cloud")
    newcomer = queued(world, gpu_type=world.a100, team=world.nlp, seconds=60)

    fleet = fleet_open()
    assert fleet.members["cloud"].draining
    nodes = [n for n in fleet.nodes() if n.cluster == "cloud"]
    assert (len(nodes), sum(n.capacity for n in nodes), sum(n.allocated for n in nodes)) == (
        2, 16, 8)
    jobs = ActiveJobs()
    jobs.refresh()
    snapshot = build_snapshot(backend=fleet, now=t0 + timedelta(seconds=30), jobs=jobs)
    (held,) = snapshot.running
    cloud_nodes = {n.name: n for n in snapshot.nodes if n.cluster == "cloud"}
    assert set(held.nodes) <= set(cloud_nodes)  # accounted against its node
    assert sum(n.free for n in cloud_nodes.values()) == 8
    assert not any(n.cluster == "cloud" for n in snapshot.open_nodes())

    r = scheduler_cycle(now=t0 + timedelta(seconds=30))

    assert r.admitted == [] and fresh(newcomer).status == JobState.QUEUED
    assert r.plan is not None and "cloud" not in r.plan.waits[newcomer.pk].message


def test_k8_the_api_and_metrics_show_a_draining_clusters_capacity_and_use_until_it_drains(
        world: World, make_cluster: MakeCluster) -> None:
    from django.test import Client

    from queueing.selectors.cluster import cluster_view

    cloud, _, t0 = running_on(world, make_cluster, sim_nodes="2x8xa100", seconds=600)
    disable(world, "cloud")
    scheduler_cycle(now=t0 + timedelta(seconds=30))

    body = api_cluster(world, "cloud")
    assert (body["state"], body["capacity"], body["free"], body["running_jobs"]) == (
        "draining", 16, 8, 1)
    (a100,) = body["gpu_types"]
    assert (a100["gpu_type"], a100["nodes"], a100["capacity"], a100["free"],
            a100["held_by_jobs"]) == ("a100", 2, 16, 8, 8)
    capacity = {r["gpu_type"]: r for r in
                world.client(world.member).get("/api/v1/capacity/").json()}
    assert (capacity["a100"]["capacity"], capacity["a100"]["held_by_jobs"]) == (16, 8)
    assert {n["name"]: n["draining"] for n in capacity["a100"]["by_node"]} == {
        "sim-a100-000": True, "sim-a100-001": True}
    assert {n["draining"] for n in capacity["h100"]["by_node"]} == {False}
    metrics = Client().get("/metrics").content.decode()
    assert 'fairq_gpus_capacity{cluster="cloud",gpu_type="a100",spot="false"} 16.0' in metrics
    assert 'fairq_gpus_free{cluster="cloud",gpu_type="a100",spot="false"} 8.0' in metrics
    # What new work may use is the open clusters' (rule P1's cluster size).
    assert cluster_view().total_gpus() == 8

    # Its job ends: the cycle that records it drained publishes none of its nodes.
    scheduler_cycle(now=t0 + timedelta(seconds=610))
    cloud.refresh_from_db()
    assert cloud.drained_at == t0 + timedelta(seconds=610)
    body = api_cluster(world, "cloud")
    assert (body["state"], body["capacity"], body["gpu_types"]) == ("drained", 0, [])
    assert {n.cluster for n in cluster_view().nodes()} == {"onprem"}


def test_k8_a_job_only_a_draining_clusters_node_could_hold_is_refused_at_submit(
        world: World, make_cluster: MakeCluster) -> None:
    """The submit check counts the nodes new work may use: a draining cluster's 8-GPU
    a100 node is no reason to take a job no open node can hold."""
    from queueing.memo import forget_all
    from tests.conftest import job_body

    make_cluster("onprem", "1x8xh100,1x4xa100", cost_rank=0)
    make_cluster("cloud", "1x8xa100", cost_rank=10)
    t0 = timezone.now() - timedelta(hours=1)
    job = queued(world, gpu_type=world.a100, seconds=3600, at=t0 - timedelta(seconds=5))
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert fresh(job).cluster.name == "cloud"
    disable(world, "cloud")
    scheduler_cycle(now=t0 + timedelta(seconds=2))
    forget_all()

    r = world.client(world.member).post("/api/v1/jobs/", job_body(gpu_type="a100", gpus=8),
                                        format="json")

    assert r.status_code == 400, r.json()
    assert r.json()["error"]["fields"]["gpus"] == [
        "No a100 node holds 8 GPUs (the largest has 4)."]


def test_k8_start_estimates_count_no_gpus_a_draining_cluster_frees(
        world: World, make_cluster: MakeCluster) -> None:
    """A queued a100 job's estimated start (rule P4) is when the open cluster's job ends,
    not when the draining cluster's shorter one does: its GPUs take no new work."""
    from queueing.selectors.start_estimate import queue_start_estimates

    onprem = make_cluster("onprem", "1x8xa100", cost_rank=0)
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10)
    t0 = timezone.now() - timedelta(hours=1)
    long = queued(world, gpu_type=world.a100, seconds=3600, requested_cluster=onprem,
                  at=t0 - timedelta(seconds=5))
    short = queued(world, gpu_type=world.a100, seconds=3600, requested_cluster=cloud,
                   at=t0 - timedelta(seconds=5))
    Job.objects.filter(pk=long.pk).update(max_runtime_seconds=2000)
    Job.objects.filter(pk=short.pk).update(max_runtime_seconds=500)
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert {fresh(long).status, fresh(short).status} == {JobState.RUNNING}
    disable(world, "cloud")
    scheduler_cycle(now=t0 + timedelta(seconds=2))
    newcomer = queued(world, gpu_type=world.a100, team=world.nlp)

    starts, error = queue_start_estimates(now=t0 + timedelta(seconds=3), job_ids=[newcomer.pk])

    assert error == ""
    at = starts[newcomer.pk].estimated_start
    assert at is not None and at >= t0 + timedelta(seconds=1900)
