"""The flush after tests that commit (tests/quick_flush.py): over random worlds the quick
flush leaves every table as Django's flush does, it is the one that ran, and a test
that changed the content types or permissions gets Django's flush."""

from __future__ import annotations

import random
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import TransactionTestCase

from accounts.models import Role
from accounts.services import token_issue

from . import quick_flush
from .factories import (
    GpuTypeFactory,
    JobFactory,
    MembershipFactory,
    QuotaFactory,
    TeamFactory,
    TierFactory,
    UserFactory,
)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _state() -> dict[str, list[Any]]:
    """Every model table's rows: content types and permissions by natural key (a full
    flush gives them new ids), the other tables by their rows' count."""
    tables = connection.introspection.django_table_names(only_existing=True,
                                                         include_views=False)
    state: dict[str, list[Any]] = {}
    with connection.cursor() as cursor:
        for table in tables:
            if table == "django_content_type":
                cursor.execute("SELECT app_label, model FROM django_content_type")
            elif table == "auth_permission":
                cursor.execute("SELECT p.codename, p.name, t.app_label, t.model"
                               " FROM auth_permission p"
                               " JOIN django_content_type t ON t.id = p.content_type_id")
            else:
                cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
            state[table] = sorted(cursor.fetchall())
    return state


def _world(seed: int) -> None:
    """Teams, users, memberships, tokens, GPU types, tiers, quotas, jobs and a group
    holding permissions, in counts drawn from `seed`; some worlds add a permission or a
    content type of their own (which a quick flush must not keep)."""
    rnd = random.Random(seed)
    types = [GpuTypeFactory(slug=f"gpu-{i}") for i in range(rnd.randint(1, 3))]
    tiers = [TierFactory(slug=f"tier-{i}", rank=10 * i) for i in range(rnd.randint(1, 3))]
    teams = [TeamFactory() for _ in range(rnd.randint(0, 4))]
    for team in teams:
        for gpu_type in types:
            if rnd.random() < 0.6:
                QuotaFactory(team=team, gpu_type=gpu_type, nominal=rnd.randint(0, 8))
        for _ in range(rnd.randint(0, 3)):
            user = UserFactory()
            MembershipFactory(user=user, team=team, role=rnd.choice(list(Role)))
            if rnd.random() < 0.5:
                token_issue(user=user)
        for _ in range(rnd.randint(0, 6)):
            JobFactory(team=team, gpu_type=rnd.choice(types), tier=rnd.choice(tiers))
    if rnd.random() < 0.5:
        group = Group.objects.create(name=f"g{seed}")
        group.permissions.set(Permission.objects.order_by("?")[:rnd.randint(1, 5)])
    if rnd.random() < 0.25:
        kind = ContentType.objects.create(app_label="zz", model=f"m{seed}")
        if rnd.random() < 0.5:
            Permission.objects.create(codename=f"p{seed}", name="p", content_type=kind)
    if rnd.random() < 0.25:
        Permission.objects.filter(pk=Permission.objects.order_by("?")[0].pk).delete()


def test_the_teardown_of_tests_that_commit_is_the_quick_one() -> None:
    assert TransactionTestCase._fixture_teardown is quick_flush.fixture_teardown


@pytest.mark.parametrize("seed", range(12))
def test_it_leaves_every_table_as_djangos_flush_does(seed: int) -> None:
    quick_flush.django_flush("default")
    fresh = _state()
    kept = _state()["auth_permission"]

    _world(seed)
    changed = _state()["auth_permission"] != kept or _state()["django_content_type"] != \
        fresh["django_content_type"]
    before = dict(quick_flush.counts)
    quick = quick_flush.quick_flush("default")
    if not quick:
        quick_flush.django_flush("default")
    after_quick = _state()

    _world(seed)
    quick_flush.django_flush("default")
    after_django = _state()

    assert after_quick == after_django == fresh
    # The quick flush ran, unless the world changed what post_migrate writes.
    assert quick is not changed
    assert quick_flush.counts["quick"] == before["quick"] + quick


def test_it_takes_djangos_flush_after_a_change_to_the_permissions() -> None:
    quick_flush.django_flush("default")
    fresh = _state()
    Permission.objects.filter(pk=Permission.objects.order_by("pk")[0].pk).delete()
    assert quick_flush.quick_flush("default") is False
    quick_flush.django_flush("default")
    assert _state() == fresh
    UserFactory()
    assert quick_flush.quick_flush("default") is True
    assert _state() == fresh
