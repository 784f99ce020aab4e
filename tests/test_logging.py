"""Structured logs (docs/deployment.md, "Logs"): FAIRQ_LOG_FORMAT=json prints one JSON
object per line with timestamp, level, logger and message, and inside the scheduler the
cycle's id on every line and the job's id and team on the lines about one job."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import environ
import pytest
from django.conf import settings

from config.settings.logs import logging_config
from queueing.logcontext import current, log_context
from queueing.models import Job

from .conftest import World, job_body, poison_admission

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """The real LOGGING of FAIRQ_LOG_FORMAT=json, writing into a buffer."""
    # A dependency (pyproject.toml) that a venv older than it may lack: `make install`.
    pytest.importorskip("pythonjsonlogger", reason="python-json-logger is not installed")
    buf = io.StringIO()
    cfg = logging_config("json")
    cfg["handlers"]["console"]["stream"] = buf
    logging.config.dictConfig(cfg)
    try:
        yield buf
    finally:
        logging.config.dictConfig(settings.LOGGING)


def records(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def test_a_json_line_has_timestamp_level_logger_message_and_the_context(
        json_lines: io.StringIO) -> None:
    log = logging.getLogger("queueing.test")
    log.warning("plain %s", "line")
    with log_context(cycle_id="c1", team="vision"), log_context(job_id=7):
        log.error("about job %d", 7)
    first, second = records(json_lines)
    assert first["level"] == "WARNING" and first["logger"] == "queueing.test"
    assert first["message"] == "plain line" and "T" in first["timestamp"]
    assert not {"cycle_id", "job_id", "team"} & set(first)
    assert {k: second[k] for k in ("cycle_id", "job_id", "team", "message")} == {
        "cycle_id": "c1", "job_id": 7, "team": "vision", "message": "about job 7"}
    assert current() == {}  # restored on exit


def test_log_context_refuses_unknown_fields() -> None:
    with pytest.raises(ValueError, match="unknown log context fields"), log_context(user="x"):
        pass


def test_every_line_of_a_cycle_has_its_id_and_a_failing_jobs_line_the_job_and_team(
        world: World, monkeypatch: pytest.MonkeyPatch, json_lines: io.StringIO) -> None:
    from queueing import tasks

    r = world.client(world.member).post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201, r.json()
    bad = int(r.json()["id"])
    poison_admission(monkeypatch, bad, KeyError("odd"))
    monkeypatch.setattr(tasks, "new_cycle_id", lambda: "c0ffee")
    tasks.scheduler_cycle_task.apply()
    lines = [r for r in records(json_lines) if r["logger"].startswith("queueing.")]
    assert lines, json_lines.getvalue()
    assert all(r.get("cycle_id") == "c0ffee" for r in lines), lines
    [failed] = [r for r in lines if "failing the job" in r["message"]]
    assert failed["level"] == "ERROR" and failed["job_id"] == bad
    assert failed["team"] == "vision"  # the team of job_body()
    assert Job.objects.get(pk=bad).status == "FAILED"


def test_a_log_format_other_than_plain_or_json_stops_start_up() -> None:
    with pytest.raises(environ.ImproperlyConfigured, match="FAIRQ_LOG_FORMAT"):
        logging_config("xml")


def test_production_logs_json_unless_told_otherwise() -> None:
    pytest.importorskip("pythonjsonlogger", reason="python-json-logger is not installed")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.prod",
           "DJANGO_SECRET_KEY": "x" * 50, "DJANGO_ALLOWED_HOSTS": "fairq.example.com",
           "DATABASE_URL": "postgres://u@127.0.0.1:1/x", "REDIS_URL": "redis://127.0.0.1:1/0"}
    env.pop("FAIRQ_LOG_FORMAT", None)
    code = ("import django; django.setup(); import logging; "
            "logging.getLogger('queueing.x').warning('hello'); ")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = json.loads(out.stderr.strip().splitlines()[-1])
    assert line["message"] == "hello" and line["level"] == "WARNING"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "FAIRQ_LOG_FORMAT": "plain"},
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stderr.strip().endswith("WARNING queueing.x hello")
