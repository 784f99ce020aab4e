"""Rule K2: among the allowed clusters where the job fits now, the lowest cost rank,
then the most free GPUs of its type, then the name."""

from __future__ import annotations

import pytest

from queueing.policy.admission import plan_admissions

from .clusters_world import job, pool, snap


@pytest.mark.parametrize(("ranks", "expected"), [
    ({}, "b"),  # same rank: b has the most free h100s (3 nodes against 2)
    ({"a": 0, "b": 1}, "a"),  # a cheaper rank wins over more free GPUs
    ({"a": 1, "b": 1, "c": 0}, "c"),  # c cheapest, though the smallest
])
def test_it_takes_the_lowest_rank_then_the_least_loaded(ranks: dict[str, int],
                                                        expected: str) -> None:
    nodes = pool("a", "h100", 2) + pool("b", "h100", 3) + pool("c", "h100", 1)
    plan = plan_admissions(snap(nodes, [job(1)], ranks=ranks))
    assert plan.admissions[0].cluster == expected


def test_ties_in_rank_and_free_gpus_go_by_name() -> None:
    nodes = pool("zeta", "h100", 2) + pool("alpha", "h100", 2)
    plan = plan_admissions(snap(nodes, [job(1)]))
    assert plan.admissions[0].cluster == "alpha"


def test_a_cluster_where_it_does_not_fit_now_is_skipped_whatever_its_rank() -> None:
    nodes = pool("onprem", "h100", 2, free=4) + pool("cloud", "h100", 1)
    plan = plan_admissions(snap(nodes, [job(1)], ranks={"onprem": 0, "cloud": 5}))
    assert plan.admissions[0].cluster == "cloud"


def test_free_gpus_are_counted_live_so_jobs_spread_over_equal_clusters() -> None:
    # Two equal clusters, four 8-GPU jobs: each admission makes its cluster the more
    # loaded one, so they alternate (least loaded first).
    nodes = pool("a", "h100", 2) + pool("b", "h100", 2)
    plan = plan_admissions(snap(nodes, [job(i) for i in range(1, 5)]))
    assert [a.cluster for a in plan.admissions] == ["a", "b", "a", "b"]


def test_only_the_clusters_the_job_allows_are_candidates() -> None:
    nodes = pool("a", "h100", 2) + pool("b", "h100", 3)
    plan = plan_admissions(snap(nodes, [job(1, clusters={"a"}), job(2, clusters={"a", "b"})],
                                ranks={"b": 0, "a": 0}))
    by_id = {a.job_id: a.cluster for a in plan.admissions}
    assert by_id == {1: "a", 2: "b"}


def test_a_nominated_preemptor_goes_where_its_preemption_made_room() -> None:
    # Rule A5: its victims were in b; a is cheaper and has room too by now.
    nodes = pool("a", "h100", 1) + pool("b", "h100", 1)
    plan = plan_admissions(snap(nodes, [job(1)], ranks={"a": 0, "b": 1}, nominated={1: 0},
                                nominated_placement={1: ("b/n-h100-0",)}))
    assert plan.admissions[0].cluster == "b"
