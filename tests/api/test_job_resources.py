"""Per-replica resources and /dev/shm through the REST API: hostile quantities are a 400
naming the field with nothing stored; the team's defaults fill what a job leaves out; its
maxima refuse what is above them."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.models import Job
from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db

GI = 2**30

HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("negative cpu", {"resources": {"cpu": "-1"}}, "resources.cpu"),
    ("zero cpu", {"resources": {"cpu": "0"}}, "resources.cpu"),
    ("zero cpu in millicores", {"resources": {"cpu": "0.0m"}}, "resources.cpu"),
    ("overflowing cpu", {"resources": {"cpu": "1e999"}}, "resources.cpu"),
    ("cpu past int64", {"resources": {"cpu": "9223372036854775808"}}, "resources.cpu"),
    ("garbage cpu", {"resources": {"cpu": "four"}}, "resources.cpu"),
    ("cpu with a unit of bytes and junk", {"resources": {"cpu": "4Gi; rm -rf /"}},
     "resources.cpu"),
    ("a trailing newline", {"resources": {"cpu": "4\n"}}, None),  # stripped: accepted
    ("negative memory", {"resources": {"memory": "-16Gi"}}, "resources.memory"),
    ("zero memory", {"resources": {"memory": "0Gi"}}, "resources.memory"),
    ("overflowing memory", {"resources": {"memory": "99999999Ei"}}, "resources.memory"),
    ("memory over 32 characters", {"resources": {"memory": "1" * 33}}, "resources.memory"),
    ("memory as a number", {"resources": {"memory": True}}, "resources.memory"),
    ("memory with a bad suffix", {"resources": {"memory": "16GB"}}, "resources.memory"),
    ("a huge exponent", {"resources": {"memory": "1e9999"}}, "resources.memory"),
    ("garbage ephemeral storage", {"resources": {"ephemeral_storage": "lots"}},
     "resources.ephemeral_storage"),
    ("an unknown resource", {"resources": {"nvidia.com/gpu": "8"}}, "resources.nvidia.com/gpu"),
    ("resources not an object", {"resources": "cpu=4"}, "resources.non_field_errors"),
    ("huge shm", {"shm_size": "2Ei"}, "shm_size"),
    ("negative shm", {"shm_size": "-64Gi"}, "shm_size"),
    ("zero shm", {"shm_size": "0"}, "shm_size"),
    ("garbage shm", {"shm_size": "/dev/sda"}, "shm_size"),
]


@pytest.mark.parametrize(("case", "fields", "refused"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_it_refuses_hostile_quantities_naming_the_field_and_storing_nothing(
    world: World, case: str, fields: dict[str, Any], refused: str | None,
) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**fields), format="json")
    if refused is None:
        assert r.status_code == 201, r.json()
        return
    assert r.status_code == 400, (case, r.json())
    errors = r.json()["error"]["fields"]
    assert refused in errors and errors[refused][0], errors
    assert not Job.objects.exists()


@pytest.mark.parametrize(("case", "fields", "refused"),
                         [c for c in HOSTILE if c[2] is not None][:6],
                         ids=[c[0] for c in HOSTILE if c[2] is not None][:6])
def test_bulk_refuses_hostile_quantities_storing_nothing(
    world: World, case: str, fields: dict[str, Any], refused: str,
) -> None:
    r = world.client(world.member).post("/api/v1/jobs/bulk/",
                                        {**job_body(**fields), "count": 3}, format="json")
    assert r.status_code == 400, r.json()
    assert refused in r.json()["error"]["fields"]
    assert not Job.objects.exists()


def test_it_names_a_bad_quantity_together_with_another_bad_field(world: World) -> None:
    body = job_body(gpus=0, resources={"cpu": "-4"})
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 400
    assert {"gpus", "resources.cpu"} <= set(r.json()["error"]["fields"])


def test_it_stores_the_quantities_as_written_and_normalised(world: World) -> None:
    body = job_body(resources={"cpu": "1500m", "memory": "16Gi", "ephemeral_storage": "100G"},
                    shm_size="8Gi")
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["resources"] == {"cpu": "1500m", "memory": "16Gi",
                                     "ephemeral_storage": "100G"}
    assert r.json()["shm_size"] == "8Gi"
    job = Job.objects.get()
    assert job.cpu_millicores == 1500 and job.memory_bytes == 16 * GI
    assert job.ephemeral_storage_bytes == 100 * 10**9 and job.shm_size_bytes == 8 * GI
    detail = world.client(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["resources"]["memory"] == "16Gi" and detail["shm_size"] == "8Gi"


def test_a_job_without_resources_has_only_the_platform_memory(world: World) -> None:
    """Every pod has a memory limit (FAIRQ_DEFAULT_MEMORY_PER_GPU, 32Gi, per GPU: the
    body asks 2); nothing else is filled in (docs/kubernetes.md)."""
    r = world.client(world.member).post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201
    assert r.json()["resources"] == {"memory": "64Gi"} and r.json()["shm_size"] == ""
    job = Job.objects.get()
    assert job.cpu_millicores is None and job.shm_size_bytes is None
    assert job.memory_bytes == 64 * GI


def test_the_teams_defaults_fill_what_the_job_leaves_out(world: World) -> None:
    team = world.vision
    team.default_cpu_millicores, team.default_memory_bytes = 8000, 64 * GI
    team.default_shm_size_bytes = 16 * GI
    team.save()
    body = job_body(resources={"memory": "32Gi"})
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["resources"] == {"cpu": "8", "memory": "32Gi"}
    assert r.json()["shm_size"] == "16Gi"
    job = Job.objects.get()
    assert (job.cpu_millicores, job.memory_bytes, job.shm_size_bytes) == (8000, 32 * GI, 16 * GI)
    assert job.ephemeral_storage_bytes is None


def test_bulk_jobs_carry_the_resources(world: World) -> None:
    body = {**job_body(resources={"cpu": "2"}, shm_size="1Gi"), "count": 3}
    r = world.client(world.member).post("/api/v1/jobs/bulk/", body, format="json")
    assert r.status_code == 201, r.json()
    assert {(j.cpu_millicores, j.shm_size_bytes, j.resources["cpu"])
            for j in Job.objects.all()} == {(2000, GI, "2")}


@pytest.mark.parametrize(("column", "limit", "fields", "refused"), [
    ("max_cpu_millicores", 16000, {"resources": {"cpu": "16.001"}}, "resources.cpu"),
    ("max_memory_bytes", 64 * GI, {"resources": {"memory": "65Gi"}}, "resources.memory"),
    ("max_ephemeral_storage_bytes", 10 * GI, {"resources": {"ephemeral_storage": "11Gi"}},
     "resources.ephemeral_storage"),
    ("max_shm_size_bytes", 8 * GI, {"shm_size": "9Gi"}, "shm_size"),
])
def test_it_refuses_a_quantity_above_the_teams_maximum(
    world: World, column: str, limit: int, fields: dict[str, Any], refused: str,
) -> None:
    setattr(world.vision, column, limit)
    world.vision.save()
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**fields), format="json")
    assert r.status_code == 400, r.json()
    assert "maximum" in r.json()["error"]["fields"][refused][0]
    assert not Job.objects.exists()


def test_a_quantity_at_the_teams_maximum_is_accepted(world: World) -> None:
    world.vision.max_cpu_millicores = 16000
    world.vision.save()
    r = world.client(world.member).post(
        "/api/v1/jobs/", job_body(resources={"cpu": "16000m"}), format="json")
    assert r.status_code == 201, r.json()
