"""The worked example of docs/scheduling.md ("Fair share" → "Worked example"), checked
number by number through the real paths: CSV import, accumulators, full recompute."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import Team
from queueing.policy.admission import plan_admissions
from queueing.policy.fairshare import Standing, entry_penalty_gpu_hours
from queueing.policy.priority import PriorityWeights, job_priority
from queueing.policy.snapshot import QueuedJob, Snapshot
from queueing.selectors.fairshare import fairshare_standings, fairshare_standings_at
from queueing.services.fairshare import fairshare_recompute
from queueing.services.usage import usage_import_csv

from .conftest import World
from .factories import JobFactory, TeamFactory

NOW = datetime(2026, 1, 15, tzinfo=UTC)
H = 168.0

EXAMPLE_CSV = """team,gpu_type,gpus,start,end
vision,a100,4,2026-01-08T00:00:00+00:00,2026-01-15T00:00:00+00:00
nlp,h100,2,2026-01-01T00:00:00+00:00,2026-01-08T00:00:00+00:00
"""


@pytest.fixture
def example(world: World, settings: Any) -> World:
    settings.FAIRQ_DECAY_HALF_LIFE_HOURS = H
    assert usage_import_csv(stream=io.StringIO(EXAMPLE_CSV), now=timezone.now()) == 2
    # speech used nothing but has a job queued: it is active (rule F2).
    JobFactory(team=world.speech, gpu_type=world.a100, tier=world.normal,
               created_at=NOW - timedelta(hours=1))
    return world


def _check_flat(standings: dict[str, Standing], scale: float = 1.0) -> None:
    v, n, s = standings["vision"], standings["nlp"], standings["speech"]
    assert v.usage == pytest.approx(484.7455 * scale, abs=1e-4)
    assert n.usage == pytest.approx(242.3728 * scale, abs=1e-4)
    assert v.usage + n.usage + s.usage == pytest.approx(727.1183 * scale, abs=1e-4)
    assert s.usage == 0
    assert (v.share, n.share, s.share) == pytest.approx((1 / 2, 1 / 3, 1 / 6))
    assert (v.normalized_usage, n.normalized_usage, s.normalized_usage) == pytest.approx(
        (2 / 3, 1 / 3, 0.0))
    assert v.factor == pytest.approx(0.39685, abs=1e-5)
    assert v.factor == pytest.approx(2 ** (-4 / 3))
    assert n.factor == pytest.approx(0.5)
    assert s.factor == 1.0


def test_worked_example_from_the_accumulators(example: World) -> None:
    _check_flat(fairshare_standings(now=NOW))


def test_worked_example_from_the_full_recompute(example: World) -> None:
    _check_flat(fairshare_standings_at(at=NOW, now=timezone.now()))
    result = fairshare_recompute(now=NOW)
    assert result.max_rel_diff < 1e-9
    _check_flat(fairshare_standings(now=NOW))


def test_worked_example_usage_halves_after_a_half_life_and_f_stays(example: World) -> None:
    _check_flat(fairshare_standings(now=NOW + timedelta(hours=H)), scale=0.5)
    later = fairshare_standings(now=NOW + timedelta(hours=H))
    assert later["vision"].usage == pytest.approx(242.3728, abs=1e-4)
    assert later["nlp"].usage == pytest.approx(121.1864, abs=1e-4)


def test_worked_example_priorities_and_order(example: World) -> None:
    st = fairshare_standings(now=NOW)
    w = PriorityWeights()  # 10 000, 1 000, size 0, max age 168 h
    jobs = [
        QueuedJob(1, "nlp", "h100", 1, 1, 100, NOW - timedelta(hours=42)),
        QueuedJob(2, "vision", "h100", 1, 1, 100, NOW - timedelta(hours=84)),
        QueuedJob(3, "speech", "h100", 1, 1, 100, NOW),
    ]
    p = {j.id: job_priority(j, now=NOW, fair_share_factor=st[j.team].factor, weights=w,
                            cluster_gpus=32).total for j in jobs}
    assert p[1] == pytest.approx(5250.0)
    assert p[2] == pytest.approx(4468.5, abs=0.01)
    assert p[3] == pytest.approx(10000.0)
    # The order the admission pass considers them (rules P2, O1): no nodes, so none is
    # admitted and no entry penalty (F6) moves a team.
    plan = plan_admissions(Snapshot(now=NOW, nodes=(), queued=tuple(jobs), priority_weights=w,
                                    fair_share={t: s.factor for t, s in st.items()}))
    assert plan.order == (3, 1, 2)  # speech, nlp, vision
    assert entry_penalty_gpu_hours(8, 2.0, 3.0) == pytest.approx(0.013333, abs=1e-6)


def test_worked_example_hierarchy(world: World) -> None:
    research = TeamFactory(slug="research", weight=1.0)
    ops = TeamFactory(slug="ops", weight=1.0)
    Team.objects.filter(pk=world.vision.pk).update(parent=research, weight=3.0)
    Team.objects.filter(pk=world.nlp.pk).update(parent=research, weight=1.0)
    # 60, 20 and 20 weighted GPU-hours as of NOW: undecayed would need zero-length
    # intervals, so put exact decayed values into the accumulators instead.
    from queueing.models import FairShareAccumulator

    for team, value in ((world.vision, 60.0), (world.nlp, 20.0), (ops, 20.0)):
        FairShareAccumulator.objects.create(team=team, value=value, as_of=NOW)
    st = fairshare_standings(now=NOW)  # speech: no usage, no job, so not active
    assert not st["speech"].active
    assert st["research"].share == pytest.approx(0.5)
    assert st["ops"].share == pytest.approx(0.5)
    assert st["vision"].share == pytest.approx(0.375)
    assert st["nlp"].share == pytest.approx(0.125)
    assert st["research"].normalized_usage == pytest.approx(0.8)
    assert st["vision"].normalized_usage == pytest.approx(0.75)
    assert st["nlp"].normalized_usage == pytest.approx(0.35)
    assert st["vision"].factor == pytest.approx(0.25)
    assert st["nlp"].factor == pytest.approx(0.14359, abs=1e-5)
    assert st["ops"].factor == pytest.approx(0.75786, abs=1e-5)
    assert st["research"].factor == pytest.approx(0.32988, abs=1e-5)
