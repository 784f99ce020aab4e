"""`fairq logs` by attempt and replica: the job's own lines on stdout, what
fairq says about them (how the attempt ended, an empty log, other attempts) on stderr."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import Job
from queueing.services.logs import job_logs_archive
from queueing.services.scheduler import scheduler_cycle

from .conftest import Cli
from .test_cli import SUBMIT


def _finished(cli: Cli, *flags: str) -> Job:
    assert cli(*SUBMIT, "-e", "FAIRQ_SIM_SECONDS=30", *flags).code == 0
    job = Job.objects.get()
    t0 = timezone.now() - timedelta(minutes=5)
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    scheduler_cycle(now=t0 + timedelta(seconds=40))
    job_logs_archive(backend=get_backend(), now=t0 + timedelta(seconds=41))
    job.refresh_from_db()
    return job


def test_logs_of_a_finished_job_print_the_kept_lines_and_the_exit_line(cli: Cli) -> None:
    job = _finished(cli, "-e", "FAIRQ_SIM_EXIT_CODE=2")
    assert job.status == "FAILED"
    r = cli("logs", str(job.pk))
    assert r.code == 0, r.err
    assert r.out.splitlines()[-1].endswith("exited with code 2")
    assert "[fairq] attempt 1 ended: FAILED: exit code 2\n" in r.err


def test_logs_of_an_attempt_and_replica_that_do_not_exist_are_refused(cli: Cli) -> None:
    job = _finished(cli)
    r = cli("logs", str(job.pk), "--attempt", "2")
    assert r.code == 1 and "attempt" in r.err
    r = cli("logs", str(job.pk), "--replica", "1")
    assert r.code == 1 and "replica" in r.err
    r = cli("--json", "logs", str(job.pk), "--attempt", "1", "--replica", "0")
    assert r.code == 0 and r.json["source"] == "archived" and r.json["attempt"] == 1


def test_logs_of_a_queued_job_say_there_are_none_yet(cli: Cli) -> None:
    assert cli(*SUBMIT).code == 0
    r = cli("logs", str(Job.objects.get().pk))
    assert r.code == 0 and r.out == ""
    assert "no logs yet: the job has not started" in r.err
