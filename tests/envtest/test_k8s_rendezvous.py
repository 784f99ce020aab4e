"""Replicas that rendezvous on the real control plane (Kubernetes 1.20, tests/envtest): a
2-replica job submitted through the REST API becomes one Job per replica and a headless
Service, read back from the API server; each pod has a stable hostname under the Service
and the rendezvous env, `MASTER_ADDR` naming replica 0's host; the endpoints controller
publishes both replicas' hostnames (what cluster DNS serves); a replica failing fails the
attempt with the replica's name and stops the other; cancel leaves no Job, pod or Service.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.envtest.test_k8s_backend import ApiException, Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]


HOLD = "fairq.test/hold"  # a finalizer of the tests' own


def service(kube: Kube, name: str) -> Any:
    try:
        return kube.core.read_namespaced_service(name, kube.ns("vision"))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    [c] = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in c.get("env") or ()}


def test_a_two_replica_job_rendezvous_through_a_headless_service_and_cancel_cleans_up(
    kube: Kube, world: Any,
) -> None:
    pk = submit(world, gpus=4, replicas=2, env={"SEED": "7"})
    name = f"fq-{pk}-1"
    wait(lambda: job(pk).submitted_to_backend_at is not None, what="the job submitted")

    jobs = {j["metadata"]["name"]: j for j in kube.jobs("vision", pk)}
    assert set(jobs) == {name, f"{name}-1"}
    owner = jobs[name]
    assert jobs[f"{name}-1"]["metadata"]["ownerReferences"][0]["uid"] == \
        owner["metadata"]["uid"]
    for i, j in enumerate((jobs[name], jobs[f"{name}-1"])):
        assert j["spec"]["parallelism"] == j["spec"]["completions"] == 1
        assert j["spec"]["backoffLimit"] == 0
        pod_spec = j["spec"]["template"]["spec"]
        assert pod_spec["hostname"] == f"{name}-{i}" and pod_spec["subdomain"] == name

    svc = service(kube, name)
    assert svc is not None and svc.spec.cluster_ip == "None"
    assert svc.spec.publish_not_ready_addresses is True
    assert svc.spec.selector == {"app.kubernetes.io/managed-by": "fairq",
                                 "fairq.io/workload": name}
    assert [p.port for p in svc.spec.ports] == [29500]
    [ref] = svc.metadata.owner_references
    assert (ref.kind, ref.name, ref.uid) == ("Job", name, owner["metadata"]["uid"])

    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING")
    pods = wait(lambda: (lambda ps: ps if len(ps) == 2 else None)(kube.pods("vision", name)),
                what="both replicas' pods")
    by_rank = {env_of(p)["NODE_RANK"]: p for p in pods}
    assert set(by_rank) == {"0", "1"}
    for rank, p in by_rank.items():
        assert p["spec"]["hostname"] == f"{name}-{rank}"
        assert p["spec"]["subdomain"] == name
        assert env_of(p) == {
            "SEED": "7", "FAIRQ_JOB_ID": str(pk), "FAIRQ_ATTEMPT": "1",
            "FAIRQ_STOP_SIGNAL": "SIGTERM",
            "MASTER_ADDR": f"{name}-0.{name}", "MASTER_PORT": "29500",
            "WORLD_SIZE": "2", "NODE_RANK": rank, "NPROC_PER_NODE": "4"}
        assert p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"

    def published() -> set[str]:
        try:
            ep = kube.core.read_namespaced_endpoints(name, kube.ns("vision"))
        except ApiException as exc:
            if exc.status == 404:
                return set()
            raise
        return {a.hostname for s in ep.subsets or () for a in
                [*(s.addresses or ()), *(s.not_ready_addresses or ())]}

    # The endpoints controller publishes each replica under its hostname: what cluster
    # DNS answers for <hostname>.<service>.
    wait(lambda: published() == {f"{name}-0", f"{name}-1"}, cycle=False,
         what="both hostnames in the Service's endpoints")

    r = world.client(world.member).post(f"/api/v1/jobs/{pk}/cancel/")
    assert r.status_code == 200, r.content
    wait(lambda: not kube.jobs("vision", pk) and not kube.pods("vision", name)
         and service(kube, name) is None, timeout=60,
         what="no Job, pod or Service left after cancel")
    assert job(pk).status == "CANCELLED"


def test_a_replica_failing_fails_the_attempt_naming_it_and_stops_the_other(
    kube: Kube, world: Any,
) -> None:
    pk = submit(world, gpus=2, replicas=2,
                env={"FAIRQ_SIM_SECONDS": "2", "FAIRQ_SIM_FAIL_REPLICA": "1",
                     "FAIRQ_SIM_EXIT_CODE": "3"})
    name = f"fq-{pk}-1"
    wait(lambda: job(pk).status == "FAILED", timeout=60, what="the job FAILED")
    done = job(pk)
    assert "replica 1 failed: exit code 3" in done.message, done.message
    assert done.exit_code == 3
    # Replica 0 would wait on its dead peer for ever: the stop deleted it, its Job and
    # the Service.
    wait(lambda: not kube.jobs("vision", pk) and not kube.pods("vision", name)
         and service(kube, name) is None, timeout=60,
         what="the other replica, the Jobs and the Service gone")


def launch(pk: int, replicas: int = 2) -> Any:
    from queueing.backends.base import LaunchSpec

    return LaunchSpec(
        name=f"fq-{pk}-1", job_id=pk, attempt=1, team="vision", tier="normal",
        priority_class_name="", gpu_type="h100", resource_name="nvidia.com/gpu",
        node_labels={"fairq.io/gpu-type": "h100"}, gpus_per_replica=1, replicas=replicas,
        image="registry.invalid/x:1", command=[], args=[], env={}, max_runtime_seconds=None)


def killed_before_companions(kube: Kube, monkeypatch: pytest.MonkeyPatch, pk: int) -> None:
    """Submit `launch(pk)` as a worker killed right after replica 0's Job was created
    would have: that Job only, no Service, no other replica's Job (the retry's to make)."""
    from datetime import UTC, datetime

    from queueing.backends.kubernetes import KubernetesBackend, KubernetesBackendError

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KubernetesBackendError("killed before the companions")

    with monkeypatch.context() as m:
        m.setattr(KubernetesBackend, "_companions", killed)
        with pytest.raises(KubernetesBackendError, match="killed before the companions"):
            kube.backend.submit(launch(pk), now=datetime.now(UTC))


def test_a_submit_cut_short_after_replica_0s_job_is_completed_by_the_retry(
    kube: Kube, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker killed between replica 0's Job and the rest: the retry adopts replica
    0's Job and makes the Service and the other replica's Job, once."""
    from datetime import UTC, datetime

    backend = kube.backend
    pk = 700000 + int(datetime.now(UTC).timestamp()) % 1000
    name = f"fq-{pk}-1"
    killed_before_companions(kube, monkeypatch, pk)
    assert [j["metadata"]["name"] for j in kube.jobs("vision", pk)] == [name]
    assert service(kube, name) is None
    backend.submit(launch(pk), now=datetime.now(UTC))
    backend.submit(launch(pk), now=datetime.now(UTC))  # and again: nothing more
    assert sorted(j["metadata"]["name"] for j in kube.jobs("vision", pk)) == [name,
                                                                            f"{name}-1"]
    assert service(kube, name) is not None
    backend.stop(name, now=datetime.now(UTC))
    wait(lambda: not kube.jobs("vision", pk) and service(kube, name) is None, cycle=False,
         what="the Jobs and the Service gone")


def test_a_service_fairq_did_not_create_under_the_workloads_name_fails_the_attempt(
    kube: Kube,
) -> None:
    """Someone else's Service under the workload's name (it could point the replicas'
    names elsewhere) is never adopted: the attempt fails, the Service is left alone."""
    from datetime import UTC, datetime

    from queueing.backends.base import SubmitRejected

    pk = 710000 + int(datetime.now(UTC).timestamp()) % 1000
    name = f"fq-{pk}-1"
    kube.core.create_namespaced_service(kube.ns("vision"), {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"clusterIP": "None", "selector": {"app": "elsewhere"},
                 "ports": [{"port": 29500}]}})
    with pytest.raises(SubmitRejected, match="fairq did not create it"):
        kube.backend.submit(launch(pk), now=datetime.now(UTC))
    assert service(kube, name).spec.selector == {"app": "elsewhere"}
    kube.backend.stop(name, now=datetime.now(UTC))  # the failed attempt's own Job
    wait(lambda: not kube.jobs("vision", pk), cycle=False, what="the attempt's Job gone")
    assert service(kube, name).spec.selector == {"app": "elsewhere"}  # not fairq's


def test_the_replicas_jobs_and_the_service_are_valid_for_the_api_server(kube: Kube) -> None:
    """Server-side dry run of every object of a 2-replica workload: the API server
    validates each field (hostname, subdomain, the Service) and keeps it."""
    from queueing.backends.k8s_manifest import service_manifest

    spec = launch(720000)
    bodies = kube.backend.manifests(spec)
    for body in bodies:
        stored = kube.batch.create_namespaced_job(kube.ns("vision"), body, dry_run="All")
        pod_spec = stored.spec.template.spec
        assert pod_spec.hostname.startswith(spec.name) and pod_spec.subdomain == spec.name
    svc = kube.core.create_namespaced_service(
        kube.ns("vision"), service_manifest(spec, kube.ns("vision")), dry_run="All")
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses is True


def test_a_service_claiming_the_workloads_job_as_owner_but_routing_elsewhere_fails_it(
    kube: Kube, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Job's uid is no secret (anyone who lists Jobs reads it): a Service under the
    workload's name owned by it but selecting other pods is not adopted either."""
    from datetime import UTC, datetime

    from queueing.backends.base import SubmitRejected

    pk = 730000 + int(datetime.now(UTC).timestamp()) % 1000
    name = f"fq-{pk}-1"
    killed_before_companions(kube, monkeypatch, pk)
    [owner] = kube.jobs("vision", pk)
    kube.core.create_namespaced_service(kube.ns("vision"), {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": name,
             "uid": owner["metadata"]["uid"]}]},
        "spec": {"clusterIP": "None", "selector": {"app": "elsewhere"},
                 "ports": [{"port": 29500}]}})
    with pytest.raises(SubmitRejected, match="fairq did not create it"):
        kube.backend.submit(launch(pk), now=datetime.now(UTC))
    kube.backend.stop(name, now=datetime.now(UTC))


def _endpoint_slices(kube: Kube, name: str) -> list[Any]:
    """The Service's EndpointSlices (discovery.k8s.io/v1beta1 on 1.20, which the
    generated client no longer has: a raw GET)."""
    import json
    from urllib.parse import quote

    api = kube.core.api_client
    resp = api.call_api(
        "GET", f"{api.configuration.host}/apis/discovery.k8s.io/v1beta1/namespaces/"
        f"{kube.ns('vision')}/endpointslices?labelSelector="
        f"{quote(f'kubernetes.io/service-name={name}')}",
        header_params={a["key"]: a["value"]
                       for a in api.configuration.auth_settings().values()})
    resp.read()
    body = json.loads(resp.data)
    assert "items" in body, body
    return list(body["items"])


@pytest.mark.parametrize("how", ["running", "finished", "already being deleted"])
def test_stop_deletes_the_service_first_so_it_is_gone_when_stop_returns(
    kube: Kube, how: str,
) -> None:
    """The Service has a dependent (the EndpointSlice the endpointslice controller makes,
    owned by it): deleted by the garbage collector as a dependent of the Job in foreground
    deletion it would itself wait, listed, for its slice. stop() deletes it first, itself,
    in the background, whatever became of the Jobs: running, finished (kept for their
    logs), or already being deleted."""
    from dataclasses import replace
    from datetime import UTC, datetime

    pk = 740000 + int(datetime.now(UTC).timestamp()) % 1000 + 1000 * len(how)
    name = f"fq-{pk}-1"
    spec = launch(pk)
    if how == "finished":
        spec = replace(spec, env={"FAIRQ_SIM_SECONDS": "0.5"})
    kube.backend.submit(spec, now=datetime.now(UTC))
    wait(lambda: _endpoint_slices(kube, name), cycle=False, what="the Service's EndpointSlice")
    if how == "finished":
        wait(lambda: [p["status"].get("phase") for p in kube.pods("vision", name)]
             == ["Succeeded", "Succeeded"], cycle=False, what="both replicas Succeeded")
        wait(lambda: all((p["status"] or {}).get("phase") == "Succeeded"
                         for p in kube.backend.pods.items()
                         if p["metadata"]["labels"].get("fairq.io/workload") == name),
             cycle=False, what="the watch seeing them")
    else:
        wait(lambda: len([p for p in kube.pods("vision", name)
                          if p["status"].get("phase") == "Running"]) == 2,
             cycle=False, what="both replicas Running")
    if how == "already being deleted":
        # A finalizer of the test's holds the Job in "being deleted" until stop() ran: left
        # to the garbage collector alone it was sometimes gone before the watch saw it so.
        kube.batch.patch_namespaced_job(name, kube.ns("vision"),
                                        {"metadata": {"finalizers": [HOLD]}})
        kube.batch.delete_namespaced_job(name, kube.ns("vision"),
                                         propagation_policy="Foreground")
        wait(lambda: (kube.backend.jobs.get(f"{kube.ns('vision')}/{name}") or {})
             .get("metadata", {}).get("deletionTimestamp"), cycle=False,
             what="the watch seeing the Job being deleted")
    kube.backend.stop(name, now=datetime.now(UTC))
    assert service(kube, name) is None  # at once: no wait
    if how == "already being deleted":
        kube.batch.patch_namespaced_job(name, kube.ns("vision"),  # a JSON patch
                                        [{"op": "remove", "path": "/metadata/finalizers/0"}])
    if how != "finished":
        wait(lambda: not kube.jobs("vision", pk), cycle=False, what="the Jobs gone")
    else:
        kube.backend.stop(name, now=datetime.now(UTC))  # again: nothing more to do
        assert service(kube, name) is None
