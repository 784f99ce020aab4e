"""A submit's membership and tier checks (rule T1) ride on its INSERT: one
statement checks and writes, so a membership or grant revoked after the request's team
lookup still refuses, and a refused submit writes nothing and says which check refused."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import Membership
from queueing.errors import DomainError
from queueing.models import BudgetPolicy, Job, JobEvent, TeamBudget, Tier
from queueing.selectors.lookups import team_for_submitter
from queueing.services.jobs import JobInput, job_submit_with_event

from .conftest import World, job_body


def _input(world: World, **over: Any) -> JobInput:
    values: dict[str, Any] = {
        "team": world.vision, "name": "resnet", "image": "ghcr.io/acme/train:1.4",
        "command": [], "args": [], "env": {}, "gpu_type": world.h100, "gpus_per_replica": 1,
        "replicas": 1, "tier": world.normal, "max_runtime_seconds": None}
    values.update(over)
    return JobInput(**values)


def test_a_submit_checks_membership_and_tier_in_its_insert(world: World) -> None:
    c = world.client(world.member)
    c.post("/api/v1/jobs/", job_body(), format="json")  # warm the reference memos
    with CaptureQueriesContext(connection) as q:
        r = c.post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201, r.content
    sqls = [x["sql"] for x in q.captured_queries]
    # The job's INSERT (PostgreSQL: one statement with the event's; SQLite: two).
    inserts = [s for s in sqls if s.startswith(("INSERT", "WITH"))
               and 'INTO "queueing_job" ' in s]
    assert len(inserts) == 1 and "queueing_tiergrant" in inserts[0]
    assert "accounts_membership" in inserts[0]
    # No statement of its own for the check any more.
    assert not [s for s in sqls if s.startswith("SELECT") and "queueing_tiergrant" in s], sqls


def test_a_membership_revoked_before_the_insert_refuses_and_writes_nothing(
        world: World) -> None:
    data = _input(world)  # built (team looked up) while a member
    Membership.objects.filter(user=world.member, team=world.vision).delete()
    with pytest.raises(DomainError) as e:
        job_submit_with_event(actor=world.member, data=data)
    assert "team" in e.value.fields
    assert not Job.objects.exists() and not JobEvent.objects.exists()


def test_a_tier_not_granted_refuses_on_tier_and_staff_pass_without_membership(
        world: World) -> None:
    data = _input(world, tier=world.critical)  # built while the tier is open to all
    Tier.objects.filter(pk=world.critical.pk).update(open_to_all_teams=False)
    with pytest.raises(DomainError) as e:
        job_submit_with_event(actor=world.member, data=data)
    assert list(e.value.fields) == ["tier"]
    assert not Job.objects.exists()
    job, event, created = job_submit_with_event(actor=world.staff,
                                                data=_input(world, team=world.nlp))
    assert created and event is not None and Job.objects.get().pk == job.pk
    assert JobEvent.objects.get().job_id == job.pk


def test_a_submit_reads_the_teams_budget_policy_with_the_team(world: World) -> None:
    """Rule B3's "has the team a downgrade budget?" rides on the team lookup: a team
    without one costs the submit no query of its own."""
    c = world.client(world.member)
    c.post("/api/v1/jobs/", job_body(), format="json")  # warm the reference memos
    # The DRF path (an Idempotency-Key sends the submit there) reads it with the team.
    with CaptureQueriesContext(connection) as q:
        assert c.post("/api/v1/jobs/", job_body(), format="json",
                      HTTP_IDEMPOTENCY_KEY="guard-1").status_code == 201
    budget_reads = [x["sql"] for x in q.captured_queries if "queueing_teambudget" in x["sql"]]
    assert len(budget_reads) == 1 and "accounts_team" in budget_reads[0]
    # The fast path remembers the team row, budget flag included (queueing/api/
    # auth_cache.py: read again once a team, membership or budget changes).
    with CaptureQueriesContext(connection) as q:
        assert c.post("/api/v1/jobs/", job_body(), format="json").status_code == 201
    assert not [x for x in q.captured_queries if "queueing_teambudget" in x["sql"]]
    team = team_for_submitter(user=world.member, slug="vision")
    assert team is not None and team.has_downgrade_budget is False  # type: ignore[attr-defined]
    TeamBudget.objects.create(team=world.vision, monthly_amount=Decimal("10"),
                              policy=BudgetPolicy.DOWNGRADE)
    team = team_for_submitter(user=world.member, slug="vision")
    assert team is not None and team.has_downgrade_budget is True  # type: ignore[attr-defined]
