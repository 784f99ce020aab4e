"""Shared GPUs in the scheduler cycle (docs/scheduling.md, rules H1, H3, H5): the live
snapshot counts a time-sliced type in slices, the cycle stores each fraction's GPU on
the job, the next snapshot rebuilds each GPU's free slices from them, and "why is my
job pending" says the per-GPU wait. PostgreSQL and the simulated backend."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.composition import get_backend, reset_backends
from queueing.models import Job, JobEvent, Quota
from queueing.policy.admission import WaitReason
from queueing.selectors.cluster import cluster_view
from queueing.selectors.fairshare import job_priority_breakdown
from queueing.selectors.queue_plan import queue_plan_forget, queue_standing
from queueing.services.jobs import next_attempt
from queueing.services.scheduler import scheduler_cycle

from .conftest import World
from .factories import GpuTypeFactory, JobFactory, QuotaFactory

pytestmark = pytest.mark.django_db

S = 4  # slices per GPU of the time-sliced type
GPUS = 3  # on its one node


@pytest.fixture
def shared(world: World, settings: Any) -> Any:
    """One node of 3 GPUs of a time-sliced type (4 slices per GPU), vision's quota 4
    GPUs of it (more than the node: waits are for capacity). The simulated backend
    reports a node in the type's units (slices) once it multiplies FAIRQ_SIM_NODES' GPUs
    by the type's units per device; until then the node is given in slices here."""
    ts = GpuTypeFactory(slug="ts-a10", sharing="time-sliced", slices_per_gpu=S,
                        resource_name="nvidia.com/gpu.shared", billing_weight=1.0)
    QuotaFactory(team=world.vision, gpu_type=ts, nominal=GPUS + 1, borrowing_limit=0)
    settings.FAIRQ_SIM_NODES = f"1x{GPUS}xts-a10"
    reset_backends()
    if get_backend().nodes()[0].capacity == GPUS:  # the backend counts GPUs, not slices
        settings.FAIRQ_SIM_NODES = f"1x{GPUS * S}xts-a10"
        reset_backends()
    assert get_backend().nodes()[0].capacity == GPUS * S
    queue_plan_forget()
    return ts


def job(world: World, ts: Any, *, slices: int = 0, gpus: int = 1, age: int = 0) -> int:
    """A queued job of vision on the time-sliced type: a fraction of `slices` of 4, or
    `gpus` whole GPUs; `age` seconds older than the others."""
    return JobFactory(team=world.vision, submitter=world.member, gpu_type=ts,
                      tier=world.normal, gpus_per_replica=gpus, gpu_slices=slices,
                      created_at=timezone.now() - timedelta(seconds=100 + age),
                      env={"FAIRQ_SIM_SECONDS": "3600"}).pk


def slots(job_id: int) -> list[int]:
    return list(Job.objects.get(pk=job_id).gpu_slots)


def test_rule_h3_halves_share_a_gpu_and_a_whole_gpu_takes_a_free_one(
        world: World, shared: Any) -> None:
    a = job(world, shared, slices=2, age=50)
    b = job(world, shared, slices=2, age=40)
    c = job(world, shared, slices=2, age=30)
    whole = job(world, shared, gpus=1, age=20)
    now = timezone.now()
    r = scheduler_cycle(now=now)
    assert sorted(r.admitted) == sorted([a, b, c, whole])
    # Two halves on one GPU, the third opens the next, the whole GPU the wholly free one.
    assert slots(a) == slots(b) == [0]
    assert slots(c) == [1]
    assert slots(whole) == [2]
    event = JobEvent.objects.get(job_id=a, to_status="ADMITTED")
    assert event.reason.endswith("; GPU 0 (2 slices of 4 each)")
    assert event.data["gpu_slots"] == [0]

    # The next cycle's snapshot rebuilds each GPU's free slices from the jobs' slots:
    # a quarter goes onto GPU 1 (2 free, shared) and a second whole GPU waits.
    quarter = job(world, shared, slices=1, age=10)
    second_whole = job(world, shared, gpus=1, age=5)
    r2 = scheduler_cycle(now=now + timedelta(seconds=1))
    assert r2.admitted == [quarter]
    assert slots(quarter) == [1]
    assert Job.objects.get(pk=second_whole).status == "QUEUED"

    # Why pending (rule H5): no GPU is wholly free.
    queue_plan_forget()
    standing = queue_standing(job_id=second_whole, now=now + timedelta(seconds=2))
    capacity = next(x for x in standing["reasons"] if x["code"] == "capacity")
    assert capacity["message"].startswith(
        "waiting for 1 × 1 whole GPU of ts-a10, wholly free (no GPU shared by fractions)")
    assert "the most wholly free ts-a10 GPUs on one node: 0" in capacity["message"]


def test_rule_h5_why_pending_says_the_most_free_slices_on_one_gpu(
        world: World, shared: Any) -> None:
    # Three jobs of 3 slices of 4: one per GPU (none fits beside another), 1 slice free
    # on each: a half does not fit, though the node has 3 free slices.
    for i in range(3):
        job(world, shared, slices=3, age=90 - i)
    half = job(world, shared, slices=2, age=0)
    now = timezone.now()
    r = scheduler_cycle(now=now)
    assert half not in r.admitted
    assert [slots(j) for j in sorted(r.admitted)] == [[0], [1], [2]]
    queue_plan_forget()
    standing = queue_standing(job_id=half, now=now + timedelta(seconds=1))
    capacity = next(x for x in standing["reasons"] if x["code"] == "capacity")
    assert capacity["message"] == (
        "waiting for 1 × 2 slices of 4 (0.5 GPU) of one ts-a10 GPU; no ts-a10 GPU has 2 "
        "free slices; the most on one GPU is 1 (on sim-ts-a10-000; 3 slices free in all); "
        # Rule R11 in GPUs too (H4): its team holds 2.25 of its 4 nominal GPUs, all of
        # them its own jobs of its tier.
        "it is owed 0.5 of team vision's 4 nominal ts-a10 GPUs (rule R11), but the jobs it "
        "may preempt (rules R1, R2) cannot make room for it")
    # Rule P1's size (H4): 0.5 GPU of a cluster of 3 GPUs (12 slices), as the plan has it.
    assert cluster_view(now=now).total_gpus() == 3.0
    breakdown = job_priority_breakdown(job=Job.objects.get(pk=half), now=now,
                                       cluster_gpus=cluster_view(now=now).total_gpus())
    assert breakdown.size == pytest.approx(0.5 / 3)


def test_rule_h1_quota_counts_slices_and_a_requeue_clears_the_slots(
        world: World, shared: Any) -> None:
    # Nominal 2 GPUs = 8 slices: eight quarters, not a ninth (the node has 12 slices).
    Quota.objects.filter(team=world.vision, gpu_type=shared).update(nominal=2)
    quarters = [job(world, shared, slices=1, age=100 - i) for i in range(9)]
    r = scheduler_cycle(now=timezone.now())
    assert len(r.admitted) == 8 and quarters[-1] not in r.admitted
    assert r.plan is not None and r.plan.waits[quarters[-1]].reason == WaitReason.QUOTA
    # Four quarters per GPU: best fit fills GPU 0 before opening GPU 1.
    assert sorted(slots(j)[0] for j in r.admitted) == [0] * 4 + [1] * 4
    assert next_attempt(2)["gpu_slots"] == []


def test_rule_h1_a_job_without_recorded_gpus_is_put_where_the_plan_would() -> None:
    from queueing.policy.snapshot import RunningJob
    from queueing.selectors.snapshot import packed_gpus

    def r(job_id: int, units: int, slots: tuple[int, ...] = ()) -> RunningJob:
        return RunningJob(job_id, "a", "ts-a10", units, 1, 0, nodes=("n",), gpu_slots=slots)

    running = (r(1, 2, (0,)), r(2, 1), r(3, 4), RunningJob(4, "a", "h100", 8, 1, 0,
                                                           nodes=("h",)))
    out, free = packed_gpus(running, {"n": (12, 4)})
    # Job 1 holds 2 slices of GPU 0; then, largest first, the whole GPU on the lowest
    # wholly free GPU (1), the quarter on the shared GPU with the fewest free (0).
    assert free == {"n": (1, 0, 4)}
    assert [j.gpu_slots for j in out] == [(0,), (0,), (1,), ()]
    assert out[3] is running[3]


def test_rule_h5_the_submit_preview_plans_a_fraction_in_slices(
        world: World, shared: Any) -> None:
    from queueing.selectors.queue_plan import submit_preview
    for i in range(3):
        job(world, shared, slices=3, age=90 - i)
    now = timezone.now()
    scheduler_cycle(now=now)
    queue_plan_forget()
    half = submit_preview(team=world.vision, gpu_type=shared, gpus_per_replica=1, replicas=1,
                          tier_rank=world.normal.rank, now=now, gpu_slices=2)
    assert not half.admitted_next
    assert "no ts-a10 GPU has 2 free slices; the most on one GPU is 1" in half.reason
    quarter = submit_preview(team=world.vision, gpu_type=shared, gpus_per_replica=1,
                             replicas=1, tier_rank=world.normal.rank, now=now, gpu_slices=1)
    assert quarter.admitted_next
