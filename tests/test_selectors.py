"""The read side (queueing/selectors/): one implementation of capacity and of "GPUs
held" for every caller, standings inputs built once, and the submit preview placed
against the cached plan's snapshot instead of a snapshot rebuilt per keystroke."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

from django.utils import timezone

from queueing.backends.base import NodeInfo
from queueing.composition import get_backend
from queueing.policy import admission
from queueing.policy.states import JobState
from queueing.selectors import queue_plan as qp
from queueing.selectors.capacity import capacity_by_gpu_type, gpus_held, gpus_held_by_type
from queueing.selectors.dashboard import quota_board, quota_cell, team_quotas
from queueing.selectors.fairshare import (
    fairshare_inputs,
    fairshare_standings,
    fairshare_standings_at,
    team_usage_inputs,
)
from queueing.selectors.snapshot import build_snapshot

from .conftest import World
from .factories import JobFactory


def _held_world(world: World) -> None:
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
               gpus_per_replica=4, replicas=2, status=JobState.RUNNING)
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal,
               gpus_per_replica=2, status=JobState.ADMITTED)
    JobFactory(team=world.nlp, gpu_type=world.a100, tier=world.normal,
               gpus_per_replica=3, status=JobState.QUEUED)
    JobFactory(team=world.vision, gpu_type=world.a100, tier=world.normal,
               gpus_per_replica=5, status=JobState.SUCCEEDED)


def test_gpus_held_counts_admitted_and_running_jobs_per_team_and_type(world: World) -> None:
    _held_world(world)
    assert gpus_held() == {("vision", "h100"): 8, ("nlp", "h100"): 2}
    assert gpus_held(team=world.nlp) == {("nlp", "h100"): 2}
    assert gpus_held(team=world.vision, gpu_type=world.a100) == {}
    assert gpus_held_by_type() == {"h100": 10}


def test_capacity_rows_agree_with_gpus_held_and_the_nodes(world: World) -> None:
    _held_world(world)
    nodes = [NodeInfo("n1", "h100", 8, 6), NodeInfo("n2", "h100", 8, 0),
             NodeInfo("m1", "other", 4, 1)]
    rows, error = capacity_by_gpu_type(nodes=nodes)
    assert error == ""
    by_type = {r.gpu_type: r for r in rows}
    assert [r.gpu_type for r in rows] == sorted(by_type)
    assert set(by_type) == {"h100", "a100", "mig-1g-10gb", "other"}
    h100 = by_type["h100"]
    assert (h100.nodes, h100.capacity, h100.allocated, h100.free) == (2, 16, 6, 10)
    assert h100.held_by_jobs == 10 == sum(h100.by_team.values())
    assert h100.by_team == {"vision": 8, "nlp": 2}
    assert h100.guaranteed == 24 and h100.overcommitted
    assert by_type["a100"].queued_demand == 3 and by_type["a100"].held_by_jobs == 0


def test_k8_capacity_counts_a_draining_clusters_gpus_but_guarantees_only_the_open_ones(
        world: World) -> None:
    """Rule K8: a draining cluster's nodes are real capacity in use (its jobs hold them),
    but no nominal quota can be met there: the overcommit warning counts the rest."""
    from queueing.selectors.capacity import overcommit_warnings

    _held_world(world)  # 24 h100 GPUs guaranteed (tests/conftest.py's quotas)
    nodes = [NodeInfo("n1", "h100", 8, 0, cluster="onprem"),
             NodeInfo("n2", "h100", 8, 0, cluster="onprem"),
             NodeInfo("d1", "h100", 8, 8, cluster="old")]
    rows, _ = capacity_by_gpu_type(nodes=nodes, closed=frozenset({"old"}))
    h100 = {r.gpu_type: r for r in rows}["h100"]
    assert (h100.capacity, h100.allocated, h100.draining_capacity, h100.open_capacity) == (
        24, 8, 8, 16)
    assert {n["name"]: n["draining"] for n in h100.by_node} == {
        "d1": True, "n1": False, "n2": False}
    assert h100.guaranteed == 24 and h100.overcommitted
    assert overcommit_warnings([h100]) == [
        "Guaranteed h100 quotas (24 GPUs) exceed the cluster's 16 h100 GPUs that take new "
        "work (8 more are on draining clusters, rule K8): not every team can get its "
        "nominal quota at once."]
    rows, _ = capacity_by_gpu_type(nodes=nodes)  # nothing closed: all 24 take new work
    assert not {r.gpu_type: r for r in rows}["h100"].overcommitted


def test_the_quota_board_cells_and_team_quotas_read_the_same_gpus_held(world: World) -> None:
    _held_world(world)
    board = quota_board(now=timezone.now())
    cells = {(team.slug, c.gpu_type.slug): c.allocated
             for team, row, _ in board.rows for c in row}
    for (team, gpu_type), gpus in gpus_held().items():
        assert cells[(team, gpu_type)] == gpus
    assert quota_cell(team=world.vision, gpu_type=world.h100).allocated == 8
    assert {c.gpu_type.slug: c.allocated for c in team_quotas(team=world.nlp)} == {
        "h100": 2, "a100": 0}


def test_standings_now_and_at_now_come_from_the_same_inputs(world: World) -> None:
    now = timezone.now()
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
               status=JobState.RUNNING, started_at=now - timedelta(hours=1))
    inputs, _ = fairshare_inputs(now=now)
    assert {i.team: i.active for i in inputs} == {"vision": True, "nlp": False,
                                                  "speech": False}
    assert fairshare_standings_at(at=now, now=now) == fairshare_standings(now=now)


def test_team_usage_inputs_name_parents_by_slug_and_default_to_no_usage(world: World) -> None:
    now = timezone.now()
    inputs = team_usage_inputs(at=now, teams=[(1, "a", 1.0, None), (2, "b", 2.0, 1)],
                               banked={1: 3.0}, running={2: [(4.0, now)]}, active={2})
    a, b = inputs
    assert (a.team, a.parent, a.accumulator.value, a.running, a.active) == (
        "a", None, 3.0, (), False)
    assert (b.team, b.parent, b.accumulator.value, b.running, b.active) == (
        "b", "a", 0.0, ((4.0, now),), True)


def test_the_preview_reads_the_cached_plans_snapshot_and_caches_each_shape(
        world: World) -> None:
    now = timezone.now()
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal, gpus_per_replica=8)
    plan = qp.queue_plan(now=now)  # what "why it waits" reads
    with mock.patch.object(qp, "build_snapshot", wraps=build_snapshot) as snapshots, \
            mock.patch.object(qp, "plan_admissions", wraps=admission.plan_admissions) as plans:
        first = qp.submit_preview(team=world.vision, gpu_type=world.h100,
                                  gpus_per_replica=8, replicas=1, tier_rank=100, now=now)
        again = qp.submit_preview(team=world.vision, gpu_type=world.h100,
                                  gpus_per_replica=8, replicas=1, tier_rank=100, now=now)
        other = qp.submit_preview(team=world.vision, gpu_type=world.a100,
                                  gpus_per_replica=1, replicas=1, tier_rank=100, now=now)
    # The first preview kept the snapshot beside a fresh plan; the others read it, and
    # the same shape again plans nothing.
    assert snapshots.call_count == 1
    assert plans.call_count == 1 + 2
    assert first == again and first.queued == plan.queued == 1
    assert other.admitted_next and other.position is not None
    with mock.patch.object(qp, "build_snapshot", wraps=build_snapshot) as again_built:
        qp.submit_preview(team=world.nlp, gpu_type=world.h100, gpus_per_replica=1,
                          replicas=1, tier_rank=100, now=now)
        assert qp.queue_plan(now=now).generation == qp._plan_with_snapshot(now=now)[0].generation
    assert again_built.call_count == 0


def test_a_kept_snapshot_unpacks_to_the_same_snapshot(world: World) -> None:
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal, gpus_per_replica=8,
               status=JobState.RUNNING, placement=["h100-0"], started_at=timezone.now())
    JobFactory(team=world.vision, gpu_type=world.a100, tier=world.normal)
    snapshot = build_snapshot(backend=get_backend(), now=timezone.now())
    assert snapshot.queued and snapshot.running and snapshot.nodes
    assert qp._snapshot_unpack(qp._snapshot_pack(snapshot)) == snapshot


def test_the_preview_says_why_when_the_cluster_view_is_missing(world: World) -> None:
    with mock.patch.object(qp, "build_snapshot",
                           side_effect=ConnectionError("connection refused")):
        preview = qp.submit_preview(team=world.vision, gpu_type=world.h100,
                                    gpus_per_replica=1, replicas=1, tier_rank=100,
                                    now=timezone.now())
    assert preview.error == "connection refused" and preview.position is None


def test_forgetting_the_plan_drops_its_snapshot_too(world: World) -> None:
    now = timezone.now()
    qp.queue_plan(now=now)
    qp.queue_plan_forget()
    with mock.patch.object(qp, "build_snapshot", wraps=build_snapshot) as snapshots:
        qp.submit_preview(team=world.vision, gpu_type=world.h100, gpus_per_replica=1,
                          replicas=1, tier_rank=100, now=now)
    assert snapshots.call_count == 1
