"""Shared GPUs in a real browser (docs/scheduling.md, rule H5): the page of a queued half
of a GPU on a time-sliced type, whose node has free slices but not two on one GPU, says
so. Screenshot: test-artifacts/screenshots/job-wait-shared-gpu.png."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.composition import get_backend, reset_backends
from queueing.selectors.queue_plan import queue_plan_forget
from tests.conftest import World
from tests.factories import GpuTypeFactory, JobFactory, QuotaFactory

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_job_page_says_no_gpu_has_two_free_slices(
        page: Any, world: World, settings: Any, cycle: Callable[..., Any],
        shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    ts = GpuTypeFactory(slug="ts-a10", sharing="time-sliced", slices_per_gpu=4,
                        resource_name="nvidia.com/gpu.shared")
    QuotaFactory(team=world.vision, gpu_type=ts, nominal=4, borrowing_limit=0)
    # The node in the type's units (slices) whether or not the simulated backend
    # multiplies FAIRQ_SIM_NODES' GPUs by them yet.
    settings.FAIRQ_SIM_NODES = "1x3xts-a10"
    reset_backends()
    if get_backend().nodes()[0].capacity == 3:
        settings.FAIRQ_SIM_NODES = "1x12xts-a10"
        reset_backends()
    now = timezone.now()
    for i in range(3):  # three quarters of 3: one per GPU, 1 slice left on each
        JobFactory(team=world.vision, submitter=world.member, gpu_type=ts, tier=world.normal,
                   gpus_per_replica=1, gpu_slices=3, name=f"notebook-{i}",
                   created_at=now - timedelta(minutes=10 - i),
                   env={"FAIRQ_SIM_SECONDS": "3600"})
    half = JobFactory(team=world.vision, submitter=world.member, gpu_type=ts,
                      tier=world.normal, gpus_per_replica=1, gpu_slices=2, name="eval-half",
                      created_at=now - timedelta(minutes=1))
    cycle(now)
    queue_plan_forget()
    login(page, "dave")
    page.goto(f"/jobs/{half.pk}/")
    expect(page.locator("body")).to_contain_text(
        "no ts-a10 GPU has 2 free slices; the most on one GPU is 1")
    shoot(page, "job-wait-shared-gpu")
