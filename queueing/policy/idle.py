"""Idle GPUs: rules U1-U4 of docs/scheduling.md, one minute of readings at a time.

Pure: a job attempt's idle state and its tier's rule in, the next state and what to do
out. `services/utilization.py` feeds it one sample per job attempt and minute and applies
the verdict (an event, a requeue, a failure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

# Rule U1: readings further apart than this are not one run below the threshold (no
# data is not idle): the run starts again at the next reading.
MAX_GAP = timedelta(minutes=2)


class Verdict(StrEnum):
    NONE = "none"
    FLAG = "flag"  # rule U2: idle for the window
    BUSY_AGAIN = "busy_again"  # rule U4: a flagged job is above the threshold again
    REQUEUE = "requeue"  # rule U3
    FAIL = "fail"  # rule U3


@dataclass(frozen=True, slots=True)
class IdleRule:
    """A tier's idle rule: `threshold_percent` 0 turns it off; `action` is "flag",
    "requeue" or "fail"."""

    threshold_percent: float
    window_minutes: int
    action: str
    grace_minutes: int


@dataclass(frozen=True, slots=True)
class IdleState:
    """What the rules remember of one job attempt: its last sample's minute, the start of
    its current run below the threshold, and when it was flagged."""

    last_at: datetime | None = None
    below_since: datetime | None = None
    idle_since: datetime | None = None


def idle_step(state: IdleState, *, minute: datetime, sm_percent: float,
              rule: IdleRule) -> tuple[IdleState, Verdict]:
    """Rules U1-U4 for the sample of `minute` (later than `state.last_at`).

    - U1: a sample below the threshold starts (or continues) a run below it; a sample at
      or above it, or a gap over MAX_GAP since the last sample, ends the run. A job with
      no samples has no run: it is never idle. A threshold of 0 never starts one.
    - U2: once the run has lasted the window (`minute - below_since >= window`), the job
      is flagged idle (`idle_since = minute`), once.
    - U3: a flagged job still below the threshold `grace` minutes after its flag is
      reclaimed, when the action is "requeue" or "fail"; "flag" never reclaims.
    - U4: a flagged job whose sample is at or above the threshold is busy again: the flag
      is cleared (and a later run flags it again after a whole window).
    """
    gap = state.last_at is not None and minute - state.last_at > MAX_GAP
    below = rule.threshold_percent > 0 and sm_percent < rule.threshold_percent
    if not below:
        verdict = Verdict.BUSY_AGAIN if state.idle_since is not None else Verdict.NONE
        return IdleState(last_at=minute), verdict
    below_since = minute if state.below_since is None or gap else state.below_since
    idle_since = None if gap else state.idle_since
    verdict = Verdict.NONE
    if idle_since is None:
        if minute - below_since >= timedelta(minutes=rule.window_minutes):
            idle_since, verdict = minute, Verdict.FLAG
    elif rule.action in ("requeue", "fail") and \
            minute - idle_since >= timedelta(minutes=rule.grace_minutes):
        verdict = Verdict.REQUEUE if rule.action == "requeue" else Verdict.FAIL
    if state.idle_since is not None and idle_since is None:
        verdict = Verdict.BUSY_AGAIN  # the gap ended the run the flag was about (U1, U4)
    return replace(state, last_at=minute, below_since=below_since,
                   idle_since=idle_since), verdict


def percentile_from_histogram(hist: Mapping[str, int], q: float) -> float:
    """The `q` quantile (0..1) of samples counted per whole percent (`hist["p"]` samples
    in [p, p + 1), only the percents seen): the lowest percent whose cumulative count
    reaches q of the total; 0.0 for no samples."""
    counts = sorted((int(p), int(n)) for p, n in hist.items())
    total = sum(n for _, n in counts)
    if total <= 0:
        return 0.0
    need = q * total
    seen = 0
    for percent, count in counts:
        seen += count
        if seen >= need:
            return float(percent)
    return float(counts[-1][0])
