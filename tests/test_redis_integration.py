"""The production wiring through a real Redis: the kick throttle in the cache, and a
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


def test_the_cache_is_redis_and_the_kick_is_throttled_keeping_the_last_one(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from unittest import mock

    from django.core.cache import caches

    from queueing import composition, tasks

    assert "redis" in type(caches["default"]).__module__.lower()
    settings.FAIRQ_KICK_SCHEDULER = True
    cache = caches["default"]
    cache.delete_many(["fairq:kick", "fairq:kick:trailing"])

    def process() -> composition.KickThrottle:  # each process has its own memory
        return composition.KickThrottle(composition._send_cycle)

    monkeypatch.setattr(composition, "_throttle", process())
    # The task is sent by its name through the Celery app: the registered task's
    # apply_async is what runs.
    with mock.patch.object(tasks.scheduler_cycle_task, "apply_async") as send:
        for _ in range(5):
            composition.kick()
        # Five kicks within a second: one cycle now, one at the end of the second (the
        # last kick is never dropped).
        countdowns = [c.kwargs.get("countdown", 0) for c in send.call_args_list]
        assert len(countdowns) == 2 and countdowns[0] == 0 and 0.5 < countdowns[1] <= 1.0
        # Another process within the second: the shared keys hold it back.
        process()()
        assert send.call_count == 2 and isinstance(cache.get("fairq:kick"), float)
        time.sleep(2.1)  # the trailing request pushed the next window a second on
        composition.kick()
        assert send.call_count == 3 and not send.call_args.kwargs.get("countdown")


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
