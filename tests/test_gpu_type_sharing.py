"""A GPU type's sharing and slices per GPU, as staff set them (docs/api.md, "Fractions of
a GPU"): exclusive has 1, mig / time-sliced / mps 2 to 64; they do not change while jobs
of the type are queued, admitted or running; every change is audited. The same rules in
the API (`PATCH /api/v1/gpu-types/{slug}/`) and the Django admin."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from accounts.models import AuditEntry
from queueing.models import GpuType
from queueing.policy.states import JobState
from tests.conftest import World
from tests.factories import JobFactory, UserFactory


def _patch(world: World, slug: str, user: Any = None, **body: Any) -> Any:
    return world.client(user or world.staff).patch(
        f"/api/v1/gpu-types/{slug}/", data=json.dumps(body), content_type="application/json")


def test_staff_make_a_type_time_sliced_with_four_slices_audited(world: World) -> None:
    r = _patch(world, "a100", sharing="time-sliced", slices_per_gpu=4)
    assert r.status_code == 200, r.content
    assert r.json()["sharing"] == "time-sliced" and r.json()["slices_per_gpu"] == 4
    row = GpuType.objects.get(slug="a100")
    assert (row.sharing, row.slices_per_gpu, row.units_per_device) == ("time-sliced", 4, 4)
    entry = AuditEntry.objects.filter(object_type="queueing.GpuType").latest("id")
    assert entry.changes["sharing"] == ["exclusive", "time-sliced"]
    listed = world.client(world.member).get("/api/v1/gpu-types/").json()
    assert {"slug": "a100", "sharing": "time-sliced", "slices_per_gpu": 4}.items() <= next(
        g for g in listed if g["slug"] == "a100").items()


@pytest.mark.parametrize(("body", "field", "text"), [
    ({"slices_per_gpu": 4}, "slices_per_gpu", "An exclusive type has 1 slice per GPU"),
    ({"sharing": "mps"}, "slices_per_gpu", "A mps type has 2 to 64 slices per GPU"),
    ({"sharing": "mig", "slices_per_gpu": 1}, "slices_per_gpu", "instances of this MIG"),
    ({"sharing": "shared"}, "sharing", "is not a valid choice"),
    ({"slices_per_gpu": 65}, "slices_per_gpu", "less than or equal to 64"),
])
def test_sharing_and_slices_are_refused_together_with_a_field_message(
        world: World, body: dict[str, Any], field: str, text: str) -> None:
    r = _patch(world, "a100", **body)
    assert r.status_code == 400, r.content
    assert text in r.json()["error"]["fields"][field][0]
    assert GpuType.objects.get(slug="a100").sharing == "exclusive"


def test_a_type_with_jobs_running_keeps_its_sharing(world: World) -> None:
    JobFactory(team=world.vision, gpu_type=world.a100, tier=world.normal,
               status=JobState.RUNNING)
    r = _patch(world, "a100", sharing="time-sliced", slices_per_gpu=4)
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["sharing"] == [
        "1 job of a100 is queued, admitted or running: sharing and slices per GPU change "
        "only when none is (their slices are counted in them). Drain the type first, or "
        "add a new type."]


def test_members_may_not_change_a_type(world: World) -> None:
    assert _patch(world, "a100", world.member, sharing="time-sliced",
                  slices_per_gpu=4).status_code == 403
    assert _patch(world, "nope", sharing="mps", slices_per_gpu=2).status_code == 404


def _admin_post(world: World, gpu_type: GpuType, **changes: Any) -> Any:
    su = UserFactory(username="su", is_staff=True, is_superuser=True)
    c = Client()
    c.force_login(su)
    body = {"slug": gpu_type.slug, "name": gpu_type.name, "resource_name": gpu_type.resource_name,
            "node_labels": json.dumps(gpu_type.node_labels or {}),
            "billing_weight": str(gpu_type.billing_weight),
            "topology_levels": json.dumps(gpu_type.topology_levels or []),
            "sharing": gpu_type.sharing, "slices_per_gpu": str(gpu_type.slices_per_gpu)}
    body.update(changes)
    return c.post(f"/admin/queueing/gputype/{gpu_type.pk}/change/", body)


def test_the_admin_form_says_no_memory_isolation_and_checks_the_slices(world: World) -> None:
    r = _admin_post(world, world.a100, sharing="time-sliced", slices_per_gpu="1")
    assert r.status_code == 200  # the form again
    page = r.content.decode()
    assert "A time-sliced type has 2 to 64 slices per GPU" in page
    assert "NO memory isolation" in page
    r = _admin_post(world, world.a100, sharing="time-sliced", slices_per_gpu="4")
    assert r.status_code == 302
    assert GpuType.objects.get(slug="a100").slices_per_gpu == 4


def test_the_admin_refuses_a_change_under_queued_jobs(world: World) -> None:
    JobFactory(team=world.vision, gpu_type=world.a100, tier=world.normal)
    r = _admin_post(world, world.a100, sharing="mps", slices_per_gpu="2")
    assert r.status_code == 200
    assert "1 job of a100 is queued, admitted or running" in r.content.decode()
