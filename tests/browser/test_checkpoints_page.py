"""Graceful stop in a real browser (docs/api.md, "Checkpoints and graceful stop"): the
job page of a job preempted 15 minutes after its checkpoint, resumed from it, and
reporting again. Screenshot: test-artifacts/screenshots/job-checkpoints.png."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.models import Job
from queueing.policy.states import JobState
from queueing.services.checkpoints import checkpoint_claim, checkpoint_report, checkpoint_token
from tests.conftest import World, job_body

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("no_r9")]


def test_the_job_page_shows_checkpoints_and_lost_time(
        page: Any, world: World, cycle: Callable[..., Any],
        shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    t0 = timezone.now() - timedelta(hours=3)
    stopped = t0 + timedelta(hours=1)
    c = world.client(world.member)
    ids = [int(c.post("/api/v1/jobs/", job_body(
        name=f"llm-pretrain-{i}", gpus=8, tier="low", stop_signal="SIGUSR1",
        checkpoint_interval_seconds=1800, termination_grace_seconds=120,
        env={"FAIRQ_SIM_SECONDS": "90000"}), format="json").json()["id"]) for i in range(2)]
    cycle(t0)
    cycle(t0)
    victim = ids[0]

    def report(attempt: int, step: int, at: Any, progress: float) -> None:
        checkpoint_report(claim=checkpoint_claim(checkpoint_token(job_id=victim,
                                                                  attempt=attempt)),
                          job_id=victim, step=step, progress=progress,
                          path=f"/ckpt/llm/step-{step}.pt", now=at)

    report(1, 1000, t0 + timedelta(minutes=15), 0.10)
    report(1, 3000, t0 + timedelta(minutes=45), 0.30)
    nlp = int(world.client(world.outsider).post("/api/v1/jobs/", job_body(
        team="nlp", name="eval-urgent", gpus=8, tier="high",
        env={"FAIRQ_SIM_SECONDS": "600"}), format="json").json()["id"])
    assert cycle(stopped).preempted == [victim]
    cycle(stopped + timedelta(seconds=1))
    # The preemptor finishes; the victim resumes as attempt 2 and checkpoints again.
    cycle(stopped + timedelta(minutes=11))
    assert Job.objects.get(pk=nlp).status == JobState.SUCCEEDED
    cycle(stopped + timedelta(minutes=11, seconds=1))
    cycle(stopped + timedelta(minutes=11, seconds=2))
    assert Job.objects.get(pk=victim).status == JobState.RUNNING
    report(2, 3500, timezone.now() - timedelta(minutes=20), 0.35)

    login(page, "dave")
    page.goto(f"/jobs/{victim}/")
    expect(page.locator("#job-stop")).to_contain_text("SIGUSR1")
    expect(page.locator("#job-checkpoints")).to_contain_text("step 3500")
    expect(page.locator("#job-lost")).to_contain_text("2.00 GPU-h over 1 preemption")
    expect(page.locator("#attempts-table")).to_contain_text(
        "preempted, 2.00 GPU-h lost since the checkpoint 15 min before")
    expect(page.locator("#tl-h")).to_be_visible()
    shoot(page, "job-checkpoints")
