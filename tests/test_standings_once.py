"""The standings the pages keep, as the scheduler cycle publishes them after step 5
(queueing/services/scheduler.py, `_STANDINGS_KEPT`; docs/performance.md, "The standings
once a cycle"): computed on the cycle's kept active jobs brought up to date, they are
what `fairshare_standings(now=...)` reads afresh once the cycle is written (rules F1-F6),
to the bit, over random worlds of real cycles: admissions (rule F6's entry penalty),
starts and ends, preemptions (the victims' usage charged, rules R6, F1), cancellations
between cycles, a department over two teams (rule F4) and weights changed.

The kept path needs committed rows on PostgreSQL (`transaction=True`)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.utils import timezone

from accounts.models import Team
from queueing.models import Job
from queueing.policy.fairshare import Standing
from queueing.policy.states import JobState
from queueing.selectors import dashboard as dash
from queueing.selectors.active_jobs import cycle_active_jobs_forget
from queueing.selectors.fairshare import fairshare_standings
from queueing.services import scheduler
from queueing.services.jobs import job_cancel, job_input_build, job_submit
from queueing.services.scheduler import CycleResult, scheduler_cycle

from .conftest import World

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _kept_jobs() -> Iterator[None]:
    cycle_active_jobs_forget()
    dash._local.clear()
    yield
    cycle_active_jobs_forget()
    dash._local.clear()


class _Calls:
    """The calls of `fairshare_standings` made through one module's name, with or
    without the kept active jobs."""

    def __init__(self) -> None:
        self.kept = self.fresh = 0

    def __call__(self, *, now: Any, jobs: Any = None) -> dict[str, Standing]:
        if jobs is None:
            self.fresh += 1
        else:
            self.kept += 1
        return fairshare_standings(now=now, jobs=jobs)


def _submit(world: World, rnd: random.Random, now: Any) -> Job:
    team, actor = rnd.choice(((world.vision, world.admin), (world.nlp, world.outsider),
                              (world.speech, world.staff)))
    gpu_type = rnd.choice(("h100", "h100", "a100"))
    data = job_input_build(
        actor=actor, team=team.slug, name="j", image="ghcr.io/acme/train:1.4",
        gpu_type=gpu_type, gpus=rnd.choice((1, 2, 4, 8)), replicas=rnd.choice((1, 1, 2)),
        tier=rnd.choice(("low", "low", "normal", "high")),
        env={"FAIRQ_SIM_SECONDS": str(rnd.choice((30, 90, 300, 900)))})
    return job_submit(actor=actor, data=data, now=now)[0]


def _published() -> dict[str, Standing]:
    """The standings kept for the pages, as another process reads them."""
    kept = cache.get(dash._STANDINGS_KEY)
    assert kept is not None
    assert dash._local[dash._STANDINGS_KEY] == kept
    got: dict[str, Standing] = kept[1]
    return got


def _cycles(world: World, seed: int, monkeypatch: pytest.MonkeyPatch
            ) -> tuple[list[CycleResult], _Calls, _Calls]:
    """Random cycles, each followed by the check: the standings published are those read
    afresh at the cycle's `now`."""
    rnd = random.Random(seed)
    if rnd.random() < 0.5:  # rule F4: a department over two of the teams
        dept = Team.objects.create(slug="dept", name="Dept", weight=rnd.choice((1.0, 2.0)))
        Team.objects.filter(pk__in=[world.nlp.pk, world.speech.pk]).update(parent=dept)
    in_cycle, in_pages = _Calls(), _Calls()
    monkeypatch.setattr(scheduler, "fairshare_standings", in_cycle)
    monkeypatch.setattr(dash, "fairshare_standings", in_pages)
    now = timezone.now()
    results = []
    for _ in range(rnd.randint(5, 8)):
        for _ in range(rnd.randint(0, 6)):
            _submit(world, rnd, now)
        active = list(Job.objects.filter(status__in=[JobState.QUEUED, JobState.RUNNING,
                                                     JobState.ADMITTED]))
        for job in rnd.sample(active, min(len(active), rnd.randint(0, 1))):
            job_cancel(actor=world.staff, job=job)
        if rnd.random() < 0.2:
            Team.objects.filter(pk=world.speech.pk).update(weight=rnd.choice((0.5, 1.0, 4.0)))
        now += timedelta(seconds=rnd.choice((5, 40, 120, 400)))
        result = scheduler_cycle(now=now)
        results.append(result)
        assert cache.get(dash._PUBLISHED_AT_KEY) == now  # every cycle here is new
        assert _published() == fairshare_standings(now=now), (seed, len(results))
    return results, in_cycle, in_pages


@pytest.mark.parametrize("seed", range(6))
def test_rule_f1_f6_the_cycles_published_standings_are_those_read_afresh(
        world: World, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    results, in_cycle, in_pages = _cycles(world, seed, monkeypatch)
    assert in_pages.fresh == 0 and in_pages.kept == 0  # none read afresh for the pages
    assert in_cycle.kept == len(results) and in_cycle.fresh == 0  # the kept path ran
    assert any(r.admitted for r in results)


def test_a_preemptions_victims_usage_is_in_the_published_standings(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule R6: step 4 requeues the victims and charges their attempts (rule F1) after
    the snapshot's standings were read; the published ones have them."""
    in_cycle = _Calls()
    monkeypatch.setattr(scheduler, "fairshare_standings", in_cycle)
    now = timezone.now()
    low = [job_submit(actor=world.outsider, data=job_input_build(
        actor=world.outsider, team="nlp", name="l", image="ghcr.io/acme/train:1.4",
        gpu_type="h100", gpus=8, tier="low", env={"FAIRQ_SIM_SECONDS": "7200"}),
        now=now)[0] for _ in range(2)]
    scheduler_cycle(now=now)
    now += timedelta(seconds=60)
    scheduler_cycle(now=now)  # both running: the 16 h100 all nlp's
    assert Job.objects.filter(pk__in=[j.pk for j in low], status=JobState.RUNNING).count() == 2
    job_submit(actor=world.admin, data=job_input_build(
        actor=world.admin, team="vision", name="h", image="ghcr.io/acme/train:1.4",
        gpu_type="h100", gpus=8, tier="high"), now=now)
    now += timedelta(seconds=600)
    result = scheduler_cycle(now=now)
    assert result.preempted
    assert _published() == fairshare_standings(now=now)
    assert in_cycle.kept == 3 and in_cycle.fresh == 0


def test_with_the_switch_off_the_pages_read_them_afresh(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """`_STANDINGS_KEPT` off: the path before, the same standings published."""
    monkeypatch.setattr(scheduler, "_STANDINGS_KEPT", False)
    in_cycle, in_pages = _Calls(), _Calls()
    monkeypatch.setattr(scheduler, "fairshare_standings", in_cycle)
    monkeypatch.setattr(dash, "fairshare_standings", in_pages)
    rnd = random.Random(11)
    now = timezone.now()
    for _ in range(3):
        for _ in range(4):
            _submit(world, rnd, now)
        now += timedelta(seconds=60)
        scheduler_cycle(now=now)
        assert _published() == fairshare_standings(now=now)
    assert in_pages.fresh == 3 and in_cycle.kept == 0
