"""platform/k8s/base/rbac.yaml is enough, and no more than enough: the cluster admin
bootstraps a team namespace (`sync_cluster --bootstrap`), the provisioner account makes
priority classes and provisions it (labels, quota, the scheduler's RoleBinding); the
fairq-scheduler account then runs a job's whole life there (submit, watch, capacity, logs,
stop), reading pods, Jobs and events in fairq's namespaces only; the provisioner can
touch nothing outside them (no kube-system labels, RoleBindings or quotas, no deleting
PriorityClasses); the fairq-web account may do nothing at all (SubjectAccessReviews and
server-side dry runs asked of the API server, so each test can fail both ways).

The envtest API server authorizes with RBAC; the admin impersonates the service
accounts. No database.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
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

RBAC = Path(__file__).resolve().parents[2] / "platform" / "k8s" / "base" / "rbac.yaml"


def _apply(api: Any, doc: dict[str, Any]) -> None:
    kind = doc["kind"]
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    create: dict[str, Callable[[], Any]] = {
        "Namespace": lambda: core.create_namespace(doc),
        "ServiceAccount": lambda: core.create_namespaced_service_account(
            doc["metadata"]["namespace"], doc),
        "ClusterRole": lambda: rbac.create_cluster_role(doc),
        "ClusterRoleBinding": lambda: rbac.create_cluster_role_binding(doc),
        "RoleBinding": lambda: rbac.create_namespaced_role_binding(
            doc["metadata"]["namespace"], doc),
    }
    try:
        create[kind]()
    except ApiException as exc:
        if exc.status != 409:
            raise
        if kind == "ClusterRole":
            rbac.replace_cluster_role(doc["metadata"]["name"], doc)


@pytest.fixture(scope="module")
def rbac_applied(k8s_api_client: Any) -> None:
    import yaml

    for doc in yaml.safe_load_all(RBAC.read_text()):
        if doc:
            _apply(k8s_api_client, doc)


PROVISIONER_ACCOUNT = ("fairq-system", "fairq-provisioner")


def bootstrap(admin: Any, prefix: str, team: str = "team") -> None:
    """What the cluster admin applies once per team (`manage.py sync_cluster --bootstrap |
    kubectl apply -f -`): the namespace and the provisioner's RoleBinding in it."""
    from queueing.backends.k8s_provisioner import KubernetesProvisioner

    provisioner = KubernetesProvisioner(lambda: admin, namespace_prefix=prefix,
                                        provisioner_account=PROVISIONER_ACCOUNT)
    for doc in provisioner.bootstrap_manifests([(team, True)]):
        _apply(admin, doc)
    # The API server's RBAC authorizer learns of the new RoleBinding through its own
    # watch: until it has, the provisioner is refused as if nothing had been applied.
    namespace = f"{prefix}{team}"
    assert _eventually(lambda: [] if _allowed(
        admin, PROV, "patch", "namespaces", namespace=namespace, name=namespace) else ["patch"]) == []


def backend_as(cp: Any, account: str, prefix: str, **kwargs: Any) -> Any:
    from queueing.backends.k8s_manifest import GpuTypeRef
    from queueing.backends.kubernetes import KubernetesBackend, api_client_from_config

    api = api_client_from_config(kubeconfig=str(cp.kubeconfig_path))
    api.set_default_header("Impersonate-User", f"system:serviceaccount:fairq-system:{account}")
    return KubernetesBackend(
        api, namespace_prefix=prefix,
        gpu_types=[GpuTypeRef("h100", "nvidia.com/gpu", {"fairq.io/gpu-type": "h100"})],
        team_quota=lambda team: {"nvidia.com/gpu": 16}, **kwargs)


@pytest.fixture
def prefix(k8s_api_client: Any) -> Iterator[str]:
    p = f"r{uuid.uuid4().hex[:6]}-"
    yield p
    core, batch = client.CoreV1Api(k8s_api_client), client.BatchV1Api(k8s_api_client)
    ns = f"{p}team"
    try:
        batch.delete_collection_namespaced_job(ns, propagation_policy="Background")
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        core.delete_namespace(ns)
    except ApiException as exc:
        if exc.status != 404:
            raise


def launch(name: str, replicas: int = 1) -> Any:
    from queueing.backends.base import LaunchSpec

    return LaunchSpec(
        name=name, job_id=int(name.split("-")[1]), attempt=1, team="team", tier="rbac",
        priority_class_name="", gpu_type="h100", resource_name="nvidia.com/gpu",
        node_labels={"fairq.io/gpu-type": "h100"}, gpus_per_replica=1, replicas=replicas,
        image="registry.invalid/x:1", command=[], args=[], env={}, max_runtime_seconds=None)


def until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


def test_the_scheduler_account_can_run_a_jobs_whole_life(
    rbac_applied: None, k8s_control_plane: Any, k8s_api_client: Any, prefix: str,
) -> None:
    from queueing.backends.base import Phase
    from queueing.backends.k8s_provisioner import NamespaceNotBootstrapped, PriorityClassSpec
    from queueing.backends.kubernetes import NamespaceNotProvisioned

    provisioner = backend_as(k8s_control_plane, "fairq-provisioner", prefix,
                             scheduler_account=("fairq-system", "fairq-scheduler"),
                             provisioner_account=PROVISIONER_ACCOUNT)
    # The worker as deployed: watches in the team namespaces only.
    backend = backend_as(k8s_control_plane, "fairq-scheduler", prefix, provision="separate",
                         teams=lambda: ["team"])
    try:
        sched = client.SchedulingV1Api(k8s_api_client)
        # Keep every fairq class as it is (other tests use them) and add one, then change it.
        keep = [PriorityClassSpec(p.metadata.name, p.value, p.preemption_policy or "Never",
                                  (p.metadata.labels or {}).get("fairq.io/tier", ""))
                for p in sched.list_priority_class().items
                if (p.metadata.labels or {}).get("app.kubernetes.io/managed-by") == "fairq"]
        mine = f"rbac-{prefix.rstrip('-')}"
        assert mine in provisioner.provisioner.sync_priority_classes(
            [*keep, PriorityClassSpec(mine, 7, "Never", "rbac")])["created"]
        # A changed value needs the class deleted: the provisioner may not (RBAC cannot
        # tell fairq's classes from others'); the cluster admin deletes it, the
        # provisioner makes it again.
        report = provisioner.provisioner.sync_priority_classes(
            [*keep, PriorityClassSpec(mine, 8, "Never", "rbac")])
        assert [(f["name"], f["status"]) for f in report["failed"]] == [(mine, 403)]
        sched.delete_priority_class(mine)
        assert mine in provisioner.provisioner.sync_priority_classes(
            [*keep, PriorityClassSpec(mine, 8, "Never", "rbac")])["created"]
        assert sched.read_priority_class(mine).value == 8

        name = f"fq-{800000 + int(uuid.uuid4().int % 1000)}-1"
        # Not provisioned yet: the scheduler says so, creates nothing, and cannot provision.
        assert backend.unprovisioned_teams(["team"]) == {"team"}
        with pytest.raises(NamespaceNotProvisioned, match="not provisioned"):
            backend.submit(launch(name), now=datetime.now(UTC))
        with pytest.raises(NamespaceNotBootstrapped):
            backend.provisioner.ensure_namespace("team")
        # Nor can the provisioner before the cluster admin bootstrapped the team.
        with pytest.raises(NamespaceNotBootstrapped, match="--bootstrap"):
            provisioner.provisioner.ensure_namespace("team")
        bootstrap(k8s_api_client, prefix)

        assert provisioner.provisioner.ensure_namespace("team") == f"{prefix}team"
        # Patch labels, replace quota and binding.
        provisioner.provisioner.ensure_namespace("team", force=True)
        quota = client.CoreV1Api(k8s_api_client).read_namespaced_resource_quota(
            "fairq-gpus", f"{prefix}team")
        assert quota.spec.hard == {"requests.nvidia.com/gpu": "16"}

        backend.provisioner.forget_refusals()  # as after UNPROVISIONED_RECHECK_SECONDS
        assert backend.unprovisioned_teams(["team"]) == set()
        # A quota change in fairq: the scheduler replaces that one object (sync_quotas).
        backend.provisioner.apply_quota(f"{prefix}team", {"nvidia.com/gpu": 12}, replace_only=True)
        quota = client.CoreV1Api(k8s_api_client).read_namespaced_resource_quota(
            "fairq-gpus", f"{prefix}team")
        assert quota.spec.hard == {"requests.nvidia.com/gpu": "12"}
        backend.submit(launch(name), now=datetime.now(UTC))
        backend.submit(launch(name), now=datetime.now(UTC))  # idempotent
        until(lambda: any(s.name == name and s.phase == Phase.RUNNING
                          for s in backend.statuses(now=datetime.now(UTC))), "RUNNING")
        assert any(n.allocated >= 1 for n in backend.nodes())
        assert "[fairq] no logs from pod" in backend.logs(name)  # not a 403
        client.CoreV1Api(backend.api).list_namespaced_event(f"{prefix}team")  # FailedCreate
        backend.stop(name, now=datetime.now(UTC))
        until(lambda: name not in {s.name for s in backend.statuses(now=datetime.now(UTC))},
              "the Job gone")
        # A multi-replica job: its replicas' Jobs and headless Service, then stopped.
        pair = f"fq-{900000 + int(uuid.uuid4().int % 1000)}-1"
        backend.submit(launch(pair, replicas=2), now=datetime.now(UTC))
        core = client.CoreV1Api(k8s_api_client)
        assert core.read_namespaced_service(pair, f"{prefix}team").spec.cluster_ip == "None"
        until(lambda: any(s.name == pair and s.phase == Phase.RUNNING
                          for s in backend.statuses(now=datetime.now(UTC))), "pair RUNNING")
        backend.stop(pair, now=datetime.now(UTC))
        # stop() deletes the Service first, in the background: gone when it returns.
        assert not [svc for svc in core.list_namespaced_service(f"{prefix}team").items
                    if svc.metadata.name == pair]
        until(lambda: pair not in {s.name for s in backend.statuses(now=datetime.now(UTC))},
              "the pair's Job gone")
        sched.delete_priority_class(mine)
    finally:
        backend.close()
        provisioner.close()


def test_the_web_account_cannot_even_watch(
    rbac_applied: None, k8s_control_plane: Any, prefix: str,
) -> None:
    from queueing.backends.kubernetes import KubernetesBackendError

    web = backend_as(k8s_control_plane, "fairq-web", prefix)
    try:
        with pytest.raises(KubernetesBackendError, match="not synced"):
            web.wait_synced(3)
        assert "(403)" in web.logs("fq-1-1")
        with pytest.raises(ApiException) as denied:
            client.CoreV1Api(web.api).list_namespaced_secret("fairq-system")
        assert denied.value.status == 403
        assert json.loads(denied.value.body)["reason"] == "Forbidden"
    finally:
        web.close()


# --- least privilege, asked of the API server itself (SubjectAccessReview as admin) -------

SCHED = "system:serviceaccount:fairq-system:fairq-scheduler"
WEB = "system:serviceaccount:fairq-system:fairq-web"


def _allowed(api: Any, user: str, verb: str, resource: str, *, group: str = "",
             namespace: str = "", subresource: str = "", name: str = "") -> bool:
    """The API server's own answer: may `user` do `verb` on `resource`?"""
    attrs = {"verb": verb, "group": group, "resource": resource}
    if namespace:
        attrs["namespace"] = namespace
    if subresource:
        attrs["subresource"] = subresource
    if name:
        attrs["name"] = name
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": ["system:serviceaccounts",
                                              "system:serviceaccounts:fairq-system",
                                              "system:authenticated"],
                     "resourceAttributes": attrs}}
    got = client.AuthorizationV1Api(api).create_subject_access_review(body)
    return bool(got.status.allowed)


@pytest.fixture
def provisioned(rbac_applied: None, k8s_api_client: Any, prefix: str) -> str:
    """A team namespace as the provisioner makes it (`sync_cluster` as fairq-provisioner),
    once the cluster admin bootstrapped it."""
    from queueing.backends.kubernetes import KubernetesBackend

    bootstrap(k8s_api_client, prefix)
    api = api_client_from_sa(k8s_api_client, "fairq-provisioner")
    provisioner = KubernetesBackend(api, namespace_prefix=prefix,
                                    team_quota=lambda team: {"nvidia.com/gpu": 16},
                                    scheduler_account=("fairq-system", "fairq-scheduler"),
                                    provisioner_account=PROVISIONER_ACCOUNT)
    try:
        return provisioner.provisioner.ensure_namespace("team", force=True)
    finally:
        provisioner.close()


def api_client_from_sa(admin: Any, account: str) -> Any:
    from kubernetes.client import ApiClient

    api = ApiClient(admin.configuration)
    api.set_default_header("Impersonate-User", f"system:serviceaccount:fairq-system:{account}")
    return api


# Every write outside fairq's namespaces and objects, for both accounts.
REFUSED_EVERYWHERE: list[tuple[str, str, str, str, str]] = [
    # (verb, group, resource, subresource, namespace)
    ("create", "batch", "jobs", "", "kube-system"),
    ("create", "batch", "jobs", "", "default"),
    ("delete", "batch", "jobs", "", "kube-system"),
    ("delete", "batch", "jobs", "", "default"),
    ("create", "", "pods", "", "kube-system"),
    ("create", "", "pods", "", "default"),
    ("delete", "", "pods", "", "kube-system"),
    ("delete", "", "pods", "", "default"),
    ("get", "", "secrets", "", "kube-system"),
    ("list", "", "secrets", "", ""),
    ("get", "", "secrets", "", "fairq-system"),
    ("patch", "", "namespaces", "", ""),
    ("create", "", "namespaces", "", ""),
    ("update", "", "resourcequotas", "", "kube-system"),
    ("update", "", "resourcequotas", "", "default"),
    ("create", "", "resourcequotas", "", "default"),
    ("create", "scheduling.k8s.io", "priorityclasses", "", ""),
    ("delete", "scheduling.k8s.io", "priorityclasses", "", ""),
    ("create", "rbac.authorization.k8s.io", "rolebindings", "", "kube-system"),
    ("get", "", "pods", "log", "kube-system"),
    ("create", "", "pods", "exec", "kube-system"),
    ("create", "", "services", "", "kube-system"),
    ("create", "", "services", "", "default"),
    ("delete", "", "services", "", "kube-system"),
    ("delete", "", "services", "", "default"),
]


@pytest.mark.parametrize("account", [SCHED, WEB])
def test_both_accounts_are_refused_every_write_outside_fairqs_namespaces(
    provisioned: str, k8s_api_client: Any, account: str,
) -> None:
    allowed = [(verb, group, resource, sub, ns)
               for verb, group, resource, sub, ns in REFUSED_EVERYWHERE
               if _allowed(k8s_api_client, account, verb, resource, group=group,
                           namespace=ns, subresource=sub)]
    assert allowed == []
    # Patching kube-system's labels by name, and the scheduler's own team namespace's.
    assert not _allowed(k8s_api_client, account, "patch", "namespaces", name="kube-system")
    assert not _allowed(k8s_api_client, account, "patch", "namespaces", name=provisioned)
    # Even inside a team namespace: no pods, no secrets, no quota changes, no RBAC.
    for verb, group, resource, sub in [("create", "", "pods", ""), ("get", "", "secrets", ""),
                                       ("update", "", "resourcequotas", ""),
                                       ("create", "rbac.authorization.k8s.io",
                                        "rolebindings", ""),
                                       ("create", "", "pods", "exec")]:
        assert not _allowed(k8s_api_client, account, verb, resource, group=group,
                            namespace=provisioned, subresource=sub), (verb, resource)


def test_the_web_account_may_do_nothing_at_all(provisioned: str, k8s_api_client: Any) -> None:
    asks = [("get", "", "pods", "log", provisioned), ("get", "", "pods", "log", ""),
            ("list", "", "pods", "", ""), ("watch", "", "pods", "", ""),
            ("list", "", "nodes", "", ""), ("list", "batch", "jobs", "", ""),
            ("list", "", "events", "", provisioned), ("get", "batch", "jobs", "", provisioned),
            ("create", "batch", "jobs", "", provisioned)]
    allowed = [a for a in asks if _allowed(k8s_api_client, WEB, a[0], a[2], group=a[1],
                                           subresource=a[3], namespace=a[4])]
    assert allowed == []
    bindings = client.RbacAuthorizationV1Api(k8s_api_client).list_cluster_role_binding().items
    assert not [b.metadata.name for b in bindings
                if any(s.name == "fairq-web" for s in (b.subjects or []))]


def test_the_scheduler_may_do_what_it_needs_in_a_provisioned_team_namespace(
    provisioned: str, k8s_api_client: Any, prefix: str,
) -> None:
    needs = [("create", "batch", "jobs", "", provisioned),
             ("delete", "batch", "jobs", "", provisioned),
             ("get", "", "pods", "log", provisioned),
             ("list", "", "events", "", provisioned),
             # Pods a Job deleted with orphan propagation left behind.
             ("delete", "", "pods", "", provisioned),
             # The headless Service of a multi-replica job.
             ("create", "", "services", "", provisioned),
             ("delete", "", "services", "", provisioned),
             ("get", "", "services", "", provisioned),
             # The watch cache: nodes cluster-wide; pods, Jobs and events (FailedCreate,
             # 11.1) in the team namespace.
             ("list", "", "nodes", "", ""), ("watch", "", "nodes", "", ""),
             ("list", "", "events", "", provisioned), ("watch", "", "events", "", provisioned),
             ("list", "", "pods", "", provisioned), ("watch", "", "pods", "", provisioned),
             ("list", "batch", "jobs", "", provisioned),
             ("watch", "batch", "jobs", "", provisioned)]
    # The API server's RBAC authorizer learns of the new RoleBinding through its own watch:
    # on a loaded machine that takes a moment, so ask again for a few seconds.
    deadline = time.monotonic() + 15
    while True:
        refused = [n for n in needs if not _allowed(k8s_api_client, SCHED, n[0], n[2],
                                                    group=n[1], subresource=n[3],
                                                    namespace=n[4])]
        if not refused or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert refused == []
    # A team namespace nobody provisioned is like any other namespace.
    unprovisioned = f"{prefix}other"
    assert not _allowed(k8s_api_client, SCHED, "create", "jobs", group="batch",
                        namespace=unprovisioned)


def test_the_scheduler_cannot_mount_kube_systems_secrets_through_a_job(
    provisioned: str, k8s_api_client: Any,
) -> None:
    """The finding itself: a server-side dry run of a Job in kube-system that mounts a
    kube-system Secret, sent as fairq-scheduler, was accepted. Now refused; the same Job
    in the provisioned team namespace is accepted (so the refusal is RBAC's)."""
    api = api_client_from_sa(k8s_api_client, "fairq-scheduler")
    batch = client.BatchV1Api(api)

    def job_in(namespace: str) -> dict[str, Any]:
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": "steal", "namespace": namespace},
                "spec": {"template": {"spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "registry.invalid/x:1",
                                    "volumeMounts": [{"name": "s", "mountPath": "/s"}]}],
                    "volumes": [{"name": "s", "secret": {"secretName": "any"}}]}}}}

    try:
        with pytest.raises(ApiException) as denied:
            batch.create_namespaced_job("kube-system", job_in("kube-system"), dry_run="All")
        assert denied.value.status == 403
        with pytest.raises(ApiException) as denied:
            batch.create_namespaced_job("default", job_in("default"), dry_run="All")
        assert denied.value.status == 403
        made = batch.create_namespaced_job(provisioned, job_in(provisioned), dry_run="All")
        assert made.metadata.namespace == provisioned
    finally:
        api.close()


# --- what the worker reads, and what the provisioner may touch ------------------------------

PROV = "system:serviceaccount:fairq-system:fairq-provisioner"


def _eventually(check: Callable[[], list[Any]]) -> list[Any]:
    """`check()` until it finds nothing wrong, for up to 15 s: the API server's RBAC
    authorizer learns of a new RoleBinding through its own watch."""
    deadline = time.monotonic() + 15
    while (wrong := check()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return wrong


def test_the_scheduler_reads_pods_jobs_and_events_in_fairqs_namespaces_only(
    provisioned: str, k8s_api_client: Any,
) -> None:
    """The worker used to list every pod cluster-wide (other tenants' env values with
    them). Now: no cluster-wide or other-namespace list or watch of pods, Jobs or events,
    asked of the API server and tried for real; the team namespace's are allowed."""
    outside = [(verb, group, resource, ns)
               for verb in ("list", "watch", "get")
               for group, resource in (("", "pods"), ("batch", "jobs"), ("", "events"))
               for ns in ("", "kube-system", "default", "fairq-system")]
    assert [a for a in outside if _allowed(k8s_api_client, SCHED, a[0], a[2], group=a[1],
                                           namespace=a[3])] == []
    inside = [(verb, group, resource) for verb in ("list", "watch")
              for group, resource in (("", "pods"), ("batch", "jobs"), ("", "events"))]
    assert _eventually(lambda: [a for a in inside if not _allowed(
        k8s_api_client, SCHED, a[0], a[2], group=a[1], namespace=provisioned)]) == []

    api = api_client_from_sa(k8s_api_client, "fairq-scheduler")
    core = client.CoreV1Api(api)
    try:
        for call in (lambda: core.list_pod_for_all_namespaces(),
                     lambda: core.list_namespaced_pod("kube-system"),
                     lambda: core.list_namespaced_pod("default")):
            with pytest.raises(ApiException) as denied:
                call()
            assert denied.value.status == 403
        assert core.list_namespaced_pod(provisioned).items == []
    finally:
        api.close()


def test_the_provisioner_can_do_none_of_the_four_dry_runs_but_provisions_a_team(
    provisioned: str, k8s_api_client: Any,
) -> None:
    """Server-side dry runs sent as fairq-provisioner, each accepted before: relabelling
    kube-system to Pod Security `privileged`, a RoleBinding in kube-system, a zero-pod
    ResourceQuota in kube-system, deleting a PriorityClass fairq did not make. All four
    are refused (403); the same kinds of objects in the provisioned team namespace, and
    a new PriorityClass, are accepted (so the refusals are RBAC's)."""
    api = api_client_from_sa(k8s_api_client, "fairq-provisioner")
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    sched = client.SchedulingV1Api(api)
    theirs = f"not-fairq-{uuid.uuid4().hex[:6]}"
    client.SchedulingV1Api(k8s_api_client).create_priority_class(
        {"metadata": {"name": theirs}, "value": 5})

    def binding(namespace: str) -> dict[str, Any]:
        return {"metadata": {"name": "x", "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "fairq-team-workloads"},
                "subjects": [{"kind": "ServiceAccount", "name": "default",
                              "namespace": "kube-system"}]}

    def quota(namespace: str) -> dict[str, Any]:
        return {"metadata": {"name": "zero", "namespace": namespace},
                "spec": {"hard": {"pods": "0"}}}

    privileged = {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "privileged"}}}
    try:
        refused = {
            "relabel kube-system": lambda: core.patch_namespace(
                "kube-system", privileged, dry_run="All"),
            "RoleBinding in kube-system": lambda: rbac.create_namespaced_role_binding(
                "kube-system", binding("kube-system"), dry_run="All"),
            "zero-pod quota in kube-system": lambda: core.create_namespaced_resource_quota(
                "kube-system", quota("kube-system"), dry_run="All"),
            "delete a PriorityClass not fairq's": lambda: sched.delete_priority_class(
                theirs, dry_run="All"),
        }
        answers = {}
        for what, call in refused.items():
            try:
                call()
                answers[what] = 200  # accepted
            except ApiException as exc:
                answers[what] = exc.status
        assert answers == dict.fromkeys(refused, 403)
        # What it needs, in the team namespace (the cluster admin bootstrapped it).
        wrong: list[str] = []

        def needs() -> list[str]:
            wrong.clear()
            for what, call in {
                "its labels": lambda: core.patch_namespace(provisioned, {"metadata": {
                    "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}},
                    dry_run="All"),
                "a quota": lambda: core.create_namespaced_resource_quota(
                    provisioned, quota(provisioned), dry_run="All"),
                "the scheduler's RoleBinding": lambda: rbac.create_namespaced_role_binding(
                    provisioned, binding(provisioned), dry_run="All"),
                "a PriorityClass": lambda: sched.create_priority_class(
                    {"metadata": {"name": f"{theirs}-2"}, "value": 6}, dry_run="All"),
            }.items():
                try:
                    call()
                except ApiException as exc:
                    wrong.append(f"{what}: {exc.status}")
            return list(wrong)

        assert _eventually(needs) == []
        # Nor a namespace of its own making (any name: kube-foo as well as a team's).
        with pytest.raises(ApiException) as denied:
            core.create_namespace({"metadata": {"name": f"{provisioned}-x"}}, dry_run="All")
        assert denied.value.status == 403
    finally:
        client.SchedulingV1Api(k8s_api_client).delete_priority_class(theirs)
        api.close()
