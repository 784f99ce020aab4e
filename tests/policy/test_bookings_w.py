"""Rules W1-W4: booked GPUs on the admission pass (docs/scheduling.md, "Booked GPUs"),
without Django: tables per rule, and a property over small simulated worlds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.bookings import Booking
from queueing.policy.preemption import PreemptionRule
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
)
from queueing.policy.stages import bookings as stage

from .test_admission import NOW, admitted, nodes, q, run, snap

H = 3600
TWO = nodes(("h100", 8), ("h100", 8))


def book(gpus: int = 8, start: float = 2 * H, hours: float = 4, team: str = "vision",
         lend: bool = False, booking_id: int = 1) -> Booking:
    """A booking `start` seconds from now (negative: already on)."""
    at = NOW + timedelta(seconds=start)
    return Booking(booking_id, team, "h100", gpus, at, at + timedelta(hours=hours), lend)


def est(job: QueuedJob, seconds: int | None) -> QueuedJob:
    return replace(job, max_runtime_seconds=seconds)


def placed(plan: Any, job_id: int) -> tuple[str, ...]:
    (a,) = [a for a in plan.admissions if a.job_id == job_id]
    placement: tuple[str, ...] = a.placement
    return placement


# --- W1: held ahead, backfilled around -------------------------------------------------

def test_rule_w1_a_job_ending_before_the_start_backfills_the_booked_gpus() -> None:
    plan = plan_admissions(snap(nodes=TWO, queued=(est(q(1, gpus=8), H), est(q(2, gpus=8), H)),
                                bookings=(book(gpus=16),)))
    assert sorted(admitted(plan)) == [1, 2]


@pytest.mark.parametrize("seconds", [3 * H, None])
def test_rule_w1_a_job_crossing_the_start_takes_only_gpus_the_booking_leaves(
        seconds: int | None) -> None:
    jobs = (est(q(1, gpus=8), seconds), est(q(2, gpus=8), seconds))
    plan = plan_admissions(snap(nodes=TWO, queued=jobs, bookings=(book(gpus=8),)))
    assert admitted(plan) == [2]  # q() submits a higher id earlier
    wait = plan.waits[1]
    assert wait.reason is WaitReason.RESERVED
    assert "booked for team vision from Mon 14:00 UTC" in wait.message
    assert "8 h100 are held" in wait.message
    assert "max runtime would cross it" in wait.message and "rule W1" in wait.message


def test_rule_w1_the_booking_is_a_placement_not_a_count() -> None:
    # h100-0: 2 free now, 6 held by a job ending before the start (8 free then); h100-1:
    # 6 free, 2 held with no estimate. A booking of 8 takes h100-0 whole at its start. A
    # crossing 2-GPU job goes to h100-1; best fit alone (and a pool count: 14 free then,
    # 8 booked, 6 left) would put it on h100-0 and leave the booking 6 + 6 in pieces.
    world = nodes(("h100", 8, 2), ("h100", 8, 6))
    running = (replace(run(50, team="b", gpus=6, on=("h100-0",)), max_runtime_seconds=2 * H),
               run(51, team="b", gpus=2, on=("h100-1",)))
    job = est(q(1, gpus=2), None)
    plan = plan_admissions(snap(nodes=world, queued=(job,), running=running,
                                bookings=(book(gpus=8, start=3 * H),)))
    assert placed(plan, 1) == ("h100-1",)
    plain = plan_admissions(snap(nodes=world, queued=(job,), running=running))
    assert placed(plain, 1) == ("h100-0",)


def test_rule_w1_a_booking_is_not_held_on_spot_nodes() -> None:
    # The regular node is the booking's at its start; the spot node is not held.
    world = (NodeState("h100-0", "h100", 8, 8), NodeState("s-0", "h100", 8, 8, spot=True))
    jobs = (replace(est(q(1, gpus=8), None), spot_ok=True), est(q(2, gpus=8), None))
    plan = plan_admissions(snap(nodes=world, queued=jobs, bookings=(book(gpus=8),)))
    assert admitted(plan) == [1] and placed(plan, 1) == ("s-0",)
    assert plan.waits[2].reason is WaitReason.RESERVED


def test_rule_w1_gpus_freed_by_the_start_count_for_the_booking() -> None:
    # h100-0 is full until a job ending in 1 h; the booking at 2 h can have it, so a
    # crossing job may take h100-1 now.
    world = nodes(("h100", 8, 0), ("h100", 8))
    ending = replace(run(50, team="b", gpus=8, on=("h100-0",)), max_runtime_seconds=2 * H)
    plan = plan_admissions(snap(nodes=world, queued=(est(q(1, gpus=8), None),),
                                running=(ending,), bookings=(book(gpus=8),)))
    assert admitted(plan) == [1] and placed(plan, 1) == ("h100-1",)


def test_rule_w1_a_team_job_running_at_the_start_counts_in_one_booking_only() -> None:
    # Vision's 8 running on h100-0 fill its first booking at the start; its second
    # needs a whole other node: of two crossing 8-GPU jobs one waits.
    world = nodes(("h100", 8, 0), ("h100", 8), ("h100", 8))
    running = (run(50, team="vision", gpus=8, on=("h100-0",)),)
    jobs = (est(q(1, gpus=8), None), est(q(2, gpus=8), None))
    plan = plan_admissions(snap(nodes=world, queued=jobs, running=running,
                                bookings=(book(gpus=8), book(gpus=8, booking_id=2))))
    assert admitted(plan) == [2]
    assert plan.waits[1].reason is WaitReason.RESERVED


def test_rule_w1_the_booking_teams_own_jobs_may_cross_into_it() -> None:
    jobs = (est(q(1, team="vision", gpus=8), None), est(q(2, team="vision", gpus=8), None))
    plan = plan_admissions(snap(nodes=TWO, queued=jobs, bookings=(book(gpus=8),)))
    assert sorted(admitted(plan)) == [1, 2]


def test_rule_w1_a_snapshot_without_bookings_plans_as_before() -> None:
    jobs = (est(q(1, gpus=8), None), est(q(2, gpus=8), None))
    with_none = plan_admissions(snap(nodes=TWO, queued=jobs))
    with_past = plan_admissions(snap(nodes=TWO, queued=jobs,
                                     bookings=(book(start=-5 * H, hours=1),)))
    assert with_none.admissions == with_past.admissions
    assert sorted(admitted(with_none)) == [1, 2]


# --- W2: emptied at its start ----------------------------------------------------------

def test_rule_w2_other_teams_jobs_on_the_booked_gpus_are_preempted_at_its_start() -> None:
    world = nodes(("h100", 8, 0), ("h100", 8, 0))
    running = (run(50, team="b", gpus=8, on=("h100-0",), tier=300, preemptible=False),
               run(51, team="b", gpus=8, on=("h100-1",), tier=100))
    plan = plan_admissions(snap(nodes=world, running=running, bookings=(book(start=-60),)))
    (pre,) = plan.preemptions
    assert pre.preemptor_id == 0 and pre.booking is not None and pre.booking.id == 1
    # Rule R4's order: the lower tier goes first; whatever its tier the rest would follow.
    assert [v.job_id for v in pre.victims] == [51]
    assert {v.rule for v in pre.victims} == {PreemptionRule.BOOKED}


def test_rule_w2_a_non_preemptible_job_goes_too_when_nothing_else_frees_it() -> None:
    world = nodes(("h100", 8, 0))
    running = (run(50, team="b", gpus=8, on=("h100-0",), tier=300, preemptible=False),)
    plan = plan_admissions(snap(nodes=world, running=running, bookings=(book(start=-60),)))
    assert [v.job_id for p in plan.preemptions for v in p.victims] == [50]


def test_rule_w2_the_teams_own_jobs_and_idle_gpus_count_no_victim() -> None:
    world = nodes(("h100", 8, 0), ("h100", 8, 4))
    running = (run(50, team="vision", gpus=4, on=("h100-0",)),
               run(51, team="b", gpus=4, on=("h100-0",)),
               run(52, team="b", gpus=4, on=("h100-1",)))
    plan = plan_admissions(snap(nodes=world, running=running, bookings=(book(start=-60),)))
    assert plan.preemptions == ()


def test_rule_w2_victims_still_stopping_are_not_preempted_twice() -> None:
    # The cycle after: the victim is requeued (not running) but its GPUs not free yet.
    world = nodes(("h100", 8, 0))
    team_job = q(1, team="vision", gpus=8)
    plan = plan_admissions(snap(nodes=world, queued=(team_job,),
                                bookings=(book(start=-60),)))
    assert plan.preemptions == () and admitted(plan) == []
    wait = plan.waits[1]
    assert wait.reason is WaitReason.PREEMPTING
    assert "booked for team vision" in wait.message and "rule W2" in wait.message


# --- W3: only the team's jobs in it ----------------------------------------------------

def test_rule_w3_the_team_is_admitted_into_its_booking_beyond_its_quota() -> None:
    # Job 3 (8 GPUs) goes into the booking; job 2 (4) then fits the team's ceiling of 4,
    # which the booked 8 do not count against; job 1 (4) would pass it.
    jobs = (q(1, team="vision", gpus=4), q(2, team="vision", gpus=4),
            q(3, team="vision", gpus=8))
    quotas = {("vision", "h100"): QuotaLimit(4, 0)}
    plan = plan_admissions(snap(nodes=TWO, queued=jobs, quotas=quotas,
                                bookings=(book(start=-60),)))
    assert admitted(plan) == [3, 2]
    assert plan.waits[1].reason is WaitReason.QUOTA


def test_rule_w3_other_teams_see_the_booked_gpus_as_not_free() -> None:
    jobs = (q(1, team="b", gpus=8), q(2, team="b", gpus=8))
    plan = plan_admissions(snap(nodes=TWO, queued=jobs, bookings=(book(start=-60),)))
    assert admitted(plan) == [2]
    wait = plan.waits[1]
    assert wait.reason is WaitReason.CAPACITY
    assert wait.message.endswith("; 8 h100 GPUs are booked for team vision until "
                                 "2026-01-05 15:59:00 UTC, not free to it (rule W3)")


def test_rule_w3_a_team_with_two_bookings_of_a_type_uses_both() -> None:
    jobs = (q(1, team="vision", gpus=8), q(2, team="vision", gpus=8),
            q(3, team="vision", gpus=8))
    quotas = {("vision", "h100"): QuotaLimit(0, 0)}
    plan = plan_admissions(snap(nodes=nodes(("h100", 8), ("h100", 8), ("h100", 8)),
                                queued=jobs, quotas=quotas,
                                bookings=(book(start=-60), book(start=-30, booking_id=2))))
    assert admitted(plan) == [3, 2]
    assert plan.waits[1].reason is WaitReason.NEVER_FITS  # beyond both, its quota of 0


def test_rule_w3_a_team_job_its_booking_cannot_hold_says_so() -> None:
    # Its own 2-GPU jobs split the booking of 16 over two nodes: 12 free, not 8 on one.
    running = (run(50, team="vision", gpus=2, on=("h100-0",)),
               run(51, team="vision", gpus=2, on=("h100-1",)))
    world = nodes(("h100", 8, 6), ("h100", 8, 6))
    plan = plan_admissions(snap(nodes=world, running=running,
                                queued=(q(1, team="vision", gpus=8),),
                                bookings=(book(gpus=16, start=-60),)))
    assert admitted(plan) == []
    wait = plan.waits[1]
    assert wait.reason is WaitReason.CAPACITY
    assert wait.message.endswith("the free GPUs of team vision's booking of 16 h100 until "
                                 "2026-01-05 15:59:00 UTC do not hold it either (rule W3)")


def test_rule_w3_the_teams_jobs_in_the_booking_leave_its_quota_free() -> None:
    # 8 running in the booking; its ceiling of 4 still admits 4 more outside it.
    world = nodes(("h100", 8, 0), ("h100", 8))
    running = (run(50, team="vision", gpus=8, on=("h100-0",)),)
    quotas = {("vision", "h100"): QuotaLimit(4, 0)}
    plan = plan_admissions(snap(nodes=world, running=running, queued=(
        q(1, team="vision", gpus=4),), quotas=quotas, bookings=(book(start=-60),)))
    assert admitted(plan) == [1]


# --- W4: unused booked GPUs are lent ---------------------------------------------------

def test_rule_w4_a_lending_tier_borrows_unused_booked_gpus_only_with_lend() -> None:
    jobs = (q(1, team="b", gpus=8, tier=0), q(2, team="b", gpus=8, tier=0))
    lent = plan_admissions(snap(nodes=TWO, queued=jobs, lend_tiers=frozenset({0}),
                                bookings=(book(start=-60, lend=True),)))
    assert sorted(admitted(lent)) == [1, 2]
    kept = plan_admissions(snap(nodes=TWO, queued=jobs, lend_tiers=frozenset({0}),
                                bookings=(book(start=-60, lend=False),)))
    assert admitted(kept) == [2]
    other_tier = plan_admissions(snap(nodes=TWO, queued=jobs, lend_tiers=frozenset({5}),
                                      bookings=(book(start=-60, lend=True),)))
    assert admitted(other_tier) == [2]


def test_rule_w4_the_team_takes_lent_gpus_back_at_once() -> None:
    world = nodes(("h100", 8, 0), ("h100", 8, 0))
    running = (run(50, team="b", gpus=8, on=("h100-0",), tier=0, min_runtime=9 * H),
               run(51, team="b", gpus=8, on=("h100-1",), tier=0))
    plan = plan_admissions(snap(nodes=world, running=running,
                                queued=(q(1, team="vision", gpus=8),),
                                lend_tiers=frozenset({0}),
                                preemption=PreemptionSettings(enabled=False),
                                bookings=(book(start=-60, lend=True),)))
    (pre,) = plan.preemptions
    assert pre.preemptor_id == 1 and pre.owed and pre.booking is not None
    assert len(pre.victims) == 1 and pre.victims[0].rule is PreemptionRule.BOOKED
    wait = plan.waits[1]
    assert wait.reason is WaitReason.PREEMPTING and "rule W4" in wait.message


# --- the property: plan -> time passes -> plan ----------------------------------------

CYCLE, GRACE = 300, 60


def simulate(world: list[tuple[int, int]], jobs: Sequence[tuple[str, int, int | None]],
             start_min: int, gpus: int, until: int, lend: bool = False) -> list[str]:
    """Plan every CYCLE seconds from NOW on `world` (per node: GPUs) with `jobs` (team,
    GPUs, estimate) queued and one booking of `gpus` for team vision `start_min` minutes
    on; jobs end by their estimates, victims hold their GPUs GRACE seconds. With `lend`
    the booking lends, and team b's jobs are of tier 0, a lending tier (rule W4): they
    may be on the booked GPUs. Returns the breaches of rules W1-W2 seen."""
    names = [f"h100-{i}" for i in range(len(world))]
    cap = dict(zip(names, (c for c, _ in world), strict=True))
    start = NOW + timedelta(minutes=start_min)
    b = Booking(1, "vision", "h100", gpus, start, start + timedelta(hours=3), lend=lend)
    lent = 0 if lend else -1  # the lending tier's rank; -1: no job has it

    def tier(team: str) -> int:
        return 0 if lend and team == "b" else 100
    queued = {i + 1: QueuedJob(i + 1, team, "h100", g, 1, tier(team),
                               NOW - timedelta(seconds=i), max_runtime_seconds=e)
              for i, (team, g, e) in enumerate(jobs)}
    # Work that ran before the booking existed: the first node's `held` GPUs, no estimate.
    running: dict[int, tuple[RunningJob, datetime | None]] = {}
    for k, (_c, held) in enumerate(world):
        if held:
            r = RunningJob(900 + k, "b", "h100", held, 1, 0, started_at=NOW - timedelta(
                hours=1), nodes=(names[k],))
            running[r.id] = (r, None)
    stopping: list[tuple[datetime, str, int]] = []
    crossed: set[int] = set()
    breaches: list[str] = []
    now = NOW
    while now < NOW + timedelta(seconds=until):
        stopping = [s for s in stopping if s[0] > now]
        for rid, (_r, end) in list(running.items()):
            if end is not None and end <= now:
                del running[rid]
        used = dict.fromkeys(names, 0)
        for r, _ in running.values():
            used[r.nodes[0]] += r.total_gpus
        for _, n, g in stopping:
            used[n] += g
        if start + timedelta(seconds=CYCLE + GRACE) <= now < b.end:
            others = sum(r.total_gpus for r, _ in running.values()
                         if r.team != "vision" and r.tier_rank != lent)
            others += sum(g for _, _, g in stopping)
            if sum(cap.values()) - others < gpus:
                breaches.append(f"{now}: other teams hold {others} of the booked GPUs")
        if now == start or (now > start and now - timedelta(seconds=CYCLE) < start):
            on = sum(running[i][0].total_gpus for i in crossed if i in running)
            if sum(cap.values()) - on < gpus:
                breaches.append(f"{now}: jobs admitted before the start that cross it "
                                f"hold {on} GPUs")
        snapshot = snap_at(
            now, nodes=tuple(NodeState(n, "h100", cap[n], cap[n] - used[n]) for n in names),
            queued=tuple(queued.values()), running=tuple(r for r, _ in running.values()),
            bookings=(b,) if b.end > now else (), lend_tiers=frozenset({0}))
        plan = plan_admissions(snapshot)
        for p in plan.preemptions:
            for v in p.victims:
                r, _ = running.pop(v.job_id)
                stopping.append((now + timedelta(seconds=GRACE), r.nodes[0], r.total_gpus))
        for a in plan.admissions:
            j = queued.pop(a.job_id)
            end = None if j.max_runtime_seconds is None else \
                now + timedelta(seconds=j.max_runtime_seconds)
            r = RunningJob(j.id, j.team, "h100", j.gpus_per_replica, 1, j.tier_rank,
                           started_at=now,
                           nodes=a.placement, max_runtime_seconds=j.max_runtime_seconds)
            running[j.id] = (r, end)
            if j.team != "vision" and now < start and (end is None or end > start):
                crossed.add(j.id)
        now += timedelta(seconds=CYCLE)
    return breaches


def snap_at(now: datetime, **kw: Any) -> Any:
    return replace(snap(**kw), now=now)


WORLDS = st.lists(st.tuples(st.sampled_from([4, 8]), st.sampled_from([0, 0, 2, 4])),
                  min_size=1, max_size=3)
JOBS = st.lists(st.tuples(st.sampled_from(["a", "b", "vision"]), st.sampled_from([1, 2, 4, 8]),
                          st.sampled_from([None, 600, 1800, 3600, 3 * H])),
                min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=WORLDS, jobs=JOBS, start_min=st.sampled_from([15, 40, 90]),
       share=st.sampled_from([1, 2]))
def test_rule_w1_w2_property_booked_gpus_hold_only_the_team_after_one_cycle_and_grace(
        world: list[tuple[int, int]], jobs: list[tuple[str, int, int | None]],
        start_min: int, share: int) -> None:
    gpus = max(1, sum(c for c, _ in world) // share)
    world = [(c, min(h, c)) for c, h in world]
    assert simulate(world, jobs, start_min, gpus, until=start_min * 60 + 3 * CYCLE) == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=WORLDS, jobs=JOBS, start_min=st.sampled_from([15, 40, 90]),
       share=st.sampled_from([1, 2]))
def test_rule_w4_property_lent_gpus_are_the_only_other_teams_on_the_booking(
        world: list[tuple[int, int]], jobs: list[tuple[str, int, int | None]],
        start_min: int, share: int) -> None:
    gpus = max(1, sum(c for c, _ in world) // share)
    world = [(c, min(h, c)) for c, h in world]
    assert simulate(world, jobs, start_min, gpus, until=start_min * 60 + 3 * CYCLE,
                    lend=True) == []


def test_rule_w1_the_property_fails_when_w1_is_mutated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The property is not vacuous: with rule W1 off (no job is held back from a booking
    start) a crossing job lands on the booked GPUs and the check says so."""
    world, jobs = [(8, 0)], [("a", 8, None)]
    assert simulate(world, jobs, 40, 8, until=40 * 60 + 3 * CYCLE) == []
    monkeypatch.setattr(stage, "crossing", lambda p, t: [])
    monkeypatch.setattr("queueing.policy.stages.nodes.crossing", lambda p, t: [])
    breaches = simulate(world, jobs, 40, 8, until=40 * 60 + 3 * CYCLE)
    assert any("cross it" in b for b in breaches)


@settings(max_examples=40, deadline=None)
@given(world=WORLDS, jobs=JOBS, start_min=st.sampled_from([15, 40, 90]),
       team_share=st.sampled_from([1, 2]))
def test_rule_w1_the_memo_of_held_back_shapes_plans_as_the_reference(
        world: list[tuple[int, int]], jobs: list[tuple[str, int, int | None]],
        start_min: int, team_share: int) -> None:
    names = [f"h100-{i}" for i in range(len(world))]
    world_nodes = tuple(NodeState(n, "h100", c, c - min(h, c))
                        for n, (c, h) in zip(names, world, strict=True))
    queued = tuple(QueuedJob(i + 1, team, "h100", g, 1, 100, NOW - timedelta(seconds=i),
                             max_runtime_seconds=e) for i, (team, g, e) in enumerate(jobs))
    gpus = max(1, sum(c for c, _ in world) // team_share)
    s = snap(nodes=world_nodes, queued=queued,
             bookings=(book(gpus=gpus, start=start_min * 60),))
    fast = plan_admissions(s)
    stage._HELD_BACK = False
    try:
        reference = plan_admissions(s)
    finally:
        stage._HELD_BACK = True
    assert fast.admissions == reference.admissions
    assert dict(fast.waits) == dict(reference.waits)
