"""The Kubernetes backend's workload bookkeeping (backends/k8s_tracker.py), with no
cluster and no Django: where workloads live, stop and its acknowledgements, finished
Jobs kept for their logs, and tombstones of Jobs deleted outside fairq."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from queueing.backends.base import Phase, WorkloadStatus
from queueing.backends.k8s_tracker import WorkloadTracker

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def status(name: str = "fq-1-1", *, started: datetime | None = None,
           phase: Phase = Phase.RUNNING, stopping: bool = False) -> WorkloadStatus:
    return WorkloadStatus(name=name, job_id=1, attempt=1, phase=phase, started_at=started,
                          stopping=stopping)


def test_it_remembers_where_a_workload_lives_until_its_job_is_deleted() -> None:
    t = WorkloadTracker()
    assert t.namespace_of("fq-1-1") is None
    t.placed("fq-1-1", "fairq-vision")
    assert t.namespace_of("fq-1-1") == "fairq-vision"
    t.deleted("fq-1-1")
    assert t.namespace_of("fq-1-1") is None


def test_a_stopped_workload_is_reported_stopping_until_the_delete_fails() -> None:
    t = WorkloadTracker()
    t.stop_asked("fq-1-1")
    assert t.seen(status()).stopping is True  # asked; the watch lags
    assert t.seen(status("fq-2-1")).stopping is False
    t.stop_failed("fq-1-1")
    assert t.seen(status()).stopping is False  # not asked after all: the cycle asks again


def test_a_deletion_fairq_asked_for_is_acknowledged_and_forgotten() -> None:
    t = WorkloadTracker()
    t.seen(status(started=T0))
    t.stop_asked("fq-1-1")
    assert t.deleted("fq-1-1") == (True, T0)
    assert t.deleted("fq-1-1") == (False, None)  # everything about it forgotten


def test_a_hidden_finished_job_is_acknowledged_when_deleted_and_can_be_unhidden() -> None:
    t = WorkloadTracker()
    t.hide("fq-1-1", T0)
    t.hide("fq-2-1", T0)
    assert t.hidden() == {"fq-1-1": T0, "fq-2-1": T0}
    t.unhide("fq-2-1")  # its Job runs pods again
    assert t.deleted("fq-1-1") == (True, None)
    assert t.deleted("fq-2-1") == (False, None)
    assert t.hidden() == {}


def test_a_deletion_outside_fairq_returns_when_it_started() -> None:
    t = WorkloadTracker()
    t.seen(status(started=T0))
    t.seen(status(started=T0 + timedelta(seconds=9)))  # the first start is kept
    assert t.deleted("fq-1-1") == (False, T0)


def test_tombstones_are_reported_until_they_expire_and_never_as_stopping() -> None:
    t = WorkloadTracker(tombstone_seconds=600)
    t.bury(status(phase=Phase.FAILED, stopping=True), at=100.0)
    [tomb] = t.tombstones(at=200.0, listed=set())
    assert (tomb.name, tomb.phase, tomb.stopping) == ("fq-1-1", Phase.FAILED, False)
    assert t.tombstones(at=200.0, listed={"fq-1-1"}) == []  # the cache lists it anyway
    assert t.tombstones(at=701.0, listed=set()) == []  # expired ...
    assert t.tombstones(at=200.0, listed=set()) == []  # ... and dropped


def test_a_stop_answers_a_tombstone() -> None:
    t = WorkloadTracker()
    t.bury(status(phase=Phase.FAILED), at=0.0)
    t.stop_requested("fq-1-1")
    assert t.tombstones(at=1.0, listed=set()) == []


def test_it_keeps_count_under_concurrent_threads() -> None:
    t = WorkloadTracker()

    def work(i: int) -> None:
        for n in range(200):
            name = f"fq-{i}-{n}"
            t.placed(name, "ns")
            t.stop_asked(name)
            t.seen(status(name, started=T0))
            t.deleted(name)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.hidden() == {} and t.namespace_of("fq-0-0") is None
    assert all(not t.seen(status(f"fq-{i}-199")).stopping for i in range(8))


def test_a_replica_seen_is_remembered_until_its_workload_is_deleted() -> None:
    t = WorkloadTracker()
    assert not t.replica_was_seen("fq-1-1", 1)
    t.replica_seen("fq-1-1", 1)
    assert t.replica_was_seen("fq-1-1", 1) and not t.replica_was_seen("fq-1-1", 2)
    assert not t.replica_was_seen("fq-2-1", 1)
    t.deleted("fq-1-1")
    assert not t.replica_was_seen("fq-1-1", 1)


def test_an_abandoned_job_is_remembered_for_five_minutes() -> None:
    t = WorkloadTracker()
    t.abandon("uid-a", at=0.0)
    assert t.abandoned("uid-a") and not t.abandoned("uid-b")
    t.abandon("uid-b", at=301.0)  # forgets what is older than 300 s
    assert not t.abandoned("uid-a") and t.abandoned("uid-b")
