"""Sealed Jobs, adoption and refusals on a real control plane (tests/envtest): what fairq adopts
when a Job's name is taken, `sync_cluster` when one object is bad, and the cycle's
creates running concurrently outside any transaction.

Fixtures and helpers are the backend tests' (`kube`, `submit`, `job`, `wait`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import datetime
from typing import Any

import pytest

from tests.envtest import test_k8s_backend
from tests.envtest.test_k8s_backend import ApiException, Kube, job, submit, wait

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]


base_kube = test_k8s_backend.kube  # the fixture, under a name tests here do not use


@pytest.fixture(name="kube")
def _kube(base_kube: Kube) -> Kube:
    """The backend tests' `kube` (a fresh prefix, backend and namespaces per test)."""
    return base_kube


class Unreachable:
    """The backend, with an API server that times out on every create: the cycle admits
    the job and leaves it ADMITTED, not yet submitted (a transient error)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def submit(self, spec: Any, *, now: datetime) -> None:
        raise TimeoutError("the API server did not answer")


def admitted_unsubmitted(kube: Kube, world: Any, **overrides: Any) -> int:
    from queueing.services.scheduler import scheduler_cycle

    pk = submit(world, **overrides)
    result = scheduler_cycle(backend=Unreachable(kube.backend))
    assert pk in result.admitted and pk in result.submit_errors
    assert job(pk).status == "ADMITTED" and job(pk).submitted_to_backend_at is None
    return pk


def foreign_job(kube: Kube, pk: int, *, gpus: int) -> dict[str, Any]:
    """A Job someone else made under fairq's name, with fairq's labels, asking for more
    GPUs than the job was admitted with (on nodes that do not exist, so it stays put)."""
    name = f"fq-{pk}-1"
    labels = {"app.kubernetes.io/managed-by": "fairq", "fairq.io/workload": name,
              "fairq.io/job-id": str(pk), "fairq.io/attempt": "1", "fairq.io/team": "vision",
              "fairq.io/tier": "normal", "fairq.io/gpu-type": "h100"}
    body = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"fairq.io/job-id": str(pk), "fairq.io/attempt": "1"}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": labels},
            "spec": {"restartPolicy": "Never",
                     "nodeSelector": {"fairq.io/gpu-type": "nowhere"},
                     "containers": [{"name": "main", "image": "evil.example/miner:1",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
        }},
    }
    created = kube.batch.create_namespaced_job(kube.ns("vision"), body)
    return {"uid": created.metadata.uid, "name": name}


# --- finding 4: adopt only what fairq created -----------------------------------------------

def test_a_job_someone_else_created_under_the_jobs_name_is_not_adopted_from_the_cache(
    kube: Kube, world: Any,
) -> None:
    from queueing.models import UsageRecord
    from queueing.services.scheduler import scheduler_cycle

    pk = admitted_unsubmitted(kube, world, gpus=1)
    foreign = foreign_job(kube, pk, gpus=8)
    wait(lambda: kube.backend.jobs.get(f"{kube.ns('vision')}/{foreign['name']}"),
         cycle=False, what="the foreign Job in the watch cache")

    result = scheduler_cycle()
    failed = job(pk)
    assert failed.status == "FAILED", (failed.status, result.submit_errors)
    assert "fairq did not create" in failed.message
    assert failed.submitted_to_backend_at is None
    assert not UsageRecord.objects.filter(job_id=pk).exists()


def test_a_409_on_a_job_someone_else_created_is_refused_not_adopted(
    kube: Kube, world: Any,
) -> None:
    from queueing.backends.base import SubmitRejected
    from queueing.composition import kubernetes_backend_from_settings
    from queueing.services.scheduler import launch_spec

    pk = admitted_unsubmitted(kube, world, gpus=1)
    foreign_job(kube, pk, gpus=8)
    # A process whose watches have not started: the create is answered 409.
    fresh = kubernetes_backend_from_settings()
    try:
        with pytest.raises(SubmitRejected, match="fairq did not create"):
            fresh.submit(launch_spec(job(pk)), now=job(pk).admitted_at)
    finally:
        fresh.close()


def test_fairqs_own_job_is_adopted_on_409_from_a_fresh_process(kube: Kube, world: Any) -> None:
    from queueing.composition import kubernetes_backend_from_settings
    from queueing.services.scheduler import launch_spec

    pk = admitted_unsubmitted(kube, world, gpus=1)
    spec = launch_spec(job(pk))
    kube.backend.submit(spec, now=job(pk).admitted_at)
    [first] = kube.jobs("vision", pk)
    fresh = kubernetes_backend_from_settings()
    try:
        fresh.submit(spec, now=job(pk).admitted_at)  # 409: fairq's own, adopted
    finally:
        fresh.close()
    [again] = kube.jobs("vision", pk)
    assert again["metadata"]["uid"] == first["metadata"]["uid"]


def test_a_job_being_deleted_is_not_adopted_the_job_is_requeued_as_a_new_attempt(
    kube: Kube, world: Any,
) -> None:
    from queueing.backends.base import SubmitRequeue
    from queueing.composition import kubernetes_backend_from_settings
    from queueing.models import JobEvent
    from queueing.services.scheduler import launch_spec, scheduler_cycle

    pk = admitted_unsubmitted(kube, world, gpus=1, env={"FAIRQ_SIM_SECONDS": "1"})
    name, ns = f"fq-{pk}-1", kube.ns("vision")
    spec = launch_spec(job(pk))
    # fairq's own Job, on its way out (a finalizer keeps it listed with a deletionTimestamp).
    kube.backend.submit(replace_labels(spec), now=job(pk).admitted_at)
    kube.batch.patch_namespaced_job(name, ns, {"metadata": {"finalizers": ["test.fairq.io/hold"]}})
    kube.batch.delete_namespaced_job(name, ns, propagation_policy="Background")
    try:
        wait(lambda: (kube.backend.jobs.get(f"{ns}/{name}") or {}).get("metadata", {})
             .get("deletionTimestamp"), cycle=False, what="the deletion in the watch cache")
        fresh = kubernetes_backend_from_settings()
        try:
            with pytest.raises(SubmitRequeue, match="being deleted"):
                fresh.submit(spec, now=job(pk).admitted_at)  # 409 path
        finally:
            fresh.close()

        result = scheduler_cycle()  # the watch cache's path
        assert pk in result.requeued
        assert job(pk).attempt == 2 and job(pk).submitted_to_backend_at is None
        assert JobEvent.objects.filter(job_id=pk, to_status="QUEUED",
                                       reason__contains="being deleted").exists()
    finally:
        kube.batch.patch_namespaced_job(name, ns, {"metadata": {"finalizers": None}})
    wait(lambda: job(pk).status == "SUCCEEDED", what="attempt 2 SUCCEEDED")
    assert [j["metadata"]["name"] for j in kube.jobs("vision", pk)] == [f"fq-{pk}-2"]


def replace_labels(spec: Any) -> Any:
    """The same attempt, but on no node: nothing runs before the deletion."""
    from dataclasses import replace

    return replace(spec, node_labels={"fairq.io/gpu-type": "nowhere"})


# --- finding 6: one bad object never stops sync_cluster ---------------------------------------

def test_sync_cluster_reports_a_bad_priority_class_name_and_still_syncs_the_rest(
    kube: Kube, world: Any,
) -> None:
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError
    from kubernetes import client

    from accounts.models import Team
    from queueing.models import Quota, Tier
    from queueing.services.provisioning import sync_cluster

    # Rows written before names were validated (update() skips full_clean and signals).
    Tier.objects.filter(pk=world.low.pk).update(priority_class_name="Fairq_Bad")
    Team.objects.create(slug="Bad_Team", name="bad")
    Team.objects.create(slug="audio", name="audio")
    Quota.objects.filter(team=world.vision, gpu_type=world.a100).update(borrowing_limit=0)

    report = sync_cluster(kube.backend.provisioner)
    failed = {(f["kind"], f["name"]): f["error"] for f in report["failed"]}
    assert "422" in failed[("PriorityClass", "Fairq_Bad")]
    assert "DNS-1123" in failed[("Namespace", kube.ns("Bad_Team"))]
    assert kube.ns("audio") in report["namespaces"]
    kube.core.read_namespace(kube.ns("audio"))
    quota = kube.core.read_namespaced_resource_quota("fairq-gpus", kube.ns("vision"))
    assert quota.spec.hard == {"requests.nvidia.com/gpu": "24"}
    sched_names = {p.metadata.name for p in
                   client.SchedulingV1Api(kube.backend.api).list_priority_class().items}
    assert world.high.priority_class_name in sched_names

    out = StringIO()
    with pytest.raises(CommandError, match="Fairq_Bad"):
        call_command("sync_cluster", stdout=out)
    assert "Fairq_Bad" in out.getvalue() and kube.ns("audio") in out.getvalue()
    with contextlib.suppress(ApiException):
        kube.core.delete_namespace(kube.ns("audio"))


# --- finding 8: concurrent creates, no transaction across API calls -------------------------

def test_the_cycle_creates_jobs_concurrently_outside_any_transaction(
    kube: Kube, world: Any,
) -> None:
    from django.db import connections

    from queueing.services.scheduler import scheduler_cycle

    kube.backend.submit_concurrency = 6  # FAIRQ_K8S_SUBMIT_CONCURRENCY
    main_connection = connections["default"]
    lock = threading.Lock()
    in_flight = [0]
    seen: dict[str, Any] = {"max": 0, "in_atomic": [], "threads": set()}

    class Slow:
        """Each create takes 0.3 s of API server time."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def submit(self, spec: Any, *, now: datetime) -> None:
            with lock:
                in_flight[0] += 1
                seen["max"] = max(seen["max"], in_flight[0])
                seen["in_atomic"].append(main_connection.in_atomic_block)
                seen["threads"].add(threading.get_ident())
            try:
                time.sleep(0.3)
                self.inner.submit(spec, now=now)
            finally:
                with lock:
                    in_flight[0] -= 1

    pks = [submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "1"}) for _ in range(12)]
    t0 = time.perf_counter()
    result = scheduler_cycle(backend=Slow(kube.backend))
    elapsed = time.perf_counter() - t0
    assert sorted(result.admitted) == sorted(pks) and not result.submit_errors
    assert all(job(pk).submitted_to_backend_at is not None for pk in pks)
    assert seen["max"] == 6, seen["max"]  # bounded by the setting, and reached
    assert not any(seen["in_atomic"])  # no transaction open while the API is called
    assert elapsed < 12 * 0.3 / 2, elapsed
    assert sorted(j["metadata"]["name"] for j in kube.jobs("vision")) == sorted(
        f"fq-{pk}-1" for pk in pks)
    wait(lambda: all(job(pk).status == "SUCCEEDED" for pk in pks), timeout=60,
         what="every job SUCCEEDED")


def test_the_backends_connection_pool_holds_its_submit_concurrency_and_the_watches(
    kube: Kube, settings: Any,
) -> None:
    from queueing.composition import kubernetes_backend_from_settings

    settings.FAIRQ_K8S_SUBMIT_CONCURRENCY = 24
    backend = kubernetes_backend_from_settings()
    try:
        assert backend.submit_concurrency == 24
        pool = backend.api.rest_client.pool_manager.connection_pool_kw
        assert pool["maxsize"] >= 24 + 4  # the creates in flight, and four watches
    finally:
        backend.close()
