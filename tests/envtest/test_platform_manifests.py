"""The packaged install (platform/k8s: a Kustomize base, `dev` and `prod` overlays) against
the real control plane of the tests:

- every object each overlay renders passes the API server's server-side dry run, sent
  with `kubectl apply --dry-run=server` exactly as docs/deployment.md says to apply it;
- the dev overlay applied for real: web, worker, webhooks, beat, PostgreSQL and Redis Deployments
  become Ready (the fake kubelet runs their pods), the release's migrate Job runs once,
  a re-apply changes nothing, and a second apply with a new image tag upgrades without
  an error from the immutable Jobs: new release Jobs, every Deployment rolled to the tag;
- what the rendered objects promise (probes, init containers, Secrets, locked-down pods,
  least privilege, network policies) checked on the rendered output.

Rendering needs `kubectl` with Kustomize >= 5 (`make kustomize`); without it these tests
skip, unless FAIRQ_REQUIRE_KUSTOMIZE=1 (CI), when they fail. No database.

Two adaptations to Kubernetes 1.20, the version of the tests' control plane, and only in
`for_envtest()`: the PodDisruptionBudget is sent as policy/v1beta1 (policy/v1, which the
manifests use for the clusters of today, arrived in 1.21; the fields used are the same),
and the ServiceMonitor, a CRD of the Prometheus operator, is not sent (checked on its
own below). For the real apply, the pods also tolerate the GPU taint (the tests' only
nodes are tainted GPU nodes) and the Jobs' containers say how long the fake kubelet lets
them "run" (FAIRQ_SIM_SECONDS)."""

from __future__ import annotations

import contextlib
import copy
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.envtest.cluster import GPU_TAINT, envtest_required
from tests.platform_render import OVERLAYS, PLATFORM, kubectl, render

if envtest_required():
    from kubernetes import client
else:
    client = pytest.importorskip("kubernetes.client")

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "fairq-system"


# --- rendering -------------------------------------------------------------------------

def by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs
            if d["kind"] in ("Deployment", "Job")]


def for_envtest(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rendered objects as Kubernetes 1.20 takes them (see the module docstring)."""
    out = []
    for doc in copy.deepcopy(docs):
        if doc["kind"] == "ServiceMonitor":
            continue
        if doc["kind"] == "PodDisruptionBudget":
            assert doc["apiVersion"] == "policy/v1"
            doc["apiVersion"] = "policy/v1beta1"
        out.append(doc)
    return out


def runnable_on_envtest(docs: list[dict[str, Any]], *, job_seconds: float) -> list[dict[str, Any]]:
    """Also: pods tolerate the GPU taint; Jobs' containers finish after `job_seconds`."""
    docs = for_envtest(docs)
    for _, spec in pod_specs(docs):
        spec.setdefault("tolerations", []).append({**GPU_TAINT, "operator": "Equal"})
    for doc in docs:
        if doc["kind"] == "Job":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                c.setdefault("env", []).append(
                    {"name": "FAIRQ_SIM_SECONDS", "value": str(job_seconds)})
    return docs


def apply(kubeconfig: Path, docs: list[dict[str, Any]], *extra: str) -> str:
    out = subprocess.run(
        [kubectl(), "--kubeconfig", str(kubeconfig), "apply", "-f", "-", *extra],
        input=yaml.safe_dump_all(docs), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"kubectl apply {' '.join(extra)} failed:\n{out.stderr}"
    return out.stdout


# --- against the API server --------------------------------------------------------------

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_each_overlay_passes_the_server_side_dry_run(
        overlay: str, k8s_control_plane: Any) -> None:
    docs = for_envtest(render(PLATFORM / "overlays" / overlay))
    kinds = sorted({d["kind"] for d in docs})
    assert {"Namespace", "ConfigMap", "Service", "Deployment", "Job", "Ingress",
            "NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler",
            "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= set(kinds)
    # The namespace for real (the namespaced dry runs need it), everything else dry-run.
    apply(k8s_control_plane.kubeconfig_path, [d for d in docs if d["kind"] == "Namespace"])
    out = apply(k8s_control_plane.kubeconfig_path, docs, "--dry-run=server")
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == len(docs), out
    assert all(x.endswith("(server dry run)") for x in lines), out


def _wait(what: str, check: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.5)


def _rolled_out(apps: Any, name: str, image: str) -> bool:
    d = apps.read_namespaced_deployment(name, NAMESPACE)
    s = d.status
    return bool(
        d.spec.template.spec.containers[0].image == image
        and s.observed_generation == d.metadata.generation
        and (s.updated_replicas or 0) == d.spec.replicas
        and (s.ready_replicas or 0) == d.spec.replicas
        and (s.replicas or 0) == d.spec.replicas)  # the old pods are gone


def test_the_dev_overlay_applied_for_real_becomes_ready_and_upgrades_to_a_new_tag(
        k8s_control_plane: Any, k8s_api_client: Any, tmp_path: Path) -> None:
    # Any: the client's models type every status field as Optional.
    apps: Any = client.AppsV1Api(k8s_api_client)
    batch: Any = client.BatchV1Api(k8s_api_client)
    core: Any = client.CoreV1Api(k8s_api_client)
    kubeconfig = k8s_control_plane.kubeconfig_path
    # The operator's copy of the tree, whose overlay they edit for each release.
    tree = tmp_path / "k8s"
    shutil.copytree(PLATFORM, tree)
    overlay = tree / "overlays" / "dev" / "kustomization.yaml"
    deployments = ("fairq-web", "fairq-worker", "fairq-webhooks", "fairq-beat", "fairq-postgres",
                   "fairq-redis")
    try:
        first = runnable_on_envtest(render(overlay.parent), job_seconds=1)
        out = apply(kubeconfig, first)
        assert "job.batch/fairq-migrate-dev created" in out, out
        for name in deployments:
            image = next(c["image"] for c in by_key(first)[("Deployment", name)]["spec"][
                "template"]["spec"]["containers"])
            _wait(f"{name} ready", lambda n=name, i=image: _rolled_out(apps, n, i))
        for job in ("fairq-migrate-dev", "fairq-sync-cluster-dev"):
            _wait(f"{job} complete",
                  lambda j=job: (batch.read_namespaced_job(j, NAMESPACE).status.succeeded or 0) == 1)
        # The migration ran once: one pod, no retry.
        migrate_pods = core.list_namespaced_pod(NAMESPACE, label_selector="job-name=fairq-migrate-dev").items
        assert len(migrate_pods) == 1

        # The same release again: nothing changes, the finished Jobs are left alone.
        again = apply(kubeconfig, first)
        assert "job.batch/fairq-migrate-dev unchanged" in again, again
        assert "deployment.apps/fairq-web unchanged" in again, again

        # A new release: only the tag is edited.
        text = overlay.read_text()
        assert "newTag: dev}" in text
        overlay.write_text(text.replace("newTag: dev}", "newTag: 1.1.0}"))
        second = runnable_on_envtest(render(overlay.parent), job_seconds=1)
        out = apply(kubeconfig, second)
        assert "job.batch/fairq-migrate-1.1.0 created" in out, out
        assert "job.batch/fairq-sync-cluster-1.1.0 created" in out, out
        assert "deployment.apps/fairq-web configured" in out, out
        for name in ("fairq-web", "fairq-worker", "fairq-webhooks", "fairq-beat"):
            _wait(f"{name} rolled to 1.1.0",
                  lambda n=name: _rolled_out(apps, n, "fairq:1.1.0"))
        _wait("the 1.1.0 migration",
              lambda: (batch.read_namespaced_job("fairq-migrate-1.1.0", NAMESPACE)
                       .status.succeeded or 0) == 1)
        # The previous release's Job is still there, untouched.
        assert batch.read_namespaced_job("fairq-migrate-dev", NAMESPACE).status.succeeded == 1
    finally:
        for name in deployments:
            with contextlib.suppress(client.exceptions.ApiException):
                apps.delete_namespaced_deployment(name, NAMESPACE, propagation_policy="Background")
        batch.delete_collection_namespaced_job(NAMESPACE, propagation_policy="Background")


# --- what the rendered objects promise ----------------------------------------------------

@pytest.fixture(scope="module")
def prod() -> dict[tuple[str, str], dict[str, Any]]:
    return by_key(render(PLATFORM / "overlays" / "prod"))


def test_the_prod_overlay_sets_image_tag_replicas_hosts_and_settings(
        prod: dict[tuple[str, str], dict[str, Any]]) -> None:
    web = prod[("Deployment", "fairq-web")]["spec"]
    assert web["replicas"] == 3
    assert web["template"]["spec"]["containers"][0]["image"] == "registry.example.com/fairq:1.0.0"
    assert prod[("Deployment", "fairq-worker")]["spec"]["replicas"] == 2
    assert prod[("Deployment", "fairq-beat")]["spec"]["replicas"] == 1
    assert prod[("HorizontalPodAutoscaler", "fairq-web")]["spec"]["minReplicas"] == 3
    # The release Jobs carry the tag: a new tag is a new Job, never a changed one.
    assert ("Job", "fairq-migrate-1.0.0") in prod and ("Job", "fairq-sync-cluster-1.0.0") in prod
    ingress = prod[("Ingress", "fairq-web")]["spec"]
    assert ingress["tls"] == [{"hosts": ["fairq.example.com"], "secretName": "fairq-tls"}]
    # The settings: one ConfigMap, named by its content's hash, referenced by every pod.
    [config] = [d for k, d in prod.items() if k[0] == "ConfigMap"]
    assert config["metadata"]["name"].startswith("fairq-config-")
    assert config["data"]["DJANGO_SETTINGS_MODULE"] == "config.settings.prod"
    assert config["data"]["FAIRQ_PROMETHEUS_URL"].startswith("http://")
    assert config["data"]["FAIRQ_LOG_FORMAT"] == "json"
    for key in ("DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"):
        assert key not in config["data"]
    # Secrets are the operator's: prod renders none.
    assert not [k for k in prod if k[0] == "Secret"]
    for name, spec in pod_specs(list(prod.values())):
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["envFrom"] == [{"configMapRef": {"name": config["metadata"]["name"]}},
                                    {"secretRef": {"name": "fairq-secrets"}}], name


def test_every_role_has_its_probes_and_waits_for_the_releases_migrations(
        prod: dict[tuple[str, str], dict[str, Any]]) -> None:
    def spec(name: str) -> dict[str, Any]:
        result: dict[str, Any] = prod[("Deployment", name)]["spec"]["template"]["spec"]
        return result

    web = spec("fairq-web")["containers"][0]
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for name, role in (("fairq-worker", "worker"), ("fairq-beat", "beat")):
        probe = spec(name)["containers"][0]["livenessProbe"]
        assert probe["exec"]["command"] == ["python", "manage.py", "heartbeat_check", role]
    hooks = spec("fairq-webhooks")["containers"][0]["livenessProbe"]["exec"]["command"]
    assert hooks[-1].startswith("celery -A config inspect ping") and "webhooks@" in hooks[-1]
    for name in ("fairq-web", "fairq-worker", "fairq-webhooks", "fairq-beat"):
        [init] = spec(name)["initContainers"]
        assert init["command"][:3] == ["python", "manage.py", "wait_for_migrations"]
    sync = prod[("Job", "fairq-sync-cluster-1.0.0")]["spec"]["template"]["spec"]
    assert sync["initContainers"][0]["command"][2] == "wait_for_migrations"
    migrate = prod[("Job", "fairq-migrate-1.0.0")]["spec"]["template"]["spec"]
    assert migrate["containers"][0]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert "initContainers" not in migrate


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pods_fairq_runs_are_locked_down(overlay: str) -> None:
    for name, spec in pod_specs(render(PLATFORM / "overlays" / overlay)):
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), name
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]


def test_the_web_runs_without_cluster_credentials_and_sync_as_the_provisioner(
        prod: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The internet-facing web has no token to show the API server; only the
    one-shot sync Job runs as fairq-provisioner; the worker as fairq-scheduler."""
    def spec(kind: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = prod[(kind, name)]["spec"]["template"]["spec"]
        return result

    assert spec("Deployment", "fairq-web")["automountServiceAccountToken"] is False
    assert spec("Deployment", "fairq-web")["serviceAccountName"] == "fairq-web"
    assert spec("Job", "fairq-sync-cluster-1.0.0")["serviceAccountName"] == "fairq-provisioner"
    assert spec("Deployment", "fairq-worker")["serviceAccountName"] == "fairq-scheduler"
    assert spec("Deployment", "fairq-beat")["automountServiceAccountToken"] is False
    assert spec("Job", "fairq-migrate-1.0.0")["automountServiceAccountToken"] is False
    assert prod[("ServiceAccount", "fairq-web")]["automountServiceAccountToken"] is False
    assert not [d for (kind, _), d in prod.items() if "Binding" in kind
                and any(s["name"] == "fairq-web" for s in d.get("subjects") or ())]


def test_network_policies_admit_the_ingress_and_prometheus_only() -> None:
    for overlay in OVERLAYS:
        docs = by_key(render(PLATFORM / "overlays" / overlay))
        web = docs[("NetworkPolicy", "fairq-web")]["spec"]
        assert web["podSelector"] == {"matchLabels": {"app": "fairq-web"}}
        [rule] = web["ingress"]
        assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
        assert [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                for p in rule["from"]] == ["ingress-nginx", "monitoring"]
        closed = docs[("NetworkPolicy", "fairq-no-ingress")]["spec"]
        assert closed["policyTypes"] == ["Ingress"] and "ingress" not in closed
        selected = closed["podSelector"]["matchExpressions"][0]["values"]
        # Every pod of fairq that is not the web is closed to all ingress.
        for doc in docs.values():
            if doc["kind"] not in ("Deployment", "Job"):
                continue
            component = doc["spec"]["template"]["metadata"]["labels"][
                "app.kubernetes.io/component"]
            assert component in selected or component in ("web", "postgres", "redis"), doc
    dev = by_key(render(PLATFORM / "overlays" / "dev"))
    stores = dev[("NetworkPolicy", "fairq-datastores")]["spec"]
    assert stores["podSelector"]["matchExpressions"][0]["values"] == ["postgres", "redis"]
    [rule] = stores["ingress"]
    assert rule["from"][0]["podSelector"]["matchExpressions"][0]["values"] == [
        "web", "worker", "beat", "migrate", "sync"]


def test_the_service_monitor_scrapes_the_web_service_with_the_bearer_token(
        prod: dict[tuple[str, str], dict[str, Any]]) -> None:
    monitor = prod[("ServiceMonitor", "fairq-web")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    service = prod[("Service", "fairq-web")]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert endpoint["path"] == "/metrics"
    assert endpoint["bearerTokenSecret"] == {"name": "fairq-secrets", "key": "FAIRQ_METRICS_TOKEN"}


def test_docker_compose_runs_the_three_roles_on_postgres_and_redis() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "redis", "migrate", "web", "worker", "beat"} <= set(services)
    assert services["worker"]["command"][:3] == ["celery", "-A", "config"]
    assert services["webhooks"]["command"][:4] == ["celery", "-A", "config", "worker"]
    assert services["beat"]["command"][:4] == ["celery", "-A", "config", "beat"]
    env = services["web"]["environment"]
    assert env["DATABASE_URL"].startswith("postgres://")
    assert env["REDIS_URL"].startswith("redis://")
