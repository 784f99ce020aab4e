"""The plan published only when the queue changed (queueing/selectors/queue_plan.py,
`plan_inputs_mark`; docs/performance.md "The plan published only when the queue
changed"): a quiet cycle - no job moved, no input of the plan changed - publishes
nothing, and a change of each kind (a submit, a cancel, an edit of a row, a team, quota,
tier, GPU type or cluster change, a node's GPUs, the plan's age, the cache flushed)
makes the next cycle publish again.

The mark stands on the cycle's kept active jobs, which need committed rows on
PostgreSQL (`transaction=True`); inside a transaction every refresh is a full read and
every cycle publishes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.cache import cache
from django.utils import timezone

from accounts.models import Team
from queueing.models import Cluster, GpuType, Job, Quota, Tier
from queueing.policy.states import JobState
from queueing.selectors import queue_plan as qp
from queueing.selectors.active_jobs import cycle_active_jobs_forget
from queueing.services.jobs import job_cancel, job_input_build, job_submit
from queueing.services.scheduler import scheduler_cycle

from .conftest import World

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _kept_jobs() -> Iterator[None]:
    cycle_active_jobs_forget()
    qp._LAST_MARK.clear()
    yield
    cycle_active_jobs_forget()
    qp._LAST_MARK.clear()


def _submit(world: World, *, gpus: int = 8, tier: str = "normal") -> Job:
    data = job_input_build(actor=world.admin, team="vision", name="j",
                           image="ghcr.io/acme/train:1.4", gpu_type="h100", gpus=gpus,
                           replicas=4, tier=tier)
    return job_submit(actor=world.admin, data=data, now=timezone.now())[0]


def _generation() -> str | None:
    got: str | None = cache.get(qp._PUB_GEN_KEY)
    return got


def _quiet(world: World) -> str:
    """A queue that cannot move (jobs of 4 x 8 h100 on a cluster too small for them),
    cycled until a cycle publishes nothing; the generation standing."""
    for _ in range(3):
        _submit(world)
    before = None
    for _ in range(4):
        result = scheduler_cycle(now=timezone.now())
        assert not result.admitted
        now = _generation()
        if now is not None and now == before:
            return now
        before = now
    raise AssertionError("no quiet cycle")


def _publishes(change: Callable[[], Any]) -> bool:
    before = _generation()
    change()
    scheduler_cycle(now=timezone.now())
    return _generation() != before


def test_a_quiet_cycle_publishes_nothing_and_the_plan_stands(world: World) -> None:
    generation = _quiet(world)
    for _ in range(2):
        scheduler_cycle(now=timezone.now())
        assert _generation() == generation
    plan = qp.queue_plan(now=timezone.now())
    assert isinstance(plan, qp.PublishedPlan) and plan.generation == generation
    assert plan.queued == 3


def _tier_rank() -> None:
    Tier.objects.filter(slug="normal").update(rank=150)


def _quota() -> None:
    Quota.objects.filter(team__slug="vision", gpu_type__slug="h100").update(nominal=4)


def _team_weight() -> None:
    Team.objects.filter(slug="vision").update(weight=7.0)


def _gpu_type() -> None:
    GpuType.objects.filter(slug="h100").update(billing_weight=5.0)


def _cluster() -> None:
    Cluster.objects.create(name="cloud", backend="simulated", sim_nodes="2x8xh100", cost_rank=5)


@pytest.mark.parametrize("change", [_tier_rank, _quota, _team_weight, _gpu_type, _cluster],
                         ids=["tier", "quota", "team", "gpu_type", "cluster"])
def test_a_change_of_the_plans_inputs_publishes(world: World, change: Any) -> None:
    _quiet(world)
    assert _publishes(change)
    assert not _publishes(lambda: None)  # and quiet again after it


def test_a_submit_a_cancel_and_an_edit_of_a_row_publish(world: World) -> None:
    _quiet(world)
    job = Job.objects.filter(status=JobState.QUEUED).order_by("pk").first()
    assert job is not None
    assert _publishes(lambda: _submit(world))
    assert not _publishes(lambda: None)
    assert _publishes(lambda: job_cancel(actor=world.admin, job=job))
    assert not _publishes(lambda: None)
    other = Job.objects.filter(status=JobState.QUEUED).order_by("pk").first()
    assert other is not None
    assert _publishes(lambda: Job.objects.filter(pk=other.pk).update(gpus_per_replica=16))
    assert not _publishes(lambda: None)


def test_a_plan_older_than_the_bound_or_gone_from_the_cache_is_published_again(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    _quiet(world)
    monkeypatch.setattr(qp, "PUBLISH_MAX_AGE", 0.0)
    assert _publishes(lambda: None)
    monkeypatch.setattr(qp, "PUBLISH_MAX_AGE", 30.0)
    assert not _publishes(lambda: None)
    assert _publishes(lambda: cache.delete(qp._PUB_GEN_KEY))
    assert _generation() is not None


def test_every_cycle_publishes_with_the_skip_off(world: World,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _quiet(world)
    monkeypatch.setattr(qp, "PUBLISH_SKIP", False)
    assert _publishes(lambda: None)
    assert _publishes(lambda: None)
