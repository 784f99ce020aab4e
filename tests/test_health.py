"""Probes (docs/deployment.md, "Health"): /healthz (liveness, no dependencies), /readyz
(PostgreSQL and Redis), the worker's and beat's heartbeats written by real scheduler
ticks and read by `manage.py heartbeat_check`, and `manage.py wait_for_migrations`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connections
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client

from queueing.health import heartbeat_age, heartbeat_path, heartbeat_touch, pending_migrations


@pytest.fixture(autouse=True)
def _heartbeat_dir(settings: Any, tmp_path: Path) -> Path:
    settings.FAIRQ_HEARTBEAT_DIR = str(tmp_path)
    settings.FAIRQ_CYCLE_INTERVAL_SECONDS = 3.0
    settings.FAIRQ_SCHEDULER_STALE_CYCLES = 20.0  # 60 s
    return tmp_path


def test_healthz_answers_without_touching_the_database(
        db: None, django_assert_num_queries: Any) -> None:
    with django_assert_num_queries(0):
        r = Client().get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_readyz_is_ready_when_postgres_and_redis_answer(db: None) -> None:
    r = Client().get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "checks": {"database": "ok", "cache": "ok"}}


def test_readyz_answers_503_naming_an_unreachable_cache(db: None, settings: Any) -> None:
    # A real Redis client pointed at a port nothing listens on (setting CACHES resets
    # Django's cache handlers).
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": "redis://127.0.0.1:1/0",
                                   "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1}}}
    r = Client().get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok"
    assert "ConnectionError" in body["checks"]["cache"]


def test_readyz_answers_503_naming_a_failing_database(
        db: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseError("connection refused")

    with monkeypatch.context() as m:
        m.setattr(connections["default"], "cursor", refuse)
        r = Client().get("/readyz")
    assert r.status_code == 503
    assert r.json()["checks"]["database"] == "DatabaseError: connection refused"


def test_readyz_refuses_other_methods(db: None) -> None:
    assert Client().post("/readyz").status_code == 405


def test_a_scheduler_tick_run_by_the_worker_touches_the_worker_heartbeat(db: None) -> None:
    from queueing.tasks import scheduler_cycle_task

    assert heartbeat_age("worker") is None
    scheduler_cycle_task.apply()  # runs the task as a worker does, with its signals
    age = heartbeat_age("worker")
    assert age is not None and age < 5
    assert heartbeat_age("beat") is None


def test_other_tasks_do_not_touch_the_worker_heartbeat(db: None) -> None:
    from queueing.tasks import sync_cluster_task

    sync_cluster_task.apply()
    assert heartbeat_age("worker") is None


def test_a_tick_sent_to_the_broker_touches_the_beat_heartbeat(db: None) -> None:
    from config.celery import app
    from queueing.tasks import scheduler_cycle_task

    app.conf.task_always_eager = False  # really publish, to the in-memory broker
    try:
        scheduler_cycle_task.apply_async()
    finally:
        app.conf.task_always_eager = True
    age = heartbeat_age("beat")
    assert age is not None and age < 5


def test_heartbeat_check_passes_on_a_fresh_heartbeat(capsys: pytest.CaptureFixture[str]) -> None:
    heartbeat_touch("worker")
    call_command("heartbeat_check", "worker")
    assert "worker: last heartbeat" in capsys.readouterr().out


def test_heartbeat_check_fails_when_there_is_none() -> None:
    with pytest.raises(CommandError, match="beat: no heartbeat yet"):
        call_command("heartbeat_check", "beat")


def test_heartbeat_check_fails_once_older_than_the_stale_limit() -> None:
    now = time.time()
    heartbeat_touch("worker", now=now - 59)
    call_command("heartbeat_check", "worker")
    heartbeat_touch("worker", now=now - 61)
    with pytest.raises(CommandError, match=r"worker: last heartbeat 6\ds ago \(limit 60s\)"):
        call_command("heartbeat_check", "worker")
    assert heartbeat_path("worker").exists()
    assert os.path.getmtime(heartbeat_path("worker")) == pytest.approx(now - 61, abs=1)


def test_wait_for_migrations_returns_at_once_when_all_are_applied(
        db: None, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    call_command("wait_for_migrations", "--timeout", "0")
    assert time.monotonic() - started < 5
    assert capsys.readouterr().out.strip() == "migrations: all applied"


def test_wait_for_migrations_times_out_naming_the_pending_migration(db: None) -> None:
    # Un-record the latest migration of `queueing` (rolled back with the test): to the
    # loader it is pending, exactly as after deploying code with a new migration.
    recorder = MigrationRecorder(connections["default"])
    last = recorder.migration_qs.filter(app="queueing").order_by("-applied", "-id").first()
    assert last is not None
    last.delete()
    assert pending_migrations() == [f"queueing.{last.name}"]
    started = time.monotonic()
    with pytest.raises(CommandError, match=rf"gave up after 0.2s: 1 migration\(s\) pending, "
                                           rf"first queueing\.{last.name}"):
        call_command("wait_for_migrations", "--timeout", "0.2", "--interval", "0.05")
    assert time.monotonic() - started < 5


def test_wait_for_migrations_rejects_a_nonsense_interval(db: None) -> None:
    with pytest.raises(CommandError, match="--interval"):
        call_command("wait_for_migrations", "--interval", "0")
