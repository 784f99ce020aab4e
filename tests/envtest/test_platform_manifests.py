"""platform/k8s/fairq.yaml is accepted by a real API server: every object is sent with
server-side dry run, so the server validates every field (apps/v1 Deployments, the
migrate and sync Jobs, the Service, the ConfigMap). No database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.envtest.cluster import envtest_required

if envtest_required():
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
else:
    client = pytest.importorskip("kubernetes.client")
    ApiException = pytest.importorskip("kubernetes.client.exceptions").ApiException

pytestmark = pytest.mark.k8s

PLATFORM = Path(__file__).resolve().parents[2] / "platform" / "k8s"


def _create(api: Any, doc: dict[str, Any], *, dry_run: str | None) -> Any:
    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    ns = doc["metadata"].get("namespace")
    kw = {"dry_run": dry_run} if dry_run else {}
    create = {
        "Namespace": lambda: core.create_namespace(doc, **kw),
        "ConfigMap": lambda: core.create_namespaced_config_map(ns, doc, **kw),
        "Service": lambda: core.create_namespaced_service(ns, doc, **kw),
        "Deployment": lambda: apps.create_namespaced_deployment(ns, doc, **kw),
        "Job": lambda: batch.create_namespaced_job(ns, doc, **kw),
    }
    return create[doc["kind"]]()


def test_every_object_of_fairq_yaml_is_valid_for_the_api_server(k8s_api_client: Any) -> None:
    import yaml

    docs = [d for d in yaml.safe_load_all((PLATFORM / "fairq.yaml").read_text()) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("Deployment") == 3  # web, worker, beat
    assert "Namespace" in kinds and "Service" in kinds and kinds.count("Job") == 2
    # The namespace for real (namespaced dry runs need it), everything else dry-run.
    for doc in docs:
        if doc["kind"] == "Namespace":
            try:
                _create(k8s_api_client, doc, dry_run=None)
            except ApiException as exc:
                if exc.status != 409:
                    raise
    for doc in docs:
        if doc["kind"] != "Namespace":
            created = _create(k8s_api_client, doc, dry_run="All")
            assert created.metadata.name == doc["metadata"]["name"]


def test_the_pods_fairq_runs_as_are_locked_down() -> None:
    import yaml

    docs = [d for d in yaml.safe_load_all((PLATFORM / "fairq.yaml").read_text()) if d]
    for doc in docs:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        spec = doc["spec"]["template"]["spec"]
        for container in spec["containers"]:
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True, doc["metadata"]["name"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
        assert not spec.get("hostNetwork") and not spec.get("hostPID")


def test_the_web_runs_without_cluster_credentials_and_sync_as_the_provisioner() -> None:
    """Issue 11.7: the internet-facing web has no token to show the API server; only the
    one-shot sync Job runs as fairq-provisioner; the worker as fairq-scheduler."""
    import yaml

    docs = {(d["kind"], d["metadata"]["name"]): d
            for d in yaml.safe_load_all((PLATFORM / "fairq.yaml").read_text()) if d}
    web = docs[("Deployment", "fairq-web")]["spec"]["template"]["spec"]
    assert web["automountServiceAccountToken"] is False
    assert web["serviceAccountName"] == "fairq-web"
    assert docs[("Job", "fairq-sync-cluster")]["spec"]["template"]["spec"][
        "serviceAccountName"] == "fairq-provisioner"
    assert docs[("Deployment", "fairq-worker")]["spec"]["template"]["spec"][
        "serviceAccountName"] == "fairq-scheduler"
    for name in ("fairq-beat",):
        assert docs[("Deployment", name)]["spec"]["template"]["spec"][
            "automountServiceAccountToken"] is False
    rbac = [d for d in yaml.safe_load_all((PLATFORM / "rbac.yaml").read_text()) if d]
    web_sa = next(d for d in rbac if d["kind"] == "ServiceAccount"
                  and d["metadata"]["name"] == "fairq-web")
    assert web_sa["automountServiceAccountToken"] is False
    assert not [d for d in rbac if "Binding" in d["kind"]
                and any(s["name"] == "fairq-web" for s in d.get("subjects") or ())]


def test_docker_compose_runs_the_three_roles_on_postgres_and_redis() -> None:
    import yaml

    compose = yaml.safe_load((PLATFORM.parents[1] / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "migrate", "web", "worker", "beat"} <= set(services)
    assert services["worker"]["command"][:3] == ["celery", "-A", "config"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "config", "beat"]
    env = services["web"]["environment"]
    assert env["DATABASE_URL"].startswith("postgres://")
    assert env["REDIS_URL"].startswith("redis://")
