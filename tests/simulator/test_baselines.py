"""FIFO, greedy backfill and EASY backfill on a hand-made trace with a known answer
(docs/simulator.md, "Baselines"): one node of 4 GPUs and four jobs.

    A: t=0, 2 GPUs, runs 100 s (estimate 100)
    B: t=1, 4 GPUs, runs 100 s (estimate 100)
    C: t=2, 2 GPUs, runs 150 s (estimate 200)
    D: t=3, 2 GPUs, runs 50 s (estimate 60)

FIFO:   A 0-100, B 100-200, C 200-350, D 200-250 (B blocks everyone behind it).
greedy: A 0-100, C 2-152, D 100-150, B 152-252 (B starves behind smaller jobs).
EASY:   B's reservation is at 100 on all 4 GPUs: C (ends by 202) may not start, D (ends
        by 63) may; A 0-100, D 3-53, B 100-200, C 200-350.
"""

from __future__ import annotations

import pytest

from queueing.simulator.baselines import run_baseline
from queueing.simulator.model import NodeSpec, Scenario, SimJob, TeamSpec, TierSpec, Workload


def _workload() -> Workload:
    sc = Scenario(nodes=(NodeSpec("n1", "gpu", 4),), teams=(TeamSpec("t", 1.0),),
                  tiers=(TierSpec("normal", 10),))

    def job(i: int, submit: float, gpus: int, runtime: float, estimate: float) -> SimJob:
        return SimJob(i, "t", "normal", "gpu", gpus, 1, submit, runtime, estimate)

    return Workload(sc, (job(1, 0, 2, 100, 100), job(2, 1, 4, 100, 100),
                         job(3, 2, 2, 150, 200), job(4, 3, 2, 50, 60)), horizon=400)


@pytest.mark.parametrize(("policy", "starts"), [
    ("fifo", {1: 0, 2: 100, 3: 200, 4: 200}),
    ("greedy", {1: 0, 2: 152, 3: 2, 4: 100}),
    ("easy", {1: 0, 2: 100, 3: 200, 4: 3}),
])
def test_each_baseline_starts_the_jobs_when_it_should(policy: str, starts: dict[int, float]) -> None:
    result = run_baseline(policy, _workload())
    got = {r.job.id: r.attempts[0].start for r in result.records}
    assert got == starts
    for r in result.records:
        assert r.finished == r.attempts[0].start + r.job.runtime
        assert r.preemptions == 0


def test_an_unknown_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown baseline"):
        run_baseline("lifo", _workload())
