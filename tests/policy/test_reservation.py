"""Rule A9: the backfill reservation for the first job waiting for capacity, without
Django."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.explain import reason_lines
from queueing.policy.snapshot import (
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)

from .test_admission import NOW, admitted, nodes, q, run, snap

MIN = 60


def est(job: QueuedJob, seconds: int | None) -> QueuedJob:
    return replace(job, max_runtime_seconds=seconds)


def ends_in(job: RunningJob, seconds: int) -> RunningJob:
    """A running job whose estimate ends `seconds` from now (it started an hour ago)."""
    return replace(job, max_runtime_seconds=3600 + seconds)


# Two 8-GPU nodes, half used each: an 8-GPU gang fits nowhere now; job 50's end in 10 min
# frees h100-0 (the shadow time), job 51 keeps h100-1 half used for an hour.
HALF = nodes(("h100", 8, 4), ("h100", 8, 4))
HOLDERS = (ends_in(run(50, gpus=4, on=("h100-0",)), 10 * MIN),
           ends_in(run(51, gpus=4, on=("h100-1",)), 60 * MIN))
GANG = q(1, gpus=8, tier=200)
# Within a tier, `q` submits a higher id earlier (rule O1 then plans it first).
T = NOW + timedelta(minutes=10)


def plan_with(*queued: QueuedJob, running: tuple[RunningJob, ...] = HOLDERS,
              **kw: Any) -> Any:
    return plan_admissions(snap(nodes=HALF, queued=(GANG, *queued), running=running, **kw))


def placed(plan: Any, job_id: int) -> tuple[str, ...]:
    (a,) = [a for a in plan.admissions if a.job_id == job_id]
    return a.placement


def test_rule_a9_the_first_job_waiting_for_capacity_reserves_gpus_at_its_shadow_time() -> None:
    plan = plan_with()
    assert plan.reservations == {"h100": (1, T)}
    assert plan.waits[1].reason is WaitReason.CAPACITY
    assert "GPUs are reserved for it from 2026-01-05 12:10:00 UTC (rule A9)" in \
        plan.waits[1].message


@pytest.mark.parametrize(("estimate", "admit", "on"), [
    # ends by its estimate before the shadow time: anywhere (best fit, A3)
    (5 * MIN, True, ("h100-0",)),
    (10 * MIN, True, ("h100-0",)),
    # still running at the shadow time: only on GPUs the reservation leaves free then
    (11 * MIN, True, ("h100-1",)),
    (None, True, ("h100-1",)),
])
def test_rule_a9_a_smaller_job_backfills_if_it_ends_first_or_leaves_the_reserved_gpus(
        estimate: int | None, admit: bool, on: tuple[str, ...]) -> None:
    plan = plan_with(est(q(2, gpus=4), estimate))
    assert admitted(plan) == [2] and placed(plan, 2) == on


def test_rule_a9_a_job_that_would_hold_reserved_gpus_at_the_shadow_time_waits() -> None:
    # Job 4 takes the 4 GPUs of h100-1 the reservation leaves; job 3 would run past the
    # shadow time on h100-0, which the gang needs then; job 2 ends before it.
    plan = plan_with(est(q(4, gpus=4), None), est(q(3, gpus=2), 2 * 3600),
                     est(q(2, gpus=2), 5 * MIN))
    assert admitted(plan) == [4, 2]
    assert placed(plan, 4) == ("h100-1",) and placed(plan, 2) == ("h100-0",)
    w = plan.waits[3]
    assert w.reason is WaitReason.RESERVED
    assert w.message == (
        "reserved for job 1 until 2026-01-05 12:10:00 UTC: the free h100 GPUs it fits on "
        "are the ones job 1 needs then, and its max_runtime_seconds (7200) runs past that "
        "(rule A9)")
    # "Why is my job pending?" says it in the same words (rule P3).
    (line,) = reason_lines(ahead=3, ahead_same_gpu_type=3, gpu_type="h100",
                           wait_code=str(w.reason), wait_message=w.message,
                           admitted_next=False)[:1]
    assert line.code == "reserved" and line.message.startswith("reserved for job 1 until")


def test_rule_a9_a_job_without_an_estimate_never_counts_as_ending_first() -> None:
    plan = plan_with(est(q(3, gpus=4), None), q(2, gpus=1))
    assert admitted(plan) == [3]
    assert plan.waits[2].reason is WaitReason.RESERVED
    assert "it has no max_runtime_seconds" in plan.waits[2].message


def test_rule_a9_off_smaller_jobs_start_wherever_they_fit() -> None:
    plan = plan_with(est(q(3, gpus=4), None), q(2, gpus=1), reservation=False)
    assert admitted(plan) == [3, 2] and plan.reservations == {}
    assert placed(plan, 3) == ("h100-0",)  # best fit, on the node the gang waits for


def test_rule_a9_no_reservation_when_the_jobs_in_the_way_have_no_estimate() -> None:
    plan = plan_with(q(2, gpus=4), running=tuple(replace(r, max_runtime_seconds=None)
                                                 for r in HOLDERS))
    assert plan.reservations == {} and admitted(plan) == [2]
    assert placed(plan, 2) == ("h100-0",)


def test_rule_a9_only_the_first_job_waiting_for_capacity_reserves() -> None:
    plan = plan_with(q(2, gpus=8, tier=150), est(q(3, gpus=4), 5 * MIN))
    assert plan.reservations == {"h100": (1, T)}
    assert plan.waits[2].reason is WaitReason.CAPACITY
    assert "reserved for it" not in plan.waits[2].message
    assert admitted(plan) == [3]


def test_rule_a9_a_job_ahead_of_the_reserved_one_in_queue_order_is_not_held_back() -> None:
    # Rule O1: the high-tier job comes first and takes h100-0's GPUs; then the gang
    # waits and reserves (its shadow time is later: the GPUs job 2 took come back later).
    plan = plan_with(est(q(2, gpus=4, tier=300), None))
    assert admitted(plan) == [2] and placed(plan, 2) == ("h100-0",)
    assert plan.reservations["h100"][0] == 1
    assert plan.reservations["h100"][1] == NOW + timedelta(minutes=60)


def test_rule_a9_the_shadow_time_counts_jobs_this_pass_admitted_with_an_estimate() -> None:
    # Job 2 (ahead, 2 GPUs for 20 min) fills h100-0 partly; the gang's shadow time is when
    # both job 50 and job 2 are gone from h100-0: 20 minutes, not 10.
    plan = plan_with(est(q(2, gpus=2, tier=300), 20 * MIN))
    assert placed(plan, 2) == ("h100-0",)
    assert plan.reservations == {"h100": (1, NOW + timedelta(minutes=20))}


def test_rule_a9_a_job_waiting_for_quota_does_not_reserve() -> None:
    plan = plan_with(est(q(2, gpus=4, team="b"), None), quotas={("a", "h100"): QuotaLimit(4, 0)})
    # 8 GPUs over a ceiling of 4: a quota wait that can never end (rule E6) - no reservation.
    assert plan.waits[1].reason is WaitReason.NEVER_FITS and plan.reservations == {}
    assert admitted(plan) == [2]


def test_rule_a9_a_job_whose_preemption_rule_r9_refuses_reserves() -> None:
    # The gang may preempt job 51 (a lower tier) but has waited 0 s: rule R9 refuses.
    plan = plan_with(est(q(2, gpus=4), None), preemption=PreemptionSettings(
        enabled=True, lost_per_wait=1.0))
    assert plan.preemptions == () and "rule R9" in plan.waits[1].message
    assert plan.reservations == {"h100": (1, T)}
    assert admitted(plan) == [2] and placed(plan, 2) == ("h100-1",)


def test_rule_a9_gangs_backfill_beside_the_reservation_replica_by_replica() -> None:
    # Three nodes: the gang needs h100-0 at the shadow time; a 2 × 4 gang that runs past
    # it fits only on h100-1 and h100-2 (best fit would put a replica on h100-0).
    three = nodes(("h100", 8, 4), ("h100", 8, 4), ("h100", 8, 6))
    holders = (*HOLDERS, ends_in(run(52, gpus=2, on=("h100-2",)), 60 * MIN))
    plan = plan_admissions(snap(nodes=three, running=holders,
                                queued=(GANG, est(q(2, gpus=4, replicas=2), None))))
    assert plan.reservations == {"h100": (1, T)}
    assert placed(plan, 2) == ("h100-1", "h100-2")


def test_rule_a9_the_same_snapshot_gives_the_same_plan() -> None:
    s: Snapshot = snap(nodes=HALF, running=HOLDERS, queued=(
        GANG, *(est(q(i, gpus=1 + i % 3), (i % 4) * 5 * MIN or None) for i in range(2, 12))))
    a, b = plan_admissions(s), plan_admissions(s)
    assert a.admissions == b.admissions and dict(a.waits) == dict(b.waits)
    assert a.reservations == b.reservations


def test_rule_a9_a_gang_smaller_than_a_whole_node_does_not_reserve() -> None:
    # Job 3 (4 GPUs on 8-GPU nodes, every node has 2 free) waits for capacity but is not
    # a large gang: smaller jobs behind it start as before (rule A4), no reservation.
    two_free = nodes(("h100", 8, 2), ("h100", 8, 2))
    holders = (ends_in(run(50, gpus=6, on=("h100-0",)), 10 * MIN),
               ends_in(run(51, gpus=6, on=("h100-1",)), 60 * MIN))
    plan = plan_admissions(snap(nodes=two_free, running=holders,
                                queued=(est(q(3, gpus=4), None), est(q(2, gpus=2), None))))
    assert plan.reservations == {} and admitted(plan) == [2]
    # The first large gang behind it reserves h100-0, and job 2 starts beside it.
    plan = plan_admissions(snap(nodes=two_free, running=holders, queued=(
        est(q(4, gpus=4), None), est(q(3, gpus=8), None), est(q(2, gpus=2), None))))
    assert plan.reservations == {"h100": (3, T)} and admitted(plan) == [2]
    assert placed(plan, 2) == ("h100-1",)


def test_rule_a9_a_job_of_several_types_is_not_given_an_equal_jobs_reserved_wait() -> None:
    # Rule G5's replay of waits gave job 2 the wait of job 3 (same team, types and shape)
    # although rule A9 reads each job's own estimate: job 3 runs past the shadow time,
    # job 2 ends before it and starts on the reserved GPUs.
    both = ("h100", "a100")
    plan = plan_admissions(snap(
        nodes=(*HALF, *nodes(("a100", 8, 0))), running=HOLDERS, queued=(
            GANG, est(q(4, gpus=4), None),
            replace(est(q(3, gpus=2), None), gpu_types=both),
            replace(est(q(2, gpus=2), 5 * MIN), gpu_types=both))))
    assert admitted(plan) == [4, 2] and placed(plan, 2) == ("h100-0",)
    assert plan.waits[3].reason is WaitReason.RESERVED
    assert "it has no max_runtime_seconds" in plan.waits[3].message
