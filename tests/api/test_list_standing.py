"""Rule E5 (docs/scheduling.md): `GET /api/v1/jobs/` carries, for each queued job, its
`position`, `jobs_ahead` (of its GPU type, rule E1) and `reason` {code, message, until?}
from the one cached plan of the queue: watching N jobs is one request and a constant
number of queries, whatever N. Also `Location` on every 201 and `/capacity/`'s nodes."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queueing.models import Job
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body


def _submit(world: World, user: Any = None, **overrides: Any) -> int:
    r = world.client(user or world.member).post("/api/v1/jobs/", job_body(**overrides),
                                                 format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def _list(client: Any, query: str = "") -> dict[int, dict[str, Any]]:
    r = client.get(f"/api/v1/jobs/?status=QUEUED{query}")
    assert r.status_code == 200, r.content
    return {j["id"]: j for j in r.json()["results"]}


def test_rule_e5_the_list_carries_position_jobs_ahead_and_reason_as_the_detail_does(
        world: World) -> None:
    # Fill both h100 nodes (2 x 8) for nlp, then queue three vision jobs.
    _submit(world, world.outsider, team="nlp", gpus=8, name="big-a")
    _submit(world, world.outsider, team="nlp", gpus=8, name="big-b")
    scheduler_cycle(now=timezone.now())
    first = _submit(world, gpus=4, name="waits-first")
    other_type = _submit(world, gpus=1, gpu_type="a100", name="fits-a100")
    second = _submit(world, gpus=2, name="waits-second")
    client = world.client(world.member)
    listed = _list(client)
    assert set(listed) == {first, other_type, second}
    for job_id, item in listed.items():
        detail = client.get(f"/api/v1/jobs/{job_id}/").json()["queue"]
        assert item["position"] == detail["position"]
        assert item["jobs_ahead"] == detail["jobs_ahead"]
        assert item["reason"] == detail["reason"] == detail["reasons"][0]
    assert listed[first]["reason"]["code"] in {"capacity", "preempting"}  # R2 may reclaim
    assert listed[first]["jobs_ahead"] == 0
    # Rule E1: the a100 job ahead of it does not count; the h100 job does.
    assert listed[second]["position"] == 3 and listed[second]["jobs_ahead"] == 1
    assert listed[other_type]["reason"]["code"] == "next_cycle"
    assert listed[other_type]["jobs_ahead"] == 0


def test_rule_e5_jobs_that_are_not_queued_carry_nulls(world: World) -> None:
    job_id = _submit(world, gpus=1)
    scheduler_cycle(now=timezone.now())
    assert Job.objects.get(pk=job_id).status != "QUEUED"
    (item,) = world.client(world.member).get("/api/v1/jobs/").json()["results"]
    assert (item["position"], item["jobs_ahead"], item["reason"]) == (None, None, None)


def test_rule_e5_listing_n_queued_jobs_costs_the_same_queries_as_listing_two(
        world: World) -> None:
    _submit(world, world.outsider, team="nlp", gpus=8, name="big-a")
    _submit(world, world.outsider, team="nlp", gpus=8, name="big-b")
    scheduler_cycle(now=timezone.now())
    client = world.client(world.member)

    def queries_of_a_warm_list() -> tuple[int, int]:
        listed = _list(client)  # plans the queue once (a new job is not in the cached plan)
        assert all(j["position"] is not None and j["reason"] for j in listed.values())
        with CaptureQueriesContext(connection) as ctx:
            assert len(_list(client)) == len(listed)
        return len(listed), len(ctx.captured_queries)

    for i in range(2):
        _submit(world, gpus=4, name=f"few-{i}")
    few, few_queries = queries_of_a_warm_list()
    for i in range(18):
        _submit(world, gpus=4, name=f"many-{i}")
    many, many_queries = queries_of_a_warm_list()
    assert (few, many) == (2, 20)
    assert many_queries == few_queries, (few_queries, many_queries)


def test_rule_e5_a_job_newer_than_the_cached_plan_gets_a_position_at_once(
        world: World) -> None:
    client = world.client(world.member)
    a = _submit(world, gpus=1, name="a")
    assert _list(client)[a]["position"] == 1  # the plan is cached now
    b = _submit(world, gpus=1, name="b")
    listed = _list(client)
    assert listed[b]["position"] == 2 and listed[b]["jobs_ahead"] == 1


def test_rule_e5_the_label_filter_and_the_standing_go_together(world: World) -> None:
    keep = _submit(world, gpus=1, name="keep", labels={"pipeline": "nightly"})
    _submit(world, gpus=1, name="drop", labels={"pipeline": "adhoc"})
    listed = _list(world.client(world.member), "&label=pipeline=nightly")
    assert set(listed) == {keep} and listed[keep]["position"] == 1


def test_every_201_names_the_created_resource_in_location(world: World) -> None:
    member, staff = world.client(world.member), world.client(world.staff)
    r = member.post("/api/v1/jobs/", job_body(gpus=1), format="json")
    assert r.status_code == 201 and r["Location"] == f"/api/v1/jobs/{r.json()['id']}/"
    assert member.get(r["Location"]).json()["id"] == r.json()["id"]
    r = member.post("/api/v1/jobs/bulk/", {**job_body(gpus=1, name="arr"), "count": 3},
                    format="json")
    assert r.status_code == 201 and r["Location"] == f"/api/v1/arrays/{r.json()['array_id']}/"
    assert member.get(r["Location"]).json()["count"] == 3
    created: list[tuple[Any, str, dict[str, Any]]] = [
        (staff, "/api/v1/teams/", {"slug": "audio", "name": "Audio"}),
        (staff, "/api/v1/quotas/", {"team": "speech", "gpu_type": "mig-1g-10gb",
                                    "nominal": 1}),
        (staff, "/api/v1/gpu-prices/", {"gpu_type": "h100", "effective_from": "2026-01-01",
                                        "price_per_gpu_hour": "2.50"}),
        (staff, "/api/v1/budgets/", {"team": "speech", "monthly_amount": "100.00",
                                     "policy": "none"}),
        (world.client(world.admin), "/api/v1/teams/vision/members/",
         {"username": world.outsider.username, "role": "member"}),
        (member, "/api/v1/tokens/", {"name": "ci"}),
    ]
    for client, url, body in created:
        r = client.post(url, body, format="json")
        assert r.status_code == 201, (url, r.content)
        location = r["Location"]
        assert location.startswith(url.split("members/")[0]), (url, location)
        # A route of the API (GET, or DELETE only for tokens and prices), never a 404.
        assert client.get(location).status_code in {200, 405}, (url, location)


def test_capacity_lists_each_node_with_its_free_gpus_and_type(world: World) -> None:
    _submit(world, gpus=3)
    scheduler_cycle(now=timezone.now())
    rows = {r["gpu_type"]: r for r in
            world.client(world.member).get("/api/v1/capacity/").json()}
    h100 = rows["h100"]
    assert len(h100["by_node"]) == h100["nodes"] == 2
    assert sum(n["free"] for n in h100["by_node"]) == h100["free"] == 13
    assert sorted(n["free"] for n in h100["by_node"]) == [5, 8]
    assert {n["gpu_type"] for n in h100["by_node"]} == {"h100"}
    assert all(n["capacity"] == 8 and n["name"] for n in h100["by_node"])
