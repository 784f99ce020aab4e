"""Rules E1-E4 (docs/scheduling.md, "Explaining a wait"): what a queued job is told, on
the admission plan alone, without Django. Table-driven where the rule has cases."""

from __future__ import annotations

from datetime import timedelta

import pytest

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.explain import explain_queue, main_reason, reason_lines
from queueing.policy.snapshot import PreemptionSettings

from .test_admission import NOW, ago, nodes, q, run, snap

PREEMPT = PreemptionSettings(enabled=True, lost_per_wait=None)


# --- E1: jobs ahead are of the job's own GPU type -------------------------------------------

def test_rule_e1_jobs_ahead_counts_only_jobs_of_the_same_gpu_type() -> None:
    order = [q(1, gpu_type="a100"), q(2), q(3, gpu_type="a100"), q(4)]
    x = explain_queue(order, waits={}, admitted=())
    assert [(x[i].position, x[i].ahead_same_gpu_type) for i in (1, 2, 3, 4)] == [
        (1, 0), (2, 0), (3, 1), (4, 1)]
    # One a100 job is ahead of job 2: it does not count.
    assert [r.code for r in x[2].reasons] == []
    (ahead,) = x[4].reasons
    assert ahead.code == "jobs_ahead"
    assert ahead.message == "1 job ahead of it for h100 GPUs (3 in the whole queue)"


@pytest.mark.parametrize(("same", "message"), [
    (0, None),
    (1, "1 job ahead of it for h100 GPUs (5 in the whole queue)"),
    (4, "4 jobs ahead of it for h100 GPUs (5 in the whole queue)"),
])
def test_rule_e1_the_jobs_ahead_line(same: int, message: str | None) -> None:
    lines = reason_lines(ahead=5, ahead_same_gpu_type=same, gpu_type="h100", wait_code=None,
                         wait_message=None, admitted_next=False)
    assert [r.message for r in lines] == ([message] if message else [])


# --- E2: GPUs held for a preemptor ----------------------------------------------------------

def test_rule_e2_a_job_that_would_fit_on_a_nominated_preemptors_gpus_names_it() -> None:
    # Job 1 preempted in an earlier cycle; its victims are gone, so the cluster (and
    # /capacity/) shows the node free. It is planned first (rule A5) and takes it.
    plan = plan_admissions(snap(nodes=nodes(("h100", 8)), queued=(q(1, gpus=8, tier=200),
                                                                   q(2, gpus=4)),
                                nominated={1: 0}))
    assert [a.job_id for a in plan.admissions] == [1]
    wait = plan.waits[2]
    assert wait.reason is WaitReason.HELD_FOR_PREEMPTOR
    assert "held for job #1" in wait.message and "rule A5" in wait.message


def test_rule_e2_gpus_a_preemption_frees_in_the_same_pass_are_held_for_its_preemptor() -> None:
    # Job 1 (8 GPUs, high tier) preempts the two low-tier jobs filling the node; job 2
    # (a lower tier, so after it) would fit on what they free, but those GPUs are job 1's
    # (rule A5).
    plan = plan_admissions(snap(
        nodes=nodes(("h100", 8, 0)), queued=(q(1, gpus=8, tier=200), q(2, gpus=4, tier=150)),
        running=(run(9, team="b", gpus=2), run(10, team="b", gpus=6)), preemption=PREEMPT))
    assert plan.waits[1].reason is WaitReason.PREEMPTING
    wait = plan.waits[2]
    assert wait.reason is WaitReason.HELD_FOR_PREEMPTOR, wait
    assert "job #1" in wait.message and "(8 GPUs held" in wait.message


@pytest.mark.parametrize(("placement", "admitted_3", "code_3"), [
    # Its victims' 2 GPUs on h100-0 are still being released; the 6 free there are its.
    (("h100-0",), [], WaitReason.HELD_FOR_PREEMPTOR),
    # Before rule E2 held them (no placement known), job 3 took them first.
    ((), [3], None),
])
def test_rule_e2_a_nominated_preemptor_waiting_for_its_victims_keeps_its_free_gpus(
        placement: tuple[str, ...], admitted_3: list[int], code_3: WaitReason | None) -> None:
    plan = plan_admissions(snap(
        nodes=nodes(("h100", 8, 6)), queued=(q(2, gpus=8, tier=200), q(3, gpus=4)),
        nominated={2: 1}, nominated_placement={2: placement} if placement else {},
        preemption=PREEMPT))
    assert plan.waits[2].reason is WaitReason.PREEMPTING
    assert [a.job_id for a in plan.admissions] == admitted_3
    if code_3 is not None:
        wait = plan.waits[3]
        assert wait.reason is code_3 and "held for job #2" in wait.message
        assert "(6 GPUs held; rule A5)" in wait.message


def test_rule_e2_a_job_too_large_even_for_the_held_gpus_waits_for_capacity() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8), ("h100", 8, 0)),
                                queued=(q(1, gpus=8, tier=200), q(2, gpus=8, replicas=2)),
                                nominated={1: 0}))
    assert plan.waits[2].reason is WaitReason.CAPACITY


# --- E3: fragmentation names the largest free block -----------------------------------------

@pytest.mark.parametrize(("free", "gpus", "replicas", "words"), [
    ((3, 2), 4, 1, "largest free block: 3 GPUs on h100-0; needs 4 on one node "
                   "(5 h100 GPUs free in all)"),
    ((1, 2), 2, 2, "largest free block: 2 GPUs on h100-1; needs 2 blocks of 2 "
                   "(3 h100 GPUs free in all)"),
    ((0, 0), 1, 1, "no h100 GPU is free"),
    ((1, 0), 2, 1, "largest free block: 1 GPU on h100-0; needs 2 on one node "
                   "(1 h100 GPUs free in all)"),
])
def test_rule_e3_a_capacity_wait_names_the_largest_free_block(
        free: tuple[int, int], gpus: int, replicas: int, words: str) -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, free[0]), ("h100", 8, free[1])),
                                queued=(q(1, gpus=gpus, replicas=replicas),)))
    wait = plan.waits[1]
    assert wait.reason is WaitReason.CAPACITY
    assert wait.message == (f"waiting for {replicas} × {gpus} free h100 GPUs on nodes; "
                            + words)


def test_rule_e3_the_block_is_the_one_left_when_the_job_is_considered() -> None:
    # Job 2 (submitted first) takes 4 of node 0's 6 free GPUs; job 1 (4 GPUs) then sees
    # 2 on h100-0.
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 6), ("h100", 8, 1)),
                                queued=(q(1, gpus=4), q(2, gpus=4))))
    assert [a.job_id for a in plan.admissions] == [2]
    assert "largest free block: 2 GPUs on h100-0; needs 4 on one node" in plan.waits[1].message


# --- E4: until when ------------------------------------------------------------------------

def test_rule_e4_a_rate_limited_job_says_when_its_team_may_preempt_again() -> None:
    pre = PreemptionSettings(enabled=True, lost_per_wait=None, max_per_team=2,
                             used={"a": 2}, made_at={"a": (ago(500), ago(100))},
                             window_seconds=600)
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), queued=(q(1, gpus=8, tier=200),),
                                running=(run(9, team="b", gpus=8),), preemption=pre))
    wait = plan.waits[1]
    assert wait.reason is WaitReason.RATE_LIMITED
    assert wait.until == NOW + timedelta(seconds=100)  # the oldest leaves the window then
    assert f"until {wait.until.isoformat(timespec='seconds')} (in 100 s)" in wait.message


@pytest.mark.parametrize(("used", "made", "needed", "in_pass", "after"), [
    (2, (500, 100), 1, 0, 100),   # the oldest of two must leave
    (2, (500, 100), 2, 0, 500),   # both must leave
    (1, (300,), 1, 1, 300),       # this pass made one more: the old one must leave
    (1, (300,), 2, 1, 600),       # and the pass's own: a whole window from now
    (0, (), 1, 0, None),          # it may already
    (2, (), 1, 0, None),          # instants not known: nothing said
    (0, (), 3, 0, None),          # more than the limit: never, nothing to wait for
])
def test_rule_e4_when_a_team_may_preempt_again(used: int, made: tuple[int, ...], needed: int,
                                               in_pass: int, after: int | None) -> None:
    pre = PreemptionSettings(max_per_team=2, used={"a": used},
                             made_at={"a": tuple(ago(600 - s) for s in made)} if made else {},
                             window_seconds=600)
    got = pre.free_again_at("a", needed=needed, made_in_pass=in_pass, now=NOW)
    assert got == (None if after is None else NOW + timedelta(seconds=after))


def test_rule_e4_a_job_whose_victims_are_protected_says_until_when() -> None:
    # The only candidate ran 60 s of its tier's 300 s minimum runtime (rule R3).
    plan = plan_admissions(snap(
        nodes=nodes(("h100", 8, 0)), queued=(q(1, gpus=8, tier=200),),
        running=(run(9, team="b", gpus=8, started=60, min_runtime=300),), preemption=PREEMPT))
    wait = plan.waits[1]
    assert wait.reason is WaitReason.CAPACITY
    assert wait.until == NOW + timedelta(seconds=240)
    assert "1 running job it could preempt is protected by the minimum runtime" in wait.message
    assert "(in 240 s)" in wait.message


def test_rule_e4_an_unprotected_wait_has_no_until() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), queued=(q(1, gpus=8),),
                                running=(run(9, gpus=8, tier=100),), preemption=PREEMPT))
    assert plan.waits[1].until is None


def test_rule_e4_the_until_reaches_the_reason_line_and_its_api_shape() -> None:
    until = NOW + timedelta(seconds=30)
    x = explain_queue([q(1)], waits={1: ("preemption_rate_limited", "m")}, admitted=(),
                      until={1: until})
    reason = main_reason(x[1].reasons)
    assert reason is not None and reason.until == until
    assert reason.as_dict() == {"code": "preemption_rate_limited", "message": "m",
                                "until": until.isoformat()}


# --- E6: a job that can never run -----------------------------------------------------------

@pytest.mark.parametrize(("gpus", "replicas", "held", "code"), [
    (6, 3, 0, "never_fits"),  # 18: more than nominal 8 + borrowing 8, whatever it holds
    (3, 3, 8, "quota"),       # 9: fits the ceiling once the team's own jobs finish
])
def test_rule_e6_more_gpus_than_the_teams_ceiling_is_never_fits_not_quota(
        gpus: int, replicas: int, held: int, code: str) -> None:
    from queueing.policy.snapshot import QuotaLimit

    running = (run(9, gpus=held),) if held else ()
    plan = plan_admissions(snap(nodes=nodes(("h100", 8), ("h100", 8), ("h100", 8)),
                                queued=(q(1, gpus=gpus, replicas=replicas),), running=running,
                                quotas={("a", "h100"): QuotaLimit(8, borrowing_limit=8)}))
    wait = plan.waits[1]
    assert wait.reason == code
    if code == "never_fits":
        assert wait.message == ("team a may hold at most 16 h100 GPUs (its quota's nominal + "
                                "borrowing limit); this job asks 18: it can never run unless "
                                "the quota is raised")


@pytest.mark.parametrize(("gpus", "replicas", "words"), [
    (17, 1, "no h100 node has 17 GPUs for one replica"),
    (8, 4, "even empty, the h100 nodes hold at most 3 replicas of 8 GPUs; this gang needs 4"),
])
def test_rule_e6_beyond_the_ceiling_and_what_the_nodes_hold_says_the_nodes_not_the_quota(
        gpus: int, replicas: int, words: str) -> None:
    """Raising the quota would not help a job no node (or no set of empty nodes) can hold:
    its wait says it cannot fit anywhere (`gang_does_not_fit`), not `never_fits`."""
    from queueing.policy.snapshot import QuotaLimit

    plan = plan_admissions(snap(nodes=nodes(("h100", 8), ("h100", 8), ("h100", 8)),
                                queued=(q(1, gpus=gpus, replicas=replicas),),
                                quotas={("a", "h100"): QuotaLimit(8, borrowing_limit=8)}))
    assert plan.waits[1].reason == "gang_does_not_fit"
    assert plan.waits[1].message == words
