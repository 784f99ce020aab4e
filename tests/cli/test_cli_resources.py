"""`fairq submit` with resources: --cpu, --memory, --ephemeral-storage and
--shm-size, the YAML job file's `resources` and `shm_size` (flags win), a refused
quantity as one line and exit 1, and `fairq status` showing them."""

from __future__ import annotations

from pathlib import Path

from queueing.models import Job

from .conftest import Cli

SUBMIT = ["submit", "-t", "vision", "-J", "train", "-i", "ghcr.io/acme/train:1.4",
          "-G", "h100", "-g", "2"]
GI = 2**30


def test_it_submits_resources_from_flags(cli: Cli) -> None:
    r = cli(*SUBMIT, "--cpu", "8", "--memory", "64Gi", "--ephemeral-storage", "100Gi",
            "--shm-size", "16Gi", "--", "python", "train.py")
    assert r.code == 0, r.err
    job = Job.objects.get()
    assert job.resources == {"cpu": "8", "memory": "64Gi", "ephemeral_storage": "100Gi"}
    assert (job.cpu_millicores, job.shm_size_bytes) == (8000, 16 * GI)
    status = cli("status", str(job.pk))
    assert "Replica   cpu 8, memory 64Gi, ephemeral storage 100Gi, /dev/shm 16Gi" in status.out


def test_the_job_files_resources_with_flags_winning(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("team: vision\nname: from-file\nimage: ghcr.io/acme/train:1.4\n"
                 "gpu_type: a100\ngpus: 1\nresources:\n  cpu: 4\n  memory: 32Gi\n"
                 "shm_size: 8Gi\n")
    r = cli("--json", "submit", "-f", str(f), "--memory", "48Gi")
    assert r.code == 0, r.err
    assert r.json["resources"] == {"cpu": "4", "memory": "48Gi"}
    assert r.json["shm_size"] == "8Gi"


def test_a_fractional_cpu_in_yaml_stays_a_quantity(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("team: vision\nname: half\nimage: busybox\ngpu_type: a100\ngpus: 1\n"
                 "resources: {cpu: 0.5}\n")
    r = cli("submit", "-f", str(f))
    assert r.code == 0, r.err
    assert Job.objects.get().cpu_millicores == 500


def test_a_refused_quantity_is_one_line_and_exit_1(cli: Cli) -> None:
    r = cli(*SUBMIT, "--shm-size=-1Gi")
    assert r.code == 1
    assert "shm_size" in r.err and r.err.count("\n") == 1
    r = cli(*SUBMIT, "--cpu", "1e999")
    assert r.code == 1 and "resources.cpu" in r.err
    assert not Job.objects.exists()


def test_the_array_job_carries_the_flags(cli: Cli) -> None:
    r = cli(*SUBMIT, "--array", "2", "--cpu", "2")
    assert r.code == 0, r.err
    assert {j.cpu_millicores for j in Job.objects.all()} == {2000}
