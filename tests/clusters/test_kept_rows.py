"""The cycle's kept active jobs carry the cluster columns (docs/architecture.md, "The
incremental snapshot"): after the first read, a refresh reads only the changed rows and
they bring their cluster, pin, selector and spot opt-in with them; an edited cluster
counts at once. Committed rows on PostgreSQL (`transaction=True`)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from queueing.models import Job
from queueing.selectors.active_jobs import ActiveJobs, cycle_active_jobs, cycle_active_jobs_forget
from queueing.selectors.snapshot import build_snapshot
from queueing.services.clusters import fleet_open
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World

from .conftest import MakeCluster, queued

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    cycle_active_jobs_forget()
    yield
    cycle_active_jobs_forget()


def test_the_kept_rows_carry_each_jobs_cluster_and_its_pin_as_a_full_read_does(
        world: World, make_cluster: MakeCluster) -> None:
    make_cluster("onprem", "1x8xh100", labels={"tier": "gold"})
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10, labels={"tier": "gold"})
    now = timezone.now()
    running = queued(world, gpu_type=world.a100)
    scheduler_cycle(now=now)
    assert cycle_active_jobs().last.full is False  # kept from the cycle's first read
    pinned = queued(world, gpu_type=world.h100, cluster_selector={"tier": "gold"},
                    allow_spot=True, tier=world.critical)

    jobs = cycle_active_jobs()

    assert jobs.last.full is False and pinned.pk in jobs.last.changed
    row = jobs.holding[running.pk]
    assert row.cluster_id == cloud.pk
    kept = jobs.queued[pinned.pk]
    assert (kept.cluster_selector, kept.allow_spot) == ({"tier": "gold"}, True)
    full = ActiveJobs()
    full.refresh()
    assert full.holding[running.pk] == row and full.queued[pinned.pk] == kept

    def snapshot_of(active: ActiveJobs) -> tuple[object, object]:
        snap = build_snapshot(backend=fleet_open(), now=now + timedelta(seconds=1),
                              jobs=active, live_workloads=set())
        return ({q.id: (q.clusters, q.spot_ok) for q in snap.queued},
                {r.id: (r.cluster, r.nodes) for r in snap.running})

    assert snapshot_of(jobs) == snapshot_of(full) == (
        {pinned.pk: (frozenset({"onprem", "cloud"}), True)},
        {running.pk: ("cloud", (f"cloud/{Job.objects.get(pk=running.pk).placement[0]}",))})

    # The cloud loses the label: the next refresh's lookups change, and so does the plan.
    cloud.labels = {"tier": "silver"}
    cloud.save()
    jobs = cycle_active_jobs()
    assert jobs.last.full is False
    assert snapshot_of(jobs)[0] == {pinned.pk: (frozenset({"onprem"}), True)}
