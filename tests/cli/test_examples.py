"""examples/ stays true: the job file is accepted as written and reaches the job, the
pipeline script submits, waits and prints each replica's log, and the team admin's
allow-list call is what the API takes."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from django.core.cache import cache
from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import Job, JobEvent, Quota
from queueing.policy.states import JobState
from queueing.services.logs import job_logs_archive
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World
from tests.factories import JobFactory

from .conftest import BASE, Cli, DjangoTransport

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB_FILE = EXAMPLES / "torchrun-job.yaml"


def _allowlists_of_the_setup_script() -> dict[str, list[str]]:
    """The JSON body team-admin-setup.sh PATCHes (its `curl -d '...'`)."""
    script = (EXAMPLES / "team-admin-setup.sh").read_text()
    body = re.search(r"-d '(\{.*?\})'", script, re.S)
    assert body, "team-admin-setup.sh no longer PATCHes a JSON body"
    return json.loads(body.group(1))


@pytest.fixture
def allowed(world: World) -> dict[str, list[str]]:
    """Team vision's allow lists set the way the example script sets them: through the
    API, as its team admin."""
    body = _allowlists_of_the_setup_script()
    # The demo's h100 has a rack level (the job file asks one rack, preferred).
    world.h100.topology_levels = [{"name": "rack", "node_label": "topology.kubernetes.io/rack"}]
    world.h100.save()
    r = world.client(world.admin).patch("/api/v1/teams/vision/workload-policy/", body,
                                        format="json")
    assert r.status_code == 200, r.content
    return body


def test_the_setup_script_allows_every_name_the_job_file_uses(allowed: dict[str, list[str]]
                                                              ) -> None:
    spec = yaml.safe_load(JOB_FILE.read_text())
    assert {v["pvc"] for v in spec["volumes"] if "pvc" in v} <= set(allowed["allowed_pvcs"])
    assert {s["secret"] for s in spec["secrets"]} <= set(allowed["allowed_secrets"])
    assert spec["image_pull_secret"] in allowed["allowed_pull_secrets"]


def test_the_job_file_runs_with_submit_wait(cli: Cli, allowed: dict[str, list[str]]) -> None:
    cli.on_sleep = scheduler_cycle
    r = cli("submit", "-f", str(JOB_FILE), "-e", "FAIRQ_SIM_SECONDS=0", "--wait",
            "--poll-interval", "0.01", "--timeout", "60")
    assert r.code == 0, r.err
    assert "SUCCEEDED" in r.err
    job = Job.objects.get()
    spec = yaml.safe_load(JOB_FILE.read_text())
    # Every field of the file reached the job as written.
    assert (job.replicas, job.gpus_per_replica) == (2, 4)
    assert job.resources == spec["resources"] and job.shm_size == spec["shm_size"]
    assert [v["name"] for v in job.volumes] == ["data", "ckpt", "scratch"]
    assert job.volumes[0] == {"name": "data", "pvc": "imagenet", "mount_path": "/data",
                              "read_only": True}
    assert job.secrets == spec["secrets"]
    assert (job.image_pull_secret, job.working_dir) == ("regcred", "/workspace")
    assert job.labels == spec["labels"] and job.annotations == spec["annotations"]
    assert job.termination_grace_seconds == 120
    assert job.args[0] == "--nnodes=$(WORLD_SIZE)"
    assert job.topology == spec["topology"]


def test_the_job_file_is_refused_when_the_team_allows_nothing(cli: Cli, world: World) -> None:
    r = cli("submit", "-f", str(JOB_FILE))
    assert r.code == 1
    assert "volumes[0].pvc" in r.err and "not in the team's allowed PVCs" in r.err
    assert not Job.objects.exists()


class _Session:
    """What pipeline.py needs of requests.Session, routed through Django's test client."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.inner = DjangoTransport()

    def request(self, method: str, url: str, *, timeout: float, **kwargs: Any) -> Any:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self.inner.request(method, url, headers=headers, timeout=timeout, **kwargs)


def _cycle_and_log_archive() -> None:
    """What the worker does between two polls: a cycle and the beat's log archive pass."""
    scheduler_cycle()
    job_logs_archive(backend=get_backend(), now=timezone.now())


def _example_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"fairq_example_{name}", EXAMPLES / name)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pipeline_argv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cli: Cli, *,
                   sim_seconds: str, tier: str | None = None,
                   extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Write examples/job.yaml with `FAIRQ_SIM_SECONDS` (and `tier`) changed into
    `tmp_path`, point the example scripts at the test server with the user's token, and
    set pipeline.py's argv; the spec written is returned."""
    job_file = tmp_path / "job.yaml"
    spec = yaml.safe_load(JOB_FILE.read_text())
    spec["env"]["FAIRQ_SIM_SECONDS"] = sim_seconds
    if tier is not None:
        spec["tier"] = tier
    job_file.write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("FAIRQ_URL", BASE)
    monkeypatch.setenv("FAIRQ_TOKEN", cli.token)
    monkeypatch.setattr(sys, "argv", ["pipeline.py", str(job_file), *extra,
                                      "--interval", "0", "--log-wait", "5"])
    return spec




def test_the_pipeline_script_submits_waits_and_prints_each_replicas_log(
        cli: Cli, allowed: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pipeline = _example_module("pipeline.py")
    session = _Session()
    monkeypatch.setattr(pipeline.requests, "Session", lambda: session)
    monkeypatch.setattr(pipeline.time, "sleep", lambda _s: _cycle_and_log_archive())
    spec = _pipeline_argv(monkeypatch, tmp_path, cli, sim_seconds="0",
                          extra=("--label", "trial=8"))
    assert pipeline.main() == 0
    out = capsys.readouterr().out
    job = Job.objects.get()
    assert job.labels == {**spec["labels"], "trial": "8"}
    assert f"submitted job {job.pk} (resnet50-ddp) to team vision" in out
    assert "SUCCEEDED" in out
    for replica in (0, 1):
        assert f"--- replica {replica} of attempt 1 (archived) ---" in out
        assert re.search(rf"started fq-{job.pk}-1 replica {replica} of 2 on sim-h100-", out)
    assert out.count("exited with code 0") == 2
    assert out.count("--- SUCCEEDED: exit code 0 ---") == 2
    # The submit carried an Idempotency-Key: the job keeps it.
    assert job.idempotency_key


def test_the_pipeline_script_prints_a_state_once_while_only_the_queue_around_it_moves(
        cli: Cli, world: World, allowed: dict[str, list[str]],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    """While the job waits, each poll finds one more job ahead of it (a100, high tier): its
    reasons' messages change ("N in the whole queue"), their codes do not. One QUEUED
    line, then one per status (ADMITTED, SUCCEEDED; RUNNING when a poll sees it)."""
    pipeline = _example_module("pipeline.py")
    session = _Session()
    monkeypatch.setattr(pipeline.requests, "Session", lambda: session)
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.high)  # ahead, its type
    polls = []

    def sleep(_s: float) -> None:
        polls.append(_s)
        if len(polls) <= 4:
            JobFactory(team=world.nlp, gpu_type=world.a100, tier=world.high)
            cache.clear()  # the cached queue plan expires (3 s) between two real polls
        else:
            _cycle_and_log_archive()

    monkeypatch.setattr(pipeline.time, "sleep", sleep)
    _pipeline_argv(monkeypatch, tmp_path, cli, sim_seconds="0")
    assert pipeline.main() == 0
    out = capsys.readouterr().out
    job = Job.objects.get(name="resnet50-ddp")
    states = re.findall(rf"job {job.pk}: (\w+)", out)
    assert states[0] == "QUEUED" and states[-1] == "SUCCEEDED", out
    assert len(states) == len(set(states)), out  # a line per status, QUEUED once
    # The one QUEUED line gives the reason as it was then: one job ahead of it in all.
    assert "1 job ahead of it for h100 GPUs (1 in the whole queue)" in out
    assert len(polls) >= 5


def test_the_array_pipeline_waits_for_its_dependency_then_cancels_the_rest(
        cli: Cli, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """examples/array_pipeline.py: a preprocessing job, an array of 4 (at most 2 at once)
    after_ok on it; the members wait for it, it is watched with the long poll to its end,
    two members run, the rest is cancelled with DELETE /arrays/{id}/."""
    pipeline = _example_module("array_pipeline.py")
    session = _Session()
    session.inner.on_wait = scheduler_cycle  # the world moves on while a long poll waits
    monkeypatch.setattr(pipeline.requests, "Session", lambda: session)
    monkeypatch.setattr(pipeline.time, "sleep", lambda _s: scheduler_cycle())
    monkeypatch.setenv("FAIRQ_URL", BASE)
    monkeypatch.setenv("FAIRQ_TOKEN", cli.token)
    monkeypatch.setattr(sys, "argv", [
        "array_pipeline.py", "--team", "vision", "--members", "4", "--at-once", "2",
        "--prep-seconds", "0", "--run-seconds", "60", "--watch-seconds", "1"])
    assert pipeline.main() == 0
    out = capsys.readouterr().out
    prep = Job.objects.get(name="prep")
    members = list(Job.objects.filter(array__isnull=False).order_by("array_index"))
    assert prep.status == JobState.SUCCEEDED and len(members) == 4
    assert out.count(f"waiting for job {prep.pk} (after_ok)") == 4
    assert f"job {prep.pk}: RUNNING -> SUCCEEDED" in out
    assert any(m == "GET" and f"/jobs/{prep.pk}/?wait=1" in p for m, p in session.inner.calls)
    assert "(holding GPUs: 2)" in out and "cancelled 4 member(s)" in out
    assert {m.status for m in members} == {JobState.CANCELLED}
    # At most two members ever held GPUs (rule A8): two were admitted, two never were.
    admitted = JobEvent.objects.filter(job__in=members, kind=JobEvent.Kind.TRANSITION,
                                       to_status=JobState.ADMITTED)
    assert admitted.values("job").distinct().count() == 2


@pytest.mark.usefixtures("no_r9")
def test_the_pipeline_script_shows_a_preempted_job_resumed_as_its_next_attempt(
        cli: Cli, world: World, allowed: dict[str, list[str]],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    """The job file on the `low` tier; once it runs, its team's `high` job needs every
    h100, an owed claim (rule R11: the team's nominal quota is 16): the pipeline prints
    RUNNING, QUEUED (why it waits), RUNNING again, SUCCEEDED, then both attempts' kept
    logs - the first ending with its stop signal (the simulated cluster's graceful stop)
    and the preemption - and exits 0. Time is virtual: each poll is a cycle 10 s later."""
    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(nominal=16,
                                                                        borrowing_limit=0)
    pipeline = _example_module("pipeline.py")
    session = _Session()
    monkeypatch.setattr(pipeline.requests, "Session", lambda: session)
    clock = [timezone.now()]
    preemptor: list[int] = []

    def sleep(_s: float) -> None:
        clock[0] += timedelta(seconds=10)
        job = Job.objects.filter(name="resnet50-ddp").first()
        if job is not None and job.status == JobState.RUNNING and not preemptor:
            r = world.client(world.member).post("/api/v1/jobs/", {
                "team": "vision", "name": "urgent", "image": "ghcr.io/acme/train:1.4",
                "command": ["python", "eval.py"], "gpu_type": "h100", "gpus": 8,
                "replicas": 2, "tier": "high", "env": {"FAIRQ_SIM_SECONDS": "30"}},
                format="json")
            assert r.status_code == 201, r.content
            preemptor.append(r.json()["id"])
        scheduler_cycle(now=clock[0])
        job_logs_archive(backend=get_backend(), now=clock[0])

    monkeypatch.setattr(pipeline.time, "sleep", sleep)
    _pipeline_argv(monkeypatch, tmp_path, cli, sim_seconds="60", tier="low")
    assert pipeline.main() == 0
    out = capsys.readouterr().out
    job = Job.objects.get(name="resnet50-ddp")
    assert job.attempt == 2 and job.status == JobState.SUCCEEDED
    states = [s for s in re.findall(rf"job {job.pk}: (\w+)", out) if s != "ADMITTED"]
    moves = [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]
    assert moves == ["QUEUED", "RUNNING", "QUEUED", "RUNNING", "SUCCEEDED"], out
    assert f"--- PREEMPTED: preempted by job #{preemptor[0]} of team vision (tier high)" \
        in out
    for attempt in (1, 2):
        for replica in (0, 1):
            assert f"--- replica {replica} of attempt {attempt} (archived) ---" in out
    first = out[out.index("--- replica 0 of attempt 1"):out.index("--- replica 1 of attempt 1")]
    assert "received SIGUSR1 (stop signal)" in first and "exited after SIGUSR1" in first
    assert out.count("--- SUCCEEDED: exit code 0 ---") == 2
