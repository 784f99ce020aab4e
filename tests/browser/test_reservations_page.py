"""Booked GPUs in a real browser (docs/reservations.md, "On the web"): a team admin books
8 h100 weekly on the bookings page, a clash is refused with its window named, the
booking shows on the capacity view (the dashboard's and the staff cluster page's) and on
the team page, and is cancelled. Screenshots: test-artifacts/screenshots/reservations-*.png."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.models import Reservation
from tests.conftest import World

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_book_see_on_the_capacity_view_and_cancel(
        page: Any, world: World, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    now = timezone.now()
    # Another team's booking already there (not lent), tomorrow.
    Reservation.objects.create(team=world.nlp, gpu_type=world.a100, gpus=4, name="nightly",
                               starts_at=(now + timedelta(days=1)).replace(minute=0, second=0,
                                                                          microsecond=0),
                               ends_at=(now + timedelta(days=1, hours=6)).replace(
                                   minute=0, second=0, microsecond=0), lend_unused=False)
    start = (now + timedelta(hours=3)).replace(minute=0, second=0, microsecond=0)
    login(page, world.admin.username)
    page.get_by_role("link", name="Bookings").click()
    expect(page.get_by_role("heading", name="Booked GPUs", exact=True)).to_be_visible()
    form = page.locator("#book-form")
    form.get_by_label("Team").select_option("vision")
    form.get_by_label("GPU type").select_option("h100")
    form.locator("#id_gpus").fill("8")
    form.locator("#id_start").fill(start.strftime("%Y-%m-%dT%H:%M"))
    form.locator("#id_duration").fill("4h")
    form.get_by_label("Repeat").select_option("FREQ=WEEKLY;COUNT=4")
    form.get_by_label("Name").fill("weekly eval")
    form.get_by_role("button", name="Book").click()
    expect(page.get_by_role("status")).to_contain_text("Booked reservation")
    r = Reservation.objects.get(team=world.vision)
    assert (r.starts_at, r.ends_at, r.gpus) == (start, start + timedelta(hours=4), 8)
    assert r.recurrence == "FREQ=WEEKLY;COUNT=4"
    expect(page.locator(".booked-win")).to_have_count(2)
    shoot(page, "reservations-page")

    # A clash: 12 more h100 in the same window do not fit in 16.
    form = page.locator("#book-form")
    form.get_by_label("GPU type").select_option("h100")
    form.locator("#id_gpus").fill("12")
    form.locator("#id_start").fill(start.strftime("%Y-%m-%dT%H:%M"))
    form.locator("#id_duration").fill("1h")
    form.get_by_role("button", name="Book").click()
    alert = page.locator("#book-form .alert")
    expect(alert).to_contain_text("cannot be guaranteed from "
                                  f"{start:%Y-%m-%dT%H:%M:%S}Z")
    expect(alert).to_contain_text("The earliest window that fits starts "
                                  f"{start + timedelta(hours=4):%Y-%m-%dT%H:%M:%S}Z")
    shoot(page, "reservations-conflict")

    # The dashboard's capacity card shows both windows on its timeline.
    page.goto(page.url.split("/reservations/")[0] + "/")
    card = page.locator("section[aria-labelledby=cap-h]")
    expect(card.locator(".booked-win")).to_have_count(2)
    expect(card.locator(".booked-table")).to_contain_text("weekly eval")
    expect(card.locator(".booked-table")).to_contain_text("not lent")
    card.scroll_into_view_if_needed()
    shoot(page, "reservations-dashboard-capacity")

    page.goto(page.url.rstrip("/") + "/teams/vision/")
    expect(page.locator("section[aria-labelledby=bookings-h]")).to_contain_text("FREQ=WEEKLY;COUNT=4")

    page.goto(page.url.split("/teams/")[0] + "/reservations/")
    page.get_by_role("button", name=f"Cancel reservation {r.pk}").click()
    expect(page.get_by_role("status")).to_contain_text(f"Cancelled reservation {r.pk}")
    r.refresh_from_db()
    assert r.cancelled_at is not None
    expect(page.locator(".booked-win")).to_have_count(1)


def test_the_staff_capacity_view_shows_the_booked_windows(
        page: Any, world: World, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    Reservation.objects.create(team=world.vision, gpu_type=world.h100, gpus=8, name="eval",
                               starts_at=now - timedelta(hours=1), ends_at=now + timedelta(hours=2),
                               recurrence="FREQ=DAILY;COUNT=5")
    Reservation.objects.create(team=world.nlp, gpu_type=world.a100, gpus=16,
                               starts_at=now + timedelta(days=2), ends_at=now + timedelta(days=3),
                               lend_unused=False)
    login(page, world.staff.username)
    page.goto(page.url.rstrip("/") + "/cluster/")
    cap = page.locator("section[aria-labelledby=ccap-h]")
    # Five daily windows of vision (one now), nlp's one.
    expect(cap.locator(".booked-win")).to_have_count(6)
    expect(cap.locator(".booked-win.booked-now")).to_have_count(1)
    expect(cap.locator(".booked-current")).to_contain_text("now")
    cap.scroll_into_view_if_needed()
    shoot(page, "reservations-cluster-capacity")
