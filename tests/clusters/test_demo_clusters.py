"""The demo's three simulated clusters (docs/clusters.md, "The demo"): seeded as rows,
with jobs flowing into each of them."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db.models import Count
from django.utils import timezone

from queueing.models import Cluster, Job, NodePool
from queueing.services.demo import demo_clusters_seed, demo_seed, demo_submit_synthetic
from queueing.services.scheduler import scheduler_cycle

pytestmark = pytest.mark.django_db


def test_the_demo_seeds_three_clusters_once_and_runs_jobs_in_each() -> None:
    demo_seed()
    demo_clusters_seed()
    demo_clusters_seed()  # twice: brought back to shape, nothing doubled
    assert list(Cluster.objects.values_list("name", "cost_rank")) == [
        ("onprem", 0), ("cloud-spot", 5), ("cloud", 10)]
    (pool,) = NodePool.objects.all()
    assert (pool.cluster.name, pool.gpu_type.slug, pool.spot) == ("cloud-spot", "a100", True)

    rng = random.Random(5)
    t0 = timezone.now()
    for i in range(6):
        now = t0 + timedelta(seconds=3 * i)
        demo_submit_synthetic(rng=rng, per_team_queue=12)
        scheduler_cycle(now=now)

    per_cluster = dict(Job.objects.filter(cluster__isnull=False).values_list(
        "cluster__name").annotate(n=Count("id")).values_list("cluster__name", "n"))
    assert set(per_cluster) == {"onprem", "cloud-spot", "cloud"}
