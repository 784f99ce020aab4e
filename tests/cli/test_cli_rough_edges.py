"""The CLI as a new user meets it, in its own process against a live server: output
piped into `head`, a server URL without its scheme, `--wait` giving up on an unreachable
fairq, `prio` with no job, Slurm's array ranges and one way of writing times."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accounts.services import token_issue
from queueing.models import JobEvent
from tests.conftest import World
from tests.factories import JobFactory

from .live import ROOT, LiveServer, run_cli

pytestmark = pytest.mark.django_db(transaction=True)


def _env(url: str, token: str, home: Path) -> dict[str, str]:
    return {**os.environ, "FAIRQ_URL": url, "FAIRQ_TOKEN": token, "XDG_CONFIG_HOME": str(home)}


def test_status_piped_into_head_exits_quietly_when_head_leaves(
        live: LiveServer, world: World, tmp_path: Path) -> None:
    """`fairq status ID | head -3`: the reader takes three lines and closes its end while
    the CLI still writes (its output is larger than a pipe holds): no traceback, no
    "Exception ignored", the exit status of a process killed by SIGPIPE."""
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    first = job.events.first()
    JobEvent.objects.bulk_create([
        JobEvent(job=job, at=job.created_at, kind="note", actor_label="scheduler",
                 reason=f"a long enough note to fill the pipe's buffer quickly, number {i}")
        for i in range(3000)])
    assert first is None or first.pk
    token = token_issue(user=world.admin).key
    proc = subprocess.Popen([sys.executable, "-m", "fairq_cli.main", "status", str(job.pk)],
                            cwd=ROOT, env=_env(live.url, token, tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    head = [proc.stdout.readline() for _ in range(3)]
    proc.stdout.close()  # head -3 is done
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=60)
    assert head[0].startswith(f"Job {job.pk}: ".encode())
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err, err
    assert err == ""
    assert code == 141


def test_status_into_a_pipe_already_closed_exits_quietly(
        live: LiveServer, world: World, tmp_path: Path) -> None:
    """The reader gone before the CLI writes a byte (the interpreter's last flush): the same."""
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    token = token_issue(user=world.admin).key
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, "-m", "fairq_cli.main", "status", str(job.pk)],
                          cwd=ROOT, env=_env(live.url, token, tmp_path), stdout=write,
                          stderr=subprocess.PIPE, timeout=60, check=False)
    os.close(write)
    err = proc.stderr.decode()
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception" not in err, err
    assert proc.returncode == 141


@pytest.mark.parametrize("url", ["127.0.0.1:1", "fq.example.org", "ftp://fq.example.org"])
def test_a_server_url_without_http_or_https_is_refused_readably(
        world: World, tmp_path: Path, url: str) -> None:
    cli = run_cli("queue", url=url, token=token_issue(user=world.admin).key, home=tmp_path)
    assert cli.finish(timeout=30) == 2
    assert "Traceback" not in cli.err and "InvalidSchema" not in cli.err
    assert "MissingSchema" not in cli.err
    host = url.split("://")[-1]
    assert cli.err == (f"fairq: the server URL {url!r} (FAIRQ_URL) must start with https:// "
                       f"or http:// (e.g. https://{host})\n")


def test_wait_gives_up_at_its_unreachable_timeout_saying_the_job_is_still_queued(
        live: LiveServer, world: World, tmp_path: Path) -> None:
    """`--unreachable-timeout 6`: the backoff (1 s, 2 s, 4 s ...) is cut to the time
    left, so the CLI gives up at 6 s, not at the last whole step before it (3 s), and
    says the job it followed is still queued, with exit 7 (not 5: the job exists)."""
    cli = run_cli("submit", "-t", "vision", "-J", "train", "-i", "ghcr.io/acme/train:1.4",
                  "-G", "h100", "-g", "2", "--wait", "--unreachable-timeout", "6",
                  url=live.url, token=token_issue(user=world.admin).key, home=tmp_path,
                  FAIRQ_WATCH_SECONDS="5")
    cli.wait_for(lambda: "QUEUED" in cli.err)
    job_id = int(cli.err.split("job ", 1)[1].split()[0])
    live.stop()
    stopped = time.monotonic()
    code = cli.finish(timeout=60)
    took = time.monotonic() - stopped
    assert code == 7, cli.err
    assert 5.5 <= took < 15, (took, cli.err)
    assert "retrying in 1s" in cli.err and "retrying in 2s" in cli.err
    assert "retrying in 3s" in cli.err  # 1 + 2 + 3 = 6: the last step cut to the time left
    last = cli.err.strip().splitlines()[-1]
    assert last.startswith("fairq: stopped waiting: fairq unreachable for 6s "
                           "(--unreachable-timeout 6s)"), last
    assert f"Job {job_id} was QUEUED when last seen: it is still queued" in last
    assert "Traceback" not in cli.err


def test_wait_on_an_array_gives_up_saying_how_many_members_had_not_ended(
        live: LiveServer, world: World, tmp_path: Path) -> None:
    cli = run_cli("submit", "-t", "vision", "-J", "sweep", "-i", "ghcr.io/acme/train:1.4",
                  "-G", "h100", "-g", "1", "-a", "3", "--wait", "--unreachable-timeout", "3",
                  url=live.url, token=token_issue(user=world.admin).key, home=tmp_path,
                  FAIRQ_WATCH_SECONDS="5")
    cli.wait_for(lambda: "Submitted array job of 3" in cli.out)
    time.sleep(0.5)  # into the watch
    live.stop()
    assert cli.finish(timeout=60) == 7, cli.err
    last = cli.err.strip().splitlines()[-1]
    assert last.startswith("fairq: stopped waiting: fairq unreachable for 3s"), last
    assert "Array " in last and ": 3 of its 3 members had not ended when last seen: they " \
        "are still queued or running" in last, last
    assert "Traceback" not in cli.err
