"""The GPU types a trace task accepts (docs/simulator.md, "GPU types a task accepts"):
`--gpu-spec off|trace|gen:SHARE`.

- `off`: one GPU type for the whole cluster (`openb`); the column is not read.
- `trace`: the trace's own `gpu_spec` column (allowed models, `|`-separated, in order of
  preference); an empty one accepts every model of the cluster.
- `gen:SHARE`: a seeded SHARE of the tasks (0 < SHARE ≤ 1) get a generated spec: one or
  two models drawn from the trace's own GPU models (weighted by their GPUs in
  `nodes.csv`) among those with a node that holds the task; the others accept every
  model. The draw is per task, seeded by the run's seed and the task's name.

With `trace` or `gen` each node's GPU type is its model. A task accepting every model
lists them largest pool first (most GPUs in the cluster, then by name); a spec keeps its
own order. Models the cluster lacks, or whose nodes are all too small for the task, are
dropped from its list; a task left with none never runs and is left out (counted).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class GpuSpecError(ValueError):
    """A `--gpu-spec` value that cannot be used."""


@dataclass(frozen=True, slots=True)
class GpuSpecMode:
    kind: str = "off"  # "off", "trace" or "gen"
    share: float = 0.0  # gen

    @classmethod
    def parse(cls, text: str) -> GpuSpecMode:
        t = text.strip().lower()
        if t in ("off", "trace"):
            return cls(t)
        if t.startswith("gen:"):
            try:
                share = float(t[4:])
            except ValueError:
                share = -1.0
            if not 0.0 < share <= 1.0:
                raise GpuSpecError(f"--gpu-spec {text!r}: gen:SHARE with 0 < SHARE <= 1, "
                                   "e.g. gen:0.3")
            return cls("gen", share)
        raise GpuSpecError(f"--gpu-spec {text!r}: one of off, trace, gen:SHARE")

    @property
    def typed(self) -> bool:
        """Whether nodes carry their model as GPU type."""
        return self.kind != "off"

    def describe(self) -> str:
        return f"gen:{self.share:g}" if self.kind == "gen" else self.kind


def split_spec(text: str) -> tuple[str, ...]:
    """The trace's `gpu_spec` cell: models separated by `|`, in order; blanks dropped,
    repeats kept once."""
    out: list[str] = []
    for part in (text or "").split("|"):
        p = part.strip()
        if p and p not in out:
            out.append(p)
    return tuple(out)


def pool_order(largest: Mapping[str, int], gpus: Mapping[str, int]) -> tuple[str, ...]:
    """The cluster's GPU types, most GPUs first, then by name."""
    return tuple(sorted(largest, key=lambda t: (-gpus[t], t)))


def accepted_types(mode: GpuSpecMode, *, spec: str, name: str, gpus_per_replica: int,
                   seed: int, largest: Mapping[str, int], gpus: Mapping[str, int],
                   trace_models: Sequence[tuple[str, int]]) -> tuple[tuple[str, ...], bool]:
    """(the types the task accepts in order of preference, whether it is restricted)
    under `mode`, on a cluster whose types have `largest` GPUs on one node and `gpus`
    GPUs in all; `trace_models` the trace's models with their GPUs in `nodes.csv`. An
    empty tuple: no node of the cluster may take it."""
    holds = [t for t in pool_order(largest, gpus) if largest[t] >= gpus_per_replica]
    if mode.kind == "trace":
        wanted = split_spec(spec)
        if not wanted:
            return tuple(holds), False
        return tuple(t for t in wanted if t in holds), True
    if mode.kind == "gen":
        rng = random.Random(f"gpu-spec:{seed}:{name}")
        if rng.random() >= mode.share:
            return tuple(holds), False
        cands = [(m, w) for m, w in trace_models if m in holds]
        picked: list[str] = []
        for _ in range(min(rng.choice((1, 2)), len(cands))):
            left = [(m, w) for m, w in cands if m not in picked]
            x = rng.random() * sum(w for _, w in left)
            for m, w in left:
                x -= w
                if x < 0:
                    picked.append(m)
                    break
            else:
                picked.append(left[-1][0])
        return tuple(picked), True
    return tuple(holds), False
