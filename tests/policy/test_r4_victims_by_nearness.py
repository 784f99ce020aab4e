"""Rule R4's victim search read one level of rule Q6's nearness at a time
(`preemption._Levels`, `_take_per_replica_by_level`) finds what the reference finds
(`preemption._INDEX = False`: every candidate of the type built, sorted and weighed), over
random worlds: a quota tree (or a flat forest), whole-GPU nodes (some reporting CPU) and
a time-sliced type (rules H1-H6), running jobs of every tier, owed claims (rule R11: no
rule R3 protection) and spared jobs (rule W4). Both the searches one after another on a
workspace (each keeping its victims, as the pass does) and whole plans are compared."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy import preemption
from queueing.policy.admission import Plan, plan_admissions
from queueing.policy.fairshare import FairShareState
from queueing.policy.preemption import find_victims
from queueing.policy.priority import PriorityWeights
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)
from queueing.policy.workspace import Workspace

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
WHOLE, SLICED, S = "h100", "a10", 4


def _tree(rnd: random.Random) -> tuple[dict[str, str | None], list[str], list[str]]:
    """(parents, teams with jobs, every node): a 1-3 level tree, or a flat forest."""
    if rnd.random() < 0.2:
        teams = [f"t{k}" for k in range(rnd.randrange(2, 6))]
        return dict.fromkeys(teams), teams, teams
    parent: dict[str, str | None] = {}
    teams: list[str] = []
    for d in range(rnd.randrange(1, 4)):
        div = f"d{d}"
        parent[div] = None
        for e in range(rnd.randrange(1, 4)):
            dept = f"{div}.e{e}"
            parent[dept] = div
            for k in range(rnd.randrange(1, 4)):
                team = f"{dept}.t{k}"
                parent[team] = dept
                teams.append(team)
            if rnd.random() < 0.2:
                teams.append(dept)  # a department's own jobs
    return parent, teams, list(parent)


def _quotas(rnd: random.Random, nodes: list[str]) -> dict[tuple[str, str], QuotaLimit]:
    quotas = {}
    for n in nodes:
        for gt, unit in ((WHOLE, 1), (SLICED, S)):
            if rnd.random() < 0.85:
                quotas[(n, gt)] = QuotaLimit(
                    rnd.choice((0, 2, 4, 8, 16)) * unit,
                    rnd.choice((None, None, 0, 4 * unit, 8 * unit)),
                    rnd.choice((None, None, 2 * unit)))
    return quotas


def _running(rnd: random.Random, teams: list[str], whole: list[NodeState],
             sliced: list[NodeState], cpu: bool) -> tuple[list[RunningJob], dict[str, int], dict[str, Any]]:
    free = {n.name: n.capacity for n in whole}
    cpu_free = {n.name: 64_000 for n in whole}
    gpu_free = {n.name: [S] * (n.capacity // S) for n in sliced}
    out: list[RunningJob] = []

    def common() -> dict[str, Any]:
        started = NOW - timedelta(seconds=rnd.choice((30, 600, 3600, 20_000)))
        return {
            "tier_rank": rnd.choice((0, 0, 100, 100, 200)),
            "preemptible": rnd.random() < 0.85,
            "started_at": None if rnd.random() < 0.05 else started,
            "min_runtime_seconds": rnd.choice((0, 0, 300, 7200)),
            "preemptions": rnd.choice((0, 0, 1, 3)),
            "checkpointed_at": rnd.choice((None, NOW - timedelta(seconds=rnd.choice((5, 900)))))}

    for _ in range(rnd.randrange(5, 60 if whole else 90)):
        jid = len(out) + 1
        if rnd.random() < 0.5 and whole:
            g, reps = rnd.choice((1, 1, 2, 4, 8)), rnd.choice((1, 1, 1, 2))
            c = rnd.choice((0, 4000, 16_000)) if cpu else 0
            on = []
            for _ in range(reps):
                fit = [n for n in free if free[n] >= g and cpu_free[n] >= c]
                if not fit:
                    break
                n = rnd.choice(fit)
                free[n] -= g
                cpu_free[n] -= c
                on.append(n)
            if len(on) != reps:
                for n in on:
                    free[n] += g
                    cpu_free[n] += c
                continue
            out.append(RunningJob(jid, rnd.choice(teams), WHOLE, g, reps, nodes=tuple(on),
                                  cpu_millicores=c or None, **common()))
        elif sliced:
            n = rnd.choice(sliced).name
            gf = gpu_free[n]
            units = rnd.choice((1, 1, 2, 3, S, 2 * S))
            fit = [i for i, f in enumerate(gf) if (f == S if units >= S else f >= units)]
            if len(fit) < max(1, units // S):
                continue
            slots = tuple(sorted(rnd.sample(fit, max(1, units // S))))
            for i in slots:
                gf[i] -= min(units, S)
            out.append(RunningJob(jid, rnd.choice(teams), SLICED, units, 1, nodes=(n,),
                                  gpu_slots=slots, **common()))
    return out, {**free, **{n: sum(g) for n, g in gpu_free.items()}}, \
        {**cpu_free, **gpu_free}


def world(rnd: random.Random, sliced_only: bool = False) -> Snapshot:
    """`sliced_only`: the time-sliced type full of fractions and claims of it, whole
    GPUs most (the fleet's claims that need a GPU all of whose jobs they may take)."""
    parent, teams, tree_nodes = _tree(rnd)
    cpu = rnd.random() < 0.3 and not sliced_only
    whole = [] if sliced_only else [NodeState(f"w{i}", WHOLE, 8, 8)
                                    for i in range(rnd.randrange(1, 5))]
    sliced = [NodeState(f"s{i}", SLICED, 4 * S, 4 * S, slices_per_gpu=S)
              for i in range(rnd.randrange(1 if sliced_only else 0, 4))]
    running, free, more = _running(rnd, teams, whole, sliced, cpu)
    nodes = tuple(
        [replace(n, free=free[n.name], cpu_free=more[n.name] if cpu else None,
                 cpu_allocatable=64_000 if cpu else None) for n in whole]
        + [replace(n, free=free[n.name], gpu_free=tuple(more[n.name])) for n in sliced])
    queued = []
    for k in range(rnd.randrange(1, 25)):
        if sliced_only:
            gt, g, reps = SLICED, rnd.choice((1, 3, S, S, S, 2 * S)), rnd.choice((1, 1, 2))
        elif sliced and rnd.random() < 0.5:
            gt, g, reps = SLICED, rnd.choice((1, 2, 3, S, S)), 1
        else:
            gt, g, reps = WHOLE, rnd.choice((1, 2, 4, 8)), rnd.choice((1, 1, 2))
        queued.append(QueuedJob(
            id=1000 + k, team=rnd.choice(teams), gpu_type=gt, gpus_per_replica=g,
            replicas=reps, tier_rank=rnd.choice((0, 100, 200, 200)),
            submitted_at=NOW - timedelta(seconds=rnd.randrange(1, 50_000)),
            cpu_millicores=rnd.choice((None, 2000, 32_000)) if cpu and gt == WHOLE else None))
    usage = {t: rnd.uniform(0, 100) for t in teams}
    return Snapshot(
        now=NOW, nodes=nodes, queued=tuple(queued), running=tuple(running),
        quotas=_quotas(rnd, tree_nodes), team_parent=parent,
        fair_share_state=FairShareState(usage, {t: 1 / len(teams) for t in teams}),
        priority_weights=PriorityWeights(), units_per_gpu={SLICED: S},
        preemption=PreemptionSettings(
            enabled=True, lost_per_wait=rnd.choice((None, 0.4)),
            max_per_team=rnd.choice((None, 3)), max_searches=rnd.choice((1, 4, 32)),
            max_preemptions_per_job=rnd.choice((None, 3))))


def _reference(s: Snapshot) -> Plan:
    preemption._INDEX = False
    try:
        return plan_admissions(s)
    finally:
        preemption._INDEX = True


@settings(max_examples=300, deadline=None)
@given(st.randoms(use_true_random=False))
def test_rule_r4_the_search_by_nearness_finds_the_victims_reading_all_finds(
    rnd: random.Random,
) -> None:
    s = world(rnd)
    factors = {t: rnd.choice((0.5, 1.0, 2.0)) for t in s.team_parent}
    ws, ref = Workspace(s), Workspace(s)
    for job in s.queued:
        protect = rnd.random() < 0.5  # False: an owed claim (rule R11)
        spared = frozenset(r.id for r in s.running if rnd.random() < 0.1)
        def factor(t: str) -> float:
            return factors.get(t, 1.0)

        found = find_victims(ws, job, now=s.now, factor=factor, protect=protect, spared=spared)
        preemption._INDEX = False
        try:
            want = find_victims(ref, job, now=s.now, factor=factor, protect=protect,
                                spared=spared)
        finally:
            preemption._INDEX = True
        assert (found and found[0]) == (want and want[0])
        assert ws.removed == ref.removed
        assert ws.capacity.gpu_free == ref.capacity.gpu_free
        assert ws.capacity.free == ref.capacity.free
        if found is not None and want is not None and rnd.random() < 0.3:
            found[1]()  # some searches undone, the others' victims kept
            want[1]()


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False))
def test_rule_r4_plans_with_the_search_by_nearness_are_the_reference_plans(
    rnd: random.Random,
) -> None:
    s = world(rnd)
    plan, want = plan_admissions(s), _reference(s)
    assert plan == want
    assert plan.waits.items() == want.waits.items()


def test_rule_q6_a_node_needing_a_farther_victim_loses_to_one_a_nearer_level_frees() -> None:
    """Node w0 makes room with its claimant's sibling's job and a job of another
    division; node w1 with a cousin's job alone. Rule R4's price starts with the farthest
    victim's nearness (rule Q6): w1's cousin (-2) beats w0's other division (0), although
    w0 is the first node the nearest level reaches."""
    parent: dict[str, str | None] = {
        "d0": None, "d0.e0": "d0", "d0.e0.me": "d0.e0", "d0.e0.sib": "d0.e0",
        "d0.e1": "d0", "d0.e1.cousin": "d0.e1", "d1": None, "d1.e0": "d1",
        "d1.e0.other": "d1.e0", "x": None}
    quotas = {(t, WHOLE): QuotaLimit(8 if t == "d0.e0.me" else 0) for t in parent
              if t.count(".") == 2}
    hour = NOW - timedelta(hours=1)

    def run(jid: int, team: str, g: int, node: str, tier: int = 100) -> RunningJob:
        return RunningJob(jid, team, WHOLE, g, 1, tier, started_at=hour, nodes=(node,))

    running = (run(1, "d0.e0.sib", 1, "w0"), run(2, "d1.e0.other", 1, "w0"),
               run(3, "x", 6, "w0", tier=200), run(4, "d0.e1.cousin", 2, "w1"),
               run(5, "x", 6, "w1", tier=200))
    s = Snapshot(now=NOW, nodes=(NodeState("w0", WHOLE, 8, 0), NodeState("w1", WHOLE, 8, 0)),
                 queued=(QueuedJob(9, "d0.e0.me", WHOLE, 2, 1, 100, NOW),), running=running,
                 quotas=quotas, team_parent=parent, priority_weights=PriorityWeights(),
                 preemption=PreemptionSettings(enabled=True, lost_per_wait=None))
    for indexed in (True, False):
        preemption._INDEX = indexed
        try:
            found = find_victims(Workspace(s), s.queued[0], now=NOW, factor=lambda _t: 1.0,
                                 protect=False)
        finally:
            preemption._INDEX = True
        assert found is not None
        assert [v.job_id for v in found[0].victims] == [4]
        assert found[0].placement == ("w1",)


def test_rule_q4_a_claim_over_its_divisions_limit_takes_a_cousins_job_first() -> None:
    """Step 1b (rules Q1, Q4): division d0 may hold 6 GPUs, its teams hold 5 (a
    sibling's 1-GPU job, a cousin's 4-GPU job) and team me claims 4 more: the search
    takes under the binding division in rule R4's order, the sibling's then the
    cousin's (a farther group), and spares the sibling; the other division's job does
    not help."""
    parent: dict[str, str | None] = {
        "d0": None, "d0.e0": "d0", "d0.e0.me": "d0.e0", "d0.e0.sib": "d0.e0", "d0.e1": "d0",
        "d0.e1.cousin": "d0.e1", "d1": None, "d1.e0": "d1", "d1.e0.other": "d1.e0"}
    quotas = {("d0", WHOLE): QuotaLimit(6, 0), ("d0.e0.me", WHOLE): QuotaLimit(4),
              ("d0.e0.sib", WHOLE): QuotaLimit(0), ("d0.e1.cousin", WHOLE): QuotaLimit(0),
              ("d1.e0.other", WHOLE): QuotaLimit(0)}
    hour = NOW - timedelta(hours=1)
    running = (RunningJob(1, "d0.e1.cousin", WHOLE, 4, 1, 0, started_at=hour, nodes=("w0",)),
               RunningJob(2, "d1.e0.other", WHOLE, 8, 1, 0, started_at=hour, nodes=("w1",)),
               RunningJob(3, "d0.e0.sib", WHOLE, 1, 1, 0, started_at=hour, nodes=("w0",)))
    s = Snapshot(now=NOW, nodes=(NodeState("w0", WHOLE, 8, 3), NodeState("w1", WHOLE, 8, 0)),
                 queued=(QueuedJob(9, "d0.e0.me", WHOLE, 4, 1, 100, NOW),), running=running,
                 quotas=quotas, team_parent=parent, priority_weights=PriorityWeights(),
                 preemption=PreemptionSettings(enabled=True, lost_per_wait=None))
    for indexed in (True, False):
        preemption._INDEX = indexed
        try:
            found = find_victims(Workspace(s), s.queued[0], now=NOW, factor=lambda _t: 1.0,
                                 protect=False)
        finally:
            preemption._INDEX = True
        assert found is not None
        assert [v.job_id for v in found[0].victims] == [1]


@settings(max_examples=400, deadline=None)
@given(st.randoms(use_true_random=False))
def test_rule_h6_a_fractions_ways_per_gpu_are_the_ways_reading_the_node(
    rnd: random.Random,
) -> None:
    """`_fraction_ways` (each GPU's own candidates) gives `_packed_choices`' ways for a
    fraction on one packed node, victims of several GPUs and CPU included."""
    gpus = rnd.randrange(1, 5)
    gf = [S] * gpus
    jobs: list[RunningJob] = []
    for k in range(rnd.randrange(0, 12)):
        units = rnd.choice((1, 2, 3, S, 2 * S))
        fit = [i for i, f in enumerate(gf) if (f == S if units >= S else f >= units)]
        if len(fit) < max(1, units // S):
            continue
        slots = tuple(sorted(rnd.sample(fit, max(1, units // S))))
        for i in slots:
            gf[i] -= min(units, S)
        jobs.append(RunningJob(k + 1, "t", SLICED, units, 1, 0, nodes=("s0",), gpu_slots=slots,
                               cpu_millicores=rnd.choice((None, 1000))))
    rnd.shuffle(jobs)
    cpu = rnd.choice((0, 0, 1500))
    node = NodeState("s0", SLICED, gpus * S, sum(gf), slices_per_gpu=S, gpu_free=tuple(gf),
                     cpu_free=rnd.choice((None, 0, 1000)) if cpu else None)
    cap = Workspace(Snapshot(now=NOW, nodes=(node,), queued=(), running=tuple(jobs),
                             quotas={})).capacity
    barred = {r.id for r in jobs if rnd.random() < 0.2}

    def allowed(r: RunningJob) -> bool:
        return r.id not in barred

    given = {(r.id, "s0"): preemption._given(cap, r, "s0") for r in jobs}
    for g in range(1, S):
        assert preemption._fraction_ways(cap, "s0", jobs, given, allowed, g, cpu, 0) == \
            preemption._packed_choices(cap, "s0", jobs, allowed, g, cpu, 0)


def _searches(s: Snapshot, rnd: random.Random, *, index: bool, bound: bool
              ) -> list[tuple[object, set[int]]]:
    """Every queued job's search in turn on one workspace (some undone), with the
    `_INDEX` and `_BOUND` switches given; what each found and the victims removed."""
    preemption._INDEX, preemption._BOUND = index, bound
    try:
        ws, out = Workspace(s), []
        for job in s.queued:
            protect = rnd.random() < 0.5  # False: an owed claim (rule R11)
            spared = frozenset(r.id for r in s.running if rnd.random() < 0.1)
            found = find_victims(ws, job, now=s.now, factor=lambda t: 1.0 + len(t) % 3,
                                 protect=protect, spared=spared)
            out.append((found and found[0], set(ws.removed)))
            if found is not None and rnd.random() < 0.3:
                found[1]()
        return out
    finally:
        preemption._INDEX, preemption._BOUND = True, True


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32))
def test_rule_h6_whole_gpu_claims_weigh_only_nodes_their_candidates_can_empty(
    seed: int,
) -> None:
    """Step 2 on the time-sliced type (`preemption._BOUND`, `_packed_bounds`): a claim
    of whole GPUs (and fractions, and gangs) weighing only the nodes whose GPUs its
    candidates could empty by a level finds what weighing every node the levels reach
    finds, and what the reference search finds; owed and spared searches."""
    s = world(random.Random(seed), sliced_only=True)
    want = _searches(s, random.Random(seed), index=False, bound=False)
    assert _searches(s, random.Random(seed), index=True, bound=False) == want
    assert _searches(s, random.Random(seed), index=True, bound=True) == want


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False))
def test_rule_h6_plans_with_the_bound_on_packed_nodes_are_the_plans_without(
    rnd: random.Random,
) -> None:
    s = world(rnd, sliced_only=True)
    plan = plan_admissions(s)
    preemption._BOUND = False
    try:
        want = plan_admissions(s)
    finally:
        preemption._BOUND = True
    assert plan == want
    assert plan.waits.items() == want.waits.items()
    assert plan == _reference(s)


def test_rule_h6_a_gpu_holding_a_job_it_may_not_take_bounds_no_node() -> None:
    """One GPU of a 4-slice node holds a fraction of the claimant's own top tier (no
    candidate, rule R1), the other one only lower-tier fractions of its team: only the
    second can be emptied, by the claimant's own level (nearness 0); no GPU can for a
    claimant of a tier those jobs are not below."""
    hour = NOW - timedelta(hours=1)

    def frac(jid: int, gpu: int, tier: int) -> RunningJob:
        return RunningJob(jid, "me", SLICED, 2, 1, tier, started_at=hour, nodes=("s0",),
                          gpu_slots=(gpu,))

    running = (frac(1, 0, 100), frac(2, 0, 0), frac(3, 1, 0), frac(4, 1, 0))
    s = Snapshot(now=NOW, nodes=(NodeState("s0", SLICED, 2 * S, 0, slices_per_gpu=S,
                                           gpu_free=(0, 0)),),
                 queued=(QueuedJob(9, "me", SLICED, S, 1, 100, NOW),
                         QueuedJob(10, "me", SLICED, S, 1, 0, NOW)),
                 running=running, quotas={("me", SLICED): QuotaLimit(8 * S)},
                 team_parent={"me": None}, units_per_gpu={SLICED: S},
                 preemption=PreemptionSettings(enabled=True, lost_per_wait=None))
    ws = Workspace(s)
    for job, want in ((s.queued[0], {"s0": 0}), (s.queued[1], {})):
        levels = preemption._Levels(ws, job, preemption._by_team(ws, SLICED, NOW, False),
                                    "", True, lambda _t: 1.0, ())
        assert preemption._packed_bounds(ws, levels, SLICED, S) == want
    found = find_victims(ws, s.queued[0], now=NOW, factor=lambda _t: 1.0, protect=False)
    assert found is not None and [v.job_id for v in found[0].victims] == [3, 4]


def _one_gpu_world(rnd: random.Random) -> Snapshot:
    """`world` with most claims of one whole GPU (`preemption._one_gpu`), some of them
    of a team's full node pool (no free GPU)."""
    s = world(rnd)
    queued = tuple(
        replace(q, gpu_type=WHOLE, gpus_per_replica=1, replicas=1, cpu_millicores=None)
        if rnd.random() < 0.8 else q for q in s.queued)
    return replace(s, queued=queued)


def _one_searches(s: Snapshot, rnd: random.Random, *, one: bool, index: bool = True
                  ) -> list[tuple[object, set[int]]]:
    """Every queued job's search in turn on one workspace (some undone), with the
    `_ONE` and `_INDEX` switches given; what each found and the victims removed."""
    preemption._ONE, preemption._INDEX = one, index
    try:
        ws, out = Workspace(s), []
        kept: list[Any] = []  # the undos of the searches kept, last on top
        for job in s.queued:
            protect = rnd.random() < 0.5  # False: an owed claim (rule R11)
            spared = frozenset(r.id for r in s.running if rnd.random() < 0.1) \
                if rnd.random() < 0.3 else frozenset()
            found = find_victims(ws, job, now=s.now, factor=lambda t: 1.0 + len(t) % 3,
                                 protect=protect, spared=spared)
            out.append((found and found[0], set(ws.removed)))
            if found is not None:
                kept.append(found[1])
            if kept and rnd.random() < 0.3:
                # Some of the last searches undone, newest first: their victims, which
                # later searches read past, are read again by the next ones.
                for _ in range(rnd.randint(1, len(kept))):
                    kept.pop()()
        return out
    finally:
        preemption._ONE, preemption._INDEX = True, True


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32))
def test_rule_r4_a_one_gpu_claims_victim_is_the_one_the_levels_weigh_to(seed: int) -> None:
    """Steps 2 and 3 for a claim of one whole GPU (`preemption._one_gpu`: the candidates
    read in rule R4's price order from runs kept for the pass) find what building and
    weighing the levels finds, and what the reference finds: flat and tree forests,
    every tier, owed and spared searches, some undone."""
    s = _one_gpu_world(random.Random(seed))
    want = _one_searches(s, random.Random(seed), one=False)
    assert _one_searches(s, random.Random(seed), one=True) == want
    assert _one_searches(s, random.Random(seed), one=False, index=False) == want


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False))
def test_rule_r4_plans_with_the_one_gpu_search_are_the_plans_without(
    rnd: random.Random,
) -> None:
    s = _one_gpu_world(rnd)
    plan = plan_admissions(s)
    preemption._ONE = False
    try:
        want = plan_admissions(s)
    finally:
        preemption._ONE = True
    assert plan == want
    assert plan.waits.items() == want.waits.items()
