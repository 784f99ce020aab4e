"""A claim of one whole GPU that asks CPU or memory (rule A6) takes the search in rule
R4's price order (`preemption._one_gpu`, from heads kept across the pass in a flat
forest) and finds what building and weighing the levels finds
(`preemption._ONE_A6 = False`) and what the reference finds (`preemption._INDEX =
False`). A node where the first candidate alone leaves too little CPU or memory may need
a way of several victims: the search then leaves the claim to the levels. Random full
whole-GPU nodes that report CPU and memory, some of them short of what claims ask, in
flat and tree forests; every tier, owed and spared searches, some undone."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy import preemption
from queueing.policy.admission import plan_admissions
from queueing.policy.fairshare import FairShareState
from queueing.policy.preemption import find_victims
from queueing.policy.priority import PriorityWeights
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    RunningJob,
    Snapshot,
)
from queueing.policy.workspace import Workspace

from .test_r4_victims_by_nearness import NOW, WHOLE, _quotas, _tree

GIB = 2**30
CPU_NODE = 64_000


def a6_world(rnd: random.Random) -> Snapshot:
    """Nodes of 8 whole GPUs, full (a free GPU now and then), that report CPU and memory;
    running jobs of one GPU most (some of two, some gangs of two replicas) asking CPU and
    memory or not; queued claims of one GPU most, asking CPU and memory that some nodes
    hold with one victim gone and others only with several (or never)."""
    parent, teams, tree_nodes = _tree(rnd)
    names = [f"w{i}" for i in range(rnd.randrange(1, 6))]
    mem_node = {n: rnd.choice((128, 256, 512)) * GIB for n in names}
    free = dict.fromkeys(names, 8)
    cpu_free = dict.fromkeys(names, CPU_NODE)
    mem_free = dict(mem_node)
    running: list[RunningJob] = []

    def ask(n: str) -> tuple[int | None, int | None]:
        c = rnd.choice((None, 2000, 8000, 16_000))
        m = rnd.choice((None, 8 * GIB, 32 * GIB, 96 * GIB))
        c = c if c is not None and c <= cpu_free[n] else None
        m = m if m is not None and m <= mem_free[n] else None
        return c, m

    for n in names:
        while free[n] > 0:
            if rnd.random() < 0.03:
                break  # a free GPU: the search is not the one-GPU one while it stays
            g = 2 if free[n] >= 2 and rnd.random() < 0.1 else 1
            on = [n]
            if rnd.random() < 0.08:
                other = [o for o in names if o != n and free[o] >= g]
                if other:
                    on.append(rnd.choice(other))
            c, m = ask(n)
            if len(on) == 2 and ((c or 0) > cpu_free[on[1]] or (m or 0) > mem_free[on[1]]):
                on = [n]
            for o in on:
                free[o] -= g
                cpu_free[o] -= c or 0
                mem_free[o] -= m or 0
            started = NOW - timedelta(seconds=rnd.choice((30, 600, 3600, 20_000)))
            running.append(RunningJob(
                len(running) + 1, rnd.choice(teams), WHOLE, g, len(on),
                tier_rank=rnd.choice((0, 0, 100, 100, 200)),
                preemptible=rnd.random() < 0.85,
                started_at=None if rnd.random() < 0.05 else started,
                min_runtime_seconds=rnd.choice((0, 0, 300, 7200)),
                preemptions=rnd.choice((0, 0, 1, 3)),
                checkpointed_at=rnd.choice((None, NOW - timedelta(seconds=5))),
                nodes=tuple(on), cpu_millicores=c, memory_bytes=m))
    reports = rnd.choice(("both", "both", "cpu", "memory"))
    nodes = tuple(NodeState(
        n, WHOLE, 8, free[n],
        cpu_free=cpu_free[n] if reports != "memory" else None,
        memory_free=mem_free[n] if reports != "cpu" else None,
        cpu_allocatable=CPU_NODE if reports != "memory" else None,
        memory_allocatable=mem_node[n] if reports != "cpu" else None) for n in names)
    queued = [QueuedJob(
        id=1000 + k, team=rnd.choice(teams), gpu_type=WHOLE,
        gpus_per_replica=1 if rnd.random() < 0.9 else 2, replicas=1,
        tier_rank=rnd.choice((0, 100, 200, 200)),
        submitted_at=NOW - timedelta(seconds=rnd.randrange(1, 50_000)),
        cpu_millicores=rnd.choice((None, 1000, 8000, 20_000, 80_000)),
        memory_bytes=rnd.choice((None, 16 * GIB, 64 * GIB, 160 * GIB, 600 * GIB)))
        for k in range(rnd.randrange(1, 30))]
    usage = {t: rnd.uniform(0, 100) for t in teams}
    return Snapshot(
        now=NOW, nodes=nodes, queued=tuple(queued), running=tuple(running),
        quotas=_quotas(rnd, tree_nodes), team_parent=parent,
        fair_share_state=FairShareState(usage, {t: 1 / len(teams) for t in teams}),
        priority_weights=PriorityWeights(),
        preemption=PreemptionSettings(
            enabled=True, lost_per_wait=rnd.choice((None, 0.4)),
            max_per_team=rnd.choice((None, 3)), max_searches=rnd.choice((1, 4, 32)),
            max_preemptions_per_job=rnd.choice((None, 3))))


def _searches(s: Snapshot, seed: int, *, a6: bool, kept: bool = True, index: bool = True
              ) -> list[tuple[object, set[int]]]:
    """Every queued job's search in turn on one workspace (some undone, newest first),
    with the switches given; what each found and the victims removed."""
    rnd = random.Random(seed)
    preemption._ONE_A6, preemption._KEPT, preemption._INDEX = a6, kept, index
    try:
        ws, out = Workspace(s), []
        undos: list[Callable[[], None]] = []
        for job in s.queued:
            protect = rnd.random() < 0.4  # False: an owed claim (rule R11)
            spared = frozenset(r.id for r in s.running if rnd.random() < 0.15) \
                if rnd.random() < 0.3 else frozenset()
            found = find_victims(ws, job, now=s.now, factor=lambda t: 1.0 + len(t) % 3,
                                 protect=protect, spared=spared)
            out.append((found and found[0], set(ws.removed)))
            if found is not None:
                undos.append(found[1])
            if undos and rnd.random() < 0.3:
                for _ in range(rnd.randint(1, len(undos))):
                    undos.pop()()
        return out
    finally:
        preemption._ONE_A6, preemption._KEPT, preemption._INDEX = True, True, True


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32))
def test_rule_a6_a_one_gpu_claim_asking_cpu_or_memory_finds_what_the_levels_find(
    seed: int,
) -> None:
    """The search in price order (kept heads, or set up per claim) finds, for claims that
    ask CPU or memory, what weighing the levels finds and what the reference finds."""
    s = a6_world(random.Random(seed))
    want = _searches(s, seed, a6=False)
    assert _searches(s, seed, a6=True) == want
    assert _searches(s, seed, a6=True, kept=False) == want
    assert _searches(s, seed, a6=False, index=False) == want


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False))
def test_rule_a6_plans_with_the_one_gpu_search_are_the_plans_without(
    rnd: random.Random,
) -> None:
    s = a6_world(rnd)
    plan = plan_admissions(s)
    preemption._ONE_A6 = False
    try:
        want = plan_admissions(s)
    finally:
        preemption._ONE_A6 = True
    assert plan == want
    assert plan.waits.items() == want.waits.items()


def test_the_one_gpu_search_runs_for_claims_asking_cpu_or_memory() -> None:
    """In these worlds the search in price order runs for claims asking CPU or memory,
    finds victims for them, and leaves some to the levels (a node whose first candidate
    alone leaves too little): else the comparisons hold nothing."""
    calls = {"ran": 0, "found": 0, "left": 0, "tree_found": 0}
    inner: Any = preemption._one_gpu

    def counted(*args: Any) -> Any:
        got = inner(*args)
        if args[5] or args[6]:  # cpu, mem
            calls["ran"] += 1
            calls["found"] += got is not None and got is not False
            calls["left"] += got is False
            calls["tree_found"] += args[1].tree is not None and bool(got)
        return got

    preemption._one_gpu = counted  # type: ignore[assignment]
    try:
        for seed in range(200):
            _searches(a6_world(random.Random(seed)), seed, a6=True)
    finally:
        preemption._one_gpu = inner
    assert calls["ran"] > 300, calls
    assert calls["found"] > 100, calls
    assert calls["left"] > 10, calls
    assert calls["tree_found"] > 20, calls


def test_rule_a6_a_way_of_two_victims_is_cheaper_than_a_lone_candidate() -> None:
    """n0 holds two jobs that lost little work, each too small alone for the claim's
    memory; n1's only candidate alone makes room but lost more. Rule R4's price (total
    work lost) takes n0's two: on every path."""
    def run(jid: int, node: str, seconds: int, mem: int) -> RunningJob:
        return RunningJob(jid, "b", WHOLE, 1, 1, tier_rank=0,
                          started_at=NOW - timedelta(seconds=seconds), nodes=(node,),
                          memory_bytes=mem * GIB)

    running = (run(1, "n0", 60, 40), run(2, "n0", 60, 40), run(3, "n1", 7200, 80),
               run(4, "n1", 9000, 20))
    nodes = tuple(NodeState(n, WHOLE, 2, 0, memory_free=0, memory_allocatable=80 * GIB * 2)
                  for n in ("n0", "n1"))
    s = Snapshot(now=NOW, nodes=nodes, queued=(), running=running,
                 team_parent={"a": None, "b": None})
    claim = QueuedJob(id=10, team="a", gpu_type=WHOLE, gpus_per_replica=1, replicas=1,
                      tier_rank=100, submitted_at=NOW - timedelta(seconds=60),
                      memory_bytes=70 * GIB)
    for a6, kept, index in ((True, True, True), (True, False, True), (False, True, True),
                            (False, True, False)):
        preemption._ONE_A6, preemption._KEPT, preemption._INDEX = a6, kept, index
        try:
            found = find_victims(Workspace(s), claim, now=NOW, factor=lambda t: 1.0)
        finally:
            preemption._ONE_A6, preemption._KEPT, preemption._INDEX = True, True, True
        assert found is not None
        assert sorted(v.job_id for v in found[0].victims) == [1, 2], (a6, kept, index)
