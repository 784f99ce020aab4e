"""Cluster facts the web process needs (validation, capacity), cached briefly."""

from __future__ import annotations

from django.core.cache import cache

from .backends import get_backend


def largest_node_gpus(gpu_type: str) -> int:
    """GPUs on the largest node of `gpu_type` (0 when the cluster has none)."""
    sizes: dict[str, int] | None = cache.get("fairq:largest-node")
    if sizes is None:
        sizes = {}
        for n in get_backend().nodes():
            sizes[n.gpu_type] = max(sizes.get(n.gpu_type, 0), n.capacity)
        cache.set("fairq:largest-node", sizes, timeout=30)
    return sizes.get(gpu_type, 0)
