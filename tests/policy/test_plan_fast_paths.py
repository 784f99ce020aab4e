"""The plan's shortcuts for a long queue (issue 20) give what their plain references give,
over random snapshots (hypothesis): rule E4's protected candidates read once per GPU type
(`_protected_among`) against `_protected_until`, which reads every running job."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy.admission import (
    _Protected,
    _protected_among,
    _protected_of_type,
    _protected_until,
)
from queueing.policy.snapshot import QueuedJob, RunningJob, Snapshot
from queueing.policy.workspace import Workspace

from . import test_clusters_properties, test_plan_properties


def _with_min_runtimes(s: Snapshot, rnd: random.Random) -> Snapshot:
    """`s` with minimum runtimes on its running jobs, some still protecting them (rule R3),
    and some not started yet."""
    running = tuple(
        RunningJob(r.id, r.team, r.gpu_type, r.gpus_per_replica, r.replicas, r.tier_rank,
                   preemptible=r.preemptible,
                   started_at=None if rnd.random() < 0.1 else r.started_at,
                   min_runtime_seconds=rnd.choice((0, 60, 600, 3600, 86400)), nodes=r.nodes,
                   cluster=r.cluster)
        for r in s.running)
    return Snapshot(now=s.now, nodes=s.nodes, queued=s.queued, running=running,
                    quotas=s.quotas, priority_weights=s.priority_weights,
                    preemption=s.preemption)


def _check_protected(s: Snapshot, rnd: random.Random) -> None:
    ws = Workspace(s)
    for r in s.running:  # victims of earlier searches of the pass
        if rnd.random() < 0.2:
            ws.removed.add(r.id)
    by_type: dict[str, _Protected] = {}
    for job in s.queued:
        candidates = by_type.get(job.gpu_type)
        if candidates is None:
            candidates = by_type[job.gpu_type] = _protected_of_type(ws, job.gpu_type, s.now)
        assert _protected_among(ws, job, candidates) == _protected_until(ws, job, s.now)


@settings(max_examples=200, deadline=None)
@given(test_plan_properties.snapshots(), st.randoms(use_true_random=False))
def test_protected_candidates_of_a_type_give_rule_e4s_answer(
    s: Snapshot, rnd: random.Random,
) -> None:
    _check_protected(_with_min_runtimes(s, rnd), rnd)


@settings(max_examples=150, deadline=None)
@given(test_clusters_properties.snapshots(), st.randoms(use_true_random=False))
def test_protected_candidates_follow_the_clusters_a_job_may_use(
    s: Snapshot, rnd: random.Random,
) -> None:
    s = _with_min_runtimes(s, rnd)
    s = Snapshot(now=s.now, nodes=s.nodes, running=s.running, quotas=s.quotas,
                 queued=tuple(QueuedJob(q.id, q.team, q.gpu_type, q.gpus_per_replica,
                                        q.replicas, q.tier_rank, q.submitted_at,
                                        clusters=q.clusters) for q in s.queued),
                 preemption=s.preemption)
    _check_protected(s, rnd)
