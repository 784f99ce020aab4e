"""The production wiring through a real Redis: the kick debounce in the cache, and a
scheduler cycle sent through the Redis broker to a real Celery worker.
Skipped unless REDIS_URL is set (CI sets it)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.conf import settings

from queueing.models import Job

from .factories import JobFactory

pytestmark = pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (set REDIS_URL)")


def test_the_cache_is_redis_and_the_kick_is_debounced(settings: Any) -> None:
    from unittest import mock

    from django.core.cache import caches

    from queueing import tasks

    assert "redis" in type(caches["default"]).__module__.lower()
    settings.FAIRQ_KICK_SCHEDULER = True
    cache = caches["default"]
    with mock.patch.object(tasks.scheduler_cycle_task, "apply_async") as send, \
            mock.patch.object(tasks, "_last_kick", 0.0):
        for _ in range(5):
            tasks.kick_scheduler()
        assert send.call_count == 1  # five kicks within a second: one cycle
        time.sleep(1.1)
        tasks.kick_scheduler()
        assert send.call_count == 2
        # Another process (its own memory of the last kick) within the second: the
        # shared key still holds it back.
        tasks._last_kick = 0.0
        tasks.kick_scheduler()
        assert send.call_count == 2 and cache.get("fairq:kick") == 1


@pytest.mark.django_db(transaction=True)
def test_a_cycle_task_travels_through_redis_to_a_worker(world: Any) -> None:
    from celery.contrib.testing.worker import start_worker

    from config.celery import app
    from queueing.tasks import scheduler_cycle_task

    job = JobFactory(team=world.vision, gpu_type=world.a100, tier=world.normal)
    old = {k: app.conf[k] for k in ("broker_url", "task_always_eager")}
    app.conf.update(broker_url=settings.REDIS_URL, task_always_eager=False)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            # An explicit connection: earlier tests may have bound the app's producer
            # pool to the in-memory broker, and changing broker_url does not rebind it.
            with app.connection_for_write(settings.REDIS_URL) as conn:
                scheduler_cycle_task.apply_async(queue="celery", connection=conn)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if Job.objects.get(pk=job.pk).status == "ADMITTED":
                    break
                time.sleep(0.2)
    finally:
        app.conf.update(**old)
    assert Job.objects.get(pk=job.pk).status == "ADMITTED"
