"""A small world of several clusters for the K-rule tests (docs/scheduling.md,
"Clusters and spot capacity"): nodes qualified "<cluster>/<node>" as the snapshot builder
makes them."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from queueing.policy.priority import PriorityWeights
from queueing.policy.snapshot import NodeState, QueuedJob, RunningJob, Snapshot

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
NO_AGE = PriorityWeights(fair_share=10_000.0, age=0.0, size=0.0)


def pool(cluster: str, gpu_type: str, count: int, gpus: int = 8, *, free: int | None = None,
         spot: bool = False, prefix: str = "") -> list[NodeState]:
    """`count` nodes of `gpus` GPUs (each `free` free, default all) in `cluster`."""
    kind = prefix or ("spot" if spot else "n")
    return [NodeState(f"{cluster}/{kind}-{gpu_type}-{i}", gpu_type, gpus,
                      gpus if free is None else free, cluster=cluster, spot=spot)
            for i in range(count)]


def job(job_id: int, *, team: str = "a", gpu_type: str = "h100", gpus: int = 8,
        replicas: int = 1, tier: int = 100, clusters: set[str] | None = None,
        spot_ok: bool = False, age: float = 0.0, **kw: Any) -> QueuedJob:
    return QueuedJob(id=job_id, team=team, gpu_type=gpu_type, gpus_per_replica=gpus,
                     replicas=replicas, tier_rank=tier,
                     submitted_at=NOW - timedelta(seconds=age + 1000 - job_id),  # id order
                     clusters=None if clusters is None else frozenset(clusters),
                     spot_ok=spot_ok, **kw)


def running(job_id: int, nodes: tuple[str, ...], *, cluster: str, team: str = "b",
            gpu_type: str = "h100", gpus: int = 8, tier: int = 0,
            started_at: datetime = NOW - timedelta(hours=1), **kw: Any) -> RunningJob:
    return RunningJob(id=job_id, team=team, gpu_type=gpu_type, gpus_per_replica=gpus,
                      replicas=len(nodes), tier_rank=tier, started_at=started_at, nodes=nodes,
                      cluster=cluster, **kw)


def snap(nodes: list[NodeState], queued: list[QueuedJob], *,
         running_jobs: tuple[RunningJob, ...] = (), ranks: Mapping[str, int] | None = None,
         **kw: Any) -> Snapshot:
    return Snapshot(now=NOW, nodes=tuple(nodes), queued=tuple(queued), running=running_jobs,
                    priority_weights=NO_AGE, cluster_ranks=ranks or {}, **kw)


def cluster_of(node: str) -> str:
    return node.split("/", 1)[0]
