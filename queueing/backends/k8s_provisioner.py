"""The Kubernetes provisioner: what must exist before fairq's Jobs can run, and nothing
of the Jobs themselves (docs/kubernetes.md, "RBAC"). Per team a labelled namespace, its
ResourceQuota `fairq-gpus` and the RoleBinding that lets the scheduler's service account
run Jobs there; per tier a PriorityClass.

Its own service account may do that only inside a team namespace that was bootstrapped
(`bootstrap_manifests`: the namespace and the provisioner's RoleBinding in it, applied
once per team by the cluster admin), and create PriorityClasses: RBAC cannot tell a team
namespace it is about to create from `kube-system`, so nothing that holds a cluster-wide
right to make RoleBindings, quotas or namespace labels runs in the cluster. With an
admin's credentials (`sync_cluster` in the tests, FAIRQ_K8S_PROVISION=scheduler), the
same calls also make what the bootstrap would.

`services/provisioning.py` drives it (`manage.py sync_cluster`, `sync_cluster_task`,
with what it reads from the database); the backend asks it whether a team's namespace
is ready before a submit, and has it make one on first use when
FAIRQ_K8S_PROVISION=scheduler. It remembers which namespaces are ready, under its own
lock (the cycle submits from several threads).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from .k8s_api import api_error, drain, raw_list
from .k8s_cache import Obj
from .k8s_manifest import (
    MANAGED_BY,
    PROVISIONER_ROLE,
    PROVISIONER_ROLE_BINDING,
    QUOTA_NAME,
    ManifestError,
    namespace_for,
    namespace_manifest,
    priority_class_manifest,
    resource_quota_manifest,
    role_binding_manifest,
)

log = logging.getLogger(__name__)

# How long a "not provisioned" answer is believed before asking the API server again.
UNPROVISIONED_RECHECK_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class PriorityClassSpec:
    name: str
    value: int
    preemption_policy: str
    tier: str


def sync_failure(kind: str, name: str, exc: Exception) -> dict[str, Any]:
    """One object `sync_cluster` could not make as it should be: kind, name, the HTTP
    status (400 when fairq refused it itself, e.g. a name that is no DNS-1123 label; 0
    when there was no answer) and why."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        status, message = api_error(exc)
        error = f"({status}) {message}"
    elif isinstance(exc, ManifestError):
        status, error = 400, str(exc)
    else:
        status, error = 0, str(exc) or type(exc).__name__
    log.warning("sync: %s %s failed: %s", kind, name, error)
    return {"kind": kind, "name": name, "status": status, "error": error}


class NamespaceNotBootstrapped(Exception):
    """The provisioner may not make or label the team namespace: it does not exist, or
    has no RoleBinding for the provisioner yet (the cluster admin applies
    `manage.py sync_cluster --bootstrap`)."""

    status = 403


class KubernetesProvisioner:
    """Namespaces, ResourceQuotas, RoleBindings and PriorityClasses. `api` returns the
    ApiClient to use now (the backend's, renewed after a fork)."""

    def __init__(
        self,
        api: Callable[[], Any],
        *,
        namespace_prefix: str = "fairq-",
        scheduler_account: tuple[str, str] | None = None,
        team_quota: Callable[[str], Mapping[str, int]] | None = None,
        provisioner_account: tuple[str, str] | None = None,
    ) -> None:
        self._api = api
        # (namespace, name) of the provisioner's service account: bound in each team
        # namespace at bootstrap (`bootstrap_manifests`, or `ensure_namespace` when it
        # creates the namespace with an admin's credentials); None binds nothing.
        self.provisioner_account = provisioner_account
        self.namespace_prefix = namespace_prefix
        # (namespace, name) of the service account bound in each team namespace; None
        # binds nothing (out-of-cluster, a user's own credentials).
        self.scheduler_account = scheduler_account
        # The team's GPU limits for its ResourceQuota; None: namespaces get no quota.
        self.team_quota = team_quota
        self._lock = threading.Lock()
        self._known: set[str] = set()  # namespaces ready for Jobs
        self._non_root: dict[str, bool] = {}  # the PSA level each was labelled with
        # namespace → (when it was refused, the HTTP status: 403 no binding, 404 none)
        self._unprovisioned: dict[str, tuple[float, int]] = {}

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api())

    # --- is a namespace ready? ----------------------------------------------------------

    def known(self, namespace: str) -> bool:
        with self._lock:
            return namespace in self._known

    def namespace_ready(self, namespace: str) -> bool:
        """Did the provisioner make `namespace`? Its ResourceQuota `fairq-gpus` is read
        (fairq-team-workloads may read that one object once the RoleBinding is there):
        403 (no binding) or 404 (no namespace) means not yet. Asked once per namespace;
        a "no" is asked again after UNPROVISIONED_RECHECK_SECONDS."""
        from kubernetes.client.exceptions import ApiException

        with self._lock:
            if namespace in self._known:
                return True
            refused = self._unprovisioned.get(namespace)
        if refused is not None and \
                time.monotonic() - refused[0] < UNPROVISIONED_RECHECK_SECONDS:
            return False
        try:
            drain(self._core().read_namespaced_resource_quota(
                QUOTA_NAME, namespace, _preload_content=False, _request_timeout=(5, 10)))
        except ApiException as exc:
            if exc.status not in (403, 404):
                raise
            with self._lock:
                self._unprovisioned[namespace] = (time.monotonic(), int(exc.status))
            return False
        with self._lock:
            self._known.add(namespace)
            self._unprovisioned.pop(namespace, None)
        return True

    def namespace_gone(self, namespace: str, *, refused: bool, status: int = 404) -> None:
        """The API server refused a create in a namespace believed ready (404: it is gone;
        403: its RoleBinding may be, or a quota on Jobs is full): forget it, so the next
        `namespace_ready` asks the API server again; `refused`: and believe it not
        provisioned for UNPROVISIONED_RECHECK_SECONDS."""
        with self._lock:
            self._known.discard(namespace)
            if refused:
                self._unprovisioned[namespace] = (time.monotonic(), status)

    def refusal_status(self, namespace: str) -> int:
        """The HTTP status of the last "not provisioned" answer for `namespace` (403: no
        RoleBinding for the scheduler; 404: no namespace); 403 when none is remembered."""
        with self._lock:
            refused = self._unprovisioned.get(namespace)
        return refused[1] if refused is not None else 403

    def forget_refusals(self) -> None:
        """Ask again at once about namespaces that were not provisioned (tests; as after
        UNPROVISIONED_RECHECK_SECONDS)."""
        with self._lock:
            self._unprovisioned.clear()

    def unprovisioned_teams(self, teams: Iterable[str]) -> set[str]:
        """The teams whose namespace is not provisioned. An API server that does not
        answer counts as "provisioned": the submit then fails and is retried, as any
        other transient error."""
        out: set[str] = set()
        for team in teams:
            try:
                namespace = namespace_for(team, self.namespace_prefix)
            except ManifestError:
                continue  # submit rejects the job with the reason
            try:
                if not self.namespace_ready(namespace):
                    out.add(team)
            except Exception as exc:
                log.info("asking whether %s is provisioned failed: %s", namespace, exc)
        return out

    # --- team namespaces ----------------------------------------------------------------

    def ensure_namespace(self, team: str, *, force: bool = False, quota: bool = True,
                         run_as_non_root: bool = True) -> str:
        """The provisioner's work for one team: its namespace (created, and labelled),
        its ResourceQuota and the RoleBinding that lets the scheduler's service account
        run Jobs there. Called by `sync_cluster`, and by submit when
        FAIRQ_K8S_PROVISION=scheduler. `quota=False`: without the quota (`sync_cluster`
        applies it as a step of its own). The namespace's Pod Security label follows
        the team's `run_as_non_root`: with FAIRQ_K8S_PROVISION=scheduler a change is
        patched before the team's next Job (a `restricted` namespace would refuse the pods
        of a team that now runs as root); with "separate" the provisioner applies it when
        it runs (docs/kubernetes.md)."""
        from kubernetes.client.exceptions import ApiException

        namespace = namespace_for(team, self.namespace_prefix)
        with self._lock:
            ready = namespace in self._known and \
                self._non_root.get(namespace, run_as_non_root) == run_as_non_root
        if ready and not force:
            return namespace
        body = namespace_manifest(namespace, team, run_as_non_root=run_as_non_root)
        core = self._core()
        # Labels first: the provisioner may patch a bootstrapped namespace (its RoleBinding
        # there allows `patch` of that namespace only) and nothing else; 404 = none yet.
        try:
            core.patch_namespace(namespace, {"metadata": {
                "labels": body["metadata"]["labels"]}})
        except ApiException as exc:
            if exc.status == 403:
                raise NamespaceNotBootstrapped(
                    f"namespace {namespace} is not bootstrapped: the cluster admin applies "
                    "`manage.py sync_cluster --bootstrap` (docs/kubernetes.md, \"RBAC\")"
                ) from exc
            if exc.status != 404:
                raise
            try:  # an admin's credentials (FAIRQ_K8S_PROVISION=scheduler, tests)
                core.create_namespace(cast(Any, body))
            except ApiException as exc2:
                if exc2.status == 403:
                    raise NamespaceNotBootstrapped(
                        f"namespace {namespace} does not exist and the provisioner may not "
                        "create it: the cluster admin applies `manage.py sync_cluster "
                        "--bootstrap` (docs/kubernetes.md, \"RBAC\")") from exc2
                if exc2.status != 409:
                    raise
        if self.provisioner_account is not None:
            # Kept in step (an admin's sync also binds namespaces made before there was
            # a provisioner binding; the provisioner itself may: it holds those rights here).
            self._apply_binding(self._provisioner_binding(namespace))
        if self.scheduler_account is not None:
            self.apply_role_binding(namespace)
        # Ready once its quota is in place (apply_quota marks it known).
        if self.team_quota is None:
            with self._lock:
                self._known.add(namespace)
        elif quota:
            self.apply_quota(namespace, self.team_quota(team))
        with self._lock:
            self._non_root[namespace] = run_as_non_root
        return namespace

    def _provisioner_binding(self, namespace: str) -> dict[str, Any]:
        assert self.provisioner_account is not None
        sa_namespace, sa_name = self.provisioner_account
        return role_binding_manifest(namespace, service_account=sa_name,
                                     service_account_namespace=sa_namespace,
                                     name=PROVISIONER_ROLE_BINDING, role=PROVISIONER_ROLE)

    def bootstrap_manifests(self, teams: Iterable[tuple[str, bool]]) -> list[dict[str, Any]]:
        """What the cluster admin applies once per team (`manage.py sync_cluster
        --bootstrap | kubectl apply -f -`) before the provisioner can provision it: the
        labelled namespace and the provisioner's RoleBinding in it. `teams`: (slug,
        run_as_non_root) pairs; a slug that makes no valid namespace is skipped."""
        out: list[dict[str, Any]] = []
        for team, non_root in teams:
            try:
                namespace = namespace_for(team, self.namespace_prefix)
            except ManifestError:
                continue
            out.append(namespace_manifest(namespace, team, run_as_non_root=non_root))
            if self.provisioner_account is not None:
                out.append(self._provisioner_binding(namespace))
        return out

    def apply_role_binding(self, namespace: str) -> None:
        assert self.scheduler_account is not None
        sa_namespace, sa_name = self.scheduler_account
        self._apply_binding(role_binding_manifest(namespace, service_account=sa_name,
                                                  service_account_namespace=sa_namespace))

    def _apply_binding(self, body: dict[str, Any]) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        namespace = body["metadata"]["namespace"]
        rbac = client.RbacAuthorizationV1Api(self._api())
        try:
            rbac.create_namespaced_role_binding(namespace, cast(Any, body))
        except ApiException as exc:
            if exc.status != 409:
                raise
            rbac.replace_namespaced_role_binding(body["metadata"]["name"], namespace,
                                                 cast(Any, body))

    def apply_quota(self, namespace: str, hard: Mapping[str, int], *,
                    replace_only: bool = False) -> None:
        """Create or replace the namespace's ResourceQuota; `replace_only`: the scheduler
        keeping a provisioned quota in step (it may not create one)."""
        from kubernetes.client.exceptions import ApiException

        body = resource_quota_manifest(namespace, hard)
        core = self._core()
        try:
            if replace_only:
                raise ApiException(status=409)
            core.create_namespaced_resource_quota(namespace, cast(Any, body))
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.replace_namespaced_resource_quota(body["metadata"]["name"], namespace,
                                                   cast(Any, body))
        # Its quota in place, the namespace is ready: submit skips it from now on.
        with self._lock:
            self._known.add(namespace)

    # --- priority classes ---------------------------------------------------------------

    def sync_priority_classes(self, classes: Sequence[PriorityClassSpec]) -> dict[str, list[Any]]:
        """Create, update (delete + create: value and preemptionPolicy are immutable) and
        delete fairq's PriorityClasses so there is exactly one per tier. Classes fairq did
        not create are never touched; a name clash is reported. Each class is handled on
        its own: one the API server refuses (an invalid name: 422) is reported in
        `failed` and the others are still synced."""
        from kubernetes import client

        scheduling = client.SchedulingV1Api(self._api())
        report: dict[str, list[Any]] = {"created": [], "replaced": [], "unchanged": [],
                                        "deleted": [], "conflicts": [], "failed": []}
        try:
            existing = {p["metadata"]["name"]: p
                        for p in raw_list(scheduling.list_priority_class)}
        except Exception as exc:
            report["failed"].append(sync_failure("PriorityClass", "*", exc))
            return report
        wanted = {c.name: c for c in classes}
        for c in classes:
            try:
                outcome = self._sync_priority_class(scheduling, c, existing.get(c.name))
            except Exception as exc:
                report["failed"].append(sync_failure("PriorityClass", c.name, exc))
                continue
            report[outcome].append(c.name)
        for name, cur in existing.items():
            if name not in wanted and (cur["metadata"].get("labels") or {}).get(MANAGED_BY) == "fairq":
                try:
                    _delete_priority_class(scheduling, name)
                except Exception as exc:
                    report["failed"].append(sync_failure("PriorityClass", name, exc))
                    continue
                report["deleted"].append(name)
        return report

    @staticmethod
    def _sync_priority_class(scheduling: Any, c: PriorityClassSpec, cur: Obj | None) -> str:
        """One tier's class; returns the report key of what was done."""
        from kubernetes.client.exceptions import ApiException

        body = priority_class_manifest(name=c.name, value=c.value,
                                       preemption_policy=c.preemption_policy, tier=c.tier)
        outcome = "created"
        if cur is not None:
            if (cur["metadata"].get("labels") or {}).get(MANAGED_BY) != "fairq":
                return "conflicts"
            if cur.get("value") == c.value and \
                    cur.get("preemptionPolicy", "PreemptLowerPriority") == c.preemption_policy:
                return "unchanged"
            # Pods keep the integer priority they were admitted with.
            _delete_priority_class(scheduling, c.name)
            outcome = "replaced"
        try:
            scheduling.create_priority_class(cast(Any, body))
        except ApiException as exc:
            if exc.status != 409:
                raise
        return outcome


def _delete_priority_class(scheduling: Any, name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        scheduling.delete_priority_class(name)
    except ApiException as exc:
        if exc.status != 404:
            raise
