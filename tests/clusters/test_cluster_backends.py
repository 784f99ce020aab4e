"""Each cluster's backend built from its row (docs/clusters.md), and the simulated
cluster's node pools: spot nodes (rules K4, K6), node names unique in a cluster."""

from __future__ import annotations

import pytest

from queueing.backends.simulated import SimulatedCluster, SimulatedClusterError, parse_node_spec
from queueing.composition import get_backend, reset_backends
from queueing.models import NodePool
from queueing.selectors.cluster import clusters_facts, node_pool
from tests.conftest import World

from .conftest import MakeCluster


def test_a_spot_marker_makes_a_pool_of_spot_nodes_numbered_after_the_first_pool() -> None:
    nodes = SimulatedCluster.from_spec("2x8xa100,1x8xa100:spot,1x8xh100:spot@rack=1").nodes()
    assert [(n.name, n.gpu_type, n.spot) for n in nodes] == [
        ("sim-a100-000", "a100", False), ("sim-a100-001", "a100", False),
        ("sim-a100-002", "a100", True), ("sim-h100-000", "h100", True)]
    assert len({n.name for n in nodes}) == len(nodes)
    (pool,) = parse_node_spec("4x8xa100:96c:1Ti:spot")
    assert (pool.count, pool.cpu_millicores, pool.spot) == (4, 96_000, True)


@pytest.mark.parametrize("spec", ["2x8xa100:spotty", "2x8xa100@rack=2:spot", "2x8xa100:spot:spot"])
def test_a_misplaced_spot_marker_is_refused_with_the_grammar(spec: str) -> None:
    with pytest.raises(SimulatedClusterError, match=r"\[:spot\]"):
        parse_node_spec(spec)


@pytest.mark.django_db
def test_a_clusters_backend_is_built_from_its_row_and_rebuilt_when_its_nodes_change(
        make_cluster: MakeCluster) -> None:
    cloud = make_cluster("cloud", "1x8xa100")
    first = get_backend(cloud)
    assert [n.name for n in first.nodes()] == ["sim-a100-000"]
    cloud.cost_rank = 20  # not a connection field: the same instance
    cloud.save()
    assert get_backend(cloud) is first
    closed: list[bool] = []
    first.close = lambda: closed.append(True)  # type: ignore[attr-defined]  # as Kubernetes'
    cloud.sim_nodes = "2x8xa100"
    cloud.save()
    second = get_backend(cloud)
    assert second is not first and len(second.nodes()) == 2
    assert closed == [True]  # the old one's watches and connections are let go
    assert get_backend("default") is not second  # the implicit cluster is apart
    reset_backends()
    assert get_backend(cloud) is not second


@pytest.mark.django_db
def test_a_nodes_pool_is_the_one_of_its_gpu_type_whose_labels_it_carries(
        world: World, make_cluster: MakeCluster) -> None:
    cloud = make_cluster("cloud", "2x8xa100")
    NodePool.objects.create(cluster=cloud, name="ondemand", gpu_type=world.a100)
    NodePool.objects.create(cluster=cloud, name="spot", gpu_type=world.a100, spot=True,
                            node_labels={"cloud.google.com/gke-spot": "true"})
    facts = clusters_facts()[cloud.pk]
    assert node_pool(facts, gpu_type="a100").name == "ondemand"  # type: ignore[union-attr]
    spot = node_pool(facts, gpu_type="a100", labels={"cloud.google.com/gke-spot": "true"})
    assert spot is not None and spot.spot
    assert node_pool(facts, gpu_type="h100") is None
