"""The scheduler's step 4 writes every admission in one statement on PostgreSQL
(`jobs.jobs_admit_batch`); the reference is one `job_transition` per job
(`scheduler._BATCHED = False`). Both must leave the same rows and events, and both keep
rule S1's compare-and-swap: a job changed after the plan read it is not admitted.
PostgreSQL only (the batched statement is PostgreSQL's)."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from queueing.models import Checkpoint, Cluster, Job, JobEvent
from queueing.policy.admission import Plan
from queueing.policy.snapshot import NodeState
from queueing.policy.stages.admit import Admission
from queueing.services import scheduler
from queueing.services.scheduler import CycleResult, apply_plan

from .factories import JobFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

NODES = [f"sim-h100-{i:03d}" for i in range(4)] + [f"sim-a100-{i:03d}" for i in range(4)]


def random_world(world: Any, rnd: random.Random) -> tuple[Plan, list[NodeState]]:
    """Queued jobs of every kind an admission writes differently, and a plan admitting
    them (and some it cannot: a type not accepted, a cluster not there, a job no longer
    queued, one admitted twice)."""
    now = timezone.now()
    east = Cluster.objects.get_or_create(name="east")[0]
    admissions = []
    for i in range(rnd.randint(1, 25)):
        kind = rnd.choice(("plain", "types", "spot", "slots", "resumed", "cluster",
                           "cancelled", "bad-type", "gone-cluster", "gang"))
        gpus = rnd.choice((1, 2, 4))
        job = JobFactory(team=rnd.choice((world.vision, world.nlp)), gpu_type=world.h100,
                         tier=world.normal, gpus_per_replica=gpus,
                         replicas=2 if kind == "gang" else 1,
                         gpu_types=["h100", "a100"] if kind in ("types", "bad-type") else [],
                         attempt=2 if kind == "resumed" else 1,
                         gpu_slices=2 if kind == "slots" else 0,
                         name=f"j{i}-{kind}")
        node = rnd.choice(NODES[:4])
        a: dict[str, Any] = {"job_id": job.pk, "team": job.team.slug, "gpu_type": "h100",
                             "placement": (node,)}
        if kind == "plain" and rnd.random() < 0.3:
            # A node name from a cluster with what no column takes (cleaned, rule S1).
            a.update(placement=(node + "\x00\u00e9",))
        elif kind == "types":
            a.update(gpu_type="a100", placement=(rnd.choice(NODES[4:]),))
        elif kind == "bad-type":
            a.update(gpu_type="mig-1g-10gb")
        elif kind == "spot":
            a.update(spot=True, placement=(node, rnd.choice(NODES[:4])))
        elif kind == "slots":
            a.update(gpu_slots=(rnd.randrange(8),))
        elif kind == "resumed":
            Checkpoint.objects.create(job=job, attempt=1, created_at=now - timedelta(
                minutes=rnd.randint(1, 90)), step=rnd.choice((None, 1200)),
                path=rnd.choice(("", "s3://ckpt/a\tb\"c")), progress=None)
        elif kind == "cluster":
            a.update(placement=(f"{east.name}/{node}",), cluster=east.name)
        elif kind == "gone-cluster":
            a.update(placement=(f"west/{node}",), cluster="west")
        elif kind == "gang":
            a.update(placement=(f"{east.name}/{node}", f"other/{node}"))
        elif kind == "cancelled":
            Job.objects.filter(pk=job.pk).update(status="CANCELLED")
        admissions.append(Admission(**a))
        if rnd.random() < 0.05:
            admissions.append(Admission(**a))
    rnd.shuffle(admissions)
    nodes = [NodeState(name=n, gpu_type=n.split("-")[1], capacity=8, free=8,
                       pool=rnd.choice(("", "spot-a", "spot-b")),
                       slices_per_gpu=rnd.choice((1, 4)))
             for n in NODES]
    return Plan(admissions=tuple(admissions), waits={}), nodes


def written(ids: list[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The jobs' rows and their events, without the events' ids."""
    rows = list(Job.objects.filter(pk__in=ids).order_by("pk").values())
    events = list(JobEvent.objects.filter(job_id__in=ids).order_by("job_id", "kind", "at")
                  .values("job_id", "at", "kind", "from_status", "to_status", "actor_id",
                          "actor_label", "reason", "attempt", "data"))
    return rows, events


def applied(plan: Plan, nodes: list[NodeState], *, batched: bool,
            sent: list[int]) -> tuple[Any, ...]:
    """What `apply_plan` writes along one path, rolled back afterwards."""
    now = timezone.now()
    ids = sorted({a.job_id for a in plan.admissions})
    sent.clear()
    old = scheduler._BATCHED
    scheduler._BATCHED = batched
    try:
        with transaction.atomic():
            admitted = apply_plan(plan=plan, now=now, result=CycleResult(), nodes=nodes)
            rows, events = written(ids)
            hooked = sorted(JobEvent.objects.filter(pk__in=sent).values_list("job_id", "to_status"))
            transaction.set_rollback(True)
    finally:
        scheduler._BATCHED = old
    for r in rows:
        r.pop("updated_at")  # ...is `now`: compared below
    return admitted, rows, events, hooked


@pytest.mark.parametrize("seed", range(12))
def test_batched_admissions_write_what_one_transition_per_job_writes(
    world: Any, sent: list[int], seed: int
) -> None:
    """Rule S1 held by one statement: the same admitted ids in the plan's order, the
    same rows, the same events, the same webhook messages as `job_transition` per job."""
    plan, nodes = random_world(world, random.Random(seed))
    batched = applied(plan, nodes, batched=True, sent=sent)
    reference = applied(plan, nodes, batched=False, sent=sent)
    for r in (*batched[1], *reference[1]):
        r.pop("admitted_at")  # each run's own `now`
    for e in (*batched[2], *reference[2]):
        if e["to_status"] == "ADMITTED":
            e.pop("at")
    assert batched[0] == reference[0]
    assert batched[1] == reference[1]
    assert batched[2] == reference[2]
    assert batched[3] == reference[3]
    assert batched[0], "the world admits someone"


@pytest.mark.parametrize("batched", [True, False])
def test_a_job_changed_after_it_was_read_is_not_admitted(
    world: Any, monkeypatch: Any, batched: bool
) -> None:
    """Rule S1's compare-and-swap: rows cancelled, or requeued as a new attempt, between
    the apply step's read and its write (what another worker's transaction that
    committed meanwhile looks like) are not written and get no event; the others are
    admitted."""
    jobs = [JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
            for _ in range(4)]
    plan = Plan(admissions=tuple(Admission(job_id=j.pk, team="vision", gpu_type="h100",
                                           placement=(NODES[0],)) for j in jobs), waits={})
    real = scheduler.newest_checkpoints  # read after the rows: the last read before the write

    def meanwhile(ids: Any) -> Any:
        Job.objects.filter(pk=jobs[0].pk).update(status="CANCELLED")
        Job.objects.filter(pk=jobs[1].pk).update(attempt=2)
        return real(ids)

    monkeypatch.setattr(scheduler, "newest_checkpoints", meanwhile)
    monkeypatch.setattr(scheduler, "_BATCHED", batched)
    with transaction.atomic():
        admitted = apply_plan(plan=plan, now=timezone.now())
    assert admitted == [jobs[2].pk, jobs[3].pk]
    status = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    assert [status[j.pk] for j in jobs] == ["CANCELLED", "QUEUED", "ADMITTED", "ADMITTED"]
    assert sorted(JobEvent.objects.filter(to_status="ADMITTED").values_list(
        "job_id", flat=True)) == [jobs[2].pk, jobs[3].pk]


def test_a_batch_that_raises_is_applied_one_job_at_a_time(
    world: Any, monkeypatch: Any
) -> None:
    """The batched statement failing (a value no column takes) rolls back its
    savepoint; the admissions are then written one `job_transition` each."""
    jobs = [JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
            for _ in range(3)]
    plan = Plan(admissions=tuple(Admission(job_id=j.pk, team="vision", gpu_type="h100",
                                           placement=(NODES[0],)) for j in jobs), waits={})

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a row no column takes")

    monkeypatch.setattr(scheduler, "jobs_admit_batch", broken)
    with transaction.atomic():
        assert apply_plan(plan=plan, now=timezone.now()) == [j.pk for j in jobs]
    assert JobEvent.objects.filter(to_status="ADMITTED").count() == 3
