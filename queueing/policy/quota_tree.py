"""Quotas in a tree (docs/scheduling.md, "Quotas in a tree").

Departments are teams with children (rule F4's forest). Each node has, per GPU type, a
nominal, a borrowing limit and a lending limit (`QuotaLimit`). A department's nominal
is its whole subtree's guarantee; its children's nominals are carved out of it, and
what is left is the department's *pool*, shared by its subtree. A department with no
quota row of a type has the sum of its children's nominals and no pool.

The arithmetic is Kueue's hierarchical cohorts', with a department's own quota its
pool, and the root (the fleet) holding the capacity no top-level node is given:

- `guaranteed(n)`: what of the node's subtree quota it never lends:
  `max(0, subtree_quota(n) - lending_limit)`, 0 with no lending limit.
- `subtree_quota(n) = own(n) + sum over children c of (subtree_quota(c) - guaranteed(c))`:
  what the node can hand out to its subtree beyond its children's kept parts.
- `usage(n) = own jobs + sum over children of max(0, usage(c) - guaranteed(c))`: what
  the node takes from its own pool, its children's lent parts, or above.
- `available(n) = max(0, guaranteed(n) - usage(n)) + min(available(parent), room)`,
  `room = subtree_quota(n) - guaranteed(n) - max(0, usage(n) - guaranteed(n)) +
  borrowing_limit` (no limit: unbounded); at the root
  `available = subtree_quota(root) - usage(root)`.

For a forest with no departments (every team top level) this is exactly rule Q1: the
ceiling `nominal + borrowing limit` and the GPUs other teams guard.

Per GPU type the tree is computed once (`O(nodes)`), and each add, remove or
`available` walks one path to the root (`O(depth)`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from .snapshot import NO_QUOTA, QuotaLimit

ROOT = ""  # the fleet: the root of every GPU type's tree


class QuotaTree:
    """The quota tree of one snapshot, every GPU type, with usage kept as jobs move."""

    def __init__(self, parent: Mapping[str, str | None],
                 quotas: Mapping[tuple[str, str], QuotaLimit],
                 capacity: Mapping[str, int]) -> None:
        from .fairshare import forest_parents

        teams = set(parent) | {t for t, _g in quotas}
        raw = {t: parent.get(t) for t in teams}
        # Rule F4's forest: an unknown parent or a cycle makes a node top level.
        safe = forest_parents({**raw, **{p: raw.get(p) for p in raw.values() if p}})
        self.parent: dict[str, str] = {t: (safe.get(t) or ROOT) for t in teams}
        for t in list(safe):
            self.parent.setdefault(t, safe[t] or ROOT)
        self.children: dict[str, list[str]] = defaultdict(list)
        for t, p in sorted(self.parent.items()):
            self.children[p].append(t)
        self.quotas = quotas
        self._nominal: dict[tuple[str, str], int] = {}
        self._paths: dict[str, list[str]] = {}
        self.capacity = dict(capacity)
        self.types = set(capacity) | {g for _t, g in quotas}
        # Per (node, type): subtree quota, guaranteed, own pool; and usage as jobs move.
        self.sq: dict[tuple[str, str], int] = {}
        self.g: dict[tuple[str, str], int] = {}
        self.own: dict[tuple[str, str], int] = defaultdict(int)
        self.usage: dict[tuple[str, str], int] = defaultdict(int)
        # How many times usage moved, and `guarders`' ranking per GPU type as of a move.
        self.moves = 0
        self._ranked: dict[str, tuple[int, list[tuple[str, int]], dict[str, int], int]] = {}
        # Per GPU type the nodes with a guarantee (`g` > 0), in `parent`'s order: only
        # they may guard (`guarders_reference`).
        self._may_guard: dict[str, list[str]] = {}
        for gpu_type in self.types:
            self._compute(ROOT, gpu_type)
        # Rule Q4: per GPU type, the guarantee no node uses yet (`max(0, g - usage)` summed
        # over the nodes), kept as usage moves: 0 = nobody guards anything.
        self.unused_guaranteed: dict[str, int] = defaultdict(int)
        for (node, gpu_type), g in self.g.items():
            if node != ROOT:
                self.unused_guaranteed[gpu_type] += g

    # -- the static part ----------------------------------------------------------
    def quota(self, node: str, gpu_type: str) -> QuotaLimit:
        return self.quotas.get((node, gpu_type), NO_QUOTA)

    def nominal(self, node: str, gpu_type: str) -> int:
        """A node's nominal: its row's, or for a department without one the sum of its
        children's."""
        if node == ROOT:
            return self.capacity.get(gpu_type, 0)
        if (node, gpu_type) in self.quotas:
            return self.quotas[(node, gpu_type)].nominal
        key = (node, gpu_type)
        got = self._nominal.get(key)
        if got is None:
            got = self._nominal[key] = sum(self.nominal(c, gpu_type)
                                           for c in self.children.get(node, ()))
        return got

    def within_guarantee(self, team: str, gpu_type: str, units: int,
                         held: Callable[[str], int]) -> int:
        """Rules Q6, Q7: how many nodes of `team`'s path, from the team up, stay within
        their nominal with `units` more for the team (all of them: `len(path(team))`).
        `held(n)`: what node n's own jobs hold. A department counts its own jobs, the
        path's child as computed below it, and each other child's subtree only up to
        that child's nominal: a child's borrowing is not the department's guarantee in
        use (rule Q5), so a sibling borrowing a team's lent share does not put the team
        beyond its department's guarantee."""
        path = self.path(team)
        below, value = "", 0
        for i, node in enumerate(path):
            value += held(node) + (units if i == 0 else 0) + sum(
                self._capped(c, gpu_type, held) for c in self.children.get(node, ())
                if c != below)
            if value > self.nominal(node, gpu_type):
                return i
            below = node
        return len(path)

    def _capped(self, node: str, gpu_type: str, held: Callable[[str], int]) -> int:
        """What `node`'s subtree holds within its guarantee (rule Q7's count)."""
        inner = held(node) + sum(self._capped(c, gpu_type, held)
                                 for c in self.children.get(node, ()))
        return min(inner, self.nominal(node, gpu_type))

    def _compute(self, node: str, gpu_type: str) -> None:
        kids = self.children.get(node, ())
        for c in kids:
            self._compute(c, gpu_type)
        carved = sum(self.nominal(c, gpu_type) for c in kids)
        if node == ROOT:
            own = self.capacity.get(gpu_type, 0) - carved
        elif (node, gpu_type) in self.quotas:
            own = self.quotas[(node, gpu_type)].nominal - carved
        else:
            own = 0
        self.own[(node, gpu_type)] = own
        sq = own + sum(self.sq[(c, gpu_type)] - self.g[(c, gpu_type)] for c in kids)
        self.sq[(node, gpu_type)] = sq
        lending = None if node == ROOT else self.quota(node, gpu_type).lending_limit
        self.g[(node, gpu_type)] = 0 if lending is None else max(0, sq - lending)

    # -- the tree's shape ------------------------------------------------------
    def path(self, node: str) -> list[str]:
        """`node` and its ancestors up to its top-level one (not the root). Kept: a
        node's parent never changes (`add` only hangs unknown teams under the root)."""
        got = self._paths.get(node)
        if got is None:
            got, n = [], node
            while n != ROOT:
                got.append(n)
                n = self.parent.get(n, ROOT)
            self._paths[node] = got
        return got

    def lca(self, a: str, b: str) -> str:
        """The nearest node both are under (ROOT when none)."""
        above = set(self.path(a))
        for n in self.path(b):
            if n in above:
                return n
        return ROOT

    # -- usage as jobs move ------------------------------------------------------
    def add(self, team: str, gpu_type: str, units: int) -> None:
        """`units` more (fewer when negative) held by `team`'s own jobs."""
        node, delta = team, units
        self.moves += 1
        if node not in self.parent:
            self.parent[node] = ROOT
            self.children[ROOT].append(node)
        while delta:
            k = (node, gpu_type)
            g = self.g.get(k, 0)
            u = self.usage[k]
            before = max(0, u - g)
            self.usage[k] = u + delta
            if node == ROOT:
                return
            if g:
                self.unused_guaranteed[gpu_type] += max(0, g - u - delta) - max(0, g - u)
            delta = max(0, u + delta - g) - before
            node = self.parent.get(node, ROOT)

    def borrowing(self, node: str, gpu_type: str) -> bool:
        """Does the node take more than its subtree quota (from above)?"""
        k = (node, gpu_type)
        return self.usage[k] > self.sq.get(k, 0)

    def available(self, node: str, gpu_type: str) -> int | None:
        """How many more units the node's own jobs may take (None = unbounded)."""
        k = (node, gpu_type)
        sq, g, u = self.sq.get(k, 0), self.g.get(k, 0), self.usage[k]
        if node == ROOT:
            return sq - u
        up = self.available(self.parent.get(node, ROOT), gpu_type)
        limit = self.quota(node, gpu_type).borrowing_limit
        if limit is not None:
            room = sq - g - max(0, u - g) + limit
            up = room if up is None else min(up, room)
        return max(0, g - u) + (up if up is not None else 0)

    def fits(self, team: str, gpu_type: str, units: int) -> bool:
        """Rules Q1 and Q4: may `team` take `units` more of `gpu_type`?"""
        room = self.available(team, gpu_type)
        return room is None or units <= room

    def within_limits(self, node: str, gpu_type: str) -> tuple[int | None, str]:
        """Rule Q4 without the fleet's cap: how many more units the node's own jobs may
        take under the borrowing limits of its path (None = unbounded), and the node
        whose limit binds ("" when none does). The root's capacity is left out: that
        GPUs exist is rule A2's business, and GPUs guarded above the top level are
        rule A1's lending wait. Ties name the nearest node."""
        if node == ROOT:
            return None, ""
        k = (node, gpu_type)
        sq, g, u = self.sq.get(k, 0), self.g.get(k, 0), self.usage[k]
        up, who = self.within_limits(self.parent.get(node, ROOT), gpu_type)
        limit = self.quota(node, gpu_type).borrowing_limit
        if limit is not None:
            room = sq - g - max(0, u - g) + limit
            if up is None or room <= up:
                up, who = room, node
        return (None if up is None else max(0, g - u) + up), who

    def guarded_off_path(self, team: str, gpu_type: str) -> int:
        """Rule Q4: the unused guarantee kept by nodes off `team`'s path (what the
        team's own path keeps it may use)."""
        mine = sum(max(0, self.g.get((n, gpu_type), 0) - self.usage[(n, gpu_type)])
                   for n in self.path(team))
        return self.unused_guaranteed[gpu_type] - mine

    def depth(self, node: str) -> int:
        """The root's is 0, a top-level node's 1."""
        return len(self.path(node))

    def guarders(self, gpu_type: str, besides: str) -> list[tuple[str, int]]:
        """Rule Q4's words: the nodes off `besides`' path that keep unused guarantee of
        `gpu_type` (their subtree quota beyond their lending limit), most first.

        The ranking of every node is kept until usage moves (`add`): a long queue
        waiting on lending limits asks it once per job, and the walk and sort of every
        node each time were most of a pass with 1,000 teams (docs/performance.md, "A
        fleet of 5,000 nodes"). `guarders_reference` is the plain path."""
        ranking = self._ranking(gpu_type)[0]
        mine = set(self.path(besides))
        return [(n, k) for n, k in ranking if n not in mine]

    def guard_summary(self, gpu_type: str, besides: str,
                      first: int = 3) -> tuple[list[tuple[str, int]], int, int]:
        """Rule Q4's words from `guarders(gpu_type, besides)` without building it: its
        `first` entries, how many it has and the GPUs they keep in all. O(first + the
        path): the path's own nodes are taken out of the kept count and sum."""
        ranking, keeps, total = self._ranking(gpu_type)
        mine = self.path(besides)
        count = len(ranking)
        for n in mine:
            k = keeps.get(n)
            if k is not None:
                count -= 1
                total -= k
        top: list[tuple[str, int]] = []
        for n, k in ranking:
            if len(top) == first:
                break
            if n not in mine:
                top.append((n, k))
        return top, count, total

    def _ranking(self, gpu_type: str) -> tuple[list[tuple[str, int]], dict[str, int], int]:
        """Every guarder of the type, ranked (`guarders_reference` besides the root),
        with each one's GPUs and their sum: kept until usage moves."""
        kept = self._ranked.get(gpu_type)
        if kept is None or kept[0] != self.moves:
            ranking = self.guarders_reference(gpu_type, ROOT)
            kept = self._ranked[gpu_type] = (self.moves, ranking, dict(ranking),
                                             sum(k for _n, k in ranking))
        return kept[1], kept[2], kept[3]

    def guarders_reference(self, gpu_type: str, besides: str) -> list[tuple[str, int]]:
        """`guarders` without the kept ranking: every node that may guard (a
        guarantee above 0: `g` is static) walked and sorted."""
        mine = set(self.path(besides))
        may = self._may_guard.get(gpu_type)
        if may is None:
            may = self._may_guard[gpu_type] = [
                n for n in self.parent if self.g.get((n, gpu_type), 0) > 0]
        out = [(n, self.g[(n, gpu_type)] - self.usage[(n, gpu_type)])
               for n in may if n not in mine]
        return sorted(((n, k) for n, k in out if k > 0), key=lambda x: (-x[1], x[0]))

    def is_department(self, node: str) -> bool:
        return bool(self.children.get(node))

    def held(self, node: str, gpu_type: str, own_held: Mapping[str, int]) -> int:
        """Everything the node's subtree holds, from each team's own holdings."""
        return own_held.get(node, 0) + sum(self.held(c, gpu_type, own_held)
                                           for c in self.children.get(node, ()))

    def nodes(self) -> Iterable[str]:
        return self.parent.keys()
