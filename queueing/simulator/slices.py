"""Which GPU of a node holds which slices (docs/simulator.md, "Fractional GPUs").

On a time-sliced GPU type a node's GPUs are each cut in S slices; fairq's policy counts
the node in slices (`NodeState.capacity/free`) and needs each GPU's free slices
(`NodeState.gpu_free`) to fit a fraction on ONE GPU and a whole GPU on a GPU nobody
shares. The simulated cluster is the one that knows: `SliceBook` keeps, per node of a
time-sliced type, the free slices of each GPU, and what every running job holds there,
so a job's slices go back to the GPU they came from.

`pack_fraction` and `pick_whole` are how the baselines choose (fairq's plan chooses
itself and says so in `Admission.gpu_slots`): a fraction goes on a GPU already shared
before a new one is opened (the shared GPU with the fewest free slices that holds it,
ties by node name, then GPU index), else on a free GPU of the node with the fewest free
slices that has one; a whole GPU is only a GPU with all its S slices free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .model import NodeSpec

# What one replica holds on a node: (node, GPU indexes, slices on each of them).
Hold = tuple[str, tuple[int, ...], int]


class SliceError(RuntimeError):
    """A placement the node's GPUs cannot hold (a plan made on other free slices)."""


class SliceBook:
    """Free slices per GPU of every node of a time-sliced type (`slices`: type -> S)."""

    def __init__(self, nodes: Iterable[NodeSpec], slices: Mapping[str, int]) -> None:
        self.per_gpu: dict[str, int] = {}
        self.free: dict[str, list[int]] = {}
        for n in nodes:
            s = slices.get(n.gpu_type, 1)
            if n.gpu_type in slices:
                self.per_gpu[n.name] = s
                self.free[n.name] = [s] * n.gpus

    def shared(self, node: str) -> bool:
        return node in self.free

    def gpu_free(self, node: str) -> tuple[int, ...]:
        return tuple(self.free[node])

    def units_free(self, node: str) -> int:
        return sum(self.free[node])

    def whole_free(self, node: str) -> int:
        """GPUs of the node with every slice free (what a whole-GPU replica may take)."""
        s = self.per_gpu[node]
        return sum(1 for f in self.free[node] if f == s)

    def set_all(self, node: str, free: bool) -> None:
        """A spot node down (every slice gone) or back (a fresh node: every slice free)."""
        s = self.per_gpu[node]
        self.free[node] = [s if free else 0] * len(self.free[node])

    def take(self, node: str, *, slices: int, whole: int = 0,
             gpu: int | None = None, gpus: tuple[int, ...] = ()) -> Hold:
        """Take one replica's share of `node`: `whole` > 0 whole GPUs (`gpus` when the
        plan said which, else the lowest-indexed GPUs with all slices free), else
        `slices` slices of ONE GPU (`gpu` when the plan said which, else `best_gpu`).
        Raises `SliceError` when the GPUs do not hold it."""
        free = self.free[node]
        s = self.per_gpu[node]
        if whole:
            idx = gpus or tuple(i for i, f in enumerate(free) if f == s)[:whole]
            if len(idx) < whole or any(not 0 <= i < len(free) or free[i] != s for i in idx):
                raise SliceError(f"{node}: {whole} whole GPUs asked ({list(idx)}); free "
                                 f"slices per GPU: {free}")
            for i in idx:
                free[i] = 0
            return node, tuple(idx), s
        g = self.best_gpu(node, slices) if gpu is None else gpu
        if g is None or not 0 <= g < len(free) or free[g] < slices:
            raise SliceError(f"{node}: no GPU {'' if g is None else g} with {slices} free "
                             f"slices (free per GPU: {free})")
        free[g] -= slices
        return node, (g,), slices

    def give(self, hold: Hold) -> None:
        node, idx, slices = hold
        if node not in self.free:
            return
        s = self.per_gpu[node]
        for i in idx:
            self.free[node][i] = min(s, self.free[node][i] + slices)

    def best_gpu(self, node: str, slices: int) -> int | None:
        """The GPU of `node` a fraction of `slices` packs on: a shared one (some slices
        taken) with the fewest free that holds it, else the first free one; None if none
        holds it."""
        return _best_gpu(self.free[node], self.per_gpu[node], slices)


def _best_gpu(free: Sequence[int], s: int, slices: int) -> int | None:
    # A shared GPU (some slices taken) before a free one, then the fewest free, then index.
    cands = [(0 if f < s else 1, f, i) for i, f in enumerate(free) if f >= slices]
    return min(cands)[2] if cands else None


def pack_fraction(book: SliceBook, nodes: Sequence[str], slices: int) -> tuple[str, int] | None:
    """The (node, GPU) a baseline puts a fraction of `slices` on, among `nodes`: the
    shared GPU with the fewest free slices that holds it (ties: node name, GPU index),
    else a free GPU on the node with the fewest free slices that has one."""
    best: tuple[int, str, int] | None = None
    for n in sorted(nodes):
        free, s = book.free[n], book.per_gpu[n]
        for i, f in enumerate(free):
            if slices <= f < s and (best is None or (f, n, i) < best):
                best = (f, n, i)
    if best is not None:
        return best[1], best[2]
    empty: tuple[int, str, int] | None = None
    for n in sorted(nodes):
        free, s = book.free[n], book.per_gpu[n]
        if s in free:
            key = (sum(free), n, free.index(s))
            if empty is None or key < empty:
                empty = key
    return None if empty is None else (empty[1], empty[2])


def pick_whole(book: SliceBook, nodes: Sequence[str], gpus: int) -> str | None:
    """The node a baseline puts a replica of `gpus` whole GPUs on, among `nodes`: the one
    with the fewest whole free GPUs that has enough (best fit, rule A3), then the fewest
    free slices, then by name (as the policy's rule H3)."""
    best: tuple[int, int, str] | None = None
    for n in nodes:
        w = book.whole_free(n)
        if w >= gpus and (best is None or (w, book.units_free(n), n) < best):
            best = (w, book.units_free(n), n)
    return None if best is None else best[2]
