"""An array's indices as Slurm's `--array` writes them (docs/scheduling.md, "Arrays"):
`0-99%4`, `1,3,5`, `0-15:4`, combinations (`1-5,10,20-30:5%2`). A bare `N` (or `N%M`)
keeps fairq's meaning: N tasks, indices 0..N-1. Pure: `POST /jobs/bulk/`'s `array` and
`fairq submit -a` (fairq_cli/arrays.py, which must agree: tests/cli) read it the same.

An array's indices are stored as runs `[start, step, n]` (the indices start,
start + step, ... n of them): `0-9999` is one run however many tasks it has."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# The largest index: member names are `<name>-<index>` (at most 63 characters).
MAX_ARRAY_INDEX = 999_999

_ITEM = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


class ArraySpecError(ValueError):
    pass


@dataclass(frozen=True)
class ArraySpec:
    """`indices` in increasing order, each once; `max_running` Slurm's `%M` (None: no
    limit)."""

    indices: tuple[int, ...]
    max_running: int | None

    @property
    def count(self) -> int:
        return len(self.indices)

    @property
    def dense(self) -> bool:
        """Indices 0..count-1: fairq's plain array of `count`."""
        return self.indices[-1] == len(self.indices) - 1


def parse_array_spec(text: str, *, max_tasks: int) -> ArraySpec:
    """`N`, `N%M` (N tasks), or Slurm's comma-separated `I`, `A-B`, `A-B:S` with an
    optional `%M` at the end. Duplicates count once (Slurm's bitmap). ArraySpecError
    with a message a person can act on."""
    body, pct, most_text = text.strip().partition("%")
    most: int | None = None
    if pct:
        if not most_text.strip().isdigit() or int(most_text) < 1:
            raise ArraySpecError(f"%{most_text.strip()}: after % comes how many may run at "
                                 "once, a whole number of at least 1")
        most = int(most_text)
    body = body.strip()
    if body.isdigit():  # fairq's `-a N`: N tasks
        n = int(body)
        if not 1 <= n <= max_tasks:
            raise ArraySpecError(f"{n} tasks: an array has 1..{max_tasks}")
        return ArraySpec(tuple(range(n)), most)
    indices: set[int] = set()
    for item in body.split(","):
        m = _ITEM.fullmatch(item.strip())
        if not m:
            raise ArraySpecError(f"{item.strip()!r}: use N (N tasks), or indices as Slurm "
                                 "writes them: 0-99, 1,3,5, 0-15:4, with %M at the end")
        start = int(m.group(1))
        end = int(m.group(2)) if m.group(2) is not None else start
        step = int(m.group(3)) if m.group(3) is not None else 1
        if end < start:
            raise ArraySpecError(f"{item.strip()!r}: the range ends before it starts")
        if step < 1:
            raise ArraySpecError(f"{item.strip()!r}: the step after : is at least 1")
        if end > MAX_ARRAY_INDEX:
            raise ArraySpecError(f"{item.strip()!r}: indices go up to {MAX_ARRAY_INDEX}")
        if (end - start) // step + 1 > max_tasks:
            raise ArraySpecError(f"{item.strip()!r} is {(end - start) // step + 1} tasks: "
                                 f"an array has 1..{max_tasks}")
        indices.update(range(start, end + 1, step))
        if len(indices) > max_tasks:
            break
    if len(indices) > max_tasks:
        raise ArraySpecError(f"{len(indices)} tasks: an array has 1..{max_tasks}")
    return ArraySpec(tuple(sorted(indices)), most)


def index_runs(indices: Sequence[int]) -> list[list[int]]:
    """Increasing indices as runs [start, step, n] (greedy: each run as long as its step
    holds)."""
    runs: list[list[int]] = []
    i = 0
    while i < len(indices):
        start = indices[i]
        if i + 1 == len(indices):
            runs.append([start, 1, 1])
            break
        step = indices[i + 1] - start
        n = 2
        while i + n < len(indices) and indices[i + n] - indices[i + n - 1] == step:
            n += 1
        runs.append([start, step, n])
        i += n
    return runs


def run_indices(runs: Sequence[Sequence[int]], positions: range) -> list[int]:
    """The indices of members at `positions` (0 is the first member) of an array whose
    indices are `runs`."""
    out: list[int] = []
    offset = 0
    want = iter(positions)
    pos = next(want, None)
    for start, step, n in runs:
        while pos is not None and pos < offset + n:
            out.append(start + (pos - offset) * step)
            pos = next(want, None)
        offset += n
        if pos is None:
            break
    return out
