"""Idle notebook sessions: rules N1-N4 (docs/scheduling.md, "Idle notebook sessions").

Pure: what the notebook server and the GPUs said, and `now`, in; a verdict out. The
service (queueing/services/sessions.py) reads the server's API and the attempt's
utilization summary, calls `idle_since` and `session_verdict`, and applies the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class ServerReading:
    """What a JupyterLab server's API said: its own `last_activity` (/api/status: API
    calls, terminals, kernels), and per kernel (/api/kernels) its `last_activity` and
    whether its `execution_state` is busy."""

    server_last_activity: datetime | None
    kernels_last_activity: tuple[datetime, ...] = ()
    kernel_busy: bool = False
    kernels: int = 0


@dataclass(frozen=True, slots=True)
class GpuReading:
    """The attempt's GPUs by rules U1-U5 (its utilization summary): `last_busy_at`, the
    last minute known at or above the tier's threshold (or the start of the run below
    it); None when nothing was ever read (no source for its pods: no veto, rule N1)."""

    last_busy_at: datetime | None


def activity_at(server: ServerReading, *, now: datetime) -> datetime | None:
    """Rule N1, the notebook side: `now` while a kernel is busy; else the newest kernel
    activity; a server without kernels, its own last activity."""
    if server.kernel_busy:
        return now
    if server.kernels and server.kernels_last_activity:
        return max(server.kernels_last_activity)
    return server.server_last_activity


def idle_since(*, started_at: datetime, server: ServerReading, gpu: GpuReading,
               now: datetime) -> datetime:
    """Rule N1: a session is idle since the latest of its start, its last notebook
    activity and its GPUs' last busy minute (never after `now`)."""
    times = [started_at]
    activity = activity_at(server, now=now)
    if activity is not None:
        times.append(activity)
    if gpu.last_busy_at is not None:
        times.append(gpu.last_busy_at)
    return min(max(times), now)


class Verdict(StrEnum):
    BUSY = "busy"  # not idle long enough for anything
    WARN = "warn"  # rule N2: warn now
    WARNED = "warned"  # warned already, not yet at the limit
    CULL = "cull"  # rule N3: stop it now
    BUSY_AGAIN = "busy_again"  # rule N4: warned, then active again


def session_verdict(*, idle_from: datetime, now: datetime, idle_limit_minutes: int,
                    warn_lead_minutes: int, warned_at: datetime | None) -> Verdict:
    """Rules N2-N4 for a session idle since `idle_from`:

    - N3: idle `idle_limit_minutes` or more -> CULL (warned or not: a lead longer than
      the check's period still warns first, as N2 comes `warn_lead_minutes` earlier);
    - N2: idle `idle_limit_minutes - warn_lead_minutes` or more and not warned in this
      idle run -> WARN (0 lead: no warning); warned in it -> WARNED;
    - N4: warned before this idle run began (activity since the warning) -> BUSY_AGAIN;
    - else BUSY."""
    idle = now - idle_from
    if warned_at is not None and warned_at < idle_from:
        return Verdict.BUSY_AGAIN
    if idle >= timedelta(minutes=idle_limit_minutes):
        return Verdict.CULL
    lead = min(max(0, warn_lead_minutes), idle_limit_minutes)
    if lead and idle >= timedelta(minutes=idle_limit_minutes - lead):
        return Verdict.WARNED if warned_at is not None else Verdict.WARN
    return Verdict.WARNED if warned_at is not None else Verdict.BUSY
