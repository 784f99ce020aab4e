"""Rule R4 amended (docs/scheduling.md): the work a preemption loses is the victim's GPUs
× the time since its current attempt's last checkpoint, or since its start when it
reported none. Victims are chosen by it, and rule R9 judges it."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import pytest

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.preemption import _unprotected, work_lost_gpu_hours
from queueing.policy.snapshot import PreemptionSettings, RunningJob
from queueing.policy.workspace import Workspace

from .test_admission import NOW, ago, nodes, q, run
from .test_preemption import snap, victims

HOUR = 3600.0


def ckpt(job: RunningJob, seconds_ago: float | None) -> RunningJob:
    return replace(job, checkpointed_at=None if seconds_ago is None else ago(seconds_ago))


@pytest.mark.parametrize(
    ("started", "checkpoint", "lost_gpu_hours"),
    [
        (HOUR, None, 8.0),  # no checkpoint: the whole attempt
        (HOUR, 60.0, 8 * 60 / HOUR),  # since the checkpoint
        (HOUR, 0.0, 0.0),  # checkpointed this instant: nothing lost
        (HOUR, 2 * HOUR, 8.0),  # older than the start (an earlier attempt's): ignored
        (None, None, 0.0),  # admitted, not started
    ])
def test_rule_r4_work_lost_counts_from_the_last_checkpoint(
    started: float | None, checkpoint: float | None, lost_gpu_hours: float,
) -> None:
    job = ckpt(run(1, gpus=8), checkpoint)
    if started is None:
        job = replace(job, started_at=None)
    assert work_lost_gpu_hours(job, NOW) == pytest.approx(lost_gpu_hours)


def test_rule_r4_the_victim_search_prices_jobs_as_work_lost_does() -> None:
    """The search's pool (one subtraction per job) against `work_lost_gpu_hours`."""
    rnd = random.Random(4)
    for _ in range(200):
        jobs = []
        for i in range(rnd.randrange(1, 12)):
            started = rnd.choice((None, 0.0, 30.0, HOUR, 5 * HOUR))
            job = run(i + 1, gpus=rnd.choice((1, 2, 8)))
            job = replace(job, started_at=None if started is None else ago(started),
                          checkpointed_at=rnd.choice((None, ago(rnd.uniform(0, 6 * HOUR)))))
            jobs.append(job)
        ws = Workspace(snap(nodes=nodes(("h100", 8)), running=tuple(jobs)))
        for protect in (True, False):
            for r, lost in _unprotected(ws, "h100", NOW, protect):
                assert lost == pytest.approx(work_lost_gpu_hours(r, NOW), abs=1e-9)


@pytest.mark.parametrize("fresh", [1, 2])
def test_rule_r4_the_victim_is_the_one_that_checkpointed_last(fresh: int) -> None:
    # Two low 8-GPU jobs of equal tier that both started two hours ago; the one that
    # checkpointed a minute ago loses a minute, the other two hours.
    running = tuple(ckpt(run(i, gpus=8, on=(f"h100-{i - 1}",), started=2 * HOUR),
                         60.0 if i == fresh else None) for i in (1, 2))
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0), ("h100", 8, 0)), running=running,
                                queued=(q(100, "b", gpus=8, tier=200),)))
    assert victims(plan, 100) == [fresh]


def test_rule_r4_a_young_job_without_checkpoint_can_cost_more_than_an_old_one_with_one() -> None:
    # Job 1 started 10 minutes ago and never checkpointed; job 2 started 5 hours ago and
    # checkpointed 2 minutes ago: job 2 is the cheaper victim.
    running = (run(1, gpus=8, on=("h100-0",), started=600),
               ckpt(run(2, gpus=8, on=("h100-1",), started=5 * HOUR), 120))
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0), ("h100", 8, 0)), running=running,
                                queued=(q(100, "b", gpus=8, tier=200),)))
    assert victims(plan, 100) == [2]


@pytest.mark.parametrize(
    ("checkpoint", "preempts"),
    [
        (None, False),  # an hour lost: 28,800 GPU-seconds > 0.4 × 8 × 600 = 1,920
        (300.0, False),  # 2,400 GPU-seconds > 1,920
        (180.0, True),  # 1,440 GPU-seconds <= 1,920
    ])
def test_rule_r9_judges_the_work_lost_since_the_checkpoint(
    checkpoint: float | None, preempts: bool,
) -> None:
    # Team b (no quota: nothing owed, rule R11 does not apply) has waited 10 minutes for
    # 8 GPUs held by a lower-tier job that started an hour ago.
    running = (ckpt(run(1, gpus=8, on=("h100-0",), started=HOUR), checkpoint),)
    plan = plan_admissions(snap(
        nodes=nodes(("h100", 8, 0)), running=running,
        queued=(q(100, "b", gpus=8, tier=200, age=600),),
        preemption=PreemptionSettings(enabled=True, lost_per_wait=0.4)))
    if preempts:
        assert victims(plan, 100) == [1]
    else:
        assert plan.preemptions == ()
        assert plan.waits[100].reason is WaitReason.CAPACITY
        lost = 8 * (HOUR if checkpoint is None else checkpoint) / HOUR
        assert f"preempting now would lose {lost:.2f} GPU-hours" in plan.waits[100].message


def test_rule_r4_the_checkpoint_does_not_shorten_the_minimum_runtime() -> None:
    # Rule R3's minimum runtime counts from the start: a job that checkpointed is still
    # protected until it has run its tier's minimum.
    running = (ckpt(run(1, gpus=8, on=("h100-0",), started=60, min_runtime=600), 10),)
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), running=running,
                                queued=(q(100, "b", gpus=8, tier=200),)))
    assert plan.preemptions == ()
    assert NOW - timedelta(seconds=60) == running[0].started_at
