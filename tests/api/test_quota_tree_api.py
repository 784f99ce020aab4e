"""`GET /api/v1/quota-tree/` (docs/api.md, "Quota tree"): every figure of a 3-level tree
with borrowing and lending, worked out by hand below from docs/scheduling.md, "Quotas in
a tree" (rule Q9 for `lent`).

The fleet: 16 nodes of 8 h100 = 128. The tree (h100 nominals; `lang` has no row: its
nominal is its children's sum):

    research 64           (own pool 64 - 16 - 32 = 16)
      vision 16, lends at most 4 (so it keeps 12)   holds 2
      lang (32)
        nlp 8, borrows at most 12                   holds 20
        speech 24                                   holds 10
    ops 40                                          holds 70
    (unassigned: 128 - 64 - 40 = 24)

- nlp borrows 12 beyond its 8; inside lang, whose own part is 0, that comes from
  speech's unused 14: speech lent 12 (a sibling first).
- ops borrows 30: 24 from the unassigned capacity, 6 from research (its own pool is
  unused): research lent 6, none of its teams.
- the root: subtree quota 24 + (52 - 0) + (40 - 0) = 116, usage 30 + 70 = 100 (vision's
  2 are inside its kept 12): 16 available to anyone; vision 10 of its own kept part
  more (26); nlp 0 (8 + 12 held).
"""

from __future__ import annotations

from typing import Any

import pytest

from accounts.models import Team
from queueing.models import Quota
from queueing.policy.states import JobState
from tests.conftest import World
from tests.factories import JobFactory, QuotaFactory, TeamFactory, UserFactory

pytestmark = pytest.mark.django_db


def three_level_tree(world: World, settings: Any) -> dict[str, Team]:
    """The tree of the module's docstring, its jobs running (shared by the web, CLI and
    write-time tests)."""
    settings.FAIRQ_SIM_NODES = "16x8xh100,2x8xa100"
    research = TeamFactory(slug="research", name="Research")
    lang = TeamFactory(slug="lang", name="Language", parent=research)
    ops = TeamFactory(slug="ops", name="Operations")
    Team.objects.filter(pk=world.vision.pk).update(parent=research)
    Team.objects.filter(pk__in=[world.nlp.pk, world.speech.pk]).update(parent=lang)
    QuotaFactory(team=research, gpu_type=world.h100, nominal=64)
    QuotaFactory(team=ops, gpu_type=world.h100, nominal=40)
    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(
        nominal=16, borrowing_limit=None, lending_limit=4)
    Quota.objects.filter(team=world.nlp, gpu_type=world.h100).update(
        nominal=8, borrowing_limit=12)
    Quota.objects.filter(team=world.speech, gpu_type=world.h100).update(
        nominal=24, borrowing_limit=None)
    for team, gpus, replicas in ((world.vision, 2, 1), (world.nlp, 4, 5),
                                 (world.speech, 5, 2), (ops, 7, 10)):
        JobFactory(team=team, gpu_type=world.h100, gpus_per_replica=gpus,
                   replicas=replicas, tier=world.normal, status=JobState.RUNNING)
    return {"research": research, "lang": lang, "ops": ops}


def _figures(node: dict[str, Any]) -> tuple[Any, ...]:
    return (node["nominal"], node["has_quota_row"], node["borrowing_limit"],
            node["lending_limit"], node["held"], node["subtree_quota"], node["guaranteed"],
            node["borrowing"], node["lent"], node["available"])


def _by_team(nodes: list[dict[str, Any]], out: dict[str, dict[str, Any]] | None = None
             ) -> dict[str, dict[str, Any]]:
    out = {} if out is None else out
    for n in nodes:
        out[n["team"]] = n
        _by_team(n["children"], out)
    return out


def test_rule_q9_every_figure_of_a_three_level_tree(world: World, settings: Any) -> None:
    three_level_tree(world, settings)
    outsider = UserFactory(username="eve")  # in no team: figures are for everyone
    r = world.client(outsider).get("/api/v1/quota-tree/?gpu_type=h100")
    assert r.status_code == 200, r.content
    [h100] = r.json()
    assert {k: h100[k] for k in ("gpu_type", "capacity", "held", "unassigned", "available")} \
        == {"gpu_type": "h100", "capacity": 128, "held": 102, "unassigned": 24, "available": 16}
    # The shape: research > (vision, lang > (nlp, speech)); ops beside it.
    assert [n["team"] for n in h100["teams"]] == ["ops", "research"]
    research = h100["teams"][1]
    assert [c["team"] for c in research["children"]] == ["lang", "vision"]
    assert [c["team"] for c in research["children"][0]["children"]] == ["nlp", "speech"]
    assert research["is_department"] and research["children"][0]["is_department"]
    assert not research["children"][1]["is_department"]
    nodes = _by_team(h100["teams"])
    # (nominal, row, borrowing limit, lending limit, held, subtree quota, guaranteed,
    #  borrowing, lent, available)
    assert _figures(nodes["research"]) == (64, True, None, None, 32, 52, 0, 0, 6, 16)
    assert _figures(nodes["vision"]) == (16, True, None, 4, 2, 16, 12, 0, 0, 26)
    assert _figures(nodes["lang"]) == (32, False, None, None, 30, 32, 0, 0, 0, 16)
    assert _figures(nodes["nlp"]) == (8, True, 12, None, 20, 8, 0, 12, 0, 0)
    assert _figures(nodes["speech"]) == (24, True, None, None, 10, 24, 0, 0, 12, 16)
    assert _figures(nodes["ops"]) == (40, True, None, None, 70, 40, 0, 30, 0, 16)
    assert nodes["lang"]["name"] == "Language"


def test_every_type_by_default_and_a_type_without_quotas_is_an_empty_tree(
        world: World, settings: Any) -> None:
    three_level_tree(world, settings)
    r = world.client(world.member).get("/api/v1/quota-tree/")
    assert r.status_code == 200
    by_type = {t["gpu_type"]: t for t in r.json()}
    assert sorted(by_type) == ["a100", "h100", "mig-1g-10gb"]
    assert by_type["mig-1g-10gb"]["teams"] == [] and by_type["mig-1g-10gb"]["capacity"] == 0
    # a100: no department has a row, so research's nominal is the sum of its teams'.
    a100 = _by_team(by_type["a100"]["teams"])
    assert sorted(a100) == ["lang", "nlp", "research", "speech", "vision"]
    assert (a100["research"]["nominal"], a100["research"]["has_quota_row"],
            a100["lang"]["nominal"]) == (24, False, 16)
    assert by_type["a100"]["unassigned"] == 16 - 24


def test_a_fraction_of_a_shared_gpu_counts_its_share(world: World, ts: Any) -> None:
    JobFactory(team=world.vision, gpu_type=ts, gpus_per_replica=1, gpu_slices=1,
               tier=world.normal, status=JobState.RUNNING)
    r = world.client(world.member).get("/api/v1/quota-tree/?gpu_type=ts-a10")
    [tree] = r.json()
    [vision] = tree["teams"]
    assert (tree["capacity"], tree["held"], vision["nominal"], vision["held"],
            vision["available"]) == (4, 0.25, 2, 0.25, 3.75)


def test_an_unknown_gpu_type_is_a_400_and_anonymous_a_401(world: World) -> None:
    r = world.client(world.member).get("/api/v1/quota-tree/?gpu_type=nope")
    assert r.status_code == 400
    assert r.json()["error"]["fields"] == {
        "gpu_type": ["No GPU type 'nope': GET /api/v1/gpu-types/ lists them."]}
    from rest_framework.test import APIClient
    assert APIClient().get("/api/v1/quota-tree/").status_code in (401, 403)


def test_the_schema_documents_the_tree(world: World) -> None:
    r = world.client(world.member).get("/api/v1/schema/?format=json")
    assert r.status_code == 200
    schema = r.json()
    op = schema["paths"]["/api/v1/quota-tree/"]["get"]
    assert [p["name"] for p in op["parameters"]] == ["gpu_type"]
    node = schema["components"]["schemas"]["QuotaTreeNode"]
    assert {"lent", "borrowing", "subtree_quota", "guaranteed", "held", "available",
            "children"} <= set(node["properties"])
    assert node["properties"]["children"]["items"]["$ref"].endswith("/QuotaTreeNode")


def test_the_fleet_counts_a_team_inside_its_department_once(world: World,
                                                            settings: Any) -> None:
    """The board's "guaranteed" and its overcommit warning: the top-level nominals (a
    department's own row, or its teams' sum), never a team again beside its department."""
    from queueing.selectors.capacity import capacity_by_gpu_type, overcommit_warnings

    three_level_tree(world, settings)
    rows, _ = capacity_by_gpu_type()
    by_type = {r.gpu_type: r.guaranteed for r in rows}
    assert (by_type["h100"], by_type["a100"]) == (64 + 40, 8 + 8 + 8)
    assert overcommit_warnings(rows) == [
        "Guaranteed a100 quotas (24 GPUs) exceed the cluster's 16 a100 GPUs: not every team "
        "can get its nominal quota at once."]
