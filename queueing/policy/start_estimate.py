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


def estimate_starts(*, now: datetime, free: Mapping[str, int], running: Sequence[Holding],
                    queued: Sequence[Waiting]) -> dict[int, datetime | None]:
    """Rule P4. Per GPU type, the queued jobs in the order given start one after the
    other (none before the one ahead of it); each starts at the earliest instant when
    the GPUs free now plus those released by then (running jobs at their `ends_at`,
    and jobs estimated to start earlier at their start plus max runtime) cover it.
    None: never, by this rule: a job ahead of it, or it, needs GPUs that only a job
    without a max runtime would release, or more than the type has. Every job of
    `queued` has an entry; ties in end times release together."""
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
        if t in blocked:
            out[job.id] = None
            continue
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
            out[job.id] = None
            continue
        available[t] = have - job.gpus
        clock[t] = at
        out[job.id] = at
        if job.max_runtime_seconds is not None:
            heapq.heappush(heap, (at + timedelta(seconds=job.max_runtime_seconds), job.gpus))
    return out
