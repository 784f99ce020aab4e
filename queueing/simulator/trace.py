"""The Alibaba openb 2023 trace as a workload (docs/simulator.md, "The openb trace",
which gives the reason for every choice below).

- cluster: `nodes` nodes sampled from `nodes.csv` by node type (model, GPUs per node):
  each type gets its share of the nodes (largest remainder), then single swaps between
  types bring the total GPUs to `gpus`; which nodes of a type are taken is seeded. The
  trace's pods name no GPU model, so every node is in one GPU type, `openb`.
- jobs: pods with at least one GPU that were scheduled, created in the last `days` days
  of the trace, with 0 < runtime ≤ `max_runtime` (runtime = deletion − scheduled time).
  A pod is one replica; a fractional GPU (gpu_milli < 1000) takes a whole GPU.
- tenants: team-<crc32(pod name) % 4>, weights 1, 1, 2, 4; nominal quota by weight,
  borrowing unlimited.
- tiers: QoS LS and Guaranteed → `high` (not preemptible); Burstable → `normal`
  (preemptible after 300 s); BE → `low` (preemptible).
- arrivals: compressed by one factor so the offered load (GPU-seconds asked / (GPUs ×
  arrival span)) is `rho`; the horizon is the compressed span.
- estimates (EASY backfill): the true runtime rounded up to the next bucket.
"""

from __future__ import annotations

import csv
import random
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from queueing.policy.settings import PolicySettings
from queueing.policy.snapshot import QuotaLimit

from .model import NodeSpec, Scenario, SimJob, TeamSpec, TierSpec, Workload

GPU_TYPE = "openb"
TEAM_WEIGHTS = (1.0, 1.0, 2.0, 4.0)
TIERS = (
    TierSpec("high", rank=30, preemptible=False, min_runtime_seconds=0),
    TierSpec("normal", rank=20, preemptible=True, min_runtime_seconds=300),
    TierSpec("low", rank=10, preemptible=True, min_runtime_seconds=0),
)
QOS_TIER = {"LS": "high", "Guaranteed": "high", "Burstable": "normal", "BE": "low"}
# Runtime estimates given to EASY backfill: the true runtime rounded up to one of these.
ESTIMATE_BUCKETS = (600, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 12 * 3600, 24 * 3600)


class TraceError(ValueError):
    """The trace directory or one of its rows cannot be read."""


def team_of(pod_name: str) -> str:
    """Tenant of a pod: crc32 of its name modulo the number of teams."""
    return f"team-{zlib.crc32(pod_name.encode()) % len(TEAM_WEIGHTS)}"


def tier_of(qos: str) -> str:
    try:
        return QOS_TIER[qos]
    except KeyError:
        raise TraceError(f"unknown QoS {qos!r}; known: {', '.join(QOS_TIER)}") from None


def estimate_of(runtime: float) -> float:
    for b in ESTIMATE_BUCKETS:
        if runtime <= b:
            return float(b)
    return float(runtime)


def nominal_by_weight(total: int, weights: Sequence[float]) -> list[int]:
    """Nominal quotas proportional to the weights, largest remainder, summing to `total`."""
    s = sum(weights)
    exact = [total * w / s for w in weights]
    out = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


@dataclass(frozen=True, slots=True)
class _NodeRow:
    name: str
    model: str
    gpus: int


def sample_nodes(rows: Iterable[_NodeRow], *, nodes: int, gpus: int,
                 seed: int) -> tuple[NodeSpec, ...]:
    """`nodes` nodes by node type (model, GPUs), as close to `gpus` GPUs as single swaps
    between types get; deterministic for a seed."""
    by_type: dict[tuple[str, int], list[_NodeRow]] = {}
    for r in rows:
        if r.gpus > 0:
            by_type.setdefault((r.model, r.gpus), []).append(r)
    if not by_type:
        raise TraceError("nodes.csv has no node with a GPU")
    types = sorted(by_type)
    total = sum(len(v) for v in by_type.values())
    if nodes > total:
        raise TraceError(f"asked for {nodes} nodes; nodes.csv has {total} with GPUs")
    exact = {t: nodes * len(by_type[t]) / total for t in types}
    count = {t: int(exact[t]) for t in types}
    for t in sorted(types, key=lambda t: (-(exact[t] - count[t]), t))[: nodes - sum(count.values())]:
        count[t] += 1

    def gpu_total() -> int:
        return sum(count[t] * t[1] for t in types)

    while gpu_total() != gpus:
        best: tuple[int, float, tuple[str, int], tuple[str, int]] | None = None
        for a in types:
            if count[a] == 0:
                continue
            for b in types:
                if a == b or count[b] >= len(by_type[b]):
                    continue
                gap = abs(gpu_total() - a[1] + b[1] - gpus)
                drift = abs(count[a] - 1 - exact[a]) + abs(count[b] + 1 - exact[b])
                cand = (gap, drift, a, b)
                if best is None or cand < best:
                    best = cand
        if best is None or best[0] >= abs(gpu_total() - gpus):
            break
        count[best[2]] -= 1
        count[best[3]] += 1
    rng = random.Random(seed)
    out = []
    for t in types:
        for r in sorted(rng.sample(by_type[t], count[t]), key=lambda r: r.name):
            out.append(NodeSpec(r.name, GPU_TYPE, r.gpus))
    return tuple(sorted(out, key=lambda n: n.name))


def _int(row: dict[str, str], col: str, where: str) -> int:
    try:
        return int(row[col])
    except (KeyError, ValueError):
        raise TraceError(f"{where}: column {col!r} is {row.get(col)!r}, not an integer") from None


def load_openb(path: str | Path, *, rho: float = 1.2, days: float = 30.0, nodes: int = 82,
               gpus: int = 429, seed: int = 0, max_runtime: float = 24 * 3600.0,
               limit: int | None = None, settings: PolicySettings | None = None) -> Workload:
    """The openb trace in `path` (nodes.csv, pods.csv) as a workload at offered load `rho`.
    `limit` keeps only the first jobs (a small slice, for a quick run)."""
    if rho <= 0:
        raise TraceError("rho must be > 0")
    d = Path(path)
    for f in ("nodes.csv", "pods.csv"):
        if not (d / f).is_file():
            raise TraceError(f"{d / f} does not exist (the openb trace directory is needed)")
    with open(d / "nodes.csv", newline="") as fh:
        node_rows = [_NodeRow(r["sn"], r["model"], _int(r, "gpu", f"nodes.csv {r.get('sn')}"))
                     for r in csv.DictReader(fh)]
    cluster = sample_nodes(node_rows, nodes=nodes, gpus=gpus, seed=seed)
    largest = max(n.gpus for n in cluster)
    with open(d / "pods.csv", newline="") as fh:
        pods = list(csv.DictReader(fh))
    if not pods:
        raise TraceError("pods.csv has no rows")
    end = max(_int(p, "deletion_time", f"pods.csv {p.get('name')}") for p in pods)
    since = end - days * 86400
    picked: list[tuple[int, str, str, int, float]] = []
    for p in pods:
        where = f"pods.csv {p.get('name')}"
        n_gpu = _int(p, "num_gpu", where)
        created = _int(p, "creation_time", where)
        if n_gpu <= 0 or created < since or not p.get("scheduled_time"):
            continue
        runtime = _int(p, "deletion_time", where) - _int(p, "scheduled_time", where)
        if runtime <= 0 or runtime > max_runtime or n_gpu > largest:
            continue
        picked.append((created, p["name"], tier_of(p["qos"]), n_gpu, float(runtime)))
    picked.sort(key=lambda x: (x[0], x[1]))
    if limit is not None:
        picked = picked[:limit]
    if not picked:
        raise TraceError("no pod of the trace is left after the filters")
    total_gpus = sum(n.gpus for n in cluster)
    demand = sum(n_gpu * runtime for _, _, _, n_gpu, runtime in picked)
    span = picked[-1][0] - picked[0][0]
    horizon = demand / (total_gpus * rho)
    scale = horizon / span if span > 0 else 0.0
    first = picked[0][0]
    jobs = tuple(
        SimJob(id=i + 1, team=team_of(name), tier=tier, gpu_type=GPU_TYPE, gpus_per_replica=n_gpu,
               replicas=1, submit=(created - first) * scale, runtime=runtime,
               estimate=estimate_of(runtime))
        for i, (created, name, tier, n_gpu, runtime) in enumerate(picked))
    teams = tuple(TeamSpec(f"team-{i}", w) for i, w in enumerate(TEAM_WEIGHTS))
    nominal = nominal_by_weight(total_gpus, TEAM_WEIGHTS)
    quotas = {(t.name, GPU_TYPE): QuotaLimit(nominal=n) for t, n in zip(teams, nominal, strict=True)}
    scenario = Scenario(nodes=cluster, teams=teams, tiers=TIERS, quotas=quotas,
                        settings=settings or PolicySettings())
    return Workload(scenario=scenario, jobs=jobs, horizon=horizon,
                    source={"kind": "openb", "rho": rho, "days": days, "seed": seed,
                            "nodes": len(cluster), "gpus": total_gpus, "jobs": len(jobs),
                            "offered_gpu_hours": demand / 3600.0})
