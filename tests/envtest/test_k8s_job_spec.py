"""Multi-replica job specs on a real control plane (Kubernetes 1.20, tests/envtest): a 2-replica x
4-GPU job submitted through the REST API with a PVC, a Secret env var, a Secret's files,
cpu/memory, shm, a pull secret, a working dir, labels, annotations and a grace period
becomes one Job per replica whose pod template, and whose pods, read back from the API
server, carry exactly those fields; the PVC and Secrets are the team namespace's own
(created here first), named only by reference."""

from __future__ import annotations

from typing import Any

import pytest

from tests.envtest.test_k8s_backend import Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]


def _team_objects(kube: Kube) -> None:
    """A PVC, two Secrets and a pull secret in the team's namespace (sync_cluster made it).
    The values are never read by fairq: the pods name the Secrets only."""
    ns = kube.ns("vision")
    kube.core.create_namespaced_persistent_volume_claim(ns, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "imagenet"},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Gi"}}}})
    kube.core.create_namespaced_secret(ns, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"},
        "stringData": {"token": "not-a-real-token"}})
    kube.core.create_namespaced_secret(ns, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "wandb"},
        "stringData": {"key": "x"}})
    kube.core.create_namespaced_secret(ns, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "regcred"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": '{"auths": {}}'}})


def test_a_two_replica_job_with_storage_secrets_and_metadata_reaches_its_pods(
    kube: Kube, world: Any,
) -> None:
    _team_objects(kube)
    world.vision.allowed_pvcs = ["imagenet"]
    world.vision.allowed_secrets = ["hf-token", "wandb"]
    world.vision.allowed_pull_secrets = ["regcred"]
    world.vision.save()
    pk = submit(
        world, gpus=4, replicas=2, resources={"cpu": "2", "memory": "8Gi"}, shm_size="1Gi",
        env={"SEED": "7", "FAIRQ_SIM_SECONDS": "60"},
        volumes=[{"name": "data", "pvc": "imagenet", "mount_path": "/data", "read_only": True},
                 {"name": "scratch", "empty_dir": {"size_limit": "10Gi"},
                  "mount_path": "/scratch"}],
        secrets=[{"secret": "hf-token", "key": "token", "env": "HF_TOKEN"},
                 {"secret": "wandb", "mount_path": "/etc/wandb"}],
        image_pull_secret="regcred", working_dir="/workspace", labels={"run": "exp-42"},
        annotations={"git-sha": "3f2c1d"}, termination_grace_seconds=45)
    name = f"fq-{pk}-1"
    wait(lambda: job(pk).submitted_to_backend_at is not None, what="the job submitted")
    jobs = {j["metadata"]["name"]: j for j in kube.jobs("vision", pk)}
    assert set(jobs) == {name, f"{name}-1"}
    pods = wait(lambda: (lambda p: p if len(p) == 2 else None)(kube.pods("vision", name)),
                cycle=False, what="both replicas' pods")
    expected_resources = {"nvidia.com/gpu": "4", "cpu": "2", "memory": "8Gi"}
    specs = [j["spec"]["template"]["spec"] for j in jobs.values()] + [p["spec"] for p in pods]
    for pod_spec in specs:
        [container] = pod_spec["containers"]
        assert container["resources"] == {"limits": expected_resources,
                                          "requests": expected_resources}
        assert container["workingDir"] == "/workspace"
        env = {e["name"]: e for e in container["env"]}
        assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "hf-token", "key": "token"}}}
        assert env["SEED"] == {"name": "SEED", "value": "7"}
        assert "not-a-real-token" not in str(pod_spec)
        # The API server adds a default mode and the service-account token is off, so
        # compare the fields fairq wrote.
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        assert set(volumes) == {"dshm", "data", "scratch", "fq-secret-1"}
        assert volumes["data"]["persistentVolumeClaim"] == {"claimName": "imagenet",
                                                            "readOnly": True}
        assert volumes["scratch"]["emptyDir"] == {"sizeLimit": "10Gi"}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}
        assert volumes["fq-secret-1"]["secret"]["secretName"] == "wandb"
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert set(mounts) == {"/dev/shm", "/data", "/scratch", "/etc/wandb"}
        assert mounts["/data"]["readOnly"] is True and mounts["/etc/wandb"]["readOnly"] is True
        assert not any("hostPath" in v for v in pod_spec["volumes"])
        assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod_spec["terminationGracePeriodSeconds"] == 45
    for obj in [*jobs.values(), *pods]:
        meta = obj["metadata"]
        assert meta["labels"]["user.fairq.io/run"] == "exp-42"
        assert meta["annotations"]["user.fairq.io/git-sha"] == "3f2c1d"
        assert meta["namespace"] == kube.ns("vision")
    # The job's label filters the API's list, as the CLI uses it.
    r = world.client(world.member).get("/api/v1/jobs/?label=run=exp-42")
    assert [j["id"] for j in r.json()["results"]] == [pk]
