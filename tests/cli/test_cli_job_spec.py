"""`fairq submit` with volumes, scratch, secrets, a pull secret, a working dir, labels,
annotations and grace: flags and the YAML job file (the API's JSON shape;
flags add to its lists and override its keys), a bad flag as a usage error (exit 2), a
refusal as one line (exit 1); `fairq status` shows them; `fairq queue --label`."""

from __future__ import annotations

from pathlib import Path

import pytest

from accounts.models import Team
from queueing.models import Job

from .conftest import Cli

SUBMIT = ["submit", "-t", "vision", "-J", "train", "-i", "ghcr.io/acme/train:1.4",
          "-G", "h100", "-g", "2"]


@pytest.fixture(autouse=True)
def _allowlists(world: object) -> None:
    Team.objects.filter(slug="vision").update(
        allowed_pvcs=["imagenet", "ckpt-llm"], allowed_secrets=["hf-token", "wandb"],
        allowed_pull_secrets=["regcred"])


def test_it_submits_every_field_from_flags_and_status_shows_them(cli: Cli) -> None:
    r = cli(*SUBMIT, "--volume", "data=pvc:imagenet:/data:ro", "--volume", "ckpt=pvc:ckpt-llm:/ckpt",
            "--scratch", "scratch=100Gi:/scratch", "--secret-env", "HF_TOKEN=hf-token:token",
            "--secret-volume", "wandb:/etc/wandb", "--pull-secret", "regcred",
            "--workdir", "/workspace", "--label", "run=exp-42", "--annotation", "git-sha=3f2c1d",
            "--grace", "2m", "--", "python", "train.py")
    assert r.code == 0, r.err
    job = Job.objects.get()
    assert job.volumes == [
        {"name": "data", "pvc": "imagenet", "mount_path": "/data", "read_only": True},
        {"name": "ckpt", "pvc": "ckpt-llm", "mount_path": "/ckpt", "read_only": False},
        {"name": "scratch", "empty_dir": {"size_limit": "100Gi"}, "mount_path": "/scratch"}]
    assert job.secrets == [{"secret": "hf-token", "key": "token", "env": "HF_TOKEN"},
                           {"secret": "wandb", "mount_path": "/etc/wandb"}]
    assert (job.image_pull_secret, job.working_dir, job.termination_grace_seconds) == (
        "regcred", "/workspace", 120)
    assert (job.labels, job.annotations) == ({"run": "exp-42"}, {"git-sha": "3f2c1d"})
    out = cli("status", str(job.pk)).out
    for line in ("Volume    data: pvc imagenet (read-only) at /data",
                 "Volume    scratch: scratch 100Gi at /scratch",
                 "Secret    hf-token[token] as $HF_TOKEN",
                 "Secret    wandb at /etc/wandb (read-only)", "Pull      regcred",
                 "Workdir   /workspace", "Labels    run=exp-42", "Notes     git-sha=3f2c1d",
                 "Grace     120s"):
        assert line in out, (line, out)


def test_the_job_file_takes_the_apis_shape_and_flags_add_to_it(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("""team: vision
name: from-file
image: ghcr.io/acme/train:1.4
gpu_type: a100
gpus: 1
volumes:
  - {name: data, pvc: imagenet, mount_path: /data, read_only: true}
secrets:
  - {secret: hf-token, key: token, env: HF_TOKEN}
image_pull_secret: regcred
working_dir: /workspace
labels: {run: exp-1, owner: cv}
annotations: {git-sha: 3f2c1d}
termination_grace_seconds: 60
""")
    r = cli("--json", "submit", "-f", str(f), "--label", "run=exp-2",
            "--scratch", "s=1Gi:/scratch")
    assert r.code == 0, r.err
    assert r.json["labels"] == {"run": "exp-2", "owner": "cv"}
    assert [v["name"] for v in r.json["volumes"]] == ["data", "s"]
    assert r.json["secrets"] == [{"secret": "hf-token", "key": "token", "env": "HF_TOKEN"}]
    assert (r.json["working_dir"], r.json["termination_grace_seconds"]) == ("/workspace", 60)


@pytest.mark.parametrize("flag", [
    ["--volume", "data=imagenet:/data"], ["--volume", "data=pvc:imagenet:/data:rx"],
    ["--scratch", "s=100Gi"], ["--secret-env", "HF_TOKEN=hf-token"],
    ["--secret-volume", "wandb"], ["--label", "run"], ["--grace", "soon"],
])
def test_a_malformed_flag_is_a_usage_error(cli: Cli, flag: list[str]) -> None:
    r = cli(*SUBMIT, *flag)
    assert r.code == 2 and r.err.startswith("fairq: "), r.err
    assert not Job.objects.exists()


def test_a_refused_spec_is_one_line_naming_the_field_and_exit_1(cli: Cli) -> None:
    r = cli(*SUBMIT, "--volume", "root=pvc:kube-system/etcd:/var/run/secrets")
    assert r.code == 1 and r.err.count("\n") == 1
    assert "volumes[0].pvc" in r.err and "volumes[0].mount_path" in r.err
    assert not Job.objects.exists()


def test_queue_filters_on_labels_all_of_them(cli: Cli) -> None:
    for name, labels in (("a", ["run=exp-1", "owner=cv"]), ("b", ["run=exp-1"]),
                         ("c", ["run=exp-2", "owner=cv"])):
        args = [x for label in labels for x in ("--label", label)]
        assert cli("submit", "-t", "vision", "-J", name, "-i", "busybox", "-G", "a100",
                   "-g", "1", *args).code == 0

    def names(*flags: str) -> list[str]:
        return sorted(j["name"] for j in cli("--json", "queue", *flags).json)

    assert names("--label", "run=exp-1") == ["a", "b"]
    assert names("--label", "run=exp-1", "-l", "owner=cv") == ["a"]
    assert names("--label", "owner=cv") == ["a", "c"]
    assert names("--label", "run=none") == []
    bad = cli("queue", "--label", "run")
    assert bad.code == 1 and "label" in bad.err
