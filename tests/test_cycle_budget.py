"""A scheduler cycle bounds its own work (FAIRQ_CYCLE_BUDGET_SECONDS, services/scheduler.py
`Budget`), so its task's time limit never cuts it half-way: what does not fit is left
for the next cycle, which is kicked at once; and its decisions are applied in one
transaction, so a cycle interrupted there has applied none of them.

The simulated cluster, made slow where the real one is under load (a create, a status
write), on the real database.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection
from django.utils import timezone

from queueing.backends.simulated import SimulatedCluster
from queueing.models import Job, JobEvent
from queueing.services import scheduler
from queueing.services.scheduler import scheduler_cycle

from .conftest import World
from .test_cycle import submit

pytestmark = pytest.mark.django_db

CREATE_SECONDS = 0.1


@pytest.fixture
def slow_creates(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each create on the simulated cluster takes CREATE_SECONDS (an API server under
    load); returns the workload names created, in order."""
    created: list[str] = []
    real = SimulatedCluster.submit

    def submit_slowly(self: SimulatedCluster, spec: Any, *, now: Any) -> None:
        time.sleep(CREATE_SECONDS)
        created.append(spec.name)
        real(self, spec, now=now)

    monkeypatch.setattr(SimulatedCluster, "submit", submit_slowly)
    return created


def test_a_cycle_with_more_submits_than_its_budget_ends_within_it_and_the_next_does_the_rest(
    world: World, settings: Any, slow_creates: list[str],
) -> None:
    settings.FAIRQ_CYCLE_BUDGET_SECONDS = 0.5
    settings.FAIRQ_CYCLE_SUBMIT_CHUNK = 2
    t0 = timezone.now()
    jobs = [submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "600"}) for _ in range(12)]

    r = scheduler_cycle(now=t0)
    # Every decision applied (12 admissions, one transaction) ...
    assert sorted(r.admitted) == sorted(jobs)
    assert Job.objects.filter(pk__in=jobs, status="ADMITTED").count() == 12
    # ... but only the creates that fit: step 5 goes on past the budget towards the 12
    # admitted, for at most `SUBMIT_SCALED_MAX` of the budget from its start (1.2 s of
    # creates do not fit in 0.75 s), so the cycle ends at most one chunk (2 creates)
    # after that bound.
    step = r.timings["total"] - r.timings["submit_create"] - r.timings["submit_publish"]
    assert r.timings["submit_create"] < 0.5 * scheduler.SUBMIT_SCALED_MAX \
        + 2 * CREATE_SECONDS + 0.3, r.timings
    assert r.timings["total"] < step + 0.5 * scheduler.SUBMIT_SCALED_MAX \
        + 2 * CREATE_SECONDS + 0.5, r.timings
    assert 0 < len(slow_creates) < 12
    assert r.deferred == {"submit": 12 - len(slow_creates)}
    assert Job.objects.filter(pk__in=jobs, submitted_to_backend_at__isnull=True).count() \
        == 12 - len(slow_creates)

    # The next cycles submit the rest, the longest admitted first, each job once.
    for i in range(1, 12):
        if not Job.objects.filter(pk__in=jobs, submitted_to_backend_at__isnull=True).exists():
            break
        r = scheduler_cycle(now=t0 + timedelta(seconds=i))
        # The jobs an earlier cycle admitted count as this one's: the same bound.
        assert not r.admitted
        assert r.timings["submit_create"] < 0.5 * scheduler.SUBMIT_SCALED_MAX \
            + 2 * CREATE_SECONDS + 0.3, r.timings
    assert not Job.objects.filter(pk__in=jobs, submitted_to_backend_at__isnull=True).exists()
    assert sorted(slow_creates) == sorted(f"fq-{pk}-1" for pk in jobs)
    assert slow_creates == [f"fq-{pk}-1" for pk in sorted(jobs)]


@pytest.mark.parametrize("batched", [False, True])
def test_a_cycle_whose_status_changes_overrun_its_budget_leaves_the_rest_for_the_next(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch, batched: bool,
) -> None:
    """One job at a time (`_apply_status`), and on PostgreSQL in batches of the common
    changes (`_apply_common`, here a chunk of one job each) alike."""
    t0, jobs = _ten_running(world, monkeypatch, batched=batched)

    real, real_batch = scheduler._apply_status, scheduler.jobs_transition_batch

    def slow_apply(*args: Any, **kwargs: Any) -> None:
        time.sleep(0.1)  # one job's status write on a loaded database
        real(*args, **kwargs)

    def slow_batch(changes: Any, **kwargs: Any) -> Any:
        if changes:
            time.sleep(0.1)  # one chunk's write on a loaded database
        return real_batch(changes, **kwargs)

    monkeypatch.setattr(scheduler, "_apply_status", slow_apply)
    monkeypatch.setattr(scheduler, "jobs_transition_batch", slow_batch)
    if batched:  # (a chunk's common changes are written together, whatever the budget)
        monkeypatch.setattr(scheduler, "STATUS_BATCH_CHUNK", 1)
    settings.FAIRQ_CYCLE_BUDGET_SECONDS = 1.0  # step 1 takes no new job past 0.4 s
    r = scheduler_cycle(now=t0 + timedelta(seconds=61))  # all ten finished
    assert r.timings["reconcile"] < 0.4 + 0.1 + 0.3, r.timings
    done = Job.objects.filter(pk__in=jobs, status="SUCCEEDED").count()
    assert 0 < done < 10 and sorted(r.finished) == sorted(
        Job.objects.filter(pk__in=jobs, status="SUCCEEDED").values_list("pk", flat=True))
    assert r.deferred == {"reconcile": 10 - done}
    # Each job moved whole or not at all: a finished one is charged, the others are not.
    for job in Job.objects.filter(pk__in=jobs):
        assert job.usage_records.exists() == (job.status == "SUCCEEDED")

    for i in range(2, 12):
        if Job.objects.filter(pk__in=jobs, status="SUCCEEDED").count() == 10:
            break
        scheduler_cycle(now=t0 + timedelta(seconds=60 + i))
    assert Job.objects.filter(pk__in=jobs, status="SUCCEEDED").count() == 10
    assert JobEvent.objects.filter(job_id__in=jobs, to_status="SUCCEEDED").count() == 10


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("floor", [0.0, 5.0])
def test_step_1_keeps_its_floor_after_listing_the_workloads_spent_its_share(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch, batched: bool,
    floor: float,
) -> None:
    """Listing and cleaning the workloads alone spent step 1's share of the budget (a
    big fleet on a loaded machine): its status changes are still written for
    `RECONCILE_FLOOR` of the budget from the first chunk's start, not one chunk. With no
    floor, one chunk (here one job) and the rest left for the next cycle."""
    t0, _ = _ten_running(world, monkeypatch, batched=batched)

    real = scheduler._clean_statuses

    def slow_clean(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)  # the workloads of a big fleet, listed and cleaned
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduler, "_clean_statuses", slow_clean)
    monkeypatch.setattr(scheduler, "STATUS_CHUNK", 1)
    monkeypatch.setattr(scheduler, "STATUS_BATCH_CHUNK", 1)
    monkeypatch.setattr(scheduler, "RECONCILE_FLOOR", floor)
    settings.FAIRQ_CYCLE_BUDGET_SECONDS = 1.0  # step 1's share, 0.4 s, spent by the listing
    r = scheduler_cycle(now=t0 + timedelta(seconds=61))  # all ten finished
    if floor:  # 5 s from the first chunk: every change
        assert len(r.finished) == 10 and "reconcile" not in r.deferred, r.deferred
    else:
        assert len(r.finished) == 1 and r.deferred["reconcile"] == 9, r.deferred


def test_a_cycle_interrupted_while_applying_its_plan_has_applied_none_of_it(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = timezone.now()
    jobs = [submit(world, gpus=1) for _ in range(5)]

    def time_limit(**kwargs: Any) -> list[int]:
        raise SoftTimeLimitExceeded()  # the task's soft limit, after the admissions

    monkeypatch.setattr(scheduler, "dependencies_fail_never_met", time_limit)
    with pytest.raises(SoftTimeLimitExceeded):
        scheduler_cycle(now=t0)
    assert Job.objects.filter(pk__in=jobs, status="QUEUED").count() == 5
    assert not JobEvent.objects.filter(job_id__in=jobs, to_status="ADMITTED").exists()

    monkeypatch.undo()
    r = scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert sorted(r.admitted) == sorted(jobs)


def test_victims_past_the_budget_are_left_to_the_next_cycles_reconcile(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch, no_r9: None,
) -> None:
    t0 = timezone.now() - timedelta(minutes=5)
    low = [submit(world, gpus=1, tier="low", env={"FAIRQ_SIM_SECONDS": "3600"})
           for _ in range(16)]  # vision: its 8 H100s and 8 borrowed
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert Job.objects.filter(pk__in=low, status="RUNNING").count() == 16

    stopped: list[str] = []
    real = SimulatedCluster.stop

    def stop_slowly(self: SimulatedCluster, name: str, *, now: Any) -> None:
        time.sleep(0.2)  # a delete on an API server under load
        stopped.append(name)
        real(self, name, now=now)

    monkeypatch.setattr(SimulatedCluster, "stop", stop_slowly)
    settings.FAIRQ_CYCLE_BUDGET_SECONDS = 0.3
    settings.FAIRQ_LOG_READ_CONCURRENCY = 1  # the victims one at a time
    high = submit(world, world.outsider, team="nlp", gpus=8, tier="high")  # takes nlp's 8 back
    r = scheduler_cycle(now=t0 + timedelta(seconds=2))
    victims = r.preempted
    assert len(victims) == 8, r.plan.waits if r.plan else None
    # All eight requeued in the one transaction; only the stops that fit were made.
    assert Job.objects.filter(pk__in=victims, status="QUEUED", attempt=2).count() == 8
    assert 1 <= len(stopped) < 8 and r.deferred.get("stop") == 8 - len(stopped)
    for i in range(3, 20):
        if len(stopped) == 8:
            break
        scheduler_cycle(now=t0 + timedelta(seconds=i))
    assert sorted(stopped) == sorted(f"fq-{pk}-1" for pk in victims)
    for _ in range(3):
        scheduler_cycle(now=t0 + timedelta(seconds=30))
    assert Job.objects.get(pk=high).status in ("ADMITTED", "RUNNING")


@pytest.mark.parametrize(("edge", "scaled"), [(False, True), (True, True), (False, False)])
def test_step_5_keeps_its_floor_after_a_plan_that_spent_the_budget(
    world: World, settings: Any, slow_creates: list[str], monkeypatch: pytest.MonkeyPatch,
    edge: bool, scaled: bool,
) -> None:
    """A plan that alone outlasts the budget (a long queue on a big fleet) leaves step 5
    `SUBMIT_FLOOR` of the budget for its creates, not one chunk, and then as long as it
    takes to start the jobs the cycle admitted, up to `SUBMIT_SCALED_MAX` of the budget
    (`_SUBMIT_SCALED` off: the floor alone); past `SUBMIT_EDGE` from the cycle's start
    no chunk starts, floor or not."""
    settings.FAIRQ_CYCLE_BUDGET_SECONDS = 2.0
    settings.FAIRQ_CYCLE_SUBMIT_CHUNK = 2
    monkeypatch.setattr(scheduler, "_SUBMIT_SCALED", scaled)
    if edge:
        monkeypatch.setattr(scheduler, "SUBMIT_EDGE", 2.0)
    real_plan = scheduler.plan_admissions

    def slow_plan(snapshot: Any) -> Any:
        time.sleep(2.1)  # the whole budget
        return real_plan(snapshot)

    monkeypatch.setattr(scheduler, "plan_admissions", slow_plan)
    jobs = [submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "600"}) for _ in range(12)]
    r = scheduler_cycle(now=timezone.now())
    assert sorted(r.admitted) == sorted(jobs)
    # One chunk always starts; the floor (0.5 s of creates of 0.1 s each) lets more go,
    # and the share scaled to the 12 admitted (1.2 s of creates, within 3 s) all of them.
    if edge:
        assert len(slow_creates) == 2, slow_creates
    elif scaled:
        assert len(slow_creates) == 12, slow_creates
        assert r.timings["submit_create"] < 2.0 * scheduler.SUBMIT_SCALED_MAX, r.timings
    else:
        assert 4 <= len(slow_creates) < 12, slow_creates
        assert r.timings["total"] < 2.1 + 2.0 * scheduler.SUBMIT_FLOOR + 2 * CREATE_SECONDS + 1.0
    assert r.deferred == ({"submit": 12 - len(slow_creates)} if len(slow_creates) < 12 else {})


def test_step_5_past_its_floor_takes_the_jobs_earlier_cycles_left_admitted(
    world: World, settings: Any, slow_creates: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jobs a cycle admitted and left unstarted (here, its floor alone) are taken by the
    next cycle's step 5 past the budget and its floor, though that cycle admitted none:
    a pile left behind shrinks instead of holding its GPUs cycle after cycle."""
    settings.FAIRQ_CYCLE_BUDGET_SECONDS = 2.0
    settings.FAIRQ_CYCLE_SUBMIT_CHUNK = 2
    real_plan = scheduler.plan_admissions

    def slow_plan(snapshot: Any) -> Any:
        time.sleep(2.1)  # the whole budget
        return real_plan(snapshot)

    monkeypatch.setattr(scheduler, "plan_admissions", slow_plan)
    jobs = [submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "600"}) for _ in range(14)]
    monkeypatch.setattr(scheduler, "_SUBMIT_SCALED", False)
    r = scheduler_cycle(now=timezone.now())
    assert sorted(r.admitted) == sorted(jobs)
    first = len(slow_creates)
    assert 4 <= first <= 10, slow_creates  # the floor: 0.5 s of creates of 0.1 s
    monkeypatch.setattr(scheduler, "_SUBMIT_SCALED", True)
    r = scheduler_cycle(now=timezone.now())
    assert not r.admitted
    assert len(slow_creates) == 14 and "submit" not in r.deferred, (first, r.deferred)
    assert slow_creates == [f"fq-{pk}-1" for pk in sorted(jobs)]


def _ten_running(world: World, monkeypatch: pytest.MonkeyPatch, *,
                 batched: bool) -> tuple[datetime, list[int]]:
    """Ten one-GPU jobs running for a minute, started five minutes ago (the cycle's `t0`),
    step 1's changes written one job at a time or (PostgreSQL only) in batches."""
    if batched and connection.vendor != "postgresql":
        pytest.skip("the batched status changes are PostgreSQL's")
    monkeypatch.setattr(scheduler, "_BATCHED_STATUSES", batched)
    t0 = timezone.now() - timedelta(minutes=5)
    jobs = [submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "60"}) for _ in range(10)]
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert Job.objects.filter(pk__in=jobs, status="RUNNING").count() == 10
    return t0, jobs
