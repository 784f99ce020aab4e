"""Rules D1-D3 and A8 (docs/scheduling.md, "Dependencies and arrays"), pure: no Django."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.dependencies import (
    Dependency,
    DependencyKind,
    Verdict,
    array_limit_reached,
    dependencies_stored,
    dependencies_verdict,
    dependency_cycle,
    dependency_verdict,
    parse_dependencies,
)
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    RunningJob,
    Snapshot,
)

OK, ANY, NOT_OK = DependencyKind.AFTER_OK, DependencyKind.AFTER_ANY, DependencyKind.AFTER_NOT_OK
MET, WAITING, NEVER = Verdict.MET, Verdict.WAITING, Verdict.NEVER
NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kind", "counts", "verdict"),
    [
        # one job
        (OK, {"QUEUED": 1}, WAITING),
        (OK, {"RUNNING": 1}, WAITING),
        (OK, {"PREEMPTED": 1}, WAITING),
        (OK, {"SUCCEEDED": 1}, MET),
        (OK, {"FAILED": 1}, NEVER),
        (OK, {"CANCELLED": 1}, NEVER),
        (ANY, {"ADMITTED": 1}, WAITING),
        (ANY, {"SUCCEEDED": 1}, MET),
        (ANY, {"FAILED": 1}, MET),
        (ANY, {"CANCELLED": 1}, MET),
        (NOT_OK, {"RUNNING": 1}, WAITING),
        (NOT_OK, {"FAILED": 1}, MET),
        (NOT_OK, {"CANCELLED": 1}, MET),
        (NOT_OK, {"SUCCEEDED": 1}, NEVER),
        # a whole array: counts per state
        (OK, {"SUCCEEDED": 9, "RUNNING": 1}, WAITING),
        (OK, {"SUCCEEDED": 10}, MET),
        (OK, {"SUCCEEDED": 8, "RUNNING": 1, "FAILED": 1}, NEVER),  # never, before all ended
        (ANY, {"SUCCEEDED": 8, "QUEUED": 2}, WAITING),
        (ANY, {"SUCCEEDED": 8, "CANCELLED": 2}, MET),
        (NOT_OK, {"SUCCEEDED": 9, "FAILED": 1}, MET),
        (NOT_OK, {"SUCCEEDED": 9, "QUEUED": 1}, WAITING),
        (NOT_OK, {"SUCCEEDED": 10}, NEVER),
        # a target that no longer exists can never be met
        (OK, None, NEVER),
        (ANY, {}, NEVER),
        (NOT_OK, {"SUCCEEDED": 0}, NEVER),
    ],
)
def test_rule_D1_D2_verdict_of_one_dependency(
    kind: DependencyKind, counts: dict[str, int] | None, verdict: Verdict
) -> None:
    assert dependency_verdict(kind, counts) is verdict


def test_rule_D1_all_must_be_met_and_the_first_waiting_is_named() -> None:
    deps = (Dependency(OK, job=1), Dependency(ANY, array=7), Dependency(OK, job=2))
    counts = {
        ("job", 1): {"SUCCEEDED": 1},
        ("array", 7): {"RUNNING": 2, "SUCCEEDED": 1},
        ("job", 2): {"QUEUED": 1},
    }
    state = dependencies_verdict(deps, counts)
    assert state.verdict is WAITING and state.on == deps[1]
    assert state.message == "waiting for array 7 (after_any)"
    done = {**counts, ("array", 7): {"SUCCEEDED": 3}, ("job", 2): {"SUCCEEDED": 1}}
    assert dependencies_verdict(deps, done).verdict is MET
    assert dependencies_verdict((), {}).verdict is MET


def test_rule_D2_one_never_met_decides_even_while_others_wait() -> None:
    deps = (Dependency(OK, job=1), Dependency(OK, job=2))
    state = dependencies_verdict(deps, {("job", 1): {"QUEUED": 1}, ("job", 2): {"FAILED": 1}})
    assert state.verdict is NEVER and state.on == deps[1]
    assert state.message.startswith("dependency after_ok on job 2 can never be met")


@pytest.mark.parametrize(
    ("edges", "cycle"),
    [
        ({}, None),
        ({1: [2], 2: [3], 3: []}, None),
        ({1: [2], 2: [3], 3: [1]}, [1, 2, 3, 1]),
        ({1: [1]}, [1, 1]),
        ({1: [4, 2], 2: [3], 3: [2], 4: [5], 5: [1]}, [1, 4, 5, 1]),  # a cycle not via 1 is skipped
        ({1: [2, 3], 2: [3], 3: [4], 4: []}, None),  # a diamond is no cycle
    ],
)
def test_rule_D3_cycle_found_from_the_job(edges: dict[int, list[int]], cycle: list[int] | None) -> None:
    assert dependency_cycle(1, edges) == cycle


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("afterok:1", "Must be a list"),
        ([{"type": "afterok", "job": 1}], "type must be one of"),
        ([{"type": "after_ok"}], "exactly one of job and array"),
        ([{"type": "after_ok", "job": 1, "array": 2}], "exactly one of job and array"),
        ([{"type": "after_ok", "job": "1"}], "positive integer"),
        ([{"type": "after_ok", "job": True}], "positive integer"),
        ([{"type": "after_ok", "job": 0}], "positive integer"),
        ([{"type": "after_ok", "job": 1, "x": 1}], "{type, job} or {type, array}"),
        ([{"type": "after_ok", "job": i} for i in range(1, 66)], "At most 64"),
    ],
)
def test_rule_D3_refuses_what_is_not_a_dependency(value: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("{", r"\{").replace("}", r"\}")):
        parse_dependencies(value)


def test_rule_D3_stored_form_round_trips_without_duplicates() -> None:
    raw = [{"type": "after_ok", "job": 3}, {"type": "after_any", "array": 2}, {"type": "after_ok", "job": 3}]
    deps = parse_dependencies(raw)
    assert len(deps) == 2
    assert dependencies_stored(deps) == raw[:2]


@pytest.mark.parametrize(
    ("active", "limit", "reached"),
    [
        (0, None, False),
        (100, None, False),
        (0, 1, False),
        (1, 1, True),
        (3, 4, False),
        (4, 4, True),
        (5, 4, True),
    ],
)
def test_rule_A8_array_limit(active: int, limit: int | None, reached: bool) -> None:
    assert array_limit_reached(active=active, limit=limit) is reached


# --- the rules inside the admission pass -----------------------------------------------------


def _snap(queued: tuple[QueuedJob, ...], running: tuple[RunningJob, ...] = (), **kw: object) -> Snapshot:
    nodes = (NodeState("h100-0", "h100", 8, 8 - sum(r.total_gpus for r in running)),)
    return Snapshot(
        now=NOW,
        nodes=nodes,
        queued=queued,
        running=running,
        preemption=PreemptionSettings(enabled=False),
        **kw,
    )  # type: ignore[arg-type]


def _q(job_id: int, **kw: object) -> QueuedJob:
    return QueuedJob(job_id, "a", "h100", 1, 1, 100, NOW - timedelta(seconds=100 - job_id), **kw)  # type: ignore[arg-type]


def test_rule_D1_in_the_pass_an_unmet_dependency_waits_and_a_met_one_is_admitted() -> None:
    deps = (Dependency(OK, job=1),)
    snapshot = _snap((_q(10, dependencies=deps),), dependency_counts={("job", 1): {"RUNNING": 1}})
    plan = plan_admissions(snapshot)
    assert plan.admissions == () and plan.never_met == {}
    wait = plan.waits[10]
    assert wait.reason is WaitReason.DEPENDENCY and wait.message == "waiting for job 1 (after_ok)"
    plan = plan_admissions(replace(snapshot, dependency_counts={("job", 1): {"SUCCEEDED": 1}}))
    assert [a.job_id for a in plan.admissions] == [10]


def test_rule_D2_in_the_pass_a_never_met_dependency_is_reported_for_the_cycle() -> None:
    snapshot = _snap(
        (_q(10, dependencies=(Dependency(NOT_OK, array=3),)), _q(11)),
        dependency_counts={("array", 3): {"SUCCEEDED": 4}},
    )
    plan = plan_admissions(snapshot)
    assert [a.job_id for a in plan.admissions] == [11]
    assert plan.waits[10].reason is WaitReason.DEPENDENCY_NEVER
    assert plan.never_met == {10: plan.waits[10].message}


def test_rule_A8_in_the_pass_at_most_the_limit_hold_gpus_counting_running_members() -> None:
    members = tuple(_q(i, array_id=5) for i in range(10, 16))
    running = (RunningJob(9, "a", "h100", 1, 1, 100, nodes=("h100-0",), array_id=5),)
    plan = plan_admissions(_snap(members, running, array_limits={5: 3}))
    assert [a.job_id for a in plan.admissions] == [10, 11]  # 1 running + 2 = the limit 3
    for job_id in (12, 13, 14, 15):
        assert plan.waits[job_id].reason is WaitReason.ARRAY_LIMIT
    assert "its limit of 3 at once (rule A8)" in plan.waits[12].message
    # Another array, and an array without a limit, are not held back by it.
    other = (*members, _q(20, array_id=6), _q(21))
    plan = plan_admissions(_snap(other, running, array_limits={5: 3}))
    assert {a.job_id for a in plan.admissions} == {10, 11, 20, 21}
