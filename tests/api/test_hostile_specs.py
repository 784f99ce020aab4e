"""Volumes, secrets, pull secrets, working dir, labels, annotations and grace through the
REST API: every hostile spec is a 400 naming the field, nothing stored; a
good one is stored normalised, returned by GET /jobs/{id}/, and carried by resubmit and
array jobs."""

from __future__ import annotations

from typing import Any

import pytest

from accounts.models import Team
from queueing.models import Job, Tier
from queueing.services.jobs import job_input_build, job_spec
from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db

GOOD: dict[str, Any] = {
    "volumes": [
        {"name": "data", "pvc": "imagenet", "mount_path": "/data", "read_only": True},
        {"name": "ckpt", "pvc": "ckpt-llm", "mount_path": "/ckpt"},
        {"name": "scratch", "empty_dir": {"size_limit": "100Gi"}, "mount_path": "/scratch"},
    ],
    "secrets": [
        {"secret": "hf-token", "key": "token", "env": "HF_TOKEN"},
        {"secret": "wandb", "mount_path": "/etc/wandb"},
    ],
    "image_pull_secret": "regcred",
    "working_dir": "/workspace",
    "labels": {"run": "exp-42"},
    "annotations": {"git-sha": "3f2c1d"},
    "termination_grace_seconds": 120,
}


def _allow(team: Team) -> None:
    team.allowed_pvcs = ["ckpt-llm", "imagenet"]
    team.allowed_secrets = ["hf-token", "wandb"]
    team.allowed_pull_secrets = ["regcred"]
    team.save()


def _pvc(pvc: str, path: str = "/data") -> dict[str, Any]:
    return {"volumes": [{"name": "data", "pvc": pvc, "mount_path": path}]}


def _mount(path: str) -> dict[str, Any]:
    return _pvc("imagenet", path)


def _scratch(size: Any) -> dict[str, Any]:
    return {"volumes": [{"name": "s", "empty_dir": {"size_limit": size}, "mount_path": "/s"}]}


def _annotations(n: int, size: int) -> dict[str, Any]:
    return {"annotations": {f"k{i}": "x" * size for i in range(n)}}


# (case, body fields, the field path the 400 names)
HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    # Names of another namespace, or not allowed.
    ("another namespace's PVC", _pvc("other-ns/x"), "volumes[0].pvc"),
    ("a PVC not allowed", _pvc("secret-data"), "volumes[0].pvc"),
    ("a PVC with upper case", _pvc("ImageNet"), "volumes[0].pvc"),
    ("another namespace's Secret",
     {"secrets": [{"secret": "kube-system/admin", "key": "k", "env": "X"}]}, "secrets[0].secret"),
    ("a Secret not allowed", {"secrets": [{"secret": "db", "key": "password", "env": "PW"}]},
     "secrets[0].secret"),
    ("a Secret volume not allowed", {"secrets": [{"secret": "db", "mount_path": "/etc/db"}]},
     "secrets[0].secret"),
    ("a pull secret not allowed", {"image_pull_secret": "other-regcred"}, "image_pull_secret"),
    ("a pull secret of another namespace", {"image_pull_secret": "ns/regcred"},
     "image_pull_secret"),
    # hostPath in every disguise.
    ("hostPath", {"volumes": [{"name": "r", "hostPath": {"path": "/"}, "mount_path": "/r"}]},
     "volumes[0].hostPath"),
    ("host_path", {"volumes": [{"name": "r", "host_path": "/", "mount_path": "/r"}]},
     "volumes[0].host_path"),
    ("hostPath beside a pvc",
     {"volumes": [{"name": "r", "pvc": "imagenet", "hostPath": {"path": "/"},
                   "mount_path": "/r"}]}, "volumes[0].hostPath"),
    ("hostPath nested in empty_dir",
     {"volumes": [{"name": "r", "empty_dir": {"size_limit": "1Gi", "hostPath": {"path": "/"}},
                   "mount_path": "/r"}]}, "volumes[0].empty_dir.hostPath"),
    ("medium Memory in empty_dir",
     {"volumes": [{"name": "r", "empty_dir": {"size_limit": "1Gi", "medium": "Memory"},
                   "mount_path": "/r"}]}, "volumes[0].empty_dir.medium"),
    ("HostPath", {"volumes": [{"name": "r", "HostPath": "/", "mount_path": "/r"}]},
     "volumes[0].HostPath"),
    ("hostPath in a secret",
     {"secrets": [{"secret": "wandb", "mount_path": "/w", "hostPath": {"path": "/"}}]},
     "secrets[0].hostPath"),
    ("hostPath inside a secret env reference",
     {"secrets": [{"secret": "hf-token", "key": "token", "env": "T", "host_path": "/"}]},
     "secrets[0].host_path"),
    ("nfs", {"volumes": [{"name": "r", "nfs": {"server": "x", "path": "/"},
                          "mount_path": "/r"}]}, "volumes[0].nfs"),
    ("a namespace key", {"volumes": [{"name": "r", "pvc": "imagenet", "namespace": "kube-system",
                                      "mount_path": "/r"}]}, "volumes[0].namespace"),
    ("a secret with items",
     {"secrets": [{"secret": "wandb", "mount_path": "/w", "items": [{"key": "k", "path": "/"}]}]},
     "secrets[0].items"),
    ("a secret with a namespace",
     {"secrets": [{"secret": "wandb", "key": "k", "env": "W", "namespace": "kube-system"}]},
     "secrets[0].namespace"),
    ("both pvc and empty_dir",
     {"volumes": [{"name": "r", "pvc": "imagenet", "empty_dir": {"size_limit": "1Gi"},
                   "mount_path": "/r"}]}, "volumes[0]"),
    ("neither pvc nor empty_dir", {"volumes": [{"name": "r", "mount_path": "/r"}]}, "volumes[0]"),
    # Mounts over fairq's and the kubelet's places.
    ("a mount over /var/run/secrets", _mount("/var/run/secrets"), "volumes[0].mount_path"),
    ("a mount under /var/run/secrets", _mount("/var/run/secrets/kubernetes.io"),
     "volumes[0].mount_path"),
    ("a mount over /var/run (above the secrets)", _mount("/var/run"), "volumes[0].mount_path"),
    ("a mount at /run/secrets", _mount("/run/secrets"), "volumes[0].mount_path"),
    ("a mount at /dev/shm", _mount("/dev/shm"), "volumes[0].mount_path"),
    ("a mount at /proc", _mount("/proc"), "volumes[0].mount_path"),
    ("a mount at /sys/fs", _mount("/sys/fs"), "volumes[0].mount_path"),
    ("a mount at /etc/hosts", _mount("/etc/hosts"), "volumes[0].mount_path"),
    ("a mount at /etc (over resolv.conf)", _mount("/etc"), "volumes[0].mount_path"),
    ("a mount at /", _mount("/"), "volumes[0].mount_path"),
    ("a mount through ..", _mount("/var/run/../run/secrets"), "volumes[0].mount_path"),
    ("a mount with //", _mount("//data"), "volumes[0].mount_path"),
    ("a mount with a trailing /", _mount("/data/"), "volumes[0].mount_path"),
    ("a relative mount", _mount("data"), "volumes[0].mount_path"),
    ("a mount with a space", _mount("/my data"), "volumes[0].mount_path"),
    ("a secret over /var/run/secrets",
     {"secrets": [{"secret": "wandb", "mount_path": "/var/run/secrets/x"}]},
     "secrets[0].mount_path"),
    ("nested mounts",
     {"volumes": [{"name": "a", "pvc": "imagenet", "mount_path": "/data"},
                  {"name": "b", "pvc": "ckpt-llm", "mount_path": "/data/ckpt"}]},
     "volumes[1].mount_path"),
    ("a secret at a volume's path",
     {"volumes": [{"name": "a", "pvc": "imagenet", "mount_path": "/data"}],
      "secrets": [{"secret": "wandb", "mount_path": "/data"}]}, "secrets[0].mount_path"),
    ("two volumes of one name",
     {"volumes": [{"name": "a", "pvc": "imagenet", "mount_path": "/a"},
                  {"name": "a", "pvc": "ckpt-llm", "mount_path": "/b"}]}, "volumes[1].name"),
    ("fairq's shm volume name",
     {"volumes": [{"name": "dshm", "pvc": "imagenet", "mount_path": "/a"}]}, "volumes[0].name"),
    ("a volume name that is no DNS label",
     {"volumes": [{"name": "Data_1", "pvc": "imagenet", "mount_path": "/a"}]}, "volumes[0].name"),
    ("a read-only scratch",
     {"volumes": [{"name": "s", "empty_dir": {"size_limit": "1Gi"}, "mount_path": "/s",
                   "read_only": True}]}, "volumes[0].read_only"),
    ("17 volumes", {"volumes": [{"name": f"v{i}", "empty_dir": {"size_limit": "1Gi"},
                                 "mount_path": f"/v{i}"} for i in range(17)]}, "volumes"),
    # Quantities.
    ("scratch of 1e400", _scratch("1e400"), "volumes[0].empty_dir.size_limit"),
    ("scratch of 99999999999999999999Ei", _scratch("99999999999999999999Ei"),
     "volumes[0].empty_dir.size_limit"),
    ("scratch above FAIRQ_MAX_SCRATCH_BYTES", _scratch("2Ti"), "volumes[0].empty_dir.size_limit"),
    ("zero scratch", _scratch("0"), "volumes[0].empty_dir.size_limit"),
    ("negative scratch", _scratch("-1Gi"), "volumes[0].empty_dir.size_limit"),
    ("scratch as a boolean", _scratch(True), "volumes[0].empty_dir.size_limit"),
    ("scratch without a size", {"volumes": [{"name": "s", "empty_dir": {}, "mount_path": "/s"}]},
     "volumes[0].empty_dir.size_limit"),
    ("shm of 1e400", {"shm_size": "1e400"}, "shm_size"),
    ("huge shm", {"shm_size": "99999999999999999999Ei"}, "shm_size"),
    ("negative shm", {"shm_size": "-1Gi"}, "shm_size"),
    ("zero shm", {"shm_size": "0"}, "shm_size"),
    # Secret env vars.
    ("a secret env var that is reserved",
     {"secrets": [{"secret": "hf-token", "key": "token", "env": "LD_PRELOAD"}]},
     "secrets[0].env"),
    ("a secret env var named FAIRQ_*",
     {"secrets": [{"secret": "hf-token", "key": "token", "env": "FAIRQ_SIM_SECONDS"}]},
     "secrets[0].env"),
    ("a secret env var the env sets",
     {"env": {"HF_TOKEN": "x"}, "secrets": [{"secret": "hf-token", "key": "token",
                                              "env": "HF_TOKEN"}]}, "secrets[0].env"),
    ("a secret env var that is no name",
     {"secrets": [{"secret": "hf-token", "key": "token", "env": "1 X"}]}, "secrets[0].env"),
    ("a secret env var without a key",
     {"secrets": [{"secret": "hf-token", "env": "HF_TOKEN"}]}, "secrets[0].key"),
    ("a secret key with a slash",
     {"secrets": [{"secret": "hf-token", "key": "../token", "env": "HF_TOKEN"}]},
     "secrets[0].key"),
    # Working directory.
    ("a relative working dir", {"working_dir": "workspace"}, "working_dir"),
    ("a working dir with ..", {"working_dir": "/workspace/../etc"}, "working_dir"),
    ("a working dir over 256 characters", {"working_dir": "/" + "a" * 256}, "working_dir"),
    # Labels and annotations.
    ("a kubernetes.io label", {"labels": {"kubernetes.io/x": "1"}}, "labels.kubernetes.io/x"),
    ("fairq's job-id label", {"labels": {"fairq.io/job-id": "1"}}, "labels.fairq.io/job-id"),
    ("a label key over 40 characters", {"labels": {"k" * 41: "1"}}, "labels." + "k" * 41),
    ("a label value with a space", {"labels": {"run": "exp 42"}}, "labels.run"),
    ("a label value over 63 characters", {"labels": {"run": "x" * 64}}, "labels.run"),
    ("17 labels", {"labels": {f"k{i}": "v" for i in range(17)}}, "labels"),
    ("an annotation on app.kubernetes.io",
     {"annotations": {"app.kubernetes.io/managed-by": "me"}},
     "annotations.app.kubernetes.io/managed-by"),
    ("an annotation over 1024 characters", {"annotations": {"note": "x" * 1025}},
     "annotations.note"),
    ("annotations over 8 KiB together", _annotations(9, 1000), "annotations"),
    ("17 annotations", _annotations(17, 1), "annotations"),
    # Grace.
    ("grace above the tier's cap", {"termination_grace_seconds": 601},
     "termination_grace_seconds"),
    ("negative grace", {"termination_grace_seconds": -1}, "termination_grace_seconds"),
    ("grace over a day", {"termination_grace_seconds": 86401}, "termination_grace_seconds"),
]


@pytest.fixture
def allowed(world: World) -> World:
    _allow(world.vision)
    Tier.objects.filter(slug="normal").update(max_termination_grace_seconds=600)
    return world


@pytest.mark.parametrize(("case", "fields", "refused"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_it_refuses_hostile_specs_naming_the_field_and_storing_nothing(
    allowed: World, settings: Any, case: str, fields: dict[str, Any], refused: str,
) -> None:
    settings.FAIRQ_MAX_SCRATCH_BYTES = 2**40
    before = Job.objects.count()
    r = allowed.client(allowed.member).post("/api/v1/jobs/", job_body(**fields), format="json")
    assert r.status_code == 400, (case, r.json())
    errors = r.json()["error"]["fields"]
    assert refused in errors and errors[refused][0], (case, errors)
    assert Job.objects.count() == before


@pytest.mark.parametrize(("case", "fields", "refused"), HOSTILE[:12], ids=[c[0] for c in HOSTILE[:12]])
def test_bulk_refuses_hostile_specs_storing_nothing(
    allowed: World, case: str, fields: dict[str, Any], refused: str,
) -> None:
    r = allowed.client(allowed.member).post("/api/v1/jobs/bulk/",
                                            {**job_body(**fields), "count": 3}, format="json")
    assert r.status_code == 400, r.json()
    assert refused in r.json()["error"]["fields"]
    assert not Job.objects.exists()


def test_the_refusal_of_a_tier_cap_names_the_cap(allowed: World) -> None:
    r = allowed.client(allowed.member).post(
        "/api/v1/jobs/", job_body(termination_grace_seconds=601), format="json")
    assert r.json()["error"]["fields"]["termination_grace_seconds"] == [
        "At most 600 seconds (tier normal's maximum), not 601."]


def test_an_allowlist_refusal_says_what_is_allowed(allowed: World) -> None:
    r = allowed.client(allowed.member).post("/api/v1/jobs/", job_body(**_pvc("db")),
                                            format="json")
    message = r.json()["error"]["fields"]["volumes[0].pvc"][0]
    assert "ckpt-llm, imagenet" in message and "workload-policy" in message


def test_another_teams_allowlist_does_not_count(allowed: World) -> None:
    """nlp allows `nlp-data`; vision's job may not name it (its own namespace has no such
    claim it allowed)."""
    allowed.nlp.allowed_pvcs = ["nlp-data"]
    allowed.nlp.save()
    r = allowed.client(allowed.member).post("/api/v1/jobs/", job_body(**_pvc("nlp-data")),
                                            format="json")
    assert r.status_code == 400 and "volumes[0].pvc" in r.json()["error"]["fields"]


def test_a_good_spec_is_stored_normalised_and_returned(allowed: World) -> None:
    client = allowed.client(allowed.member)
    r = client.post("/api/v1/jobs/", job_body(**GOOD), format="json")
    assert r.status_code == 201, r.json()
    job = Job.objects.get(pk=r.json()["id"])
    assert job.volumes == [
        {"name": "data", "pvc": "imagenet", "mount_path": "/data", "read_only": True},
        {"name": "ckpt", "pvc": "ckpt-llm", "mount_path": "/ckpt", "read_only": False},
        {"name": "scratch", "empty_dir": {"size_limit": "100Gi"}, "mount_path": "/scratch"},
    ]
    assert job.secrets == GOOD["secrets"]
    assert (job.image_pull_secret, job.working_dir) == ("regcred", "/workspace")
    assert (job.labels, job.annotations) == ({"run": "exp-42"}, {"git-sha": "3f2c1d"})
    assert job.termination_grace_seconds == 120
    got = client.get(f"/api/v1/jobs/{job.pk}/").json()
    for key in GOOD:
        assert got[key] == getattr(job, key), key


def test_grace_not_given_is_the_setting_cut_to_the_tier_cap(allowed: World, settings: Any) -> None:
    settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS = 30
    client = allowed.client(allowed.member)
    r = client.post("/api/v1/jobs/", job_body(), format="json")
    assert r.json()["termination_grace_seconds"] == 30
    settings.FAIRQ_K8S_TERMINATION_GRACE_SECONDS = 900  # above normal's cap of 600
    r = client.post("/api/v1/jobs/", job_body(), format="json")
    assert r.json()["termination_grace_seconds"] == 600


def test_resubmit_and_array_jobs_carry_every_field(allowed: World) -> None:
    client = allowed.client(allowed.member)
    job = Job.objects.get(pk=client.post("/api/v1/jobs/", job_body(**GOOD),
                                         format="json").json()["id"])
    again = job_input_build(actor=allowed.member, **job_spec(job))
    for key in GOOD:
        assert getattr(again, key) == getattr(job, key), key
    r = client.post("/api/v1/jobs/bulk/", {**job_body(**GOOD), "count": 2}, format="json")
    assert r.status_code == 201, r.json()
    for member in Job.objects.filter(pk__in=r.json()["ids"]):
        for key in GOOD:
            assert getattr(member, key) == getattr(job, key), key


def test_a_spec_valid_once_is_refused_after_the_allowlist_shrinks(allowed: World) -> None:
    job = Job.objects.get(pk=allowed.client(allowed.member).post(
        "/api/v1/jobs/", job_body(**GOOD), format="json").json()["id"])
    Team.objects.filter(pk=allowed.vision.pk).update(allowed_secrets=["wandb"])
    from queueing.errors import DomainError
    with pytest.raises(DomainError) as refused:
        job_input_build(actor=allowed.member, **job_spec(job))
    assert "secrets[0].secret" in refused.value.fields


@pytest.mark.parametrize(("case", "fields", "refused"),
                         [c for c in HOSTILE if "hostPath" in c[0] or "namespace" in c[0]
                          or "mount" in c[0]],
                         ids=[c[0] for c in HOSTILE if "hostPath" in c[0] or "namespace" in c[0]
                              or "mount" in c[0]])
def test_the_service_refuses_them_without_the_serializer(
    allowed: World, case: str, fields: dict[str, Any], refused: str,
) -> None:
    """A front end that skips the API's serializer (the web form) gets the same refusals
    from `job_input_build` (queueing.validation.workload_check)."""
    from queueing.errors import DomainError

    body = job_body(**fields)
    with pytest.raises(DomainError) as refusal:
        job_input_build(actor=allowed.member, **body)
    assert refused in refusal.value.fields, refusal.value.fields
    assert not Job.objects.exists()
