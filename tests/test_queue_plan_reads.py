"""Rule P3's read path with many readers: N reads of N queued jobs between two
scheduler cycles plan the queue at most once, and each process fetches (unpickles) the
shared plan at most once, reading only its generation afterwards; a cycle that moved a
job, or another process's newer plan, still reaches every reader at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from django.core.cache import cache
from django.utils import timezone

from queueing.policy import admission
from queueing.selectors import queue_plan as qp
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body


@pytest.fixture(autouse=True)
def _a_request_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan a request makes (on a short queue with no cycle's plan published, or the
    path before cycles published theirs): the cycle's is left unread."""
    monkeypatch.setattr(qp, "PUBLISHED", False)


def _submit(world: World, **overrides: Any) -> int:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**overrides), format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


class _Counts:
    plans = 0
    shared_fetches = 0


@contextmanager
def _counting() -> Iterator[_Counts]:
    """Counts the plans of the whole queue and the fetches of the shared plan (the key
    whose value is the whole plan, alone or in a `get_many`)."""
    counts = _Counts()
    real_get, real_get_many = cache.get, cache.get_many

    def get(key: str, *args: Any, **kwargs: Any) -> Any:
        counts.shared_fetches += key == qp._PLAN_KEY
        return real_get(key, *args, **kwargs)

    def get_many(keys: list[str], *args: Any, **kwargs: Any) -> Any:
        counts.shared_fetches += qp._PLAN_KEY in keys
        return real_get_many(keys, *args, **kwargs)

    real_plan = admission.plan_admissions

    def plan(*args: Any, **kwargs: Any) -> Any:
        counts.plans += 1
        return real_plan(*args, **kwargs)

    with mock.patch.object(qp, "plan_admissions", plan), \
            mock.patch.object(cache, "get", get), mock.patch.object(cache, "get_many", get_many):
        yield counts


def _positions(world: World, ids: list[int]) -> list[int]:
    c = world.client(world.member)
    out = []
    for i in ids:
        r = c.get(f"/api/v1/jobs/{i}/")
        assert r.status_code == 200
        out.append(r.json()["queue"]["position"])
    return out


def _queued_world(world: World, n: int) -> list[int]:
    # 9 GPUs per job on 8-GPU quotas with borrowing: a full cluster keeps most queued.
    ids = [_submit(world, name=f"j{i}", gpus=8, replicas=2) for i in range(n)]
    scheduler_cycle(now=timezone.now())
    return [i for i in ids if world.client(world.member).get(f"/api/v1/jobs/{i}/")
            .json()["status"] == "QUEUED"]


def test_rule_p3_n_reads_of_n_queued_jobs_plan_once_between_two_cycles(world: World) -> None:
    queued = _queued_world(world, 12)
    assert len(queued) >= 8
    qp.queue_plan_forget()  # as a cycle that moved a job does
    with _counting() as counts:
        positions = _positions(world, queued)
    assert counts.plans == 1  # the first read plans; the others reuse it
    assert counts.shared_fetches == 0  # this process made it: no unpickling of it again
    assert sorted(positions) == positions and len(set(positions)) == len(queued)


def test_rule_p3_another_process_fetches_the_shared_plan_once(world: World) -> None:
    queued = _queued_world(world, 12)
    qp.queue_plan(now=timezone.now())
    qp._Local.plan = None  # a web process that did not make the plan
    with _counting() as counts:
        _positions(world, queued)
    assert counts.plans == 0
    assert counts.shared_fetches == 1  # not one per read (~30 ms per 10,000 jobs)


def test_rule_p3_a_newer_plan_of_another_process_replaces_the_local_copy(world: World) -> None:
    _submit(world, name="first")
    now = timezone.now()
    old = qp.queue_plan(now=now)
    newer = qp.queue_plan(now=now, fresh=True)  # another process planned since
    qp._Local.plan = old  # this process still holds the old one
    with _counting() as counts:
        got = qp.queue_plan(now=now)
    assert got.generation == newer.generation != old.generation
    assert (counts.plans, counts.shared_fetches) == (0, 1)


def test_rule_p3_a_cycle_that_moves_a_job_reaches_a_process_holding_the_plan(
        world: World) -> None:
    first = _submit(world, name="first")
    assert _positions(world, [first]) == [1]
    held = qp._Local.plan
    assert held is not None and first in held.entries
    result = scheduler_cycle(now=timezone.now())  # admits it: drops the plan
    assert first in result.admitted
    second = _submit(world, name="second", gpus=8, replicas=2)  # waits: 2 of 16 GPUs taken
    with _counting() as counts:
        assert qp.queue_plan(now=timezone.now()).generation != held.generation
    assert counts.plans == 1
    assert _positions(world, [second]) == [1]


def test_rule_p3_the_plan_expires_with_its_generation(world: World) -> None:
    """A process's copy is only used while the shared generation names it: expiry (the
    TTL that bounds the plan's age when no cycle drops it) reaches it too."""
    job = _submit(world, name="one")
    qp.queue_plan(now=timezone.now())
    cache.delete(qp._GEN_KEY)  # as QUEUE_PLAN_TTL does to the generation and plan together
    with _counting() as counts:
        _positions(world, [job])
    assert counts.plans == 1


def test_rule_p3_previews_unpack_the_kept_snapshot_once_per_process(world: World) -> None:
    _submit(world, name="queued", gpus=8, replicas=2)
    now = timezone.now()
    qp.submit_preview(team=world.vision, gpu_type=world.h100, gpus_per_replica=1,
                      replicas=1, tier_rank=100, now=now)  # keeps the snapshot
    qp._Local.plan = qp._Local.snapshot = None  # a web process that did not make them
    real_get, real_get_many = cache.get, cache.get_many
    fetched: list[str] = []

    def get(key: str, *args: Any, **kwargs: Any) -> Any:
        fetched.append(key)
        return real_get(key, *args, **kwargs)

    def get_many(keys: list[str], *args: Any, **kwargs: Any) -> Any:
        fetched.extend(keys)
        return real_get_many(keys, *args, **kwargs)

    with mock.patch.object(cache, "get", get), mock.patch.object(cache, "get_many", get_many), \
            mock.patch.object(qp, "build_snapshot") as built:
        for gpus in (1, 2, 4):  # three shapes: three placements, one snapshot
            preview = qp.submit_preview(team=world.vision, gpu_type=world.h100,
                                        gpus_per_replica=gpus, replicas=1, tier_rank=100,
                                        now=now)
            assert preview.queued == 1 and preview.error == ""
    assert built.call_count == 0
    assert fetched.count(qp._SNAPSHOT_KEY) == 1 and fetched.count(qp._PLAN_KEY) == 1


def test_rule_p3_after_a_miss_one_process_plans_and_the_others_wait_for_it(
        world: World) -> None:
    job = _submit(world, name="one")
    cache.add(qp._BUILD_KEY, "another process", timeout=qp.PLAN_BUILD_WAIT)  # it is planning
    made: list[str] = []

    def other_process_finishes(_seconds: float) -> None:
        if not made:
            made.append(qp._plan_compute(now=timezone.now())[0].generation)
            qp._Local.plan = None  # made there, not here

    with mock.patch.object(qp.time, "sleep", other_process_finishes), _counting() as counts:
        got = qp.queue_plan(now=timezone.now())
    assert counts.plans == 1 and made == [got.generation]  # its plan, not one of our own
    assert job in got.entries


def test_rule_p3_a_reader_plans_itself_when_the_planning_process_gives_up(
        world: World) -> None:
    job = _submit(world, name="one")
    cache.add(qp._BUILD_KEY, "another process", timeout=qp.PLAN_BUILD_WAIT)

    def it_gives_up(_seconds: float) -> None:
        cache.delete(qp._BUILD_KEY)  # an error plan (not cached), or it died

    with mock.patch.object(qp.time, "sleep", it_gives_up), _counting() as counts:
        got = qp.queue_plan(now=timezone.now())
    assert counts.plans == 1 and job in got.entries
    assert cache.get(qp._BUILD_KEY) is None  # and leaves no mark behind


def test_rule_p3_a_reader_waits_for_another_process_at_most_plan_build_wait(
        world: World) -> None:
    job = _submit(world, name="one")
    cache.add(qp._BUILD_KEY, "a process that hangs", timeout=60)
    with mock.patch.object(qp, "PLAN_BUILD_WAIT", 0.05), _counting() as counts:
        t0 = time.monotonic()
        got = qp.queue_plan(now=timezone.now())
    assert time.monotonic() - t0 < 5
    assert counts.plans == 1 and job in got.entries
