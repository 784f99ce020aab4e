"""Rule R9.1 (docs/scheduling.md, an amendment of R9): the large gang rule A9 reserves
for counts, beside its wait so far, the wait a preemption spares it - until its shadow
time, at most as long again as it has waited. Without Django."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.snapshot import PreemptionSettings, QueuedJob, RunningJob

from .test_admission import nodes, q, run, snap

MIN = 60
# Two 8-GPU nodes, half used each by a low-tier 4-GPU job that has run an hour (taking
# one loses 4 × 3,600 = 14,400 GPU-seconds). Job 50's estimate ends in 60 min (the
# shadow time of an 8-GPU gang), job 51's in 120 min.
HALF = nodes(("h100", 8, 4), ("h100", 8, 4))


def holders(estimates: bool = True) -> tuple[RunningJob, ...]:
    out = (run(50, team="c", gpus=4, on=("h100-0",)), run(51, team="c", gpus=4, on=("h100-1",)))
    if not estimates:
        return out
    return (replace(out[0], max_runtime_seconds=3600 + 60 * MIN),
            replace(out[1], max_runtime_seconds=3600 + 120 * MIN))


def plan(*queued: QueuedJob, running: tuple[RunningJob, ...] | None = None,
         reservation: bool = True) -> Any:
    return plan_admissions(snap(
        nodes=HALF, queued=queued, running=holders() if running is None else running,
        reservation=reservation,
        preemption=PreemptionSettings(enabled=True, lost_per_wait=0.4, max_per_team=None)))


def preempted(p: Any, job_id: int) -> bool:
    return any(x.preemptor_id == job_id for x in p.preemptions)


def test_rule_r9_1_the_reserved_gang_counts_the_wait_a_preemption_spares_it() -> None:
    # Waited 45 min: R9 alone allows 0.4 × 8 × 2,700 = 8,640 GPU-seconds < 14,400. Its
    # shadow time is 60 min away; R9.1 counts 45 more minutes (as long as it waited):
    # 0.4 × 8 × 5,400 = 17,280 >= 14,400, so it preempts. Without R9.1 it waited.
    p = plan(q(1, gpus=8, tier=200, age=45 * MIN))
    assert preempted(p, 1)


def test_rule_r9_1_counts_at_most_as_long_again_as_the_gang_has_waited() -> None:
    # Waited 20 min: R9.1 adds 20 (not the 60 to its shadow time): 0.4 × 8 × 2,400 =
    # 7,680 < 14,400. R9 refuses; the gang keeps its reservation.
    p = plan(q(1, gpus=8, tier=200, age=20 * MIN))
    assert p.preemptions == ()
    assert p.waits[1].reason is WaitReason.CAPACITY and "rule R9" in p.waits[1].message
    assert dict(p.wait_causes())[1] == "capacity:not_worth_it"
    assert p.reservations == {"h100": (1, p.reservations["h100"][1])}


def test_rule_r9_1_a_job_smaller_than_a_whole_node_gets_no_credit() -> None:
    # A 6-GPU job (A9 reserves for none) that waited 75 min: R9 allows 0.4 × 6 × 4,500 =
    # 10,800 < 14,400; no credit, so no preemption.
    p = plan(q(1, gpus=6, tier=200, age=75 * MIN))
    assert p.preemptions == ()


def test_rule_r9_1_no_shadow_time_no_credit() -> None:
    # The jobs in the way have no estimate: no shadow time (A9), nothing to count.
    assert plan(q(1, gpus=8, tier=200, age=45 * MIN), running=holders(False)).preemptions == ()


def test_rule_r9_1_off_with_rule_a9() -> None:
    # `--no-reservation` (FAIRQ_RESERVATION off): no reservation, so R9 alone.
    assert plan(q(1, gpus=8, tier=200, age=45 * MIN), reservation=False).preemptions == ()

