"""The Kubernetes backend: one batch/v1 Job per job attempt (docs/kubernetes.md).

- submit  — `fq-<job id>-<attempt>` in the team's namespace (`<prefix><team>`, made by
            the provisioner, `ensure_namespace`: labelled, a ResourceQuota mirroring the
            team's quota, a RoleBinding for the scheduler; or on first use when
            provision="scheduler"; else an unprovisioned one raises NamespaceNotProvisioned);
            creating a name that exists is adopted (409), an invalid spec (422) fails
            the job (`SubmitRejected`), anything else is retried by the next cycle.
- statuses, nodes — read an in-process cache fed by watches (fairq's Jobs and Pods,
            other pods' GPU requests, Nodes), so the scheduler cycle costs no API call.
- stop    — deletes the Job with `propagationPolicy=Foreground`: the Job stays listed
            (with a deletionTimestamp) until its pods are gone, and `nodes()` counts the
            GPUs of pods being deleted, so freed GPUs show as free only once they are.
            A Job that already finished is not deleted but forgotten, so its pods' logs
            stay readable until `ttlSecondsAfterFinished` removes it.
- logs    — the pods' logs through the API server (the worker archives them for the web).

Only the worker uses this class; web processes read what it publishes (queueing/cluster.py,
services/logs.py). The watch threads start on first use and kick a scheduler cycle when
a fairq pod or Job changes phase.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from .base import LaunchSpec, NodeInfo, Phase, SubmitRejected, SubmitRequeue, WorkloadStatus
from .k8s_cache import Informer, Obj, key_of
from .k8s_manifest import (
    L_WORKLOAD,
    MANAGED_BY,
    QUOTA_NAME,
    SELECTOR,
    GpuTypeRef,
    ManifestError,
    ManifestOptions,
    adoption_verdict,
    capacity,
    job_finished,
    job_manifest,
    namespace_for,
    namespace_manifest,
    orphan_pods_status,
    parse_time,
    pod_is_terminal,
    pods_finished,
    priority_class_manifest,
    resource_quota_manifest,
    role_binding_manifest,
    sealed_by_fairq,
    sign_job,
    unbound_demand,
    workload_status,
)

log = logging.getLogger(__name__)

# How long a Job deleted outside fairq after it ran is still reported (as FAILED), so
# the job that owned it does not stay RUNNING for ever.
TOMBSTONE_SECONDS = 600.0


class KubernetesBackendError(Exception):
    """The cluster cannot answer yet (caches not synced, API down): retry later."""


class NamespaceNotProvisioned(KubernetesBackendError):
    """FAIRQ_K8S_PROVISION=separate and the team's namespace has no RoleBinding for the
    scheduler yet: `manage.py sync_cluster` (the provisioner) has not run for the team."""


# How long a "not provisioned" answer is believed before asking the API server again.
UNPROVISIONED_RECHECK_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class PriorityClassSpec:
    name: str
    value: int
    preemption_policy: str
    tier: str


def _api_error(exc: Exception) -> tuple[int, str]:
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None) or ""
    message = str(getattr(exc, "reason", "") or exc)
    try:
        parsed = json.loads(body) if body else {}
        message = parsed.get("message") or message
    except (ValueError, AttributeError):
        pass
    return status, str(message)


def sync_failure(kind: str, name: str, exc: Exception) -> dict[str, Any]:
    """One object `sync_cluster` could not make as it should be: kind, name, the HTTP
    status (400 when fairq refused it itself, e.g. a name that is no DNS-1123 label; 0
    when there was no answer) and why."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        status, message = _api_error(exc)
        error = f"({status}) {message}"
    elif isinstance(exc, ManifestError):
        status, error = 400, str(exc)
    else:
        status, error = 0, str(exc) or type(exc).__name__
    log.warning("sync: %s %s failed: %s", kind, name, error)
    return {"kind": kind, "name": name, "status": status, "error": error}


class _Debounced:
    """Call `fn` at most once per `interval`, and once more after the interval when calls
    arrived inside it (trailing edge), so the last change is never dropped."""

    def __init__(self, fn: Callable[[], None], interval: float = 1.0) -> None:
        self._fn = fn
        self._interval = interval
        self._lock = threading.Lock()
        self._last = 0.0
        self._pending = False

    def __call__(self) -> None:
        with self._lock:
            now = time.monotonic()
            if self._pending:
                return
            wait = self._last + self._interval - now
            if wait <= 0:
                self._last = now
                fire = True
            else:
                self._pending = True
                fire = False
        if fire:
            self._call()
        else:
            t = threading.Timer(wait + 0.05, self._trailing)
            t.daemon = True
            t.start()

    def _trailing(self) -> None:
        with self._lock:
            self._pending = False
            self._last = time.monotonic()
        self._call()

    def _call(self) -> None:
        try:
            self._fn()
        except Exception:
            log.exception("scheduler kick failed")


class KubernetesBackend:
    def __init__(
        self,
        api_client: Any,
        *,
        namespace_prefix: str = "fairq-",
        backoff_limit: int = 0,
        ttl_after_finished_seconds: int | None = 3600,
        image_pull_timeout_seconds: float = 300.0,
        pod_create_timeout_seconds: float | None = 120.0,
        termination_grace_seconds: int = 30,
        registry_allowlist: Sequence[str] = (),
        gpu_types: Sequence[GpuTypeRef] | Callable[[], Sequence[GpuTypeRef]] = (),
        gpu_types_ttl_seconds: float = 30.0,
        team_quota: Callable[[str], Mapping[str, int]] | None = None,
        resync_seconds: float = 300.0,
        watch_seconds: int = 60,
        sync_timeout_seconds: float = 30.0,
        kick: Callable[[], None] | None = None,
        provision: str = "scheduler",
        scheduler_account: tuple[str, str] | None = None,
        owner_key: bytes = b"",
        submit_concurrency: int = 1,
        orphan_pod_grace_seconds: float = 30.0,
    ) -> None:
        if provision not in ("scheduler", "separate"):
            raise ValueError(f"provision must be 'scheduler' or 'separate', not {provision!r}")
        self.api = api_client
        # "scheduler": this process creates team namespaces and quotas on first use (the
        # old, cluster-wide RBAC). "separate": the provisioner does (sync_cluster), and
        # submit only checks the namespace is provisioned (docs/kubernetes.md, "RBAC").
        self.provision = provision
        # (namespace, name) of the service account the provisioner binds in each team
        # namespace; None binds nothing (out-of-cluster, a user's own credentials).
        self.scheduler_account = scheduler_account
        self._unprovisioned: dict[str, float] = {}  # namespace → when it was last refused
        # Seals the Jobs fairq creates (k8s_manifest.sign_job); from SECRET_KEY in
        # from_settings. Empty (tests, benches) still seals, with a key anyone knows.
        self.owner_key = owner_key
        # How many creates the cycle may have in flight (scheduler.submit_admitted); the
        # client's connection pool must hold that many on top of the watches.
        self.submit_concurrency = max(1, submit_concurrency)
        self.namespace_prefix = namespace_prefix
        self.backoff_limit = backoff_limit
        self.ttl_after_finished_seconds = ttl_after_finished_seconds
        self.image_pull_timeout_seconds = image_pull_timeout_seconds
        self.pod_create_timeout_seconds = pod_create_timeout_seconds
        self.orphan_pod_grace_seconds = orphan_pod_grace_seconds
        self.termination_grace_seconds = termination_grace_seconds
        self.registry_allowlist = tuple(registry_allowlist)
        self._gpu_types_source = gpu_types
        self._gpu_types_ttl = gpu_types_ttl_seconds
        self._gpu_types_cache: tuple[float, Sequence[GpuTypeRef]] | None = None
        self.team_quota = team_quota
        self.sync_timeout_seconds = sync_timeout_seconds
        self._kick = _Debounced(kick) if kick is not None else None
        self._lock = threading.Lock()
        self._known_namespaces: set[str] = set()
        self._namespace_non_root: dict[str, bool] = {}  # the PSA level each was labelled
        self._where: dict[str, str] = {}  # workload name → namespace
        self._stopping: set[str] = set()  # names fairq deleted
        self._hidden: dict[str, datetime] = {}  # finished Jobs fairq forgot: name → finished
        self._ran: dict[str, datetime] = {}  # names seen RUNNING → started_at
        self._tombstones: dict[str, tuple[float, WorkloadStatus]] = {}
        self._version: tuple[int, int] | None = None
        self._last_housekeeping = 0.0
        self._started = False
        self._resync_seconds = resync_seconds
        self._watch_seconds = watch_seconds
        self._pid = os.getpid()
        self._wire()

    def _wire(self) -> None:
        """API objects and informers for this process (again after a fork: threads do not
        survive one, and the parent's connections must not be shared)."""
        from kubernetes import client

        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.scheduling = client.SchedulingV1Api(self.api)
        resync_seconds, watch_seconds = self._resync_seconds, self._watch_seconds
        self.jobs = Informer("jobs", self.batch.list_job_for_all_namespaces,
                             label_selector=SELECTOR, resync_seconds=resync_seconds,
                             watch_seconds=watch_seconds, on_change=self._job_changed)
        self.pods = Informer("pods", self.core.list_pod_for_all_namespaces,
                             label_selector=SELECTOR, resync_seconds=resync_seconds,
                             watch_seconds=watch_seconds, on_change=self._pod_changed)
        # Everyone else's GPUs: non-terminal pods bound to a node, not fairq's.
        self.other_pods = Informer(
            "other-pods", self.core.list_pod_for_all_namespaces,
            label_selector=f"{MANAGED_BY}!=fairq",
            field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
            resync_seconds=resync_seconds, watch_seconds=watch_seconds)
        self.nodes_informer = Informer("nodes", self.core.list_node,
                                       resync_seconds=resync_seconds,
                                       watch_seconds=watch_seconds,
                                       on_change=self._node_changed)
        self._informers = (self.jobs, self.pods, self.other_pods, self.nodes_informer)
        # The Job controller's FailedCreate events (why a Job has no pods), watched so
        # the cycle never asks per Job. Not waited for: without it (not synced, or not
        # allowed to list events) a Job without pods only shows as waiting, never fails.
        self.events = Informer(
            "events", self.core.list_event_for_all_namespaces,
            field_selector="involvedObject.kind=Job,reason=FailedCreate",
            resync_seconds=resync_seconds, watch_seconds=watch_seconds)

    # --- construction -----------------------------------------------------------------

    @classmethod
    def from_settings(cls) -> KubernetesBackend:
        """A backend for the cluster in settings: FAIRQ_KUBECONFIG (and FAIRQ_KUBE_CONTEXT)
        when set, else the in-cluster service account, else ~/.kube/config."""
        from django.conf import settings

        from . import k8s_sync

        concurrency = settings.FAIRQ_K8S_SUBMIT_CONCURRENCY
        api = api_client_from_config(kubeconfig=settings.FAIRQ_KUBECONFIG,
                                     context=settings.FAIRQ_KUBE_CONTEXT,
                                     pool_size=concurrency + 8)

        def kick() -> None:
            from queueing.tasks import kick_scheduler

            kick_scheduler()

        return cls(
            api,
            namespace_prefix=settings.FAIRQ_KUBE_NAMESPACE_PREFIX,
            backoff_limit=settings.FAIRQ_K8S_BACKOFF_LIMIT,
            ttl_after_finished_seconds=settings.FAIRQ_K8S_TTL_AFTER_FINISHED_SECONDS,
            image_pull_timeout_seconds=settings.FAIRQ_K8S_IMAGE_PULL_TIMEOUT_SECONDS,
            pod_create_timeout_seconds=settings.FAIRQ_K8S_POD_CREATE_TIMEOUT_SECONDS,
            termination_grace_seconds=settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS,
            registry_allowlist=settings.FAIRQ_REGISTRY_ALLOWLIST,
            gpu_types=k8s_sync.gpu_type_refs,
            team_quota=k8s_sync.team_gpu_limits,
            resync_seconds=settings.FAIRQ_K8S_RESYNC_SECONDS,
            kick=kick,
            provision=settings.FAIRQ_K8S_PROVISION,
            scheduler_account=scheduler_account_setting(),
            owner_key=hmac.new(settings.SECRET_KEY.encode(), b"fairq.k8s.job-owner",
                               hashlib.sha256).digest(),
            submit_concurrency=concurrency,
            orphan_pod_grace_seconds=settings.FAIRQ_K8S_ORPHAN_POD_GRACE_SECONDS,
        )

    def _after_fork(self) -> None:
        """In a forked child (gunicorn --preload, Celery prefork) start over: a new
        connection pool and new informers (the parent's threads did not come along)."""
        if self._pid == os.getpid():
            return
        from kubernetes import client

        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self.api = client.ApiClient(self.api.configuration)
                self._wire()
                self._started = False

    def start(self) -> KubernetesBackend:
        self._after_fork()
        with self._lock:
            if self._started:
                return self
            self._started = True
        for informer in (*self._informers, self.events):
            informer.start()
        return self

    def wait_synced(self, timeout: float | None = None) -> None:
        """Start the watches and wait for their first list; raises when one does not
        arrive in time (the cycle fails and is retried: an empty cache must never be
        read as "no workloads", or every admitted job would look vanished)."""
        self.start()
        deadline = time.monotonic() + (self.sync_timeout_seconds if timeout is None else timeout)
        for informer in self._informers:
            if not informer.wait_synced(max(0.0, deadline - time.monotonic())):
                raise KubernetesBackendError(
                    f"the {informer.name} watch has not synced with the API server"
                    + (f": {informer.last_error}" if informer.last_error else ""))

    def close(self) -> None:
        for informer in (*self._informers, self.events):
            informer.request_stop()
        for informer in (*self._informers, self.events):
            informer.stop(timeout=5.0)
        try:
            self.api.close()
        except Exception:
            log.debug("closing the API client failed", exc_info=True)

    # --- server version -----------------------------------------------------------------

    def server_version(self) -> tuple[int, int]:
        if self._version is None:
            from kubernetes import client

            code = client.VersionApi(self.api).get_code()
            self._version = (int(re.sub(r"\D", "", code.major) or 0),
                             int(re.sub(r"\D", "", code.minor) or 0))
        return self._version

    def indexed_jobs_served(self) -> bool:
        """completionMode=Indexed: alpha in 1.21 (off), beta in 1.22 (on), GA in 1.24.
        Older servers drop the field silently, so it is only set where it means something."""
        return self.server_version() >= (1, 22)

    # --- submit -------------------------------------------------------------------------

    def _options(self, namespace: str) -> ManifestOptions:
        return ManifestOptions(
            namespace=namespace, backoff_limit=self.backoff_limit,
            ttl_seconds_after_finished=self.ttl_after_finished_seconds,
            indexed=self.indexed_jobs_served(),
            termination_grace_seconds=self.termination_grace_seconds,
        )

    def manifest(self, spec: LaunchSpec) -> dict[str, Any]:
        """The Job `submit` would create (raises SubmitRejected when it cannot exist)."""
        from queueing.validation import registry_problem

        problem = registry_problem(spec.image, self.registry_allowlist)
        if problem:
            raise SubmitRejected(problem)
        try:
            namespace = namespace_for(spec.team, self.namespace_prefix)
            return job_manifest(spec, self._options(namespace))
        except ManifestError as exc:
            raise SubmitRejected(str(exc)) from exc

    def submit(self, spec: LaunchSpec, *, now: datetime) -> None:
        """Create the attempt's Job, or adopt the one that holds its name if fairq created
        it (its owner seal verifies: `k8s_manifest.adoption_verdict`); a Job fairq did not
        create raises SubmitRejected, one being deleted SubmitRequeue. Safe to call from
        several threads at once (the cycle does)."""
        from kubernetes.client.exceptions import ApiException

        self._after_fork()
        body = sign_job(self.manifest(spec), self.owner_key)
        namespace = body["metadata"]["namespace"]
        cached = self.jobs.get(f"{namespace}/{spec.name}") if self._started else None
        if cached is not None:
            self._adopt(cached, body)  # already there: the name is the identity
            return
        if self.provision == "scheduler":
            self.ensure_namespace(spec.team, run_as_non_root=spec.run_as_non_root)
        elif not self.namespace_ready(namespace):
            raise NamespaceNotProvisioned(
                f"namespace {namespace} is not provisioned for fairq yet "
                "(the provisioner runs `manage.py sync_cluster`)")
        try:
            self._create_job(namespace, body)
        except ApiException as exc:
            status, message = _api_error(exc)
            if status == 409:
                existing = self._read_job(namespace, spec.name)
                if existing is None:  # deleted since: the next cycle creates it
                    raise KubernetesBackendError(
                        f"{spec.name} existed a moment ago and is gone now; retrying") from exc
                self._adopt(existing, body)
                return
            if status in (400, 422):
                raise SubmitRejected(f"Kubernetes refused the Job: {message}") from exc
            if status == 404:
                self._known_namespaces.discard(namespace)
                if self.provision == "separate":
                    self._unprovisioned[namespace] = time.monotonic()
                    raise NamespaceNotProvisioned(
                        f"namespace {namespace} does not exist (the provisioner runs "
                        "`manage.py sync_cluster`)") from exc
            raise KubernetesBackendError(
                f"creating {spec.name} failed ({status}): {message}") from exc
        except ValueError as exc:  # the client's model validation: our body is malformed
            raise SubmitRejected(f"invalid Job: {exc}") from exc
        with self._lock:
            self._where[spec.name] = namespace

    def _adopt(self, existing: Obj, body: Mapping[str, Any]) -> None:
        """Take over a Job holding the name of `body`, or raise why not (finding 11.4)."""
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        verdict, why = adoption_verdict(existing, body, key=self.owner_key)
        if verdict == "refuse":
            log.warning("%s: %s", name, why)
            raise SubmitRejected(why)
        if verdict == "requeue":
            log.info("%s: %s; requeued as a new attempt", name, why)
            raise SubmitRequeue(why)
        log.info("%s already exists: adopted%s", name, f" ({why})" if why else "")
        with self._lock:
            self._where[name] = namespace

    def _read_job(self, namespace: str, name: str) -> Obj | None:
        """The Job as the API server has it now (JSON), None when there is none. A list
        by name, not a get: fairq's RBAC grants jobs list and watch, not get."""
        items = _raw_list(self.batch.list_namespaced_job, namespace=namespace,
                          field_selector=f"metadata.name={name}")
        return items[0] if items else None

    def _create_job(self, namespace: str, body: dict[str, Any]) -> None:
        """POST the Job as JSON. With the 37.x client's public `param_serialize` and
        `call_api` this skips validating the body into models and deserializing the
        answer, which cost a third of a create (bench/bench_k8s.py); older clients take
        the generated method."""
        from kubernetes.client.exceptions import ApiException

        if not hasattr(self.api, "param_serialize"):
            _drain(self.batch.create_namespaced_job(namespace, cast(Any, body),
                                                    _preload_content=False))
            return
        request = self.api.param_serialize(
            method="POST", resource_path=f"/apis/batch/v1/namespaces/{namespace}/jobs",
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"])
        resp = self.api.call_api(*request, _request_timeout=30)
        resp.read()
        if not 200 <= resp.status <= 299:
            raise ApiException.from_response(http_resp=resp, body=None, data=None)

    def namespace_ready(self, namespace: str) -> bool:
        """Did the provisioner make `namespace`? Its ResourceQuota `fairq-gpus` is read
        (fairq-team-workloads may read that one object once the RoleBinding is there):
        403 (no binding) or 404 (no namespace) means not yet. Asked once per namespace;
        a "no" is asked again after UNPROVISIONED_RECHECK_SECONDS."""
        from kubernetes.client.exceptions import ApiException

        if namespace in self._known_namespaces:
            return True
        refused = self._unprovisioned.get(namespace)
        if refused is not None and time.monotonic() - refused < UNPROVISIONED_RECHECK_SECONDS:
            return False
        self._after_fork()
        try:
            _drain(self.core.read_namespaced_resource_quota(
                QUOTA_NAME, namespace, _preload_content=False, _request_timeout=(5, 10)))
        except ApiException as exc:
            if exc.status not in (403, 404):
                raise
            self._unprovisioned[namespace] = time.monotonic()
            return False
        self._known_namespaces.add(namespace)
        self._unprovisioned.pop(namespace, None)
        return True

    def unprovisioned_teams(self, teams: Iterable[str]) -> set[str]:
        """The teams whose jobs cannot be submitted because their namespace is not
        provisioned (FAIRQ_K8S_PROVISION=separate only: otherwise submit provisions).
        An API server that does not answer counts as "provisioned": the submit then
        fails and is retried, as any other transient error."""
        if self.provision == "scheduler":
            return set()
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
        if namespace in self._known_namespaces and not force and \
                self._namespace_non_root.get(namespace, run_as_non_root) == run_as_non_root:
            return namespace
        body = namespace_manifest(namespace, team, run_as_non_root=run_as_non_root)
        try:
            self.core.create_namespace(cast(Any, body))
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.core.patch_namespace(namespace, {"metadata": {
                "labels": body["metadata"]["labels"]}})
        if self.scheduler_account is not None:
            self.apply_role_binding(namespace)
        # Ready once its quota is in place (apply_quota marks it known).
        if self.team_quota is None:
            self._known_namespaces.add(namespace)
        elif quota:
            self.apply_quota(namespace, self.team_quota(team))
        self._namespace_non_root[namespace] = run_as_non_root
        return namespace

    def apply_role_binding(self, namespace: str) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        assert self.scheduler_account is not None
        sa_namespace, sa_name = self.scheduler_account
        body = role_binding_manifest(namespace, service_account=sa_name,
                                     service_account_namespace=sa_namespace)
        rbac = client.RbacAuthorizationV1Api(self.api)
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
        try:
            if replace_only:
                raise ApiException(status=409)
            self.core.create_namespaced_resource_quota(namespace, cast(Any, body))
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.core.replace_namespaced_resource_quota(
                body["metadata"]["name"], namespace,
                cast(Any, body))
        # Its quota in place, the namespace is ready: submit skips it from now on.
        self._known_namespaces.add(namespace)

    # --- stop ---------------------------------------------------------------------------

    def _namespace_of(self, name: str) -> str | None:
        with self._lock:
            ns = self._where.get(name)
        if ns is not None:
            return ns
        for job in self.jobs.items():
            if job["metadata"]["name"] == name and self._fairqs(job):
                return str(job["metadata"]["namespace"])
        return None

    def stop(self, name: str, *, now: datetime) -> None:
        """Delete the Job (Foreground: its pods first). A finished Job is only forgotten
        (its pods' logs stay readable until its TTL); unknown names are a no-op."""

        self.start()
        with self._lock:
            self._tombstones.pop(name, None)
        self._delete_orphan_pods(name)
        namespace = self._namespace_of(name) or self._find_namespace(name)
        if namespace is None:
            return
        job = self.jobs.get(f"{namespace}/{name}")
        if job is not None:
            if job["metadata"].get("deletionTimestamp"):
                return  # already going
            # Finished by its condition, or all its pods ended before the Job controller
            # wrote it: nothing holds GPUs, and deleting would lose the logs.
            finished = job_finished(job) or pods_finished(
                self._pods_by_workload().get(f"{namespace}/{name}", []))
            if finished is not None and not self._expired(finished, now):
                with self._lock:
                    self._hidden[name] = finished
                return
        with self._lock:
            self._stopping.add(name)
        try:
            _drain(self.batch.delete_namespaced_job(name, namespace,
                                                    propagation_policy="Foreground",
                                                    _preload_content=False))
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                # Not asked after all: statuses() must not report it as stopping, or
                # the cycle would never ask again.
                with self._lock:
                    self._stopping.discard(name)
                raise

    def _delete_orphan_pods(self, name: str) -> None:
        """Delete the pods of workload `name` that no Job owns any more (a Job deleted
        with orphan propagation): nothing else would ever stop them."""
        from kubernetes.client.exceptions import ApiException

        jobs = {key_of(j) for j in self.jobs.items()}
        for pod in self.pods.items():
            meta = pod["metadata"]
            if (meta.get("labels") or {}).get(L_WORKLOAD) != name or not self._ours(meta) \
                    or meta.get("deletionTimestamp") or _owned_by_job(pod) \
                    or f"{meta['namespace']}/{name}" in jobs:
                continue
            try:
                _drain(self.core.delete_namespaced_pod(
                    meta["name"], meta["namespace"], _preload_content=False,
                    body=cast(Any, {"preconditions": {"uid": meta.get("uid")}})))
                log.info("deleted pod %s/%s: its Job is gone", meta["namespace"], meta["name"])
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise

    def _find_namespace(self, name: str) -> str | None:
        """A Job created moments ago, or before this process started, may not be in the
        cache yet: ask the API server."""
        items = _raw_list(self.batch.list_job_for_all_namespaces,
                          label_selector=f"{L_WORKLOAD}={name}")
        mine = [i for i in items if self._fairqs(i)]
        return str(mine[0]["metadata"]["namespace"]) if mine else None

    def _ours(self, meta: Mapping[str, Any]) -> bool:
        """In one of this fairq's team namespaces (the prefix tells fairq instances apart)."""
        return str(meta.get("namespace", "")).startswith(self.namespace_prefix)

    def _fairqs(self, job: Mapping[str, Any]) -> bool:
        """A Job this fairq created: in its namespaces, with an owner seal that verifies.
        A Job someone else made under a fairq name and labels (finding 11.4) is not a
        workload: never reported, charged, adopted or stopped."""
        return self._ours(job.get("metadata") or {}) and sealed_by_fairq(job, self.owner_key)

    def _expired(self, finished: datetime, now: datetime) -> bool:
        if self.ttl_after_finished_seconds is None:
            return True
        return now - finished > timedelta(seconds=self.ttl_after_finished_seconds + 120)

    # --- statuses -----------------------------------------------------------------------

    def _pods_by_workload(self) -> dict[str, list[Obj]]:
        by: dict[str, list[Obj]] = defaultdict(list)
        for pod in self.pods.items():
            workload = (pod["metadata"].get("labels") or {}).get(L_WORKLOAD)
            if workload:
                by[f"{pod['metadata'].get('namespace')}/{workload}"].append(pod)
        return by

    def statuses(self, *, now: datetime) -> list[WorkloadStatus]:
        self.wait_synced()
        pods = self._pods_by_workload()
        out: list[WorkloadStatus] = []
        housekeeping: list[tuple[str, str]] = []
        with self._lock:
            hidden = dict(self._hidden)
        create_errors = self._create_errors()
        job_keys: set[str] = set()
        for job in self.jobs.items():
            meta = job["metadata"]
            name = meta["name"]
            if not self._ours(meta):
                continue  # another fairq's (a staging instance on the same cluster)
            key = f"{meta['namespace']}/{name}"
            job_keys.add(key)  # its pods are a Job's, not orphans, whoever made it
            if not sealed_by_fairq(job, self.owner_key):
                continue  # not fairq's (finding 11.4): not reported, charged or stopped
            job_pods = pods.get(key, [])
            if name in hidden:
                if any(not pod_is_terminal(p) for p in job_pods) and job_finished(job) is None:
                    # Forgotten when its pods had ended, but the Job controller started
                    # another: report it again, so the cycle stops it.
                    with self._lock:
                        self._hidden.pop(name, None)
                else:
                    if self._expired(hidden[name], now) and not meta.get("deletionTimestamp"):
                        housekeeping.append((name, meta["namespace"]))
                    continue
            status = workload_status(job, job_pods, now=now,
                                     image_pull_timeout_seconds=self.image_pull_timeout_seconds,
                                     pod_create_timeout_seconds=self.pod_create_timeout_seconds,
                                     create_error=create_errors.get(key, "")
                                     if not job_pods else "")
            if status is None:
                continue
            if status.started_at is not None:
                with self._lock:
                    self._ran.setdefault(name, status.started_at)
            with self._lock:
                if name in self._stopping and not status.stopping:
                    status = replace(status, stopping=True)  # asked; the watch lags
            out.append(status)
        listed = {s.name for s in out}
        with self._lock:
            for name, (until, tomb) in list(self._tombstones.items()):
                if until < time.monotonic():
                    del self._tombstones[name]
                elif name not in listed:
                    out.append(tomb)
                    listed.add(name)
        out.extend(self._orphan_pods(pods, job_keys, listed, now=now))
        if housekeeping and time.monotonic() - self._last_housekeeping > 60:
            self._last_housekeeping = time.monotonic()
            for name, namespace in housekeeping:
                # Finished, forgotten by fairq and past its TTL: the TTL controller is
                # off (1.20 without the TTLAfterFinished gate), so clean up ourselves.
                self._delete_quietly(name, namespace)
        return out

    def _create_errors(self) -> dict[str, str]:
        """The Job controller's last FailedCreate message per fairq Job ("ns/name"), from
        the events watch: no API call, however many Jobs wait for pods."""
        latest: dict[str, tuple[str, str]] = {}
        for event in self.events.items():
            involved = event.get("involvedObject") or {}
            if not str(involved.get("namespace", "")).startswith(self.namespace_prefix):
                continue
            key = f"{involved.get('namespace')}/{involved.get('name')}"
            at = str(event.get("lastTimestamp") or event.get("eventTime") or "")
            if key not in latest or at >= latest[key][0]:
                latest[key] = (at, str(event.get("message") or "")[:300])
        return {k: m for k, (_, m) in latest.items()}

    def _orphan_pods(self, pods: Mapping[str, list[Obj]], job_keys: set[str],
                     listed: set[str], *, now: datetime) -> list[WorkloadStatus]:
        """fairq pods whose Job is gone (deleted with orphan propagation, or while fairq
        was down), once older than the grace (a pod can reach the cache before its Job):
        pods that ran are reported (`orphan_pods_status`; the cycle charges them and
        calls `stop`, which deletes them); pods that never ran are deleted here."""
        out: list[WorkloadStatus] = []
        grace = timedelta(seconds=self.orphan_pod_grace_seconds)
        for key, group in pods.items():
            namespace, name = key.split("/", 1)
            if key in job_keys or not namespace.startswith(self.namespace_prefix):
                continue
            # Only pods no Job owns: orphan propagation removes the owner reference; a pod
            # that still has one belongs to a Job the cache may merely lag behind on (or
            # one being garbage collected).
            live = [p for p in group
                    if not p["metadata"].get("deletionTimestamp") and not _owned_by_job(p)]
            created = [parse_time(p["metadata"].get("creationTimestamp")) for p in live]
            if not live or any(c is None or now - c < grace for c in created):
                continue
            status = orphan_pods_status(name, live, now=now)
            if status is None:
                self._delete_orphan_pods(name)
            elif name not in listed:
                out.append(status)
        return out

    def _delete_quietly(self, name: str, namespace: str) -> None:
        try:
            with self._lock:
                self._stopping.add(name)
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
        except Exception as exc:
            with self._lock:
                self._stopping.discard(name)
            log.info("deleting finished Job %s/%s failed: %s", namespace, name, exc)

    # --- nodes --------------------------------------------------------------------------

    def gpu_types(self) -> Sequence[GpuTypeRef]:
        source = self._gpu_types_source
        if not callable(source):
            return source
        cached = self._gpu_types_cache
        if cached is None or time.monotonic() - cached[0] > self._gpu_types_ttl:
            cached = (time.monotonic(), tuple(source()))
            self._gpu_types_cache = cached
        return cached[1]

    def nodes(self) -> list[NodeInfo]:
        self.wait_synced()
        fairq_pods = self.pods.items()
        unbound: dict[str, int] = defaultdict(int)
        by = self._pods_by_workload()
        for job in self.jobs.items():
            key = f"{job['metadata']['namespace']}/{job['metadata']['name']}"
            for node, n in unbound_demand(job, by.get(key, [])).items():
                unbound[node] += n
        return capacity(self.nodes_informer.items(), fairq_pods + self.other_pods.items(),
                        self.gpu_types(), unbound=unbound)

    # --- logs ---------------------------------------------------------------------------

    def logs(self, name: str, *, tail: int = 100) -> str:
        """The last `tail` lines of each pod of the workload (a header per pod when there
        are several); a readable line instead of an error when a pod has no logs."""
        from kubernetes.client.exceptions import ApiException

        self._after_fork()
        try:
            pods = _raw_list(self.core.list_pod_for_all_namespaces,
                             label_selector=f"{L_WORKLOAD}={name}")
        except ApiException as exc:
            status, message = _api_error(exc)
            return f"[fairq] cannot list the pods of {name} ({status}): {message}"
        if not pods:
            return ""
        pods.sort(key=lambda p: p["metadata"]["name"])
        chunks: list[str] = []
        for pod in pods:
            pod_name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
            try:
                text = self.core.read_namespaced_pod_log(
                    pod_name, namespace, container="main", tail_lines=tail,
                    _request_timeout=(5, 30))
            except ApiException as exc:
                status, message = _api_error(exc)
                if status == 404:
                    text = f"[fairq] pod {pod_name} is gone; its logs with it"
                else:
                    text = f"[fairq] no logs from pod {pod_name} ({status}): {message}"
            except Exception as exc:
                text = f"[fairq] no logs from pod {pod_name}: {exc}"
            lines = str(text or "").splitlines()
            if len(pods) > 1:
                chunks.append(f"==> {pod_name} <==")
            chunks.extend(lines[-tail:])
        return "\n".join(chunks)

    # --- priority classes ---------------------------------------------------------------

    def sync_priority_classes(self, classes: Sequence[PriorityClassSpec]) -> dict[str, list[Any]]:
        """Create, update (delete + create: value and preemptionPolicy are immutable) and
        delete fairq's PriorityClasses so there is exactly one per tier. Classes fairq did
        not create are never touched; a name clash is reported. Each class is handled on
        its own: one the API server refuses (an invalid name: 422) is reported in
        `failed` and the others are still synced."""
        report: dict[str, list[Any]] = {"created": [], "replaced": [], "unchanged": [],
                                        "deleted": [], "conflicts": [], "failed": []}
        try:
            existing = {p["metadata"]["name"]: p
                        for p in _raw_list(self.scheduling.list_priority_class)}
        except Exception as exc:
            report["failed"].append(sync_failure("PriorityClass", "*", exc))
            return report
        wanted = {c.name: c for c in classes}
        for c in classes:
            try:
                outcome = self._sync_priority_class(c, existing.get(c.name))
            except Exception as exc:
                report["failed"].append(sync_failure("PriorityClass", c.name, exc))
                continue
            report[outcome].append(c.name)
        for name, cur in existing.items():
            if name not in wanted and (cur["metadata"].get("labels") or {}).get(MANAGED_BY) == "fairq":
                try:
                    self._delete_priority_class(name)
                except Exception as exc:
                    report["failed"].append(sync_failure("PriorityClass", name, exc))
                    continue
                report["deleted"].append(name)
        return report

    def _sync_priority_class(self, c: PriorityClassSpec, cur: Obj | None) -> str:
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
            self._delete_priority_class(c.name)
            outcome = "replaced"
        try:
            self.scheduling.create_priority_class(cast(Any, body))
        except ApiException as exc:
            if exc.status != 409:
                raise
        return outcome

    def _delete_priority_class(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.scheduling.delete_priority_class(name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    # --- watch hooks (informer threads: quick, no DB) ------------------------------------

    def _job_changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if not self._fairqs(new or old or {}):
            return
        if new is not None:
            with self._lock:
                self._where[new["metadata"]["name"]] = new["metadata"]["namespace"]
        if kind == "DELETED" and old is not None:
            self._job_deleted(old)
        old_c = _conditions(old)
        if kind in ("ADDED", "DELETED") or old_c != _conditions(new):
            self._poke()

    def _job_deleted(self, job: Obj) -> None:
        """A Job fairq did not stop is gone (kubectl, a removed namespace, the TTL
        controller before fairq saw the end): keep reporting its last status for a while,
        so its job is not left RUNNING for ever. A finished Job reports how it finished;
        one that ran but did not finish reports FAILED; one that never ran reports nothing
        (the cycle requeues an admitted job whose workload vanished)."""
        meta = job["metadata"]
        name = meta["name"]
        with self._lock:
            self._where.pop(name, None)
            acknowledged = name in self._stopping or name in self._hidden
            self._hidden.pop(name, None)
            self._stopping.discard(name)
            started = self._ran.pop(name, None)
        if acknowledged:
            return
        pods = self._pods_by_workload().get(f"{meta['namespace']}/{name}", [])
        now = datetime.now(UTC)
        status = workload_status(job, pods, now=now,
                                 image_pull_timeout_seconds=self.image_pull_timeout_seconds)
        if status is None:
            return
        if status.phase not in (Phase.SUCCEEDED, Phase.FAILED):
            if started is None and status.started_at is None:
                return
            status = WorkloadStatus(
                name=name, job_id=status.job_id, attempt=status.attempt, phase=Phase.FAILED,
                started_at=started or status.started_at, finished_at=now,
                nodes=status.nodes, reason="its Kubernetes Job was deleted outside fairq")
        with self._lock:
            # Gone, not going: a pod it left behind is the cycle's to stop.
            self._tombstones[name] = (time.monotonic() + TOMBSTONE_SECONDS,
                                      replace(status, stopping=False))

    def _pod_changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if kind in ("ADDED", "DELETED") or _phase(old) != _phase(new):
            self._poke()

    def _node_changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        # Capacity is read from the cache each cycle; a node that appears, leaves or
        # changes schedulability is worth a cycle now.
        if kind != "MODIFIED" or _node_key(old) != _node_key(new):
            self._poke()

    def _poke(self) -> None:
        if self._kick is not None and all(i.synced.is_set() for i in self._informers):
            self._kick()


def _owned_by_job(pod: Obj) -> bool:
    return any(ref.get("kind") == "Job" and ref.get("controller")
               for ref in pod["metadata"].get("ownerReferences") or ())


def _conditions(job: Obj | None) -> list[tuple[str, str]]:
    if job is None:
        return []
    return [(c.get("type", ""), c.get("status", ""))
            for c in (job.get("status") or {}).get("conditions") or ()]


def _phase(pod: Obj | None) -> tuple[str, bool]:
    if pod is None:
        return ("", False)
    return ((pod.get("status") or {}).get("phase") or "",
            bool(pod["metadata"].get("deletionTimestamp")))


def _node_key(node: Obj | None) -> Any:
    if node is None:
        return None
    spec = node.get("spec") or {}
    ready = [c.get("status") for c in (node.get("status") or {}).get("conditions") or ()
             if c.get("type") == "Ready"]
    return (spec.get("unschedulable"), json.dumps(spec.get("taints"), sort_keys=True), ready,
            json.dumps((node.get("status") or {}).get("allocatable"), sort_keys=True),
            json.dumps(node["metadata"].get("labels"), sort_keys=True))


def _drain(resp: Any) -> None:
    """Read and release a raw response, so its connection goes back to the pool."""
    try:
        resp.read()
    finally:
        resp.release_conn()


def _raw_list(func: Callable[..., Any], **kwargs: Any) -> list[Obj]:
    """The items of a list call as the API server's JSON (no model deserialization)."""
    resp = func(_preload_content=False, _request_timeout=60, **kwargs)
    try:
        return list(json.loads(resp.data).get("items") or [])
    finally:
        resp.release_conn()


def scheduler_account_setting() -> tuple[str, str] | None:
    """FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT ("namespace/name", "" for none)."""
    from django.conf import settings

    value = settings.FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT
    if not value:
        return None
    namespace, _, name = value.partition("/")
    return namespace, name


def api_client_from_config(*, kubeconfig: str = "", context: str = "",
                           pool_size: int = 16) -> Any:
    """A new ApiClient (never the global default configuration): from `kubeconfig` when
    given, else the in-cluster service account when running in a pod, else
    ~/.kube/config. Its connection pool keeps `pool_size` (at least 16) connections per
    host: the client is shared by the watch threads and the cycle's concurrent creates
    (urllib3's pool is thread-safe; past its size, connections are opened and dropped)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context or None,
                                client_configuration=cfg, persist_config=False)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=cfg)
    else:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            context=context or None, client_configuration=cfg,
                                persist_config=False)
    # Four long-lived watches plus the cycle's calls share the pool.
    cfg.connection_pool_maxsize = max(getattr(cfg, "connection_pool_maxsize", 0) or 0, 16,
                                      pool_size)
    return client.ApiClient(cfg)
