"""Cluster backends: one interface (`base.ClusterBackend`), a simulated and a Kubernetes
implementation. `get_backend()` returns the configured one, one instance per process."""

from __future__ import annotations

import threading

from .base import ClusterBackend

_lock = threading.Lock()
_instances: dict[str, ClusterBackend] = {}


def get_backend(cluster: str = "default") -> ClusterBackend:
    """The backend for `cluster` (one per cluster, ready for several clusters later)."""
    from django.conf import settings

    with _lock:
        if cluster not in _instances:
            if settings.FAIRQ_CLUSTER_BACKEND == "kubernetes":
                from .kubernetes import KubernetesBackend

                _instances[cluster] = KubernetesBackend.from_settings()
            else:
                from .simulated import SimulatedCluster

                _instances[cluster] = SimulatedCluster.from_spec(
                    settings.FAIRQ_SIM_NODES,
                    default_seconds=settings.FAIRQ_SIM_DEFAULT_SECONDS,
                )
        return _instances[cluster]


def reset_backends() -> None:
    """Forget the backend instances (tests, settings changes)."""
    with _lock:
        _instances.clear()
