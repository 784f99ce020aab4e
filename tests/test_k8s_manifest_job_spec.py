"""The Job manifest carries a job's volumes, secret references, pull secret, working
directory, labels, annotations and grace period, and re-checks them: a spec
that slipped past the API (a hostPath, another namespace, a mount over the service
account token) never becomes a pod."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.backends.k8s_manifest import (
    L_JOB_ID,
    ManifestError,
    adoption_verdict,
    job_manifest,
    job_manifests,
    sign_job,
)
from queueing.models import Job
from queueing.services.scheduler import launch_spec
from tests.conftest import World
from tests.factories import JobFactory
from tests.test_k8s_manifest import OPTS, spec
from tests.test_k8s_manifest_resources import RESTRICTED_VOLUME_TYPES

GI = 2**30
VOLUMES = (
    {"name": "data", "pvc": "imagenet", "mount_path": "/data", "read_only": True},
    {"name": "ckpt", "pvc": "ckpt-llm", "mount_path": "/ckpt", "read_only": False},
    {"name": "scratch", "empty_dir": {"size_limit": "100Gi"}, "mount_path": "/scratch"},
)
SECRETS = (
    {"secret": "hf-token", "key": "token", "env": "HF_TOKEN"},
    {"secret": "wandb", "mount_path": "/etc/wandb"},
)


def pod(manifest: dict[str, Any]) -> dict[str, Any]:
    pod_spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return pod_spec


def test_pvcs_and_scratch_become_volumes_and_mounts_in_order() -> None:
    m = job_manifest(spec(volumes=VOLUMES, shm_size_bytes=GI), OPTS)
    assert pod(m)["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet", "readOnly": True}},
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt-llm", "readOnly": False}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "100Gi"}},
    ]
    assert pod(m)["containers"][0]["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "data", "mountPath": "/data", "readOnly": True},
        {"name": "ckpt", "mountPath": "/ckpt", "readOnly": False},
        {"name": "scratch", "mountPath": "/scratch"},
    ]


def test_a_secret_env_var_is_a_secret_key_ref_among_the_sorted_env() -> None:
    m = job_manifest(spec(secrets=SECRETS[:1], env={"SEED": "1"}), OPTS)
    env = pod(m)["containers"][0]["env"]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token",
                                                                "key": "token"}}} in env
    assert [e["name"] for e in env] == sorted(e["name"] for e in env)
    # Only the reference: no value of it anywhere in the body.
    assert [e for e in env if "valueFrom" in e] == [env[[e["name"] for e in env].index("HF_TOKEN")]]


def test_a_secret_volume_is_read_only_under_fairqs_name() -> None:
    m = job_manifest(spec(secrets=SECRETS), OPTS)
    assert pod(m)["volumes"] == [{"name": "fq-secret-1", "secret": {"secretName": "wandb"}}]
    assert pod(m)["containers"][0]["volumeMounts"] == [
        {"name": "fq-secret-1", "mountPath": "/etc/wandb", "readOnly": True}]


def test_pull_secret_working_dir_and_grace_reach_the_pod() -> None:
    m = job_manifest(spec(image_pull_secret="regcred", working_dir="/workspace",
                          termination_grace_seconds=120), OPTS)
    assert pod(m)["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod(m)["containers"][0]["workingDir"] == "/workspace"
    assert pod(m)["terminationGracePeriodSeconds"] == 120


def test_without_them_the_pod_has_none_and_the_backends_grace() -> None:
    m = job_manifest(spec(), OPTS)
    assert "imagePullSecrets" not in pod(m) and "workingDir" not in pod(m)["containers"][0]
    assert pod(m)["terminationGracePeriodSeconds"] == OPTS.termination_grace_seconds
    assert not [e for e in pod(m)["containers"][0]["env"] if "valueFrom" in e]


def test_user_labels_and_annotations_go_under_the_user_prefix_on_job_and_pods() -> None:
    m = job_manifest(spec(labels={"run": "exp-42"}, annotations={"git-sha": "3f2c1d"}), OPTS)
    for meta in (m["metadata"], m["spec"]["template"]["metadata"]):
        assert meta["labels"]["user.fairq.io/run"] == "exp-42"
        assert meta["annotations"]["user.fairq.io/git-sha"] == "3f2c1d"
        assert "run" not in meta["labels"] and meta["labels"][L_JOB_ID] == "12"


def test_every_replica_carries_the_same_volumes_secrets_and_labels() -> None:
    jobs = job_manifests(spec(replicas=2, volumes=VOLUMES, secrets=SECRETS,
                              labels={"run": "exp-42"}), OPTS)
    assert len(jobs) == 2
    assert pod(jobs[0])["volumes"] == pod(jobs[1])["volumes"]
    assert jobs[1]["spec"]["template"]["metadata"]["labels"]["user.fairq.io/run"] == "exp-42"


def test_every_volume_keeps_the_restricted_pod_security_level() -> None:
    m = job_manifest(spec(volumes=VOLUMES, secrets=SECRETS, shm_size_bytes=GI), OPTS)
    for volume in pod(m)["volumes"]:
        assert set(volume) - {"name"} <= RESTRICTED_VOLUME_TYPES
    assert "hostPath" not in str(m) and "namespace" not in str(pod(m))


def test_a_spec_digest_covers_them_and_adoption_still_works() -> None:
    key = b"k" * 32
    first = sign_job(job_manifest(spec(volumes=VOLUMES, labels={"run": "a"}), OPTS), key)
    same = sign_job(job_manifest(spec(volumes=VOLUMES, labels={"run": "a"}), OPTS), key)
    other = sign_job(job_manifest(spec(volumes=VOLUMES, labels={"run": "b"}), OPTS), key)
    assert adoption_verdict(first, same, key=key) == ("adopt", "")
    verdict, note = adoption_verdict(first, other, key=key)
    assert verdict == "adopt" and "earlier spec" in note


HOSTILE_SPECS: list[tuple[str, dict[str, Any]]] = [
    ("hostPath", {"volumes": ({"name": "r", "hostPath": {"path": "/"}, "mount_path": "/r"},)}),
    ("hostPath in empty_dir",
     {"volumes": ({"name": "r", "empty_dir": {"size_limit": "1Gi", "hostPath": "/"},
                   "mount_path": "/r"},)}),
    ("another namespace's PVC",
     {"volumes": ({"name": "r", "pvc": "kube-system/x", "mount_path": "/r"},)}),
    ("a mount over the token", {"volumes": ({"name": "r", "pvc": "x",
                                             "mount_path": "/var/run/secrets"},)}),
    ("a secret of another namespace",
     {"secrets": ({"secret": "kube-system/admin", "key": "k", "env": "X"},)}),
    ("a secret env var that is reserved",
     {"secrets": ({"secret": "s", "key": "k", "env": "NVIDIA_VISIBLE_DEVICES"},)}),
    ("a secret over the job's env",
     {"env": {"X": "1"}, "secrets": ({"secret": "s", "key": "k", "env": "X"},)}),
    ("a pull secret of another namespace", {"image_pull_secret": "ns/regcred"}),
    ("a relative working dir", {"working_dir": "../x"}),
    ("a prefixed label", {"labels": {"fairq.io/team": "nlp"}}),
    ("a prefixed annotation", {"annotations": {"kubernetes.io/x": "1"}}),
    ("a negative grace", {"termination_grace_seconds": -1}),
    ("a boolean grace", {"termination_grace_seconds": True}),
]


@pytest.mark.parametrize(("case", "overrides"), HOSTILE_SPECS, ids=[c[0] for c in HOSTILE_SPECS])
def test_the_manifest_refuses_what_the_api_refuses(case: str, overrides: dict[str, Any]) -> None:
    with pytest.raises(ManifestError):
        job_manifest(spec(**overrides), OPTS)


def test_a_jobs_fields_reach_its_launch_spec(world: World) -> None:
    job: Job = JobFactory(  # type: ignore[no-untyped-call,assignment] # factory_boy: no types
        team=world.vision, gpu_type=world.h100, tier=world.normal,
                     volumes=list(VOLUMES), secrets=list(SECRETS), image_pull_secret="regcred",
                     working_dir="/w", labels={"run": "a"}, annotations={"n": "b"},
                     termination_grace_seconds=90)
    launch = launch_spec(job)
    assert list(launch.volumes) == list(VOLUMES) and list(launch.secrets) == list(SECRETS)
    assert (launch.image_pull_secret, launch.working_dir, launch.termination_grace_seconds) == (
        "regcred", "/w", 90)
    assert (dict(launch.labels), dict(launch.annotations)) == ({"run": "a"}, {"n": "b"})
