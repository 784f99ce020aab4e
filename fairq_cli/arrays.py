"""`fairq submit -a`: an array's indices as Slurm's `--array` writes them (`0-99%4`,
`1,3,5`, `0-15:4`, combinations); a bare `N` or `N%M` is N tasks 0..N-1. The server
reads `POST /jobs/bulk/`'s `array` with queueing/policy/arrays.py, this module's twin
(the CLI imports nothing of the server's): tests/cli/test_cli_prio_arrays_times.py holds
them to the same answers."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The server's largest array (queueing.services.jobs.MAX_BULK_JOBS).
MAX_ARRAY_TASKS = 10_000

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
