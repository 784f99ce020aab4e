"""Rules F1-F6 on the pure policy: closed-form decay, accumulator, factor, hierarchy,
entry penalty. Property tests with hypothesis; no database."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from queueing.policy.fairshare import (
    Accumulator,
    FairShareState,
    Standing,
    TeamUsageInput,
    compute_standings,
    decayed_interval_usage,
    entry_penalty_gpu_hours,
    fair_share_factor,
)

H = 168.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _numeric_integral(rate: float, start: datetime, end: datetime, as_of: datetime) -> float:
    n = 20_000
    dt = (end - start).total_seconds() / n
    total = 0.0
    for i in range(n):
        t = start + timedelta(seconds=(i + 0.5) * dt)
        total += rate * 2 ** (-((as_of - t).total_seconds() / 3600) / H) * dt / 3600
    return total


def test_rule_f1_closed_form_matches_the_integral() -> None:
    start, end, as_of = T0, T0 + timedelta(hours=30), T0 + timedelta(hours=100)
    exact = decayed_interval_usage(rate=8.0, start=start, end=end, as_of=as_of,
                                   half_life_hours=H)
    assert exact == pytest.approx(_numeric_integral(8.0, start, end, as_of), rel=1e-7)


def test_rule_f1_undecayed_for_a_short_recent_interval() -> None:
    got = decayed_interval_usage(rate=4.0, start=T0, end=T0 + timedelta(seconds=1),
                                 as_of=T0 + timedelta(seconds=1), half_life_hours=H)
    assert got == pytest.approx(4.0 / 3600, rel=1e-5)


@given(value=st.floats(0.0, 1e9), hours=st.floats(0.0, 2000.0))
def test_rule_f1_usage_halves_after_one_half_life(value: float, hours: float) -> None:
    acc = Accumulator(value, T0)
    now = T0 + timedelta(hours=hours)
    later = acc.at(now + timedelta(hours=H), H)
    assert later == pytest.approx(acc.at(now, H) / 2, rel=1e-9, abs=1e-300)


intervals = st.lists(
    st.tuples(
        st.floats(0.0, 64.0),  # rate
        st.integers(0, 60 * 24 * 3600),  # start offset, seconds
        st.integers(0, 5 * 24 * 3600),  # duration, seconds
    ),
    max_size=30,
)


@settings(max_examples=200)
@given(items=intervals, half_life=st.floats(1.0, 1000.0))
def test_rule_f1_accumulator_equals_the_full_recompute_in_any_order(
    items: list[tuple[float, int, int]], half_life: float
) -> None:
    now = T0 + timedelta(days=70)
    acc = Accumulator(0.0, T0)
    for rate, off, dur in items:
        s = T0 + timedelta(seconds=off)
        acc = acc.add_interval(rate=rate, start=s, end=s + timedelta(seconds=dur),
                               half_life_hours=half_life)
    rev = Accumulator(0.0, T0)
    for rate, off, dur in reversed(items):
        s = T0 + timedelta(seconds=off)
        rev = rev.add_interval(rate=rate, start=s, end=s + timedelta(seconds=dur),
                               half_life_hours=half_life)
    full = sum(
        decayed_interval_usage(rate=r, start=T0 + timedelta(seconds=o),
                               end=T0 + timedelta(seconds=o + d), as_of=now,
                               half_life_hours=half_life)
        for r, o, d in items
    )
    assert acc.at(now, half_life) == pytest.approx(full, rel=1e-9, abs=1e-12)
    assert rev.at(now, half_life) == pytest.approx(full, rel=1e-9, abs=1e-12)


def test_accumulator_merge_is_the_sum() -> None:
    a = Accumulator(10.0, T0)
    b = Accumulator(4.0, T0 + timedelta(hours=H))
    m = a.merge(b, H)
    assert m.as_of == b.as_of
    assert m.value == pytest.approx(5.0 + 4.0)


@given(u=st.floats(0.0, 1.0), s=st.floats(1e-6, 1.0))
def test_rule_f3_factor_is_in_0_1(u: float, s: float) -> None:
    assert 0.0 < fair_share_factor(u, s) <= 1.0


@given(u1=st.floats(0.0, 1.0), u2=st.floats(0.0, 1.0), s=st.floats(1e-3, 1.0))
def test_rule_f3_factor_falls_as_usage_grows(u1: float, u2: float, s: float) -> None:
    assume(u1 <= u2)
    assert fair_share_factor(u2, s) <= fair_share_factor(u1, s)
    if (u2 - u1) / s > 1e-9:  # strictly, above the resolution of a float
        assert fair_share_factor(u2, s) < fair_share_factor(u1, s)


@given(others=st.lists(st.floats(1e-2, 1e4), min_size=1, max_size=6),
       mine=st.floats(0.0, 1e4), more=st.floats(1e-3, 1e4))
def test_rule_f3_a_team_that_uses_more_gets_a_lower_factor(
    others: list[float], mine: float, more: float
) -> None:
    def factor(u: float) -> float:
        teams = [_team("me", 1.0, u)] + [_team(f"o{i}", 1.0, x) for i, x in enumerate(others)]
        return compute_standings(teams, now=T0, half_life_hours=H)["me"].factor

    assume(sum(others) > 0)
    assert factor(mine + more) < factor(mine)


@given(s=st.floats(1e-6, 1.0))
def test_rule_f3_factor_is_one_half_at_exactly_its_share(s: float) -> None:
    assert fair_share_factor(s, s) == pytest.approx(0.5)
    assert fair_share_factor(0.0, s) == 1.0


def _team(name: str, weight: float, usage: float, parent: str | None = None,
          active: bool = True) -> TeamUsageInput:
    return TeamUsageInput(team=name, weight=weight, accumulator=Accumulator(usage, T0),
                          parent=parent, active=active)


def test_rules_f2_f3_flat_standings() -> None:
    st_ = compute_standings([_team("a", 3, 60.0), _team("b", 1, 20.0), _team("c", 1, 0.0)],
                            now=T0, half_life_hours=H)
    assert st_["a"].share == pytest.approx(0.6)
    assert st_["a"].normalized_usage == pytest.approx(0.75)
    assert st_["a"].factor == pytest.approx(2 ** (-0.75 / 0.6))
    assert st_["b"].factor == pytest.approx(2 ** (-0.25 / 0.2))
    assert st_["c"].factor == 1.0
    assert st_["a"].level_share == st_["a"].share
    assert st_["a"].usage_fraction == st_["a"].normalized_usage


def test_rule_f2_total_zero_gives_u_zero_and_f_one() -> None:
    st_ = compute_standings([_team("a", 1, 0.0), _team("b", 2, 0.0)], now=T0, half_life_hours=H)
    assert all(s.normalized_usage == 0 and s.factor == 1.0 for s in st_.values())


def test_rule_f2_only_active_teams_share_the_cluster() -> None:
    st_ = compute_standings([_team("a", 1, 50.0), _team("b", 1, 50.0),
                             _team("idle", 2, 0.0, active=False)], now=T0, half_life_hours=H)
    assert st_["a"].share == pytest.approx(0.5)
    assert st_["a"].factor == pytest.approx(0.5)
    # An idle team is shown with the share it would get on becoming active.
    assert st_["idle"].share == pytest.approx(0.5)
    assert st_["idle"].factor == 1.0
    assert not st_["idle"].active


def test_rule_f4_hierarchy_follows_slurm_classic() -> None:
    # Department d (weight 1) with children x (3) and y (1); flat team e (weight 1).
    teams = [_team("d", 1, 0.0), _team("x", 3, 30.0, "d"), _team("y", 1, 10.0, "d"),
             _team("e", 1, 60.0)]
    st_ = compute_standings(teams, now=T0, half_life_hours=H)
    assert st_["d"].usage == pytest.approx(40.0)
    assert st_["d"].share == pytest.approx(0.5)
    assert st_["d"].normalized_usage == pytest.approx(0.4)
    assert st_["x"].share == pytest.approx(0.5 * 0.75)
    ua_x = 0.3
    ue_x = ua_x + (0.4 - ua_x) * 0.75
    assert st_["x"].normalized_usage == pytest.approx(ue_x)
    assert st_["x"].factor == pytest.approx(2 ** (-ue_x / 0.375))
    ue_y = 0.1 + (0.4 - 0.1) * 0.25
    assert st_["y"].factor == pytest.approx(2 ** (-ue_y / 0.125))
    assert st_["e"].factor == pytest.approx(2 ** (-0.6 / 0.5))


def test_rule_f4_unknown_parent_and_cycles_make_a_team_top_level() -> None:
    st_ = compute_standings([_team("a", 1, 1.0, "nope"), _team("b", 1, 1.0, "c"),
                             _team("c", 1, 1.0, "b")], now=T0, half_life_hours=H)
    assert st_["a"].parent is None
    assert {st_["b"].parent, st_["c"].parent} & {None}


flat_teams = st.lists(
    st.tuples(st.floats(0.1, 10.0), st.floats(0.0, 1e4)), min_size=1, max_size=12
)


@given(teams=flat_teams, charges=st.lists(st.tuples(st.integers(0, 11), st.floats(0, 50)),
                                          max_size=10))
def test_rule_f6_state_matches_standings_with_the_charges_as_extra_usage(
    teams: list[tuple[float, float]], charges: list[tuple[int, float]]
) -> None:
    inputs = [_team(f"t{i}", w, u) for i, (w, u) in enumerate(teams)]
    state = FairShareState.from_standings(compute_standings(inputs, now=T0, half_life_hours=H))
    extra: dict[str, float] = {}
    for i, h in charges:
        name = f"t{i % len(teams)}"
        state.charge(name, h)
        extra[name] = extra.get(name, 0.0) + h
    want = compute_standings(inputs, now=T0, half_life_hours=H, extra_usage=extra)
    for name, s in want.items():
        assert state.factor(name) == pytest.approx(s.factor, rel=1e-9, abs=1e-300)


def test_rule_f6_charging_a_child_moves_its_department() -> None:
    teams = [_team("d", 1, 0.0), _team("x", 1, 10.0, "d"), _team("y", 1, 10.0, "d"),
             _team("e", 1, 20.0)]
    state = FairShareState.from_standings(compute_standings(teams, now=T0, half_life_hours=H))
    before = state.copy()
    state.charge("x", 20.0)
    want = compute_standings(teams, now=T0, half_life_hours=H, extra_usage={"x": 20.0})
    for t in ("d", "x", "y", "e"):
        assert state.factor(t) == pytest.approx(want[t].factor)
    assert state.factor("x") < before.factor("x")
    assert state.factor("y") < before.factor("y")  # its department used more
    assert state.factor("e") > before.factor("e")
    assert before.factor("x") == pytest.approx(
        compute_standings(teams, now=T0, half_life_hours=H)["x"].factor)


def test_state_from_plain_standings_without_new_fields_is_flat() -> None:
    s = {"a": Standing("a", None, 1, 0.5, 10, 0.5, 0.5), "b": Standing("b", None, 1, 0.5, 10,
                                                                      0.5, 0.5)}
    state = FairShareState.from_standings(s)
    assert state.factor("a") == pytest.approx(0.5)
    assert state.factor("unknown") == 1.0


def test_rule_f6_entry_penalty_is_one_interval_of_weighted_gpu_time() -> None:
    assert entry_penalty_gpu_hours(8, 2.0, 300) == pytest.approx(8 * 2 * 300 / 3600)
    assert entry_penalty_gpu_hours(0, 2.0, 300) == 0.0
    assert entry_penalty_gpu_hours(4, 1.0, 0) == 0.0
    assert math.isclose(entry_penalty_gpu_hours(1, 1.0, 3600), 1.0)


trees = st.lists(
    st.tuples(st.floats(0.1, 10.0), st.floats(0.0, 1e4), st.integers(-1, 30),
              st.booleans()),
    min_size=1, max_size=15,
)


@settings(max_examples=150)
@given(teams=trees, charges=st.lists(st.tuples(st.integers(0, 14), st.floats(0, 50)),
                                     max_size=8))
def test_rule_f4_state_follows_any_tree_like_the_standings(
    teams: list[tuple[float, float, int, bool]], charges: list[tuple[int, float]]
) -> None:
    # Parent index p < i keeps it a forest; p >= i (or -1) makes a top-level team.
    inputs = [
        _team(f"t{i}", w, u, parent=f"t{p}" if 0 <= p < i else None, active=a)
        for i, (w, u, p, a) in enumerate(teams)
    ]
    standings = compute_standings(inputs, now=T0, half_life_hours=H)
    for s in standings.values():
        assert 0.0 < s.factor <= 1.0
        assert 0.0 <= s.share <= 1.0
    state = FairShareState.from_standings(standings)
    extra: dict[str, float] = {}
    for i, h in charges:
        name = f"t{i % len(teams)}"
        if not standings[name].active:
            continue  # only active teams are admitted (they have queued work, rule F2)
        state.charge(name, h)
        extra[name] = extra.get(name, 0.0) + h
    want = compute_standings(inputs, now=T0, half_life_hours=H, extra_usage=extra)
    for name, s in want.items():
        assert state.factor(name) == pytest.approx(s.factor, rel=1e-9, abs=1e-300)


@given(teams=flat_teams)
def test_rule_f4_flat_teams_give_exactly_rules_f1_to_f3(teams: list[tuple[float, float]]) -> None:
    inputs = [_team(f"t{i}", w, u) for i, (w, u) in enumerate(teams)]
    got = compute_standings(inputs, now=T0, half_life_hours=H)
    total_u = sum(u for _, u in teams)
    total_w = sum(w for w, _ in teams)
    for i, (w, u) in enumerate(teams):
        s = got[f"t{i}"]
        norm = u / total_u if total_u > 0 else 0.0
        assert s.share == pytest.approx(w / total_w)
        assert s.normalized_usage == pytest.approx(norm)
        assert s.factor == pytest.approx(fair_share_factor(norm, w / total_w))


def test_the_policy_imports_without_django() -> None:
    import subprocess
    import sys

    code = ("import sys; import queueing.policy.fairshare, queueing.policy.priority, "
            "queueing.policy.explain; "
            "assert not any(m == 'django' or m.startswith('django.') for m in sys.modules)")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "."}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
