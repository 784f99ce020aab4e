"""Pods locked down. The pod's security context (capabilities dropped,
RuntimeDefault seccomp, no privilege escalation, runAsNonRoot per team), Pod Security
Admission labels on fairq's namespaces, reserved env names, names matched in full and
ASCII-only images, refused at submit (400) and again by the manifest (ManifestError).

The manifests' acceptance by a real API server is tests/envtest/test_pod_security_dry_run.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from queueing import validation as v
from queueing.backends.base import parse_workload_name
from queueing.backends.k8s_manifest import (
    ManifestError,
    ManifestOptions,
    job_manifest,
    namespace_for,
    namespace_manifest,
)

from .conftest import job_body
from .test_k8s_manifest import spec

OPTS = ManifestOptions(namespace="fairq-vision")
PSA = "pod-security.kubernetes.io"

RESERVED = ["NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUDA_VISIBLE_DEVICES",
            "LD_PRELOAD", "LD_LIBRARY_PATH", "KUBERNETES_SERVICE_HOST", "FAIRQ_TOKEN",
            "FAIRQ_ARRAY_INDEX", "MASTER_ADDR", "NODE_RANK", "FAIRQ_ATTEMPT",
            "FAIRQ_STOP_SIGNAL", "FAIRQ_CHECKPOINT_TOKEN"]
NON_ASCII_IMAGES = ["ghcr.io/acme/train:1\u0663",  # ARABIC-INDIC DIGIT THREE: \w matches it
                    "ghcr.io/acme/train:\u00e9t\u00e9", "ghcr.io/acme/train:v\u00b2"]


def container(m: dict[str, Any]) -> dict[str, Any]:
    [c] = m["spec"]["template"]["spec"]["containers"]
    return c


# --- the security context -------------------------------------------------------------------

def test_the_container_drops_every_capability_and_uses_the_runtime_default_seccomp() -> None:
    sc = container(job_manifest(spec(run_as_non_root=False), OPTS))["securityContext"]
    assert sc == {"privileged": False, "allowPrivilegeEscalation": False,
                  "capabilities": {"drop": ["ALL"]},
                  "seccompProfile": {"type": "RuntimeDefault"}}


def test_a_team_that_runs_non_root_gets_run_as_non_root() -> None:
    sc = container(job_manifest(spec(run_as_non_root=True), OPTS))["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert "runAsUser" not in sc  # the image's user, which must not be root


def test_a_launch_spec_runs_non_root_unless_told_otherwise() -> None:
    assert spec().run_as_non_root is True


def test_namespaces_carry_pod_security_admission_labels_by_the_teams_setting() -> None:
    strict = namespace_manifest("fairq-vision", "vision", run_as_non_root=True)
    labels = strict["metadata"]["labels"]
    assert labels[f"{PSA}/enforce"] == "restricted"
    assert labels[f"{PSA}/enforce-version"].startswith("v1.")
    assert labels["app.kubernetes.io/managed-by"] == "fairq"
    assert labels["fairq.io/team"] == "vision"
    root = namespace_manifest("fairq-vision", "vision", run_as_non_root=False)
    assert root["metadata"]["labels"][f"{PSA}/enforce"] == "baseline"
    assert root["metadata"]["labels"][f"{PSA}/enforce-version"] == \
        labels[f"{PSA}/enforce-version"]


@pytest.mark.django_db
def test_the_teams_setting_reaches_the_launch_spec(world: Any) -> None:
    from accounts.models import Team
    from queueing.services.scheduler import launch_spec
    from tests.factories import JobFactory

    assert Team(slug="new", name="New").run_as_non_root is True  # the default of a new team
    world.vision.run_as_non_root = False
    world.vision.save()
    job = JobFactory(team=world.vision, tier=world.normal, gpu_type=world.h100)
    assert launch_spec(job).run_as_non_root is False
    world.vision.run_as_non_root = True
    world.vision.save()
    job.refresh_from_db()
    assert launch_spec(job).run_as_non_root is True


# --- reserved env names ---------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in RESERVED if n != "FAIRQ_ARRAY_INDEX"])
def test_the_manifest_refuses_reserved_env_names(name: str) -> None:
    with pytest.raises(ManifestError, match="reserved"):
        job_manifest(spec(env={name: "x"}), OPTS)


def test_the_manifest_takes_the_documented_fairq_names_and_the_array_index() -> None:
    env = {"FAIRQ_SIM_SECONDS": "5", "FAIRQ_SIM_EXIT_CODE": "0",
           "FAIRQ_ARRAY_INDEX": "3", "FAIRQ_ARRAY_SIZE": "10", "NVIDIA": "x", "LD_PATH": "x"}
    m = job_manifest(spec(env=env, run_as_non_root=True), OPTS)
    assert {e["name"] for e in container(m)["env"]} == set(env) | {
        "FAIRQ_JOB_ID", "FAIRQ_ATTEMPT", "FAIRQ_STOP_SIGNAL"}


@pytest.mark.django_db
@pytest.mark.parametrize("name", RESERVED)
def test_the_api_refuses_reserved_env_names(world: Any, name: str) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(env={name: "1"}),
                                        format="json")
    assert r.status_code == 400, r.content
    assert name in " ".join(r.json()["error"]["fields"]["env"])


@pytest.mark.django_db
def test_the_api_takes_the_documented_fairq_names(world: Any) -> None:
    env = {"FAIRQ_SIM_SECONDS": "5", "FAIRQ_SIM_EXIT_CODE": "0", "NVIDIA": "x"}
    r = world.client(world.member).post("/api/v1/jobs/", job_body(env=env), format="json")
    assert r.status_code == 201, r.content


# --- names matched in full, images ASCII only -----------------------------------------------

@pytest.mark.parametrize("name", ["A\n", "SEED\n", "A\nB"])
def test_env_names_are_matched_in_full(name: str) -> None:
    assert not v.ENV_NAME_RE.match(name)
    with pytest.raises(ManifestError):
        job_manifest(spec(env={name: "1"}), OPTS)


# (The API trims whitespace around `name` and `image`, so "resnet\n" arrives as "resnet";
# env names are not trimmed.)
@pytest.mark.django_db
@pytest.mark.parametrize(("field", "value"), [
    ("env", {"A\n": "1"}), ("env", {"SEED\n": "1"}),
    *[("image", image) for image in NON_ASCII_IMAGES],
])
def test_the_api_refuses_trailing_newlines_and_non_ascii_images(
        world: Any, field: str, value: Any) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**{field: value}),
                                        format="json")
    assert r.status_code == 400, r.content
    assert field in r.json()["error"]["fields"]


@pytest.mark.parametrize("image", [*NON_ASCII_IMAGES, "ghcr.io/acme/train:1.4\n", "ghcr.io/UPPER/x",
                                   "ghcr.io/acme/train:1.4 --privileged"])
def test_the_manifest_refuses_images_that_are_not_references(image: str) -> None:
    with pytest.raises(ManifestError, match="image"):
        job_manifest(spec(image=image), OPTS)


def test_every_pattern_is_anchored_at_the_very_end() -> None:
    assert not v.JOB_NAME_RE.match("resnet\n")
    assert not v.IMAGE_RE.match("ubuntu\n")
    assert parse_workload_name("fq-1-2\n") is None
    with pytest.raises(ManifestError):
        namespace_for("vision\n", "fairq-")


@pytest.mark.django_db
def test_slugs_are_matched_in_full() -> None:
    from django.core.exceptions import ValidationError

    from accounts.models import Team

    with pytest.raises(ValidationError) as err:
        Team(slug="red\n", name="Red").full_clean()
    assert "slug" in err.value.message_dict


def test_the_valid_images_still_pass() -> None:
    for image in ["ubuntu", "ubuntu:22.04", "ghcr.io/acme/train:1.4", "localhost:5000/x/y:A_b-1.2",
                  "registry.example.com:5000/team/x@sha256:" + "a" * 64]:
        assert v.IMAGE_RE.match(image), image
        job_manifest(spec(image=image), OPTS)
    assert json.dumps(job_manifest(spec(), OPTS)).isascii()


@pytest.mark.django_db
def test_staff_set_run_as_non_root_through_the_team_api_audited(world: Any) -> None:
    from accounts.models import AuditEntry

    c = world.client(world.staff)
    r = c.patch("/api/v1/teams/vision/", {"run_as_non_root": False}, format="json")
    assert r.status_code == 200 and r.json()["run_as_non_root"] is False
    audit = AuditEntry.objects.filter(object_type="accounts.Team", action="update").latest("id")
    assert audit.changes == {"run_as_non_root": [True, False]}
    r = c.post("/api/v1/teams/", {"slug": "rooty", "name": "R", "run_as_non_root": False},
               format="json")
    assert r.status_code == 201 and r.json()["run_as_non_root"] is False
    r = c.post("/api/v1/teams/", {"slug": "safe", "name": "S"}, format="json")
    assert r.json()["run_as_non_root"] is True
    m = world.client(world.member)
    assert m.get("/api/v1/teams/vision/").json()["run_as_non_root"] is False
    assert m.patch("/api/v1/teams/vision/", {"run_as_non_root": True},
                   format="json").status_code == 403
