"""The cycle's bookkeeping rules as pure functions (docs/scheduling.md, F2, F6, R5, R6,
A5/R8), for every caller that runs cycles: the trace simulator (queueing/simulator/) calls
them; the scheduler service's reads and writes hold the same rules over the database
(docs/simulator.md, "One policy for both", lists each pair).

Times are passed in; nothing here reads a clock, a setting or a database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from .fairshare import Accumulator, entry_penalty_gpu_hours


def active_teams(*, usage: Mapping[str, float], with_work: Iterable[str]) -> frozenset[str]:
    """Rule F2: a team is active when it has decayed usage or a job queued, admitted or
    running (`with_work`). Only active teams share the cluster."""
    return frozenset({t for t, u in usage.items() if u > 0} | set(with_work))


class Holding(NamedTuple):
    """A job holding GPUs, as the standings see it: `started_at` None while admitted but
    not running yet. A named tuple: the service builds one per job holding GPUs in every
    cycle, and a frozen dataclass costs several times as much to make."""

    team: str
    gpus: float  # GPU-equivalents (rule H4: a quarter of a GPU is 0.25)
    billing_weight: float
    started_at: datetime | None


def standings_running_and_penalty(
    holding: Iterable[Holding], *, now: datetime, interval_seconds: float,
) -> tuple[dict[str, list[tuple[float, datetime]]], dict[str, float]]:
    """Rules F1 and F6 across cycles: per team, the open intervals (weighted GPUs, start)
    of its running attempts, and the entry penalty of its jobs admitted but not running
    yet (a job keeps its penalty until its real usage counts)."""
    running: dict[str, list[tuple[float, datetime]]] = {}
    penalty: dict[str, float] = {}
    for h in holding:
        if h.started_at is not None and h.started_at <= now:
            running.setdefault(h.team, []).append((h.gpus * h.billing_weight, h.started_at))
        else:
            penalty[h.team] = penalty.get(h.team, 0.0) + entry_penalty_gpu_hours(
                h.gpus, h.billing_weight, interval_seconds)
    return running, penalty


def preemptions_in_window(
    made: Iterable[tuple[datetime, str]], *, now: datetime, window_seconds: float,
) -> dict[str, int]:
    """Rule R5: per preemptor team, the preemptions (one per victim, given as (instant,
    preemptor team)) made in the window `(now − window, now]`."""
    used: dict[str, int] = {}
    for at, team in made:
        if 0 <= (now - at).total_seconds() < window_seconds:
            used[team] = used.get(team, 0) + 1
    return used


@dataclass(frozen=True, slots=True)
class Nomination:
    """A preemption made for `job_id`'s attempt `attempt`, at `at`, whose victims' workloads
    are `workloads`."""

    job_id: int
    attempt: int
    at: datetime
    workloads: tuple[str, ...]
    # The preemptor's planned placement, one node per replica (rule E2 holds it).
    placement: tuple[str, ...] = ()


def nominated_preemptors(
    nominations: Iterable[Nomination], *, now: datetime, queued_attempts: Mapping[int, int],
    live_workloads: Iterable[str], grace_seconds: float, nomination_seconds: float,
) -> dict[int, int]:
    """Rules A5, R8: queued jobs that preempted for their current attempt (given in
    `queued_attempts`: job id -> attempt) in the last `nomination_seconds`, mapped to how
    many of their victims' workloads may still hold GPUs: all of them during the
    termination grace after the preemption, then those the cluster still lists."""
    live = set(live_workloads)
    out: dict[int, int] = {}
    for n in nominations:
        age = (now - n.at).total_seconds()
        if age < 0 or age > nomination_seconds or queued_attempts.get(n.job_id) != n.attempt:
            continue
        held = len(n.workloads) if age < grace_seconds else sum(
            1 for w in n.workloads if w in live)
        out[n.job_id] = max(out.get(n.job_id, 0), held)
    return out


def nominated_placements(nominations: Iterable[Nomination],
                         nominated: Mapping[int, int]) -> dict[int, tuple[str, ...]]:
    """Rule E2: the placement planned for each nominated preemptor (`nominated`, from
    `nominated_preemptors`) whose victims may still hold GPUs: its latest nomination's."""
    out: dict[int, tuple[str, ...]] = {}
    latest: dict[int, datetime] = {}
    for n in nominations:
        if nominated.get(n.job_id, 0) > 0 and n.placement and (
                n.job_id not in latest or n.at >= latest[n.job_id]):
            out[n.job_id], latest[n.job_id] = n.placement, n.at
    return out


@dataclass(frozen=True, slots=True)
class Charge:
    """GPU time to charge as usage (rule F1): `rate` weighted GPUs over `[start, end]`."""

    rate: float
    start: datetime
    end: datetime

    @property
    def gpu_hours(self) -> float:
        return self.rate * (self.end - self.start).total_seconds() / 3600.0


@dataclass(frozen=True, slots=True)
class Requeued:
    """Rule R6's outcome for one victim: its next attempt, the submit time it keeps, the
    GPU time of the preempted attempt to charge (None: it never ran), and, when the
    caller gave its team's accumulator, that accumulator with the charge added."""

    attempt: int
    submitted_at: datetime
    charge: Charge | None
    accumulator: Accumulator | None

    @property
    def charged_gpu_hours(self) -> float:
        return 0.0 if self.charge is None else self.charge.gpu_hours


def requeue_victim(
    *, attempt: int, submitted_at: datetime, started_at: datetime | None, now: datetime,
    gpus: int, billing_weight: float, accumulator: Accumulator | None = None,
    half_life_hours: float = 168.0,
) -> Requeued:
    """Rule R6: a victim goes back to the queue as attempt + 1 with its submit time (its
    age) kept; the GPU time of the preempted attempt (from its start to `now`; nothing if
    it never started) is charged to its team as usage (rule F1) before the attempt
    changes. The simulator passes its accumulator and gets it back charged; the service
    writes `charge` as a usage record, which charges its stored accumulator the same way
    (queueing/services/usage.py::usage_record_attempt)."""
    charge = None
    if started_at is not None and now > started_at:
        charge = Charge(gpus * billing_weight, started_at, now)
    acc = accumulator
    if acc is not None and charge is not None:
        acc = acc.add_interval(rate=charge.rate, start=charge.start, end=charge.end,
                               half_life_hours=half_life_hours)
    return Requeued(attempt=attempt + 1, submitted_at=submitted_at, charge=charge,
                    accumulator=acc)
