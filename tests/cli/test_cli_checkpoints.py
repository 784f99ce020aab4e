"""`fairq submit --stop-signal/--checkpoint-every` (flags and the job file),
`fairq show` (alias of status) with the stop signal, the newest checkpoint and what each
preemption lost, and `fairq checkpoint` run as a job runs it: FAIRQ_CHECKPOINT_URL and
FAIRQ_CHECKPOINT_TOKEN from the environment, against the API in-process."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from fairq_cli.main import main
from queueing.models import Checkpoint, Job
from queueing.policy.states import JobState
from queueing.services.checkpoints import checkpoint_claim, checkpoint_report, checkpoint_token
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World

from .conftest import BASE, Cli, DjangoTransport, Result

SUBMIT = ["submit", "-t", "vision", "-J", "train", "-i", "ghcr.io/acme/train:1.4",
          "-G", "h100", "-g", "8", "-q", "low", "-e", "FAIRQ_SIM_SECONDS=9000"]


def checkpoint(*argv: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    code = main(["checkpoint", *argv], transport=DjangoTransport(), out=out, err=err)
    return Result(code, out.getvalue(), err.getvalue())


def test_submit_takes_the_stop_signal_and_the_checkpoint_interval(cli: Cli) -> None:
    r = cli(*SUBMIT, "--stop-signal", "usr1", "--checkpoint-every", "30m", "--", "python", "t.py")
    assert r.code == 0, r.err
    job = Job.objects.get()
    assert (job.stop_signal, job.checkpoint_interval_seconds) == ("SIGUSR1", 1800)
    out = cli("show", str(job.pk)).out
    assert "Stop      SIGUSR1, then SIGKILL after 30s" in out, out
    assert "Checkpt   every 30m; none reported yet" in out, out


def test_a_bad_signal_is_a_usage_error_and_a_short_interval_the_servers_refusal(
        cli: Cli) -> None:
    r = cli(*SUBMIT, "--stop-signal", "KILL")
    assert r.code == 2 and "--stop-signal wants one of SIGTERM" in r.err
    r = cli(*SUBMIT, "--checkpoint-every", "30s")
    assert r.code == 1 and "checkpoint_interval_seconds: Seconds, at least 60" in r.err, r.err
    assert not Job.objects.exists()


def test_the_job_file_takes_checkpoint_every_as_a_duration(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("team: vision\nname: from-file\nimage: ghcr.io/acme/train:1.4\n"
                 "gpu_type: a100\ngpus: 1\nstop_signal: SIGINT\ncheckpoint_every: 1h\n")
    assert cli("submit", "-f", str(f)).code == 0
    job = Job.objects.get()
    assert (job.stop_signal, job.checkpoint_interval_seconds) == ("SIGINT", 3600)


def test_fairq_checkpoint_reports_from_inside_the_job(
        cli: Cli, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli(*SUBMIT, "--checkpoint-every", "10m").code == 0
    job = Job.objects.get()
    scheduler_cycle(now=timezone.now())
    scheduler_cycle(now=timezone.now())
    job.refresh_from_db()
    assert job.status == JobState.RUNNING
    monkeypatch.setenv("FAIRQ_CHECKPOINT_URL", f"{BASE}/api/v1/jobs/{job.pk}/checkpoints/")
    monkeypatch.setenv("FAIRQ_CHECKPOINT_TOKEN", checkpoint_token(job_id=job.pk, attempt=1))
    r = checkpoint("--step", "1200", "--progress", "0.4", "--path", "/ckpt/step-1200.pt")
    assert r.code == 0, r.err
    c = Checkpoint.objects.get()
    assert r.out == f"checkpoint {c.pk} of job {job.pk} attempt 1 recorded\n"
    assert (c.step, c.progress, c.path) == (1200, 0.4, "/ckpt/step-1200.pt")
    out = cli("show", str(job.pk)).out
    assert "Checkpt   every 10m; newest " in out and \
        "(attempt 1: step 1200, 40%, /ckpt/step-1200.pt)" in out, out
    # A bad value: the server's 400, one line, exit 1.
    r = checkpoint("--step", "-3")
    assert r.code == 1 and "step: A whole number, at least 0" in r.err, r.err


def test_fairq_checkpoint_without_the_environment_says_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAIRQ_CHECKPOINT_URL", raising=False)
    monkeypatch.delenv("FAIRQ_CHECKPOINT_TOKEN", raising=False)
    r = checkpoint("--step", "1")
    assert r.code == 2
    assert "FAIRQ_CHECKPOINT_URL and FAIRQ_CHECKPOINT_TOKEN not set" in r.err
    assert "FAIRQ_PUBLIC_URL" in r.err


@pytest.mark.usefixtures("no_r9")
def test_show_says_what_each_preemption_lost(cli: Cli, world: World) -> None:
    t0 = timezone.now() - timedelta(hours=2)
    stopped = t0 + timedelta(hours=1)
    assert cli(*SUBMIT).code == 0
    assert cli(*SUBMIT[:4], "other", *SUBMIT[5:]).code == 0
    victim = Job.objects.order_by("id").first()
    assert victim is not None
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0)
    checkpoint_report(claim=checkpoint_claim(checkpoint_token(job_id=victim.pk, attempt=1)),
                      job_id=victim.pk, step=10, now=stopped - timedelta(minutes=15))
    r = world.client(world.outsider).post("/api/v1/jobs/", {
        "team": "nlp", "name": "big", "image": "ghcr.io/acme/train:1.4", "gpu_type": "h100",
        "gpus": 8, "tier": "high"}, format="json")
    assert r.status_code == 201
    assert scheduler_cycle(now=stopped).preempted == [victim.pk]
    out = cli("show", str(victim.pk)).out
    assert "Attempt 1 preempted, 2.00 GPU-h lost since the checkpoint 15 min before" in out, out
    assert "Lost      2.00 GPU-h to 1 preemption(s)" in out
