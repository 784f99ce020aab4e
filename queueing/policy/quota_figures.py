"""What the quota tree says about each node, for people (docs/scheduling.md, "Quotas in
a tree": rules Q8 and Q9). Every figure comes from `QuotaTree`; this module adds the
two things people ask of it that admission does not:

- rule Q8, `carve_excess`: by how much a department's children's nominals pass the
  department's own quota row (the write-time check refuses a change that makes it
  worse);
- rule Q9, `lent_units`: whose unused nominal the borrowers hold, so a node's "lent"
  is a figure (what of its nominal others hold) and not only a yes or no.

All in the policy's units (rule H4); the callers divide for GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .quota_tree import ROOT, QuotaTree


def carve_excess(tree: QuotaTree) -> dict[tuple[str, str], int]:
    """Rule Q8: per (department, GPU type) with a quota row, how much its children's
    nominals (each its own row, or the sum of its children's) pass that row's nominal.
    Only the pairs over it; a department without a row of the type is its children's
    sum and never over."""
    return {(node, gpu_type): -own for (node, gpu_type), own in tree.own.items()
            if node != ROOT and own < 0 and (node, gpu_type) in tree.quotas}


def _unused_contribution(tree: QuotaTree, node: str, gpu_type: str) -> int:
    """What `node` hands its parent (`subtree_quota - guaranteed`, the part it may
    lend) and does not use itself."""
    k = (node, gpu_type)
    sq, g = tree.sq.get(k, 0), tree.g.get(k, 0)
    return max(0, (sq - g) - max(0, tree.usage[k] - g))


def _split(amount: int, parts: Mapping[str, int]) -> dict[str, int]:
    """`amount` (at most the sum of `parts`) shared in proportion to `parts`, in whole
    units: largest remainders first, ties by name."""
    total = sum(parts.values())
    if amount <= 0 or total <= 0:
        return dict.fromkeys(parts, 0)
    shares = {k: amount * v // total for k, v in parts.items()}
    left = amount - sum(shares.values())
    order = sorted(parts, key=lambda k: (-(amount * parts[k] % total), k))
    for k in order[:left]:
        shares[k] += 1
    return shares


def lent_units(tree: QuotaTree, gpu_type: str) -> dict[str, int]:
    """Rule Q9: per node, how much of its nominal others hold now.

    At each node, from the root down: what is taken from its pool by others than the
    children's own use - its own jobs, its children's borrowing beyond their subtree
    quota, and what its parent takes from it (its own "lent") - comes first from the
    node's own part (its row's nominal less its children's; at the root the capacity no
    top-level node is given), then from the children's unused lendable parts, shared in
    proportion to them. A child's share is its "lent", and is spread below it the same
    way."""
    lent: dict[str, int] = {}
    todo: list[tuple[str, int]] = [(ROOT, 0)]
    while todo:
        node, taken_above = todo.pop()
        kids = tree.children.get(node, ())
        demand = taken_above + (tree.usage[(node, gpu_type)]
                                - sum(max(0, tree.usage[(c, gpu_type)] - tree.g.get((c, gpu_type), 0))
                                      for c in kids))
        demand += sum(max(0, tree.usage[(c, gpu_type)] - tree.sq.get((c, gpu_type), 0))
                      for c in kids)
        rest = max(0, demand - max(0, tree.own.get((node, gpu_type), 0)))
        unused = {c: _unused_contribution(tree, c, gpu_type) for c in kids}
        shares = _split(min(rest, sum(unused.values())), unused)
        for c in kids:
            lent[c] = shares.get(c, 0)
            todo.append((c, lent[c]))
    return lent


@dataclass(frozen=True)
class NodeFigures:
    """One node of one GPU type's tree, in units (docs/api.md, "Quota tree")."""

    team: str
    parent: str  # ROOT ("") for a top-level node
    has_row: bool  # its own quota row of the type (else: its children's sum, or 0)
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    held: int  # its whole subtree's admitted and running jobs
    subtree_quota: int
    guaranteed: int
    borrowing: int  # what it takes from above: usage beyond its subtree quota
    lent: int  # rule Q9: what of its nominal others hold
    available: int | None  # what more its own jobs may take now (None: unbounded; never
    # below 0, though the fleet's capacity may be below what is held, e.g. while nodes
    # drain)


def tree_figures(tree: QuotaTree, gpu_type: str,
                 own_held: Mapping[str, int]) -> dict[str, NodeFigures]:
    """Every node's figures for `gpu_type`, with `tree`'s usage already holding
    `own_held` (each team's own jobs, `QuotaTree.add`)."""
    lent = lent_units(tree, gpu_type)
    out: dict[str, NodeFigures] = {}
    for node in tree.nodes():
        k = (node, gpu_type)
        q = tree.quota(node, gpu_type)
        available = tree.available(node, gpu_type)
        out[node] = NodeFigures(
            team=node, parent=tree.parent.get(node, ROOT), has_row=k in tree.quotas,
            nominal=tree.nominal(node, gpu_type), borrowing_limit=q.borrowing_limit,
            lending_limit=q.lending_limit, held=tree.held(node, gpu_type, own_held),
            subtree_quota=tree.sq.get(k, 0), guaranteed=tree.g.get(k, 0),
            borrowing=max(0, tree.usage[k] - tree.sq.get(k, 0)), lent=lent.get(node, 0),
            available=None if available is None else max(0, available))
    return out
