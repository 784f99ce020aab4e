"""The composition root: the one place that builds the cluster backends from settings
(docs/architecture.md). Backends read no settings and import nothing above them; what
they need from the rest of fairq is handed to them here: numbers from settings, the
scheduler `kick`, and the database reads the wiring layer provides at start-up
(`provide_database_reads`, called by `QueueingConfig.ready()`).

`get_backend()` returns the configured backend, one instance per cluster and process:
the one implicit cluster of settings, or (several clusters, docs/clusters.md) the backend
of a `Cluster` row given as a `ClusterConfig`, rebuilt when the row's connection fields
change.
Only the scheduler's side (the worker, management commands) calls it: web and API
processes read the published cluster view (queueing/selectors/cluster.py) instead, and ask
`backend_class()` what kind of backend is configured (its capabilities, `in_process`
and `provisions`) without building one.

`kick()` asks for a scheduler cycle soon: the only kick in fairq (services call it after
a submit or a finish, the Kubernetes backend's watches when a workload changes phase).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from django.conf import settings

from queueing.backends.base import ClusterBackend, UtilizationSource

if TYPE_CHECKING:
    from queueing.backends.k8s_manifest import GpuTypeRef
    from queueing.backends.k8s_provisioner import KubernetesProvisioner
    from queueing.backends.kubernetes import KubernetesBackend
    from queueing.backends.notebook_local import LocalNotebooks

log = logging.getLogger(__name__)
_lock = threading.Lock()
_instances: dict[str, ClusterBackend] = {}
# Per cluster name, the connection fields its cached backend was built from.
_built_from: dict[str, tuple[object, ...]] = {}
_sources: dict[str, UtilizationSource] = {}

# The Celery task a kick sends, by its registered name: this layer imports no task.
SCHEDULER_CYCLE_TASK = "queueing.tasks.scheduler_cycle_task"
STOP_WORKLOAD_TASK = "queueing.tasks.stop_workload_task"


# --- what the backends read from fairq's database ------------------------------------------

@dataclass(frozen=True, slots=True)
class DatabaseReads:
    """The reads a Kubernetes backend needs from fairq's database, as plain callables
    (services/provisioning.py), so backends and this module import no model."""

    gpu_types: Callable[[], Sequence[GpuTypeRef]]
    team_quota: Callable[[str], Mapping[str, int]]
    # The team slugs: the worker watches their namespaces only (docs/kubernetes.md, "RBAC").
    teams: Callable[[], Sequence[str]]


_reads: DatabaseReads | None = None


def provide_database_reads(reads: DatabaseReads) -> None:
    """Called once at start-up by the wiring layer (QueueingConfig.ready())."""
    global _reads
    _reads = reads


def _sim_units_per_gpu() -> dict[str, int]:
    """Shared GPUs: per GPU type, the units one simulated GPU counts (its
    `units_per_device`: slices per GPU of a time-sliced or MPS type, else 1)."""
    if _reads is None:
        return {}
    return {ref.slug: ref.units_per_device for ref in _reads.gpu_types()}


# --- the backends ----------------------------------------------------------------------------

def backend_class() -> type[ClusterBackend]:
    """The configured backend's class, for its capabilities (`in_process`, `provisions`):
    nothing is built and no cluster is asked. (This module is the only reader of
    FAIRQ_CLUSTER_BACKEND.)"""
    if settings.FAIRQ_CLUSTER_BACKEND == "kubernetes":
        from queueing.backends.kubernetes import KubernetesBackend

        return KubernetesBackend
    from queueing.backends.simulated import SimulatedCluster

    return SimulatedCluster


class ClusterConfig(Protocol):
    """What building a cluster's backend reads of its `Cluster` row (this layer imports
    no model: the row itself, or any object with these attributes)."""

    name: str
    backend: str
    kubeconfig: str
    context: str
    in_cluster: bool
    sim_nodes: str


def _connection(config: ClusterConfig) -> tuple[object, ...]:
    return (config.backend, config.kubeconfig, config.context, config.in_cluster,
            config.sim_nodes)


def get_backend(cluster: str | ClusterConfig = "default") -> ClusterBackend:
    """The backend for `cluster`, one per cluster and process: a name ("default") is the
    implicit cluster of settings; a `ClusterConfig` (a `Cluster` row) is built from its
    own fields, and built again when they changed since (a new kubeconfig, context or
    set of simulated nodes: the old instance is dropped, a simulated cluster's state
    with it)."""
    if isinstance(cluster, str):
        with _lock:
            if cluster not in _instances:
                _instances[cluster] = _build(cluster)
                _built_from[cluster] = ()
            return _instances[cluster]
    key, fields = f"cluster:{cluster.name}", _connection(cluster)
    old: ClusterBackend | None = None
    with _lock:
        if key not in _instances or _built_from.get(key) != fields:
            old = _instances.get(key)
            _instances[key] = _build_cluster(cluster)
            _built_from[key] = fields
        backend = _instances[key]
    close = getattr(old, "close", None)
    if callable(close):  # the old Kubernetes backend's watches and connections
        try:
            close()
        except Exception:
            log.warning("closing the old backend of cluster %s failed", cluster.name,
                        exc_info=True)
    return backend


def _build_cluster(config: ClusterConfig) -> ClusterBackend:
    if config.backend == "kubernetes":
        return kubernetes_backend(kubeconfig="" if config.in_cluster else config.kubeconfig,
                                  context="" if config.in_cluster else config.context)
    from queueing.backends.simulated import SimulatedCluster

    return SimulatedCluster.from_spec(config.sim_nodes,
                                      default_seconds=settings.FAIRQ_SIM_DEFAULT_SECONDS,
                                      stop_seconds=settings.FAIRQ_SIM_STOP_SECONDS,
                                      units_per_gpu=_sim_units_per_gpu,
                                      notebooks=_local_notebooks())


def get_provisioner(cluster: str = "default") -> KubernetesProvisioner | None:
    """The provisioner of the configured backend (namespaces, quotas, RoleBindings,
    PriorityClasses), driven by services/provisioning.py; None when the backend
    provisions nothing (the simulated cluster)."""
    if not backend_class().provisions:
        return None
    return getattr(get_backend(cluster), "provisioner", None)


def _build(cluster: str) -> ClusterBackend:
    if settings.FAIRQ_CLUSTER_BACKEND == "kubernetes":
        return kubernetes_backend_from_settings()
    from queueing.backends.simulated import SimulatedCluster

    return SimulatedCluster.from_spec(settings.FAIRQ_SIM_NODES,
                                      default_seconds=settings.FAIRQ_SIM_DEFAULT_SECONDS,
                                      stop_seconds=settings.FAIRQ_SIM_STOP_SECONDS,
                                      units_per_gpu=_sim_units_per_gpu,
                                      notebooks=_local_notebooks())


def _local_notebooks() -> LocalNotebooks | None:
    """Real local servers for the simulated cluster's sessions (the demo): with
    FAIRQ_SIM_NOTEBOOKS on and JupyterLab installed; else None (docs/sessions.md)."""
    from queueing.backends.notebook_local import LocalNotebooks, jupyterlab_installed

    if not settings.FAIRQ_SIM_NOTEBOOKS or not jupyterlab_installed():
        return None
    return LocalNotebooks(settings.FAIRQ_SIM_NOTEBOOK_DIR)


def scheduler_account_setting(
        name: str = "FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT") -> tuple[str, str] | None:
    """FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT, or the setting `name` ("namespace/name", ""
    for none)."""
    value = getattr(settings, name)
    if not value:
        return None
    namespace, _, name = value.partition("/")
    return namespace, name


def kubernetes_backend_from_settings() -> KubernetesBackend:
    """A new Kubernetes backend for the cluster in settings: FAIRQ_KUBECONFIG (and
    FAIRQ_KUBE_CONTEXT) when set, else the in-cluster service account, else
    ~/.kube/config. Not cached (get_backend() keeps one per process)."""
    return kubernetes_backend(kubeconfig=settings.FAIRQ_KUBECONFIG,
                              context=settings.FAIRQ_KUBE_CONTEXT)


def kubernetes_backend(*, kubeconfig: str, context: str) -> KubernetesBackend:
    """A new Kubernetes backend for the cluster `kubeconfig` and `context` reach (both
    empty: the in-cluster service account, else ~/.kube/config), configured from
    settings otherwise."""
    from queueing.backends.k8s_api import api_client_from_config
    from queueing.backends.kubernetes import KubernetesBackend

    if _reads is None:
        raise RuntimeError("the database reads are not provided: Django is not set up "
                           "(QueueingConfig.ready() calls provide_database_reads)")
    concurrency = settings.FAIRQ_K8S_SUBMIT_CONCURRENCY
    # The cycle's concurrent creates, or its concurrent log reads (never both at once),
    # plus the watches: four per team namespace (docs/kubernetes.md, "RBAC"), counted
    # now (teams added later open connections outside the pool until a restart).
    pool = max(concurrency, settings.FAIRQ_LOG_READ_CONCURRENCY)
    try:
        watches = 4 * len(_reads.teams()) + 1
    except Exception:  # no database yet: the pool is only a size
        watches = 8
    api = api_client_from_config(kubeconfig=kubeconfig, context=context,
                                 pool_size=pool + max(8, watches))
    return KubernetesBackend(
        api,
        namespace_prefix=settings.FAIRQ_KUBE_NAMESPACE_PREFIX,
        ttl_after_finished_seconds=settings.FAIRQ_K8S_TTL_AFTER_FINISHED_SECONDS,
        image_pull_timeout_seconds=settings.FAIRQ_K8S_IMAGE_PULL_TIMEOUT_SECONDS,
        pod_create_timeout_seconds=settings.FAIRQ_K8S_POD_CREATE_TIMEOUT_SECONDS,
        termination_grace_seconds=settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS,
        registry_allowlist=settings.FAIRQ_REGISTRY_ALLOWLIST,
        gpu_types=_reads.gpu_types,
        team_quota=_reads.team_quota,
        resync_seconds=settings.FAIRQ_K8S_RESYNC_SECONDS,
        kick=kick,
        provision=settings.FAIRQ_K8S_PROVISION,
        scheduler_account=scheduler_account_setting(),
        provisioner_account=scheduler_account_setting("FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT"),
        owner_key=hmac.new(settings.SECRET_KEY.encode(), b"fairq.k8s.job-owner",
                           hashlib.sha256).digest(),
        submit_concurrency=concurrency,
        spot_node_labels=settings.FAIRQ_SPOT_NODE_LABELS,
        spot_termination_taints=settings.FAIRQ_SPOT_TERMINATION_TAINTS,
        spot_tolerations=settings.FAIRQ_SPOT_TOLERATIONS,
        teams=_reads.teams,
        other_pod_namespaces=settings.FAIRQ_K8S_OTHER_POD_NAMESPACES,
        mps_pipe_directory=settings.FAIRQ_K8S_MPS_PIPE_DIRECTORY,
        mps_log_directory=settings.FAIRQ_K8S_MPS_LOG_DIRECTORY,
    )


def get_utilization_source(cluster: str = "default", *,
                           backend: ClusterBackend | None = None) -> UtilizationSource | None:
    """Where GPU readings come from (docs/scheduling.md, "Idle GPUs"): Prometheus at
    FAIRQ_PROMETHEUS_URL when set (dcgm-exporter's metrics for the pods in fairq's
    namespaces); else the simulated cluster, which reports its jobs' FAIRQ_SIM_GPU_UTIL;
    else None (no readings: no job is ever idle). One per cluster and process. `backend`:
    the cycle's backend (a test's), asked instead of the configured one."""
    if settings.FAIRQ_PROMETHEUS_URL:
        key = f"{cluster}:utilization"
        with _lock:
            if key not in _sources:
                from queueing.backends.prometheus import PrometheusUtilization

                _sources[key] = PrometheusUtilization(
                    settings.FAIRQ_PROMETHEUS_URL,
                    namespace_prefix=settings.FAIRQ_KUBE_NAMESPACE_PREFIX,
                    timeout_seconds=settings.FAIRQ_PROMETHEUS_TIMEOUT_SECONDS)
            return _sources[key]
    backend = backend or get_backend(cluster)
    return cast(UtilizationSource, backend) if callable(getattr(backend, "readings", None)) \
        else None


def reset_backends() -> None:
    """Forget the backend instances (tests, settings changes)."""
    with _lock:
        for backend in _instances.values():
            notebooks = getattr(backend, "notebooks", None)  # a simulated cluster's servers
            if notebooks is not None:
                notebooks.stop_all()
        _instances.clear()
        _built_from.clear()
        _sources.clear()


# --- the kick ------------------------------------------------------------------------------

class KickCache(Protocol):
    """The shared cache a `KickThrottle` keeps its windows in (Django's cache)."""

    def add(self, key: str, value: float, timeout: int) -> bool: ...

    def get(self, key: str) -> Any: ...

    def set(self, key: str, value: float, timeout: int) -> None: ...


class KickThrottle:
    """At most one cycle request per `interval` across all processes, and never a
    dropped last one. The first kick of a window sends at once (`send(0)`) and stores
    when the window started; the first kick inside that window schedules one trailing
    request for the window's end (`send(countdown)`, as the backend's debounce did
    before), which runs after every kick until then, so the last change is always seen
    by a cycle, and pushes the next window's start to a full `interval` after it; later
    kicks of the window send nothing. Windows are keys in the shared cache (`add` is
    true only for the first caller while the key lives), their values wall-clock times
    (`clock`, the same in every process). A process that scheduled the trailing request,
    or saw another process's, skips the cache until it is due: a burst of submits costs
    each process at most four round trips a window, not one per submit."""

    def __init__(self, send: Callable[[float], None], *, cache: KickCache | None = None,
                 interval: int = 1, key: str = "fairq:kick",
                 clock: Callable[[], float] = time.time) -> None:
        self._send = send
        self._cache = cache
        self._interval = interval
        self._key = key
        self._clock = clock
        self._covered_until = 0.0  # this process's trailing request is due then

    def __call__(self) -> None:
        now = self._clock()
        if now < self._covered_until:
            return  # the trailing request this process scheduled runs after this kick
        cache = self._cache or _django_cache()
        if cache.add(self._key, now, self._interval):
            self._send(0.0)
            return
        if cache.add(f"{self._key}:trailing", now, self._interval):
            started = cache.get(self._key)
            countdown = float(self._interval)
            if isinstance(started, int | float):
                countdown = min(countdown, max(0.05, started + self._interval - now))
            cache.set(self._key, now + countdown, 2 * self._interval)
            self._covered_until = now + countdown
            self._send(round(countdown, 3))
            return
        # Another process's trailing request is due when the window key says (it set
        # it): every kick until then is covered by it, and this process stops asking.
        due = cache.get(self._key)
        if isinstance(due, int | float) and due > now:
            self._covered_until = due


def _django_cache() -> KickCache:
    from django.core.cache import cache

    return cast(KickCache, cache)


def _send_cycle(countdown: float) -> None:
    from config.celery import app

    options: dict[str, float] = {"expires": 10 + countdown}
    if countdown:
        options["countdown"] = countdown
    app.signature(SCHEDULER_CYCLE_TASK).apply_async(**options)


# One per process; `_send_cycle` looked up at each call (tests replace it).
_throttle = KickThrottle(lambda countdown: _send_cycle(countdown))


def kick() -> None:
    """Ask for a scheduler cycle soon (after a submit or a finish, or a workload's phase
    change seen by a watch): nothing when FAIRQ_KICK_SCHEDULER is off; else throttled
    to one request a second across processes, the last kick never dropped
    (`KickThrottle`)."""
    if not settings.FAIRQ_KICK_SCHEDULER:
        return
    _throttle()


def stop_workload_soon(name: str) -> None:
    """Ask a worker to stop workload `name` on the cluster (a cancel, after its commit):
    the task is sent by its registered name, like the kick, so services need not import
    the tasks module above them; it retries with backoff where the cluster fails."""
    from config.celery import app

    app.signature(STOP_WORKLOAD_TASK, args=(name,)).apply_async()
