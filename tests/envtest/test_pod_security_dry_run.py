"""Pod lockdown against a real API server (Kubernetes 1.20): the locked-down Job and the
Pod Security labelled namespace are valid objects (server-side dry run validates every
field and keeps it: seccompProfile is a field since 1.19), and the backend relabels a
team's namespace when the team's run_as_non_root changes. PSA itself is not enforced
before 1.23, so the labels are checked as stored, not as enforced. No database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.envtest.cluster import envtest_required

if envtest_required():
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
else:
    client = pytest.importorskip("kubernetes.client")
    ApiException = pytest.importorskip("kubernetes.client.exceptions").ApiException

from tests.test_k8s_manifest import spec

pytestmark = pytest.mark.k8s

PSA = "pod-security.kubernetes.io"


def _container_sc(job: Any) -> Any:
    [c] = job.spec.template.spec.containers
    return c.security_context


@pytest.mark.parametrize("non_root", [True, False])
def test_the_locked_down_job_is_valid_and_kept_by_the_api_server(
        k8s_api_client: Any, k8s_namespace: str, non_root: bool) -> None:
    from queueing.backends.k8s_manifest import ManifestOptions, job_manifest

    body = job_manifest(spec(run_as_non_root=non_root), ManifestOptions(namespace=k8s_namespace))
    batch = client.BatchV1Api(k8s_api_client)
    stored = batch.create_namespaced_job(k8s_namespace, body, dry_run="All")
    sc = _container_sc(stored)
    assert sc.capabilities.drop == ["ALL"] and not sc.capabilities.add
    assert sc.seccomp_profile.type == "RuntimeDefault"
    assert sc.allow_privilege_escalation is False and sc.privileged is False
    assert sc.run_as_non_root is (True if non_root else None)
    # The dry run validates: the same Job with a seccomp type the server does not know
    # is refused, so the acceptance above means something.
    bad = job_manifest(spec(run_as_non_root=non_root), ManifestOptions(namespace=k8s_namespace))
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["seccompProfile"] = {
        "type": "Bogus"}
    with pytest.raises(ApiException) as refused:
        batch.create_namespaced_job(k8s_namespace, bad, dry_run="All")
    assert refused.value.status == 422


@pytest.mark.parametrize(("non_root", "level"), [(True, "restricted"), (False, "baseline")])
def test_the_labelled_namespace_is_valid(k8s_api_client: Any, non_root: bool, level: str) -> None:
    from queueing.backends.k8s_manifest import PSA_VERSION, namespace_manifest

    body = namespace_manifest(f"dry-{uuid.uuid4().hex[:8]}", "team", run_as_non_root=non_root)
    stored = client.CoreV1Api(k8s_api_client).create_namespace(body, dry_run="All")
    assert stored.metadata.labels[f"{PSA}/enforce"] == level
    assert stored.metadata.labels[f"{PSA}/enforce-version"] == PSA_VERSION


@pytest.fixture
def backend(k8s_control_plane: Any, k8s_api_client: Any) -> Iterator[Any]:
    from queueing.backends.kubernetes import KubernetesBackend, api_client_from_config

    prefix = f"p{uuid.uuid4().hex[:6]}-"
    b = KubernetesBackend(api_client_from_config(kubeconfig=str(k8s_control_plane.kubeconfig_path)),
                          namespace_prefix=prefix)
    try:
        yield b
    finally:
        b.close()
        core, batch = client.CoreV1Api(k8s_api_client), client.BatchV1Api(k8s_api_client)
        try:
            batch.delete_collection_namespaced_job(f"{prefix}vision",
                                                   propagation_policy="Background")
            core.delete_collection_namespaced_pod(f"{prefix}vision", grace_period_seconds=0)
            core.delete_namespace(f"{prefix}vision")
        except ApiException as exc:
            if exc.status != 404:
                raise


def test_the_namespace_label_follows_the_teams_setting(backend: Any, k8s_api_client: Any) -> None:
    core = client.CoreV1Api(k8s_api_client)
    ns = backend.provisioner.ensure_namespace("vision", run_as_non_root=True)

    def level() -> str:
        return str(core.read_namespace(ns).metadata.labels[f"{PSA}/enforce"])

    assert level() == "restricted"
    # The team now runs as root: its next submit relabels the namespace before the Job
    # is created (a restricted namespace would refuse its pods).
    job_name = f"fq-{900000 + uuid.uuid4().int % 1000}-1"
    backend.submit(spec(name=job_name, job_id=int(job_name.split("-")[1]), team="vision",
                        run_as_non_root=False, placement=()), now=datetime.now(UTC))
    assert level() == "baseline"
    stored = client.BatchV1Api(k8s_api_client).read_namespaced_job(job_name, ns)
    sc = _container_sc(stored)
    assert sc.run_as_non_root is None and sc.capabilities.drop == ["ALL"]
    backend.provisioner.ensure_namespace("vision", run_as_non_root=True)
    assert level() == "restricted"
