"""The shared test world: three teams, a team admin, a member, an outsider and staff,
GPU types and tiers matching the test settings' simulated cluster
(FAIRQ_SIM_NODES = 2x8xh100, 2x8xa100, 1x7xmig-1g-10gb)."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from accounts.models import Role
from accounts.services import token_issue
from queueing.composition import reset_backends
from queueing.memo import forget_all
from queueing.services import jobs as jobs_service

from . import quick_flush
from .factories import (
    GpuTypeFactory,
    MembershipFactory,
    QuotaFactory,
    TeamFactory,
    TierFactory,
    UserFactory,
)

# The flush after each test that commits: DELETE of every model table, on
# PostgreSQL, where Django's TRUNCATE of every table costs seconds (tests/quick_flush.py).
quick_flush.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `postgres` need row locks and concurrent transactions: skip them on
    SQLite (CI sets DATABASE_URL, so they run there)."""
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_backend_and_cache() -> Iterator[None]:
    """Each test gets an empty simulated cluster, an empty cache and no memos."""
    reset_backends()
    _clear_cache()
    forget_all()
    yield
    reset_backends()


def _clear_cache() -> None:
    """Empty this test run's cache. On Redis only our prefixed keys go: `clear()` there
    is FLUSHDB, which would also drop Celery's queues and others' keys."""
    from django.core.cache import cache, caches

    backend = caches["default"]
    if "redis" not in type(backend).__module__:
        cache.clear()
        return
    backend.delete_pattern("*")  # type: ignore[attr-defined]  # django-redis: within KEY_PREFIX


@dataclass
class World:
    vision: Any
    nlp: Any
    speech: Any
    h100: Any
    a100: Any
    mig: Any
    low: Any
    normal: Any
    high: Any
    critical: Any
    admin: Any  # team-admin of vision
    member: Any  # member of vision
    outsider: Any  # member of nlp only
    staff: Any

    def client(self, user: Any) -> APIClient:
        """An API client authenticated with a real token of `user`."""
        c = APIClient()
        c.credentials(HTTP_AUTHORIZATION=f"Token {token_issue(user=user).key}")
        return c


@pytest.fixture
def world(db: None) -> World:
    h100 = GpuTypeFactory(slug="h100", billing_weight=2.0,
                          node_labels={"nvidia.com/gpu.product": "H100"})
    a100 = GpuTypeFactory(slug="a100", billing_weight=1.0)
    mig = GpuTypeFactory(slug="mig-1g-10gb", resource_name="nvidia.com/mig-1g.10gb",
                         billing_weight=0.15)
    low = TierFactory(slug="low", rank=0)
    normal = TierFactory(slug="normal", rank=100, min_runtime_seconds=0)
    high = TierFactory(slug="high", rank=200)
    critical = TierFactory(slug="critical", rank=300, preemptible=False)
    vision = TeamFactory(slug="vision", weight=3.0)
    nlp = TeamFactory(slug="nlp", weight=2.0)
    speech = TeamFactory(slug="speech", weight=1.0)
    admin = UserFactory(username="alice")
    member = UserFactory(username="dave")
    outsider = UserFactory(username="bob")
    staff = UserFactory(username="root", is_staff=True)
    MembershipFactory(user=admin, team=vision, role=Role.TEAM_ADMIN)
    MembershipFactory(user=member, team=vision, role=Role.MEMBER)
    MembershipFactory(user=outsider, team=nlp, role=Role.TEAM_ADMIN)
    for team in (vision, nlp, speech):
        QuotaFactory(team=team, gpu_type=h100, nominal=8, borrowing_limit=8)
        QuotaFactory(team=team, gpu_type=a100, nominal=8, borrowing_limit=None)
    return World(vision, nlp, speech, h100, a100, mig, low, normal, high, critical,
                 admin, member, outsider, staff)


def poison_admission(monkeypatch: pytest.MonkeyPatch, bad: int, exc: Exception) -> None:
    """Admitting job `bad` raises `exc`, on both of step 4's paths: the one-job path's
    `job_transition`, and the batched path's statement (`jobs_admit_batch`), which then
    falls back to the one-job path."""
    from queueing.services import scheduler as sched

    real_transition, real_batch = sched.job_transition, sched.jobs_admit_batch

    def transition(job: Any, target: Any, **kw: Any) -> bool:
        if job.pk == bad and target == "ADMITTED":
            raise exc
        return real_transition(job, target, **kw)

    def batch(rows: Any, **kw: Any) -> Any:
        if any(row[0].pk == bad for row in rows):
            raise exc
        return real_batch(rows, **kw)

    monkeypatch.setattr(sched, "job_transition", transition)
    monkeypatch.setattr(sched, "jobs_admit_batch", batch)


def poison_charge(monkeypatch: pytest.MonkeyPatch, bad: Collection[int],
                  exc: Exception) -> None:
    """Charging a job of `bad` when it ends raises `exc`, on both of step 1's paths: the
    one-job path's `usage_record_attempt`, and the batched path's insert
    (`usage_record_attempts`), which then falls back to the one-job path."""
    from queueing.services import scheduler as sched

    real_charge, real_batch = sched.usage_record_attempt, sched.usage_record_attempts

    def charge(*, job: Any, start: Any, end: Any, **kw: Any) -> Any:
        if job.pk in bad:
            raise exc
        return real_charge(job=job, start=start, end=end, **kw)

    def batch(charges: Any) -> Any:
        if any(job.pk in bad for job, _, _ in charges):
            raise exc
        return real_batch(charges)

    monkeypatch.setattr(sched, "usage_record_attempt", charge)
    monkeypatch.setattr(sched, "usage_record_attempts", batch)


def job_body(**overrides: Any) -> dict[str, Any]:
    """A valid job as pipelines post it."""
    body: dict[str, Any] = {
        "team": "vision", "name": "resnet-sweep-3", "image": "ghcr.io/acme/train:1.4",
        "command": ["python", "train.py"], "args": ["--epochs", "10"], "env": {"SEED": "1"},
        "gpu_type": "h100", "gpus": 2, "replicas": 1, "tier": "normal",
        "max_runtime_seconds": 3600,
    }
    body.update(overrides)
    return body


@pytest.fixture
def ts(world: World, settings: Any) -> Any:
    """A time-sliced GPU type `ts-a10` (4 slices per GPU, docs/api.md "Fractions of a
    GPU") on 2 simulated nodes of 2 GPUs beside the usual h100 and a100 ones; vision's
    quota 2 of its GPUs, borrowing unlimited."""
    settings.FAIRQ_SIM_NODES = "2x8xh100,2x8xa100,2x2xts-a10"
    gpu_type = GpuTypeFactory(slug="ts-a10", sharing="time-sliced", slices_per_gpu=4,
                              resource_name="nvidia.com/gpu.shared")
    QuotaFactory(team=world.vision, gpu_type=gpu_type, nominal=2, borrowing_limit=None)
    return gpu_type


@pytest.fixture
def on_postgres() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def no_r9(settings: Any) -> None:
    """Rule R9 off (lost work against the preemptor's wait). For tests that submit at the
    wall clock's time and run cycles at chosen instants: with R9 on they would decide on
    how long the submits took on a loaded machine. R9's own tests set it."""
    settings.FAIRQ_PREEMPTION_LOST_PER_WAIT = -1.0


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The event ids handed to the webhooks (after commit), by the per-job and the
    batched writes alike (`jobs.webhooks_event_written`, `webhooks_events_written`)."""
    ids: list[int] = []
    monkeypatch.setattr(jobs_service, "webhooks_event_written", ids.append)
    monkeypatch.setattr(jobs_service, "webhooks_events_written", ids.extend)
    return ids
