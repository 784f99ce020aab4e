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
- shared GPUs (`share`, docs/simulator.md, "Fractional GPUs"): the nodes of the chosen
  models are one time-sliced type `openb-ts` of S slices per GPU, the others the
  exclusive `openb`; a task asking a fraction (num_gpu 1, gpu_milli < 1000) asks
  ceil(gpu_milli x S / 1000) slices of one GPU there (a whole GPU when that is S);
  whole 1-GPU tasks go there too with the seeded odds that give both pools the same
  load; multi-GPU tasks stay exclusive. The offered load counts what the tasks asked
  (gpu_milli / 1000 for a fraction), the same for every S and for `whole_gpus`.
  `ShareMode.fractions` samples the fractional tasks down to a share of the jobs.
"""

from __future__ import annotations

import csv
import random
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from queueing.policy.settings import PolicySettings
from queueing.policy.snapshot import QuotaLimit

from .estimates import DEFAULT_ESTIMATE, EstimateModel, bucket_of
from .gpu_spec import GpuSpecMode, accepted_types
from .model import NodeSpec, Scenario, SimJob, TeamSpec, TierSpec, Workload

GPU_TYPE = "openb"
SHARED_TYPE = "openb-ts"
# The models whose nodes are time-sliced by default: the inference-class GPUs of the
# trace (T4, P100, A10; about 18 % of its GPUs), the training nodes (G2, G3, V100) whole.
SHARED_MODELS = ("A10", "P100", "T4")
TEAM_WEIGHTS = (1.0, 1.0, 2.0, 4.0)
TIERS = (
    TierSpec("high", rank=30, preemptible=False, min_runtime_seconds=0),
    TierSpec("normal", rank=20, preemptible=True, min_runtime_seconds=300),
    TierSpec("low", rank=10, preemptible=True, min_runtime_seconds=0),
)
QOS_TIER = {"LS": "high", "Guaranteed": "high", "Burstable": "normal", "BE": "low"}


class TraceError(ValueError):
    """The trace directory or one of its rows cannot be read."""


@dataclass(frozen=True, slots=True)
class ShareMode:
    """Shared GPUs in the trace replay: `slices` S per GPU of the time-sliced pool (the
    nodes of `models`); `fractions` the share of the jobs that ask a fraction, sampled
    down from the trace's (None: the trace's own)."""

    slices: int
    models: tuple[str, ...] = SHARED_MODELS
    fractions: float | None = None

    def __post_init__(self) -> None:
        if not 2 <= self.slices <= 64:
            raise TraceError(f"share: slices per GPU must be 2-64, not {self.slices}")
        if self.fractions is not None and not 0 < self.fractions < 1:
            raise TraceError(f"share: the fractional jobs' share must be in (0, 1), not "
                             f"{self.fractions}")
        if not self.models:
            raise TraceError("share: name at least one GPU model to time-slice")

    def describe(self) -> str:
        frac = "trace" if self.fractions is None else f"{self.fractions:g}"
        return f"ts{self.slices}:{'+'.join(self.models)}:{frac}"


def slices_for(gpu_milli: int, slices: int) -> int:
    """A task's gpu_milli on the grid of `slices` per GPU, rounded UP (a task never gets
    less than it asked): 470 milli of a GPU of 4 slices is 2 slices, of 8 slices 4."""
    return -(-gpu_milli * slices // 1000)


def _unit(key: str) -> float:
    """A seeded draw in [0, 1) from a string key (crc32: stable across processes)."""
    return zlib.crc32(key.encode()) / 2**32


def sample_fractions(names: Sequence[str], fractional: Sequence[bool], share: float,
                     seed: int) -> set[str]:
    """The fractional tasks kept so that they are `share` of the jobs (every whole task
    is kept): k = round(share x whole / (1 - share)) of them, the first by the seeded
    key crc32("fraction:<seed>:<name>") then name; all when the trace has fewer."""
    whole = sum(1 for f in fractional if not f)
    frac = sorted((n for n, f in zip(names, fractional, strict=True) if f),
                  key=lambda n: (_unit(f"fraction:{seed}:{n}"), n))
    k = round(share * whole / (1 - share))
    return set(frac[:k])


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
               gpu_spec: GpuSpecMode | None = None,
               share: ShareMode | None = None) -> Workload:
    """The openb trace in `path` (nodes.csv, pods.csv) as a workload at offered load `rho`
    on the cluster `seed` draws. `limit` keeps only the first jobs (a small slice, for a
    quick run). `seed` also seeds the estimates' over-request factors and the generated
    GPU specs. `share`: a time-sliced pool and fractional tasks (module docstring)."""
    if rho <= 0:
        raise TraceError("rho must be > 0")
    spec_mode = gpu_spec or GpuSpecMode()
    if share is not None and spec_mode.kind != "off":
        raise TraceError("share: GPU specs (--gpu-spec) and a time-sliced pool together "
                         "are not modelled; use --gpu-spec off")
    d = Path(path)
    for f in ("nodes.csv", "pods.csv"):
        if not (d / f).is_file():
            raise TraceError(f"{d / f} does not exist (the openb trace directory is needed)")
    with open(d / "nodes.csv", newline="") as fh:
        node_rows = [_NodeRow(r["sn"], r["model"], _int(r, "gpu", f"nodes.csv {r.get('sn')}"))
                     for r in csv.DictReader(fh)]
    cluster = draw_nodes(node_rows, gpus=gpus, seed=seed,
                         typed=spec_mode.typed or share is not None)
    if share is not None:
        cluster = tuple(replace(n, gpu_type=SHARED_TYPE if n.gpu_type in share.models
                                else GPU_TYPE) for n in cluster)
        if {n.gpu_type for n in cluster} != {GPU_TYPE, SHARED_TYPE}:
            which = "+".join(share.models) if all(n.gpu_type == GPU_TYPE for n in cluster) \
                else "any other model"
            raise TraceError(f"share: the cluster of seed {seed} has no node of {which}")
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
    picked: list[tuple[int, str, str, int, float, tuple[str, ...], bool, int]] = []
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
        if share is not None and n_gpu > largest.get(GPU_TYPE, 0):
            dropped += 1  # shared GPUs: a multi-GPU task runs on the exclusive nodes only
            continue
        milli = _int(p, "gpu_milli", where) if share is not None else 1000
        picked.append((created, p["name"], tier_of(p["qos"]), n_gpu, float(runtime), types,
                       restricted, milli))
    picked.sort(key=lambda x: (x[0], x[1]))
    trace_fractions = sum(1 for x in picked if x[3] == 1 and x[7] < 1000) / max(1, len(picked))
    if share is not None and share.fractions is not None:
        kept = sample_fractions([x[1] for x in picked],
                                [x[3] == 1 and x[7] < 1000 for x in picked],
                                share.fractions, seed)
        picked = [x for x in picked if not (x[3] == 1 and x[7] < 1000) or x[1] in kept]
    if limit is not None:
        picked = picked[:limit]
    if not picked:
        raise TraceError("no pod of the trace is left after the filters")
    total_gpus = sum(n.gpus for n in cluster)
    shared = _shared_asks(picked, share, cluster, seed) if share is not None else {}
    # GPU-equivalents the tasks asked: a fraction its gpu_milli / 1000, not rounded, so
    # neither S nor whole GPUs change the arrivals (docs/simulator.md, "Fractional GPUs").
    demand = sum(_asked(x) * x[4] for x in picked)
    span = picked[-1][0] - picked[0][0]
    horizon = demand / (total_gpus * rho)
    scale = horizon / span if span > 0 else 0.0
    first = picked[0][0]
    s_per = share.slices if share is not None else 1

    def job(i: int, created: int, name: str, tier: str, n_gpu: int, runtime: float,
            types: tuple[str, ...], milli: int) -> SimJob:
        gt, k = (shared[name][0], shared[name][1]) if name in shared else (types[0], 0)
        if share is not None and name not in shared:
            gt = GPU_TYPE
        return SimJob(id=i + 1, team=team_of(name), tier=tier, gpu_type=gt,
                      gpus_per_replica=n_gpu, replicas=1, submit=(created - first) * scale,
                      runtime=runtime,
                      estimate=estimate.estimate(runtime, cap=max_runtime, seed=seed, key=name),
                      gpu_types=types if len(types) > 1 and share is None else (),
                      gpu_slices=k, slices_per_gpu=s_per if gt == SHARED_TYPE else 1,
                      asked=milli / 1000.0 if n_gpu == 1 and milli < 1000 else None)

    jobs = tuple(job(i, created, name, tier, n_gpu, runtime, types, milli)
                 for i, (created, name, tier, n_gpu, runtime, types, _, milli)
                 in enumerate(picked))
    teams = tuple(TeamSpec(f"team-{i}", w) for i, w in enumerate(TEAM_WEIGHTS))
    quotas: dict[tuple[str, str], QuotaLimit] = {}
    for gt in sorted(type_gpus):
        nominal = nominal_by_weight(type_gpus[gt], TEAM_WEIGHTS)
        for t, part in zip(teams, nominal, strict=True):
            quotas[(t.name, gt)] = QuotaLimit(nominal=part)
    scenario = Scenario(nodes=cluster, teams=teams, tiers=TIERS, quotas=quotas,
                        settings=settings or PolicySettings(),
                        slices={SHARED_TYPE: share.slices} if share is not None else {})
    extra: dict[str, object] = {}
    if share is not None:
        frac = [j for j in jobs if j.asked is not None]
        extra["share"] = {
            "mode": share.describe(), "slices_per_gpu": share.slices,
            "models": list(share.models), "shared_gpus": type_gpus.get(SHARED_TYPE, 0),
            "fraction_jobs": len(frac), "fraction_share": len(frac) / len(jobs),
            "trace_fraction_share": trace_fractions,
            "sliced_jobs": sum(1 for j in jobs if j.gpu_slices),
            "whole_to_shared_odds": _whole_odds(picked, share, cluster, seed),
            "whole_1gpu_on_shared": sum(1 for j in jobs if j.gpu_type == SHARED_TYPE
                                        and j.asked is None),
            # The load in what the jobs hold: slices (k / S) and, each fraction taking a
            # whole GPU (`whole_gpus`), whole GPUs.
            "rho_slices": sum(j.share * j.runtime for j in jobs) / (total_gpus * horizon),
            "rho_whole_gpus": sum(j.gpus * j.runtime for j in jobs) / (total_gpus * horizon),
        }
    return Workload(scenario=scenario, jobs=jobs, horizon=horizon,
                    source={"kind": "openb", "rho": rho, "days": days, "seed": seed,
                            "nodes": len(cluster), "gpus": total_gpus, "jobs": len(jobs),
                            "offered_gpu_hours": demand / 3600.0,
                            "estimate": estimate.describe(),
                            "gpu_spec": spec_mode.describe(),
                            "gpu_types": dict(sorted(type_gpus.items())),
                            "restricted_jobs": sum(1 for x in picked if x[6]),
                            "dropped_no_node": dropped, **extra})


_Picked = tuple[int, str, str, int, float, tuple[str, ...], bool, int]


def _asked(x: _Picked) -> float:
    """GPU-equivalents a picked task asked: gpu_milli / 1000 for a fraction, else GPUs."""
    return x[7] / 1000 if x[3] == 1 and x[7] < 1000 else float(x[3])


def _whole_odds(picked: Sequence[_Picked], share: ShareMode, cluster: Sequence[NodeSpec],
                seed: int) -> float:
    """The odds a whole 1-GPU task runs on the time-sliced pool: what makes the pool's
    share of the GPU-equivalents asked (gpu_milli / 1000 for a fraction: the same for
    every S) its share of the cluster's GPUs, the fractional tasks (all of them there)
    counted first; 0 when they alone exceed it."""
    gpus = sum(n.gpus for n in cluster)
    pool = sum(n.gpus for n in cluster if n.gpu_type == SHARED_TYPE)
    frac = whole1 = total = 0.0
    for x in picked:
        n_gpu, runtime, milli = x[3], x[4], x[7]
        if n_gpu == 1 and milli < 1000:
            frac += milli / 1000 * runtime
            total += milli / 1000 * runtime
        else:
            total += n_gpu * runtime
            if n_gpu == 1:
                whole1 += runtime
    if whole1 <= 0:
        return 0.0
    return min(1.0, max(0.0, (total * pool / gpus - frac) / whole1))


def _shared_asks(picked: Sequence[_Picked], share: ShareMode, cluster: Sequence[NodeSpec],
                 seed: int) -> dict[str, tuple[str, int]]:
    """The tasks on the time-sliced pool, name -> (type, slices per replica (0: whole
    GPUs)): every fractional task, its gpu_milli rounded up to the slice grid, and the
    whole 1-GPU tasks drawn with `_whole_odds` (seeded per pod name)."""
    odds = _whole_odds(picked, share, cluster, seed)
    out: dict[str, tuple[str, int]] = {}
    for x in picked:
        name, n_gpu, milli = x[1], x[3], x[7]
        if n_gpu == 1 and milli < 1000:
            k = slices_for(milli, share.slices)
            out[name] = (SHARED_TYPE, 0 if k >= share.slices else k)
        elif n_gpu == 1 and _unit(f"pool:{seed}:{name}") < odds:
            out[name] = (SHARED_TYPE, 0)
    return out


def whole_gpus(workload: Workload) -> Workload:
    """The same jobs, each fraction taking a whole GPU of its time-sliced type (S slices
    of one GPU): whole-GPU-only scheduling, to compare with (docs/simulator.md,
    "Fractional GPUs"). Submit times, runtimes, estimates and the cluster are kept."""
    jobs = tuple(replace(j, gpu_slices=0) if j.gpu_slices else j for j in workload.jobs)
    return replace(workload, jobs=jobs, source={**workload.source, "whole_gpus": True})
