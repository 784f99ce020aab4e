"""The worker's side of the cluster view (queueing/selectors/cluster.py): after each
cycle it publishes what web processes will read until the next one."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.core.cache import cache

from queueing.backends.base import ClusterBackend
from queueing.selectors.cluster import VIEW_KEY, ClusterView, Reachability, cluster_view_of


def cluster_view_publish(*, backend: ClusterBackend, now: datetime, workloads: Iterable[str],
                         unprovisioned: Iterable[str] = (),
                         clusters: Iterable[Reachability] = (),
                         closed: Iterable[str] = ()) -> ClusterView:
    """The worker, after a cycle: what web processes will read until the next one. With
    several clusters (docs/clusters.md) `backend` is the cycle's fleet: every reachable
    cluster's nodes (a draining one's too), each with its `cluster`; `clusters` which
    ones answered; `closed` the ones the plan gave no new work (rule K8:
    `Snapshot.closed_clusters`)."""
    view = cluster_view_of(backend, now=now, workloads=workloads, unprovisioned=unprovisioned,
                           clusters=clusters, closed=closed)
    cache.set(VIEW_KEY, view.to_dict(), timeout=None)
    return view
