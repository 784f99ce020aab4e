"""The submit path's plain-SQL reads and writes (queueing/rawsql.py) give exactly what the
ORM gives, on SQLite and on PostgreSQL; the per-process memos forget when told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.forms.models import model_to_dict

from accounts.models import ApiToken, Team
from accounts.selectors import api_token_with_user
from accounts.services import token_issue
from queueing.memo import forget_all
from queueing.models import GpuType, Job, JobEvent
from queueing.selectors.lookups import gpu_types_by_slug, team_for_submitter
from queueing.services.jobs import JobInput, _insert_job_with_event, job_submit_with_event

from .conftest import World
from .factories import GpuTypeFactory

NOW = datetime(2026, 11, 22, 4, 0, 0, 123456, tzinfo=UTC)


def _fields(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_token_lookup_loads_the_token_and_its_user_as_the_orm_does(world: World) -> None:
    issued = token_issue(user=world.member, name="ci", expires_at=NOW + timedelta(days=3))
    ApiToken.objects.filter(pk=issued.token.pk).update(last_used_at=NOW)
    token = api_token_with_user(prefix=issued.token.prefix)
    assert token is not None
    orm = ApiToken.objects.select_related("user").get(pk=issued.token.pk)
    assert _fields(token) == _fields(orm)
    assert _fields(token.user) == _fields(orm.user)
    assert token.expires_at is not None and token.expires_at.tzinfo is not None  # aware
    assert not token._state.adding and token._state.db == "default"
    assert api_token_with_user(prefix="nosuchprefix") is None


def test_team_for_submitter_needs_a_membership_unless_staff(world: World) -> None:
    team = team_for_submitter(user=world.member, slug="vision")
    assert team is not None and _fields(team) == _fields(Team.objects.get(slug="vision"))
    assert team_for_submitter(user=world.outsider, slug="vision") is None
    assert team_for_submitter(user=world.member, slug="nlp") is None
    assert team_for_submitter(user=world.member, slug="no-such-team") is None
    staff_team = team_for_submitter(user=world.staff, slug="nlp")
    assert staff_team is not None and staff_team.pk == world.nlp.pk


def _input(world: World, **over: Any) -> JobInput:
    values: dict[str, Any] = {
        "team": world.vision, "name": "resnet", "image": "ghcr.io/acme/train:1.4",
        "command": ["python", "train.py"], "args": ["--lr", "0.1"],
        "env": {"SEED": "7", "Ü": "ü"}, "gpu_type": world.h100, "gpus_per_replica": 2,
        "replicas": 3, "tier": world.high, "max_runtime_seconds": None}
    values.update(over)
    return JobInput(**values)


def test_a_submitted_job_and_its_event_are_the_rows_the_orm_writes(world: World) -> None:
    job, event, created = job_submit_with_event(actor=world.member, data=_input(world),
                                                idempotency_key="k-1", now=NOW)
    assert created and event is not None
    assert job.pk is not None and event.pk is not None and event.job_id == job.pk
    stored = Job.objects.get(pk=job.pk)
    # The same job through the ORM, for comparison, then compared field by field.
    d = _input(world)
    orm = Job.objects.create(
        team=d.team, submitter=world.member, name=d.name, image=d.image, command=d.command,
        args=d.args, env=d.env, gpu_type=d.gpu_type, gpus_per_replica=d.gpus_per_replica,
        replicas=d.replicas, tier=d.tier, max_runtime_seconds=d.max_runtime_seconds,
        status="QUEUED", idempotency_key="k-2", created_at=NOW, updated_at=NOW)
    orm.refresh_from_db()
    mine, theirs = model_to_dict(stored), model_to_dict(orm)
    for differs in ("id", "idempotency_key"):
        mine.pop(differs), theirs.pop(differs)
    assert mine == theirs
    assert stored.created_at == NOW and stored.env == {"SEED": "7", "Ü": "ü"}
    assert stored.updated_at >= NOW  # auto_now, as through save()
    # What the API answers from is what was stored.
    assert _fields(job) | {"updated_at": None} == _fields(stored) | {"updated_at": None}
    stored_event = JobEvent.objects.get(job=job)
    assert _fields(stored_event) == _fields(event)
    assert (stored_event.to_status, stored_event.reason, stored_event.actor_id,
            stored_event.actor_label, stored_event.attempt, stored_event.data) == (
        "QUEUED", "submitted", world.member.pk, str(world.member), 1, {})


def test_a_key_taken_meanwhile_rolls_back_only_this_insert(world: World) -> None:
    """Inside a caller's transaction a failed INSERT (the idempotency key was taken by a
    concurrent submit) must not break that transaction (PostgreSQL aborts it unless the
    INSERT ran in a savepoint), and must leave no event behind."""
    first, _, _ = job_submit_with_event(actor=world.member, data=_input(world),
                                        idempotency_key="dup", now=NOW)
    job = Job(team=world.vision, submitter=world.member, name="again", image="x:1",
              gpu_type=world.h100, gpus_per_replica=1, tier=world.normal,
              idempotency_key="dup", created_at=NOW, updated_at=NOW)
    event = JobEvent(at=NOW, kind=JobEvent.Kind.TRANSITION, to_status="QUEUED", reason="submitted")
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            _insert_job_with_event(job, event)
        assert Job.objects.filter(idempotency_key="dup").count() == 1  # still usable
    assert JobEvent.objects.filter(job=first).count() == 1
    assert JobEvent.objects.count() == 1
    # And through the service: the first job comes back, nothing is written.
    again, ev, created = job_submit_with_event(actor=world.member, data=_input(world),
                                               idempotency_key="dup", now=NOW)
    assert (again.pk, ev, created) == (first.pk, None, False)


def test_reference_memos_hold_within_their_ttl_and_forget_when_told(
        world: World, django_assert_num_queries: Any) -> None:
    assert "b200" not in gpu_types_by_slug()
    GpuTypeFactory(slug="b200")
    with django_assert_num_queries(0):
        assert "b200" not in gpu_types_by_slug()  # memoized: no query, old answer
    forget_all()
    assert isinstance(gpu_types_by_slug()["b200"], GpuType)


@pytest.mark.parametrize("staff", [False, True])
def test_token_lookup_reads_one_row_in_one_query(
        world: World, staff: bool, django_assert_num_queries: Any) -> None:
    user = world.staff if staff else world.member
    prefix = token_issue(user=user).token.prefix
    with django_assert_num_queries(1):
        token = api_token_with_user(prefix=prefix)
    assert token is not None and token.user == get_user_model().objects.get(pk=user.pk)


def _same_values(a: list[Any], b: list[Any]) -> bool:
    """Equal and of the same types (psycopg's Int4 is not a plain int), JSON compared by
    what it wraps."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if type(x) is not type(y):
            return False
        x, y = getattr(x, "obj", x), getattr(y, "obj", y)  # Jsonb wraps its value
        if x != y:
            return False
    return True


@pytest.mark.parametrize("overrides", [
    {}, {"working_dir": "/w", "notify_url": "https://x/y", "max_runtime_seconds": None},
    {"env": {}, "args": [], "labels": {"a": "b"}, "requested_cluster": None},
    {"name": "ü-名前", "privileged": False, "allow_spot": True},
])
def test_insert_values_are_the_fields_own_conversion(
        world: World, overrides: Any, monkeypatch: Any) -> None:
    """`insert_params` takes the plain strings, booleans and NULLs as they are: exactly what
    each field's `pre_save` + `get_db_prep_save` gives, types included."""
    from django.db import connection
    from django.utils import timezone

    from queueing.rawsql import _insert_plan, insert_columns, insert_params

    monkeypatch.setattr(timezone, "now", lambda: NOW)  # auto_now: the same in both

    values = {"team": world.vision, "submitter": world.member, "name": "n", "image": "x:1",
              "gpu_type": world.h100, "gpus_per_replica": 2, "tier": world.normal,
              "command": ["python"], "env": {"A": "1"}, "created_at": NOW, "updated_at": NOW,
              "max_runtime_seconds": 3600}
    values.update({k: v for k, v in overrides.items() if hasattr(Job, k)})
    job = Job(**values)
    event = JobEvent(at=NOW, kind=JobEvent.Kind.TRANSITION, to_status="QUEUED",
                     reason="submitted", actor=world.member, actor_label="m", attempt=1)
    event.job_id = 1
    for obj in (job, event):
        # The reference: every value through its field's own conversion, as Model.save().
        _, fields = insert_columns(type(obj))
        converted = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
        assert _same_values(insert_params(obj), converted), obj
    taken = sum(1 for _, _, kind in _insert_plan(Job) if kind is not None)
    assert taken >= 15  # the fast conversion is used, not only the fallback
