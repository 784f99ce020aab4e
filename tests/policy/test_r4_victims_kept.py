"""A claim of one whole GPU in a flat forest reads its candidates from heads kept across
the pass (`preemption._Kept`, `_one_gpu_kept`: per team and run, the first job not
removed, read again only for the teams whose running jobs moved) and finds what the
same search set up per claim finds (`preemption._KEPT = False`) and what the reference
finds (`preemption._INDEX = False`); rule R11's count of borrowed GPUs kept per team
(`owed._borrowed_kept`) is the count summed again (`owed._KEPT = False`). Random flat
worlds of full whole-GPU nodes: every tier, non-preemptible jobs, ties of work lost
and of F, F moving between searches, owed and protected searches, spared jobs, searches
undone newest first and teams' running GPUs moved by bookings (rule W4)."""

from __future__ import annotations

import random
from collections.abc import Callable
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
from queueing.policy.stages import owed
from queueing.policy.stages.state import Pass
from queueing.policy.workspace import Workspace

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
GT = "h100"
FS = (0.25, 0.5, 1.0, 1.0, 2.0, 4.0)  # teams' F (rule R4's reclaim order), ties too


def flat_world(rnd: random.Random) -> Snapshot:
    """Full nodes of 8 whole GPUs (a few free GPUs in some worlds), one-GPU jobs most,
    2-12 teams of a flat forest with small nominal quotas (many borrow), queued claims of
    one GPU most."""
    teams = [f"t{k}" for k in range(rnd.randrange(2, 13))]
    nodes = [f"n{i}" for i in range(rnd.randrange(1, 7))]
    free = dict.fromkeys(nodes, 8)
    running: list[RunningJob] = []
    spare = rnd.choice((0, 0, 0, 1, 3))
    for n in nodes:
        while free[n] > 0:
            if spare and rnd.random() < 0.05:
                spare -= 1
                break
            g = 2 if free[n] >= 2 and rnd.random() < 0.1 else 1
            free[n] -= g
            started = NOW - timedelta(seconds=rnd.choice((30, 600, 3600, 20_000)))
            running.append(RunningJob(
                len(running) + 1, rnd.choice(teams), GT, g, 1,
                tier_rank=rnd.choice((0, 0, 100, 100, 200)),
                preemptible=rnd.random() < 0.85,
                started_at=None if rnd.random() < 0.05 else started,
                min_runtime_seconds=rnd.choice((0, 0, 300, 7200)),
                preemptions=rnd.choice((0, 0, 1, 3)),
                checkpointed_at=rnd.choice((None, NOW - timedelta(seconds=rnd.choice((5, 900))))),
                nodes=(n,)))
    queued = [QueuedJob(
        id=10_000 + k, team=rnd.choice(teams), gpu_type=GT,
        gpus_per_replica=1 if rnd.random() < 0.85 else 2, replicas=1,
        tier_rank=rnd.choice((0, 100, 200, 200)),
        submitted_at=NOW - timedelta(seconds=rnd.randrange(1, 50_000)))
        for k in range(rnd.randrange(1, 40))]
    quotas = {(t, GT): QuotaLimit(rnd.choice((0, 1, 2, 4, 8)),
                                  rnd.choice((None, None, 4, 16)), None)
              for t in teams if rnd.random() < 0.9}
    usage = {t: rnd.choice((0.0, 10.0, 50.0)) for t in teams}
    return Snapshot(
        now=NOW, nodes=tuple(NodeState(n, GT, 8, free[n]) for n in nodes),
        queued=tuple(queued), running=tuple(running), quotas=quotas,
        team_parent=dict.fromkeys(teams),
        fair_share_state=FairShareState(usage, {t: 1 / len(teams) for t in teams}),
        priority_weights=PriorityWeights(),
        preemption=PreemptionSettings(
            enabled=True, lost_per_wait=rnd.choice((None, None, 0.4)),
            max_per_team=rnd.choice((None, 5)), max_searches=rnd.choice((4, 64)),
            max_preemptions_per_job=rnd.choice((None, 3))))


def _searches(s: Snapshot, seed: int, *, kept: bool, index: bool = True
              ) -> list[tuple[object, set[int]]]:
    """Every queued job's search in turn on one workspace, with the `_KEPT` and `_INDEX`
    switches given: F moved, searches undone and bookings' moves made between them,
    the same each time for a seed; what each found and the victims removed."""
    rnd = random.Random(seed)
    preemption._KEPT, preemption._INDEX = kept, index
    teams = sorted({r.team for r in s.running} | {q.team for q in s.queued})
    fs = {t: rnd.choice(FS) for t in teams}
    try:
        ws, out = Workspace(s), []
        undos: list[Callable[[], None]] = []
        for job in s.queued:
            protect = rnd.random() < 0.4  # False: an owed claim (rule R11)
            spared = frozenset(r.id for r in s.running if rnd.random() < 0.2) \
                if rnd.random() < 0.5 else frozenset()
            found = find_victims(ws, job, now=s.now, factor=lambda t: fs.get(t, 1.0),
                                 protect=protect, spared=spared)
            out.append((found and found[0], set(ws.removed)))
            if found is not None:
                undos.append(found[1])
            if undos and rnd.random() < 0.3:
                for _ in range(rnd.randint(1, len(undos))):
                    undos.pop()()  # newest first: later searches read past their victims
            if rnd.random() < 0.3:
                fs[rnd.choice(teams)] = rnd.choice(FS)  # rule F6's charges
            if rnd.random() < 0.3:
                # A booking's jobs moved (rule W4): a team's flag of rule R2 flips.
                ws.ledger.move_running(rnd.choice(teams), GT, rnd.choice((-2, -1, 1, 2)))
        return out
    finally:
        preemption._KEPT, preemption._INDEX = True, True


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from((0, 32)))
def test_rule_r4_a_one_gpu_claims_victim_from_kept_heads_is_the_one_set_up_per_claim(
    seed: int, stale: int,
) -> None:
    """The search from kept heads finds what the search set up per claim finds, and
    what the reference finds; `stale` 0: the kept heaps made again at nearly every
    search."""
    s = flat_world(random.Random(seed))
    preemption._STALE = stale
    try:
        got = _searches(s, seed, kept=True)
    finally:
        preemption._STALE = 32
    assert got == _searches(s, seed, kept=False)
    assert got == _searches(s, seed, kept=False, index=False)


def _plan_checked(s: Snapshot) -> Plan:
    """`plan_admissions` with each kept count of borrowed GPUs compared with the count
    summed again at that moment."""
    kept = owed._borrowed_kept

    def checked(p: Pass, gpu_type: str) -> tuple[int, int, dict[str, int]]:
        got = kept(p, gpu_type)
        saved = p.borrowed.pop(gpu_type)
        owed._KEPT = False
        try:
            want = owed._borrowed(p, gpu_type)
        finally:
            owed._KEPT = True
            p.borrowed[gpu_type] = saved
        assert (got[1], got[2]) == (want[1], want[2])
        return got

    owed._borrowed_kept = checked  # type: ignore[assignment]
    try:
        return plan_admissions(s)
    finally:
        owed._borrowed_kept = kept  # type: ignore[assignment]


@settings(max_examples=200, deadline=None)
@given(st.randoms(use_true_random=False))
def test_rule_r11_plans_with_kept_heads_and_counts_are_the_plans_without(
    rnd: random.Random,
) -> None:
    s = flat_world(rnd)
    plan = _plan_checked(s)
    preemption._KEPT = owed._KEPT = False
    try:
        want = plan_admissions(s)
    finally:
        preemption._KEPT = owed._KEPT = True
    assert plan == want
    assert plan.waits.items() == want.waits.items()


def test_the_kept_search_runs_and_finds_in_these_worlds() -> None:
    """The worlds above take the kept path, and it finds victims there (else the
    comparisons hold nothing)."""
    calls: dict[str, int] = {"ran": 0, "found": 0}
    inner: Any = preemption._one_gpu_kept

    def counted(*args: Any) -> Any:
        got = inner(*args)
        calls["ran"] += 1
        calls["found"] += got is not None
        return got

    preemption._one_gpu_kept = counted  # type: ignore[assignment]
    try:
        for seed in range(40):
            _searches(flat_world(random.Random(seed)), seed, kept=True)
    finally:
        preemption._one_gpu_kept = inner
    assert calls["ran"] > 200
    assert calls["found"] > 100


def test_rule_r4_a_claim_reads_past_a_spared_job_when_its_cheapest_is_not_its_nodes_first(
) -> None:
    """Rule R4's price order (work lost before F) and a node's first by key (F before
    work lost) differ: c1 loses least but n0's first by key is b1 (lower F), so the
    search reads on; c2, next in c1's run, is spared (rule W4), so the victim is b1 -
    on every path."""
    now = NOW

    def run(jid: int, team: str, node: str, seconds: int) -> RunningJob:
        return RunningJob(jid, team, GT, 1, 1, tier_rank=100,
                          started_at=now - timedelta(seconds=seconds), nodes=(node,))

    running = (run(1, "c", "n0", 30), run(2, "b", "n0", 600), run(3, "c", "n1", 60),
               run(4, "c", "n1", 3600))
    s = Snapshot(
        now=now, nodes=(NodeState("n0", GT, 2, 0), NodeState("n1", GT, 2, 0)),
        queued=(), running=running,
        quotas={("a", GT): QuotaLimit(4, None, None), ("b", GT): QuotaLimit(0, None, None),
                ("c", GT): QuotaLimit(0, None, None)},
        team_parent=dict.fromkeys("abc"))
    claim = QueuedJob(id=10, team="a", gpu_type=GT, gpus_per_replica=1, replicas=1,
                      tier_rank=100, submitted_at=now - timedelta(seconds=60))
    fs = {"b": 1.0, "c": 2.0}
    for kept, index in ((True, True), (False, True), (False, False)):
        preemption._KEPT, preemption._INDEX = kept, index
        try:
            found = find_victims(Workspace(s), claim, now=now, factor=fs.__getitem__,
                                 protect=False, spared=frozenset({3}))
        finally:
            preemption._KEPT, preemption._INDEX = True, True
        assert found is not None
        assert [v.job_id for v in found[0].victims] == [2], (kept, index)
