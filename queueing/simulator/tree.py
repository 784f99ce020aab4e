"""Quotas in a tree in the replay's report (docs/simulator.md, "Quotas in a tree and
bookings"; docs/scheduling.md, "Quotas in a tree").

The *owed wait*: how long a job waited while it was owed its GPUs by the tree - with it,
its team and every department above it held no more than their nominal (rule Q3's
nominal: the quota row's, or a department's children's sum) - so whatever held the GPUs
it waited for was someone's borrowing of its lent guarantee. Per team, the longest
such stretch of one job (a job's owed time is cut where it stops being owed). With the
tree policy (rules Q6, Q7) it is at most one cycle plus the victims' grace.

Counted from the run's attempts, in GPU-equivalents, per GPU type a job asked (its
first accepted type); what a team holds counts every tier and the victims in their
grace (they still hold the GPUs).
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from queueing.policy.quota_tree import QuotaTree

from .metrics import queued_intervals
from .model import RunResult, Workload

_EPS = 1e-9


def owed_waits(result: RunResult, workload: Workload) -> dict[str, dict[str, float]]:
    """Per team with jobs: `owed_wait_max_seconds` (the longest owed stretch of one of
    its jobs), `owed_jobs` (its jobs that were ever owed while waiting) and
    `owed_wait_hours` (all their owed waiting)."""
    sc = workload.scenario
    parent = {t.name: t.parent for t in sc.teams}
    capacity: dict[str, int] = defaultdict(int)
    for n in sc.nodes:
        capacity[n.gpu_type] += n.gpus
    tree = QuotaTree(parent, sc.quotas, capacity)
    paths = {t: tree.path(t) for t in parent}
    out: dict[str, dict[str, float]] = {
        t: {"owed_wait_max_seconds": 0.0, "owed_jobs": 0, "owed_wait_hours": 0.0}
        for t in sorted({r.job.team for r in result.records})}
    for gpu_type in sorted(capacity):
        nominal = {n: tree.nominal(n, gpu_type) for n in parent}
        # +share at a start, -share when its GPUs are released, on every node of the path.
        moves: list[tuple[float, int, str, float]] = []
        waits: list[tuple[float, float, int, str, float]] = []
        for r in result.records:
            for a in r.attempts:
                if (a.gpu_type or r.job.gpu_type) == gpu_type:
                    moves.append((a.start, 1, r.job.team, r.job.share))
                    moves.append((a.held_until, 0, r.job.team, -r.job.share))
            if r.job.gpu_type == gpu_type:
                for s, e in queued_intervals(r, result.end):
                    if e > s:
                        waits.append((s, e, r.job.id, r.job.team, r.job.share))
        _sweep(moves, waits, paths, nominal, out)
    return out


def _sweep(moves: list[tuple[float, int, str, float]],
           waits: list[tuple[float, float, int, str, float]],
           paths: dict[str, list[str]], nominal: dict[str, int],
           out: dict[str, dict[str, float]]) -> None:
    """One GPU type: walk the instants where holdings or the queue change; between two,
    a waiting job is owed when its share fits under the nominal of every node of its
    team's path."""
    held: dict[str, float] = defaultdict(float)
    edges = sorted({x for m in moves for x in (m[0],)} | {x for w in waits for x in w[:2]})
    moves.sort(key=lambda m: (m[0], m[1]))
    by_start = sorted(waits)
    waiting: dict[int, tuple[float, str, float]] = {}
    stretch: dict[int, float] = {}
    ever: set[int] = set()
    mi = wi = 0
    for lo, hi in itertools.pairwise(edges):
        while mi < len(moves) and moves[mi][0] <= lo:
            _t, _k, team, g = moves[mi]
            for n in paths.get(team, [team]):
                held[n] += g
            mi += 1
        while wi < len(by_start) and by_start[wi][0] <= lo:
            _s, e, job, team, g = by_start[wi]
            waiting[job] = (e, team, g)
            wi += 1
        room: dict[str, float] = {}
        for job in list(waiting):
            e, team, g = waiting[job]
            if e <= lo:
                del waiting[job]
                stretch.pop(job, None)
                continue
            if team not in room:
                room[team] = min((nominal.get(n, 0) - held[n] for n in paths.get(team, [team])),
                                 default=0.0)
            if g <= room[team] + _EPS:
                run = stretch.get(job, 0.0) + (hi - lo)
                stretch[job] = run
                row = out[team]
                row["owed_wait_hours"] += (hi - lo) / 3600.0
                row["owed_wait_max_seconds"] = max(row["owed_wait_max_seconds"], run)
                if job not in ever:
                    ever.add(job)
                    row["owed_jobs"] += 1
            else:
                stretch.pop(job, None)
