"""GET /api/v1/jobs/?label=key=value: a job's own labels filter the list,
repeated = all of them, on SQLite and PostgreSQL alike; a malformed filter is a 400."""

from __future__ import annotations

import pytest

from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db


def _names(world: World, query: str) -> list[str]:
    r = world.client(world.member).get(f"/api/v1/jobs/?{query}")
    assert r.status_code == 200, r.json()
    return sorted(j["name"] for j in r.json()["results"])


@pytest.fixture
def labelled(world: World) -> World:
    client = world.client(world.member)
    for name, labels in (("a", {"run": "exp-42", "owner": "cv"}), ("b", {"run": "exp-42"}),
                         ("c", {"run": "exp-43", "owner": "cv"}), ("d", {}),
                         ("e", {"a.b_c-d": "x.y_z-1"})):
        r = client.post("/api/v1/jobs/", job_body(name=name, labels=labels), format="json")
        assert r.status_code == 201, r.json()
    return world


def test_one_label_filters(labelled: World) -> None:
    assert _names(labelled, "label=run=exp-42") == ["a", "b"]
    assert _names(labelled, "label=owner=cv") == ["a", "c"]
    assert _names(labelled, "label=a.b_c-d=x.y_z-1") == ["e"]


def test_repeated_labels_must_all_match(labelled: World) -> None:
    assert _names(labelled, "label=run=exp-42&label=owner=cv") == ["a"]
    assert _names(labelled, "label=run=exp-43&label=owner=cv") == ["c"]
    assert _names(labelled, "label=run=exp-42&label=run=exp-43") == []


def test_an_empty_value_matches_only_an_empty_label(labelled: World) -> None:
    assert _names(labelled, "label=run=") == []


def test_it_combines_with_the_other_filters(labelled: World) -> None:
    assert _names(labelled, "label=run=exp-42&name=a") == ["a"]


def test_another_teams_jobs_stay_invisible(labelled: World) -> None:
    r = labelled.client(labelled.outsider).get("/api/v1/jobs/?label=run=exp-42")
    assert r.json()["results"] == []


@pytest.mark.parametrize("query", ["label=run", "label==x", "label=fairq.io/job-id=1",
                                   "label=%25s%25d", "label=%25(x)s=1", "label=%00=1",
                                   "label=run=exp 42", f"label=run={'x' * 64}",
                                   "&".join(["label=a=b"] * 17)])
def test_a_malformed_label_filter_is_a_400(labelled: World, query: str) -> None:
    r = labelled.client(labelled.member).get(f"/api/v1/jobs/?{query}")
    assert r.status_code == 400, r.json()
    assert "label" in r.json()["error"]["fields"]
