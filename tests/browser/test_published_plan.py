"""Rule P3 in a real browser from the plan the cycle published (queueing/selectors/
queue_plan.py): after one cycle the dashboard's queue and a queued job's page say why
it waits, and no request plans the queue. Screenshots:
test-artifacts/screenshots/dashboard-published-plan.png, job-wait-published-plan.png."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.utils import timezone

from queueing.selectors import queue_plan as qp
from tests.conftest import World
from tests.factories import JobFactory

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_pages_say_why_a_job_waits_from_the_cycles_plan(
        page: Any, world: World, cycle: Callable[..., Any],
        shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    now = timezone.now()
    jobs = [JobFactory(team=world.vision, submitter=world.member, gpu_type=world.h100,
                       tier=world.normal, gpus_per_replica=8, replicas=1, name=f"sweep-{i}",
                       created_at=now - timedelta(minutes=10 - i),
                       env={"FAIRQ_SIM_SECONDS": "3600"}) for i in range(6)]
    cycle(now)
    plan = qp.queue_plan(now=timezone.now())
    assert isinstance(plan, qp.PublishedPlan)
    waiting = [j for j in jobs if plan.position(j.pk) is not None]
    assert waiting, "the cluster admitted every job: nothing waits"
    last = waiting[-1]
    reasons = [r["message"] for r in plan.reasons(last.pk)]
    assert reasons
    with mock.patch.object(qp, "plan_admissions", side_effect=AssertionError("planned")):
        login(page, "dave")
        page.goto("/")
        queue = page.locator("#team-queue")
        expect(queue).to_contain_text(last.name)
        expect(queue).to_contain_text(reasons[0])
        shoot(page, "dashboard-published-plan")
        page.goto(f"/jobs/{last.pk}/")
        expect(page.locator("#queue-position")).to_contain_text(
            f"Position {plan.position(last.pk)} of {plan.queued}")
        for message in reasons:
            expect(page.locator("body")).to_contain_text(message)
        shoot(page, "job-wait-published-plan")
