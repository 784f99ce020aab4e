"""Several clusters on two real control planes at once: `alpha` (the session's first plane: two
h100 nodes and an a100 node, cost rank 0) and `beta` (the second: an h100 and an l40s
node, cost rank 10), both `Cluster` rows of kind kubernetes under one fair share.

- Rules K1-K3: each job lands in exactly one cluster, by the rule: h100 in alpha (the
  lower cost rank), l40s in beta (only there), an h100 job pinned to beta in beta; each
  plane holds only its own jobs' Kubernetes Jobs.
- Rule K5: alpha's apiserver frozen (SIGSTOP) for longer than the grace: its running job
  is requeued with reason `cluster_unreachable` and runs again in beta, where it fits;
  when alpha answers again, the stale attempt's Job there is stopped, attempt 1 is
  charged once, and nothing runs twice.
- Rule K8: alpha disabled under a running job: the job runs on there to its end (its
  Job not deleted), new work goes to beta, and alpha is recorded drained.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.envtest.test_k8s_backend import (
    ApiException,
    Kube,
    _empty_namespace,
    job,
    submit,
    wait,
)

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]

TEAMS = ("vision", "nlp", "speech")


@dataclass
class Two:
    alpha: Kube
    beta: Kube
    rows: dict[str, Any]

    def planes(self) -> dict[str, Kube]:
        return {"alpha": self.alpha, "beta": self.beta}

    def k8s_jobs(self, pk: int, *, only: str = "") -> dict[str, list[str]]:
        """The fairq Jobs of job `pk` per cluster (names; deleting ones left out), in
        every cluster or `only` one."""
        out: dict[str, list[str]] = {}
        for name, kube in self.planes().items():
            if only and name != only:
                continue
            resp = kube.batch.list_namespaced_job(
                kube.ns("vision"), _preload_content=False, _request_timeout=10,
                label_selector=f"app.kubernetes.io/managed-by=fairq,fairq.io/job-id={pk}")
            out[name] = sorted(j["metadata"]["name"] for j in json.loads(resp.data)["items"]
                               if not j["metadata"].get("deletionTimestamp"))
        return out


@pytest.fixture
def two(k8s_control_plane: Any, k8s_second_control_plane: Any, settings: Any,
        world: Any) -> Iterator[Two]:
    from kubernetes import client

    from queueing.backends.kubernetes import KubernetesBackend
    from queueing.composition import get_backend, reset_backends
    from queueing.models import Cluster, GpuType
    from queueing.services.provisioning import cluster_provisioners, sync_cluster
    from tests.factories import GpuTypeFactory

    prefix = f"k{uuid.uuid4().hex[:6]}-"
    settings.FAIRQ_CLUSTER_BACKEND = "kubernetes"
    settings.FAIRQ_KUBECONFIG = str(k8s_control_plane.kubeconfig_path)
    settings.FAIRQ_KUBE_NAMESPACE_PREFIX = prefix
    settings.FAIRQ_K8S_RESYNC_SECONDS = 30
    settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS = 5
    settings.FAIRQ_PREEMPTION_TERMINATION_GRACE_SECONDS = 2
    settings.FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS = 12
    GpuType.objects.filter(slug="h100").update(node_labels={"fairq.io/gpu-type": "h100"})
    GpuType.objects.filter(slug="a100").update(node_labels={"fairq.io/gpu-type": "a100"})
    GpuTypeFactory(slug="l40s", node_labels={"fairq.io/gpu-type": "l40s"})
    rows = {
        "alpha": Cluster.objects.create(name="alpha", backend="kubernetes", cost_rank=0,
                                        kubeconfig=str(k8s_control_plane.kubeconfig_path),
                                        labels={"site": "onprem"}),
        "beta": Cluster.objects.create(name="beta", backend="kubernetes", cost_rank=10,
                                       kubeconfig=str(k8s_second_control_plane.kubeconfig_path),
                                       labels={"site": "cloud"}),
    }
    reset_backends()
    provisioners = dict(cluster_provisioners())
    assert set(provisioners) == {"alpha", "beta"}, "one provisioner per Kubernetes cluster"
    kubes: dict[str, Kube] = {}
    apis = []
    for name, plane in (("alpha", k8s_control_plane), ("beta", k8s_second_control_plane)):
        backend = get_backend(rows[name])
        assert isinstance(backend, KubernetesBackend)
        sync_cluster(provisioners[name])
        backend.wait_synced(30)
        api = plane.api_client()
        apis.append(api)
        kubes[name] = Kube(backend, client.CoreV1Api(api), client.BatchV1Api(api), prefix)
    try:
        yield Two(kubes["alpha"], kubes["beta"], rows)
    finally:
        for kube in kubes.values():
            kube.backend.close()
        reset_backends()
        for kube in kubes.values():
            for team in TEAMS:
                try:
                    _empty_namespace(kube, kube.ns(team))
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        for api in apis:
            api.close()


def _running(pk: int) -> Any:
    j = job(pk)
    return j if j.status == "RUNNING" else None


def test_k1_k2_k3_each_job_runs_in_one_cluster_chosen_by_the_rule(two: Two, world: Any) -> None:
    from queueing.models import Job

    h100 = submit(world, gpus=8, gpu_type="h100", env={"FAIRQ_SIM_SECONDS": "4"})
    l40s = submit(world, gpus=8, gpu_type="l40s", env={"FAIRQ_SIM_SECONDS": "4"})
    pinned = submit(world, gpus=8, gpu_type="h100", env={"FAIRQ_SIM_SECONDS": "4"})
    Job.objects.filter(pk=pinned).update(requested_cluster=two.rows["beta"])  # rule K3

    wait(lambda: all(_running(pk) for pk in (h100, l40s, pinned)), timeout=90,
                 what="the three jobs RUNNING")
    where = {pk: job(pk).cluster.name for pk in (h100, l40s, pinned)}
    assert where == {h100: "alpha", l40s: "beta", pinned: "beta"}
    # Stored unqualified: the node names each cluster knows.
    assert set(job(h100).placement) <= {"gpu-h100-0", "gpu-h100-1"}
    assert job(l40s).placement == ["gpu-b-l40s-0"]
    assert job(pinned).placement == ["gpu-b-h100-0"]
    # Each plane holds only its own jobs' Kubernetes Jobs.
    assert two.k8s_jobs(h100) == {"alpha": [f"fq-{h100}-1"], "beta": []}
    assert two.k8s_jobs(l40s) == {"alpha": [], "beta": [f"fq-{l40s}-1"]}
    assert two.k8s_jobs(pinned) == {"alpha": [], "beta": [f"fq-{pinned}-1"]}
    wait(lambda: all(job(pk).status == "SUCCEEDED" for pk in (h100, l40s, pinned)),
                 timeout=90, what="the three jobs SUCCEEDED")


def test_k5_a_cluster_down_longer_than_the_grace_requeues_its_job_to_the_other_once(
        two: Two, world: Any, k8s_control_plane: Any) -> None:
    from queueing.models import Cluster, JobEvent, UsageRecord

    pk = submit(world, gpus=8, gpu_type="h100")  # runs until stopped
    wait(lambda: _running(pk), timeout=60, what="the job RUNNING")
    assert job(pk).cluster.name == "alpha" and job(pk).attempt == 1

    with k8s_control_plane.frozen("kube-apiserver"):
        down_at = time.monotonic()
        since = wait(lambda: Cluster.objects.get(name="alpha").unreachable_since,
                             timeout=30, what="alpha counted unreachable")
        # Inside the grace the job is kept where it was: not requeued, not failed.
        assert job(pk).status == "RUNNING" and job(pk).attempt == 1
        assert JobEvent.objects.filter(job_id=pk, kind="cluster_unreachable").exists()
        moved = wait(lambda: (j := job(pk)).attempt == 2 and j.status == "RUNNING"
                             and j, timeout=90, what="the job RUNNING again, in beta")
        assert time.monotonic() - down_at >= 12, "requeued only after the grace"
        assert moved.cluster.name == "beta" and moved.placement == ["gpu-b-h100-0"]
        assert JobEvent.objects.filter(job_id=pk, to_status="QUEUED",
                                       data__ended_how="cluster_unreachable").exists()
        assert two.k8s_jobs(pk, only="beta") == {"beta": [f"fq-{pk}-2"]}

    # alpha answers again: the stale attempt's Job there is stopped, nothing runs twice.
    wait(lambda: Cluster.objects.get(name="alpha").unreachable_since is None,
                 timeout=60, what="alpha reachable again")
    wait(lambda: two.k8s_jobs(pk)["alpha"] == [], timeout=90,
                 what="attempt 1's Job stopped in alpha")
    assert two.k8s_jobs(pk) == {"alpha": [], "beta": [f"fq-{pk}-2"]}
    now = job(pk)
    assert now.status == "RUNNING" and now.attempt == 2 and now.cluster.name == "beta"
    first = UsageRecord.objects.filter(job_id=pk, attempt=1)
    assert first.count() == 1, "attempt 1 charged once"
    # Charged up to when alpha was last seen, not for the time it could not be read.
    charged = first.get()
    assert charged.gpu_seconds > 0
    assert charged.end <= since
    attempts = world.client(world.member).get(f"/api/v1/jobs/{pk}/").json()["attempts"]
    assert [(a["attempt"], a["ended_how"]) for a in attempts] == [
        (1, "cluster_unreachable"), (2, "running")]


def test_k8_a_job_on_a_disabled_cluster_keeps_running_its_job_is_not_deleted_then_it_drains(
        two: Two, world: Any) -> None:
    """Rule K8 on real control planes: alpha disabled under a running job. Past
    reconcile's 15 s grace for missing workloads the job still runs there, attempt 1, its
    Kubernetes Job in place; a new h100 job goes to beta though alpha has a free h100
    node, which the API still shows (alpha's real capacity and use); the job's end is
    seen (SUCCEEDED, charged) and alpha is recorded drained."""
    from queueing.models import Cluster, UsageRecord
    from queueing.services.scheduler import scheduler_cycle

    pk = submit(world, gpus=8, gpu_type="h100", env={"FAIRQ_SIM_SECONDS": "45"})
    wait(lambda: _running(pk), timeout=60, what="the job RUNNING")
    assert job(pk).cluster.name == "alpha"

    r = world.client(world.staff).patch("/api/v1/clusters/alpha/", {"enabled": False},
                                        format="json")
    assert r.status_code == 200, r.content
    assert (r.json()["state"], r.json()["running_jobs"]) == ("draining", 1)
    newcomer = submit(world, gpus=8, gpu_type="h100", env={"FAIRQ_SIM_SECONDS": "4"})
    until = time.monotonic() + 20
    while time.monotonic() < until:
        scheduler_cycle()
        time.sleep(0.5)

    kept = job(pk)
    assert (kept.status, kept.attempt, kept.cluster.name) == ("RUNNING", 1, "alpha")
    assert two.k8s_jobs(pk) == {"alpha": [f"fq-{pk}-1"], "beta": []}
    placed = job(newcomer)
    assert placed.cluster.name == "beta" and placed.placement == ["gpu-b-h100-0"]
    assert two.k8s_jobs(newcomer)["alpha"] == []
    assert Cluster.objects.get(name="alpha").drained_at is None
    # While it drains, alpha shows its real h100s and the job's use of them (the plan
    # offered its free node to no one: the newcomer went to beta).
    body = world.client(world.member).get("/api/v1/clusters/alpha/").json()
    h100 = {g["gpu_type"]: g for g in body["gpu_types"]}["h100"]
    assert (body["state"], h100["capacity"], h100["free"], h100["held_by_jobs"]) == (
        "draining", 16, 8, 8)

    wait(lambda: job(pk).status == "SUCCEEDED", timeout=90, what="the job SUCCEEDED in alpha")
    assert UsageRecord.objects.filter(job_id=pk, attempt=1).count() == 1
    wait(lambda: Cluster.objects.get(name="alpha").drained_at, timeout=30,
         what="alpha recorded drained")
    body = world.client(world.member).get("/api/v1/clusters/alpha/").json()
    assert (body["state"], body["running_jobs"]) == ("drained", 0)
