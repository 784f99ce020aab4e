"""The scheduler cycle across several simulated clusters (docs/clusters.md, rules K1-K5).

Time is the cycle's `now`. Where a test is about the cycle, not about rule K2's choice,
each job's GPU type exists in one cluster only, so any policy places it there.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import AuditEntry
from queueing.composition import get_backend
from queueing.models import Cluster, Job, JobEvent, UsageRecord
from queueing.policy.states import JobState
from queueing.selectors.active_jobs import ActiveJobs
from queueing.selectors.cluster import cluster_view, clusters_reachability
from queueing.selectors.snapshot import build_snapshot
from queueing.services.clusters import fleet_open
from queueing.services.scheduler import scheduler_cycle
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


def fresh(job: Job) -> Job:
    return Job.objects.select_related("cluster").get(pk=job.pk)


# --- K1: each job in one cluster, stored as the cluster names its nodes ---------------------

def test_k1_each_job_is_created_on_its_own_cluster_with_unqualified_nodes(
        world: World, make_cluster: MakeCluster) -> None:
    onprem = make_cluster("onprem", "1x8xh100", cost_rank=0)
    cloud = make_cluster("cloud", "2x8xa100", cost_rank=10)
    now = timezone.now()
    h = queued(world, gpu_type=world.h100)
    a = queued(world, gpu_type=world.a100, team=world.nlp, replicas=2)

    r = scheduler_cycle(now=now)

    assert sorted(r.admitted) == sorted([h.pk, a.pk])
    h, a = fresh(h), fresh(a)
    assert (h.cluster, h.placement) == (onprem, ["sim-h100-000"])
    assert a.cluster == cloud and sorted(a.placement) == ["sim-a100-000", "sim-a100-001"]
    assert h.submitted_to_backend_at == now and a.submitted_to_backend_at == now
    assert live(backend_of(onprem), now) == {h.backend_name}
    assert live(backend_of(cloud), now) == {a.backend_name}
    event = h.events.get(to_status=JobState.ADMITTED)
    assert event.data == {"placement": ["sim-h100-000"], "cluster": "onprem"}
    assert event.reason == "admitted on onprem: sim-h100-000"

    scheduler_cycle(now=now + timedelta(seconds=1))
    assert fresh(h).status == fresh(a).status == JobState.RUNNING
    assert fresh(a).cluster == cloud


def test_k1_the_snapshot_qualifies_every_node_and_running_job_with_its_cluster(
        world: World, make_cluster: MakeCluster) -> None:
    make_cluster("onprem", "1x8xh100,1x8xa100")
    cloud = make_cluster("cloud", "1x8xa100,1x8xa100:spot", cost_rank=10)
    now = timezone.now()
    a = queued(world, gpu_type=world.a100, requested_cluster=cloud)
    scheduler_cycle(now=now)
    assert fresh(a).status == JobState.ADMITTED
    fleet = fleet_open()
    fleet.statuses(now=now)
    jobs = ActiveJobs()
    jobs.refresh()
    snapshot = build_snapshot(backend=fleet, now=now, jobs=jobs)

    names = {n.name: (n.cluster, n.spot) for n in snapshot.nodes}
    assert names == {"onprem/sim-h100-000": ("onprem", False),
                     "onprem/sim-a100-000": ("onprem", False),
                     "cloud/sim-a100-000": ("cloud", False),
                     "cloud/sim-a100-001": ("cloud", True)}
    (running,) = snapshot.running
    placed = fresh(a)
    assert running.cluster == placed.cluster.name
    assert running.nodes == tuple(f"{placed.cluster.name}/{n}" for n in placed.placement)


# --- K2: the cheapest cluster where it fits (rule K2) ----------------------------------------

def test_k2_a_job_goes_to_the_lowest_cost_rank_where_it_fits_then_the_next(
        world: World, make_cluster: MakeCluster) -> None:
    # "cloud" sorts first by name: only rule K2's rank puts the first job on-premises.
    onprem = make_cluster("onprem", "1x8xa100", cost_rank=0)
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10)
    now = timezone.now()
    first = queued(world, gpu_type=world.a100, at=now - timedelta(seconds=2))
    second = queued(world, gpu_type=world.a100, team=world.nlp, at=now - timedelta(seconds=1))

    scheduler_cycle(now=now)

    assert fresh(first).cluster == onprem
    assert fresh(second).cluster == cloud


# --- K3: pins and selectors -----------------------------------------------------------------

def test_k3_a_pinned_job_runs_in_its_cluster_even_when_another_is_cheaper(
        world: World, make_cluster: MakeCluster) -> None:
    make_cluster("cloud", "1x8xa100", cost_rank=0)
    onprem = make_cluster("onprem", "1x8xa100", cost_rank=10)
    now = timezone.now()
    job = queued(world, gpu_type=world.a100, requested_cluster=onprem)

    scheduler_cycle(now=now)

    assert fresh(job).cluster == onprem
    assert live(backend_of(onprem), now) == {fresh(job).backend_name}


def test_k3_a_cluster_selector_keeps_a_job_to_the_clusters_carrying_its_labels(
        world: World, make_cluster: MakeCluster) -> None:
    # "eu" is cheaper and sorts first: only the selector sends the job to "us".
    make_cluster("eu", "1x8xa100", cost_rank=0, labels={"region": "eu-west"})
    us = make_cluster("us", "1x8xa100", cost_rank=10, labels={"region": "us-east"})
    now = timezone.now()
    job = queued(world, gpu_type=world.a100, cluster_selector={"region": "us-east"})

    scheduler_cycle(now=now)

    assert fresh(job).cluster == us


def test_k3_the_snapshot_resolves_pins_and_selectors_into_allowed_clusters(
        world: World, make_cluster: MakeCluster) -> None:
    us = make_cluster("us", "1x8xa100", labels={"region": "us-east", "cost": "cloud"})
    make_cluster("eu", "1x8xa100", labels={"region": "eu-west", "cost": "cloud"})
    off = make_cluster("off", "1x8xa100", enabled=False, labels={"region": "us-east"})
    now = timezone.now()
    anywhere = queued(world, gpu_type=world.a100)
    pinned = queued(world, gpu_type=world.a100, requested_cluster=us)
    cloud = queued(world, gpu_type=world.a100, cluster_selector={"cost": "cloud"})
    us_east = queued(world, gpu_type=world.a100, cluster_selector={"region": "us-east"})
    both = queued(world, gpu_type=world.a100, requested_cluster=us,
                  cluster_selector={"region": "eu-west"})
    disabled = queued(world, gpu_type=world.a100, requested_cluster=off)
    jobs = ActiveJobs()
    jobs.refresh()

    snapshot = build_snapshot(backend=fleet_open(), now=now, jobs=jobs, live_workloads=set())

    allowed = {q.id: q.clusters for q in snapshot.queued}
    # A pin on a disabled cluster stays its cluster (rule K8 tells it the cluster is
    # disabled: `closed_clusters`); a selector takes enabled clusters only.
    assert allowed == {anywhere.pk: None, pinned.pk: frozenset({"us"}),
                       cloud.pk: frozenset({"us", "eu"}), us_east.pk: frozenset({"us"}),
                       both.pk: frozenset(), disabled.pk: frozenset({"off"})}
    assert snapshot.closed_clusters == frozenset({"off"})


def test_k3_without_cluster_rows_nothing_is_qualified_or_restricted(world: World) -> None:
    now = timezone.now()
    job = queued(world, gpu_type=world.a100)
    jobs = ActiveJobs()
    jobs.refresh()
    snapshot = build_snapshot(backend=get_backend(), now=now, jobs=jobs, live_workloads=set())
    assert all("/" not in n.name and n.cluster == "" for n in snapshot.nodes)
    assert [q.clusters for q in snapshot.queued] == [None]
    scheduler_cycle(now=now)
    assert fresh(job).cluster is None and fresh(job).status == JobState.ADMITTED


# --- K4: spot capacity ----------------------------------------------------------------------

def test_k4_spot_eligibility_is_the_tier_or_the_opt_in(
        world: World, make_cluster: MakeCluster) -> None:
    make_cluster("onprem", "1x8xh100")
    now = timezone.now()
    low = queued(world, gpu_type=world.a100, tier=world.low)
    critical = queued(world, gpu_type=world.a100, tier=world.critical)
    opted = queued(world, gpu_type=world.a100, tier=world.critical, allow_spot=True)
    jobs = ActiveJobs()
    jobs.refresh()
    snapshot = build_snapshot(backend=fleet_open(), now=now, jobs=jobs, live_workloads=set())
    assert {q.id: q.spot_ok for q in snapshot.queued} == {
        low.pk: True, critical.pk: False, opted.pk: True}


def test_k4_spot_nodes_take_only_preemptible_or_opted_in_jobs(
        world: World, make_cluster: MakeCluster) -> None:
    spot = make_cluster("cloud-spot", "2x8xa100", cost_rank=5)
    spot_pool(spot, world.a100)
    now = timezone.now()
    critical = queued(world, gpu_type=world.a100, tier=world.critical,
                      at=now - timedelta(seconds=3))
    opted = queued(world, gpu_type=world.a100, tier=world.critical, allow_spot=True,
                   team=world.nlp, at=now - timedelta(seconds=2))
    low = queued(world, gpu_type=world.a100, tier=world.low, team=world.speech,
                 at=now - timedelta(seconds=1))

    scheduler_cycle(now=now)

    assert fresh(critical).status == JobState.QUEUED
    assert fresh(opted).cluster == spot and fresh(low).cluster == spot


# --- K5: a cluster that cannot be read ------------------------------------------------------

def test_k5_an_unreachable_cluster_never_stops_the_other_clusters_cycle(
        world: World, make_cluster: MakeCluster) -> None:
    onprem = make_cluster("onprem", "1x8xh100")
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10)
    flaky = Flaky(get_backend(cloud))
    flaky.down = True
    now = timezone.now()
    h = queued(world, gpu_type=world.h100)
    a = queued(world, gpu_type=world.a100)

    r = scheduler_cycle(now=now, backends={"cloud": flaky})

    assert r.admitted == [h.pk] and fresh(h).cluster == onprem
    assert fresh(a).status == JobState.QUEUED  # its only cluster is away
    assert r.unreachable == ["cloud"]
    cloud.refresh_from_db()
    onprem.refresh_from_db()
    assert cloud.unreachable_since == now and onprem.last_seen_at == now
    assert onprem.unreachable_since is None
    entry = AuditEntry.objects.get(object_type="queueing.Cluster", object_id=str(cloud.pk))
    assert entry.action == "unreachable"
    assert entry.changes["unreachable_since"] == [None, now.isoformat()]
    assert "connection refused" in entry.changes["error"][1]
    # The published view: the reachable cluster's nodes, each with its cluster, and
    # which cluster could not be read since when.
    view = cluster_view()
    assert [(n.cluster, n.name) for n in view.nodes()] == [("onprem", "sim-h100-000")]
    assert {c.cluster: (c.reachable, c.unreachable_since) for c in view.clusters} == {
        "onprem": (True, None), "cloud": (False, now)}
    assert {c.cluster: c.reachable for c in clusters_reachability()} == {
        "onprem": True, "cloud": False}


def test_k5_running_jobs_are_kept_inside_the_grace_and_requeued_after_it_charged_not_failed(
        world: World, make_cluster: MakeCluster, settings: object) -> None:
    grace = 600
    onprem = make_cluster("onprem", "1x8xh100", cost_rank=0)
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10)
    flaky = Flaky(get_backend(cloud))
    backends = {"cloud": flaky}
    t0 = timezone.now()
    job = queued(world, gpu_type=world.a100, seconds=7200)  # a100s: only in the cloud
    onprem_backend = get_backend(onprem)
    scheduler_cycle(now=t0, backends=backends)
    scheduler_cycle(now=t0 + timedelta(seconds=10), backends=backends)
    job = fresh(job)
    assert (job.status, job.cluster) == (JobState.RUNNING, cloud)
    first_workload = job.backend_name

    flaky.down = True
    t1 = t0 + timedelta(seconds=100)  # last seen at t0 + 10
    scheduler_cycle(now=t1, backends=backends)
    scheduler_cycle(now=t1 + timedelta(seconds=grace - 1), backends=backends)
    job = fresh(job)
    assert (job.status, job.attempt, job.cluster) == (JobState.RUNNING, 1, cloud)
    (told,) = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.CLUSTER_UNREACHABLE)
    assert told.data["cluster"] == "cloud" and told.data["since"] == t1.isoformat()
    # Kept: it still holds its quota while the cluster is away.
    jobs = ActiveJobs()
    jobs.refresh()
    snapshot = build_snapshot(backend=fleet_open(backends=backends), now=t1, jobs=jobs,
                              live_workloads=set())
    assert [r.id for r in snapshot.running] == [job.pk]

    r = scheduler_cycle(now=t1 + timedelta(seconds=grace), backends=backends)

    job = fresh(job)
    assert job.pk in r.requeued
    assert job.attempt == 2 and job.status != JobState.FAILED
    (usage,) = UsageRecord.objects.filter(job=job)
    assert usage.attempt == 1 and usage.gpu_seconds == 8 * 10  # up to when last seen
    requeue = job.events.get(to_status=JobState.QUEUED, attempt=2)
    assert requeue.data["ended_how"] == "cluster_unreachable"
    assert requeue.data["cluster"] == "cloud"
    assert JobEvent.objects.filter(job=job, kind=JobEvent.Kind.CLUSTER_UNREACHABLE,
                                   data__requeued=True).count() == 1
    # No a100 is left in sight: it waits (the cloud's old workload still runs there).
    assert job.status == JobState.QUEUED
    assert live(flaky, t1) == {first_workload}
    assert live(onprem_backend, t1) == set()


def test_k5_queued_and_never_created_jobs_go_elsewhere_and_nothing_runs_twice(
        world: World, make_cluster: MakeCluster) -> None:
    grace = 600
    onprem = make_cluster("onprem", "1x8xh100", cost_rank=0)
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10)
    flaky = Flaky(get_backend(cloud))
    backends = {"cloud": flaky}
    t0 = timezone.now()
    running = queued(world, gpu_type=world.a100, seconds=7200, at=t0 - timedelta(seconds=9))
    scheduler_cycle(now=t0, backends=backends)
    scheduler_cycle(now=t0 + timedelta(seconds=1), backends=backends)
    assert fresh(running).status == JobState.RUNNING and fresh(running).cluster == cloud
    scheduler_cycle(now=t0 + timedelta(seconds=30), backends=backends)  # last seen

    # The cloud goes away; on-premises gains a100s (an operator adds a node pool: its
    # backend is rebuilt from the changed row).
    flaky.down = True
    onprem.sim_nodes = "1x8xh100,2x8xa100"
    onprem.save()
    t1 = t0 + timedelta(seconds=60)
    waiting = queued(world, gpu_type=world.a100, team=world.nlp, at=t1)
    r = scheduler_cycle(now=t1, backends=backends)
    assert r.admitted == [waiting.pk] and fresh(waiting).cluster == onprem
    assert fresh(running).status == JobState.RUNNING  # kept inside the grace

    r = scheduler_cycle(now=t1 + timedelta(seconds=grace), backends=backends)
    moved = fresh(running)
    assert moved.pk in r.requeued and moved.pk in r.admitted
    assert (moved.attempt, moved.cluster) == (2, onprem)
    onprem_backend = get_backend(Cluster.objects.get(name="onprem"))
    t2 = t1 + timedelta(seconds=grace + 1)
    assert live(onprem_backend, t2) == {waiting.backend_name, moved.backend_name}

    # The cloud answers again: its stale workload (attempt 1) is stopped, not adopted.
    flaky.down = False
    r = scheduler_cycle(now=t2, backends=backends)
    assert r.orphans_stopped == [f"fq-{moved.pk}-1"]
    assert live(flaky, t2) == set()
    assert live(onprem_backend, t2) == {waiting.backend_name, moved.backend_name}
    cloud.refresh_from_db()
    assert cloud.unreachable_since is None and cloud.last_seen_at == t2
    assert AuditEntry.objects.filter(object_type="queueing.Cluster", object_id=str(cloud.pk),
                                     action="reachable").count() == 1
    # Charged once for its first attempt (up to when the cloud was last seen), not again
    # when its stale workload was found.
    assert list(UsageRecord.objects.filter(job=moved).values_list("attempt", "gpu_seconds")) \
        == [(1, 8 * 30)]
    assert fresh(moved).status == JobState.RUNNING


def test_k5_an_admitted_job_never_created_on_an_unreachable_cluster_goes_back_at_once(
        world: World, make_cluster: MakeCluster) -> None:
    stuck = admitted_never_created(world, make_cluster)
    onprem, flaky, job, t0 = stuck.onprem, stuck.flaky, stuck.job, stuck.at
    backends = {"cloud": flaky}

    # The cloud goes away before its workload was created; on-premises has a100s now.
    flaky.down = True
    onprem.sim_nodes = "1x8xh100,1x8xa100"
    onprem.save()
    r = scheduler_cycle(now=t0 + timedelta(seconds=5), backends=backends)

    job = fresh(job)
    assert job.pk in r.requeued
    assert job.events.filter(to_status=JobState.QUEUED, attempt=2,
                             data__ended_how="cluster_unreachable").exists()
    assert not UsageRecord.objects.filter(job=job).exists()
    assert (job.attempt, job.cluster, job.status) == (2, onprem, JobState.ADMITTED)
    assert live(get_backend(onprem), t0) == {job.backend_name}


# --- the workers' other cluster calls -------------------------------------------------------

def test_logs_and_stops_reach_the_cluster_the_workload_runs_in(
        world: World, make_cluster: MakeCluster) -> None:
    from queueing.services.logs import job_log_read, job_logs_archive
    from queueing.tasks import stop_workload_task

    make_cluster("onprem", "1x8xh100")
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10)
    t0 = timezone.now()
    job = queued(world, gpu_type=world.a100)
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    job = fresh(job)
    assert job.cluster == cloud and job.status == JobState.RUNNING

    # The web's live read of the in-process clusters, and the worker's archive.
    assert job_log_read(job=job, tail=10).lines[0].endswith(f"started {job.backend_name} "
                                                            "on sim-a100-000")
    assert job_logs_archive(backend=fleet_open(), now=t0 + timedelta(seconds=2)).refreshed \
        == [job.pk]
    # A cancel's stop, sent to every cluster: only the cloud runs it.
    stop_workload_task.run(job.backend_name)
    assert live(backend_of(cloud), t0) == set()


@pytest.mark.usefixtures("no_r9")
def test_k7_a_preemption_stops_its_victim_on_the_victims_cluster_and_runs_the_preemptor_there(
        world: World, make_cluster: MakeCluster) -> None:
    onprem = make_cluster("onprem", "1x8xh100")
    cloud = make_cluster("cloud", "2x8xa100", cost_rank=10)
    t0 = timezone.now() + timedelta(seconds=1)
    fill = [queued(world, gpu_type=world.a100, tier=world.low, at=t0 - timedelta(seconds=9))
            for _ in range(2)]  # vision borrows the cloud's second 8 a100s
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert {fresh(j).status for j in fill} == {JobState.RUNNING}
    h = queued(world, gpu_type=world.h100, team=world.speech)
    hi = queued(world, gpu_type=world.a100, tier=world.high, team=world.nlp)

    r = scheduler_cycle(now=t0 + timedelta(seconds=100))

    assert fresh(h).cluster == onprem  # the other cluster's admissions go on meanwhile
    (victim,) = [fresh(j) for j in fill if j.pk in r.preempted]
    assert (victim.status, victim.attempt) == (JobState.QUEUED, 2)
    assert live(backend_of(cloud), t0 + timedelta(seconds=100)) == {
        fresh(j).backend_name for j in fill if j.pk != victim.pk}
    r = scheduler_cycle(now=t0 + timedelta(seconds=101))
    hi = fresh(hi)
    assert hi.pk in r.admitted and hi.cluster == cloud
    assert hi.placement[0] in {n.name for n in backend_of(cloud).nodes()}
    assert hi.backend_name in live(backend_of(cloud), t0 + timedelta(seconds=101))


def test_gpu_readings_come_from_every_cluster_once_a_minute(
        world: World, make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    from queueing.backends.simulated import SimulatedCluster
    from queueing.models import UtilizationSample

    reads: list[int] = []
    real = SimulatedCluster.readings

    def counted(self: SimulatedCluster, *, now: datetime) -> list[Any]:
        reads.append(len(self.nodes()))
        return real(self, now=now)

    monkeypatch.setattr(SimulatedCluster, "readings", counted)

    make_cluster("onprem", "1x8xh100")
    make_cluster("cloud", "1x8xa100", cost_rank=10)
    t0 = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=10)
    h = queued(world, gpu_type=world.h100, env={"FAIRQ_SIM_GPU_UTIL": "40"})
    a = queued(world, gpu_type=world.a100, env={"FAIRQ_SIM_GPU_UTIL": "90"})
    for second in (1, 2, 30, 61, 62, 90, 121):  # minutes 0, 1 and 2: one read each
        scheduler_cycle(now=t0 + timedelta(seconds=second))
    samples = list(UtilizationSample.objects.order_by("job_id", "minute").values_list(
        "job_id", "minute", "sm"))
    # (Minute 0 was read as the jobs were admitted, before fairq saw them running.)
    assert samples == [(h.pk, t0 + timedelta(minutes=1), 40.0),
                       (h.pk, t0 + timedelta(minutes=2), 40.0),
                       (a.pk, t0 + timedelta(minutes=1), 90.0),
                       (a.pk, t0 + timedelta(minutes=2), 90.0)]
    assert len(reads) == 2 * 3  # each cluster, once in each of the three minutes


def test_before_the_worker_publishes_the_web_sees_every_in_process_cluster(
        world: World, make_cluster: MakeCluster) -> None:
    make_cluster("onprem", "1x8xh100")
    spot = make_cluster("cloud-spot", "1x8xa100", cost_rank=5)
    spot_pool(spot, world.a100)

    view = cluster_view()

    assert view.published_at is not None and not view.error
    assert sorted((n.cluster, n.name, n.spot) for n in view.nodes()) == [
        ("cloud-spot", "sim-a100-000", True), ("onprem", "sim-h100-000", False)]
    assert view.largest_node_gpus() == {"h100": 8, "a100": 8}


def test_k1_a_preempted_job_is_in_no_cluster_until_it_is_admitted_again(
        world: World, make_cluster: MakeCluster, no_r9: None) -> None:
    """Rule R6's requeue clears where the attempt ran (its cluster and spot flag), as
    rules K5 and K6 do: a queued job is in no cluster."""
    from queueing.models import Quota

    onprem = make_cluster("onprem", "1x8xh100")
    # Vision borrows the 8 GPUs (rule Q2: a team's nominal is never taken by another's tier).
    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(nominal=0)
    now = timezone.now()
    victim = queued(world, gpu_type=world.h100, tier=world.low, at=now - timedelta(hours=1))
    scheduler_cycle(now=now)
    scheduler_cycle(now=now + timedelta(seconds=1))
    assert fresh(victim).status == JobState.RUNNING and fresh(victim).cluster == onprem
    preemptor = queued(world, gpu_type=world.h100, tier=world.high, team=world.nlp)
    r = scheduler_cycle(now=now + timedelta(minutes=30))
    requeued = fresh(victim)
    assert r.preempted == [victim.pk], r.plan.waits[preemptor.pk] if r.plan else r
    assert requeued.status == JobState.QUEUED and requeued.attempt == 2
    assert requeued.cluster is None and requeued.placement == [] and not requeued.on_spot
    # Charged where it ran: the usage record keeps the cluster.
    assert UsageRecord.objects.get(job=victim, attempt=1).cluster == onprem
