"""The cycle's view of booked GPUs (`Snapshot.bookings`) and the charge of unused booked
time (docs/reservations.md, "Charging"), on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import FairShareAccumulator, Reservation, UsageRecord
from queueing.policy.states import JobState
from queueing.selectors.reservations import snapshot_bookings
from queueing.selectors.snapshot import build_snapshot
from queueing.services.reservations import reservations_charge_unused
from tests.conftest import World
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _hour(h: float) -> Any:
    return timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=h)


def _reserve(world: World, **over: Any) -> Reservation:
    values: dict[str, Any] = {"team": world.vision, "gpu_type": world.h100, "gpus": 8,
                              "starts_at": _hour(2), "ends_at": _hour(4)}
    values.update(over)
    return Reservation.objects.create(**values)


def test_snapshot_holds_the_windows_within_the_horizon(world: World, settings: Any,
                                                       ts: Any) -> None:
    settings.FAIRQ_BOOKING_HORIZON_HOURS = 24 * 15
    weekly = _reserve(world, recurrence="FREQ=WEEKLY;COUNT=10", timezone="Europe/Paris")
    shared = _reserve(world, gpu_type=ts, gpus=8, lend_unused=False)  # 2 GPUs of 4 slices
    _reserve(world, cancelled_at=timezone.now())
    _reserve(world, starts_at=_hour(-5), ends_at=_hour(-3))  # over
    now = timezone.now()
    snap = build_snapshot(backend=get_backend(), now=now)
    got = [(b.id, b.team, b.gpu_type, b.gpus, b.lend) for b in snap.bookings]
    # 15 days ahead: the weekly one's first three windows, and the shared one.
    assert sorted(got) == sorted([(weekly.pk, "vision", "h100", 8, True)] * 3
                                 + [(shared.pk, "vision", "ts-a10", 8, False)])
    starts = sorted(b.start for b in snap.bookings if b.id == weekly.pk)
    assert starts[0] == weekly.starts_at
    assert all(b.end - b.start == timedelta(hours=2) for b in snap.bookings)


def test_snapshot_bookings_cost_one_query_when_none(world: World) -> None:
    with CaptureQueriesContext(connection) as q:
        assert snapshot_bookings(now=timezone.now()) == ()
    assert len(q.captured_queries) == 1


def test_unused_booked_time_is_charged_once_when_on(world: World, settings: Any) -> None:
    settings.FAIRQ_BOOKING_CHARGE_UNUSED = True
    start = _hour(-3)
    r = _reserve(world, starts_at=start, ends_at=start + timedelta(hours=2))
    job = JobFactory(team=world.vision, gpu_type=world.h100, gpus_per_replica=2,
                     status=JobState.SUCCEEDED, tier=world.normal)
    # 2 GPUs for the first hour; a 12-GPU hour of the team only counts up to the 8 booked.
    UsageRecord.objects.create(team=world.vision, gpu_type=world.h100, job=job, attempt=1,
                               gpus=2, start=start, end=start + timedelta(hours=1),
                               gpu_seconds=7200)
    UsageRecord.objects.create(team=world.vision, gpu_type=world.h100, job=job, attempt=2,
                               gpus=12, start=start + timedelta(hours=1),
                               end=start + timedelta(hours=2), gpu_seconds=12 * 3600)
    now = timezone.now()
    assert reservations_charge_unused(now=now) == 1
    charge = UsageRecord.objects.get(source=f"booking:{r.pk}")
    # Booked 16 GPU-h; used 2 + 8 (capped): 6 GPU-h unused, charged at the h100's weight.
    assert charge.gpu_seconds == pytest.approx(6 * 3600)
    assert charge.billing_weight == 2.0 and charge.job is None
    assert (charge.start, charge.end) == (start, start + timedelta(hours=2))
    assert FairShareAccumulator.objects.get(team=world.vision).value > 0
    assert reservations_charge_unused(now=now + timedelta(minutes=5)) == 0
    assert UsageRecord.objects.filter(source=f"booking:{r.pk}").count() == 1


def test_nothing_is_charged_when_off(world: World, settings: Any) -> None:
    settings.FAIRQ_BOOKING_CHARGE_UNUSED = False
    _reserve(world, starts_at=_hour(-3), ends_at=_hour(-1))
    assert reservations_charge_unused(now=timezone.now()) == 0
    assert not UsageRecord.objects.exists()


def test_a_window_not_ended_or_cancelled_before_is_not_charged(world: World,
                                                              settings: Any) -> None:
    settings.FAIRQ_BOOKING_CHARGE_UNUSED = True
    _reserve(world, starts_at=_hour(-1), ends_at=_hour(1))  # under way
    _reserve(world, starts_at=_hour(-3), ends_at=_hour(-1),
             cancelled_at=timezone.now() - timedelta(hours=4))  # cancelled before it began
    assert reservations_charge_unused(now=timezone.now()) == 0


def test_a_recurring_booking_past_its_year_is_not_read(world: World) -> None:
    """A recurring booking's windows all start within MAX_RECURRENCE of its first, so one
    whose first window ended longer ago than that is not read, nor walked window by
    window, by the cycle or by a conflict check; one still within its year is."""
    from queueing.policy.bookings import MAX_RECURRENCE
    from queueing.selectors.reservations import live_reservations, with_windows_after

    now = timezone.now()
    old_start = now - MAX_RECURRENCE - timedelta(days=30)
    old = _reserve(world, starts_at=old_start, ends_at=old_start + timedelta(hours=2),
                   recurrence="FREQ=WEEKLY;COUNT=52")
    recent_start = now - timedelta(days=300)  # its 52nd window is still ahead
    recent = _reserve(world, starts_at=recent_start,
                      ends_at=recent_start + timedelta(hours=2),
                      recurrence="FREQ=WEEKLY;COUNT=52")
    kept = set(with_windows_after(live_reservations(), now).values_list("pk", flat=True))
    assert kept == {recent.pk}
    assert old.pk not in {b.id for b in snapshot_bookings(now=now)}
    assert {b.id for b in snapshot_bookings(now=now)} == {recent.pk}


def test_rule_w5_holds_read_without_the_queue_equal_the_full_snapshots(world: World) -> None:
    """A booking's check (rule W5) builds its snapshot from the jobs holding GPUs alone: the
    same holds as the cycle's full snapshot, and no queued row read."""
    from queueing.policy.bookings import booking_holds
    from queueing.services.reservations import _holds_snapshot

    now = timezone.now()
    JobFactory(team=world.nlp, gpu_type=world.h100, gpus_per_replica=4, tier=world.critical,
               status=JobState.RUNNING, started_at=now, max_runtime_seconds=3600)
    JobFactory(team=world.vision, gpu_type=world.h100, gpus_per_replica=2, tier=world.normal,
               status=JobState.RUNNING, started_at=now)
    for _ in range(3):
        JobFactory(team=world.vision, gpu_type=world.h100, gpus_per_replica=8)
    _reserve(world)
    full = build_snapshot(backend=get_backend(), now=now)
    assert len(full.queued) == 3
    with CaptureQueriesContext(connection) as q:
        lean = _holds_snapshot(now)
    assert lean.queued == ()
    # (The nominations' query joins the jobs of `preempting` events of the last minutes.)
    assert not any("'QUEUED'" in x["sql"] and 'FROM "queueing_job" ' in x["sql"]
                   for x in q.captured_queries)
    for gt in ("h100", "a100"):
        assert booking_holds(lean, gt) == booking_holds(full, gt)
    assert booking_holds(lean, "h100")[1]  # the critical job and the booking hold
