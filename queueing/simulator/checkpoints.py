"""Checkpoints and the termination grace in the replay (docs/simulator.md, "Checkpoints,
grace and owed claims").

- `--checkpoint SHARE:MIN_RUNTIME:INTERVAL[:SAVE]` (default `1:1h:30m`: every job that
  runs over 1 h checkpoints every 30 min; `off`: none): which jobs declare a checkpoint
  interval and how often. Among the jobs whose true runtime is over MIN_RUNTIME, a
  seeded SHARE (each job's own draw, by the run's seed and the job's id) checkpoints
  every INTERVAL of its attempt. The runtime only picks who checkpoints (a user knows
  whether their job is long); it is never an estimate. SAVE (default 0 s) is how long
  the save on the stop signal takes: a checkpointing victim whose grace is at least SAVE
  saves its work at the signal and loses nothing; otherwise it keeps its last periodic
  checkpoint. A job that does not checkpoint loses its whole attempt.
- `--grace SECONDS` or `--grace TIER=SECONDS,...`: how long a victim keeps its GPUs
  after the preemption (its pods' termination grace, rule R10); a tier not named gets
  the preemption settings' `termination_grace_seconds` (30, what a job asking none gets,
  `FAIRQ_K8S_TERMINATION_GRACE_SECONDS`).

Assumptions (stated, not measured): checkpointing costs the job no time; a victim does
no work during its grace, it only stops (and saves); it holds its GPUs for the whole
grace; a spot interruption (rule K6) gives no time to save.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from .estimates import EstimateError, parse_duration
from .model import SimJob, TierSpec


class CheckpointError(ValueError):
    """A `--checkpoint` or `--grace` value that cannot be used."""


def _duration(text: str, what: str, *, zero: bool = False) -> float:
    t = text.strip().lower()
    if zero and t in ("0", "0s", "0m", "0h"):
        return 0.0
    try:
        return parse_duration(t)
    except EstimateError as exc:
        raise CheckpointError(f"{what}: {exc}") from None


@dataclass(frozen=True, slots=True)
class CheckpointModel:
    """Which jobs checkpoint and how often (module docstring); `share` 0 = none."""

    share: float = 0.0
    min_runtime: float = 0.0
    interval: float = 1800.0
    save_seconds: float = 0.0

    @classmethod
    def parse(cls, text: str) -> CheckpointModel:
        t = text.strip().lower()
        if t in ("off", "none", "0"):
            return cls()
        parts = t.split(":")
        if len(parts) not in (3, 4):
            raise CheckpointError(f"--checkpoint {text!r}: off or SHARE:MIN_RUNTIME:INTERVAL"
                                  "[:SAVE], e.g. 1:1h:30m or 0.5:0:30m")
        try:
            share = float(parts[0])
        except ValueError:
            raise CheckpointError(f"--checkpoint {text!r}: SHARE is a number in 0..1") from None
        if not 0.0 <= share <= 1.0:
            raise CheckpointError(f"--checkpoint {text!r}: SHARE is a number in 0..1")
        where = f"--checkpoint {text!r}"
        return cls(share, _duration(parts[1], where, zero=True), _duration(parts[2], where),
                   _duration(parts[3], where, zero=True) if len(parts) == 4 else 0.0)

    def describe(self) -> str:
        if self.share <= 0:
            return "off"
        out = f"{self.share:g}:{self.min_runtime:g}s:{self.interval:g}s"
        return out + (f":{self.save_seconds:g}s" if self.save_seconds else "")

    def picks(self, job: SimJob, *, seed: int) -> bool:
        """Whether `job` checkpoints: over the minimum runtime, and its own seeded draw
        under the share (a draw per job: it does not depend on the other jobs)."""
        if self.share <= 0 or job.runtime <= self.min_runtime:
            return False
        return self.share >= 1.0 or random.Random(f"checkpoint:{seed}:{job.id}").random() < \
            self.share


DEFAULT_CHECKPOINT = CheckpointModel(1.0, 3600.0, 1800.0)


def with_checkpoints(jobs: Sequence[SimJob], model: CheckpointModel, *,
                     seed: int) -> tuple[SimJob, ...]:
    """The jobs with their checkpoint intervals as `model` draws them (others None)."""
    return tuple(replace(j, checkpoint_interval=model.interval if model.picks(j, seed=seed)
                         else None) for j in jobs)


def parse_grace(text: str, tiers: Sequence[str]) -> dict[str, float]:
    """`30` (every tier) or `low=120,normal=60` (those tiers) as tier -> seconds."""
    t = text.strip()
    if "=" not in t:
        value = _duration(t, f"--grace {text!r}", zero=True)
        return dict.fromkeys(tiers, value)
    out: dict[str, float] = {}
    for item in t.split(","):
        name, sep, seconds = item.partition("=")
        name = name.strip()
        if not sep or name not in tiers:
            raise CheckpointError(f"--grace {text!r}: TIER=SECONDS with a tier of "
                                  f"{', '.join(tiers)}")
        out[name] = _duration(seconds, f"--grace {text!r}", zero=True)
    return out


def with_grace(tiers: Sequence[TierSpec], grace: Mapping[str, float]) -> tuple[TierSpec, ...]:
    return tuple(replace(t, grace_seconds=grace[t.name]) if t.name in grace else t
                 for t in tiers)
