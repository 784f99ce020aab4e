"""The scheduler's step 1 writes the common status changes of a chunk together on
PostgreSQL (`scheduler._apply_common`: `jobs.jobs_transition_batch` for the starts and
the ends, `usage.usage_record_attempts` for the ends' usage records and accumulators);
the reference is `_apply_status` per job (`scheduler._BATCHED_STATUSES = False`). Both
must leave the same rows, events, usage records, accumulators (rule F1) and webhook
messages, and both keep rule S1's compare-and-swap: a job changed after step 1 read it
is not moved (nor charged) a second time. PostgreSQL only (the statements are
PostgreSQL's)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queueing.backends.base import Phase, WorkloadStatus
from queueing.models import FairShareAccumulator, GpuType, Job, JobEvent, UsageRecord
from queueing.services import scheduler
from queueing.services.scheduler import CycleResult

from .factories import JobFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

KINDS = ("start", "start-moved", "start-slots-kept", "start-nul", "start-no-nodes",
         "start-then-end", "failed-before-start", "end-ok", "end-failed", "end-no-finish",
         "end-before-start", "end-charged", "end-spot", "end-shared", "end-resumed",
         "end-gang", "cancelled", "other-attempt")


class _NoNodes:
    def nodes(self) -> list[Any]:
        return []


def _job(world: Any, rnd: random.Random, kind: str, t0: datetime, i: int) -> Job:
    running = kind.startswith("end") or kind in ("cancelled", "other-attempt")
    node = f"sim-h100-{rnd.randrange(4):03d}"
    gpu_type = world.a100 if kind == "end-shared" or rnd.random() < 0.3 else world.h100
    return JobFactory(
        team=rnd.choice((world.vision, world.nlp, world.speech)), gpu_type=gpu_type,
        tier=world.normal, gpus_per_replica=rnd.choice((1, 2, 4)),
        replicas=2 if kind == "end-gang" else 1,
        gpu_slices=2 if kind == "end-shared" else 0,
        status="CANCELLED" if kind == "cancelled" else "RUNNING" if running else "ADMITTED",
        attempt=2 if kind == "end-resumed" else 1, name=f"j{i}-{kind}",
        admitted_at=t0, submitted_to_backend_at=t0,
        started_at=t0 + timedelta(seconds=rnd.randint(1, 30)) if running else None,
        placement=[node] * (2 if kind == "end-gang" else 1),
        gpu_slots=[rnd.randrange(8)] if kind in ("start-moved", "start-slots-kept") else [],
        on_spot=kind == "end-spot", spot_pools={"spot-a": 1} if kind == "end-spot" else {})


def _status(job: Job, kind: str, rnd: random.Random, t0: datetime) -> WorkloadStatus:
    at = t0 + timedelta(seconds=rnd.randint(40, 600))
    node = job.placement[0]
    base: dict[str, Any] = {"name": f"fq-{job.pk}-{job.attempt}", "job_id": job.pk,
                            "attempt": job.attempt}
    if kind.startswith("start") and kind != "start-then-end":
        nodes: tuple[str, ...] = {
            "start-moved": ("sim-a100-009",), "start-nul": (node + "\x00\u00e9",),
            "start-no-nodes": ()}.get(kind, (node,))
        return WorkloadStatus(**base, phase=Phase.RUNNING, nodes=nodes,
                              started_at=None if kind == "start-no-nodes" else at)
    if kind == "start-then-end":
        return WorkloadStatus(**base, phase=Phase.SUCCEEDED, nodes=(node,), started_at=at,
                              finished_at=at + timedelta(seconds=5), exit_code=0)
    if kind == "failed-before-start":
        return WorkloadStatus(**base, phase=Phase.FAILED, reason="ErrImagePull",
                              finished_at=at, exit_code=None)
    if kind == "other-attempt":
        base.update(attempt=job.attempt + 1, name=f"fq-{job.pk}-{job.attempt + 1}")
    failed = kind == "end-failed" or (kind not in ("end-ok",) and rnd.random() < 0.3)
    finished: datetime | None = at
    if kind == "end-no-finish":
        finished = None
    elif kind == "end-before-start":
        finished = t0
    return WorkloadStatus(
        **base, phase=Phase.FAILED if failed else Phase.SUCCEEDED, nodes=tuple(job.placement),
        started_at=job.started_at, finished_at=finished,
        exit_code=(2**40 if kind == "end-failed" else 137) if failed else 0,
        reason=("OOMKilled\x00 by the \u00e9 kernel" if kind == "end-failed"
                else "Error" if failed else ""))


def random_world(world: Any, rnd: random.Random) -> list[WorkloadStatus]:
    """Admitted and running jobs of every kind step 1 moves differently, and their
    workloads' statuses; accumulators for some of the teams."""
    t0 = timezone.now() - timedelta(hours=1)
    GpuType.objects.filter(pk=world.a100.pk).update(billing_weight=rnd.choice((0.5, 1.7)),
                                                    sharing="time-sliced", slices_per_gpu=4)
    for team in (world.vision, world.nlp, world.speech):
        if rnd.random() < 0.6:
            FairShareAccumulator.objects.update_or_create(team=team, defaults={
                "value": rnd.uniform(0, 50), "as_of": t0 + timedelta(minutes=rnd.randint(0, 90))})
    statuses = []
    for i in range(rnd.randint(1, 40)):
        kind = rnd.choice(KINDS)
        job = _job(world, rnd, kind, t0, i)
        if kind == "end-charged":
            UsageRecord.objects.create(team=job.team, gpu_type=job.gpu_type, job=job,
                                       attempt=job.attempt, gpus=1, start=t0, end=t0,
                                       gpu_seconds=0)
        statuses.append(_status(job, kind, rnd, t0))
    rnd.shuffle(statuses)
    return statuses


def written(ids: list[int]) -> tuple[Any, ...]:
    """The jobs' rows, their events, usage records and the accumulators, without ids."""
    rows = list(Job.objects.filter(pk__in=ids).order_by("pk").values())
    events = list(JobEvent.objects.filter(job_id__in=ids).order_by("job_id", "id")
                  .values("job_id", "at", "kind", "from_status", "to_status", "actor_id",
                          "actor_label", "reason", "attempt", "data"))
    usage = list(UsageRecord.objects.filter(job_id__in=ids).order_by("job_id", "attempt")
                 .values("team_id", "gpu_type_id", "job_id", "attempt", "gpus",
                         "billing_weight", "start", "end", "gpu_seconds", "source",
                         "cluster_id", "spot", "price_per_gpu_hour", "lost_gpu_hours"))
    accumulators = list(FairShareAccumulator.objects.order_by("team_id")
                        .values_list("team_id", "value", "as_of"))
    return rows, events, usage, accumulators


def applied(statuses: list[WorkloadStatus], *, batched: bool, now: datetime,
            sent: list[int], chunk: int = 100) -> tuple[Any, ...]:
    """What step 1's chunks write along one path, rolled back afterwards."""
    ids = sorted({s.job_id for s in statuses})
    sent.clear()
    old = scheduler._BATCHED_STATUSES
    scheduler._BATCHED_STATUSES = batched
    result = CycleResult()
    try:
        with transaction.atomic():
            # The reference: whole rows read at once before the chunks (as step 1 read
            # them before its chunks read their own rows, locked: `moved` None).
            moved = Job.objects.select_related("gpu_type").in_bulk(ids) if not batched \
                else None
            done = 0
            while done < len(statuses):
                done += scheduler._apply_statuses(
                    statuses[done:done + chunk], moved, first=done == 0, budget=None,
                    now=now, result=result, pools_now=scheduler._PoolsNow(_NoNodes()))
            out = written(ids)
            hooked = sorted(JobEvent.objects.filter(pk__in=sent).values_list(
                "job_id", "to_status"))
            transaction.set_rollback(True)
    finally:
        scheduler._BATCHED_STATUSES = old
    return (*out, hooked, sorted(result.started), sorted(result.finished),
            result.job_errors)


@pytest.mark.parametrize("seed", range(12))
def test_batched_status_changes_write_what_one_job_at_a_time_writes(
    world: Any, sent: list[int], seed: int
) -> None:
    """The same rows, events, usage records, accumulators (up to rounding: rule F1's
    intervals may be added in another order), webhook messages and started and
    finished jobs as `_apply_status` per job, in chunks of a random size."""
    rnd = random.Random(seed)
    statuses = random_world(world, rnd)
    now = timezone.now()
    chunk = rnd.choice((1, 3, 100))
    batched = applied(statuses, batched=True, now=now, sent=sent, chunk=chunk)
    reference = applied(statuses, batched=False, now=now, sent=sent, chunk=chunk)
    names = ("rows", "events", "usage", "accumulators", "webhooks", "started", "finished",
             "errors")
    for name, b, r in zip(names, batched, reference, strict=True):
        if name == "accumulators":
            assert [(t, at) for t, _, at in b] == [(t, at) for t, _, at in r], name
            assert [v for _, v, _ in b] == pytest.approx([v for _, v, _ in r], rel=1e-12)
        else:
            assert b == r, name
    assert batched[5] or batched[6], "the world moves someone"


def test_a_chunk_of_common_changes_is_a_few_statements(world: Any) -> None:
    """Fifty starts and fifty ends: a constant number of statements on the batched path
    (two savepoints opened and released, the rows read and locked, the starts, the
    ends, the usage records, the accumulators read, created when missing, read again
    and written), not some per job: no column of a row is read one job at a time."""
    rnd = random.Random(7)
    t0 = timezone.now() - timedelta(hours=1)
    statuses = []
    for i in range(100):
        kind = "start" if i % 2 else "end-ok"
        job = _job(world, rnd, kind, t0, i)
        statuses.append(_status(job, kind, rnd, t0))
    result = CycleResult()
    with CaptureQueriesContext(connection) as queries:
        scheduler._apply_statuses(statuses, None, first=True, budget=None,
                                  now=timezone.now(), result=result,
                                  pools_now=scheduler._PoolsNow(_NoNodes()))
    assert len(result.started) == 50 and len(result.finished) == 50
    shown = "\n".join(q["sql"][:100] for q in queries.captured_queries)
    assert len(queries) <= 12, shown
    assert UsageRecord.objects.count() == 50


@pytest.mark.parametrize("batched", [True, False])
def test_a_job_changed_after_it_was_read_is_not_moved_twice(
    world: Any, sent: list[int], batched: bool, monkeypatch: Any
) -> None:
    """Rule S1's compare-and-swap: rows ended, cancelled or requeued as a new attempt
    by another worker between step 1's read and its write (what a transaction that
    committed meanwhile looks like) are not written, get no event, no usage record and
    no charge to their team's accumulator; the others are moved."""
    monkeypatch.setattr(scheduler, "_BATCHED_STATUSES", batched)
    rnd = random.Random(3)
    t0 = timezone.now() - timedelta(hours=1)
    kinds = ["end-ok", "end-ok", "end-ok", "end-ok", "start", "start"]
    jobs = [_job(world, rnd, kind, t0, i) for i, kind in enumerate(kinds)]
    for job in jobs:
        job.team = world.vision
        Job.objects.filter(pk=job.pk).update(team=world.vision)
    statuses = [_status(job, kind, rnd, t0) for job, kind in zip(jobs, kinds, strict=True)]
    moved = Job.objects.select_related("gpu_type").in_bulk([j.pk for j in jobs])
    # Meanwhile: one ended and charged by another worker, one cancelled, one requeued,
    # one start cancelled.
    Job.objects.filter(pk=jobs[0].pk).update(status="SUCCEEDED")
    UsageRecord.objects.create(team=world.vision, gpu_type=jobs[0].gpu_type, job=jobs[0],
                               attempt=1, gpus=1, start=t0, end=t0, gpu_seconds=0)
    Job.objects.filter(pk=jobs[1].pk).update(status="CANCELLED")
    Job.objects.filter(pk=jobs[2].pk).update(status="QUEUED", attempt=2)
    Job.objects.filter(pk=jobs[4].pk).update(status="CANCELLED")
    FairShareAccumulator.objects.update_or_create(team=world.vision, defaults={
        "value": 0.0, "as_of": t0})
    result = CycleResult()
    with transaction.atomic():
        scheduler._apply_statuses(statuses, moved, first=True, budget=None,
                                  now=timezone.now(), result=result,
                                  pools_now=scheduler._PoolsNow(_NoNodes()))
    assert result.finished == [jobs[3].pk] and result.started == [jobs[5].pk]
    status = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    assert [status[j.pk] for j in jobs] == ["SUCCEEDED", "CANCELLED", "QUEUED", "SUCCEEDED",
                                            "CANCELLED", "RUNNING"]
    assert sorted(JobEvent.objects.filter(job_id__in=[j.pk for j in jobs]).values_list(
        "job_id", flat=True)) == [jobs[3].pk, jobs[5].pk]
    assert sorted(UsageRecord.objects.values_list("job_id", "gpu_seconds")) == sorted([
        (jobs[0].pk, 0.0), (jobs[3].pk, jobs[3].gpu_share * (
            statuses[3].finished_at - jobs[3].started_at).total_seconds())])
    # Only the one job ended here is charged: its interval alone.
    from queueing.policy.fairshare import Accumulator
    from queueing.selectors.fairshare import half_life_hours
    expected = Accumulator(0.0, t0).add_interval(
        rate=jobs[3].gpu_share * jobs[3].gpu_type.billing_weight,
        start=jobs[3].started_at, end=statuses[3].finished_at,
        half_life_hours=half_life_hours())
    acc = FairShareAccumulator.objects.get(team=world.vision)
    assert acc.value == pytest.approx(expected.value, rel=1e-12)
    assert acc.as_of == expected.as_of
    assert len(set(sent)) == 2


def test_a_batch_that_raises_is_applied_one_job_at_a_time(
    world: Any, monkeypatch: Any
) -> None:
    """The batched statements failing roll back their savepoint; the changes are then
    written by `_apply_status` one job each, and none is lost."""
    rnd = random.Random(5)
    t0 = timezone.now() - timedelta(hours=1)
    kinds = ["end-ok", "start", "end-failed"]
    jobs = [_job(world, rnd, kind, t0, i) for i, kind in enumerate(kinds)]
    statuses = [_status(job, kind, rnd, t0) for job, kind in zip(jobs, kinds, strict=True)]
    calls: list[int] = []
    real_usage = scheduler.usage_record_attempts

    def broken(charges: Any) -> Any:
        calls.append(len(charges))
        real_usage(charges)  # written, then rolled back with the savepoint
        raise ValueError("a row no column takes")

    monkeypatch.setattr(scheduler, "usage_record_attempts", broken)
    moved = Job.objects.select_related("gpu_type").in_bulk([j.pk for j in jobs])
    result = CycleResult()
    with transaction.atomic():
        scheduler._apply_statuses(statuses, moved, first=True, budget=None,
                                  now=timezone.now(), result=result,
                                  pools_now=scheduler._PoolsNow(_NoNodes()))
    assert calls == [2]
    assert sorted(result.finished) == sorted([jobs[0].pk, jobs[2].pk])
    assert result.started == [jobs[1].pk] and not result.job_errors
    assert JobEvent.objects.filter(job_id__in=[j.pk for j in jobs]).count() == 3
    assert UsageRecord.objects.filter(job_id__in=[j.pk for j in jobs]).count() == 2
