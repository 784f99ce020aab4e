"""Cluster facts the web process needs (validation, capacity), cached briefly."""

from __future__ import annotations

from .backends import get_backend
from .memo import ttl_memo


@ttl_memo(30)
def _largest_node_sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for n in get_backend().nodes():
        sizes[n.gpu_type] = max(sizes.get(n.gpu_type, 0), n.capacity)
    return sizes


def largest_node_gpus(gpu_type: str) -> int:
    """GPUs on the largest node of `gpu_type` (0 when the cluster has none); the node
    sizes are kept 30 s in each process (queueing/memo.py)."""
    return _largest_node_sizes().get(gpu_type, 0)
