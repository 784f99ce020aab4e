"""`fairq` end to end against the API (in-process): output, --json and exit codes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from fairq_cli.config import ConfigError, load_config
from fairq_cli.main import duration_seconds, main
from queueing.models import Job
from tests.conftest import World
from tests.factories import JobFactory

from .conftest import Cli

SUBMIT = ["submit", "-t", "vision", "-J", "train", "-i", "ghcr.io/acme/train:1.4",
          "-G", "h100", "-g", "2"]


def test_it_submits_from_flags(cli: Cli) -> None:
    r = cli(*SUBMIT, "--time", "2h", "-e", "SEED=3", "--", "python", "train.py")
    assert r.code == 0, r.err
    job = Job.objects.get()
    assert r.out.startswith(f"Submitted job {job.pk} (vision/train, 2xh100")
    assert job.command == ["python", "train.py"]
    assert job.max_runtime_seconds == 7200
    assert job.env == {"SEED": "3"}


def test_it_submits_a_yaml_job_file_with_flags_winning(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("team: vision\nname: from-file\nimage: ghcr.io/acme/train:1.4\n"
                 "gpu_type: a100\ngpus: 1\ntime: 30m\ncommand: [python, eval.py]\n")
    r = cli("--json", "submit", "-f", str(f), "-g", "4")
    assert r.code == 0, r.err
    assert r.json["name"] == "from-file"
    assert r.json["gpus"] == 4
    assert r.json["max_runtime_seconds"] == 1800


def test_it_submits_an_array_job(cli: Cli) -> None:
    r = cli(*SUBMIT, "--array", "5")
    assert r.code == 0, r.err
    assert Job.objects.count() == 5
    assert "Submitted array job of 5" in r.out


def test_missing_fields_are_a_usage_error(cli: Cli) -> None:
    r = cli("submit", "-t", "vision")
    assert r.code == 2
    assert r.err.startswith("fairq: missing name, image, gpu_type, gpus")
    assert r.err.count("\n") == 1


def test_server_rejection_is_one_line_and_exit_1(cli: Cli) -> None:
    r = cli(*SUBMIT[:-4], "-G", "tpu", "-g", "1")
    assert r.code == 1
    assert "gpu_type: Unknown GPU type 'tpu'" in r.err
    assert r.err.count("\n") == 1


def _run_cycle() -> None:
    from queueing.services.scheduler import scheduler_cycle

    scheduler_cycle()


def test_wait_follows_the_job_and_exits_with_its_result(cli: Cli) -> None:
    cli.on_sleep = _run_cycle
    r = cli(*SUBMIT, "-e", "FAIRQ_SIM_SECONDS=0", "--wait", "--timeout", "60")
    assert r.code == 0, r.err
    assert "SUCCEEDED" in r.err
    assert "succeeded" in r.out


def test_wait_exits_3_when_the_job_failed_and_names_its_exit_code(cli: Cli) -> None:
    cli.on_sleep = _run_cycle
    r = cli(*SUBMIT, "-e", "FAIRQ_SIM_SECONDS=0", "-e", "FAIRQ_SIM_EXIT_CODE=7", "--wait",
            "--timeout", "60")
    assert r.code == 3, (r.out, r.err)
    assert f"fairq: job {Job.objects.get().pk} FAILED (exit code 7)" in r.err


def test_queue_prints_a_table_of_active_jobs(cli: Cli, world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal, name="qjob")
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal, name="secret")
    r = cli("queue")
    assert r.code == 0, r.err
    header, *rows = r.out.splitlines()
    assert header.split()[:3] == ["JOBID", "TEAM", "NAME"]
    assert len(rows) == 1
    assert rows[0].split()[:3] == [str(job.pk), "vision", "qjob"]
    assert " PD " in rows[0]
    assert cli("--json", "queue").json[0]["id"] == job.pk


def test_status_and_cancel(cli: Cli, world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    r = cli("status", str(job.pk))
    assert r.code == 0, r.err
    assert "State     QUEUED" in r.out
    r = cli("cancel", str(job.pk))
    assert r.code == 0, r.err
    assert r.out == f"Cancelled job {job.pk} ({job.name})\n"
    r = cli("cancel", str(job.pk))
    assert r.code == 1
    assert "cannot be cancelled" in r.err


def test_other_teams_jobs_are_not_found(cli: Cli, world: World) -> None:
    job = JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal)
    r = cli("status", str(job.pk))
    assert r.code == 1
    assert r.err == f"fairq: job {job.pk} not found\n"


def test_logs_follow_until_the_job_ends(cli: Cli) -> None:
    cli.on_sleep = _run_cycle
    assert cli(*SUBMIT, "-e", "FAIRQ_SIM_SECONDS=0").code == 0
    job = Job.objects.get()
    r = cli("logs", str(job.pk))
    assert r.code == 0
    assert r.out == ""
    r = cli("logs", str(job.pk), "-f", "--poll-interval", "0.01")
    assert r.code == 0, r.err
    job.refresh_from_db()
    assert job.status == "SUCCEEDED"
    # Between reads it waited with the watch (a long poll), not a sleep.
    assert any(path.startswith(f"/api/v1/jobs/{job.pk}/?wait=1")
               for _, path in cli.transport.calls)
    assert cli.sleeps == []


def test_share_prints_the_callers_teams(cli: Cli) -> None:
    r = cli("share")
    assert r.code == 0, r.err
    teams = [line.split()[0] for line in r.out.splitlines()[1:]]
    assert teams == ["vision"]  # alice is in vision only (docs/api.md, "Who sees which team")
    assert "FAIRSHARE" in r.out.splitlines()[0]


def test_prio_prints_the_breakdown(cli: Cli, world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    detail = cli("--json", "status", str(job.pk)).json
    if not detail.get("priority"):
        pytest.skip("the job detail has no priority breakdown yet")
    r = cli("prio", str(job.pk))
    assert r.code == 0, r.err
    header, row = r.out.splitlines()[:2]
    assert header.split() == ["JOBID", "TEAM", "TIER", "STATE", "PRIORITY", "FAIRSHARE",
                              "AGE", "SIZE"]
    assert row.split()[:4] == [str(job.pk), "vision", "normal", "QUEUED"]
    assert "fair_share" in r.out


def test_bad_token_is_exit_1(world: World) -> None:
    from .conftest import DjangoTransport

    err = io.StringIO()
    code = main(["--url", "http://testserver", "--token", "fq_nope_nope", "queue"],
                transport=DjangoTransport(), out=io.StringIO(), err=err)
    assert code == 1
    assert err.getvalue() == "fairq: Invalid token\n"


def test_config_comes_from_flags_env_then_file(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "config.toml"
    f.write_text('url = "http://file"\ntoken = "file-token"\n'
                 '[profiles.prod]\nurl = "http://prod"\ntoken = "prod-token"\n')
    monkeypatch.delenv("FAIRQ_URL", raising=False)
    monkeypatch.delenv("FAIRQ_TOKEN", raising=False)
    assert load_config(url=None, token=None, path=f).url == "http://file"
    assert load_config(url=None, token=None, path=f, profile="prod").token == "prod-token"
    monkeypatch.setenv("FAIRQ_URL", "http://env/")
    assert load_config(url=None, token=None, path=f).url == "http://env"
    assert load_config(url="http://flag", token=None, path=f).url == "http://flag"
    with pytest.raises(ConfigError):
        load_config(url=None, token=None, path=tmp_path / "none.toml",
                    profile=None) if not monkeypatch.delenv("FAIRQ_URL") else None


@pytest.mark.parametrize(("text", "seconds"),
                         [("90", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400),
                          ("1:30:00", 5400), ("45:00", 2700)])
def test_durations(text: str, seconds: int) -> None:
    assert duration_seconds(text) == seconds


def test_no_config_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("FAIRQ_URL", raising=False)
    monkeypatch.delenv("FAIRQ_TOKEN", raising=False)
    err = io.StringIO()
    assert main(["queue"], out=io.StringIO(), err=err) == 2
    assert err.getvalue().startswith("fairq: no server URL")


def _unused(_: Any) -> None:  # keeps imports honest for type checkers
    return None


def test_status_names_each_node_once_with_its_replicas(cli: Cli, world: World) -> None:
    """A placement is one node per replica; people read each node once."""
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal, replicas=3,
                     status="RUNNING", placement=["gpu-a", "gpu-a", "gpu-b"])
    r = cli("status", str(job.pk))
    assert r.code == 0, r.err
    assert "  Nodes     gpu-a (2 replicas), gpu-b\n" in r.out


def test_wait_exits_6_when_the_timeout_passes(cli: Cli) -> None:
    r = cli(*SUBMIT, "--wait", "--timeout", "1")  # no cycle runs: it stays queued
    assert r.code == 6, r.err
    assert r.err.endswith(f"fairq: job {Job.objects.get().pk} is still QUEUED after --timeout: "
                          "it is still queued, this command only stopped watching\n")


def test_a_bad_watch_setting_is_a_usage_error(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAIRQ_WATCH_SECONDS", "600")
    r = cli(*SUBMIT, "--wait")
    assert r.code == 2
    assert "FAIRQ_WATCH_SECONDS must be 1..60" in r.err
    assert not Job.objects.exists()  # said before submitting


def test_an_array_wait_takes_a_few_requests_not_one_per_member(
        cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """`submit -a 40 --wait` follows the array's counts and the long poll on one member
    not ended at a time: far fewer requests than members (it used to follow each)."""
    from queueing.services.scheduler import scheduler_cycle

    monkeypatch.setenv("FAIRQ_WATCH_SECONDS", "1")  # in-process, a long poll blocks the test

    cli.on_sleep = scheduler_cycle  # the world moves on while the CLI waits
    r = cli("submit", "-t", "vision", "-J", "sweep", "-i", "ghcr.io/acme/train:1.4",
            "-G", "h100", "-g", "1", "-e", "FAIRQ_SIM_SECONDS=0", "-a", "40", "--wait")
    assert r.code == 0, r.err
    assert "Array of 40: 40 succeeded" in r.out
    assert set(Job.objects.values_list("status", flat=True)) == {"SUCCEEDED"}
    gets = [path for method, path in cli.transport.calls if method == "GET"]
    assert any(p.startswith("/api/v1/arrays/") for p in gets)
    assert len(gets) < 20, (len(gets), gets)
