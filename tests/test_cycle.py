"""The scheduler cycle on the simulated cluster: lifecycle, charging, admission limits.

Time is driven explicitly: every cycle gets `now`, and so does the simulated cluster.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.composition import get_backend, reset_backends
from queueing.models import FairShareAccumulator, Job, JobEvent, Quota, UsageRecord
from queueing.policy.admission import WaitReason
from queueing.policy.states import IllegalTransition, JobState
from queueing.services.jobs import job_cancel, job_transition
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body
from .factories import JobFactory

pytestmark = pytest.mark.django_db


def submit(world: World, user: Any = None, *, at: datetime | None = None,
           **overrides: Any) -> int:
    """Submit through the API; `at` back-dates the submission (and its event)."""
    r = world.client(user or world.member).post("/api/v1/jobs/", job_body(**overrides),
                                                 format="json")
    assert r.status_code == 201, r.json()
    job_id = int(r.json()["id"])
    if at is not None:
        Job.objects.filter(pk=job_id).update(created_at=at)
        JobEvent.objects.filter(job_id=job_id).update(at=at)
    return job_id


def status(job_id: int) -> str:
    return Job.objects.get(pk=job_id).status


def test_a_job_goes_queued_admitted_running_succeeded_and_is_charged(world: World) -> None:
    t0 = timezone.now() - timedelta(minutes=5)
    job_id = submit(world, at=t0 - timedelta(seconds=1), env={"FAIRQ_SIM_SECONDS": "60"})
    assert status(job_id) == "QUEUED"

    r = scheduler_cycle(now=t0)
    assert r.admitted == [job_id] and status(job_id) == "ADMITTED"
    job = Job.objects.get(pk=job_id)
    assert job.submitted_to_backend_at == t0 and len(job.placement) == 1

    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert status(job_id) == "RUNNING"
    assert Job.objects.get(pk=job_id).started_at == t0

    scheduler_cycle(now=t0 + timedelta(seconds=61))
    job = Job.objects.get(pk=job_id)
    assert job.status == "SUCCEEDED" and job.exit_code == 0
    assert job.finished_at == t0 + timedelta(seconds=60)
    events = list(job.events.values_list("from_status", "to_status"))
    assert events == [("", "QUEUED"), ("QUEUED", "ADMITTED"), ("ADMITTED", "RUNNING"),
                      ("RUNNING", "SUCCEEDED")]

    usage = UsageRecord.objects.get(job=job)
    assert usage.gpu_seconds == 2 * 60 and usage.gpus == 2 and usage.billing_weight == 2.0

    # The fair-share endpoint shows the decayed weighted GPU-hours (rule F1, closed form).
    body = world.client(world.staff).get("/api/v1/fairshare/").json()
    as_of = datetime.fromisoformat(body["as_of"])
    vision = next(t for t in body["teams"] if t["team"] == "vision")
    h = 168.0
    end_age = (as_of - (t0 + timedelta(seconds=60))).total_seconds() / 3600
    start_age = (as_of - t0).total_seconds() / 3600
    expected = 2 * 2.0 * h / math.log(2) * (2 ** (-end_age / h) - 2 ** (-start_age / h))
    assert vision["usage_gpu_hours"] == pytest.approx(expected, rel=1e-9)
    assert vision["usage_gpu_hours"] == pytest.approx(4 * 60 / 3600, rel=1e-3)
    # Vision is the only active team (rule F2: usage or queued work), so S = 1, U = 1.
    assert vision["share"] == 1.0 and vision["normalized_usage"] == 1.0
    assert vision["fair_share_factor"] == pytest.approx(0.5)
    nlp = next(t for t in body["teams"] if t["team"] == "nlp")
    assert nlp["usage_gpu_hours"] == 0 and nlp["fair_share_factor"] == 1.0
    # ...and the workload's record is gone from the cluster once the job is final.
    scheduler_cycle(now=t0 + timedelta(seconds=62))
    assert get_backend().statuses(now=t0 + timedelta(seconds=62)) == []


def test_a_failing_job_fails_with_its_exit_code_and_is_charged(world: World) -> None:
    t0 = timezone.now()
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "10", "FAIRQ_SIM_EXIT_CODE": "3"})
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=11))
    job = Job.objects.get(pk=job_id)
    assert job.status == "FAILED" and job.exit_code == 3
    assert "exit code 3" in job.events.last().reason
    assert UsageRecord.objects.get(job=job).gpu_seconds == 20


def test_admission_respects_node_capacity(world: World) -> None:
    """The test cluster has 2 × 8 h100: three 8-GPU jobs, two run, one waits."""
    t0 = timezone.now()
    ids = [submit(world, world.member, gpus=8),
           submit(world, world.outsider, team="nlp", gpus=8),
           submit(world, world.staff, team="speech", gpus=8)]
    r = scheduler_cycle(now=t0)
    assert len(r.admitted) == 2
    waiting = [i for i in ids if status(i) == "QUEUED"]
    assert len(waiting) == 1
    assert r.plan is not None and r.plan.waits[waiting[0]].reason == WaitReason.CAPACITY
    assert sum(n.allocated for n in get_backend().nodes() if n.gpu_type == "h100") == 16


def test_admission_respects_the_team_quota_nominal_plus_borrowing(world: World) -> None:
    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(nominal=2,
                                                                       borrowing_limit=2)
    ids = [submit(world, gpus=1, name=f"j{i}") for i in range(5)]
    r = scheduler_cycle(now=timezone.now())
    assert sorted(r.admitted) == ids[:4]
    assert r.plan is not None and r.plan.waits[ids[4]].reason == WaitReason.QUOTA
    assert status(ids[4]) == "QUEUED"


def test_an_empty_borrowing_limit_means_no_ceiling(world: World) -> None:
    Quota.objects.filter(team=world.vision, gpu_type=world.a100).update(nominal=1,
                                                                       borrowing_limit=None)
    ids = [submit(world, gpu_type="a100", gpus=8, name=f"j{i}") for i in range(2)]
    assert sorted(scheduler_cycle(now=timezone.now()).admitted) == ids


def test_a_gang_is_admitted_whole_or_not_at_all(world: World) -> None:
    t0 = timezone.now()
    # Two 4-GPU jobs: best fit packs them on one node, the other stays empty.
    small = [submit(world, gpus=4, name=f"s{i}", env={"FAIRQ_SIM_SECONDS": "30"})
             for i in range(2)]
    scheduler_cycle(now=t0)
    placements = [Job.objects.get(pk=i).placement for i in small]
    assert placements[0] == placements[1]
    # A 2 × 6 gang needs two nodes with 6 free: only one has. Nothing of it is placed.
    gang = submit(world, world.outsider, team="nlp", gpus=6, replicas=2,
                  env={"FAIRQ_SIM_SECONDS": "30"})
    r = scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert gang not in r.admitted and status(gang) == "QUEUED"
    assert Job.objects.get(pk=gang).placement == []
    assert sum(n.allocated for n in get_backend().nodes()) == 8
    # When the small jobs finish, the whole gang starts across both nodes.
    scheduler_cycle(now=t0 + timedelta(seconds=31))
    job = Job.objects.get(pk=gang)
    assert job.status == "ADMITTED" and len(set(job.placement)) == 2


def test_a_gang_larger_than_the_cluster_waits_with_a_reason(world: World) -> None:
    # a100: no quota ceiling. Submit refuses such a gang (rule E6); this one was queued
    # when the cluster had more a100 nodes.
    gang = JobFactory(team=world.vision, submitter=world.member, gpu_type=world.a100,
                      tier=world.normal, gpus_per_replica=8, replicas=3).pk
    r = scheduler_cycle(now=timezone.now())
    assert r.admitted == [] and r.plan is not None
    wait = r.plan.waits[gang]
    assert wait.reason == WaitReason.NO_FIT
    # (A row of before every job had memory: the nodes' GPUs alone say it cannot fit.)
    assert wait.message == ("even empty, the a100 nodes hold at most 2 replicas of 8 GPUs; "
                            "this gang needs 3")
    assert sum(n.allocated for n in get_backend().nodes()) == 0


def test_the_team_below_its_fair_share_goes_first(world: World) -> None:
    now = timezone.now()
    FairShareAccumulator.objects.create(team=world.nlp, value=100.0, as_of=now)
    first = submit(world, world.outsider, team="nlp", gpus=8, replicas=2, name="nlp-big")
    later = submit(world, world.member, gpus=8, replicas=2, name="vision-big")
    r = scheduler_cycle(now=now)
    assert r.admitted == [later] and status(first) == "QUEUED"


def test_a_higher_tier_goes_before_a_better_fair_share(world: World) -> None:
    now = timezone.now()
    FairShareAccumulator.objects.create(team=world.nlp, value=100.0, as_of=now)
    high = submit(world, world.outsider, team="nlp", gpus=8, replicas=2, tier="high")
    normal = submit(world, world.member, gpus=8, replicas=2, tier="normal")
    assert scheduler_cycle(now=now).admitted == [high] and status(normal) == "QUEUED"


def test_cancelling_a_running_job_charges_its_time_and_frees_its_gpus(
    world: World, django_capture_on_commit_callbacks: Any
) -> None:
    t0 = timezone.now() - timedelta(minutes=1)
    job_id = submit(world, gpus=8, env={"FAIRQ_SIM_SECONDS": "600"})
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert status(job_id) == "RUNNING"
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(actor=world.admin, job=Job.objects.get(pk=job_id),
                   now=t0 + timedelta(seconds=30))
    job = Job.objects.get(pk=job_id)
    assert job.status == "CANCELLED" and job.finished_at == t0 + timedelta(seconds=30)
    assert UsageRecord.objects.get(job=job).gpu_seconds == 8 * 30
    assert sum(n.allocated for n in get_backend().nodes()) == 0


def test_a_workload_left_behind_by_a_cancel_is_stopped_by_the_next_cycle(world: World) -> None:
    """The stop task may be lost (worker died): reconcile ends workloads no job owns."""
    t0 = timezone.now()
    job_id = submit(world, gpus=8, env={"FAIRQ_SIM_SECONDS": "600"})
    scheduler_cycle(now=t0)
    job_cancel(actor=world.admin, job=Job.objects.get(pk=job_id), now=t0)  # no on_commit
    assert sum(n.allocated for n in get_backend().nodes()) == 8
    r = scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert r.orphans_stopped == [f"fq-{job_id}-1"]
    assert sum(n.allocated for n in get_backend().nodes()) == 0


def test_an_admitted_job_whose_workload_vanished_is_requeued(world: World) -> None:
    t0 = timezone.now()
    job_id = submit(world, gpus=2)
    scheduler_cycle(now=t0)
    reset_backends()  # the cluster forgot everything (e.g. the simulated worker restarted)
    scheduler_cycle(now=t0 + timedelta(seconds=5))
    assert status(job_id) == "ADMITTED"  # within the grace period: not yet
    r = scheduler_cycle(now=t0 + timedelta(seconds=20))
    job = Job.objects.get(pk=job_id)
    assert job_id in r.requeued or job.attempt == 2
    assert job.attempt == 2
    requeue = job.events.get(from_status="ADMITTED", to_status="QUEUED")
    assert "vanished" in requeue.reason
    # The same cycle admitted it again as attempt 2, under a new workload name.
    assert job.status == "ADMITTED"
    assert [s.name for s in get_backend().statuses(now=t0 + timedelta(seconds=21))] == \
        [f"fq-{job_id}-2"]


def test_a_running_job_whose_workload_vanished_fails_and_frees_its_quota(world: World) -> None:
    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(nominal=8,
                                                                       borrowing_limit=0)
    t0 = timezone.now() - timedelta(minutes=1)
    job_id = submit(world, gpus=8, at=t0 - timedelta(seconds=1),
                    env={"FAIRQ_SIM_SECONDS": "600"})
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert status(job_id) == "RUNNING"
    reset_backends()  # e.g. the demo restarted: its in-memory cluster is empty
    scheduler_cycle(now=t0 + timedelta(seconds=5))
    assert status(job_id) == "RUNNING"  # within the grace period
    scheduler_cycle(now=t0 + timedelta(seconds=30))
    job = Job.objects.get(pk=job_id)
    assert job.status == "FAILED"
    assert "disappeared while running" in job.events.last().reason
    assert UsageRecord.objects.get(job=job).gpu_seconds == 8 * 30
    # Its GPUs no longer count against the team: a new job of the same size is admitted.
    again = submit(world, gpus=8, name="again")
    assert again in scheduler_cycle(now=t0 + timedelta(seconds=31)).admitted


def test_a_workload_that_fails_before_it_starts_fails_without_a_running_event(
    world: World,
) -> None:
    """An image that cannot be pulled: the job never ran, so no RUNNING and no usage."""
    from dataclasses import replace

    from queueing.backends.base import Phase
    from queueing.backends.simulated import SimulatedCluster

    class PullErrorCluster(SimulatedCluster):
        def statuses(self, *, now: datetime) -> list[Any]:
            return [replace(s, phase=Phase.FAILED, started_at=None, finished_at=now,
                            reason="image pull failed past the timeout")
                    for s in super().statuses(now=now)]

    cluster = PullErrorCluster.from_spec("1x8xh100")
    t0 = timezone.now()
    job_id = submit(world, at=t0 - timedelta(seconds=1))
    scheduler_cycle(now=t0, backend=cluster)
    scheduler_cycle(now=t0 + timedelta(seconds=1), backend=cluster)
    job = Job.objects.get(pk=job_id)
    assert job.status == "FAILED" and job.started_at is None
    assert list(job.events.values_list("from_status", "to_status")) == [
        ("", "QUEUED"), ("QUEUED", "ADMITTED"), ("ADMITTED", "FAILED")]
    assert "image pull" in job.events.last().reason
    assert not UsageRecord.objects.filter(job=job).exists()


def test_a_retried_submit_after_a_killed_worker_creates_no_second_workload(world: World) -> None:
    from queueing.policy.admission import plan_admissions
    from queueing.selectors.snapshot import build_snapshot
    from queueing.services.scheduler import apply_plan, launch_spec

    t0 = timezone.now()
    job_id = submit(world, gpus=2)
    backend = get_backend()
    apply_plan(plan=plan_admissions(build_snapshot(backend=backend, now=t0)), now=t0)
    job = Job.objects.select_related("team", "tier", "gpu_type").get(pk=job_id)
    backend.submit(launch_spec(job), now=t0)  # ...and the worker dies before saving that
    assert job.submitted_to_backend_at is None
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert len(backend.statuses(now=t0 + timedelta(seconds=1))) == 1
    assert status(job_id) == "RUNNING"
    assert sum(n.allocated for n in backend.nodes()) == 2


def test_an_illegal_transition_raises_and_changes_nothing(world: World) -> None:
    from django.db import transaction

    job_id = submit(world)
    job = Job.objects.get(pk=job_id)
    before = (job.status, job.updated_at, JobEvent.objects.count())
    # (QUEUED -> FAILED is legal: a job fairq could not process, tests/test_poison.py.)
    for target in (JobState.RUNNING, JobState.SUCCEEDED, JobState.PREEMPTED, JobState.QUEUED):
        with pytest.raises(IllegalTransition), transaction.atomic():
            job_transition(job, target, now=timezone.now())
    job.refresh_from_db()
    assert (job.status, job.updated_at, JobEvent.objects.count()) == before


def test_a_stale_transition_loses_the_compare_and_swap(world: World) -> None:
    from django.db import transaction

    job_id = submit(world)
    stale = Job.objects.get(pk=job_id)
    fresh = Job.objects.get(pk=job_id)
    with transaction.atomic():
        assert job_transition(fresh, JobState.CANCELLED, now=timezone.now())
    with transaction.atomic():
        assert not job_transition(stale, JobState.ADMITTED, now=timezone.now())
    assert status(job_id) == "CANCELLED"
    assert Job.objects.get(pk=job_id).events.filter(to_status="ADMITTED").count() == 0


def test_workloads_left_behind_are_charged_once_with_one_usage_query(world: World) -> None:
    """Workloads no job holds that ran (three cancels whose stop was lost): whether their
    attempts are charged is one query for all of them, not one per workload per cycle;
    they were charged at the cancel, so nothing is charged twice."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    t0 = timezone.now()
    ids = [submit(world, gpus=2, env={"FAIRQ_SIM_SECONDS": "600"}) for _ in range(3)]
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert [status(i) for i in ids] == ["RUNNING"] * 3
    for i in ids:  # no on_commit: the stop is lost
        job_cancel(actor=world.admin, job=Job.objects.get(pk=i), now=t0 + timedelta(seconds=30))
    charged = UsageRecord.objects.count()
    with CaptureQueriesContext(connection) as ctx:
        r = scheduler_cycle(now=t0 + timedelta(seconds=31))
    assert sorted(r.orphans_stopped) == sorted(f"fq-{i}-1" for i in ids)
    usage_reads = [q["sql"] for q in ctx.captured_queries
                   if "queueing_usagerecord" in q["sql"] and q["sql"].startswith("SELECT")]
    assert len(usage_reads) == 1, usage_reads
    assert UsageRecord.objects.count() == charged
