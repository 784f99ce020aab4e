"""Runtime estimates: what a user says a job will run (its `max_runtime_seconds`), the
figure rule A9's reservation, rule R9.1 and EASY backfill plan with (docs/simulator.md,
"Runtime estimates"). The simulator must not know what a user would not, so the default
is a user's limit, not the true runtime.

- `user[:LO-HI]` (default `user`, 2-10): the true runtime times an over-request factor
  drawn per job, log-uniform in [LO, HI], seeded by the run's seed and the job's name;
  capped by the job's maximum (the replay's 24 h).
- `oracle`: the true runtime rounded up to the next bucket (10 min … 24 h): what the
  replay used before; for comparison only.
- `fixed:DURATION` (`fixed:24h`, `fixed:90m`, `fixed:3600`): every job the same limit.

An estimate is never below the runtime: the simulator does not kill a job at its limit,
so a limit below it (a short `fixed:`) is raised to the runtime.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .model import SimJob

# `oracle`: the true runtime rounded up to one of these.
ESTIMATE_BUCKETS = (600, 1800, 3600, 2 * 3600, 4 * 3600, 8 * 3600, 12 * 3600, 24 * 3600)
DEFAULT_OVER_REQUEST = (2.0, 10.0)
# The most a job may ask for: the replay keeps tasks of at most 24 h, and 24 h is every
# replay tier's maximum.
DEFAULT_CAP_SECONDS = 24 * 3600.0

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class EstimateError(ValueError):
    """An `--estimate` value that cannot be used."""


def bucket_of(runtime: float) -> float:
    """The true runtime rounded up to the next of `ESTIMATE_BUCKETS` (the oracle)."""
    for b in ESTIMATE_BUCKETS:
        if runtime <= b:
            return float(b)
    return float(runtime)


def parse_duration(text: str) -> float:
    """`24h`, `90m`, `600s`, `600`, `1.5d` as seconds (> 0)."""
    m = _DURATION.match(text.strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise EstimateError(f"{text!r} is not a duration > 0 (e.g. 24h, 90m, 3600)")
    return float(m.group(1)) * _UNIT[m.group(2)]


@dataclass(frozen=True, slots=True)
class EstimateModel:
    """How a job's estimate follows from its true runtime (module docstring)."""

    kind: str  # "user", "oracle" or "fixed"
    low: float = DEFAULT_OVER_REQUEST[0]
    high: float = DEFAULT_OVER_REQUEST[1]
    seconds: float = 0.0  # fixed

    @classmethod
    def parse(cls, text: str) -> EstimateModel:
        t = text.strip().lower()
        if t == "oracle":
            return cls("oracle")
        if t == "user":
            return cls("user")
        if t.startswith("user:"):
            lo, sep, hi = t[5:].partition("-")
            try:
                low, high = float(lo), float(hi if sep else lo)
            except ValueError:
                raise EstimateError(f"--estimate {text!r}: user:LO-HI with numbers, "
                                    "e.g. user:2-10") from None
            if not 1.0 <= low <= high:
                raise EstimateError(f"--estimate {text!r}: need 1 <= LO <= HI (a user asks "
                                    "at least what the job uses)")
            return cls("user", low, high)
        if t.startswith("fixed:"):
            try:
                return cls("fixed", seconds=parse_duration(t[6:]))
            except EstimateError as exc:
                raise EstimateError(f"--estimate {text!r}: {exc}") from None
        raise EstimateError(f"--estimate {text!r}: one of user, user:LO-HI, oracle, "
                            "fixed:DURATION")

    def describe(self) -> str:
        if self.kind == "user":
            return f"user:{self.low:g}-{self.high:g}"
        if self.kind == "fixed":
            return f"fixed:{self.seconds:g}s"
        return self.kind

    def factor(self, seed: int, key: str) -> float:
        """The over-request factor of one job (`user`): log-uniform in [low, high], from
        its own generator, so it does not depend on which other jobs are loaded."""
        if self.low == self.high:
            return self.low
        u = random.Random(f"estimate:{seed}:{key}").random()
        return math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))

    def estimate(self, runtime: float, *, cap: float, seed: int, key: str) -> float:
        """The job's limit in whole seconds: never below `runtime`, the user model never
        above `cap` (the job's or its tier's maximum) unless the runtime is."""
        if self.kind == "oracle":
            value = bucket_of(runtime)
        elif self.kind == "fixed":
            value = self.seconds
        else:
            value = min(runtime * self.factor(seed, key), cap)
        return float(math.ceil(max(value, runtime)))


DEFAULT_ESTIMATE = EstimateModel("user")


def with_estimates(jobs: Sequence[SimJob], model: EstimateModel, *, seed: int,
                   cap: float = DEFAULT_CAP_SECONDS) -> tuple[SimJob, ...]:
    """The jobs with their estimates replaced by `model`'s (keyed by job id: for inputs
    without task names, fairq's own history)."""
    return tuple(replace(j, estimate=model.estimate(j.runtime, cap=cap, seed=seed,
                                                    key=str(j.id)))
                 for j in jobs)
