"""Rules N1-N4 (docs/scheduling.md, "Idle notebook sessions") as tables: pure, no
database, no Django."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from queueing.policy.sessions import (
    GpuReading,
    ServerReading,
    Verdict,
    activity_at,
    idle_since,
    session_verdict,
)

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


def m(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.mark.parametrize(("server", "expected"), [
    # a busy kernel is activity now
    (ServerReading(m(1), (m(1),), kernel_busy=True, kernels=1), m(30)),
    # kernels: the newest kernel activity, not the server's (an open tab polls the API)
    (ServerReading(m(29), (m(5), m(12)), kernels=2), m(12)),
    # no kernel: the server's own last activity (terminals, files)
    (ServerReading(m(20), (), kernels=0), m(20)),
    (ServerReading(None, (), kernels=0), None),
])
def test_rule_n1_notebook_activity(server: ServerReading, expected: datetime | None) -> None:
    assert activity_at(server, now=m(30)) == expected


@pytest.mark.parametrize(("server", "gpu", "expected"), [
    # idle since the latest of start, notebook activity and GPU busy
    (ServerReading(None, (m(10),), kernels=1), GpuReading(m(3)), m(10)),
    (ServerReading(None, (m(10),), kernels=1), GpuReading(m(25)), m(25)),
    # no GPU readings at all: no veto; the notebook alone
    (ServerReading(None, (m(10),), kernels=1), GpuReading(None), m(10)),
    # nothing ever happened: idle since its start
    (ServerReading(None, (), kernels=0), GpuReading(None), m(0)),
    # a kernel busy now: not idle at all
    (ServerReading(None, (m(1),), kernel_busy=True, kernels=1), GpuReading(None), m(40)),
])
def test_rule_n1_idle_since(server: ServerReading, gpu: GpuReading,
                            expected: datetime) -> None:
    assert idle_since(started_at=m(0), server=server, gpu=gpu, now=m(40)) == expected


@pytest.mark.parametrize(("idle_minutes", "warned_at", "expected"), [
    (0, None, Verdict.BUSY),
    (49, None, Verdict.BUSY),
    (50, None, Verdict.WARN),  # rule N2: limit 60, lead 10
    (55, m(50), Verdict.WARNED),
    (59.9, m(50), Verdict.WARNED),
    (60, m(50), Verdict.CULL),  # rule N3
    (60, None, Verdict.CULL),  # never warned (a check missed): still stopped at the limit
    (500, None, Verdict.CULL),
])
def test_rule_n2_warn_then_n3_cull(idle_minutes: float, warned_at: datetime | None,
                                    expected: Verdict) -> None:
    assert session_verdict(idle_from=m(0), now=m(idle_minutes), idle_limit_minutes=60,
                           warn_lead_minutes=10, warned_at=warned_at) == expected


def test_rule_n4_activity_after_the_warning_resets() -> None:
    # warned at 50, used at 55: idle since 55, before its new warning
    assert session_verdict(idle_from=m(55), now=m(56), idle_limit_minutes=60,
                           warn_lead_minutes=10, warned_at=m(50)) == Verdict.BUSY_AGAIN
    # the service then clears warned_at: the next run warns again at 55 + 50
    assert session_verdict(idle_from=m(55), now=m(104), idle_limit_minutes=60,
                           warn_lead_minutes=10, warned_at=None) == Verdict.BUSY
    assert session_verdict(idle_from=m(55), now=m(105), idle_limit_minutes=60,
                           warn_lead_minutes=10, warned_at=None) == Verdict.WARN


def test_rule_n2_no_lead_no_warning() -> None:
    assert session_verdict(idle_from=m(0), now=m(59), idle_limit_minutes=60,
                           warn_lead_minutes=0, warned_at=None) == Verdict.BUSY
    assert session_verdict(idle_from=m(0), now=m(60), idle_limit_minutes=60,
                           warn_lead_minutes=0, warned_at=None) == Verdict.CULL


def test_rule_n3_cull_at_the_limit_only() -> None:
    kw = {"idle_limit_minutes": 5, "warn_lead_minutes": 2}
    assert session_verdict(idle_from=m(0), now=m(4.99), warned_at=m(3), **kw) == Verdict.WARNED
    assert session_verdict(idle_from=m(0), now=m(5), warned_at=m(3), **kw) == Verdict.CULL
