"""Step 5 reads its rows and writes their marks per group of chunks
(`scheduler._submit_groups`); the plain path reads and marks per chunk
(`scheduler._BATCHED_SUBMIT = False`). Over random sets of admitted jobs (gangs, array
members, several clusters, one unreachable, creates that fail every way a create
fails, jobs no longer to submit, a budget spent part-way) both must create the same
workloads in the same order and leave the same rows, events and results."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queueing.backends.base import (
    LaunchSpec,
    NodeInfo,
    SubmitRefused,
    SubmitRejected,
    SubmitRequeue,
    WorkloadStatus,
)
from queueing.models import Cluster, Job, JobArray, JobEvent
from queueing.services import scheduler
from queueing.services.clusters import Fleet, Member, fleet_open
from queueing.services.scheduler import CycleResult, submit_admitted

from .conftest import World
from .factories import JobFactory

pytestmark = pytest.mark.django_db

FAILURES = ("requeue", "rejected", "refused", "transient", "odd")


class Recorder:
    """A cluster that records the specs it is asked to create, and fails the creates
    named in `fail` the way each is named."""

    in_process = True
    provisions = False

    def __init__(self, fail: dict[str, str]) -> None:
        self.fail = fail
        self.created: list[LaunchSpec] = []

    def nodes(self) -> list[NodeInfo]:
        return []

    def submit(self, spec: LaunchSpec, *, now: datetime) -> None:
        how = self.fail.get(spec.name)
        if how == "requeue":
            raise SubmitRequeue(f"{spec.name} is being deleted")
        if how == "rejected":
            raise SubmitRejected("spec.containers[0].image: Invalid value")
        if how == "refused":
            raise SubmitRefused("jobs quota exhausted")
        if how == "transient":
            raise ConnectionError("connection reset")
        if how == "odd":
            raise ValueError("an error of no known kind")
        self.created.append(spec)

    def stop(self, name: str, *, now: datetime) -> None:
        pass

    def statuses(self, *, now: datetime) -> list[WorkloadStatus]:
        return []

    def logs(self, name: str, *, tail: int = 100) -> str:
        return ""


class Spent:
    """A budget spent after `checks` of step 5's tests (None: never): both paths test it
    before the same chunks, so a count stands in for the clock."""

    def __init__(self, checks: int | None) -> None:
        self.checks = checks

    def submit_spent(self, step_started: float) -> bool:
        if self.checks is None:
            return False
        self.checks -= 1
        return self.checks < 0


def random_jobs(world: World, rnd: random.Random, *, clusters: list[Cluster]
                ) -> tuple[list[int], dict[str, str]]:
    """Admitted jobs of every kind step 5 handles; the creates that are to fail."""
    now = timezone.now()
    array = JobArray.objects.create(team=world.vision, name="sweep", count=8, created_at=now)
    ids, fail = [], {}
    for i in range(rnd.randint(1, 30)):
        kind = rnd.choice(("plain", "gang", "array", "resumed", "submitted", "cancelled",
                           "cluster", "no-cluster", *FAILURES))
        fields: dict[str, Any] = {}
        if kind == "array":
            fields.update(array=array, array_index=i)
        if kind == "cluster" or (clusters and kind != "no-cluster"):
            fields.update(cluster=rnd.choice(clusters) if clusters else None)
        job = JobFactory(
            team=rnd.choice((world.vision, world.nlp, world.speech)),
            tier=rnd.choice((world.low, world.normal, world.high)),
            gpu_type=rnd.choice((world.h100, world.a100)),
            gpus_per_replica=rnd.choice((1, 2, 8)), replicas=3 if kind == "gang" else 1,
            status="CANCELLED" if kind == "cancelled" else "ADMITTED",
            attempt=rnd.choice((2, 3)) if kind in ("resumed", "requeue") else 1,
            admitted_at=now - timedelta(seconds=rnd.choice((1, 2, 3, 5))),
            submitted_to_backend_at=now if kind == "submitted" else None,
            placement=[f"sim-h100-{rnd.randrange(4):03d}"] * (3 if kind == "gang" else 1),
            memory_bytes=2**30, env={"K": str(i)}, name=f"j{i}-{kind}", **fields)
        ids.append(job.pk)
        if kind in FAILURES:
            fail[job.backend_name] = kind
    return ids, fail


def submitted(fleet: Fleet, recorders: dict[str, Recorder], ids: list[int], *,
              batched: bool, chunk: int, group: int, checks: int | None,
              settings: Any, now: datetime) -> tuple[Any, ...]:
    """What `submit_admitted` creates and writes along one path, rolled back after."""
    for r in recorders.values():
        r.created.clear()
    settings.FAIRQ_CYCLE_SUBMIT_CHUNK = chunk
    old = scheduler._BATCHED_SUBMIT, scheduler.SUBMIT_GROUP_MAX
    scheduler._BATCHED_SUBMIT, scheduler.SUBMIT_GROUP_MAX = batched, group
    result = CycleResult(cycle_id="c")
    try:
        with transaction.atomic():
            submit_admitted(backend=fleet, now=now, result=result,
                            budget=Spent(checks))  # type: ignore[arg-type]
            rows = list(Job.objects.filter(pk__in=ids).order_by("pk").values())
            events = list(JobEvent.objects.filter(job_id__in=ids).order_by(
                "job_id", "kind", "attempt", "reason").values(
                "job_id", "at", "kind", "from_status", "to_status", "actor_label", "reason",
                "attempt", "data"))
            transaction.set_rollback(True)
    finally:
        scheduler._BATCHED_SUBMIT, scheduler.SUBMIT_GROUP_MAX = old
    created = {name: [s.name for s in r.created] for name, r in recorders.items()}
    specs = {name: r.created[:] for name, r in recorders.items()}
    return (rows, events, created, specs, sorted(result.submitted), result.submit_errors,
            result.requeued, result.job_errors, result.deferred)


@pytest.mark.parametrize("seed", range(12))
def test_submits_in_groups_create_and_write_what_submits_per_chunk_do(
    world: World, settings: Any, seed: int
) -> None:
    rnd = random.Random(seed)
    several = seed % 2 == 1
    recorders: dict[str, Recorder] = {}
    fail: dict[str, str] = {}
    if several:
        clusters = [Cluster.objects.create(name=n, backend="simulated", sim_nodes="1x8xh100")
                    for n in ("east", "west", "gone")]
        ids, fail = random_jobs(world, rnd, clusters=clusters)
        recorders = {"east": Recorder(fail), "west": Recorder(fail)}
        fleet = fleet_open(backends=recorders)
        fleet.members["gone"].error = "unreachable"  # rule K5: its jobs wait
    else:
        ids, fail = random_jobs(world, rnd, clusters=[])
        recorders = {"": Recorder(fail)}
        fleet = Fleet([Member("", recorders[""])])
    chunk = rnd.choice((1, 2, 3, 64))
    group = rnd.choice((1, 4, 5, 1024))
    checks = rnd.choice((None, None, 0, 1, 2, 4))
    now = timezone.now()
    plain = submitted(fleet, recorders, ids, batched=False, chunk=chunk, group=group,
                      checks=checks, settings=settings, now=now)
    batched = submitted(fleet, recorders, ids, batched=True, chunk=chunk, group=group,
                        checks=checks, settings=settings, now=now)
    for name, got, want in zip(("rows", "events", "created", "specs", "submitted",
                                "submit_errors", "requeued", "job_errors", "deferred"),
                               batched, plain, strict=True):
        assert got == want, (name, seed, chunk, group, checks, [
            (g["id"], k, v, w[k]) for g, w in zip(got, want, strict=False) if name == "rows"
            for k, v in g.items() if v != w[k]])


def test_submits_in_groups_read_once_per_group(world: World, settings: Any) -> None:
    """Ten jobs in chunks of two: the plain path reads five times, the batched one three
    (groups of 2, 4 and 8 rows), and marks them in as many UPDATEs."""
    now = timezone.now()
    ids = [JobFactory(team=world.vision, tier=world.normal, gpu_type=world.h100,
                      status="ADMITTED", admitted_at=now, placement=["sim-h100-000"],
                      memory_bytes=2**30).pk for _ in range(10)]
    recorder = Recorder({})
    fleet = Fleet([Member("", recorder)])
    reads = {}
    for batched in (False, True):
        with CaptureQueriesContext(connection) as ctx:
            out = submitted(fleet, {"": recorder}, ids, batched=batched, chunk=2, group=1024,
                            checks=None, settings=settings, now=now)
        assert sorted(out[4]) == sorted(ids)
        sql = [q["sql"] for q in ctx.captured_queries]
        reads[batched] = (
            sum(1 for q in sql if q.startswith("SELECT") and '"queueing_job"."image"' in q
                and "submitted_to_backend_at" in q.partition("WHERE")[2]),
            sum(1 for q in sql if q.startswith("UPDATE")))
    assert reads == {False: (5, 5), True: (3, 3)}
