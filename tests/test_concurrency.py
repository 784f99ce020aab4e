"""Two scheduler cycles at once never admit a job twice (PostgreSQL: real row locks and
concurrent transactions; skipped on SQLite)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from queueing.models import Job, JobEvent
from queueing.services import scheduler
from queueing.services.scheduler import scheduler_cycle

from .factories import JobFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def run_in_threads(fn: Callable[[], Any], n: int = 2) -> list[Any]:
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            results[i] = fn()
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()  # each thread has its own connection

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def queue_jobs(world: Any, count: int) -> list[int]:
    return [JobFactory(team=world.vision, gpu_type=world.a100, tier=world.normal,
                       gpus_per_replica=1).pk for _ in range(count)]


def assert_admitted_once(ids: list[int]) -> None:
    for job_id in ids:
        n = JobEvent.objects.filter(job_id=job_id, to_status="ADMITTED").count()
        assert n <= 1, f"job {job_id} admitted {n} times"
    admitted = Job.objects.filter(pk__in=ids, status="ADMITTED")
    assert admitted.count() == JobEvent.objects.filter(to_status="ADMITTED").count()


def cycle_beside_a_held_one(monkeypatch: Any) -> tuple[Any, Any]:
    """Two cycles: the first is held inside the lock (in its snapshot) until the second,
    started meanwhile, has returned. Their results, first then second."""
    inside, second_done = threading.Event(), threading.Event()
    real_snapshot = scheduler.build_snapshot

    def held_snapshot(**kwargs: Any) -> Any:
        if not inside.is_set():
            inside.set()
            assert second_done.wait(timeout=30), "the second cycle never returned"
        return real_snapshot(**kwargs)

    monkeypatch.setattr(scheduler, "build_snapshot", held_snapshot)

    def run() -> list[Any]:
        first: list[Any] = []
        holder = threading.Thread(target=lambda: (first.append(scheduler_cycle(
            now=timezone.now())), connection.close()))
        holder.start()
        assert inside.wait(timeout=30)
        second = scheduler_cycle(now=timezone.now())  # its own connection: this thread's
        second_done.set()
        holder.join(timeout=60)
        return [first[0], second]

    first, second = run_in_threads(run, n=1)[0]
    return first, second


def test_a_second_cycle_stands_aside_while_one_holds_the_lock(
    world: Any, monkeypatch: Any
) -> None:
    """The first cycle is held inside the lock until the second has returned: the
    second must not plan at all (the advisory lock), and nothing is admitted twice."""
    ids = queue_jobs(world, 24)
    first, second = cycle_beside_a_held_one(monkeypatch)
    assert (first.ran, second.ran) == (True, False)
    assert len(first.admitted) == 16 and second.admitted == []  # 2 × 8 a100 in the cluster
    assert_admitted_once(ids)


def test_a_cycle_asked_for_while_one_runs_is_kicked_when_it_ends(
    world: Any, monkeypatch: Any
) -> None:
    """The second cycle finds the lock held and stands aside; it is not lost: the first,
    once it has let the lock go, kicks another (a kick sent while a cycle runs - a watch
    that saw a pod start - waited for the beat before, or was lost again). A cycle that
    nobody asked for while it ran kicks nothing."""
    from django.core.cache import cache

    cache.delete("fairq:cycle:again")
    kicks: list[float] = []
    monkeypatch.setattr(scheduler, "kick", lambda: kicks.append(1.0))
    queue_jobs(world, 4)
    first, second = cycle_beside_a_held_one(monkeypatch)
    assert (first.ran, second.ran) == (True, False)
    assert kicks == [1.0]
    # Alone: nobody asked for another while it ran.
    assert scheduler_cycle(now=timezone.now() + timedelta(seconds=1)).ran
    assert kicks == [1.0]


def test_stale_plans_applied_at_once_admit_each_job_once(world: Any, monkeypatch: Any) -> None:
    """Without the cycle lock, both cycles plan on the same snapshot and race to apply:
    the compare-and-swap on (status, attempt) lets exactly one win each job."""

    @contextlib.contextmanager
    def no_lock() -> Iterator[bool]:
        yield True

    monkeypatch.setattr(scheduler, "cycle_lock", no_lock)
    ids = queue_jobs(world, 12)
    barrier = threading.Barrier(2)
    real_apply = scheduler.apply_plan

    def apply_together(**kwargs: Any) -> list[int]:
        barrier.wait()  # both plans are made before either applies
        return real_apply(**kwargs)

    monkeypatch.setattr(scheduler, "apply_plan", apply_together)
    now = timezone.now()
    results = run_in_threads(lambda: scheduler_cycle(now=now + timedelta(seconds=0)))
    won = [j for r in results for j in r.admitted]
    assert sorted(won) == sorted(set(won)), "a job was admitted by both cycles"
    assert sorted(won) == sorted(ids)
    assert_admitted_once(ids)


def test_two_crossing_parent_moves_never_make_a_cycle(world: Any, monkeypatch: Any) -> None:
    """A under B and B under A at the same time: each passes Team.clean() on its own.
    Serialized parent changes refuse the second cleanly (rule F4) where PostgreSQL would
    otherwise abort one as a deadlock. The first move holds its transaction open after
    validating; the second starts meanwhile."""
    import time

    from django.core.exceptions import ValidationError

    from accounts.models import Team
    from accounts.services import team_update

    a, b = world.nlp, world.speech
    original_clean = Team.clean

    def slow_clean(self: Team) -> None:
        original_clean(self)
        time.sleep(0.5)  # validated; not yet saved nor committed

    monkeypatch.setattr(Team, "clean", slow_clean)
    outcomes: dict[str, str] = {}

    def move(child_pk: int, parent_pk: int, delay: float) -> Callable[[], None]:
        def run() -> None:
            time.sleep(delay)
            child, parent = Team.objects.get(pk=child_pk), Team.objects.get(pk=parent_pk)
            try:
                team_update(actor=None, team=child, parent=parent)
                outcomes[child.slug] = "moved"
            except ValidationError:
                outcomes[child.slug] = "refused"
        return run

    moves = [move(a.pk, b.pk, 0.0), move(b.pk, a.pk, 0.2)]
    run_in_threads(lambda: moves.pop(0)())
    assert sorted(outcomes.values()) == ["moved", "refused"]
    parents = dict(Team.objects.filter(pk__in=[a.pk, b.pk]).values_list("pk", "parent_id"))
    assert not (parents[a.pk] == b.pk and parents[b.pk] == a.pk)


def _lock_waiters() -> int:
    """Backends of this database waiting on a row (or other heavyweight) lock."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()")
        return int(cur.fetchone()[0])


def test_cycle_and_array_cancel_lock_jobs_in_id_order_never_deadlock(
    world: Any, monkeypatch: Any, caplog: Any
) -> None:
    """An array cancelled while a cycle admits its members: the plan admits in its own
    order (rule O1; here the highest id first), the cancel touches the members in id
    order. Both take the members' row locks in id order, so one waits for the other
    and neither is aborted as a deadlock. The cycle is held after its first admission
    (a row lock taken) until the cancel waits on a lock."""
    import logging
    import time

    from queueing.models import JobArray
    from queueing.services.arrays import array_cancel

    now = timezone.now()
    array = JobArray.objects.create(team=world.vision, name="sweep", count=4, materialized=4,
                                    created_at=now)
    ids = [JobFactory(team=world.vision, gpu_type=world.a100, tier=world.normal,
                      gpus_per_replica=1, array=array, array_index=i,
                      name=f"sweep-{i}").pk for i in range(4)]
    real_plan = scheduler.plan_admissions
    real_transition, real_batch = scheduler.job_transition, scheduler.jobs_admit_batch

    def plan_highest_id_first(snapshot: Any) -> Any:
        import dataclasses
        plan = real_plan(snapshot)
        return dataclasses.replace(plan, admissions=tuple(
            sorted(plan.admissions, key=lambda a: -a.job_id)))

    first_admitted, go = threading.Event(), threading.Event()

    def held(write: Callable[..., Any]) -> Callable[..., Any]:
        # After the first write of an admission (one job's, or the batch's): its row
        # locks are held until the cycle's transaction ends.
        def run(*args: Any, **kwargs: Any) -> Any:
            done = write(*args, **kwargs)
            if not first_admitted.is_set():
                first_admitted.set()
                assert go.wait(timeout=30), "never released"
            return done
        return run

    monkeypatch.setattr(scheduler, "plan_admissions", plan_highest_id_first)
    monkeypatch.setattr(scheduler, "job_transition", held(real_transition))
    monkeypatch.setattr(scheduler, "jobs_admit_batch", held(real_batch))
    errors: dict[str, BaseException] = {}
    results: dict[str, Any] = {}

    def run(name: str, fn: Callable[[], Any]) -> threading.Thread:
        def target() -> None:
            try:
                results[name] = fn()
            except BaseException as exc:  # asserted below
                errors[name] = exc
            finally:
                connection.close()
        thread = threading.Thread(target=target)
        thread.start()
        return thread

    caplog.set_level(logging.WARNING, logger="queueing.services.scheduler")
    cycle = run("cycle", lambda: scheduler_cycle(now=now))
    assert first_admitted.wait(timeout=30)
    cancel = run("cancel", lambda: array_cancel(actor=None, array=array, now=now))
    deadline = time.monotonic() + 20
    while _lock_waiters() < 1:  # the cancel waits on a member's row lock
        assert time.monotonic() < deadline, "the cancel never waited on the cycle's locks"
        time.sleep(0.02)
    go.set()
    cycle.join(timeout=60)
    cancel.join(timeout=60)
    assert not errors, errors
    raised = [r.getMessage() for r in caplog.records if "raised" in r.getMessage()]
    assert not raised, raised  # the cycle's admissions were never rolled back
    assert sorted(results["cycle"].admitted) == ids
    assert sorted(results["cancel"][0]) == ids
    assert set(Job.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"CANCELLED"}
    for job_id in ids:
        assert JobEvent.objects.filter(job_id=job_id, to_status="CANCELLED").count() == 1
