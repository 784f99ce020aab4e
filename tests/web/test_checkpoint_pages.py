"""Graceful stop on the web: the submit form's stop signal and checkpoint interval
(`30m` as the max runtime is written; refusals on their fields, nothing stored), "submit
again" keeps them, and the job page shows the signal, the newest checkpoints and what
each preemption lost."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from queueing.models import Job
from queueing.services.checkpoints import checkpoint_claim, checkpoint_report, checkpoint_token
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body
from tests.web.test_pages import form_body, login

pytestmark = pytest.mark.django_db


def test_the_form_takes_the_signal_and_the_interval(world: World) -> None:
    r = login(world.member).post("/jobs/new/", form_body(stop_signal="SIGUSR1",
                                                         checkpoint_interval_seconds="30m"))
    assert r.status_code == 302, r.content.decode()
    job = Job.objects.get()
    assert (job.stop_signal, job.checkpoint_interval_seconds) == ("SIGUSR1", 1800)
    again = login(world.member).get(f"/jobs/new/?from={job.pk}").content.decode()
    assert 'value="30m"' in again and '<option value="SIGUSR1" selected>' in again


def test_the_form_refuses_an_interval_under_a_minute_on_its_field(world: World) -> None:
    r = login(world.member).post("/jobs/new/", form_body(checkpoint_interval_seconds="30s"))
    assert r.status_code in (200, 400)
    html = r.content.decode()
    assert "at least 60" in html and not Job.objects.exists()
    r = login(world.member).post("/jobs/new/", form_body(stop_signal="SIGKILL"))
    assert "SIGKILL" in r.content.decode() and not Job.objects.exists()


@pytest.mark.usefixtures("no_r9")
def test_the_job_page_shows_the_signal_the_checkpoints_and_the_loss(world: World) -> None:
    t0 = timezone.now() - timedelta(hours=2)
    stopped = t0 + timedelta(hours=1)
    c = world.client(world.member)
    ids = [int(c.post("/api/v1/jobs/", job_body(
        name=f"train-{i}", gpus=8, tier="low", stop_signal="SIGUSR1",
        checkpoint_interval_seconds=1800, env={"FAIRQ_SIM_SECONDS": "9000"}),
        format="json").json()["id"]) for i in range(2)]
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0)
    claim = checkpoint_claim(checkpoint_token(job_id=ids[0], attempt=1))
    checkpoint_report(claim=claim, job_id=ids[0], step=1200, progress=0.4,
                      path="/ckpt/step-1200.pt", now=stopped - timedelta(minutes=15))
    world.client(world.outsider).post("/api/v1/jobs/", job_body(
        team="nlp", name="big", gpus=8, tier="high"), format="json")
    assert scheduler_cycle(now=stopped).preempted == [ids[0]]
    html = login(world.member).get(f"/jobs/{ids[0]}/").content.decode()
    assert "<code>SIGUSR1</code> first" in html
    assert "every 30" in html and "step 1200, 40%, <code>/ckpt/step-1200.pt</code>" in html
    assert "2.00 GPU-h over 1 preemption" in html
    assert "preempted, 2.00 GPU-h lost since the checkpoint 15 min before" in html
