"""`fairq submit --topology LEVEL[:MODE]` and the YAML job file's `topology` (rule A7):
sent as the API's `topology` field, refused levels as one line and exit 1, and
`fairq status` showing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from queueing.memo import forget_all
from queueing.models import GpuType, Job

from .conftest import Cli

SUBMIT = ["submit", "-t", "vision", "-J", "train", "-i", "ghcr.io/acme/train:1.4",
          "-G", "h100", "-g", "2", "-N", "2"]


@pytest.fixture(autouse=True)
def _racks(cli: Cli) -> None:
    assert GpuType.objects.filter(slug="h100").update(topology_levels=[
        {"name": "rack", "node_label": "topology.kubernetes.io/rack"}]) == 1
    forget_all()  # the GPU types are memoized per process


def test_the_flag_asks_for_one_rack(cli: Cli) -> None:
    r = cli(*SUBMIT, "--topology", "rack")
    assert r.code == 0, r.err
    job = Job.objects.get()
    assert (job.topology_level, job.topology_mode) == ("rack", "required")
    assert "Topology  one rack (required)" in cli("status", str(job.pk)).out


def test_the_job_file_with_the_flag_winning(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("team: vision\nname: from-file\nimage: ghcr.io/acme/train:1.4\n"
                 "gpu_type: h100\ngpus: 1\nreplicas: 2\ntopology: {level: rack, mode: required}\n")
    r = cli("--json", "submit", "-f", str(f))
    assert r.code == 0, r.err
    assert r.json["topology"] == {"level": "rack", "mode": "required"}
    r = cli("--json", "submit", "-f", str(f), "--topology", "rack:preferred")
    assert r.code == 0, r.err
    assert r.json["topology"] == {"level": "rack", "mode": "preferred"}


def test_an_unknown_level_is_one_line_and_exit_1(cli: Cli) -> None:
    r = cli(*SUBMIT, "--topology", "row:required")
    assert r.code == 1 and "topology.level" in r.err and r.err.count("\n") == 1
    r = cli(*SUBMIT, "--topology", ":required")
    assert r.code != 0 and "--topology" in r.err
    assert not Job.objects.exists()
