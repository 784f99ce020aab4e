"""The watch end to end: the real CLI (its own process) and raw HTTP against a live
server on this process's test database, while the test moves the world on (scheduler
cycles, cancels, a server restart)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from accounts.services import token_issue
from queueing.api import watch
from queueing.models import Job
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World

from .live import LiveServer, run_cli

pytestmark = pytest.mark.django_db(transaction=True)

SUBMIT = ["submit", "-t", "vision", "-J", "train", "-i", "ghcr.io/acme/train:1.4",
          "-G", "h100", "-g", "2"]


def _cycle() -> None:
    scheduler_cycle()


def _token(world: World) -> str:
    return token_issue(user=world.admin).key


def _cli(live: LiveServer, world: World, tmp_path: Path, *argv: str, **env: str) -> Any:
    return run_cli(*argv, url=live.url, token=_token(world), home=tmp_path,
                   **{"FAIRQ_WATCH_SECONDS": "5", **env})


def _submitted(n: int = 1) -> list[Job]:
    deadline = time.monotonic() + 30
    while Job.objects.count() < n:
        assert time.monotonic() < deadline, "the CLI submitted nothing"
        time.sleep(0.05)
    return list(Job.objects.order_by("id"))


# --- submit --wait: exit codes -----------------------------------------------------------


def test_wait_exits_0_when_the_job_succeeds(live: LiveServer, world: World,
                                            tmp_path: Path) -> None:
    cli = _cli(live, world, tmp_path, *SUBMIT, "-e", "FAIRQ_SIM_SECONDS=0", "--wait")
    assert cli.finish(step=_cycle) == 0, cli.err
    assert "RUNNING" in cli.err and "SUCCEEDED" in cli.err
    assert f"Job {_submitted()[0].pk} succeeded" in cli.out


def test_wait_exits_3_when_the_job_fails(live: LiveServer, world: World,
                                         tmp_path: Path) -> None:
    cli = _cli(live, world, tmp_path, *SUBMIT, "-e", "FAIRQ_SIM_SECONDS=0",
               "-e", "FAIRQ_SIM_EXIT_CODE=7", "--wait")
    assert cli.finish(step=_cycle) == 3, cli.err
    assert f"fairq: job {_submitted()[0].pk} FAILED (exit code 7)" in cli.err


def test_wait_exits_4_when_the_job_is_cancelled(live: LiveServer, world: World,
                                                tmp_path: Path) -> None:
    cli = _cli(live, world, tmp_path, *SUBMIT, "--wait", FAIRQ_WATCH_SECONDS="30")
    job = _submitted()[0]
    cli.wait_for(lambda: "QUEUED" in cli.err)
    started = time.monotonic()
    r = requests.post(f"{live.url}/api/v1/jobs/{job.pk}/cancel/", timeout=10,
                      headers={"Authorization": f"Token {_token(world)}"})
    assert r.status_code == 200, r.text
    assert cli.finish(timeout=40) == 4, cli.err
    # The long poll answered on the cancel, not at the end of its 30 s (a loaded CI
    # machine may take seconds to answer; 30 s apart is what the test tells apart).
    assert time.monotonic() - started < 20
    assert f"fairq: job {job.pk} CANCELLED" in cli.err


def test_wait_exits_7_when_fairq_stays_unreachable(live: LiveServer, world: World,
                                                   tmp_path: Path) -> None:
    cli = _cli(live, world, tmp_path, *SUBMIT, "--wait", "--unreachable-timeout", "2")
    _submitted()
    cli.wait_for(lambda: "QUEUED" in cli.err)
    live.stop()
    assert cli.finish(timeout=30) == 7, cli.err
    assert "fairq unreachable, retrying in 1s" in cli.err
    assert "stopped waiting" in cli.err


def test_any_command_exits_5_when_nothing_listens(world: World, tmp_path: Path) -> None:
    server = LiveServer(port=1)  # nothing listens on port 1
    cli = run_cli("queue", url=server.url, token=_token(world), home=tmp_path)
    assert cli.finish(timeout=30) == 5
    assert cli.err.startswith("fairq: cannot reach http://127.0.0.1:1/api/v1")


def test_wait_survives_a_server_restart(live: LiveServer, world: World,
                                        tmp_path: Path) -> None:
    cli = _cli(live, world, tmp_path, *SUBMIT, "-e", "FAIRQ_SIM_SECONDS=0", "--wait")
    _submitted()
    cli.wait_for(lambda: "QUEUED" in cli.err)
    live.stop()
    cli.wait_for(lambda: "fairq unreachable, retrying in 2s" in cli.err, timeout=20)
    live.start()
    assert cli.finish(step=_cycle) == 0, cli.err
    assert "fairq reachable again" in cli.err
    assert "succeeded" in cli.out


def test_an_array_waits_for_every_member(live: LiveServer, world: World,
                                         tmp_path: Path) -> None:
    cli = _cli(live, world, tmp_path, *SUBMIT, "-e", "FAIRQ_SIM_SECONDS=0", "-a", "3",
               "--wait")
    jobs = _submitted(3)
    requests.post(f"{live.url}/api/v1/jobs/{jobs[1].pk}/cancel/", timeout=10,
                  headers={"Authorization": f"Token {_token(world)}"}).raise_for_status()
    assert cli.finish(step=_cycle) == 4, cli.err
    assert "Array of 3: 1 cancelled, 2 succeeded" in cli.out
    assert {j.status for j in Job.objects.all()} == {"SUCCEEDED", "CANCELLED"}


def test_fairq_url_may_end_in_api_v1(live: LiveServer, world: World, tmp_path: Path) -> None:
    for url in (f"{live.url}/api/v1", f"{live.url}/api/v1/"):
        cli = run_cli("queue", url=url, token=_token(world), home=tmp_path)
        assert cli.finish() == 0, cli.err
        assert cli.out.startswith("JOBID")


# --- the long poll ----------------------------------------------------------------------


def _api(live: LiveServer, world: World) -> requests.Session:
    s = requests.Session()
    s.headers["Authorization"] = f"Token {_token(world)}"
    return s


def test_long_poll_returns_as_soon_as_the_job_changes(live: LiveServer, world: World) -> None:
    api = _api(live, world)
    job = api.post(f"{live.url}/api/v1/jobs/", json={
        "team": "vision", "name": "lp", "image": "ghcr.io/acme/train:1.4", "gpu_type": "h100",
        "gpus": 1}, timeout=10).json()
    url = f"{live.url}/api/v1/jobs/{job['id']}/"
    since = api.get(url, timeout=10).headers["Fairq-Last-Event"]
    cancel: dict[str, Any] = {}

    def cancel_now() -> None:
        t = time.monotonic()
        cancel["status"] = api.post(f"{url}cancel/", timeout=30).status_code
        cancel["seconds"] = time.monotonic() - t

    timer = threading.Timer(1.0, cancel_now)
    timer.start()
    started = time.monotonic()
    r = api.get(url, params={"wait": 40, "since_event": since}, timeout=90)
    took = time.monotonic() - started
    timer.join()
    assert cancel["status"] == 200, cancel
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED", (cancel, took)
    # The cancel's change, well before the 40 s wait ends (however slow a loaded machine
    # makes the cancel itself: `cancel["seconds"]`).
    assert 0.9 <= took < 30.0, (cancel, took)


def test_long_poll_times_out_with_304_when_nothing_changes(live: LiveServer,
                                                           world: World) -> None:
    api = _api(live, world)
    job = api.post(f"{live.url}/api/v1/jobs/", json={
        "team": "vision", "name": "lp", "image": "ghcr.io/acme/train:1.4", "gpu_type": "h100",
        "gpus": 1}, timeout=10).json()
    url = f"{live.url}/api/v1/jobs/{job['id']}/"
    since = api.get(url, timeout=10).headers["Fairq-Last-Event"]
    started = time.monotonic()
    r = api.get(url, params={"wait": 2, "since_event": since}, timeout=30)
    assert r.status_code == 304
    assert 2.0 <= time.monotonic() - started < 15.0  # it waited the 2 s, then answered


# --- the event stream -------------------------------------------------------------------


def _read_stream(r: requests.Response) -> tuple[list[dict[str, Any]], list[str]]:
    """(events, comments) of a whole SSE answer."""
    events: list[dict[str, Any]] = []
    comments: list[str] = []
    current: dict[str, Any] = {}
    for raw in r.iter_lines(decode_unicode=True):
        line = raw or ""
        if not line:
            if "data" in current:
                current["received"] = time.monotonic()
                events.append(current)
            current = {}
        elif line.startswith(":"):
            comments.append(line[1:].strip())
        else:
            key, _, value = line.partition(": ")
            current[key] = json.loads(value) if key == "data" else value
    return events, comments


def test_the_stream_yields_job_events_and_resumes_with_last_event_id(
        live: LiveServer, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "POLL_SECONDS", 0.1)
    monkeypatch.setattr(watch, "HEARTBEAT_SECONDS", 0.5)
    api = _api(live, world)
    body = {"team": "vision", "image": "ghcr.io/acme/train:1.4", "gpu_type": "h100", "gpus": 1}

    def later() -> None:
        time.sleep(1.0)  # idle first: a heartbeat
        job = api.post(f"{live.url}/api/v1/jobs/", json={**body, "name": "s1"}, timeout=10).json()
        api.post(f"{live.url}/api/v1/jobs/{job['id']}/cancel/", timeout=10)

    t = threading.Thread(target=later)
    t.start()
    opened = time.monotonic()
    r = api.get(f"{live.url}/api/v1/jobs/stream/", params={"team": "vision", "duration": 10},
                headers={"Accept": "text/event-stream"}, stream=True, timeout=30)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events, comments = _read_stream(r)
    t.join()
    assert [(e["event"], e["data"]["to_status"]) for e in events] == [
        ("transition", "QUEUED"), ("transition", "CANCELLED")]
    assert [int(e["id"]) for e in events] == [e["data"]["id"] for e in events]
    # Each event as it happens (~1 s in), not when the 10 s stream ends.
    assert events[0]["received"] - opened < 8
    assert "heartbeat" in comments
    assert comments[-1].startswith("the stream ends after 10s")

    # Resume after the first: only the second comes again.
    r = api.get(f"{live.url}/api/v1/jobs/stream/", params={"team": "vision", "duration": 1},
                headers={"Last-Event-ID": events[0]["id"]}, stream=True, timeout=30)
    again, _ = _read_stream(r)
    assert [e["id"] for e in again] == [events[1]["id"]]

    # Another team's member sees none of it, from the very start.
    outsider = requests.Session()
    outsider.headers["Authorization"] = f"Token {token_issue(user=world.outsider).key}"
    r = outsider.get(f"{live.url}/api/v1/jobs/stream/",
                     params={"duration": 1, "last_event_id": 0}, stream=True, timeout=30)
    assert _read_stream(r)[0] == []
