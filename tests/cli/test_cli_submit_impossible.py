"""Rule E6 at submit through `fairq submit -f`: a job file no cluster could hold is the
API's 400, shown on one line naming the field and the largest possible, exit 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from queueing.models import Cluster, Job
from tests.api.test_submit_impossible import FLEET, LARGEST_EAST
from tests.conftest import World

from .conftest import Cli

pytestmark = pytest.mark.django_db


def test_a_job_file_through_the_cli_is_refused_readably(world: World, cli: Cli,
                                                        tmp_path: Path) -> None:
    for name, nodes in FLEET.items():
        Cluster.objects.create(name=name, backend="simulated", sim_nodes=nodes)
    f = tmp_path / "job.yaml"
    f.write_text("team: vision\nname: huge\nimage: ghcr.io/acme/train:1.4\n"
                 "gpu_type: h100\ngpus: 8\nreplicas: 64\n")
    r = cli("submit", "-f", str(f))
    assert r.code == 1
    assert "replicas" in r.err and LARGEST_EAST in r.err
    assert not Job.objects.exists()


