"""Rule W2 through the preemption path on PostgreSQL: a booking's start preempts other
teams' jobs on its GPUs with no preemptor job; the victims requeue (rule R6) and their
events say the booking caused it (rule R7)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import Job, JobEvent
from queueing.policy.admission import plan_admissions
from queueing.policy.bookings import Booking
from queueing.policy.states import JobState
from queueing.selectors.preemption import preemption_settings
from queueing.selectors.snapshot import build_snapshot
from queueing.services.preemption import preemptions_apply

from .conftest import World
from .test_scheduler_preemption import fill_h100

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_r9")]


def test_rule_w2_a_booking_start_preempts_through_the_preemption_path(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    ids = fill_h100(world, t0, tier="critical")  # vision, non-preemptible, 2 x 8 GPUs
    now = t0 + timedelta(seconds=30)
    booking = Booking(41, "nlp", "h100", 8, now - timedelta(minutes=1),
                      now + timedelta(hours=2), lend=False)
    snapshot = replace(build_snapshot(backend=get_backend(), now=now), bookings=(booking,))
    plan = plan_admissions(snapshot)
    (p,) = plan.preemptions
    assert p.preemptor_id == 0 and p.booking == booking and len(p.victims) == 1
    applied = preemptions_apply(plan=plan, now=now)
    (victim,) = applied.preempted
    assert victim in ids and len(applied.workloads) == 1
    v = Job.objects.get(pk=victim)
    assert v.status == JobState.QUEUED and v.attempt == 2
    ev = JobEvent.objects.get(job_id=victim, kind=JobEvent.Kind.PREEMPTED)
    assert ev.data["rule"] == "W2-booked" and ev.data["booking"] == 41
    assert ev.data["booking_team"] == "nlp" and "preemptor" not in ev.data
    assert "booked for team nlp" in ev.reason and "rule W2" in ev.reason
    assert not JobEvent.objects.filter(kind=JobEvent.Kind.PREEMPTING).exists()
    # Its page shows the attempt the booking ended, with no preemptor job to link.
    web = Client()
    web.force_login(world.member)
    page = web.get(reverse("web:job-detail", args=[victim]))
    assert page.status_code == 200 and b"booked for team nlp" in page.content
    # The other vision job keeps running; no team's rate limit (rule R5) counts it.
    (other,) = [i for i in ids if i != victim]
    assert Job.objects.get(pk=other).status == JobState.RUNNING
    assert dict(preemption_settings(now=now).used) == {}
