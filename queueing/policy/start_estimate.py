"""Rule P4 (docs/scheduling.md): when a queued job may start, estimated from the ends of
the jobs holding its GPU type (their start plus max runtime) and the jobs ahead of it.

Pure: the running jobs, the queue in order and the free GPUs come in, `now` too;
estimates come out. An estimate, not a promise: it ignores quotas (A1), node fit and
fragmentation (A2, A3), preemption (R1, R2) and jobs submitted later that go ahead.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Holding:
    """GPUs of one type a running (or admitted) job holds, and when it must end: its
    start plus its max runtime, or None when it has no max runtime (it may run for ever)."""

    gpu_type: str
    gpus: int
    ends_at: datetime | None


@dataclass(frozen=True)
class Waiting:
    """A queued job, in queue order (rule P2): the GPUs it needs and its max runtime."""

    id: int
    gpu_type: str
    gpus: int
    max_runtime_seconds: int | None
    # Rule G5: every GPU type it accepts, in order of preference; () = only `gpu_type`.
    gpu_types: tuple[str, ...] = ()


def estimate_starts(*, now: datetime, free: Mapping[str, int], running: Sequence[Holding],
                    queued: Sequence[Waiting]) -> dict[int, datetime | None]:
    """Rule P4. Per GPU type, the queued jobs in the order given start one after the
    other (none before the one ahead of it); each starts at the earliest instant when
    the GPUs free now plus those released by then (running jobs at their `ends_at`,
    and jobs estimated to start earlier at their start plus max runtime) cover it.
    None: never, by this rule: a job ahead of it, or it, needs GPUs that only a job
    without a max runtime would release, or more than the type has. Every job of
    `queued` has an entry; ties in end times release together. A job accepting several
    types (`Waiting.gpu_types`, rule G5) starts on the one where it starts first."""
    out: dict[int, datetime | None] = {}
    releases: dict[str, list[tuple[datetime, int]]] = {}
    for h in running:
        if h.ends_at is not None:
            releases.setdefault(h.gpu_type, []).append((max(h.ends_at, now), h.gpus))
    for heap in releases.values():
        heapq.heapify(heap)
    available = dict(free)
    clock: dict[str, datetime] = {}
    blocked: set[str] = set()
    for job in queued:
        t = job.gpu_type
        if len(job.gpu_types) > 1:
            # Rule G5: the earliest over its types (ties: the preferred one), then as a
            # job of that type; never on any: every type it accepts waits behind it.
            at_of = {gt: _earliest(releases.get(gt, []), available.get(gt, 0),
                                   clock.get(gt, now), job.gpus)
                     for gt in job.gpu_types if gt not in blocked}
            known = [(at, k, gt) for k, (gt, at) in enumerate(at_of.items()) if at is not None]
            if not known:
                blocked.update(job.gpu_types)
                out[job.id] = None
                continue
            t = min(known)[2]
        elif t in blocked:
            out[job.id] = None
            continue
        out[job.id] = _start(job, t, releases, available, clock, blocked, now)
    return out


def _earliest(heap: list[tuple[datetime, int]], have: int, at: datetime,
              gpus: int) -> datetime | None:
    """When `gpus` GPUs of a type are free, `have` free now and `heap` to be released,
    no earlier than `at`; None when never. Reads the heap, does not change it."""
    for ends, released in sorted(heap):
        if have >= gpus:
            break
        at = max(at, ends)
        have += released
    return at if have >= gpus else None


def _start(job: Waiting, t: str, releases: dict[str, list[tuple[datetime, int]]],
           available: dict[str, int], clock: dict[str, datetime], blocked: set[str],
           now: datetime) -> datetime | None:
    """Rule P4 for one job on GPU type `t`: its start, taken from the type's GPUs."""
    heap = releases.setdefault(t, [])
    at = clock.get(t, now)
    have = available.get(t, 0)
    while have < job.gpus and heap:
        ends, gpus = heapq.heappop(heap)
        at = max(at, ends)
        have += gpus
    if have < job.gpus:
        # Later jobs of the type cannot start before this one (queue order).
        blocked.add(t)
        available[t] = have
        return None
    available[t] = have - job.gpus
    clock[t] = at
    if job.max_runtime_seconds is not None:
        heapq.heappush(heap, (at + timedelta(seconds=job.max_runtime_seconds), job.gpus))
    return at
