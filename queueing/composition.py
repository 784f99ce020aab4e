"""The composition root: the one place that builds the cluster backends from settings
(docs/architecture.md). Backends read no settings and import nothing above them; what
they need from the rest of fairq is handed to them here.

`get_backend()` returns the configured backend, one instance per cluster and process.
Only the scheduler's side (the worker, management commands) calls it: web and API
processes read the published cluster view (queueing/selectors) instead.
"""

from __future__ import annotations

import threading

from django.conf import settings

from queueing.backends.base import ClusterBackend

_lock = threading.Lock()
_instances: dict[str, ClusterBackend] = {}


def get_backend(cluster: str = "default") -> ClusterBackend:
    """The backend for `cluster` (one per cluster, ready for several clusters later)."""
    with _lock:
        if cluster not in _instances:
            _instances[cluster] = _build(cluster)
        return _instances[cluster]


def _build(cluster: str) -> ClusterBackend:
    if settings.FAIRQ_CLUSTER_BACKEND == "kubernetes":
        from queueing.backends.kubernetes import KubernetesBackend

        return KubernetesBackend.from_settings()
    from queueing.backends.simulated import SimulatedCluster

    return SimulatedCluster.from_spec(settings.FAIRQ_SIM_NODES,
                                      default_seconds=settings.FAIRQ_SIM_DEFAULT_SECONDS)


def reset_backends() -> None:
    """Forget the backend instances (tests, settings changes)."""
    with _lock:
        _instances.clear()
