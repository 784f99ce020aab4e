"""One plan of the queue answers every "why does my job wait" (queueing/selectors/
queue_plan.py): the API, the CLI and the dashboard read the same cached plan, a job newer
than the plan gets a fresh one, and a scheduler cycle that moved jobs drops it."""

from __future__ import annotations

from typing import Any
from unittest import mock

from django.core.cache import cache
from django.utils import timezone

from queueing.policy import admission
from queueing.selectors import queue_plan as qp
from queueing.selectors.queue_plan import team_queue
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body


def _submit(world: World, user: Any = None, **overrides: Any) -> int:
    r = world.client(user or world.member).post("/api/v1/jobs/", job_body(**overrides),
                                                 format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def _queue(world: World, job_id: int) -> dict[str, Any]:
    r = world.client(world.member).get(f"/api/v1/jobs/{job_id}/")
    assert r.status_code == 200
    return dict(r.json()["queue"])


def _count_plans() -> Any:
    return mock.patch.object(qp, "plan_admissions", wraps=admission.plan_admissions)


def test_pollers_of_many_queued_jobs_share_one_plan(world: World) -> None:
    ids = [_submit(world, name=f"j{i}", gpus=8, tier="low") for i in range(4)]
    ids += [_submit(world, name="big", gpus=8, replicas=2)]  # the whole cluster: 16 GPUs
    with _count_plans() as plans:
        answers = [_queue(world, i) for i in ids]
        assert plans.call_count == 1  # not one plan per GET
    # The normal-tier gang before the low-tier jobs (rule P2), each place once.
    assert [a["position"] for a in answers] == [2, 3, 4, 5, 1]
    assert {a["queued"] for a in answers} == {5}


def test_a_job_newer_than_the_cached_plan_gets_a_fresh_one(world: World) -> None:
    first = _submit(world, name="first")
    assert _queue(world, first)["position"] == 1
    second = _submit(world, name="second")
    with _count_plans() as plans:
        q = _queue(world, second)
        assert plans.call_count == 1
    assert q["position"] == 2 and q["ahead"] == 1


def test_a_cycle_that_admits_drops_the_plan(world: World) -> None:
    job = _submit(world, name="fits")
    assert _queue(world, job)["reasons"][0]["code"] == "next_cycle"
    assert cache.get(qp._PLAN_KEY) is not None
    result = scheduler_cycle(now=timezone.now())
    assert job in result.admitted
    assert cache.get(qp._PLAN_KEY) is None


def test_the_api_and_the_dashboard_word_a_wait_the_same(world: World, settings: Any) -> None:
    settings.FAIRQ_SIM_NODES = "4x8xh100,2x8xa100,1x7xmig-1g-10gb"  # 32 h100 GPUs
    _submit(world, world.outsider, team="nlp", gpus=8, tier="high", name="ahead")
    mine = _submit(world, gpus=8, replicas=3, name="gang")  # 24 GPUs: more than any quota
    api = _queue(world, mine)
    rows, _ = team_queue(team=world.vision, now=timezone.now())
    row = next(r for r in rows if r.job.pk == mine)
    assert row.position == api["position"] == 2
    assert row.reason == "; ".join(r["message"] for r in api["reasons"])
    assert [r["code"] for r in api["reasons"]][-1] == "jobs_ahead"
    assert api["reasons"][-1]["message"] == "1 job ahead of it for h100 GPUs (1 in the whole queue)"


def test_an_unreachable_cluster_is_a_reason_not_an_error(world: World) -> None:
    job = _submit(world)
    with mock.patch.object(qp, "build_snapshot",
                           side_effect=ConnectionError("connection refused")):
        q = _queue(world, job)
    assert q["position"] is None
    assert q["reasons"] == [{"code": "cluster_unreachable",
                             "message": "the cluster did not answer: connection refused"}]
