"""`fairq session start|list|open|stop` against the real API in-process (docs/cli.md,
"Notebook sessions"): what a person reads, and the refusals on one readable line."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts.services import token_issue
from queueing.composition import reset_backends
from queueing.models import Job, NotebookSession
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World
from tests.factories import GpuTypeFactory

from .conftest import Cli

pytestmark = pytest.mark.django_db


@pytest.fixture
def dave(world: World, cli: Cli, settings: Any) -> Cli:
    settings.FAIRQ_SIM_NODES = "2x8xh100,2x8xa100,1x7xmig-1g-10gb,2x4xt4-shared"
    reset_backends()
    GpuTypeFactory(slug="t4-shared", resource_name="nvidia.com/gpu.shared",
                   sharing="time-sliced", slices_per_gpu=4)
    world.vision.allowed_pvcs = ["home"]
    world.vision.save()
    cli.token = token_issue(user=world.member).key
    return cli


def test_start_list_open_stop(world: World, dave: Cli) -> None:
    out = dave("session", "start", "-t", "vision", "--fraction", "1/4", "--pvc", "home",
               "--idle", "30m", "--time", "2h")
    assert out.code == 0, out.err
    sid = NotebookSession.objects.get().job_id
    assert out.out == (
        f"Started session {sid} (vision/notebook): 1/4 t4-shared (shared GPU, time-sliced: no "
        "memory isolation), QUEUED; stopped after 30 idle minutes, time limit 2h.\n"
        f"Open it with: fairq session open {sid}\n")
    assert NotebookSession.objects.get().idle_limit_minutes == 30

    out = dave("session", "open", str(sid))
    assert out.code == 1 and out.err == f"fairq: session {sid} is QUEUED: no notebook to open yet\n"

    now = timezone.now()
    scheduler_cycle(now=now)
    scheduler_cycle(now=now + timedelta(seconds=1))
    out = dave("session", "open", str(sid))
    assert out.code == 0
    assert out.out == f"http://testserver/sessions/{sid}/lab/\n"
    assert "starting" in out.err  # no local server in the tests: no address

    out = dave("session", "list")
    lines = out.out.splitlines()
    assert lines[0].split() == ["ID", "TEAM", "NAME", "STATE", "GPU", "AGE", "IDLE", "COST",
                                "URL"]
    assert lines[1].split()[:4] == [str(sid), "vision", "notebook", "RUNNING"]
    assert "0m/30m" in lines[1] and f"/sessions/{sid}/lab/" in lines[1]

    out = dave("session", "stop", str(sid))
    assert out.code == 0
    assert out.out == f"Stopped session {sid} (notebook); its PVC and files are kept\n"
    assert Job.objects.get(pk=sid).status == "CANCELLED"


def test_refusals_are_one_readable_line(world: World, dave: Cli) -> None:
    out = dave("session", "start", "-t", "vision", "-G", "a100", "--fraction", "0.5")
    assert out.code == 1
    assert "whole devices only" in out.err and out.err.count("\n") == 1
    out = dave("session", "start", "-t", "vision", "--idle", "90s")
    assert out.code == 2 and out.err == "fairq: --idle 90s: whole minutes (60m, 2h)\n"
    out = dave("session", "start", "-t", "vision", "--time", "soon")
    assert out.code == 2 and "bad duration 'soon'" in out.err
    out = dave("session", "open", "999999")
    assert out.code == 1 and "not found" in out.err
