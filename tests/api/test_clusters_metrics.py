"""Issue 19 in /metrics (docs/metrics.md, "Clusters"): fairq_cluster_reachable{cluster},
capacity and free GPUs per cluster, GPU type and spot flag, GPUs held per cluster, and
fairq_spot_reclaimed_total{cluster} (counted by `record_spot_reclaimed`, rule K6); the
old fairq_gpus_allocated{gpu_type} series unchanged."""

from __future__ import annotations

import pytest
from django.test import Client

from queueing.services.metrics import record_spot_reclaimed
from tests.api.test_clusters import three_clusters
from tests.conftest import World
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _scrape() -> str:
    r = Client().get("/metrics")
    assert r.status_code == 200
    return r.content.decode()


def test_each_cluster_exports_reachability_capacity_free_and_spot(world: World) -> None:
    clusters = three_clusters(world)
    JobFactory(team=world.vision, gpu_type=world.h100, gpus_per_replica=4, replicas=2,
               status="RUNNING", cluster=clusters["onprem"])
    JobFactory(team=world.nlp, gpu_type=world.h100, gpus_per_replica=1, status="RUNNING",
               cluster=clusters["cloud"])
    text = _scrape()
    assert 'fairq_cluster_reachable{cluster="onprem"} 1.0' in text
    assert 'fairq_cluster_reachable{cluster="cloud"} 1.0' in text
    assert 'fairq_cluster_reachable{cluster="lab"} 0.0' in text
    assert 'fairq_gpus_capacity{cluster="onprem",gpu_type="h100",spot="false"} 16.0' in text
    assert 'fairq_gpus_free{cluster="onprem",gpu_type="h100",spot="false"} 6.0' in text
    assert 'fairq_gpus_capacity{cluster="cloud",gpu_type="a100",spot="false"} 16.0' in text
    # cloud's h100s are all spot: its on-demand h100 series is 0, the spot one 8 (7 free).
    assert 'fairq_gpus_capacity{cluster="cloud",gpu_type="h100",spot="true"} 8.0' in text
    assert 'fairq_gpus_free{cluster="cloud",gpu_type="h100",spot="true"} 7.0' in text
    assert 'fairq_gpus_capacity{cluster="cloud",gpu_type="h100",spot="false"} 0.0' in text
    assert 'fairq_gpus_capacity{cluster="onprem",gpu_type="h100",spot="true"}' not in text
    assert 'fairq_cluster_gpus_allocated{cluster="onprem",gpu_type="h100"} 8.0' in text
    assert 'fairq_cluster_gpus_allocated{cluster="cloud",gpu_type="h100"} 1.0' in text
    # The old series, the sum over the clusters, keeps its name and labels.
    assert 'fairq_gpus_allocated{gpu_type="h100"} 9.0' in text


def test_without_clusters_the_implicit_one_exports_capacity_but_no_reachability(
        world: World) -> None:
    text = _scrape()
    assert "fairq_cluster_reachable{" not in text
    # The test settings' simulated cluster: 2x8xh100 (cluster="" is no label at all).
    assert 'fairq_gpus_capacity{cluster="",gpu_type="h100",spot="false"} 16.0' in text


def test_spot_reclamations_are_counted_per_cluster(world: World) -> None:
    three_clusters(world)
    assert "fairq_spot_reclaimed_total{" not in _scrape()
    record_spot_reclaimed(cluster="cloud", jobs=3)
    record_spot_reclaimed(cluster="cloud")
    record_spot_reclaimed(cluster="onprem", jobs=0)  # nothing requeued: nothing counted
    text = _scrape()
    assert 'fairq_spot_reclaimed_total{cluster="cloud"} 4.0' in text
    assert 'fairq_spot_reclaimed_total{cluster="onprem"}' not in text
