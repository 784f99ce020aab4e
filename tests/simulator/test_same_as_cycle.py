"""One policy for both: a small trace replayed by the simulator and by
the real scheduler cycle (`scheduler_cycle`, database and all) on the simulated cluster,
at the same instants, gives the same admissions, on the same nodes, and the same
preemptions with the same victims.

The real side creates each job when the simulator's clock reaches its submit time and
runs one cycle at each instant the simulator ran one; the settings both use are the
service's (read from django.conf.settings), so the comparison also holds the simulator's
bookkeeping (queueing/policy/cycle.py: F2, F6, R5, R6, A5/R8) to the service's.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from queueing.backends.simulated import SimulatedCluster
from queueing.models import Job
from queueing.policy.admission import Plan
from queueing.policy.settings import DEFAULTS, PolicySettings
from queueing.policy.snapshot import QuotaLimit
from queueing.selectors.snapshot import policy_settings
from queueing.services.scheduler import scheduler_cycle
from queueing.simulator.engine import EPOCH, estimate_seconds, run_fairq
from queueing.simulator.model import (
    NodeSpec,
    Scenario,
    SimJob,
    TeamSpec,
    TierSpec,
    Workload,
)
from queueing.simulator.trace import nominal_by_weight
from tests.factories import GpuTypeFactory, JobFactory, QuotaFactory, TeamFactory, TierFactory

pytestmark = pytest.mark.django_db

NODES = (NodeSpec("node-000", "h100", 8), NodeSpec("node-001", "h100", 8),
         NodeSpec("node-002", "h100", 4))
TEAMS = (TeamSpec("ada", 1.0), TeamSpec("bob", 2.0), TeamSpec("cyd", 1.0))
# Grace 0: the simulated cluster the real cycle runs on frees a victim's GPUs at once.
TIERS = (TierSpec("x-high", 930, preemptible=False, grace_seconds=0),
         TierSpec("x-normal", 920, True, 120, grace_seconds=0),
         TierSpec("x-low", 910, True, 0, grace_seconds=0))


def _settings() -> PolicySettings:
    """The service's settings object, as the cycle runs (the simulator takes the same)."""
    return replace(policy_settings(), billing_weights={})


def test_the_service_runs_the_policy_defaults_unless_its_settings_override_them() -> None:
    """One settings object: with no FAIRQ_* override the service's settings object is the
    policy's defaults (what the simulator runs), and an override changes only its field."""
    assert _settings() == DEFAULTS
    with override_settings(FAIRQ_PREEMPTION_MAX_PER_TEAM=-1, FAIRQ_PREEMPTION_MAX_PER_JOB=5):
        assert _settings() == replace(DEFAULTS, preemption=replace(
            DEFAULTS.preemption, max_per_team=None, max_preemptions_per_job=5))


def _workload(seed: int, n: int) -> Workload:
    """`n` jobs over an hour, seeded: mixed tiers, teams and sizes (gangs included), long
    enough runs that high tiers must preempt."""
    rng = random.Random(seed)
    nominal = nominal_by_weight(20, [t.weight for t in TEAMS])
    quotas = {(t.name, "h100"): QuotaLimit(q) for t, q in zip(TEAMS, nominal, strict=True)}
    sc = Scenario(nodes=NODES, teams=TEAMS, tiers=TIERS, quotas=quotas, settings=_settings())
    jobs = []
    t = 0.0
    for i in range(n):
        t += rng.choice((0, 20, 45, 90, 180))
        g, reps = rng.choice(((1, 1), (1, 1), (2, 1), (4, 1), (4, 2), (8, 1)))
        tier = rng.choices(("x-high", "x-normal", "x-low"), weights=(2, 3, 5))[0]
        runtime = float(rng.choice((60, 300, 900, 1800)))
        team = rng.choice(TEAMS).name
        # max_runtime_seconds (rule A9's estimate): the runtime or twice it.
        jobs.append(SimJob(i + 1, team, tier, "h100", g, reps, t, runtime,
                           runtime * rng.choice((1, 2))))
    return Workload(sc, tuple(jobs), horizon=t)


def _decisions(plan: Plan, ids: dict[int, int]) -> tuple[object, ...]:
    return (sorted((ids[a.job_id], a.placement) for a in plan.admissions),
            sorted((ids[p.preemptor_id], tuple(sorted(ids[v.job_id] for v in p.victims)))
                   for p in plan.preemptions),
            sorted((gt, ids[job], at) for gt, (job, at) in plan.reservations.items()))


@pytest.mark.parametrize(("seed", "overrides"), [
    (1, {}), (2, {}), (3, {}),
    # A tight rate limit (R5: without the same window count the decisions differ) and a
    # long entry penalty (F6).
    (4, {"FAIRQ_FAIRSHARE_RECOMPUTE_SECONDS": 900.0, "FAIRQ_PREEMPTION_MAX_PER_TEAM": 1,
         "FAIRQ_PREEMPTION_WINDOW_SECONDS": 400}),
])
def test_the_simulator_and_the_real_cycle_make_the_same_decisions(
        seed: int, overrides: dict[str, object], settings: Any) -> None:
    for name, value in overrides.items():
        setattr(settings, name, value)
    w = _workload(seed, 40)
    sim: list[tuple[float, tuple[object, ...]]] = []
    result = run_fairq(w, on_cycle=lambda t, plan: sim.append(
        (t, _decisions(plan, {j.id: j.id for j in w.jobs}))))
    assert sum(r.preemptions for r in result.records) > 0  # the trace does preempt
    assert any(d[2] for _, d in sim)  # and reserves (rule A9)

    gpu = GpuTypeFactory(slug="h100", billing_weight=1.0)
    teams = {t.name: TeamFactory(slug=t.name, weight=t.weight) for t in TEAMS}
    tiers = {t.name: TierFactory(slug=t.name, rank=t.rank, preemptible=t.preemptible,
                                 min_runtime_seconds=t.min_runtime_seconds) for t in TIERS}
    for (team, _), q in w.scenario.quotas.items():
        QuotaFactory(team=teams[team], gpu_type=gpu, nominal=q.nominal)
    backend = SimulatedCluster([(n.name, n.gpu_type, n.gpus) for n in NODES])
    db_id: dict[int, int] = {}  # simulator id -> job row
    pending = list(w.jobs)
    real: list[tuple[float, tuple[object, ...]]] = []
    for t, _ in sim:
        while pending and pending[0].submit <= t:
            j = pending.pop(0)
            at = EPOCH + timedelta(seconds=j.submit)
            row = JobFactory(team=teams[j.team], tier=tiers[j.tier], gpu_type=gpu,
                             gpus_per_replica=j.gpus_per_replica, replicas=j.replicas,
                             env={"FAIRQ_SIM_SECONDS": str(int(j.runtime))}, created_at=at,
                             updated_at=at, max_runtime_seconds=estimate_seconds(j))
            db_id[row.pk] = j.id
        r = scheduler_cycle(now=EPOCH + timedelta(seconds=t), backend=backend)
        assert r.ran and r.plan is not None and not r.job_errors
        real.append((t, _decisions(r.plan, db_id)))
        assert sorted(db_id[i] for i in r.admitted) == [a for a, _ in real[-1][1][0]]  # type: ignore[index]
    assert real == sim
    # After the last cycle both have every job done, each preempted as often.
    scheduler_cycle(now=EPOCH + timedelta(seconds=result.end + 3600), backend=backend)
    rows = {db_id[pk]: (status, attempt) for pk, status, attempt in
            Job.objects.values_list("pk", "status", "attempt")}
    assert all(r.finished is not None for r in result.records)
    assert {i: status for i, (status, _) in rows.items()} == dict.fromkeys(rows, "SUCCEEDED")
    assert {i: attempt - 1 for i, (_, attempt) in rows.items()} == {
        r.job.id: r.preemptions for r in result.records}
