"""The cycle's kept active jobs (queueing/selectors/active_jobs.py; docs/architecture.md,
"The incremental snapshot"): after its first read a cycle reads only the job rows that
changed, and what it plans on is exactly what a full read would give, whatever changed
the rows and in whatever order their transactions commit.

The kept path needs committed rows (outside a transaction) and PostgreSQL's transaction
ids: these tests commit (`transaction=True`) and run on PostgreSQL; the last ones check
the fallback (inside a transaction, every refresh reads everything).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any
from unittest import mock

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from queueing.composition import get_backend
from queueing.memo import forget_all
from queueing.models import Job, JobEvent
from queueing.policy.admission import Plan
from queueing.policy.states import JobState
from queueing.selectors import active_jobs as aj
from queueing.selectors.active_jobs import ActiveJobs, cycle_active_jobs, cycle_active_jobs_forget
from queueing.selectors.fairshare import fairshare_standings
from queueing.selectors.snapshot import build_snapshot
from queueing.services import scheduler
from queueing.services.jobs import job_cancel, job_input_build, job_submit, jobs_submit_bulk
from queueing.services.quotas import quota_set
from queueing.services.scheduler import scheduler_cycle

from .conftest import World
from .factories import JobFactory

kept = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _empty_cache() -> Any:
    cycle_active_jobs_forget()
    yield
    cycle_active_jobs_forget()


def submit(world: World, n: int = 1, **kw: Any) -> list[Job]:
    now = timezone.now()
    out = []
    for _ in range(n):
        data = job_input_build(
            actor=world.admin,
            team="vision",
            name="j",
            image="ghcr.io/acme/train:1.4",
            gpu_type=kw.get("gpu", "h100"),
            gpus=kw.get("gpus", 1),
            tier=kw.get("tier", "normal"),
        )
        out.append(job_submit(actor=world.admin, data=data, now=now)[0])
    return out


def full_read() -> ActiveJobs:
    fresh = ActiveJobs()
    fresh.refresh()
    return fresh


def assert_same_as_full_read(jobs: ActiveJobs) -> None:
    """The kept rows, with their extras and the policy's jobs built from them, equal a
    fresh read of every active job."""
    fresh = full_read()
    assert jobs.queued == fresh.queued
    assert jobs.holding == fresh.holding
    assert jobs.queued_at == fresh.queued_at
    assert jobs.preemptions == fresh.preemptions
    now = timezone.now()
    backend = get_backend()
    a = build_snapshot(backend=backend, now=now, jobs=jobs, live_workloads=set())
    b = build_snapshot(backend=backend, now=now, jobs=fresh, live_workloads=set())
    assert sorted(a.queued, key=lambda q: q.id) == sorted(b.queued, key=lambda q: q.id)
    assert sorted(a.running, key=lambda r: r.id) == sorted(b.running, key=lambda r: r.id)
    assert a.quotas == b.quotas and a.fair_share == b.fair_share
    # The standings from the kept jobs are those of the queries they replace.
    # (The same sums, maybe in another order: equal to the last few bits.)
    kept_standings = fairshare_standings(now=now, jobs=jobs)
    read_standings = fairshare_standings(now=now)
    assert kept_standings.keys() == read_standings.keys()
    for team, s in read_standings.items():
        k = kept_standings[team]
        assert (k.weight, k.active, k.parent) == (s.weight, s.active, s.parent)
        assert k.usage == pytest.approx(s.usage, rel=1e-12)
        assert k.factor == pytest.approx(s.factor, rel=1e-12)


class TestKept:
    pytestmark = kept

    def test_a_refresh_after_no_change_reads_no_row(self, world: World) -> None:
        """Once no transaction older than the rows' writes runs any more, a refresh
        reads nothing. (On a server shared with other databases their transactions
        count too: the oldest one running holds the feed back, for as long as it runs.)"""
        submit(world, 3)
        first = cycle_active_jobs().last
        assert first.full and len(first.changed) == 3
        for _ in range(240):
            again = cycle_active_jobs()
            assert not again.last.full and again.kept and len(again.queued) == 3
            if not again.last.changed:
                break
            time.sleep(0.5)
        assert again.last.changed == set()

    def test_a_submit_is_seen_and_only_it_is_read(self, world: World) -> None:
        submit(world, 2)
        cycle_active_jobs()
        (new,) = submit(world)
        jobs = cycle_active_jobs()
        assert new.pk in jobs.last.changed and not jobs.last.full
        assert new.pk in jobs.queued
        assert_same_as_full_read(jobs)

    def test_a_bulk_submit_written_with_copy_is_seen(self, world: World) -> None:
        cycle_active_jobs()
        data = job_input_build(
            actor=world.admin,
            team="vision",
            name="arr",
            image="ghcr.io/acme/train:1.4",
            gpu_type="h100",
            gpus=1,
        )
        ids = jobs_submit_bulk(actor=world.admin, data=data, count=50)
        jobs = cycle_active_jobs()
        assert set(ids) <= set(jobs.queued) and not jobs.last.full
        assert_same_as_full_read(jobs)

    def test_a_cancel_drops_the_job(self, world: World) -> None:
        a, b = submit(world, 2)
        cycle_active_jobs()
        job_cancel(actor=world.admin, job=a)
        jobs = cycle_active_jobs()
        assert a.pk not in jobs.queued and b.pk in jobs.queued and not jobs.last.full
        assert_same_as_full_read(jobs)

    def test_a_tier_change_of_the_job_is_seen(self, world: World) -> None:
        (a,) = submit(world)
        cycle_active_jobs()
        Job.objects.filter(pk=a.pk).update(tier=world.high)  # an edit, e.g. the admin's
        jobs = cycle_active_jobs()
        assert jobs.queued[a.pk].tier_id == world.high.pk
        assert_same_as_full_read(jobs)
        (q,) = build_snapshot(backend=get_backend(), now=timezone.now(), jobs=jobs).queued
        assert q.tier_rank == 200

    def test_a_tier_rank_edit_changes_no_job_row_and_still_counts(self, world: World) -> None:
        (a,) = submit(world)
        jobs = cycle_active_jobs()
        build_snapshot(backend=get_backend(), now=timezone.now(), jobs=jobs)  # memoized
        world.normal.rank = 150
        world.normal.save()
        jobs = cycle_active_jobs()
        assert not jobs.last.full and a.pk in jobs.queued
        (q,) = build_snapshot(backend=get_backend(), now=timezone.now(), jobs=jobs).queued
        assert q.tier_rank == 150

    def test_quota_and_team_weight_changes_are_read_each_cycle(self, world: World) -> None:
        submit(world)
        jobs = cycle_active_jobs()
        before = build_snapshot(backend=get_backend(), now=timezone.now(), jobs=jobs)
        quota_set(actor=None, team=world.vision, gpu_type=world.h100, nominal=3)
        world.vision.weight = 9.0
        world.vision.save()
        forget_all()  # the standings' memos (a cycle sees the change once they expire)
        cycle_active_jobs_forget()
        jobs = cycle_active_jobs()
        after = build_snapshot(backend=get_backend(), now=timezone.now(), jobs=jobs)
        assert before.quota("vision", "h100").nominal == 8
        assert after.quota("vision", "h100").nominal == 3
        assert_same_as_full_read(jobs)

    def test_a_requeued_job_comes_back_with_its_new_queue_time(self, world: World) -> None:
        (a,) = submit(world)
        scheduler_cycle(now=timezone.now())  # admitted and submitted
        a.refresh_from_db()
        assert a.state == JobState.ADMITTED
        # Its workload vanishes (deleted outside fairq): after the grace it is requeued.
        get_backend().stop(a.backend_name, now=timezone.now())
        later = timezone.now() + scheduler.VANISHED_GRACE + timedelta(seconds=1)
        with mock.patch.object(
            scheduler, "plan_admissions", side_effect=lambda snap: Plan(admissions=(), waits={})
        ):
            result = scheduler_cycle(now=later)
        assert a.pk in result.requeued
        jobs = cycle_active_jobs()
        assert not jobs.last.full
        assert jobs.queued[a.pk].attempt == 2 and jobs.queued_at[a.pk] == later
        assert_same_as_full_read(jobs)

    def test_a_running_job_is_kept_as_holding_and_leaves_when_it_ends(self, world: World) -> None:
        (a,) = submit(world)
        t0 = timezone.now()
        scheduler_cycle(now=t0)
        scheduler_cycle(now=t0 + timedelta(seconds=1))
        jobs = cycle_active_jobs()
        assert jobs.holding[a.pk].status == JobState.RUNNING
        assert_same_as_full_read(jobs)
        job_cancel(actor=world.admin, job=Job.objects.get(pk=a.pk))
        jobs = cycle_active_jobs()
        assert a.pk not in jobs.holding and not jobs.last.full

    def test_a_deleted_row_is_caught_by_the_count(self, world: World) -> None:
        a, b = submit(world, 2)
        cycle_active_jobs()
        JobEvent.objects.filter(job_id=a.pk).delete()
        Job.objects.filter(pk=a.pk).delete()
        jobs = cycle_active_jobs()
        assert jobs.last.full and jobs.last.reason.startswith("count")
        assert set(jobs.queued) == {b.pk}

    def test_a_cycle_with_a_deleted_running_job_goes_on_and_drops_it(self, world: World) -> None:
        """Reconcile's refresh does not count: the deleted job is still kept there (and
        misleads no one); the snapshot's refresh counts and drops it before the plan."""
        a, b = submit(world, 2)
        t0 = timezone.now()
        scheduler_cycle(now=t0)
        scheduler_cycle(now=t0 + timedelta(seconds=1))
        assert {a.pk, b.pk} <= set(cycle_active_jobs().holding)
        JobEvent.objects.filter(job_id=a.pk).delete()
        Job.objects.filter(pk=a.pk).delete()
        assert a.pk in cycle_active_jobs(count=False).holding
        result = scheduler_cycle(now=t0 + timedelta(seconds=2))
        assert result.job_errors == {}
        jobs = cycle_active_jobs()
        assert a.pk not in jobs.holding and b.pk in jobs.holding
        assert_same_as_full_read(jobs)

    def test_a_new_worker_process_starts_from_a_full_read(self, world: World) -> None:
        submit(world, 2)
        cycle_active_jobs()
        assert not cycle_active_jobs().last.full
        forget_all()  # what a restarted process has: nothing kept
        again = cycle_active_jobs()
        assert again.last.full and again.last.reason == "first read"

    def test_a_transaction_committing_after_a_later_one_is_still_seen(self, world: World) -> None:
        """Transaction ids are handed out in one order and commits land in another: the
        feed reads from the oldest transaction running at the last read, not the
        highest id seen."""
        a, b = submit(world, 2)
        cycle_active_jobs()
        dsn = _dsn()
        with psycopg.connect(dsn) as early, psycopg.connect(dsn, autocommit=True) as late:
            early.execute(
                "UPDATE queueing_job SET gpus_per_replica = 2 WHERE id = %s", [a.pk]
            )  # the older transaction id, not committed yet
            late.execute("UPDATE queueing_job SET gpus_per_replica = 3 WHERE id = %s", [b.pk])
            jobs = cycle_active_jobs()
            assert jobs.queued[b.pk].gpus_per_replica == 3
            assert jobs.queued[a.pk].gpus_per_replica == 1  # not visible yet
            early.commit()
        jobs = cycle_active_jobs()
        assert jobs.queued[a.pk].gpus_per_replica == 2 and not jobs.last.full
        assert_same_as_full_read(jobs)

    def test_a_concurrent_submit_during_the_cycles_is_never_lost(self, world: World) -> None:
        """Submits from another thread while cycles run: after the last, the kept rows
        are those of a full read."""
        submit(world, 3)
        stop = threading.Event()

        def submitter() -> None:
            try:
                while not stop.is_set():
                    submit(world)
            finally:
                connection.close()

        thread = threading.Thread(target=submitter)
        thread.start()
        try:
            t0 = timezone.now()
            for k in range(6):
                scheduler_cycle(now=t0 + timedelta(seconds=k))
        finally:
            stop.set()
            thread.join()
        assert_same_as_full_read(cycle_active_jobs())

    def test_reconcile_handles_an_unchanged_workload_once(self, world: World) -> None:
        (a,) = submit(world)
        t0 = timezone.now()
        scheduler_cycle(now=t0)  # admitted, submitted
        scheduler_cycle(now=t0 + timedelta(seconds=1))  # RUNNING
        with mock.patch.object(scheduler, "_running_changes", wraps=scheduler._running_changes) as changes:
            scheduler_cycle(now=t0 + timedelta(seconds=2))  # handled once more (row moved)
            scheduler_cycle(now=t0 + timedelta(seconds=3))
            scheduler_cycle(now=t0 + timedelta(seconds=4))
            assert changes.call_count == 1
            # Its row changes (whoever wrote it): handled again.
            Job.objects.filter(pk=a.pk).update(message="edited")
            scheduler_cycle(now=t0 + timedelta(seconds=5))
            assert changes.call_count == 2

    def test_reconcile_handles_a_changed_status(self, world: World) -> None:
        (a,) = submit(world)
        t0 = timezone.now()
        for k in range(3):
            scheduler_cycle(now=t0 + timedelta(seconds=k))
        backend = get_backend()
        real = backend.statuses

        def restarted(*, now: Any) -> Any:
            from dataclasses import replace

            return [replace(s, restarts=1) if s.job_id == a.pk else s for s in real(now=now)]

        with mock.patch.object(backend, "statuses", side_effect=restarted):
            scheduler_cycle(now=t0 + timedelta(seconds=5))
        assert JobEvent.objects.filter(job_id=a.pk, kind=JobEvent.Kind.POD_RESTARTED).exists()

    def test_cycles_decide_on_what_a_full_read_gives(self, world: World) -> None:
        """Cycles with churn between them (submits, cancels, admissions, jobs that end):
        after each, the kept rows are a full read's."""
        t0 = timezone.now()
        for k in range(5):
            jobs = submit(world, 3, gpus=1 + k % 3)
            job_cancel(actor=world.admin, job=jobs[0])
            scheduler_cycle(now=t0 + timedelta(seconds=k))
            assert_same_as_full_read(cycle_active_jobs())


def test_inside_a_transaction_every_refresh_reads_everything(world: World) -> None:
    submit(world, 2)
    jobs = cycle_active_jobs()
    assert jobs.last.full and not jobs.kept
    again = cycle_active_jobs()
    assert again.last.full and not again.kept and len(again.queued) == 2


def test_a_row_the_policy_cannot_take_is_reported_not_kept_silently(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    Job.objects.filter(pk=job.pk).update(status=JobState.RUNNING, placement={"x": 1})
    odd: dict[int, Exception] = {}
    build_snapshot(backend=get_backend(), now=timezone.now(), jobs=cycle_active_jobs(), odd_rows=odd)
    assert job.pk in odd


def test_every_column_the_cycle_reads_is_a_column_of_the_job() -> None:
    names = {f.attname for f in Job._meta.concrete_fields}
    assert set(aj.ACTIVE_JOB_COLUMNS) <= names


def _dsn() -> str:
    s = connection.settings_dict
    return f"host={s['HOST'] or '127.0.0.1'} port={s['PORT'] or 5432} dbname={s['NAME']} user={s['USER']}" + (
        f" password={s['PASSWORD']}" if s.get("PASSWORD") else ""
    )
