"""What the cycle keeps between cycles at fleet size (docs/performance.md, "A fleet of
5,000 nodes: the cycle on PostgreSQL"), each held to the plain path it replaces:

  * `KeptPackedGpus` (queueing/selectors/snapshot.py) to `packed_gpus`: rule H1's free
    slices per GPU and the running jobs placed where their GPUs are not recorded;
  * `KeptHolding` (queueing/selectors/fairshare.py) to `holding_running_and_penalty`:
    rules F1 and F6's running intervals and entry penalties per team;
  * the simulated cluster's kept statuses (`SimulatedCluster.statuses`) to
    `statuses_reference`;
  * the collector after a cycle (`scheduler.gc_after_cycle`).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from queueing.backends import simulated
from queueing.backends.base import LaunchSpec, workload_name
from queueing.backends.simulated import SimulatedCluster
from queueing.policy.snapshot import RunningJob
from queueing.selectors import active_jobs
from queueing.selectors.active_jobs import ActiveJobs, JobRow, Lookups
from queueing.selectors.fairshare import KeptHolding, holding_running_and_penalty
from queueing.selectors.snapshot import KeptPackedGpus, packed_gpus
from queueing.services import scheduler

from .conftest import World
from .factories import JobFactory

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)


# --- KeptPackedGpus ---------------------------------------------------------------------

def _nodes(rnd: random.Random) -> dict[str, tuple[int, int]]:
    out = {}
    for i in range(rnd.randint(1, 6)):
        s = rnd.choice((2, 4, 8))
        out[f"p{i}"] = (s * rnd.randint(1, 4), s)
    return out


def _job(rnd: random.Random, pk: int, nodes: dict[str, tuple[int, int]]) -> RunningJob:
    names = [*nodes, "whole-0", "whole-1"]
    replicas = rnd.choice((1, 1, 1, 2))
    placed = tuple(rnd.choice(names) for _ in range(replicas))
    units = rnd.choice((1, 1, 2, 3, 4, 8, 16))
    gpus = max(1, units // 4)
    slots: tuple[int, ...] = ()
    shape = rnd.random()
    if shape < 0.6:  # recorded: a fraction's GPU, or whole GPUs' indexes
        slots = tuple(rnd.randint(-1, 8) for _ in range(replicas * gpus))
    elif shape < 0.7:  # not a whole number per replica: not recorded
        slots = (0, 1, 2)[:max(1, replicas * gpus - 1)] if replicas > 1 else ()
    return RunningJob(id=pk, team="t", gpu_type="a10", gpus_per_replica=units,
                      replicas=replicas, tier_rank=0, started_at=NOW, nodes=placed,
                      gpu_slots=slots)


def test_rule_h1_kept_packed_gpus_are_packed_gpus_over_random_worlds() -> None:
    """Over random worlds and changes between calls (jobs ending, starting, moving, their
    GPUs recorded or not; nodes added or resized), the kept free slices and placed jobs
    are `packed_gpus`' every time."""
    for seed in range(60):
        rnd = random.Random(seed)
        nodes = _nodes(rnd)
        kept = KeptPackedGpus()
        running = [_job(rnd, pk, nodes) for pk in range(1, rnd.randint(2, 40))]
        next_pk = 1000
        for _ in range(12):
            got = kept(tuple(running), nodes)
            want = packed_gpus(tuple(running), nodes)
            assert got == want, seed
            # Churn: ends, starts, a changed row (a new object), a resized node set.
            for _ in range(rnd.randint(0, 4)):
                if running:
                    running.pop(rnd.randrange(len(running)))
            for _ in range(rnd.randint(0, 4)):
                next_pk += 1
                running.insert(rnd.randrange(len(running) + 1), _job(rnd, next_pk, nodes))
            if running and rnd.random() < 0.5:
                i = rnd.randrange(len(running))
                running[i] = replace(_job(rnd, running[i].id, nodes))
            if rnd.random() < 0.15:
                nodes = _nodes(rnd)


def test_rule_h1_an_unchanged_job_is_not_looked_at_again() -> None:
    nodes = {"p0": (8, 4)}
    job = RunningJob(id=1, team="t", gpu_type="a10", gpus_per_replica=1, replicas=1,
                     tier_rank=0, started_at=NOW, nodes=("p0",), gpu_slots=(1,))
    kept = KeptPackedGpus()
    kept((job,), nodes)
    assert kept.took[1][0] is job
    _, free = kept((job,), nodes)
    assert free == {"p0": (4, 3)}
    _, free = kept((), nodes)  # it ended
    assert free == {"p0": (4, 4)}


# --- the simulated cluster's kept statuses ---------------------------------------------------

def _spec(pk: int, env: dict[str, str]) -> LaunchSpec:
    return LaunchSpec(name=workload_name(pk, 1), job_id=pk, attempt=1, team="t", tier="t",
                      priority_class_name="p", gpu_type="h100",
                      resource_name="nvidia.com/gpu", node_labels={}, gpus_per_replica=1,
                      replicas=1, image="x", command=[], args=[], env=env,
                      max_runtime_seconds=None)


def test_kept_statuses_are_the_reference_statuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random submits, stops and reclaims as the clock moves: `statuses` equals
    `statuses_reference` every time, and gives the same object for a workload whose
    status did not change."""
    for seed in range(10):
        rnd = random.Random(seed)
        sim = SimulatedCluster([(f"n{i}", "h100", 8) for i in range(4)],
                               default_seconds=50, stop_seconds=rnd.choice((0.0, 7.0)))
        now, pk, before = NOW, 0, {}
        for _ in range(30):
            for _ in range(rnd.randint(0, 3)):
                pk += 1
                env = {"FAIRQ_SIM_SECONDS": str(rnd.randint(1, 60))}
                if rnd.random() < 0.2:
                    env["FAIRQ_SIM_EXIT_CODE"] = "3"
                with contextlib.suppress(simulated.SimulatedClusterError):
                    sim.submit(_spec(pk, env), now=now)
            if pk and rnd.random() < 0.3:
                sim.stop(workload_name(rnd.randint(1, pk), 1), now=now)
            now += timedelta(seconds=rnd.randint(1, 9))
            got = sim.statuses(now=now)
            assert got == sim.statuses_reference(now=now)
            for s in got:
                if s.name in before and before[s.name] == s:
                    assert before[s.name] is s
            before = {s.name: s for s in got}
    monkeypatch.setattr(simulated, "KEEP_STATUSES", False)
    assert all(a is not b for a, b in zip(sim.statuses(now=now), sim.statuses(now=now),
                                          strict=True))


def test_the_planned_placement_is_taken_when_it_still_fits() -> None:
    sim = SimulatedCluster([(f"n{i}", "h100", 8) for i in range(3)])
    spec = replace(_spec(1, {}), gpus_per_replica=6, placement=("n2",))
    sim.submit(spec, now=NOW)
    assert sim.statuses(now=NOW)[0].nodes == ("n2",)
    # n2 no longer holds 6 more: best fit elsewhere.
    sim.submit(replace(spec, name=workload_name(2, 1), job_id=2), now=NOW)
    assert sim.statuses(now=NOW)[1].nodes == ("n0",)


# --- the collector --------------------------------------------------------------------------

def test_the_collector_freezes_what_a_fleet_cycle_keeps(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setattr(scheduler, "_gc_frozen_cycles", 0)
    monkeypatch.setattr(scheduler, "GC_THAW_EVERY", 2)
    try:
        scheduler.gc_after_cycle(10)  # below the size: nothing
        assert gc.get_freeze_count() == 0
        scheduler.gc_after_cycle(scheduler.GC_FREEZE_MIN_ACTIVE)
        assert gc.get_freeze_count() > 0
        kept = [object() for _ in range(3)]
        scheduler.gc_after_cycle(scheduler.GC_FREEZE_MIN_ACTIVE)
        scheduler.gc_after_cycle(scheduler.GC_FREEZE_MIN_ACTIVE)  # the thaw: a full pass
        assert scheduler._gc_frozen_cycles == 1
        monkeypatch.setattr(scheduler, "GC_FREEZE", False)
        scheduler.gc_after_cycle(scheduler.GC_FREEZE_MIN_ACTIVE)  # as before
        assert gc.get_freeze_count() == 0
        assert kept
    finally:
        gc.unfreeze()


# --- the standings' running intervals -------------------------------------------------------

def _row(rnd: random.Random, pk: int, now: datetime) -> JobRow:
    running = rnd.random() < 0.8
    started = now - timedelta(seconds=rnd.randint(-30, 5000)) if running or \
        rnd.random() < 0.3 else None
    return JobRow._make([None] * len(JobRow._fields))._replace(
        id=pk, status="RUNNING" if running else "ADMITTED", attempt=1,
        team_id=rnd.randint(1, 6), gpu_type_id=rnd.choice((1, 2)),
        gpus_per_replica=rnd.choice((1, 2, 4)), replicas=rnd.choice((1, 1, 2)),
        started_at=started, gpu_slices=rnd.choice((0, 0, 1, 3)))


def test_rule_f1_f6_kept_running_intervals_are_the_plain_ones() -> None:
    """Over random jobs holding GPUs and changes between calls (ends, starts, changed
    rows, attempts starting after `now`, time going back, a lookups change), the kept
    running intervals and entry penalties per team are the plain path's, to the bit."""
    for seed in range(40):
        rnd = random.Random(seed)
        lookups = Lookups(teams={i: f"t{i}" for i in range(1, 7)},
                          gpu_types={1: "h100", 2: "a10"},
                          billing_weights={1: 2.0, 2: 0.5},
                          units={"a10": (4, 4)} if seed % 2 else {})
        slug_of = {i: f"t{i}" for i in range(1, 6)}  # team 6's jobs are left out
        jobs = ActiveJobs()
        jobs.lookups = lookups
        now = NOW
        jobs.holding = {pk: _row(rnd, pk, now) for pk in range(1, rnd.randint(2, 60))}
        kept = KeptHolding()
        pk = 1000
        for _ in range(10):
            got = kept(jobs, slug_of, now=now, interval=30.0)
            assert got == holding_running_and_penalty(jobs, slug_of, now=now, interval=30.0)
            holding = dict(jobs.holding)
            for _ in range(rnd.randint(0, 5)):
                if holding:
                    holding.pop(rnd.choice(list(holding)))
            for _ in range(rnd.randint(0, 5)):
                pk += 1
                holding[pk] = _row(rnd, pk, now)
            if holding and rnd.random() < 0.5:
                k = rnd.choice(list(holding))
                holding[k] = _row(rnd, k, now)
            jobs.holding = holding
            now += timedelta(seconds=rnd.choice((-20, 5, 10, 30)))
            if rnd.random() < 0.1:
                jobs.lookups = replace(lookups, billing_weights={1: 3.0, 2: 0.5})


# --- the rows read with their repeated values shared ----------------------------------------

def _raw_row(rnd: random.Random, pk: int) -> tuple[object, ...]:
    """A row as the driver gives it: new objects for every value (equal values too)."""
    def fresh_json() -> object:
        return rnd.choice(([], {}, None, ["n0"], {"zone": "a"}, [{"job": 3, "on": "ok"}],
                           [0, 2], [], {}))

    created = NOW - timedelta(seconds=rnd.randint(0, 10**6))
    updated = (created + timedelta(0) if rnd.random() < 0.7
               else created + timedelta(seconds=rnd.randint(1, 99)))
    values: dict[str, object] = {
        "id": pk, "status": "".join(rnd.choice(("QUEUED", "RUNNING", "ADMITTED"))),
        "attempt": rnd.choice((1, 1, 2, 300)), "team_id": rnd.choice((1, 700, 1100)) + 0,
        "gpu_type_id": rnd.randint(1, 4), "tier_id": rnd.choice((3, 999)),
        "gpus_per_replica": rnd.choice((1, 8, 16)), "replicas": rnd.choice((1, 2)),
        "created_at": created, "cpu_millicores": rnd.choice((None, 4000, 500_000)),
        "memory_bytes": rnd.choice((None, 2**30, 2**40)),
        "topology_level": rnd.choice(("", "rack", "zone")),
        "topology_mode": rnd.choice(("", "required", "preferred")),
        "placement": fresh_json(), "submitted_to_backend_at": rnd.choice((None, created)),
        "started_at": rnd.choice((None, updated)), "updated_at": updated,
        "message": rnd.choice(("", "waiting for quota", "x" * 300)),
        "dependencies": fresh_json(), "array_id": rnd.choice((None, 5, 10**6)),
        "max_runtime_seconds": rnd.choice((None, 3600, 86400 * 30)),
        "cluster_id": rnd.choice((None, 1, 2)), "requested_cluster_id": rnd.choice((None, 2)),
        "cluster_selector": fresh_json(), "allow_spot": rnd.choice((True, False)),
        "gpu_types": fresh_json(), "termination_grace_seconds": rnd.choice((None, 30, 600)),
        "checkpointed_at": rnd.choice((None, updated)), "gpu_slices": rnd.choice((0, 1, 3)),
        "gpu_slots": fresh_json(),
    }
    return tuple(copy.deepcopy(values[f]) for f in JobRow._fields)


def test_compact_rows_are_the_plain_rows_over_random_reads() -> None:
    """Every row read with its repeated values shared is the plain row (`JobRow._make`)
    value by value, of the same types; a shared JSON value is only ever an empty one, so
    no row sees another's list or dict."""
    for seed in range(40):
        rnd = random.Random(seed)
        raw = [_raw_row(rnd, pk) for pk in range(1, rnd.randint(2, 300))]
        plain = [JobRow._make(r) for r in raw]
        got = list(active_jobs.compact_rows(copy.deepcopy(raw)))
        assert got == plain, seed
        assert [type(v) for r in got for v in r] == [type(v) for r in plain for v in r]
        seen: dict[int, tuple[int, str]] = {}
        for r in got:
            for name in ("placement", "dependencies", "cluster_selector", "gpu_types",
                         "gpu_slots"):
                v = getattr(r, name)
                if isinstance(v, list | dict):
                    owner = seen.setdefault(id(v), (r.id, name))
                    assert not v or owner == (r.id, name), (seed, r.id, name)


@pytest.mark.django_db
def test_the_active_jobs_read_compact_is_the_plain_read(world: World,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """A read of job rows through the database: the same rows with the sharing on and
    off; a full read's ids changed are every active job kept (the set its `_apply`
    made)."""
    from queueing.models import Job

    for i in range(6):
        JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                   status="QUEUED" if i % 2 else "RUNNING",
                   placement=[] if i % 2 else [f"n{i}"])
    qs = Job.objects.filter(status__in=active_jobs.ACTIVE_STATES)
    monkeypatch.setattr(active_jobs, "COMPACT_ROWS", False)
    plain = active_jobs._rows(qs)
    monkeypatch.setattr(active_jobs, "COMPACT_ROWS", True)
    got = active_jobs._rows(qs)
    assert len(got) == 6
    assert sorted(got) == sorted(plain)
    jobs = ActiveJobs()
    assert jobs.refresh().full
    assert jobs.last.changed == set(jobs.queued) | set(jobs.holding)
    assert len(jobs.last.changed) == 6
