"""Two agents asking the same earliest window at once and booking it (`POST
/reservations/earliest/` with `book: true`) get two windows, one after the other: the
GPU type's row lock (docs/reservations.md). PostgreSQL: real row locks and concurrent
transactions."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from queueing.models import Reservation
from queueing.services import reservations as service
from tests.conftest import World

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_agents_booking_the_earliest_window_at_once_get_two(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    found = service.earliest_for

    def slow(**kwargs: Any) -> Any:
        answer = found(**kwargs)
        time.sleep(0.5)  # both would have found the same window by now, without the lock
        return answer

    monkeypatch.setattr(service, "earliest_for", slow)
    barrier = threading.Barrier(2)
    answers: list[Any] = []
    errors: list[BaseException] = []

    def agent(user: Any) -> None:
        try:
            barrier.wait(timeout=10)
            answers.append(world.client(user).post("/api/v1/reservations/earliest/", {
                "team": "vision", "gpu_types": ["h100"], "gpus": 16, "duration": "2h",
                "book": True}, format="json"))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=agent, args=(u,)) for u in (world.admin, world.staff)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert [a.status_code for a in answers] == [201, 201], [a.content for a in answers]
    first, second = sorted(Reservation.objects.all(), key=lambda r: r.starts_at)
    # The whole fleet each: the second starts as the first ends.
    assert second.starts_at == first.ends_at
    assert first.ends_at - first.starts_at == timedelta(hours=2)
