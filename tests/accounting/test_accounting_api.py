"""GET /api/v1/accounting/: attempts like sacct, scoped to the caller's teams."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import World

from .history import seed


@pytest.fixture
def history(world: World) -> dict[str, Any]:
    return seed(world)


def get(world: World, who: Any, **params: Any) -> Any:
    return world.client(who).get("/api/v1/accounting/", params)


def keys(r: Any) -> list[tuple[int, int]]:
    return [(row["job_id"], row["attempt"]) for row in r.json()["results"]]


def test_a_member_sees_their_teams_attempts_running_first(world: World,
                                                          history: dict[str, Any]) -> None:
    r = get(world, world.member)
    assert r.status_code == 200, r.content
    j1, j2, j4 = history["j1"].pk, history["j2"].pk, history["j4"].pk
    assert keys(r) == [(j4, 1), (j2, 1), (j1, 2), (j1, 1)]
    rows = {(x["job_id"], x["attempt"]): x for x in r.json()["results"]}
    live = rows[(j4, 1)]
    assert live["state"] == "RUNNING" and live["end"] is None
    assert 1790 <= live["elapsed_seconds"] <= 1900
    assert live["efficiency"] == 0.03
    assert rows[(j1, 1)]["state"] == "PREEMPTED"
    assert rows[(j1, 1)]["reason"] == "preempted by job 99"
    assert rows[(j1, 1)]["exit_code"] is None  # the job's exit code is the last attempt's
    assert rows[(j1, 1)]["gpu_hours"] == 4.0 and rows[(j1, 1)]["elapsed_seconds"] == 7200
    assert rows[(j1, 1)]["sm_mean"] is None and rows[(j1, 1)]["efficiency"] is None
    ok = rows[(j1, 2)]
    assert (ok["state"], ok["exit_code"], ok["gpu_hours"], ok["sm_mean"], ok["efficiency"]) == \
        ("SUCCEEDED", 0, 6.0, 80.0, 0.8)
    assert (ok["user"], ok["team"], ok["gpu_type"], ok["tier"], ok["gpus"]) == \
        ("alice", "vision", "h100", "normal", 2)
    assert rows[(j2, 1)]["state"] == "FAILED" and rows[(j2, 1)]["exit_code"] == 137


def test_it_hides_other_teams_attempts(world: World, history: dict[str, Any]) -> None:
    assert keys(get(world, world.outsider)) == [(history["j3"].pk, 1)]
    r = get(world, world.outsider, team="vision")
    assert r.status_code == 404


def test_staff_see_every_team(world: World, history: dict[str, Any]) -> None:
    assert len(keys(get(world, world.staff))) == 5
    assert keys(get(world, world.staff, team="nlp")) == [(history["j3"].pk, 1)]


def test_it_filters_by_user_state_gpu_type_and_time(world: World,
                                                    history: dict[str, Any]) -> None:
    j1, j2, j4 = history["j1"].pk, history["j2"].pk, history["j4"].pk
    assert keys(get(world, world.admin, user="dave")) == [(j4, 1), (j2, 1)]
    assert keys(get(world, world.admin, state="FAILED")) == [(j2, 1)]
    assert keys(get(world, world.admin, state="running")) == [(j4, 1)]
    assert keys(get(world, world.admin, state="PREEMPTED,SUCCEEDED")) == [(j1, 2), (j1, 1)]
    assert keys(get(world, world.admin, gpu_type="h100")) == [(j1, 2), (j1, 1)]
    # Attempts overlapping [from, to): the first day's two attempts of j1 only.
    r = get(world, world.admin, **{"from": "2026-10-01T01:00:00+00:00",
                                   "to": "2026-10-02T00:00:00Z"})
    assert keys(r) == [(j1, 2), (j1, 1)]
    r = get(world, world.admin, **{"from": "2026-10-01T05:59:59+00:00"})
    assert keys(r) == [(j4, 1), (j2, 1), (j1, 2)]


@pytest.mark.parametrize(("params", "field"), [
    ({"from": "yesterday"}, "from"),
    ({"to": "2026-10-01T00:00:00"}, "to"),  # no offset
    ({"from": "2026-10-02T00:00:00Z", "to": "2026-10-01T00:00:00Z"}, "from"),
    ({"state": "DONE"}, "state"),
    ({"page_size": "0"}, "page_size"),
    ({"offset": "-1"}, "offset"),
])
def test_bad_filters_are_a_400_on_the_field(world: World, params: dict[str, str],
                                            field: str) -> None:
    r = get(world, world.member, **params)
    assert r.status_code == 400, r.content
    assert field in r.json()["error"]["fields"]


def test_pages_follow_next_without_gaps_or_repeats(world: World,
                                                   history: dict[str, Any]) -> None:
    c = world.client(world.staff)
    seen: list[tuple[int, int]] = []
    page = c.get("/api/v1/accounting/", {"page_size": 2}).json()
    assert page["previous"] is None
    pages = 1
    while True:
        seen += [(x["job_id"], x["attempt"]) for x in page["results"]]
        if not page["next"]:
            break
        page = c.get(page["next"]).json()
        assert page["previous"]
        pages += 1
    assert pages == 3
    assert seen == keys(get(world, world.staff))
    assert len(set(seen)) == 5
