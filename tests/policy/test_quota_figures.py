"""Rules Q8 and Q9 in the pure policy (queueing/policy/quota_figures.py): a department's
excess over its own row, and whose nominal the borrowers hold."""

from __future__ import annotations

import random

import pytest

from queueing.policy.quota_figures import carve_excess, lent_units, tree_figures
from queueing.policy.quota_tree import ROOT, QuotaTree
from queueing.policy.snapshot import QuotaLimit


def _tree(parent: dict[str, str | None], quotas: dict[str, QuotaLimit | int],
          capacity: int, held: dict[str, int]) -> QuotaTree:
    rows = {(t, "g"): q if isinstance(q, QuotaLimit) else QuotaLimit(q, None, None)
            for t, q in quotas.items()}
    tree = QuotaTree(parent, rows, {"g": capacity})
    for team, units in held.items():
        tree.add(team, "g", units)
    return tree


def test_rule_q8_only_a_department_with_a_row_can_be_over() -> None:
    parent = {"d": None, "a": "d", "b": "d", "e": None, "c": "e"}
    tree = _tree(parent, {"d": 10, "a": 6, "b": 7, "c": 50}, 100, {})
    assert carve_excess(tree) == {("d", "g"): 3}  # e has no row: it is c's 50
    assert carve_excess(_tree(parent, {"d": 13, "a": 6, "b": 7}, 100, {})) == {}


def test_rule_q8_a_team_without_a_row_passes_its_children_up() -> None:
    parent = {"d": None, "m": "d", "a": "m", "b": "m"}
    tree = _tree(parent, {"d": 10, "a": 6, "b": 7}, 100, {})
    assert carve_excess(tree) == {("d", "g"): 3}


def test_rule_q9_a_sibling_lends_before_the_fleet() -> None:
    # d (no row: 20) > a 10 holds 15, b 10 holds 2; 100 unassigned in the fleet.
    tree = _tree({"d": None, "a": "d", "b": "d"}, {"a": 10, "b": 10}, 120, {"a": 15, "b": 2})
    assert lent_units(tree, "g") == {"d": 0, "a": 0, "b": 5}


def test_rule_q9_a_department_pool_lends_before_its_teams() -> None:
    # d 30 (own pool 10) > a 10 holds 15, b 10 holds 0: d's pool covers a's 5.
    tree = _tree({"d": None, "a": "d", "b": "d"}, {"d": 30, "a": 10, "b": 10}, 30,
                 {"a": 15})
    assert lent_units(tree, "g") == {"d": 0, "a": 0, "b": 0}
    # The fleet has nothing unassigned; x (top level, 0) borrows 12 from d: 5 of d's
    # pool are left, then b's 10 lends the other 7.
    tree = _tree({"d": None, "a": "d", "b": "d", "x": None}, {"d": 30, "a": 10, "b": 10},
                 30, {"a": 15, "x": 12})
    lent = lent_units(tree, "g")
    assert (lent["d"], lent["b"], lent["a"], lent["x"]) == (12, 7, 0, 0)


def test_rule_q9_lenders_share_in_proportion_largest_remainders_first() -> None:
    parent = {"a": None, "b": None, "c": None, "x": None}
    tree = _tree(parent, {"a": 5, "b": 3, "c": 2}, 10, {"x": 5})
    # 5 of 10 unused: 2.5, 1.5, 1 -> 2, 1, 1 and the unit left to a (tie a-b, by name).
    assert lent_units(tree, "g") == {"a": 3, "b": 1, "c": 1, "x": 0}


def test_rule_q9_a_lending_limit_keeps_the_rest() -> None:
    tree = _tree({"a": None, "b": None, "x": None},
                 {"a": QuotaLimit(10, None, 2), "b": 10}, 20, {"x": 12})
    assert lent_units(tree, "g") == {"a": 2, "b": 10, "x": 0}
    # a keeps 8 of its 10 unused: x has all the rest and may take no more.
    assert tree_figures(tree, "g", {"x": 12})["x"].available == 0
    assert tree_figures(tree, "g", {"x": 12})["a"].available == 8


@pytest.mark.parametrize("seed", range(40))
def test_rule_q9_random_trees_lend_what_is_borrowed_and_no_more(seed: int) -> None:
    """On random trees: a node never lends more than the unused part it may lend, and at
    the root what the fleet's unassigned part does not cover is lent by the top-level
    nodes, as far as they have it."""
    rng = random.Random(seed)
    teams = [f"t{i}" for i in range(rng.randint(2, 9))]
    parent: dict[str, str | None] = {}
    for i, t in enumerate(teams):
        parent[t] = rng.choice([None, *teams[:i]]) if i else None
    quotas: dict[str, QuotaLimit | int] = {}
    for t in teams:
        if rng.random() < 0.8:
            n = rng.randint(0, 12)
            quotas[t] = QuotaLimit(n, rng.choice([None, rng.randint(0, 8)]),
                                   rng.choice([None, rng.randint(0, n)]))
    held = {t: rng.randint(0, 14) for t in teams if rng.random() < 0.7}
    tree = _tree(parent, quotas, rng.randint(0, 80), held)
    lent = lent_units(tree, "g")
    figures = tree_figures(tree, "g", held)
    for t in teams:
        k = (t, "g")
        sq, g = tree.sq.get(k, 0), tree.g.get(k, 0)
        assert 0 <= lent[t] <= max(0, (sq - g) - max(0, tree.usage[k] - g))
        assert figures[t].lent == lent[t] and figures[t].held == tree.held(t, "g", held)
    top = [t for t in teams if tree.parent[t] == ROOT]
    demand = sum(max(0, tree.usage[(t, "g")] - tree.sq.get((t, "g"), 0)) for t in top)
    unused = sum(max(0, tree.sq.get((t, "g"), 0) - tree.g.get((t, "g"), 0)
                     - max(0, tree.usage[(t, "g")] - tree.g.get((t, "g"), 0))) for t in top)
    rest = max(0, demand - max(0, tree.own[(ROOT, "g")]))
    assert sum(lent[t] for t in top) == min(rest, unused)
