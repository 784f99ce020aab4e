"""Rule R9, a refusal remembered for the pass (docs/scheduling.md): a job of the same
team, shape and tier as one whose preemption R9 refused in this pass, and whose wait is
worth less than the victims that search found, waits without a search of its own, so the
pass's R4 search budget goes to jobs that can use it. And `Plan.wait_causes` says why
each job waits."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.snapshot import PreemptionSettings

from .test_admission import NOW, nodes, q, run
from .test_preemption import snap, victims

# One 2-GPU node held by team c's two low-tier jobs (c has no quota: all borrowed), each
# 1 GPU that has run an hour: taking one loses 3,600 GPU-seconds.
RUNNING = (run(1, "c", gpus=1, started=3600), run(2, "c", gpus=1, started=3600))
FAIR = {"a": 1.0, "b": 0.5, "c": 0.1}  # rule O1: a's jobs before b's


def _plan(*queued: object, max_searches: int = 2) -> object:
    return plan_admissions(snap(
        nodes=nodes(("h100", 2, 0)), running=RUNNING, queued=queued, fair_share=FAIR,
        preemption=PreemptionSettings(enabled=True, lost_per_wait=1.0, max_per_team=None,
                                      max_searches=max_searches)))


def test_rule_r9_a_refused_search_is_not_repeated_and_the_budget_serves_the_next_team() -> None:
    # a's two jobs waited 60 s and 30 s: R9 refuses a's first search (3,600 > 60); its
    # second would be refused the same victims, so it does not search. b's job, which has
    # waited 2 h, gets the pass's second search and preempts. Without the memo a's second
    # job took that search and b's waited with none.
    plan = _plan(q(10, "a", tier=200, age=60), q(11, "a", tier=200, age=30),
                 q(20, "b", tier=200, age=7200))
    assert len(victims(plan, 20)) == 1
    causes = dict(plan.wait_causes())
    assert causes[10] == causes[11] == "capacity:not_worth_it"
    assert causes[20] == WaitReason.PREEMPTING.value
    assert plan.waits[11].reason is WaitReason.CAPACITY
    assert "rule R9" in plan.waits[11].message and "equal job" in plan.waits[11].message


def test_rule_r9_a_job_of_the_same_key_that_waited_long_enough_still_searches() -> None:
    # a's first job in queue order (submitted 3 h ago) was preempted 60 s ago: R9 counts
    # its wait from then and refuses. a's next job has waited 2 h: worth the 3,600
    # GPU-seconds, so the refusal does not hold it back.
    requeued = replace(q(10, "a", tier=200, age=3 * 3600),
                       queued_at=NOW - timedelta(seconds=60))
    plan = _plan(requeued, q(11, "a", tier=200, age=7200))
    assert dict(plan.wait_causes())[10] == "capacity:not_worth_it"
    assert len(victims(plan, 11)) == 1


def test_wait_causes_say_when_no_search_was_left_in_the_pass() -> None:
    # One search per pass: a's job spends it; b's (another key) gets none.
    plan = _plan(q(10, "a", tier=200, age=60), q(20, "b", tier=200, age=60), max_searches=1)
    assert dict(plan.wait_causes()) == {10: "capacity:not_worth_it",
                                       20: "capacity:no_search"}


def test_wait_causes_say_when_the_search_found_no_victim() -> None:
    # Team c's own job of the same low tier has no victim (R1 wants a strictly lower tier).
    plan = _plan(q(30, "c", tier=0, age=60))
    assert dict(plan.wait_causes()) == {30: "capacity:no_victim"}
