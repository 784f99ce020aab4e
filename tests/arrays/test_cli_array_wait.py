"""`fairq submit -a N --wait` against a live server while cycles run, for an array larger
than the submit's window: the CLI waits for the members the scheduler writes
later too, and its summary counts every member."""

from __future__ import annotations

from pathlib import Path

import pytest

from accounts.services import token_issue
from queueing.models import Job, JobArray
from queueing.services.jobs import ARRAY_SUBMIT_WINDOW
from queueing.services.scheduler import scheduler_cycle
from tests.cli.live import LiveServer, run_cli
from tests.conftest import World

pytestmark = pytest.mark.django_db(transaction=True)


def test_wait_on_an_array_follows_the_members_written_later(
        live: LiveServer, world: World, tmp_path: Path) -> None:
    n = ARRAY_SUBMIT_WINDOW + 8
    cli = run_cli("submit", "-t", "vision", "-J", "wide", "-i", "ghcr.io/acme/train:1.4",
                  "-G", "a100", "-g", "1", "-e", "FAIRQ_SIM_SECONDS=0", "-a", str(n), "--wait",
                  url=live.url, token=token_issue(user=world.admin).key, home=tmp_path,
                  FAIRQ_WATCH_SECONDS="2")
    assert cli.finish(step=scheduler_cycle, timeout=120) == 0, cli.err
    assert f"and 8 more as they are scheduled (array {JobArray.objects.get().pk})" in cli.out
    assert f"Array of {n}: {n} succeeded" in cli.out
    assert sorted(Job.objects.values_list("array_index", flat=True)) == list(range(n))
