"""Rule Q1 in one place: a lending limit is at most the nominal (docs/scheduling.md).

The database holds it (a check constraint), `Quota.clean()` names the field, and every
writer (API, quota board, admin) answers with the model's message."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from accounts.models import AuditEntry
from queueing.models import Quota
from tests.conftest import World
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

MESSAGE = "Cannot lend more than the nominal {}."


def _quota(world: World) -> Quota:
    return Quota.objects.get(team=world.vision, gpu_type=world.h100)  # nominal 8


def _login(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


# --- the schema -----------------------------------------------------------------------


def test_the_database_refuses_a_lending_limit_above_nominal_on_an_orm_save(world: World) -> None:
    quota = _quota(world)
    quota.lending_limit = 9  # save() does not run clean(): only the constraint stops it
    with pytest.raises(IntegrityError), transaction.atomic():
        quota.save()
    with pytest.raises(IntegrityError), transaction.atomic():
        Quota.objects.create(team=world.vision, gpu_type=world.mig, nominal=1, lending_limit=2)


def test_the_database_refuses_a_raw_update_that_lowers_nominal_below_lending(
    world: World,
) -> None:
    Quota.objects.filter(pk=_quota(world).pk).update(lending_limit=8)  # = nominal: allowed
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"UPDATE {Quota._meta.db_table} SET nominal = 2 WHERE id = %s",
                    [_quota(world).pk])
    assert _quota(world).nominal == 8


@pytest.mark.parametrize(("nominal", "lending"), [(4, None), (4, 0), (4, 4), (0, 0)])
def test_model_clean_accepts_lending_up_to_nominal(world: World, nominal: int,
                                                    lending: int | None) -> None:
    Quota(team=world.vision, gpu_type=world.mig, nominal=nominal,
          lending_limit=lending).full_clean()


def test_model_clean_puts_the_error_on_lending_limit(world: World) -> None:
    with pytest.raises(ValidationError) as exc:
        Quota(team=world.vision, gpu_type=world.mig, nominal=4, lending_limit=5).full_clean()
    assert exc.value.message_dict == {"lending_limit": [MESSAGE.format(4)]}


# --- the API ---------------------------------------------------------------------------


def test_the_api_refuses_to_create_a_quota_lending_more_than_nominal(world: World) -> None:
    r = world.client(world.staff).post(
        "/api/v1/quotas/", {"team": "vision", "gpu_type": "mig-1g-10gb", "nominal": 2,
                            "lending_limit": 3}, format="json")
    assert r.status_code == 400, r.content
    assert r.json()["error"]["code"] == "invalid"
    assert r.json()["error"]["fields"] == {"lending_limit": [MESSAGE.format(2)]}
    assert not Quota.objects.filter(team=world.vision, gpu_type=world.mig).exists()
    assert not AuditEntry.objects.filter(object_type="queueing.Quota").exists()


@pytest.mark.parametrize("body", [
    {"lending_limit": 9},  # above the stored nominal 8
    {"nominal": 3, "lending_limit": 4},
    {"nominal": 1},  # the stored lending limit 2 would pass the new nominal
])
def test_the_api_refuses_an_update_lending_more_than_nominal(world: World,
                                                             body: dict[str, int]) -> None:
    quota = _quota(world)
    Quota.objects.filter(pk=quota.pk).update(lending_limit=2)
    r = world.client(world.staff).patch(f"/api/v1/quotas/{quota.pk}/", body, format="json")
    assert r.status_code == 400, r.content
    nominal = body.get("nominal", 8)
    assert r.json()["error"]["fields"] == {"lending_limit": [MESSAGE.format(nominal)]}
    quota.refresh_from_db()
    assert (quota.nominal, quota.lending_limit) == (8, 2)
    assert not AuditEntry.objects.filter(object_type="queueing.Quota").exists()


def test_the_api_accepts_lending_all_of_the_nominal(world: World) -> None:
    quota = _quota(world)
    r = world.client(world.staff).patch(f"/api/v1/quotas/{quota.pk}/", {"lending_limit": 8},
                                        format="json")
    assert r.status_code == 200, r.content
    assert r.json()["lending_limit"] == 8


# --- the quota board and the admin ------------------------------------------------------


@pytest.mark.parametrize("htmx", [True, False])
def test_the_quota_board_shows_the_model_message(world: World, htmx: bool) -> None:
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    r = _login(world.staff).post("/quotas/vision/h100/", {"nominal": "3", "lending_limit": "5"},
                                 **extra)
    assert MESSAGE.format(3) in r.content.decode()
    assert _quota(world).nominal == 8
    assert not AuditEntry.objects.filter(object_type="queueing.Quota").exists()


def test_the_admin_refuses_lending_more_than_nominal(world: World) -> None:
    quota = _quota(world)
    su = UserFactory(username="su", is_staff=True, is_superuser=True)
    r = _login(su).post(f"/admin/queueing/quota/{quota.pk}/change/", {
        "team": world.vision.pk, "gpu_type": world.h100.pk, "nominal": "4",
        "borrowing_limit": "", "lending_limit": "6",
    })
    assert r.status_code == 200  # the form again, with the error
    assert MESSAGE.format(4) in r.content.decode()
    quota.refresh_from_db()
    assert (quota.nominal, quota.lending_limit) == (8, None)


# --- the migration ---------------------------------------------------------------------

BEFORE = [("queueing", "0002_fairshare_snapshot")]


@pytest.mark.django_db(transaction=True)
def test_the_migration_clamps_existing_lending_limits_to_nominal_and_audits_it() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        apps = executor.loader.project_state(BEFORE).apps
        team = apps.get_model("accounts", "Team").objects.create(slug="old", name="Old")
        gpu = apps.get_model("queueing", "GpuType").objects.create(
            slug="h100", name="H100", resource_name="nvidia.com/gpu")
        gpu2 = apps.get_model("queueing", "GpuType").objects.create(
            slug="a100", name="A100", resource_name="nvidia.com/gpu")
        old_quota = apps.get_model("queueing", "Quota")
        over = old_quota.objects.create(team=team, gpu_type=gpu, nominal=4, lending_limit=10)
        fine = old_quota.objects.create(team=team, gpu_type=gpu2, nominal=4, lending_limit=3)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert Quota.objects.get(pk=over.pk).lending_limit == 4
    assert Quota.objects.get(pk=fine.pk).lending_limit == 3
    entry = AuditEntry.objects.get(object_type="queueing.Quota")
    assert (entry.object_id, entry.actor, entry.action) == (str(over.pk), None, "update")
    assert entry.changes == {"lending_limit": [10, 4]}
