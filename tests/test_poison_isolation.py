"""The fault-isolation test (docs/scheduling.md, "The cycle"): 50 hostile jobs and workload
statuses of every kind among 1,000 ordinary jobs. Every ordinary job is admitted and
finishes; every hostile one ends with a reason and an event; no cycle raises.

Hostile rows are written to the database directly (as rows older than today's validation
would be); hostile statuses come from a wrapper around the simulated cluster. The clock is
virtual (`now=`); the cluster has 320 GPUs, so the 1,000 one-GPU jobs of 60 s run in a
few waves (a cycle every 61 s of virtual time: each job is admitted, then seen
running and finished by the next cycle).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.backends.base import Phase, WorkloadStatus
from queueing.backends.simulated import SimulatedCluster
from queueing.models import Job, JobEvent, Quota
from queueing.policy.states import FINAL_STATES, JobState
from queueing.services.jobs import JobInput, jobs_submit_bulk
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, poison_charge
from .test_poison import HostileCluster

pytestmark = pytest.mark.django_db

Rewrite = Callable[[WorkloadStatus], list[Any]]


class Exploding:
    """A status whose every attribute raises."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name} for you")


def _first_attempt(fn: Rewrite) -> Rewrite:
    """Rewrite attempt 1 only; later attempts report what the cluster says."""
    return lambda s: fn(s) if s.attempt == 1 else [s]


def _while_running(fn: Rewrite) -> Rewrite:
    return lambda s: fn(s) if s.phase == Phase.RUNNING else [s]


def _status_rewrites() -> list[Rewrite]:
    def failed(**kw: Any) -> Rewrite:
        return lambda s: [replace(s, phase=Phase.FAILED, finished_at=s.started_at, **kw)]

    day = timedelta(days=1)
    naive = datetime(2020, 1, 1, 12, 0)  # a naive time is the point
    return [
        failed(reason="Error\x00: OOM\x1b[0m\x07 \ud800 killed", exit_code=137),
        failed(reason="x" * 5_000_000, exit_code=1),
        failed(reason="exit", exit_code=2**70),
        failed(reason="exit", exit_code=-(2**70)),
        failed(reason="exit", exit_code=math.nan),
        failed(reason=None, exit_code="137"),
        failed(reason=b"\x00bytes", exit_code=99999999999),
        lambda s: [replace(s, phase=Phase.SUCCEEDED, started_at=None, finished_at=None)],
        lambda s: [replace(s, phase=Phase.FAILED, started_at=None, reason="image pull\x00")],
        lambda s: [replace(s, phase=Phase.SUCCEEDED, finished_at=s.started_at - day,
                           exit_code=0)],
        lambda s: [replace(s, phase=Phase.SUCCEEDED, started_at=naive, finished_at=naive,
                           exit_code=0)],
        _first_attempt(lambda s: [replace(s, attempt=s.attempt + 5)]),  # wrong attempt
        _first_attempt(lambda s: [replace(s, attempt=-1)]),
        _first_attempt(lambda s: [replace(s, attempt=2**40)]),
        _first_attempt(lambda s: [Exploding()]),
        _while_running(lambda s: [replace(s, nodes=("nöde-\x00☃", None, 5, "x" * 10_000))]),
        _while_running(lambda s: [replace(s, nodes="not-a-tuple")]),  # type: ignore[arg-type]
        _while_running(lambda s: [replace(s, phase="EXPLODED")]),  # type: ignore[arg-type]
        lambda s: [s, replace(s, phase=Phase.FAILED, exit_code=1, reason="dup\x00")],
        lambda s: [replace(s, name="fq-\x00" + "é" * 1000)],
    ]


def _poison_rows(ids: list[int], now: datetime) -> dict[int, str]:
    """Give each job a hostile row; returns job id -> what is wrong with it."""
    kinds: list[tuple[str, dict[str, Any]]] = [
        ("sim seconds 1e20", {"env": {"FAIRQ_SIM_SECONDS": "1e20"}}),
        ("sim seconds inf", {"env": {"FAIRQ_SIM_SECONDS": "inf"}}),
        ("sim seconds nan", {"env": {"FAIRQ_SIM_SECONDS": "nan"}}),
        ("sim seconds -1", {"env": {"FAIRQ_SIM_SECONDS": "-1"}}),
        ("sim seconds 1e308", {"env": {"FAIRQ_SIM_SECONDS": "1e308"}}),
        ("sim exit code huge", {"env": {"FAIRQ_SIM_EXIT_CODE": "99999999999"}}),
        ("sim exit code -huge", {"env": {"FAIRQ_SIM_EXIT_CODE": "-99999999999"}}),
        ("env not a mapping", {"env": ["A=1"]}),
        ("command not a list", {"command": 5}),
        ("admitted, placement not a list", {"status": JobState.ADMITTED, "admitted_at": now,
                                            "placement": {"node": 1}}),
        ("running without started_at or workload", {
            "status": JobState.RUNNING, "admitted_at": now, "started_at": None,
            "updated_at": now - timedelta(minutes=5), "placement": ["sim-h100-000"],
            "submitted_to_backend_at": now - timedelta(minutes=5)}),
    ]
    what = {}
    for job_id, (label, values) in zip(ids, itertools.cycle(kinds), strict=False):
        Job.objects.filter(pk=job_id).update(**values)
        what[job_id] = label
    return what


def test_fifty_hostile_jobs_among_a_thousand_never_stop_the_others(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    Quota.objects.update(nominal=0, borrowing_limit=None, lending_limit=None)
    t0 = timezone.now()
    ordinary: list[int] = []
    for team, count in ((world.vision, 334), (world.nlp, 333), (world.speech, 333)):
        ordinary += jobs_submit_bulk(actor=world.staff, count=count, now=t0, data=JobInput(
            team=team, name=f"ok-{team.slug}", image="ghcr.io/acme/train:1", command=[],
            args=[], env={"FAIRQ_SIM_SECONDS": "60"}, gpu_type=world.h100,
            gpus_per_replica=1, replicas=1, tier=world.normal, max_runtime_seconds=None))
    hostile = jobs_submit_bulk(actor=world.staff, count=50, now=t0, data=JobInput(
        team=world.speech, name="hostile", image="ghcr.io/acme/train:1", command=[],
        args=[], env={"FAIRQ_SIM_SECONDS": "60"}, gpu_type=world.h100, gpus_per_replica=1,
        replicas=1, tier=world.high, max_runtime_seconds=None))
    # 11 hostile rows, 20 hostile statuses, 2 jobs whose processing raises, the rest
    # hostile rows again (a second of each kind).
    rows = hostile[:11] + hostile[33:]
    what = _poison_rows(rows, t0)
    rewrites = _status_rewrites()
    cluster = HostileCluster(SimulatedCluster.from_spec("40x8xh100"))
    for job_id, fn in zip(hostile[11:31], rewrites, strict=True):
        cluster.rewrite[job_id] = fn
        what[job_id] = "hostile status"
    raising = set(hostile[31:33])
    what.update(dict.fromkeys(raising, "raises while charged"))
    assert len(what) == 50
    # Statuses that name no job, or a job that does not exist.
    cluster.extra = [
        WorkloadStatus(name="fq-999999999999-1", job_id=999999999999, attempt=1,
                       phase=Phase.RUNNING, nodes=("sim-h100-000",)),
        WorkloadStatus(name="fq-x", job_id=-5, attempt=1, phase=Phase.FAILED, reason="\x00"),
        WorkloadStatus(name="fq-y", job_id=2**70, attempt=1, phase=Phase.SUCCEEDED),
        WorkloadStatus(name="fq-z", job_id="12", attempt=1, phase=Phase.SUCCEEDED),  # type: ignore[arg-type]
        WorkloadStatus(name="\x00", job_id=True, attempt=1, phase=Phase.SUCCEEDED),  # type: ignore[arg-type]
        Exploding(),
        None,
    ]
    poison_charge(monkeypatch, raising, ZeroDivisionError("a bug met an odd row"))

    now = t0
    for _ in range(40):
        now += timedelta(seconds=61)
        scheduler_cycle(now=now, backend=cluster)  # never raises
        if not Job.objects.exclude(status__in=list(FINAL_STATES)).exists():
            break

    states = dict(Job.objects.values_list("pk", "status"))
    assert all(states[pk] == JobState.SUCCEEDED for pk in ordinary), \
        {s: sum(1 for pk in ordinary if states[pk] == s) for s in JobState}
    assert JobEvent.objects.filter(job_id__in=ordinary, to_status=JobState.ADMITTED) \
        .values("job_id").distinct().count() == 1000
    for pk in hostile:
        assert states[pk] in FINAL_STATES, (pk, what[pk], states[pk])
        last = JobEvent.objects.filter(job_id=pk).order_by("-id").first()
        assert last is not None and last.reason and last.to_status == states[pk], what[pk]
    for pk in raising:
        assert states[pk] == JobState.FAILED
        assert JobEvent.objects.filter(job_id=pk).order_by("-id")[0].reason.startswith(
            "fairq could not process")
    for pk in rows[:9]:  # the knobs and rows fairq refuses end FAILED, saying why
        assert states[pk] == JobState.FAILED, what[pk]
    # Nothing unsafe was stored.
    for reason, message in Job.objects.filter(pk__in=hostile).values_list(
            "events__reason", "message"):
        for text in (reason or "", message or ""):
            assert "\x00" not in text and "\x1b" not in text and len(text) <= 500
    assert all(-(2**31) <= c < 2**31 for c in Job.objects.filter(exit_code__isnull=False)
               .values_list("exit_code", flat=True))
    # ...and the cluster is empty again: every hostile workload was stopped.
    assert sum(n.allocated for n in cluster.nodes()) == 0
