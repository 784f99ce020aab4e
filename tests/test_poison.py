"""One bad job or one odd workload status never stops the cycle.

Hostile rows are written to the database directly, as rows older than today's validation
would be; hostile workload statuses come from a small wrapper around the simulated cluster
(the reconcile takes any ClusterBackend).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from queueing.backends.base import LaunchSpec, NodeInfo, Phase, WorkloadStatus
from queueing.backends.simulated import SimulatedCluster
from queueing.models import Job, JobEvent
from queueing.services import scheduler as sched
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body, poison_admission, poison_charge

pytestmark = pytest.mark.django_db


class HostileCluster:
    """A simulated cluster whose statuses pass through `rewrite` (job id → a function of
    the real status returning the statuses to report instead), plus `extra` statuses."""

    def __init__(self, inner: SimulatedCluster) -> None:
        self.inner = inner
        self.rewrite: dict[int, Callable[[WorkloadStatus], list[Any]]] = {}
        self.extra: list[Any] = []

    def nodes(self) -> list[NodeInfo]:
        return self.inner.nodes()

    def submit(self, spec: LaunchSpec, *, now: datetime) -> None:
        self.inner.submit(spec, now=now)

    def stop(self, name: str, *, now: datetime) -> None:
        self.inner.stop(name, now=now)

    def statuses(self, *, now: datetime) -> list[WorkloadStatus]:
        out: list[Any] = []
        for s in self.inner.statuses(now=now):
            fn = self.rewrite.get(s.job_id)
            out.extend(fn(s) if fn else [s])
        return out + list(self.extra)

    def logs(self, name: str, *, tail: int = 100) -> str:
        return self.inner.logs(name, tail=tail)


def submit(world: World, user: Any = None, **overrides: Any) -> int:
    r = world.client(user or world.member).post("/api/v1/jobs/", job_body(**overrides),
                                                 format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def poison(job_id: int, **env: str) -> None:
    """Give a job an env today's validation refuses (as an old row would have)."""
    job = Job.objects.get(pk=job_id)
    Job.objects.filter(pk=job_id).update(env={**job.env, **env})


def last_reason(job_id: int) -> str:
    event = JobEvent.objects.filter(job_id=job_id).order_by("-id").first()
    assert event is not None
    return event.reason


def run(backend: Any, t0: datetime, *seconds: float) -> None:
    for s in seconds:
        scheduler_cycle(now=t0 + timedelta(seconds=s), backend=backend)


@pytest.mark.parametrize("seconds", ["1e20", "inf", "-inf", "nan", "-1", "1e308"])
def test_a_job_with_absurd_sim_seconds_fails_alone(world: World, seconds: str) -> None:
    t0 = timezone.now()
    bad = submit(world, env={"FAIRQ_SIM_SECONDS": "10"})
    poison(bad, FAIRQ_SIM_SECONDS=seconds)
    good = submit(world, world.outsider, team="nlp", env={"FAIRQ_SIM_SECONDS": "10"})
    cluster = SimulatedCluster.from_spec("2x8xh100")
    run(cluster, t0, 0, 1, 11, 12)
    assert Job.objects.get(pk=good).status == "SUCCEEDED"
    job = Job.objects.get(pk=bad)
    assert job.status == "FAILED"
    assert "FAIRQ_SIM_SECONDS" in last_reason(bad) and "FAIRQ_SIM_SECONDS" in job.message
    assert sum(n.allocated for n in cluster.nodes()) == 0


@pytest.mark.parametrize("code", ["99999999999", "-99999999999", "256", "-1", "x"])
def test_a_job_with_an_absurd_sim_exit_code_fails_alone(world: World, code: str) -> None:
    t0 = timezone.now()
    bad = submit(world, env={"FAIRQ_SIM_SECONDS": "10"})
    poison(bad, FAIRQ_SIM_EXIT_CODE=code)
    good = submit(world, world.outsider, team="nlp", env={"FAIRQ_SIM_SECONDS": "10"})
    cluster = SimulatedCluster.from_spec("2x8xh100")
    run(cluster, t0, 0, 1, 11, 12)
    assert Job.objects.get(pk=good).status == "SUCCEEDED"
    job = Job.objects.get(pk=bad)
    assert job.status == "FAILED" and "FAIRQ_SIM_EXIT_CODE" in last_reason(bad)
    assert job.exit_code is None or -(2**31) <= job.exit_code < 2**31


def test_an_exit_code_out_of_range_from_the_cluster_is_clamped(world: World) -> None:
    t0 = timezone.now()
    bad = submit(world, env={"FAIRQ_SIM_SECONDS": "10"})
    good = submit(world, world.outsider, team="nlp", env={"FAIRQ_SIM_SECONDS": "10"})
    cluster = HostileCluster(SimulatedCluster.from_spec("2x8xh100"))
    cluster.rewrite[bad] = lambda s: [WorkloadStatus(
        name=s.name, job_id=s.job_id, attempt=s.attempt, phase=Phase.FAILED,
        started_at=s.started_at, finished_at=s.started_at, exit_code=99999999999,
        reason="exit code 99999999999", nodes=s.nodes)]
    run(cluster, t0, 0, 1, 11, 12)
    assert Job.objects.get(pk=good).status == "SUCCEEDED"
    job = Job.objects.get(pk=bad)
    assert job.status == "FAILED" and job.exit_code == 2**31 - 1


def test_a_nul_byte_in_a_workload_reason_is_stripped_before_it_is_saved(world: World) -> None:
    t0 = timezone.now()
    bad = submit(world, env={"FAIRQ_SIM_SECONDS": "10"})
    good = submit(world, world.outsider, team="nlp", env={"FAIRQ_SIM_SECONDS": "10"})
    cluster = HostileCluster(SimulatedCluster.from_spec("2x8xh100"))
    cluster.rewrite[bad] = lambda s: [WorkloadStatus(
        name=s.name, job_id=s.job_id, attempt=s.attempt, phase=Phase.FAILED,
        started_at=s.started_at, finished_at=s.started_at, exit_code=1,
        reason="Error: \x00oom\x1b[31m\nkilled\t(137)", nodes=("node-\x00é",))]
    run(cluster, t0, 0, 1, 11, 12)
    assert Job.objects.get(pk=good).status == "SUCCEEDED"
    job = Job.objects.get(pk=bad)
    assert job.status == "FAILED"
    assert last_reason(bad) == "Error: oom[31m\nkilled\t(137)" == job.message
    assert Job.objects.get(pk=bad).placement == ["node-é"] or job.placement


def test_an_exception_while_reconciling_one_job_fails_only_that_job(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = timezone.now()
    bad = submit(world, env={"FAIRQ_SIM_SECONDS": "10"})
    good = submit(world, world.outsider, team="nlp", env={"FAIRQ_SIM_SECONDS": "10"})
    poison_charge(monkeypatch, {bad}, ZeroDivisionError("a bug met an odd row"))
    cluster = SimulatedCluster.from_spec("2x8xh100")
    run(cluster, t0, 0, 1, 11)
    assert Job.objects.get(pk=good).status == "SUCCEEDED"
    assert Job.objects.get(pk=bad).status == "FAILED"
    assert last_reason(bad).startswith("fairq could not process")
    assert "ZeroDivisionError" in last_reason(bad)


def test_an_exception_while_admitting_one_job_fails_only_that_job(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = timezone.now()
    bad = submit(world, env={"FAIRQ_SIM_SECONDS": "10"})
    good = submit(world, world.outsider, team="nlp", env={"FAIRQ_SIM_SECONDS": "10"})
    poison_admission(monkeypatch, bad, KeyError("odd"))
    cluster = SimulatedCluster.from_spec("2x8xh100")
    result = scheduler_cycle(now=t0, backend=cluster)
    assert result.admitted == [good] and bad in result.job_errors
    assert Job.objects.get(pk=bad).status == "FAILED"
    assert "KeyError" in last_reason(bad)
    run(cluster, t0, 1, 11)
    assert Job.objects.get(pk=good).status == "SUCCEEDED"


def test_a_job_whose_launch_spec_cannot_be_built_fails_alone(world: World) -> None:
    t0 = timezone.now()
    bad = submit(world, env={"FAIRQ_SIM_SECONDS": "10"})
    Job.objects.filter(pk=bad).update(env=["not", "a", "mapping"])
    good = submit(world, world.outsider, team="nlp", env={"FAIRQ_SIM_SECONDS": "10"})
    cluster = SimulatedCluster.from_spec("2x8xh100")
    run(cluster, t0, 0, 1, 11)
    assert Job.objects.get(pk=good).status == "SUCCEEDED"
    assert Job.objects.get(pk=bad).status == "FAILED"
    assert "fairq could not process" in last_reason(bad)
    assert sum(n.allocated for n in cluster.nodes()) == 0


@pytest.mark.parametrize(("name", "value"), [
    ("FAIRQ_SIM_SECONDS", "1e20"), ("FAIRQ_SIM_SECONDS", "inf"), ("FAIRQ_SIM_SECONDS", "nan"),
    ("FAIRQ_SIM_SECONDS", "-1"), ("FAIRQ_SIM_SECONDS", "ten"), ("FAIRQ_SIM_SECONDS", "2592001"),
    ("FAIRQ_SIM_EXIT_CODE", "99999999999"), ("FAIRQ_SIM_EXIT_CODE", "-1"),
    ("FAIRQ_SIM_EXIT_CODE", "256"), ("FAIRQ_SIM_EXIT_CODE", "1.5"),
    ("FAIRQ_SIM_EXIT_CODE", "٣"),  # an Arabic-Indic digit: int() takes it, we do not
])
def test_the_simulated_clusters_knobs_are_validated_at_submit(
        world: World, name: str, value: str) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(env={name: value}),
                                        format="json")
    assert r.status_code == 400, r.json()
    assert name in str(r.json()["error"]["fields"]["env"])
    assert not Job.objects.exists()


@pytest.mark.parametrize("env", [{"FAIRQ_SIM_SECONDS": "0"}, {"FAIRQ_SIM_SECONDS": "2.5"},
                                 {"FAIRQ_SIM_SECONDS": "2592000"},
                                 {"FAIRQ_SIM_EXIT_CODE": "0"}, {"FAIRQ_SIM_EXIT_CODE": "255"}])
def test_sensible_knobs_are_accepted(world: World, env: dict[str, str]) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(env=env), format="json")
    assert r.status_code == 201, r.json()


def test_the_web_form_and_array_jobs_refuse_bad_knobs_too(world: World) -> None:
    r = world.client(world.member).post(
        "/api/v1/jobs/bulk/", {**job_body(env={"FAIRQ_SIM_SECONDS": "inf"}), "count": 3},
        format="json")
    assert r.status_code == 400 and "FAIRQ_SIM_SECONDS" in str(r.json()["error"]["fields"]["env"])
    web = Client()
    web.force_login(world.member)
    page = web.post("/jobs/new/", {
        "team": "vision", "name": "resnet", "image": "ghcr.io/acme/train:1.4",
        "command": "python train.py", "env": "FAIRQ_SIM_EXIT_CODE=99999999999",
        "gpu_type": "h100", "gpus": "2", "replicas": "1", "tier": "normal"})
    assert page.status_code == 400 and b"FAIRQ_SIM_EXIT_CODE must be" in page.content
    assert not Job.objects.exists()


# --- a failed cycle is visible ---------------------------------------------------------------

def scrape() -> str:
    return Client().get("/metrics").content.decode()


def test_a_failed_cycle_is_logged_with_its_id_counted_and_makes_the_scheduler_unhealthy(
        world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from queueing import tasks
    from queueing.tasks import scheduler_cycle_task

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("the cluster API is down")

    monkeypatch.setattr(sched, "reconcile", broken)
    monkeypatch.setattr(tasks, "new_cycle_id", lambda: "c0ffee")  # the name the task calls
    with caplog.at_level("ERROR", logger="queueing.tasks"):
        assert scheduler_cycle_task()["failed"] == 1
    assert "cycle c0ffee failed" in caplog.text and "RuntimeError" in caplog.text
    assert "fairq_cycle_failures_total 1.0" in scrape()
    r = Client().get("/healthz/scheduler")
    assert r.status_code == 503 and r.json()["status"] == "stale"
    assert r.json()["last_failure_cycle"] == "c0ffee"
    assert r.json()["last_success_age_seconds"] is None

    monkeypatch.undo()
    before = time.time()
    with caplog.at_level("DEBUG", logger="queueing.tasks"):
        scheduler_cycle_task()
    assert re.search(r"cycle [0-9a-f]{12} ok in [0-9.]+s \(reconcile [0-9.]+ snapshot", caplog.text)
    r = Client().get("/healthz/scheduler")
    assert r.status_code == 200 and r.json()["status"] == "ok", r.json()
    assert r.json()["stale_after_seconds"] == 20 * 3.0
    text = scrape()
    stamp = next(float(line.split()[1]) for line in text.splitlines()
                 if line.startswith("fairq_cycle_last_success_timestamp_seconds "))
    assert before <= stamp <= time.time()
    assert "fairq_cycle_failures_total 1.0" in text
    # What /healthz/scheduler reads as "behind", for FairqSchedulerBehind: one cycle just
    # ended, so the longest gap is the time since it, far under the 5 x 3 s limit.
    gap = next(float(line.split()[1]) for line in text.splitlines()
               if line.startswith("fairq_cycle_longest_gap_seconds "))
    assert 0 <= gap < 15
    assert "fairq_cycle_behind_after_seconds 15.0" in text


def test_the_scheduler_is_unhealthy_once_its_last_success_is_older_than_the_limit(
        world: World) -> None:
    from queueing.selectors.metrics import scheduler_health
    from queueing.tasks import scheduler_cycle_task

    scheduler_cycle_task()
    now = time.time()
    assert scheduler_health(now=now + 14)["healthy"]
    assert scheduler_health(now=now + 16)["status"] == "behind"
    assert scheduler_health(now=now + 61)["status"] == "stale"
    with override_settings(FAIRQ_SCHEDULER_STALE_CYCLES=100, FAIRQ_SCHEDULER_BEHIND_CYCLES=100):
        assert scheduler_health(now=now + 299)["healthy"]


def test_cycles_that_fall_behind_their_interval_make_the_scheduler_unhealthy(
        world: World) -> None:
    """Cycles that still succeed, but further apart than FAIRQ_SCHEDULER_BEHIND_CYCLES
    intervals (a worker busy with other work), answer 503 "behind", though the last one
    just ended, until that pause is older than the stale window; 200 again once cycles
    kept their interval that long. Real cycles, real clock (a 0.2 s interval: behind
    after 1 s, the window and stale 4 s)."""
    from queueing.tasks import scheduler_cycle_task

    with override_settings(FAIRQ_CYCLE_INTERVAL_SECONDS=0.2):
        scheduler_cycle_task()
        scheduler_cycle_task()
        r = Client().get("/healthz/scheduler")
        assert r.status_code == 200 and r.json()["status"] == "ok", r.json()
        time.sleep(1.3)
        scheduler_cycle_task()  # one cycle 1.3 s after the previous: 6.5 intervals
        r = Client().get("/healthz/scheduler")
        body = r.json()
        assert r.status_code == 503 and body["status"] == "behind", body
        assert body["last_success_age_seconds"] < 1.0 and body["longest_gap_seconds"] >= 1.3
        assert body["behind_after_seconds"] == 5 * 0.2
        scheduler_cycle_task()  # on time again, and a burst of cycles: still behind
        scheduler_cycle_task()
        assert Client().get("/healthz/scheduler").json()["status"] == "behind"
        paused_until = time.monotonic()
        while time.monotonic() < paused_until + 4.2:  # a stale window of cycles on time
            scheduler_cycle_task()
            time.sleep(0.1)
        r = Client().get("/healthz/scheduler")
        assert r.status_code == 200 and r.json()["status"] == "ok", r.json()
        time.sleep(1.2)  # no cycle for 6 intervals
        r = Client().get("/healthz/scheduler")
        assert r.status_code == 503 and r.json()["status"] == "behind", r.json()


def test_isolated_jobs_are_counted(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from queueing.tasks import scheduler_cycle_task

    bad = submit(world)
    poison_admission(monkeypatch, bad, ValueError("odd"))
    scheduler_cycle_task()
    text = scrape()
    assert "fairq_cycle_job_errors_total 1.0" in text
    assert "fairq_cycle_failures_total 0.0" in text
    assert Client().get("/healthz/scheduler").status_code == 200


def test_a_kubernetes_termination_message_with_a_nul_byte_is_saved_clean(world: World) -> None:
    """The Kubernetes path: the backend's own `workload_status` of a failed pod whose
    termination message holds NUL and whose exit code is out of range, as the reconcile
    gets it. It raised DataError in every cycle before."""
    from queueing.backends.k8s_manifest import L_ATTEMPT, L_JOB_ID, workload_status

    t0 = timezone.now()
    bad = submit(world, env={"FAIRQ_SIM_SECONDS": "100"})
    good = submit(world, world.outsider, team="nlp", env={"FAIRQ_SIM_SECONDS": "10"})
    cluster = HostileCluster(SimulatedCluster.from_spec("2x8xh100"))
    stamp = (t0 + timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def k8s_failed(s: WorkloadStatus) -> list[Any]:
        job = {"metadata": {"name": s.name, "namespace": "fairq-vision",
                            "labels": {L_JOB_ID: str(s.job_id), L_ATTEMPT: str(s.attempt)}},
               "spec": {"backoffLimit": 0},
               "status": {"conditions": [{"type": "Failed", "status": "True",
                                          "reason": "BackoffLimitExceeded"}]}}
        pod = {"spec": {"nodeName": "gpu-node-1"}, "status": {
            "phase": "Failed", "containerStatuses": [{"state": {"terminated": {
                "exitCode": 2**40, "reason": "Error", "startedAt": stamp, "finishedAt": stamp,
                "message": "Traceback\x00\x00 (most recent call last)\x1b[0m"}}}]}}
        status = workload_status(job, [pod], now=t0 + timedelta(seconds=6))
        assert status is not None and "\x00" in status.reason
        return [status]

    cluster.rewrite[bad] = k8s_failed
    run(cluster, t0, 0, 1, 11, 12)
    assert Job.objects.get(pk=good).status == "SUCCEEDED"
    job = Job.objects.get(pk=bad)
    assert job.status == "FAILED" and job.exit_code == 2**31 - 1
    assert last_reason(bad) == "exit code 1099511627776 (Error): Traceback (most recent call " \
        "last)[0m" == job.message


# R9 off: submitted at the wall clock, cycles at chosen instants; the preemption
# it needs does not wait on how long the submits took (conftest no_r9).
@pytest.mark.usefixtures("no_r9")
def test_preemptions_that_raise_are_skipped_and_admissions_still_commit(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    for i in range(2):  # vision fills both h100 nodes with low-tier jobs
        submit(world, name=f"fill-{i}", tier="low", gpus=8, env={"FAIRQ_SIM_SECONDS": "5000"})
    scheduler_cycle(now=t0)
    submit(world, world.outsider, team="nlp", tier="high", gpus=8)  # would preempt
    a100 = submit(world, world.outsider, team="nlp", gpu_type="a100", gpus=1)

    def broken(**kwargs: Any) -> Any:
        raise LookupError("odd victim")

    monkeypatch.setattr(sched, "preemptions_apply", broken)
    r = scheduler_cycle(now=t0 + timedelta(seconds=100))
    assert r.plan is not None and r.plan.preemptions
    assert r.admitted == [a100] and r.preempted == []
    assert Job.objects.get(pk=a100).status == "ADMITTED"
