"""The quota tree as people see it (docs/scheduling.md, "Quotas in a tree"; docs/api.md,
"Quota tree"): per GPU type, departments with their teams, each node's nominal, limits,
held GPUs, subtree quota, guarantee, borrowing, lent and available. Every figure is
`QuotaTree`'s (`queueing/policy/quota_figures.py`), computed in the policy's units and
shown in the type's devices as quotas are written (GPUs; a MIG type's instances; a
time-sliced or MPS type's slices / slices per GPU, so 0.25).

And rule Q8's write-time check (`carve_problems`): the services refuse a quota or a
parent change that makes a department's children's nominals pass its own row's."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from accounts.models import Team
from queueing.models import GpuType, Quota
from queueing.policy.quota_figures import NodeFigures, carve_excess, tree_figures
from queueing.policy.quota_tree import ROOT, QuotaTree
from queueing.policy.snapshot import QuotaLimit

from .capacity import gpus_held
from .cluster import cluster_nodes
from .gpu_share import whole
from .snapshot import quota_in_units


@dataclass
class TreeNode:
    """One team of one GPU type's tree, its figures in the type's devices."""

    team: str
    name: str
    is_department: bool  # a team with children (Team.parent)
    has_row: bool  # a quota row of its own for the type (else its children's sum)
    nominal: int | float
    borrowing_limit: int | float | None
    lending_limit: int | float | None
    held: int | float
    subtree_quota: int | float
    guaranteed: int | float
    borrowing: int | float
    lent: int | float
    available: int | float | None
    depth: int = 0
    children: list[TreeNode] = field(default_factory=list)


@dataclass
class TypeTree:
    """One GPU type's tree: the fleet (its open capacity, rule K8) and the top-level
    nodes under it."""

    gpu_type: str
    sharing: str
    slices_per_gpu: int
    capacity: int | float  # open capacity (draining clusters' nodes left out)
    held: int | float  # by every team's admitted and running jobs
    unassigned: int | float  # capacity no top-level node is given (may be < 0)
    available: int | float  # what the fleet has left: capacity - usage at the root, >= 0
    roots: list[TreeNode] = field(default_factory=list)
    by_team: dict[str, TreeNode] = field(default_factory=dict)

    def walk(self) -> Iterator[TreeNode]:
        """Every node, depth first, each before its children."""
        stack = list(reversed(self.roots))
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def path(self, team: str) -> list[TreeNode]:
        """`team` and its ancestors, nearest first."""
        out = []
        parents = {c.team: n for n in self.walk() for c in n.children}
        node = self.by_team.get(team)
        while node is not None:
            out.append(node)
            node = parents.get(node.team)
        return out


@dataclass
class QuotaForest:
    """Every team once (slug -> name, parent) and each GPU type's tree."""

    teams: dict[str, tuple[str, str | None]]
    trees: list[TypeTree]
    error: str = ""  # the cluster view missing or stale (capacity then 0)


def _rows() -> tuple[dict[str, tuple[str, str | None]], list[dict[str, Any]]]:
    """Every team (slug -> name, parent slug) and every quota row, as stored."""
    teams: dict[str, tuple[str, str | None]] = {
        slug: (name, parent) for slug, name, parent
        in Team.objects.values_list("slug", "name", "parent__slug")}
    quotas = [dict(q) for q in Quota.objects.values(
        "team__slug", "gpu_type__slug", "nominal", "borrowing_limit", "lending_limit")]
    return teams, quotas


def _in_units(quotas: list[dict[str, Any]], per_device: Mapping[str, int]
              ) -> dict[tuple[str, str], QuotaLimit]:
    return {(q["team__slug"], q["gpu_type__slug"]): quota_in_units(
        q["nominal"], q["borrowing_limit"], q["lending_limit"],
        per_device.get(q["gpu_type__slug"], 1)) for q in quotas}


def quota_forest(*, gpu_type: str | None = None) -> QuotaForest:
    """Every GPU type's tree (or only `gpu_type`'s), every team in each (a team with no
    quota of the type and nothing held: zeros). The capacity is the published cluster
    view's, less draining clusters' nodes (rule K8); held is what admitted and running
    jobs hold (a fraction its share)."""
    teams, quotas = _rows()
    types = list(GpuType.objects.order_by("slug").values_list("slug", "sharing",
                                                              "slices_per_gpu"))
    if gpu_type is not None:
        types = [t for t in types if t[0] == gpu_type]
    per_device = {slug: (spg if sharing in ("time-sliced", "mps") else 1)
                  for slug, sharing, spg in types}
    nodes, closed, error = cluster_nodes()
    capacity: dict[str, int] = defaultdict(int)
    for n in nodes:
        if n.cluster not in closed:
            capacity[n.gpu_type] += n.capacity
    tree = QuotaTree({t: p for t, (_, p) in teams.items()}, _in_units(quotas, per_device),
                     {slug: capacity.get(slug, 0) for slug in per_device})
    held: dict[str, dict[str, int]] = defaultdict(dict)
    for (team, g), devices in gpus_held().items():
        if g in per_device:
            held[g][team] = round(devices * per_device[g])
            tree.add(team, g, held[g][team])
    has_children = {p for _, p in teams.values() if p}
    trees = []
    for slug, sharing, spg in types:
        per = per_device[slug]
        figures = tree_figures(tree, slug, held[slug])
        nodes_of = {t: _node(f, teams.get(t, (t, None))[0], t in has_children, per)
                    for t, f in figures.items()}
        for t, f in figures.items():
            if f.parent != ROOT and f.parent in nodes_of:
                nodes_of[f.parent].children.append(nodes_of[t])
        roots = [nodes_of[t] for t in sorted(nodes_of) if figures[t].parent == ROOT
                 or figures[t].parent not in nodes_of]
        top = TypeTree(slug, sharing, spg, whole(capacity.get(slug, 0) / per),
                       whole(sum(held[slug].values()) / per),
                       whole(tree.own.get((ROOT, slug), 0) / per),
                       whole(max(0, tree.available(ROOT, slug) or 0) / per), roots, nodes_of)
        for node in top.walk():
            node.children.sort(key=lambda c: c.team)
            for c in node.children:
                c.depth = node.depth + 1
        trees.append(top)
    return QuotaForest(teams, trees, error)


def _node(f: NodeFigures, name: str, is_department: bool, per: int) -> TreeNode:
    def g(units: int | None) -> int | float | None:
        return None if units is None else whole(units / per)

    return TreeNode(
        team=f.team, name=name, is_department=is_department, has_row=f.has_row,
        nominal=whole(f.nominal / per), borrowing_limit=g(f.borrowing_limit),
        lending_limit=g(f.lending_limit), held=whole(f.held / per),
        subtree_quota=whole(f.subtree_quota / per), guaranteed=whole(f.guaranteed / per),
        borrowing=whole(f.borrowing / per), lent=whole(f.lent / per),
        available=g(f.available))


def pruned(node: TreeNode) -> TreeNode | None:
    """`node` with only the parts of its subtree that have a quota row of the type or
    hold some of it (None when nothing below it does)."""
    kids = [k for k in (pruned(c) for c in node.children) if k is not None]
    if not kids and not node.has_row and not node.held:
        return None
    return TreeNode(**{**node.__dict__, "children": kids})


# --- rule Q8: a department's children's nominals fit in its own ----------------------


def carve_problems(*, quota: tuple[str, str, int] | None = None,
                   parent: tuple[str, str | None] | None = None) -> list[str]:
    """Rule Q8: the messages for a change that makes a department's children's nominals
    pass its own quota row's nominal, or pass it by more than before: `quota` (team
    slug, GPU type slug, new nominal) or `parent` (team slug, new parent slug or None).
    A department without a row of the type is its children's sum and never over; a
    change that leaves an existing excess as it was, or lowers it, passes."""
    teams, quotas = _rows()
    parents = {t: p for t, (_, p) in teams.items()}
    before: dict[tuple[str, str], int] = {(q["team__slug"], q["gpu_type__slug"]): q["nominal"]
                                          for q in quotas}
    after = dict(before)
    new_parents = dict(parents)
    if quota is not None:
        after[(quota[0], quota[1])] = quota[2]
    if parent is not None:
        new_parents[parent[0]] = parent[1]
    old = carve_excess(QuotaTree(parents, _nominals(before), {}))
    new_tree = QuotaTree(new_parents, _nominals(after), {})
    out = []
    for (dept, g), excess in sorted(carve_excess(new_tree).items()):
        if excess > old.get((dept, g), 0):
            nominal = after[(dept, g)]
            out.append(f"The teams of {dept} are guaranteed {nominal + excess} {g}, more "
                       f"than {dept}'s nominal {nominal}.")
    return out


def _nominals(rows: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], QuotaLimit]:
    """Rule Q8 compares nominals only, in the rows' own devices (the same factor on both
    sides of each comparison)."""
    return {k: QuotaLimit(n, None, None) for k, n in rows.items()}


# --- a team's standing at each level (the dashboard) ---------------------------------


@dataclass
class Level:
    """One node on a team's path to the fleet, in the type's devices."""

    team: str
    held: int | float
    nominal: int | float
    borrowing: int | float
    lent: int | float
    lender: str  # who it borrows from: its parent's slug, or "the fleet"


@dataclass
class TypeStanding:
    gpu_type: str
    levels: list[Level]  # the team first, then each department above it
    fleet_held: int | float
    fleet_capacity: int | float


def team_standing(*, team: str, forest: QuotaForest | None = None) -> list[TypeStanding]:
    """Per GPU type where `team` or a department above it has a quota row or holds
    some: the team's and each department's held against nominal, borrowing (and from
    whom) and lent, then the fleet's use against its capacity (of `forest`, default
    the forest as it is now)."""
    out = []
    for tree in (forest or quota_forest()).trees:
        path = tree.path(team)
        if not any(n.has_row or n.held for n in path):
            continue
        levels = [Level(n.team, n.held, n.nominal, n.borrowing, n.lent,
                        path[i + 1].team if i + 1 < len(path) else "the fleet")
                  for i, n in enumerate(path)]
        out.append(TypeStanding(tree.gpu_type, levels, tree.held, tree.capacity))
    return out
