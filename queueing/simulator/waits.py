"""Why a tier waited: the wait-cause breakdown of a fairq run, and the floors of the
non-preemptible tier's wait (docs/simulator.md, "Why a tier waited").

Every cycle the plan gives each waiting job a *cause* (`Plan.wait_causes`: its wait
reason, a `capacity` wait split by what its preemption search gave). `WaitCauses`
attributes the time from one cycle to the next to the cause the earlier cycle gave, so a
job's causes add up to exactly its wait (metrics.wait_seconds); a victim put back in the
queue waits `requeued` until the next cycle. `breakdown` groups that per tier.

`nominal_floor` is what the non-preemptible tier's wait would be if each of its jobs were
admitted as soon as its team had room in its nominal quota (rule Q2 guarantees that room
can be reclaimed; beyond it nothing is owed); `cluster_floor` the same with the whole
cluster as every team's room (no other work at all): no policy gets the tier's waits
lower than this on the same arrivals.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from queueing.policy.admission import Plan

from .metrics import percentile, wait_seconds
from .model import RunResult, SimJob, Workload

REQUEUED = "requeued"  # a preemption's victim, back in the queue until the next cycle
UNPLANNED = "unplanned"  # still queued when the run stopped (max_seconds)

# What each cause means, for the report's legend (rules of docs/scheduling.md).
CAUSE_TEXT: Mapping[str, str] = {
    "quota": "its team's quota ceiling (Q1)",
    "never_fits": "more than its team may ever hold (E6)",
    "lending_limit": "the idle GPUs are other teams' guarded nominal (Q1)",
    "gang_does_not_fit": "no node shape holds the gang (A2)",
    "cpu_memory": "CPU or memory beside the GPUs (A6)",
    "topology": "no topology domain has room (A7)",
    "capacity:no_search": "no free GPUs; no search left in the pass or preemption off (R4)",
    "capacity:no_victim": "no free GPUs; no victim set allowed (R1-R3, Q2)",
    "capacity:protected": "no free GPUs; candidates within their minimum runtime (R3)",
    "capacity:not_worth_it": "no free GPUs; the victims found would lose more than its "
                             "wait is worth (R9)",
    "preemption_rate_limited": "its team's preemption rate limit (R5)",
    "preempting": "its victims are being stopped (R8 grace, nomination)",
    "held_for_preemptor": "the free GPUs are held for a preemptor (A5, E2)",
    "reserved": "the free GPUs are reserved for a large gang (A9)",
    "dependency": "a dependency has not ended (D1)",
    "dependency_never_met": "a dependency can never be met (D2)",
    "array_limit": "its array's concurrency limit (A8)",
    REQUEUED: "preempted, back in the queue until the next cycle (R6)",
    UNPLANNED: "still queued when the run stopped",
}


class WaitCauses:
    """Collects, cycle by cycle, how long each job waited for which cause: pass
    `on_cycle` to `engine.run_fairq`. `seconds[job][cause]` after `finish`."""

    def __init__(self) -> None:
        self.seconds: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._last: float | None = None
        self._causes: list[tuple[int, str]] = []

    def _close(self, now: float) -> None:
        if self._last is None:
            return
        dt = now - self._last
        if dt > 0:
            seconds = self.seconds
            for job_id, cause in self._causes:
                seconds[job_id][cause] += dt

    def on_cycle(self, now: float, plan: Plan) -> None:
        self._close(now)
        causes = list(plan.wait_causes())
        causes.extend((v.job_id, REQUEUED) for p in plan.preemptions for v in p.victims)
        self._causes, self._last = causes, now

    def finish(self, end: float) -> None:
        """The run stopped at `end`: the last cycle's waiters waited until then (a run
        that drains every job ends with none)."""
        if self._causes and self._last is not None and end > self._last:
            dt = end - self._last
            for job_id, _ in self._causes:
                self.seconds[job_id][UNPLANNED] += dt
        self._causes, self._last = [], None


def breakdown(result: RunResult, causes: WaitCauses, workload: Workload,
              *, goal_minutes: float = 1.0) -> dict[str, Any]:
    """Per tier: each cause's share of the tier's waiting, the p95 of the time jobs
    spent in it, and the jobs for which it was the main cause (the cause of most of their
    wait) with the p95 of their whole wait; also how many jobs waited longer than
    `goal_minutes` by main cause. Plain data for the JSON."""
    rank = {t.name: t.rank for t in workload.scenario.tiers}
    by_tier: dict[str, list[tuple[float, dict[str, float]]]] = defaultdict(list)
    for rec in result.records:
        by_tier[rec.job.tier].append((wait_seconds(rec, result.end),
                                      dict(causes.seconds.get(rec.job.id, {}))))
    out: dict[str, Any] = {}
    for tier in sorted(by_tier, key=lambda t: (-rank.get(t, 0), t)):
        rows = by_tier[tier]
        total = sum(sum(c.values()) for _, c in rows)
        per: dict[str, dict[str, Any]] = {}
        names = sorted({k for _, c in rows for k in c})
        for name in names:
            spent = [c[name] for _, c in rows if c.get(name, 0.0) > 0]
            main = [w for w, c in rows if c and max(c, key=lambda k: (c[k], k)) == name]
            per[name] = {
                "wait_hours": sum(spent) / 3600.0,
                "share_pct": 100.0 * sum(spent) / total if total > 0 else 0.0,
                "jobs": len(spent),
                "p95_min": percentile([s / 60.0 for s in spent], 95),
                "main_jobs": len(main),
                "main_wait_p95_min": percentile([w / 60.0 for w in main], 95),
                "main_over_goal": sum(1 for w in main if w > goal_minutes * 60.0),
            }
        out[tier] = {
            "jobs": len(rows),
            "wait_hours": total / 3600.0,
            "over_goal": sum(1 for w, _ in rows if w > goal_minutes * 60.0),
            "goal_minutes": goal_minutes,
            "causes": dict(sorted(per.items(), key=lambda kv: -kv[1]["wait_hours"])),
        }
    return out


def _units(j: SimJob) -> int:
    """A job's size in its type's units (slices on a time-sliced type, as the pools)."""
    return j.units_per_replica * j.replicas


def _pool_waits(jobs: Iterable[SimJob], room: Mapping[tuple[str, str], int],
                pool: Mapping[SimJob, tuple[str, str]]) -> dict[int, float]:
    """Each job's wait under greedy backfill on pools of GPUs that are counted, not
    placed (no node fragmentation): whenever its pool frees GPUs or a job arrives, the
    waiting jobs of the pool that fit start, earliest submitted first, and run their
    runtime. A job asking more than its whole pool never starts (wait inf)."""
    free = dict(room)
    ends: list[tuple[float, int, tuple[str, str], int]] = []
    waiting: dict[tuple[str, str], list[tuple[float, int, SimJob]]] = defaultdict(list)
    out: dict[int, float] = {}
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.id))
    i = 0
    while i < len(arrivals) or ends:
        # The next instant: an arrival or an end, ends first at a tie (they free GPUs).
        t_arr = arrivals[i].submit if i < len(arrivals) else float("inf")
        t_end = ends[0][0] if ends else float("inf")
        now = min(t_arr, t_end)
        touched: set[tuple[str, str]] = set()
        while ends and ends[0][0] == now:
            _, _, key, gpus = heapq.heappop(ends)
            free[key] += gpus
            touched.add(key)
        while i < len(arrivals) and arrivals[i].submit == now:
            j = arrivals[i]
            i += 1
            key = pool[j]
            if _units(j) > room.get(key, 0):
                out[j.id] = float("inf")
                continue
            heapq.heappush(waiting[key], (j.submit, j.id, j))
            touched.add(key)
        for key in touched:
            q = waiting[key]
            kept = []
            while q:
                item = heapq.heappop(q)
                j = item[2]
                if _units(j) <= free[key]:
                    free[key] -= _units(j)
                    out[j.id] = now - j.submit
                    heapq.heappush(ends, (now + j.runtime, j.id, key, _units(j)))
                else:
                    kept.append(item)
                if free[key] == 0:
                    break
            for item in kept:
                heapq.heappush(q, item)
    return out


def _floor_stats(waits: Mapping[int, float], goal_minutes: float) -> dict[str, Any]:
    finite = [w / 60.0 for w in waits.values() if w != float("inf")]
    never = len(waits) - len(finite)
    values = finite + [float("inf")] * never
    return {
        "jobs": len(waits),
        "wait_p50_min": percentile(values, 50),
        "wait_p95_min": percentile(values, 95),
        "wait_p99_min": percentile(values, 99),
        "over_goal": sum(1 for w in values if w > goal_minutes),
        "never_fit": never,
    }


def non_preemptible_floors(workload: Workload, *, goal_minutes: float = 1.0
                           ) -> dict[str, Any]:
    """The two floors of the non-preemptible tiers' waits (module docstring), per tier
    set: `nominal` (each team's jobs of those tiers on its nominal GPUs of their type) and
    `cluster` (on all the cluster's GPUs of the type, shared by every team, nothing else
    running). GPUs are counted, not placed, and the jobs of one pool start earliest
    first whenever they fit (greedy backfill): both are optimistic about fragmentation.
    Empty when every tier is preemptible."""
    sc = workload.scenario
    tiers = {t.name for t in sc.tiers if not t.preemptible}
    jobs = [j for j in workload.jobs if j.tier in tiers]
    if not jobs:
        return {}
    # In the types' units (a time-sliced type in slices, S per GPU).
    nominal_room = {key: q.nominal * sc.slices_per_gpu(key[1]) for key, q in sc.quotas.items()}
    nominal = _pool_waits(jobs, nominal_room, {j: (j.team, j.gpu_type) for j in jobs})
    by_type: dict[tuple[str, str], int] = defaultdict(int)
    for n in sc.nodes:
        by_type[("", n.gpu_type)] += n.gpus * sc.slices_per_gpu(n.gpu_type)
    cluster = _pool_waits(jobs, by_type, {j: ("", j.gpu_type) for j in jobs})
    return {
        "tiers": sorted(tiers),
        "nominal": _floor_stats(nominal, goal_minutes),
        "cluster": _floor_stats(cluster, goal_minutes),
    }
