"""The demo's weekly booking (`seed_demo`; docs/reservations.md): booked once by alice,
guaranteed on the demo's clusters, not twice."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from accounts.models import AuditEntry
from queueing.models import Reservation
from queueing.services.demo import demo_clusters_seed, demo_reservation_seed, demo_seed

pytestmark = pytest.mark.django_db


def test_the_demo_books_alices_weekly_window_once() -> None:
    demo_seed()
    demo_clusters_seed()
    now = timezone.now()
    booked = demo_reservation_seed(now=now)
    assert booked is not None
    r = Reservation.objects.get(pk=booked)
    assert (r.team.slug, r.gpu_type.slug, r.gpus, r.recurrence) == (
        "vision", "h100", 8, "FREQ=WEEKLY;COUNT=12")
    assert r.ends_at - r.starts_at == timedelta(hours=2) and r.starts_at > now
    assert r.created_by is not None and r.created_by.username == "alice"
    assert AuditEntry.objects.filter(action="book", object_id=str(booked)).exists()
    assert demo_reservation_seed(now=now) is None
    assert Reservation.objects.count() == 1
