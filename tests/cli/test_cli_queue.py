"""`fairq queue` tells the truth: each queued job's reason is the API's
(rule P3), the queue is in position order (rule P2), `--start` estimates when each may
start (rule P4), and `fairq prio` shows the tier."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest

from queueing.composition import get_backend
from queueing.models import Job
from queueing.services.jobs import job_cancel
from queueing.services.scheduler import scheduler_cycle

from .conftest import Cli

H100 = ["-t", "vision", "-i", "ghcr.io/acme/train:1.4", "-G", "h100"]


@pytest.fixture
def busy(cli: Cli) -> dict[str, Job]:
    """The test cluster's 16 h100 GPUs held by two running jobs (1 h and 3 h max runtime),
    then a normal-tier job of 8 GPUs and, after it, a high-tier job of 4 (which goes
    first, rule P2)."""
    for name, limit in (("r1", "1h"), ("r2", "3h")):
        assert cli("submit", *H100, "-J", name, "-g", "8", "--time", limit,
                   "-e", "FAIRQ_SIM_SECONDS=86400").code == 0
    scheduler_cycle()
    scheduler_cycle()
    assert set(Job.objects.values_list("status", flat=True)) == {"RUNNING"}
    assert cli("submit", *H100, "-J", "big", "-g", "8", "--time", "2h").code == 0
    assert cli("submit", *H100, "-J", "urgent", "-g", "4", "--time", "30m",
               "-q", "high").code == 0
    return {j.name: j for j in Job.objects.all()}


def test_queue_prints_the_apis_reason_in_position_order(cli: Cli, busy: dict[str, Job]) -> None:
    r = cli("queue")
    assert r.code == 0, r.err
    rows = r.out.splitlines()[1:]
    assert [row.split()[2] for row in rows] == ["r1", "r2", "urgent", "big"]
    assert "(Priority)" not in r.out
    for name in ("urgent", "big"):
        detail = cli("--json", "status", str(busy[name].pk)).json
        reason = detail["queue"]["reasons"][0]["message"]
        row = next(row for row in rows if row.split()[2] == name)
        assert row.endswith(f"({reason})"), (row, reason)


def test_queue_start_estimates_from_the_running_jobs_max_runtimes(
        cli: Cli, busy: dict[str, Job]) -> None:
    r = cli("queue", "--start")
    assert r.code == 0, r.err
    header, *rows = r.out.splitlines()
    assert header.split()[6:8] == ["POS", "START_TIME"]
    r1 = busy["r1"]
    r1.refresh_from_db()
    assert r1.started_at is not None
    first_end = r1.started_at + timedelta(hours=1)
    # Rule P4: urgent (4 GPUs) starts when r1's 8 come back; big (8) needs 4 more, which
    # urgent gives back 30 minutes later (before r2's end at 3 h).
    expected = {"urgent": ("1", first_end), "big": ("2", first_end + timedelta(minutes=30))}
    assert [row.split()[2] for row in rows] == ["urgent", "big"]
    for row in rows:
        cells = row.split()
        position, start = expected[cells[2]]
        assert cells[6] == position
        assert cells[7] == start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = cli("--json", "queue", "--start").json
    assert [j["estimated_start"] is not None for j in data] == [True, True]


def test_queue_start_says_na_when_a_holder_has_no_max_runtime(cli: Cli) -> None:
    assert cli("submit", *H100, "-J", "forever", "-g", "8", "-N", "2",
               "-e", "FAIRQ_SIM_SECONDS=86400").code == 0
    scheduler_cycle()
    scheduler_cycle()
    assert cli("submit", *H100, "-J", "next", "-g", "1").code == 0
    r = cli("queue", "--start")
    assert r.code == 0, r.err
    (row,) = r.out.splitlines()[1:]
    assert row.split()[2] == "next" and row.split()[7] == "N/A"


def test_prio_shows_the_tier(cli: Cli, busy: dict[str, Job]) -> None:
    r = cli("prio", str(busy["urgent"].pk), str(busy["big"].pk))
    assert r.code == 0, r.err
    tiers = {row.split()[0]: row.split()[2] for row in r.out.splitlines()[1:]}
    assert tiers == {str(busy["urgent"].pk): "high", str(busy["big"].pk): "normal"}


def test_logs_say_when_the_log_is_empty(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty log is said so, also while following one."""
    assert cli("submit", *H100, "-J", "quiet", "-g", "1", "-e", "FAIRQ_SIM_SECONDS=600").code == 0
    scheduler_cycle()
    scheduler_cycle()
    job = Job.objects.get()
    monkeypatch.setattr(get_backend(), "logs", lambda name, tail=100: "")  # the pod wrote nothing
    r = cli("logs", str(job.pk))
    assert r.code == 0, r.err
    assert r.out == ""
    assert r.err == "[fairq] attempt 1: no logs yet\n"
    assert job.status == "RUNNING"
    cli.on_sleep = lambda: job_cancel(actor=None, job=Job.objects.get())  # while following
    r = cli("logs", str(job.pk), "-f", "--poll-interval", "1")
    assert r.code == 0, r.err
    assert r.err.startswith("[fairq] attempt 1: no logs yet (following)\n")
