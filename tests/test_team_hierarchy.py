"""Rule F4: the team hierarchy is a forest. Writers refuse a parent cycle (Team.clean());
a cycle forced around them (raw SQL) makes its teams top-level in the fair-share
standings, deterministically, and nothing loops."""

from __future__ import annotations

import itertools
import signal
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import FrameType

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.utils import timezone

from accounts.models import Team
from queueing.policy.fairshare import (
    Accumulator,
    FairShareState,
    TeamUsageInput,
    compute_standings,
)
from queueing.selectors.fairshare import (
    fairshare_standings,
    fairshare_standings_at,
    standings_sorted,
)
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body
from tests.factories import TeamFactory, UserFactory

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def deadline() -> Iterator[None]:
    """Fail instead of hanging if something walks a cycle for ever."""
    def stop(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError("walked the parent cycle for more than 20 s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _chain(*slugs: str) -> list[Team]:
    """Teams where each is the parent of the next: _chain("a", "b") is a -> b."""
    teams: list[Team] = []
    for slug in slugs:
        teams.append(TeamFactory(slug=slug, parent=teams[-1] if teams else None))
    return teams


def _force_parent(team: Team, parent: Team) -> None:
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {Team._meta.db_table} SET parent_id = %s WHERE id = %s",
                    [parent.pk, team.pk])


# --- writers refuse a cycle -------------------------------------------------------------

# (chain top-down, the team whose parent changes, its new parent): each closes a cycle.
CYCLES = [
    pytest.param(("a",), "a", "a", id="self"),
    pytest.param(("a", "b"), "a", "b", id="2-cycle"),
    pytest.param(("a", "b", "c"), "a", "c", id="3-cycle"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("chain", "child", "parent"), CYCLES)
def test_model_clean_refuses_a_team_becoming_its_own_ancestor(
    chain: tuple[str, ...], child: str, parent: str
) -> None:
    _chain(*chain)
    team = Team.objects.get(slug=child)
    team.parent = Team.objects.get(slug=parent)
    with pytest.raises(ValidationError) as exc:
        team.full_clean()
    assert list(exc.value.message_dict) == ["parent"]


@pytest.mark.django_db
def test_model_clean_allows_moves_that_keep_a_forest() -> None:
    a, b, c = _chain("a", "b", "c")
    d = TeamFactory(slug="d")
    c.parent = a  # up a level
    c.full_clean()
    a.parent = d  # the root under a new root
    a.full_clean()
    b.parent = None
    b.full_clean()


@pytest.mark.django_db
def test_model_clean_terminates_on_a_cycle_already_in_the_database(deadline: None) -> None:
    a, b = _chain("a", "b")
    _force_parent(a, b)  # a <-> b, written around clean()
    below = TeamFactory(slug="below", parent=b)
    below.full_clean()  # not on the cycle: no error, no endless walk
    a.refresh_from_db()
    with pytest.raises(ValidationError):
        a.full_clean()  # on it: any edit of a asks for the cycle to be fixed


@pytest.mark.django_db
@pytest.mark.parametrize(("chain", "child", "parent"), CYCLES)
def test_the_admin_refuses_a_parent_cycle(chain: tuple[str, ...], child: str,
                                          parent: str) -> None:
    _chain(*chain)
    team = Team.objects.get(slug=child)
    su = UserFactory(username="su", is_staff=True, is_superuser=True)
    c = Client()
    c.force_login(su)
    r = c.post(f"/admin/accounts/team/{team.pk}/change/", {
        "slug": team.slug, "name": team.name, "weight": "1",
        "parent": Team.objects.get(slug=parent).pk,
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000",
    })
    assert r.status_code == 200  # the form again, with the error
    assert "own" in r.content.decode() and "errorlist" in r.content.decode()
    team.refresh_from_db()
    assert team.parent_id == (Team.objects.get(slug=chain[chain.index(child) - 1]).pk
                              if chain.index(child) else None)


@pytest.mark.parametrize(("chain", "child", "parent"), CYCLES)
def test_the_api_refuses_a_parent_cycle(world: World, chain: tuple[str, ...], child: str,
                                        parent: str) -> None:
    _chain(*chain)
    r = world.client(world.staff).patch(f"/api/v1/teams/{child}/", {"parent": parent},
                                        format="json")
    assert r.status_code == 400, r.content
    assert list(r.json()["error"]["fields"]) == ["parent"]
    before = chain[chain.index(child) - 1] if chain.index(child) else None
    assert Team.objects.get(slug=child).parent == (
        Team.objects.get(slug=before) if before else None)


# --- fair share on a cycle forced into the database -------------------------------------


@pytest.mark.parametrize("cycle", [("a",), ("a", "b"), ("a", "b", "c")])
def test_hierarchy_cycles_finds_exactly_the_teams_on_a_cycle(cycle: tuple[str, ...]) -> None:
    from queueing.policy.fairshare import forest_parents, hierarchy_cycles

    parent: dict[str, str | None] = {t: cycle[(i + 1) % len(cycle)] for i, t in enumerate(cycle)}
    parent |= {"tail": "a", "root": None, "lost": "nope"}
    assert hierarchy_cycles(parent) == frozenset(cycle)
    for order in itertools.permutations(parent):
        got = forest_parents({t: parent[t] for t in order})
        assert got == {**dict.fromkeys(cycle), "tail": "a", "root": None, "lost": None}


def test_standings_and_state_on_a_cycle_are_flat_for_its_teams(deadline: None) -> None:
    def inputs(order: list[str]) -> list[TeamUsageInput]:
        parent = {"a": "b", "b": "a", "a-child": "a"}
        usage = {"a": 3.0, "b": 1.0, "a-child": 2.0}
        return [TeamUsageInput(team=t, weight=1.0, accumulator=Accumulator(usage[t], T0),
                               parent=parent[t]) for t in order]

    results = [compute_standings(inputs(list(o)), now=T0, half_life_hours=24)
               for o in itertools.permutations(["a", "b", "a-child"])]
    assert all(r == results[0] for r in results)  # whatever the input order
    st = results[0]
    assert (st["a"].parent, st["b"].parent, st["a-child"].parent) == (None, None, "a")
    assert st["a"].usage == 5.0 and st["b"].usage == 1.0  # a's subtree holds a-child
    state = FairShareState(usage={"a": 5.0, "b": 1.0, "a-child": 2.0},
                           share={t: s.share for t, s in st.items()},
                           parent={"a": "b", "b": "a", "a-child": "a"},
                           level_share={t: s.level_share or 0.0 for t, s in st.items()})
    for t, s in st.items():
        assert state.factor(t) == pytest.approx(s.factor)


def test_standings_sorted_lists_each_team_of_a_cycle_once(deadline: None) -> None:
    st = compute_standings([TeamUsageInput(team=t, weight=1.0, accumulator=Accumulator(0.0, T0))
                            for t in ("a", "b", "c")], now=T0, half_life_hours=24)
    cyclic = {"a": replace(st["a"], parent="b"), "b": replace(st["b"], parent="a"),
              "c": replace(st["c"], parent="a")}
    assert [s.team for s in standings_sorted(cyclic)] == ["a", "c", "b"]


def test_fair_share_and_scheduling_survive_a_raw_sql_cycle(world: World, deadline: None) -> None:
    """vision -> nlp -> vision forced in the database, speech below vision: the standings
    list every team once, the cycle's teams top-level, and a scheduling cycle admits."""
    world.speech.parent = world.vision
    world.speech.save()
    _force_parent(world.vision, world.nlp)
    _force_parent(world.nlp, world.vision)
    now = timezone.now()
    for st in (fairshare_standings(now=now), fairshare_standings_at(at=now - timedelta(hours=1),
                                                                      now=now)):
        assert {t: s.parent for t, s in st.items()} == {"vision": None, "nlp": None,
                                                         "speech": "vision"}
        assert [s.team for s in standings_sorted(st)] == ["nlp", "vision", "speech"]
    r = world.client(world.member).post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201, r.content
    assert scheduler_cycle(now=now).admitted == [r.json()["id"]]
    rows = world.client(world.staff).get("/api/v1/fairshare/").json()["teams"]
    assert [(t["team"], t["parent"]) for t in rows] == [("nlp", None), ("vision", None),
                                                        ("speech", "vision")]
