"""`fairq quota-tree` (docs/cli.md): the quota tree as text, from GET /api/v1/quota-tree/ -
departments with their teams indented, a department without a row's nominal in
parentheses (its teams' sum), and the figures of rule Q9. The tree is
tests/api/test_quota_tree_api.py's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.test_quota_tree_api import three_level_tree
from tests.conftest import World

from .conftest import Cli

pytestmark = pytest.mark.django_db


def test_rule_q9_the_tree_as_text(cli: Cli, world: World, settings: Any) -> None:
    three_level_tree(world, settings)
    r = cli("quota-tree", "-G", "h100")
    assert r.code == 0, r.err
    assert r.out.splitlines() == [
        "h100: 102 of 128 in use, 16 available, 24 unassigned",
        "TEAM        NOMINAL  HELD  BORROWING  LENT  AVAILABLE  LIMITS",
        "ops         40       70    30         0     16         -",
        "research    64       32    0          6     16         -",
        "  lang      (32)     30    0          0     16         -",
        "    nlp     8        20    12         0     0          borrow<=12",
        "    speech  24       10    0          12    16         -",
        "  vision    16       2     0          0     26         lend<=4",
    ]


def test_every_type_json_and_a_wrong_type(cli: Cli, world: World, settings: Any) -> None:
    three_level_tree(world, settings)
    r = cli("quota-tree")
    assert r.code == 0, r.err
    blocks = r.out.split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == [
        "a100: 0 of 16 in use, 16 available, -8 unassigned",
        "h100: 102 of 128 in use, 16 available, 24 unassigned",
        "mig-1g-10gb: 0 of 0 in use, 0 available, 0 unassigned"]
    assert blocks[2].splitlines()[1] == "(no quotas)"
    data = cli("--json", "quota-tree", "-G", "h100").json
    assert [n["team"] for n in data[0]["teams"]] == ["ops", "research"]
    bad = cli("quota-tree", "-G", "nope")
    assert bad.code != 0 and "No GPU type 'nope'" in bad.err
