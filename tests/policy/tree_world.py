"""Worlds for the quota tree's tests (docs/scheduling.md, "Quotas in a tree"): teams and
departments on one GPU type, running jobs packed on 8-GPU nodes, and the next cycle
of a plan (victims gone, admissions running, preemptors nominated, rule R8)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from queueing.policy.admission import Plan, plan_admissions
from queueing.policy.priority import PriorityWeights
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
GT = "h100"
NODE = 8
TIER = 100
# Preemption on, rule R9 off: which jobs are victims is what these tests look at.
PRE = PreemptionSettings(enabled=True, lost_per_wait=None, max_per_team=None,
                         max_preemptions_per_job=None)


def place(jobs: Iterable[tuple[int, str, int]], nodes: int, *,
          tier: int = TIER) -> tuple[RunningJob, ...]:
    """Running jobs (id, team, GPUs) of 1-GPU replicas, packed on `nodes` 8-GPU nodes in
    order (each replica on the first node with a free GPU), an hour old."""
    free = [NODE] * nodes
    out = []
    for job_id, team, gpus in jobs:
        on = []
        for _ in range(gpus):
            i = next(k for k, f in enumerate(free) if f > 0)
            free[i] -= 1
            on.append(f"{GT}-{i}")
        out.append(RunningJob(job_id, team, GT, 1, gpus, tier, preemptible=True,
                              started_at=NOW - timedelta(hours=1), nodes=tuple(on)))
    return tuple(out)


def node_states(running: Iterable[RunningJob], nodes: int) -> tuple[NodeState, ...]:
    used = [0] * nodes
    for r in running:
        for name in r.nodes:
            used[int(name.rsplit("-", 1)[1])] += r.gpus_per_replica
    return tuple(NodeState(f"{GT}-{i}", GT, NODE, NODE - used[i]) for i in range(nodes))


def queued(job_id: int, team: str, gpus: int, *, tier: int = TIER) -> QueuedJob:
    """A gang of `gpus` 1-GPU replicas."""
    return QueuedJob(job_id, team, GT, 1, gpus, tier,
                     NOW - timedelta(minutes=10) + timedelta(seconds=job_id))


def world(parent: Mapping[str, str | None], quotas: Mapping[str, QuotaLimit],
          running: tuple[RunningJob, ...], queue: Iterable[QueuedJob], nodes: int,
          **kw: Any) -> Snapshot:
    kw.setdefault("preemption", PRE)
    kw.setdefault("priority_weights", PriorityWeights(fair_share=0.0, age=1.0, size=0.0))
    return Snapshot(now=NOW, nodes=node_states(running, nodes), queued=tuple(queue),
                    running=running, quotas={(t, GT): q for t, q in quotas.items()},
                    team_parent=dict(parent), **kw)


def next_cycle(s: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot of the next cycle: the preempted victims gone (their grace passed),
    the admitted jobs running where they were placed, the preemptors nominated with
    their victims gone (rule R8)."""
    gone = {v.job_id for p in plan.preemptions for v in p.victims}
    by_id = {j.id: j for j in s.queued}
    started = tuple(RunningJob(a.job_id, a.team, a.gpu_type, by_id[a.job_id].gpus_per_replica,
                               by_id[a.job_id].replicas, by_id[a.job_id].tier_rank,
                               started_at=s.now, nodes=a.placement)
                    for a in plan.admissions)
    running = tuple(r for r in s.running if r.id not in gone) + started
    admitted = {a.job_id for a in plan.admissions}
    nodes = len(s.nodes)
    return replace(s, running=running, nodes=node_states(running, nodes),
                   queued=tuple(j for j in s.queued if j.id not in admitted),
                   nominated={p.preemptor_id: 0 for p in plan.preemptions},
                   nominated_placement={p.preemptor_id: p.placement
                                        for p in plan.preemptions})


def two_cycles(s: Snapshot) -> tuple[Plan, Snapshot, Plan]:
    """Plan, let the victims go, plan again."""
    first = plan_admissions(s)
    s2 = next_cycle(s, first)
    return first, s2, plan_admissions(s2)


def victim_teams(plan: Plan) -> list[str]:
    return sorted(v.team for p in plan.preemptions for v in p.victims)
