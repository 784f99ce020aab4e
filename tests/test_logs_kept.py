"""Logs that outlive the pod: when an attempt ends (success, failure,
preemption, cancel) the worker keeps the tail of each replica's log in the "fairq-logs"
storage; the API, the job page and `fairq logs` show it by attempt and replica, with how
the attempt ended. On the simulated cluster, driven with explicit time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

import pytest
from django.test import Client
from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import Job, JobLog
from queueing.services.logs import (
    attempt_logs_keep,
    job_log_read,
    job_logs_archive,
    log_storage,
    split_replicas,
)
from queueing.services.scheduler import scheduler_cycle

from .conftest import World
from .factories import JobFactory
from .test_cycle import submit

pytestmark = pytest.mark.django_db


def _run(world: World, *, seconds: str = "60", exit_code: str | None = None,
         **body: Any) -> tuple[int, datetime]:
    env = {"FAIRQ_SIM_SECONDS": seconds}
    if exit_code is not None:
        env["FAIRQ_SIM_EXIT_CODE"] = exit_code
    t0 = timezone.now() - timedelta(minutes=10)
    job_id = submit(world, env=env, **body)
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert Job.objects.get(pk=job_id).status == "RUNNING"
    return job_id, t0


def _backend_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kubernetes deleted the pods: the cluster has nothing to say any more."""
    monkeypatch.setattr(get_backend(), "logs", lambda name, tail=100: "")


def _page(world: World, url: str) -> str:
    c = Client()
    c.force_login(world.member)
    r = c.get(url)
    assert r.status_code == 200
    return str(r.content.decode())


def _kept(job_id: int, attempt: int, replica: int = 0) -> str:
    row = JobLog.objects.get(job_id=job_id, attempt=attempt, replica=replica)
    assert row.final and row.stored and row.text == ""
    return bytes(log_storage().open(row.stored).read()).decode()


def test_logs_are_kept_after_success_and_read_after_the_pod_is_gone(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_id, t0 = _run(world)
    scheduler_cycle(now=t0 + timedelta(seconds=62))
    assert Job.objects.get(pk=job_id).status == "SUCCEEDED"
    live = get_backend().logs(f"fq-{job_id}-1", tail=1000)
    assert "exited with code 0" in live
    result = job_logs_archive(backend=get_backend(), now=t0 + timedelta(seconds=63))
    assert result.kept == [(job_id, 1)]
    assert _kept(job_id, 1) == live

    _backend_gone(monkeypatch)
    r = world.client(world.member).get(f"/api/v1/jobs/{job_id}/logs/")
    body = r.json()
    assert r.status_code == 200 and body["source"] == "archived"
    assert body["lines"] == live.splitlines() and body["exit"] == "SUCCEEDED: exit code 0"
    assert body["attempts"] == [{"attempt": 1, "replicas": [0], "final": True}]
    assert not body["empty"] and body["note"] == ""


def test_a_finished_workload_stopped_before_the_archive_keeps_every_replicas_exit_line(
    world: World,
) -> None:
    """The cycle after a job finished forgets its workload (`stop`) before the archive
    task ran: the simulated cluster keeps the stopped workload's logs readable, as a
    Kubernetes Job's pods stay until its TTL, so the kept tail of each replica still ends
    with its exit line (it kept the last live copy, without it, before)."""
    job_id, t0 = _run(world, replicas=2, gpus=4)
    scheduler_cycle(now=t0 + timedelta(seconds=62))
    scheduler_cycle(now=t0 + timedelta(seconds=63))  # the workload is forgotten
    assert f"fq-{job_id}-1" not in {s.name for s in get_backend().statuses(
        now=t0 + timedelta(seconds=64))}
    job_logs_archive(backend=get_backend(), now=t0 + timedelta(seconds=64))
    for replica in (0, 1):
        kept = _kept(job_id, 1, replica).splitlines()
        assert kept[0].endswith(f"started fq-{job_id}-1 replica {replica} of 2 on "
                                f"{Job.objects.get(pk=job_id).placement[replica]}")
        assert kept[-1].endswith("exited with code 0")


def test_logs_are_kept_after_a_failure_with_the_exit_code(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_id, t0 = _run(world, seconds="30", exit_code="3")
    scheduler_cycle(now=t0 + timedelta(seconds=40))
    job = Job.objects.get(pk=job_id)
    assert job.status == "FAILED"
    job_logs_archive(backend=get_backend(), now=t0 + timedelta(seconds=41))
    assert "exited with code 3" in _kept(job_id, 1)
    _backend_gone(monkeypatch)
    view = job_log_read(job=job)
    assert view.source == "archived" and "exit code 3" in view.exit
    assert view.lines[-1].endswith("exited with code 3")


# R9 off: submitted at the wall clock, cycles at chosen instants; the preemption
# it needs does not wait on how long the submits took (conftest no_r9).
@pytest.mark.usefixtures("no_r9")
def test_a_preempted_attempt_keeps_its_logs_before_its_workload_is_stopped(
    world: World,
) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    ids = [submit(world, name=f"fill-{i}", tier="low", gpus=8,
                  env={"FAIRQ_SIM_SECONDS": "5000"}) for i in range(2)]
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    (victim,) = scheduler_cycle(now=t0 + timedelta(seconds=100)).preempted
    assert victim in ids
    job = Job.objects.get(pk=victim)
    assert job.status == "QUEUED" and job.attempt == 2
    assert f"fq-{victim}-1" not in {s.name for s in get_backend().statuses(now=t0)}
    assert f"started fq-{victim}-1" in _kept(victim, 1)

    view = job_log_read(job=job, attempt=1)
    assert view.source == "archived" and view.exit.startswith("PREEMPTED")
    # The new attempt has not run: nothing yet, and it says so.
    now = job_log_read(job=job)
    assert now.attempt == 2 and now.lines == [] and now.note
    assert now.attempts == [{"attempt": 1, "replicas": [0], "final": True}]


def test_a_cancelled_job_keeps_its_logs(
    world: World, django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    job_id, _ = _run(world, seconds="600")
    name = f"fq-{job_id}-1"
    with django_capture_on_commit_callbacks(execute=True):
        r = world.client(world.member).post(f"/api/v1/jobs/{job_id}/cancel/")
    assert r.status_code == 200, r.json()
    assert name not in {s.name for s in get_backend().statuses(now=timezone.now())}
    assert f"started {name}" in _kept(job_id, 1)
    body = world.client(world.member).get(f"/api/v1/jobs/{job_id}/logs/").json()
    assert body["source"] == "archived" and body["exit"].startswith("CANCELLED")


def test_when_the_read_fails_the_last_live_copy_is_kept(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_id, t0 = _run(world, seconds="600")
    job_logs_archive(backend=get_backend(), now=t0 + timedelta(seconds=2))
    live = JobLog.objects.get(job_id=job_id, attempt=1).text
    assert live

    def down(*args: Any, **kwargs: Any) -> str:
        raise ConnectionError("the cluster is down")

    monkeypatch.setattr(get_backend(), "logs", down)
    assert attempt_logs_keep(backend=get_backend(), name=f"fq-{job_id}-1", now=t0)
    assert _kept(job_id, 1) == live


def test_an_empty_log_says_the_pod_wrote_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_id, t0 = _run(world, seconds="30")
    scheduler_cycle(now=t0 + timedelta(seconds=40))
    _backend_gone(monkeypatch)
    job_logs_archive(backend=get_backend(), now=t0 + timedelta(seconds=41))
    assert _kept(job_id, 1) == ""
    body = world.client(world.member).get(f"/api/v1/jobs/{job_id}/logs/").json()
    assert body["lines"] == [] and body["empty"] and body["note"] == "the pod wrote nothing"
    assert "The pod wrote nothing." in _page(world, f"/jobs/{job_id}/")


def test_the_kept_log_is_bounded_to_the_configured_bytes(
    world: World, monkeypatch: pytest.MonkeyPatch, settings: Any,
) -> None:
    settings.FAIRQ_LOG_ARCHIVE_BYTES = 1000
    job_id, t0 = _run(world, seconds="600")
    big = "\n".join(f"step {i} loss 0.{i:04d}" for i in range(5000))
    monkeypatch.setattr(get_backend(), "logs", lambda name, tail=100: big)
    attempt_logs_keep(backend=get_backend(), name=f"fq-{job_id}-1", now=t0)
    kept = _kept(job_id, 1)
    assert 0 < len(kept.encode()) <= 1000 and kept.endswith("step 4999 loss 0.4999")
    assert JobLog.objects.get(job_id=job_id, attempt=1).size == len(kept.encode())


def test_each_replica_is_kept_and_chosen_by_number(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    job_id, t0 = _run(world, seconds="600", gpus=8, replicas=2)
    text = "==> fq-x-1-0 <==\nrank 0 up\nrank 0 done\n==> fq-x-1-1 <==\nrank 1 up"
    monkeypatch.setattr(get_backend(), "logs", lambda name, tail=100: text)
    attempt_logs_keep(backend=get_backend(), name=f"fq-{job_id}-1", now=t0)
    assert _kept(job_id, 1, 0) == "rank 0 up\nrank 0 done"
    assert _kept(job_id, 1, 1) == "rank 1 up"
    c = world.client(world.member)
    body = c.get(f"/api/v1/jobs/{job_id}/logs/?replica=1").json()
    assert body["replica"] == 1 and body["lines"] == ["rank 1 up"] and body["replicas"] == 2
    assert body["attempts"] == [{"attempt": 1, "replicas": [0, 1], "final": True}]
    assert c.get(f"/api/v1/jobs/{job_id}/logs/?replica=0&tail=1").json()["lines"] == [
        "rank 0 done"]
    html = _page(world, f"/jobs/{job_id}/?replica=1")
    assert "rank 1 up" in html and "replica 1" in html


def test_the_backend_answer_is_split_per_replica() -> None:
    assert split_replicas("") == {0: ""}
    assert split_replicas("a\nb") == {0: "a\nb"}
    assert split_replicas("==> p0 <==\na\n==> p1 <==\n") == {0: "a", 1: ""}


@pytest.mark.parametrize(("query", "field"), [
    ("attempt=0", "attempt"), ("attempt=2", "attempt"), ("attempt=x", "attempt"),
    ("replica=-1", "replica"), ("replica=1", "replica"), ("replica=x", "replica"),
    ("tail=x", "tail"),
])
def test_bad_log_parameters_are_a_400_naming_the_field(
    world: World, query: str, field: str,
) -> None:
    job_id = submit(world)
    r = world.client(world.member).get(f"/api/v1/jobs/{job_id}/logs/?{query}")
    assert r.status_code == 400, r.json()
    assert field in r.json()["error"]["fields"]


def test_another_teams_job_logs_are_not_found(world: World) -> None:
    job_id, _ = _run(world, seconds="600")
    for url in (f"/api/v1/jobs/{job_id}/logs/", f"/api/v1/jobs/{job_id}/logs/?attempt=1"):
        assert world.client(world.outsider).get(url).status_code == 404


def test_a_running_job_shows_live_lines(world: World) -> None:
    job_id, t0 = _run(world, seconds="600")
    job_logs_archive(backend=get_backend(), now=t0 + timedelta(seconds=2))
    body = world.client(world.member).get(f"/api/v1/jobs/{job_id}/logs/").json()
    assert body["source"] == "live" and body["exit"] == "" and body["lines"]
    assert body["attempts"] == [{"attempt": 1, "replicas": [0], "final": False}]


# R9 off: submitted at the wall clock, cycles at chosen instants; the preemption
# it needs does not wait on how long the submits took (conftest no_r9).
@pytest.mark.usefixtures("no_r9")
def test_the_job_page_shows_each_attempt_and_refuses_a_bad_one(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    for i in range(2):
        submit(world, name=f"fill-{i}", tier="low", gpus=8, env={"FAIRQ_SIM_SECONDS": "5000"})
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    (victim,) = scheduler_cycle(now=t0 + timedelta(seconds=100)).preempted
    html = _page(world, f"/jobs/{victim}/?attempt=1")
    assert f"started fq-{victim}-1" in html and "kept after it ended" in html
    assert "Exit:</strong> PREEMPTED" in html
    assert _page(world, f"/jobs/{victim}/").count('href="?attempt=1&amp;replica=0"') == 1
    assert "This job has attempts 1 to 2." in _page(world, f"/jobs/{victim}/?attempt=7")
    assert "whole numbers" in _page(world, f"/jobs/{victim}/?replica=x")


def test_a_job_cancelled_before_it_ran_has_no_log_rather_than_an_empty_one(
    world: World, django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    # Waits: more than the h100 nodes hold (queued when there were more: submit refuses
    # such a job now, rule E6).
    job_id = JobFactory(team=world.vision, submitter=world.member, gpu_type=world.h100,
                        tier=world.normal, gpus_per_replica=8, replicas=4).pk
    scheduler_cycle(now=timezone.now())
    assert Job.objects.get(pk=job_id).status == "QUEUED"
    with django_capture_on_commit_callbacks(execute=True):
        assert world.client(world.member).post(
            f"/api/v1/jobs/{job_id}/cancel/").status_code == 200
    assert not JobLog.objects.filter(job_id=job_id).exists()
    body = world.client(world.member).get(f"/api/v1/jobs/{job_id}/logs/").json()
    assert body["lines"] == [] and not body["empty"]
    assert body["note"] == "no logs: the job never started"


# --- the kept files go with their rows; retention -------------------------------------------

@pytest.fixture
def log_dir(settings: Any, tmp_path: Any) -> Any:
    """The "fairq-logs" storage in a directory of this test (FileSystemStorage), so the
    files on disk can be looked at."""
    settings.STORAGES = {**settings.STORAGES, "fairq-logs": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path)}}}
    return tmp_path


def _files(root: Any) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _kept_attempt(world: World, monkeypatch: pytest.MonkeyPatch, *, replicas: int = 1,
                  gpus: int = 1, finish: bool = False) -> int:
    job_id, t0 = _run(world, seconds="30" if finish else "600", gpus=gpus, replicas=replicas)
    if finish:
        scheduler_cycle(now=t0 + timedelta(seconds=40))
        assert Job.objects.get(pk=job_id).status == "SUCCEEDED"
    text = "\n".join(f"==> fq-x-1-{i} <==\nrank {i} up" for i in range(replicas))
    monkeypatch.setattr(get_backend(), "logs", lambda name, tail=100: text)
    assert attempt_logs_keep(backend=get_backend(), name=f"fq-{job_id}-1", now=t0)
    return job_id


def test_deleting_a_job_deletes_its_kept_log_files_once_committed(
    world: World, monkeypatch: pytest.MonkeyPatch, log_dir: Any,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    job_id = _kept_attempt(world, monkeypatch, replicas=2)
    other = _kept_attempt(world, monkeypatch)
    assert _files(log_dir) == [f"jobs/{job_id}/attempt-1/replica-0.log",
                               f"jobs/{job_id}/attempt-1/replica-1.log",
                               f"jobs/{other}/attempt-1/replica-0.log"]
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        Job.objects.filter(pk=job_id).delete()  # the cascade deletes its JobLog rows
    assert len(_files(log_dir)) == 3  # not before the commit
    for callback in callbacks:
        callback()
    assert _files(log_dir) == [f"jobs/{other}/attempt-1/replica-0.log"]
    assert not JobLog.objects.filter(job_id=job_id).exists()


def test_a_storage_that_fails_to_delete_is_logged_and_the_delete_goes_on(
    world: World, monkeypatch: pytest.MonkeyPatch, log_dir: Any,
    django_capture_on_commit_callbacks: Callable[..., Any], caplog: Any,
) -> None:
    job_id = _kept_attempt(world, monkeypatch)

    def broken(self: Any, name: str) -> None:
        raise OSError("the bucket is read-only")

    monkeypatch.setattr(type(log_storage()), "delete", broken)
    with django_capture_on_commit_callbacks(execute=True):
        JobLog.objects.filter(job_id=job_id).delete()
    assert not JobLog.objects.filter(job_id=job_id).exists()
    assert f"deleting the kept log jobs/{job_id}/attempt-1/replica-0.log" in caplog.text
    assert "the bucket is read-only" in caplog.text


def test_kept_logs_older_than_the_retention_are_pruned_with_their_files_and_an_event(
    world: World, monkeypatch: pytest.MonkeyPatch, log_dir: Any, settings: Any,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    from queueing.models import JobEvent
    from queueing.services.logs import job_logs_prune

    settings.FAIRQ_LOG_RETENTION_DAYS = 30
    now = timezone.now()
    old = _kept_attempt(world, monkeypatch, replicas=2, finish=True)
    young = _kept_attempt(world, monkeypatch)
    live, _ = _run(world, seconds="600")
    JobLog.objects.create(job_id=live, attempt=1, text="still running",
                          fetched_at=now - timedelta(days=90))  # a live copy: never pruned
    JobLog.objects.filter(job_id=old).update(fetched_at=now - timedelta(days=30, seconds=1))
    JobLog.objects.filter(job_id=young).update(fetched_at=now - timedelta(days=29))
    size = sum(JobLog.objects.filter(job_id=old).values_list("size", flat=True))

    with django_capture_on_commit_callbacks(execute=True):
        result = job_logs_prune(now=now)
    assert (result.rows, result.attempts, result.bytes) == (2, [(old, 1)], size)
    assert _files(log_dir) == [f"jobs/{young}/attempt-1/replica-0.log"]
    assert set(JobLog.objects.values_list("job_id", flat=True)) == {young, live}
    [event] = JobEvent.objects.filter(kind=JobEvent.Kind.LOGS_PRUNED)
    assert (event.job_id, event.attempt, event.actor_label) == (old, 1, "retention")
    assert event.data == {"replicas": [0, 1], "bytes": size, "retention_days": 30}
    assert "kept more than 30 days" in event.reason
    # The API says so where the logs were.
    body = world.client(world.member).get(f"/api/v1/jobs/{old}/logs/?attempt=1").json()
    assert body["source"] == "none" and body["lines"] == []
    assert body["note"] == "the kept logs of this attempt were deleted after 30 days"
    # Nothing more to prune: no second event.
    assert job_logs_prune(now=now).rows == 0
    assert JobEvent.objects.filter(kind=JobEvent.Kind.LOGS_PRUNED).count() == 1


def test_a_retention_of_zero_days_keeps_logs_for_ever(
    world: World, monkeypatch: pytest.MonkeyPatch, log_dir: Any, settings: Any,
) -> None:
    from queueing.services.logs import job_logs_prune

    settings.FAIRQ_LOG_RETENTION_DAYS = 0
    job_id = _kept_attempt(world, monkeypatch)
    JobLog.objects.filter(job_id=job_id).update(fetched_at=timezone.now() - timedelta(days=3650))
    assert job_logs_prune(now=timezone.now()).rows == 0
    assert _files(log_dir) == [f"jobs/{job_id}/attempt-1/replica-0.log"]


def test_pruning_is_a_beat_task_run_hourly(settings: Any) -> None:
    from config.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["job-logs-prune"]
    assert entry["task"] == "queueing.tasks.job_logs_prune_task"
    assert entry["schedule"] == timedelta(hours=1)
    app.loader.import_default_modules()
    assert entry["task"] in app.tasks


# --- preemption victims' logs are read concurrently ------------------------------------------

class _SlowLogs:
    """A cluster whose log reads take a while: each waits on `barrier` (all of `parties`
    reads in flight at once, or it breaks after `timeout` s) or sleeps `seconds`."""

    def __init__(self, *, parties: int = 0, seconds: float = 0.0, timeout: float = 5.0) -> None:
        import threading

        self.barrier = threading.Barrier(parties, timeout=timeout) if parties else None
        self.seconds = seconds
        self.lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.stopped: list[str] = []

    def logs(self, name: str, *, tail: int = 100) -> str:
        import time

        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            if self.barrier is not None:
                self.barrier.wait()
            time.sleep(self.seconds)
            return f"last words of {name}"
        finally:
            with self.lock:
                self.in_flight -= 1

    def stop(self, name: str, *, now: datetime) -> None:
        self.stopped.append(name)


def _victims(n: int) -> list[str]:
    from queueing.policy.states import JobState

    from .factories import JobFactory

    now = timezone.now()
    return [f"fq-{JobFactory(status=JobState.RUNNING, started_at=now).pk}-1" for _ in range(n)]


def test_the_victims_logs_are_read_concurrently_then_each_kept_and_stopped(
    settings: Any,
) -> None:
    """Four reads that each wait for the other three: read one by one, the first would
    wait 5 s and break the barrier (and every victim would keep an empty log)."""
    import time

    from queueing.services.logs import workloads_stop_keeping_logs

    settings.FAIRQ_LOG_READ_CONCURRENCY = 4
    names = _victims(4)
    cluster = _SlowLogs(parties=4)
    started = time.monotonic()
    failed = workloads_stop_keeping_logs(backend=cast(Any, cluster), names=names,
                                         now=timezone.now())
    assert failed == {} and time.monotonic() - started < 4
    assert cluster.peak == 4 and cluster.stopped == names  # stopped in order, after reading
    for name in names:
        job_id = int(name.split("-")[1])
        assert _kept(job_id, 1) == f"last words of {name}"


def test_concurrent_log_reads_are_bounded_by_the_setting(settings: Any) -> None:
    from queueing.services.logs import workloads_stop_keeping_logs

    settings.FAIRQ_LOG_READ_CONCURRENCY = 2
    names = _victims(5)
    cluster = _SlowLogs(seconds=0.05)
    assert workloads_stop_keeping_logs(backend=cast(Any, cluster), names=names,
                                       now=timezone.now()) == {}
    assert cluster.peak == 2 and cluster.stopped == names


def test_a_victim_whose_stop_fails_does_not_stop_the_others(settings: Any) -> None:
    from queueing.services.logs import workloads_stop_keeping_logs

    names = _victims(3)
    cluster = _SlowLogs()
    real_stop = cluster.stop

    def stop(name: str, *, now: datetime) -> None:
        if name == names[1]:
            raise ConnectionError("the API server hung up")
        real_stop(name, now=now)

    cluster.stop = stop  # type: ignore[method-assign]
    failed = workloads_stop_keeping_logs(backend=cast(Any, cluster), names=names,
                                         now=timezone.now())
    assert list(failed) == [names[1]] and cluster.stopped == [names[0], names[2]]
    assert _kept(int(names[1].split("-")[1]), 1) == f"last words of {names[1]}"


def test_the_archive_stops_at_its_budget_and_the_next_run_goes_on_from_the_oldest_copy(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    settings.FAIRQ_LOG_READ_CONCURRENCY = 1  # chunks of 2 reads
    jobs = [_run(world, seconds="600", gpus=1)[0] for _ in range(6)]
    now = timezone.now()
    backend = get_backend()
    real = backend.logs
    read: list[str] = []

    def slow_logs(name: str, tail: int = 100) -> str:
        time.sleep(0.1)  # a kubelet under load
        read.append(name)
        return real(name, tail=tail)

    monkeypatch.setattr(backend, "logs", slow_logs)
    started = time.perf_counter()
    first = job_logs_archive(backend=backend, now=now, budget_seconds=0.15)
    # Chunks of two reads (0.2 s): none starts past 0.15 s, so the run ends after the
    # first (or, on a slow machine, the second) and leaves the rest.
    assert time.perf_counter() - started < 0.15 + 0.2 + 1.0
    assert 2 <= len(first.refreshed) <= 4 and first.left == 6 - len(first.refreshed), first
    second = job_logs_archive(backend=backend, now=now + timedelta(seconds=1),
                              budget_seconds=0.15)
    # Those never copied go first; then the oldest copies.
    never = sorted(set(jobs) - set(first.refreshed))
    assert second.refreshed[:2] == never[:2]
    for i in range(2, 6):  # resumable: each run goes on where the last stopped
        if JobLog.objects.filter(job_id__in=jobs).count() == 6:
            break
        job_logs_archive(backend=backend, now=now + timedelta(seconds=i), budget_seconds=0.15)
    assert JobLog.objects.filter(job_id__in=jobs).count() == 6


def test_an_unanswered_read_is_tried_again_then_what_fairq_has_is_kept(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queueing.backends.base import logs_unanswered_note
    from queueing.services.logs import LogsUnread, workload_stop_keeping_logs

    settings.FAIRQ_LOG_KEEP_RETRY_SECONDS = 30
    job_id, t0 = _run(world)
    job_logs_archive(backend=get_backend(), now=t0 + timedelta(seconds=20))  # a live copy
    live = JobLog.objects.get(job_id=job_id, attempt=1).text
    name = f"fq-{job_id}-1"
    monkeypatch.setattr(get_backend(), "logs", lambda n, tail=100: logs_unanswered_note(
        f"pod {n}-x", "(500) timeout"))
    stopped: list[str] = []
    monkeypatch.setattr(get_backend(), "stop", lambda n, now: stopped.append(n))
    for seconds in (30, 45, 59):
        with pytest.raises(LogsUnread):
            workload_stop_keeping_logs(backend=get_backend(), name=name,
                                       now=t0 + timedelta(seconds=seconds))
    assert stopped == [] and not JobLog.objects.filter(job_id=job_id, final=True).exists()
    workload_stop_keeping_logs(backend=get_backend(), name=name,
                               now=t0 + timedelta(seconds=60))
    assert stopped == [name] and _kept(job_id, 1) == live


@pytest.mark.parametrize("ran", [False, True], ids=["never_ran", "ran"])
def test_an_earlier_attempt_preempted_before_it_ran_keeps_no_empty_log(
        world: World, monkeypatch: pytest.MonkeyPatch, ran: bool) -> None:
    """A victim's workload is stopped after the commit that requeued its job, so its job
    is on attempt 2 when attempt 1's log is kept. Attempt 1 preempted while ADMITTED (no
    pod yet: the cluster answers nothing) has no log to keep, not an empty file; one that
    ran (its RUNNING event) and wrote nothing keeps its empty log, which says so."""
    from queueing.models import JobEvent

    job = JobFactory(team=world.vision, submitter=world.member, gpu_type=world.h100,
                     tier=world.normal, status="QUEUED", attempt=2)
    if ran:
        JobEvent.objects.create(job=job, at=timezone.now(), kind="transition",
                                from_status="ADMITTED", to_status="RUNNING", attempt=1)
    _backend_gone(monkeypatch)
    kept = attempt_logs_keep(backend=get_backend(), name=f"fq-{job.pk}-1",
                             now=timezone.now())
    assert kept is ran
    assert JobLog.objects.filter(job_id=job.pk, attempt=1).exists() is ran


def test_an_archive_run_stopped_at_its_budget_queues_the_next_at_once(
    world: World, settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a one-process worker a run may hold a cycle back by one budget at most; the
    rest follows at once, behind the cycles queued meanwhile, not at the next beat."""
    import time

    from queueing import tasks

    settings.FAIRQ_LOG_READ_CONCURRENCY = 1  # chunks of 2 reads
    settings.FAIRQ_LOG_ARCHIVE_BUDGET_SECONDS = 0.15
    jobs = [_run(world, seconds="600", gpus=1)[0] for _ in range(6)]
    backend = get_backend()
    real = backend.logs

    def slow_logs(name: str, tail: int = 100) -> str:
        time.sleep(0.1)
        return real(name, tail=tail)

    monkeypatch.setattr(backend, "logs", slow_logs)
    queued: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.job_logs_archive_task, "apply_async",
                        lambda *a, **kw: queued.append(a))
    refreshed = tasks.job_logs_archive_task()
    assert 2 <= refreshed < 6 and len(queued) == 1
    while len(queued) < 10 and JobLog.objects.filter(job_id__in=jobs).count() < 6:
        tasks.job_logs_archive_task()
    assert JobLog.objects.filter(job_id__in=jobs).count() == 6
    kicks = len(queued)
    tasks.job_logs_archive_task()  # nothing left: no next run queued
    assert len(queued) == kicks
