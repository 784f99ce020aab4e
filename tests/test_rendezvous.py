"""Replicas that rendezvous. The env names fairq sets (the rendezvous,
the job id and attempt) are refused from users at submit (400 on `env`); the simulated
cluster runs replicas all or nothing (`FAIRQ_SIM_FAIL_REPLICA`: one replica failing fails
the job, with a reason naming it). The Kubernetes manifests are tested in
tests/test_k8s_manifest.py, the real control plane in tests/envtest/test_k8s_rendezvous.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing import validation as v
from queueing.backends.base import LaunchSpec, Phase
from queueing.backends.simulated import SimulatedCluster
from queueing.models import Job
from queueing.services.logs import split_replicas
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body

T0 = datetime(2026, 1, 1, 12, 0).astimezone()

SET_BY_FAIRQ = ["MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "NPROC_PER_NODE",
                "FAIRQ_JOB_ID", "FAIRQ_ATTEMPT", "FAIRQ_STOP_SIGNAL", "FAIRQ_CHECKPOINT_URL",
                "FAIRQ_CHECKPOINT_TOKEN"]


def launch(**overrides: Any) -> LaunchSpec:
    values: dict[str, Any] = {
        "name": "fq-7-1", "job_id": 7, "attempt": 1, "team": "vision", "tier": "normal",
        "priority_class_name": "fairq-normal", "gpu_type": "h100",
        "resource_name": "nvidia.com/gpu", "node_labels": {}, "gpus_per_replica": 4,
        "replicas": 2, "image": "ghcr.io/acme/train:1", "command": [], "args": [],
        "env": {"FAIRQ_SIM_SECONDS": "10"}, "max_runtime_seconds": None,
    }
    values.update(overrides)
    return LaunchSpec(**values)


# --- reserved names ----------------------------------------------------------------------

@pytest.mark.parametrize("name", SET_BY_FAIRQ)
def test_names_fairq_sets_are_reserved(name: str) -> None:
    assert v.env_name_reserved(name)


@pytest.mark.django_db
@pytest.mark.parametrize("name", SET_BY_FAIRQ)
def test_the_api_refuses_a_users_own_rendezvous_and_attempt_env(world: World,
                                                                 name: str) -> None:
    r = world.client(world.member).post("/api/v1/jobs/",
                                        job_body(replicas=2, env={name: "1"}), format="json")
    assert r.status_code == 400, r.content
    [message] = r.json()["error"]["fields"]["env"]
    assert name in message
    assert "MASTER_ADDR" in message and "NODE_RANK" in message  # the error says the set
    assert not Job.objects.exists()


# --- FAIRQ_SIM_FAIL_REPLICA -------------------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "x", "1.5", "1024", "99999", ""])
def test_sim_fail_replica_must_be_a_replica_index(value: str) -> None:
    with pytest.raises(ValueError, match="FAIRQ_SIM_FAIL_REPLICA"):
        v.sim_fail_replica(value)
    assert v.sim_fail_replica(" 3 ") == 3


@pytest.mark.django_db
def test_the_api_refuses_a_bad_sim_fail_replica_and_takes_a_good_one(world: World) -> None:
    client = world.client(world.member)
    r = client.post("/api/v1/jobs/", job_body(replicas=2, env={"FAIRQ_SIM_FAIL_REPLICA": "x"}),
                    format="json")
    assert r.status_code == 400, r.content
    assert "FAIRQ_SIM_FAIL_REPLICA" in " ".join(r.json()["error"]["fields"]["env"])
    r = client.post("/api/v1/jobs/", job_body(replicas=2, env={"FAIRQ_SIM_FAIL_REPLICA": "1"}),
                    format="json")
    assert r.status_code == 201, r.content


def test_one_replica_failing_fails_the_simulated_workload_naming_the_replica() -> None:
    cluster = SimulatedCluster.from_spec("2x8xh100")
    cluster.submit(launch(env={"FAIRQ_SIM_SECONDS": "10", "FAIRQ_SIM_FAIL_REPLICA": "1",
                               "FAIRQ_SIM_EXIT_CODE": "3"}), now=T0)
    [running] = cluster.statuses(now=T0 + timedelta(seconds=5))
    assert running.phase == Phase.RUNNING
    [s] = cluster.statuses(now=T0 + timedelta(seconds=10))
    assert s.phase == Phase.FAILED and s.exit_code == 3
    assert s.reason == "replica 1 failed: exit code 3"
    assert sum(n.allocated for n in cluster.nodes()) == 0  # the other replica stopped too
    # Each replica's own log (headed as the Kubernetes backend heads each pod's) says what
    # happened to it.
    logs = split_replicas(cluster.logs("fq-7-1"))
    assert logs[1].splitlines()[-1].endswith("exited with code 3")
    assert logs[0].splitlines()[-1].endswith("stopped: replica 1 failed")


def test_a_failing_replica_without_an_exit_code_fails_with_1_and_beyond_replicas_none() -> None:
    cluster = SimulatedCluster.from_spec("2x8xh100")
    cluster.submit(launch(env={"FAIRQ_SIM_SECONDS": "1", "FAIRQ_SIM_FAIL_REPLICA": "0"}),
                   now=T0)
    cluster.submit(launch(name="fq-8-1", job_id=8,
                          env={"FAIRQ_SIM_SECONDS": "1", "FAIRQ_SIM_FAIL_REPLICA": "2"}),
                   now=T0)
    by = {s.name: s for s in cluster.statuses(now=T0 + timedelta(seconds=1))}
    assert by["fq-7-1"].phase == Phase.FAILED and by["fq-7-1"].exit_code == 1
    assert by["fq-7-1"].reason == "replica 0 failed: exit code 1"
    assert by["fq-8-1"].phase == Phase.SUCCEEDED  # 2 replicas: index 2 names none


@pytest.mark.django_db
def test_a_job_whose_replica_fails_is_failed_with_the_replicas_reason(world: World) -> None:
    t0 = timezone.now()
    r = world.client(world.member).post("/api/v1/jobs/", job_body(
        replicas=2, gpus=4, env={"FAIRQ_SIM_SECONDS": "10", "FAIRQ_SIM_FAIL_REPLICA": "1"}),
        format="json")
    assert r.status_code == 201, r.content
    cluster = SimulatedCluster.from_spec("2x8xh100")
    for s in (0, 1, 11, 12):
        scheduler_cycle(now=t0 + timedelta(seconds=s), backend=cluster)
    job = Job.objects.get(pk=r.json()["id"])
    assert job.status == "FAILED"
    assert "replica 1 failed" in job.message
    assert sum(n.allocated for n in cluster.nodes()) == 0
