"""Several clusters in the CLI: `fairq submit --cluster/--cluster-selector/--allow-spot`, the
CLUSTER column of `fairq queue` (rule K1: where it runs, "-" while queued), `fairq
status`'s placement lines and `fairq clusters` (capacity, free and spot per GPU type,
reachable)."""

from __future__ import annotations

import pytest

from queueing.models import Job
from tests.api.test_clusters import three_clusters
from tests.conftest import World

from .conftest import Cli

H100 = ["-t", "vision", "-i", "ghcr.io/acme/train:1.4", "-G", "h100", "-g", "2"]


@pytest.fixture
def clusters(world: World) -> dict[str, object]:
    return dict(three_clusters(world))


def test_submit_pins_a_cluster_a_selector_and_spot(cli: Cli, clusters: dict[str, object]) -> None:
    r = cli("--json", "submit", *H100, "-J", "pinned", "--cluster", "cloud",
            "--cluster-selector", "cost=cloud", "--cluster-selector", "region=us-east",
            "--allow-spot", "--", "python", "train.py")
    assert r.code == 0, r.err
    job = Job.objects.get(name="pinned")
    assert job.requested_cluster is not None and job.requested_cluster.name == "cloud"
    assert job.cluster_selector == {"cost": "cloud", "region": "us-east"} and job.allow_spot
    status = cli("status", str(job.pk))
    assert "  Placement pinned to cloud; clusters with cost=cloud, region=us-east; may run " \
           "on spot nodes" in status.out


def test_submit_says_why_no_cluster_can_run_it(cli: Cli, clusters: dict[str, object]) -> None:
    r = cli("submit", *H100, "-J", "nowhere", "--cluster", "lab")
    assert r.code == 1
    assert "No h100 nodes in cluster lab; clusters with h100 nodes: cloud, onprem." in r.err
    r = cli("submit", *H100, "-J", "bad", "--cluster-selector", "region")
    assert r.code == 2 and "--cluster-selector wants KEY=VALUE" in r.err
    assert not Job.objects.exists()


def test_queue_shows_the_cluster_each_job_runs_in(cli: Cli, world: World,
                                                  clusters: dict[str, object]) -> None:
    for name in ("here", "there"):
        assert cli("submit", *H100, "-J", name).code == 0
    # Set where a job runs directly, without a cycle placing it (rule K2).
    Job.objects.filter(name="here").update(status="RUNNING", cluster=clusters["onprem"],
                                           placement=["n1"])
    r = cli("queue")
    assert r.code == 0, r.err
    header, *rows = r.out.splitlines()
    assert header.split()[7:10] == ["GPUS", "NODES", "CLUSTER"]
    by_name = {row.split()[2]: row.split() for row in rows}
    assert by_name["here"][9] == "onprem" and by_name["here"][10] == "n1"
    assert by_name["there"][9] == "-"
    only = cli("queue", "-M", "onprem")
    assert [row.split()[2] for row in only.out.splitlines()[1:]] == ["here"]
    assert "  Cluster   onprem" in cli("status", str(Job.objects.get(name="here").pk)).out


def test_clusters_lists_capacity_free_spot_and_reachability(
        cli: Cli, clusters: dict[str, object]) -> None:
    r = cli("clusters")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0].split() == ["CLUSTER", "RANK", "STATE", "GPU_TYPE", "NODES", "GPUS", "FREE",
                                "SPOT", "JOBS", "LABELS"]
    assert lines[1].split() == ["onprem", "0", "up", "h100", "2", "16", "6", "-", "0",
                                "cost=owned,region=eu-west"]
    assert lines[2].split()[:5] == ["lab", "5", "unreachable", "since", lines[2].split()[4]]
    assert lines[3].split() == ["cloud", "10", "up", "a100", "2", "16", "12", "-", "0",
                                "cost=cloud,region=us-east"]
    assert lines[4].split() == ["h100", "1", "8", "7", "8", "(7", "free)"]
    as_json = cli("--json", "clusters").json
    assert [c["name"] for c in as_json] == ["onprem", "lab", "cloud"]


def test_clusters_without_any_configured_shows_the_default_one(cli: Cli) -> None:
    r = cli("clusters")
    assert r.code == 0, r.err
    assert r.out.splitlines()[1].split()[:7] == ["(default)", "0", "up", "a100", "2", "16", "16"]


def test_k8_clusters_says_draining_and_drained(cli: Cli, world: World,
                                              clusters: dict[str, object]) -> None:
    from django.utils import timezone

    from queueing.models import Cluster

    Cluster.objects.filter(name="cloud").update(enabled=False)
    Cluster.objects.filter(name="lab").update(enabled=False, drained_at=timezone.now())
    r = cli("clusters")
    assert r.code == 0, r.err
    by_name = {line.split()[0]: line.split() for line in r.out.splitlines()[1:]
               if not line.startswith(" ")}
    assert by_name["cloud"][2] == "draining" and by_name["lab"][2] == "drained"
