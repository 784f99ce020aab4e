"""Several clusters in /metrics (docs/metrics.md, "Clusters"): fairq_cluster_reachable{cluster},
capacity and free GPUs per cluster, GPU type and spot flag, GPUs held per cluster, and
fairq_spot_reclaimed_total{cluster} (rule K6, counted from the `spot_reclaimed` job
events like the other counters); the old fairq_gpus_allocated{gpu_type} series
unchanged."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from queueing.models import JobEvent
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


def test_spot_reclamations_are_counted_per_cluster_from_their_events(world: World) -> None:
    three_clusters(world)
    assert "fairq_spot_reclaimed_total{" not in _scrape()
    job = JobFactory(team=world.vision, gpu_type=world.h100, status="QUEUED", attempt=2)

    def reclaimed(**data: str) -> None:
        JobEvent.objects.create(job=job, at=timezone.now(), kind="spot_reclaimed",
                                actor_label="scheduler", attempt=1,
                                data={"rule": "K6", **data})

    reclaimed(cluster="cloud", node="s0")
    reclaimed(node="cloud/s1")  # a qualified node names its cluster
    reclaimed(cluster="cloud", node="s0")
    reclaimed(node="sim-h100-000")  # the implicit cluster
    JobEvent.objects.create(job=job, at=timezone.now(), kind="preempted", attempt=1,
                            data={"rule": "R1"})  # not a reclamation
    text = _scrape()
    assert 'fairq_spot_reclaimed_total{cluster="cloud"} 3.0' in text
    assert 'fairq_spot_reclaimed_total{cluster=""} 1.0' in text
    assert 'fairq_spot_reclaimed_total{cluster="onprem"}' not in text


def test_k8_a_drained_cluster_exports_no_reachability(world: World) -> None:
    """Rule K8: the scheduler reads a drained cluster no more; what it recorded last (lab
    was unreachable) is no alert. A draining one is still read: its series stays."""
    from queueing.models import Cluster

    clusters = three_clusters(world)
    Cluster.objects.filter(pk=clusters["lab"].pk).update(enabled=False,
                                                          drained_at=timezone.now())
    Cluster.objects.filter(pk=clusters["cloud"].pk).update(enabled=False)
    text = _scrape()
    assert 'fairq_cluster_reachable{cluster="lab"}' not in text
    assert 'fairq_cluster_reachable{cluster="cloud"} 1.0' in text
