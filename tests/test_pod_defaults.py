"""Safe pod defaults (docs/kubernetes.md, "Memory, /dev/shm and CPU"; docs/scheduling.md
rule R10): every pod has a memory limit, /dev/shm stays within it, and a preemptible
tier's termination grace is capped, at submit and in the rendered pod; `check --deploy`
warns while images may come from any registry."""

from __future__ import annotations

from typing import Any

import pytest
from django.core import checks
from django.test import override_settings

from queueing.backends.k8s_manifest import job_manifest
from queueing.models import Job
from queueing.services.scheduler import launch_spec
from tests.conftest import World, job_body
from tests.factories import JobFactory
from tests.test_k8s_manifest import OPTS, spec

pytestmark = pytest.mark.django_db

GI = 2**30
TI = 2**40


def pod(manifest: dict[str, Any]) -> dict[str, Any]:
    pod_spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return pod_spec


def limits(manifest: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = pod(manifest)["containers"][0]["resources"]["limits"]
    return out


def rendered(job: Job) -> dict[str, Any]:
    return job_manifest(launch_spec(Job.objects.select_related(
        "team", "tier", "gpu_type").get(pk=job.pk)), OPTS)


# --- memory: a limit on every pod ---------------------------------------------------------

@override_settings(FAIRQ_DEFAULT_MEMORY_PER_GPU="24Gi")
def test_a_job_and_team_without_memory_get_the_platform_default_per_gpu(world: World) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(gpus=2), format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["resources"] == {"memory": "48Gi"}
    job = Job.objects.get()
    assert job.memory_bytes == 48 * GI
    m = rendered(job)
    requests = pod(m)["containers"][0]["resources"]["requests"]
    assert limits(m)["memory"] == requests["memory"] == "48Gi"


def test_the_teams_default_memory_wins_over_the_platforms(world: World) -> None:
    world.vision.default_memory_bytes = 10 * GI
    world.vision.save()
    r = world.client(world.member).post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201, r.json()
    assert Job.objects.get().memory_bytes == 10 * GI


@override_settings(FAIRQ_DEFAULT_MEMORY_PER_GPU="16Gi")
def test_a_job_queued_without_memory_still_renders_a_memory_limit(world: World) -> None:
    """A row from before the default (memory NULL) gets it when it is launched."""
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     gpus_per_replica=4)
    assert job.memory_bytes is None
    assert limits(rendered(job))["memory"] == "64Gi"


def test_no_cpu_limit_unless_the_job_or_its_team_sets_cpu(world: World) -> None:
    """Decided: no platform CPU default (a CPU limit throttles; docs/kubernetes.md)."""
    r = world.client(world.member).post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201, r.json()
    assert "cpu" not in limits(rendered(Job.objects.get()))


# --- /dev/shm within the memory limit -----------------------------------------------------

@pytest.mark.parametrize(("fields", "case"), [
    ({"shm_size": "1000Ti"}, "a thousand TiB against the default memory"),
    ({"shm_size": "64Gi", "resources": {"memory": "16Gi"}}, "above the job's own memory"),
])
def test_shm_above_the_memory_limit_is_refused_naming_shm_size(
        world: World, fields: dict[str, Any], case: str) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**fields), format="json")
    assert r.status_code == 400, (case, r.json())
    errors = r.json()["error"]["fields"]
    assert list(errors) == ["shm_size"], errors
    assert "memory limit" in errors["shm_size"][0]
    assert not Job.objects.exists()


def test_shm_up_to_the_memory_limit_is_accepted(world: World) -> None:
    body = job_body(shm_size="16Gi", resources={"memory": "16Gi"})
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 201, r.json()
    volumes = pod(rendered(Job.objects.get()))["volumes"]
    assert volumes[0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}


def test_the_shm_size_limit_is_never_above_the_memory_limit_in_the_pod() -> None:
    """A spec older than the submit rule (1000Ti of /dev/shm, 16Gi of memory)."""
    m = job_manifest(spec(shm_size_bytes=1000 * TI, memory_bytes=16 * GI), OPTS)
    assert pod(m)["volumes"][0]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert limits(m)["memory"] == "16Gi"


# --- rule R10: termination grace of preemptible tiers -------------------------------------

@override_settings(FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS=300)
def test_a_preemptible_tier_refuses_a_grace_above_the_platform_cap(world: World) -> None:
    assert world.low.preemptible and world.low.max_termination_grace_seconds is None
    body = job_body(tier="low", termination_grace_seconds=86400)
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 400, r.json()
    errors = r.json()["error"]["fields"]
    assert list(errors) == ["termination_grace_seconds"], errors
    assert "At most 300 seconds" in errors["termination_grace_seconds"][0]
    assert not Job.objects.exists()
    body = job_body(tier="low", termination_grace_seconds=300)
    assert world.client(world.member).post("/api/v1/jobs/", body,
                                           format="json").status_code == 201


@override_settings(FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS=300)
def test_a_tier_may_raise_the_cap_with_its_own(world: World) -> None:
    world.low.max_termination_grace_seconds = 3600
    world.low.save()
    body = job_body(tier="low", termination_grace_seconds=3600)
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 201, r.json()
    assert pod(rendered(Job.objects.get()))["terminationGracePeriodSeconds"] == 3600


@override_settings(FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS=300)
def test_a_non_preemptible_tier_has_no_platform_cap(world: World) -> None:
    assert not world.critical.preemptible
    world.critical.open_to_all_teams = True
    world.critical.save()
    body = job_body(tier="critical", termination_grace_seconds=7200)
    r = world.client(world.admin).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 201, r.json()


@override_settings(FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS=300)
def test_a_queued_job_with_a_day_of_grace_renders_at_most_the_cap(world: World) -> None:
    """A row from before rule R10 (a day of grace on `low`): its pod gets the cap."""
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.low,
                     termination_grace_seconds=86400)
    assert pod(rendered(job))["terminationGracePeriodSeconds"] == 300


# --- check --deploy: the registry allow-list ----------------------------------------------

def _deploy_ids() -> set[str]:
    return {m.id for m in checks.run_checks(include_deployment_checks=True) if m.id}


def test_check_deploy_warns_without_a_registry_allowlist() -> None:
    with override_settings(FAIRQ_REGISTRY_ALLOWLIST=[]):
        assert "fairq.W002" in _deploy_ids()
    with override_settings(FAIRQ_REGISTRY_ALLOWLIST=["ghcr.io/acme"]):
        assert "fairq.W002" not in _deploy_ids()
