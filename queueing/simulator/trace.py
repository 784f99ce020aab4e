"""The Alibaba openb 2023 trace as a workload (docs/simulator.md, "The openb trace",
which gives the reason for every choice below).

- cluster: a seeded draw of nodes from `nodes.csv` up to `gpus` GPUs (each seed a
  different cluster of the same GPU total; the node count follows from the draw).
  With `gpu_spec` off every node is of one GPU type, `openb`; otherwise of its model.
- jobs: pods with at least one GPU that were scheduled, created in the last `days` days
  of the trace, with 0 < runtime ≤ `max_runtime` (runtime = deletion − scheduled time).
  A pod is one replica; a fractional GPU (gpu_milli < 1000) takes a whole GPU.
- GPU types a job accepts (`gpu_spec`): off, the trace's own `gpu_spec` column, or a
  seeded share of generated specs (`gpu_spec.py`).
- tenants: team-<crc32(pod name) % 4>, weights 1, 1, 2, 4; nominal quota by weight per
  GPU type, borrowing unlimited.
- tiers: QoS LS and Guaranteed → `high` (not preemptible); Burstable → `normal`
  (preemptible after 300 s); BE → `low` (preemptible).
- arrivals: compressed by one factor so the offered load (GPU-seconds asked / (GPUs ×
  arrival span)) is `rho`; the horizon is the compressed span.
- estimates (rule A9, R9.1, EASY backfill): the `estimate` model (`estimates.py`;
  default a user's over-requested limit capped at `max_runtime`).
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

from .estimates import DEFAULT_ESTIMATE, EstimateModel, bucket_of
from .gpu_spec import GpuSpecMode, accepted_types
from .model import NodeSpec, Scenario, SimJob, TeamSpec, TierSpec, Workload

GPU_TYPE = "openb"
TEAM_WEIGHTS = (1.0, 1.0, 2.0, 4.0)
TIERS = (
    TierSpec("high", rank=30, preemptible=False, min_runtime_seconds=0),
    TierSpec("normal", rank=20, preemptible=True, min_runtime_seconds=300),
    TierSpec("low", rank=10, preemptible=True, min_runtime_seconds=0),
)
QOS_TIER = {"LS": "high", "Guaranteed": "high", "Burstable": "normal", "BE": "low"}


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
    """The `oracle` estimate (estimates.bucket_of)."""
    return bucket_of(runtime)


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


def draw_nodes(rows: Iterable[_NodeRow], *, gpus: int, seed: int,
               typed: bool = False) -> tuple[NodeSpec, ...]:
    """A seeded draw of whole nodes (those with a GPU) until they hold `gpus` GPUs: the
    nodes in a seeded random order, each taken while it does not overshoot the total.
    Each seed gives another cluster (another mix of node types) of the same GPU total;
    the node count is what the draw gives. `typed`: each node's GPU type is its model,
    else the one type `openb`."""
    pool = sorted((r for r in rows if r.gpus > 0), key=lambda r: r.name)
    if not pool:
        raise TraceError("nodes.csv has no node with a GPU")
    if gpus > sum(r.gpus for r in pool):
        raise TraceError(f"asked for {gpus} GPUs; nodes.csv has {sum(r.gpus for r in pool)}")
    rng = random.Random(f"cluster:{seed}")
    taken: list[_NodeRow] = []
    total = 0
    for r in rng.sample(pool, len(pool)):
        if total + r.gpus <= gpus:
            taken.append(r)
            total += r.gpus
            if total == gpus:
                break
    return tuple(NodeSpec(r.name, r.model if typed else GPU_TYPE, r.gpus)
                 for r in sorted(taken, key=lambda r: r.name))


def _int(row: dict[str, str], col: str, where: str) -> int:
    try:
        return int(row[col])
    except (KeyError, ValueError):
        raise TraceError(f"{where}: column {col!r} is {row.get(col)!r}, not an integer") from None


def load_openb(path: str | Path, *, rho: float = 1.2, days: float = 30.0, gpus: int = 429,
               seed: int = 0, max_runtime: float = 24 * 3600.0, limit: int | None = None,
               settings: PolicySettings | None = None,
               estimate: EstimateModel = DEFAULT_ESTIMATE,
               gpu_spec: GpuSpecMode | None = None) -> Workload:
    """The openb trace in `path` (nodes.csv, pods.csv) as a workload at offered load `rho`
    on the cluster `seed` draws. `limit` keeps only the first jobs (a small slice, for a
    quick run). `seed` also seeds the estimates' over-request factors and the generated
    GPU specs."""
    if rho <= 0:
        raise TraceError("rho must be > 0")
    spec_mode = gpu_spec or GpuSpecMode()
    d = Path(path)
    for f in ("nodes.csv", "pods.csv"):
        if not (d / f).is_file():
            raise TraceError(f"{d / f} does not exist (the openb trace directory is needed)")
    with open(d / "nodes.csv", newline="") as fh:
        node_rows = [_NodeRow(r["sn"], r["model"], _int(r, "gpu", f"nodes.csv {r.get('sn')}"))
                     for r in csv.DictReader(fh)]
    cluster = draw_nodes(node_rows, gpus=gpus, seed=seed, typed=spec_mode.typed)
    largest: dict[str, int] = {}
    type_gpus: dict[str, int] = {}
    for n in cluster:
        largest[n.gpu_type] = max(largest.get(n.gpu_type, 0), n.gpus)
        type_gpus[n.gpu_type] = type_gpus.get(n.gpu_type, 0) + n.gpus
    trace_models: dict[str, int] = {}
    for r in node_rows:
        if r.gpus > 0:
            trace_models[r.model] = trace_models.get(r.model, 0) + r.gpus
    models = sorted(trace_models.items())
    with open(d / "pods.csv", newline="") as fh:
        pods = list(csv.DictReader(fh))
    if not pods:
        raise TraceError("pods.csv has no rows")
    end = max(_int(p, "deletion_time", f"pods.csv {p.get('name')}") for p in pods)
    since = end - days * 86400
    picked: list[tuple[int, str, str, int, float, tuple[str, ...], bool]] = []
    dropped = 0
    for p in pods:
        where = f"pods.csv {p.get('name')}"
        n_gpu = _int(p, "num_gpu", where)
        created = _int(p, "creation_time", where)
        if n_gpu <= 0 or created < since or not p.get("scheduled_time"):
            continue
        runtime = _int(p, "deletion_time", where) - _int(p, "scheduled_time", where)
        if runtime <= 0 or runtime > max_runtime:
            continue
        types, restricted = accepted_types(
            spec_mode, spec=p.get("gpu_spec") or "", name=p["name"], gpus_per_replica=n_gpu,
            seed=seed, largest=largest, gpus=type_gpus, trace_models=models)
        if not types:
            dropped += 1  # no node of the cluster it accepts holds it
            continue
        picked.append((created, p["name"], tier_of(p["qos"]), n_gpu, float(runtime), types,
                       restricted))
    picked.sort(key=lambda x: (x[0], x[1]))
    if limit is not None:
        picked = picked[:limit]
    if not picked:
        raise TraceError("no pod of the trace is left after the filters")
    total_gpus = sum(n.gpus for n in cluster)
    demand = sum(x[3] * x[4] for x in picked)
    span = picked[-1][0] - picked[0][0]
    horizon = demand / (total_gpus * rho)
    scale = horizon / span if span > 0 else 0.0
    first = picked[0][0]
    jobs = tuple(
        SimJob(id=i + 1, team=team_of(name), tier=tier, gpu_type=types[0],
               gpus_per_replica=n_gpu, replicas=1, submit=(created - first) * scale,
               runtime=runtime,
               estimate=estimate.estimate(runtime, cap=max_runtime, seed=seed, key=name),
               gpu_types=types if len(types) > 1 else ())
        for i, (created, name, tier, n_gpu, runtime, types, _) in enumerate(picked))
    teams = tuple(TeamSpec(f"team-{i}", w) for i, w in enumerate(TEAM_WEIGHTS))
    quotas: dict[tuple[str, str], QuotaLimit] = {}
    for gt in sorted(type_gpus):
        nominal = nominal_by_weight(type_gpus[gt], TEAM_WEIGHTS)
        for t, share in zip(teams, nominal, strict=True):
            quotas[(t.name, gt)] = QuotaLimit(nominal=share)
    scenario = Scenario(nodes=cluster, teams=teams, tiers=TIERS, quotas=quotas,
                        settings=settings or PolicySettings())
    return Workload(scenario=scenario, jobs=jobs, horizon=horizon,
                    source={"kind": "openb", "rho": rho, "days": days, "seed": seed,
                            "nodes": len(cluster), "gpus": total_gpus, "jobs": len(jobs),
                            "offered_gpu_hours": demand / 3600.0,
                            "estimate": estimate.describe(),
                            "gpu_spec": spec_mode.describe(),
                            "gpu_types": dict(sorted(type_gpus.items())),
                            "restricted_jobs": sum(1 for x in picked if x[6]),
                            "dropped_no_node": dropped})
