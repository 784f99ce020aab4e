"""Rules N1-N4 against a real JupyterLab server (docs/sessions.md, "Idle culling").

The simulated cluster starts a real `jupyter lab` for the session (FAIRQ_SIM_NOTEBOOKS,
queueing/backends/notebook_local.py); the test makes kernel activity through the
server's REST API, then runs the check at chosen instants after that activity: idle
-> warned -> culled, activity resets, a file written in the root dir survives the cull.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core import mail
from django.utils import timezone

from queueing.backends.notebook_local import jupyterlab_installed
from queueing.composition import get_backend, reset_backends
from queueing.models import Job, JobEvent, NotebookSession, UsageRecord
from queueing.policy.states import JobState
from queueing.services.scheduler import scheduler_cycle
from queueing.services.sessions import (
    Upstream,
    notebook_upstream,
    server_read,
    session_start,
    sessions_check,
)
from tests.conftest import World

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not jupyterlab_installed(), reason="needs jupyterlab")]


@pytest.fixture
def lab_settings(settings: Any, tmp_path: Path) -> Iterator[Path]:
    settings.FAIRQ_SIM_NOTEBOOKS = True
    settings.FAIRQ_SIM_NOTEBOOK_DIR = str(tmp_path)
    settings.FAIRQ_NOTICE_EMAILS = True
    reset_backends()
    yield tmp_path
    reset_backends()  # stops the servers the test left running


def running_session(world: World, *, pvc: str = "home", idle: int = 60) -> tuple[Job, Upstream]:
    """A session started, admitted, running, its server answering."""
    world.member.email = "dave@example.org"
    world.member.save()
    world.vision.allowed_pvcs = ["home", "scratch"]
    world.vision.save()
    job = session_start(actor=world.member, team="vision", gpu_type="a100", gpus=1, pvc=pvc,
                        idle_minutes=idle)
    now = timezone.now()
    scheduler_cycle(now=now)
    scheduler_cycle(now=now + timedelta(seconds=1))
    job.refresh_from_db()
    assert job.status == JobState.RUNNING
    up = notebook_upstream(job)
    assert up is not None and up.base_url.startswith("http://127.0.0.1:")
    deadline = time.monotonic() + 60
    while True:  # the server takes a few seconds to listen
        try:
            server_read(up, timeout=2)
            return job, up
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def api(up: Upstream, method: str, path: str, **kw: Any) -> httpx.Response:
    r = httpx.request(method, up.base_url + up.prefix + path,
                      headers={"Authorization": f"token {up.token}"}, timeout=30, **kw)
    assert r.status_code < 300, (r.status_code, r.text[:200])
    return r


def kernel_activity(up: Upstream, kernel: str | None = None) -> tuple[str, datetime]:
    """Start a kernel (or restart it): the server records kernel activity."""
    if kernel is None:
        kernel = api(up, "POST", "api/kernels", json={"name": "python3"}).json()["id"]
    else:
        api(up, "POST", f"api/kernels/{kernel}/restart")
    # Its start (or restart) is over once its last activity holds still for two seconds
    # (no client is connected: its state says `starting`): a loaded machine is slow.
    deadline, seen, still = time.monotonic() + 60, None, 0
    while True:
        kernels = api(up, "GET", "api/kernels", params={"no_track_activity": "1"}).json()
        now = max(k["last_activity"] for k in kernels)
        still = still + 1 if now == seen else 0
        if still >= 2:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"the kernel did not settle: {kernels}")
        seen = now
        time.sleep(1.0)
    return kernel, datetime.fromisoformat(now.replace("Z", "+00:00"))


def session(job: Job) -> NotebookSession:
    return NotebookSession.objects.get(job_id=job.pk)


def test_it_reads_the_real_server_without_counting_as_activity(world: World,
                                                                lab_settings: Path) -> None:
    _, up = running_session(world)
    _, last = kernel_activity(up)
    time.sleep(1.5)
    reading = server_read(up, timeout=5)
    assert reading.kernels == 1 and not reading.kernel_busy
    assert reading.kernels_last_activity == (last,)  # our reads did not move it
    bad = Upstream(up.base_url, token="wrong", prefix=up.prefix)
    with pytest.raises(Exception, match="HTTP 403"):
        server_read(bad, timeout=5)


def test_rules_n2_n3_idle_warned_then_culled_files_kept(world: World,
                                                       lab_settings: Path) -> None:
    job, up = running_session(world, pvc="home")
    api(up, "PUT", "api/contents/notes.txt",
        json={"type": "file", "format": "text", "content": "keep me"})
    _, last = kernel_activity(up)

    r = sessions_check(now=last + timedelta(minutes=49))
    assert r.checked == 1 and not r.warned and not r.culled
    assert session(job).warned_at is None

    at = last + timedelta(minutes=50)
    r = sessions_check(now=at)
    assert r.warned == [job.pk]
    assert session(job).warned_at == at
    warning = JobEvent.objects.get(job=job, kind=JobEvent.Kind.IDLE)
    assert warning.data["rule"] == "N2" and "rule N2" in warning.reason
    assert [m.to for m in mail.outbox] == [["dave@example.org"]]
    assert "is idle" in mail.outbox[0].subject

    r = sessions_check(now=last + timedelta(minutes=55))  # warned once only
    assert not r.warned and len(mail.outbox) == 1

    at = last + timedelta(minutes=60)
    r = sessions_check(now=at)
    assert r.culled == [job.pk]
    job.refresh_from_db()
    assert job.status == JobState.CANCELLED and job.message == "culled: idle"
    assert session(job).culled_at == at
    end = JobEvent.objects.filter(job=job, to_status=JobState.CANCELLED).get()
    assert end.data["rule"] == "N3" and "files are kept" in end.reason
    assert UsageRecord.objects.filter(job=job).count() == 1
    assert "was stopped" in mail.outbox[1].subject
    # The pod (the local server) is gone; the files on the PVC are not.
    time.sleep(0.5)
    get_backend().statuses(now=timezone.now())
    with pytest.raises(httpx.HTTPError):
        httpx.get(up.base_url + up.prefix + "api/status", timeout=2)
    kept = lab_settings / "vision" / "home" / "notes.txt"
    assert kept.read_text() == "keep me"

    # A new session of the same PVC serves the same file.
    _, up2 = running_session(world, pvc="home")
    body = api(up2, "GET", "api/contents/notes.txt").json()
    assert body["content"] == "keep me"


def test_rule_n4_activity_resets_the_idle_run(world: World, lab_settings: Path) -> None:
    job, up = running_session(world)
    kernel, first = kernel_activity(up)
    sessions_check(now=first + timedelta(minutes=50))
    assert session(job).warned_at == first + timedelta(minutes=50)

    # Used again (the kernel restarted): activity after the warning.
    time.sleep(1.1)
    _, second = kernel_activity(up, kernel)
    assert second > first
    # Seen at a check before its limit counted from the first activity would have hit.
    NotebookSession.objects.filter(job_id=job.pk).update(warned_at=second - timedelta(seconds=1))
    r = sessions_check(now=second + timedelta(minutes=1))
    assert r.busy_again == [job.pk]
    assert session(job).warned_at is None
    assert JobEvent.objects.filter(job=job, kind=JobEvent.Kind.IDLE,
                                   data__rule="N4").count() == 1
    # The idle run starts again at the new activity: no warning 49 minutes after it,
    # none culled at first + 60.
    r = sessions_check(now=second + timedelta(minutes=49))
    assert not r.warned and not r.culled
    r = sessions_check(now=second + timedelta(minutes=50))
    assert r.warned == [job.pk]
    job.refresh_from_db()
    assert job.status == JobState.RUNNING


@pytest.mark.parametrize(("minutes", "busy_gpu", "expected"), [
    (30, False, "busy"), (50, False, "warn"), (60, False, "cull"),
    # GPUs busy 5 minutes before the check: not idle, whatever the kernels
    (60, True, "busy"),
])
def test_culling_decisions_table(world: World, lab_settings: Path, minutes: int,
                                 busy_gpu: bool, expected: str) -> None:
    from queueing.models import AttemptUtilization

    job, up = running_session(world)
    _, last = kernel_activity(up)
    now = last + timedelta(minutes=minutes)
    if busy_gpu:
        AttemptUtilization.objects.create(job=job, attempt=job.attempt, first_at=last,
                                          last_at=now - timedelta(minutes=5), samples=10,
                                          sm_last=80.0)
    r = sessions_check(now=now)
    got = "warn" if r.warned else "cull" if r.culled else "busy"
    assert got == expected
