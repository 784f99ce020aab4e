"""Job dependencies and array limits (docs/scheduling.md, rules D1-D3 and A8), pure.

A job may wait for other jobs of its team, or whole arrays, like Slurm's
`--dependency=afterok:12,afterany:14`. Whether a dependency is met is decided from the
states of the jobs it names (counts per state: an array of 10,000 members is 10,000 rows
in the database, a handful of counts here). The scheduler cycle, "why is my job pending"
and the simulator all decide it here: `plan_admissions` calls `dependencies_verdict` for
every queued job that has dependencies.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from .states import JobState


class DependencyKind(StrEnum):
    """Rule D1: `after_ok` (Slurm's afterok) waits for success, `after_any` for any end,
    `after_not_ok` for a failure or a cancel."""

    AFTER_OK = "after_ok"
    AFTER_ANY = "after_any"
    AFTER_NOT_OK = "after_not_ok"


class Verdict(StrEnum):
    MET = "met"
    WAITING = "waiting"
    NEVER = "never"  # rule D2: it can never be met


@dataclass(frozen=True, slots=True)
class Dependency:
    """One dependency: on job `job` or on every member of array `array` (exactly one)."""

    kind: DependencyKind
    job: int | None = None
    array: int | None = None

    @property
    def target(self) -> tuple[str, int]:
        """("job", id) or ("array", id): the key of `Counts` in a snapshot."""
        if self.array is not None:
            return ("array", self.array)
        assert self.job is not None
        return ("job", self.job)

    @property
    def label(self) -> str:
        kind, ident = self.target
        return f"{kind} {ident}"


# How many of the named job(s) are in each state: {"SUCCEEDED": 3, "RUNNING": 1}.
Counts = Mapping[str, int]

_OK = frozenset({JobState.SUCCEEDED.value})
_NOT_OK = frozenset({JobState.FAILED.value, JobState.CANCELLED.value})


def dependency_verdict(kind: DependencyKind, counts: Counts | None) -> Verdict:
    """Rules D1 and D2 for one dependency, given the states of the job(s) it names.

    after_ok: met once all ended and all succeeded; never once one failed or was
    cancelled. after_any: met once all ended. after_not_ok: met once all ended and at
    least one failed or was cancelled; never once all ended and all succeeded. A target
    with no job at all (deleted) can never be met."""
    total = sum(counts.values()) if counts else 0
    if total == 0:
        return Verdict.NEVER
    assert counts is not None
    ok = sum(n for s, n in counts.items() if s in _OK)
    not_ok = sum(n for s, n in counts.items() if s in _NOT_OK)
    ended = ok + not_ok == total
    if kind is DependencyKind.AFTER_OK:
        if not_ok:
            return Verdict.NEVER
        return Verdict.MET if ended else Verdict.WAITING
    if kind is DependencyKind.AFTER_ANY:
        return Verdict.MET if ended else Verdict.WAITING
    if not ended:
        return Verdict.WAITING
    return Verdict.MET if not_ok else Verdict.NEVER


@dataclass(frozen=True, slots=True)
class DependencyState:
    """The verdict over all of a job's dependencies and the one that decides it."""

    verdict: Verdict
    on: Dependency | None = None

    @property
    def message(self) -> str:
        if self.on is None:
            return ""
        if self.verdict is Verdict.WAITING:
            return f"waiting for {self.on.label} ({self.on.kind})"
        if self.verdict is Verdict.NEVER:
            return (
                f"dependency {self.on.kind} on {self.on.label} can never be met ({_never_why(self.on.kind)})"
            )
        return ""


def _never_why(kind: DependencyKind) -> str:
    if kind is DependencyKind.AFTER_OK:
        return "it failed, was cancelled, or no longer exists"
    if kind is DependencyKind.AFTER_NOT_OK:
        return "it succeeded, or no longer exists"
    return "it no longer exists"


def dependencies_verdict(
    deps: Sequence[Dependency], counts: Mapping[tuple[str, int], Counts]
) -> DependencyState:
    """Rules D1-D2 over all of a job's dependencies (all must be met, like Slurm's `,`):
    NEVER as soon as one can never be met (the first such, in the job's order), else
    WAITING on the first not met yet, else MET. `counts` maps each target to the states
    of its job(s)."""
    waiting: Dependency | None = None
    for dep in deps:
        verdict = dependency_verdict(dep.kind, counts.get(dep.target))
        if verdict is Verdict.NEVER:
            return DependencyState(Verdict.NEVER, dep)
        if verdict is Verdict.WAITING and waiting is None:
            waiting = dep
    if waiting is not None:
        return DependencyState(Verdict.WAITING, waiting)
    return DependencyState(Verdict.MET)


def dependency_cycle(start: int, edges: Mapping[int, Iterable[int]]) -> list[int] | None:
    """Rule D3: a path of jobs from `start` back to `start` along `edges` (job -> the jobs
    it waits for, arrays already expanded to their members), or None. Deterministic: the
    lowest ids first; each job is walked once."""
    path: list[int] = [start]
    seen = {start}
    stack: list[Iterator[int]] = [iter(sorted(edges.get(start, ())))]
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            path.pop()
            continue
        if nxt == start:
            return [*path, start]
        if nxt in seen:  # walked already: no path back to start through it
            continue
        seen.add(nxt)
        path.append(nxt)
        stack.append(iter(sorted(edges.get(nxt, ()))))
    return None


def array_limit_reached(*, active: int, limit: int | None) -> bool:
    """Rule A8: an array member is admitted only while fewer than `limit` members of its
    array hold GPUs (admitted or running, this pass's admissions counted); None = no
    limit (Slurm's `--array=0-99%4`: at most 4 at once)."""
    return limit is not None and active >= limit


MAX_DEPENDENCIES = 64


def parse_dependencies(value: object) -> tuple[Dependency, ...]:
    """The stored (and posted) form, `[{"type": "after_ok", "job": 12}, {"type":
    "after_any", "array": 3}]`, as Dependencies; ValueError naming the first problem.
    Duplicates are dropped, the order kept."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError("Must be a list of {type, job} or {type, array}.")
    if len(value) > MAX_DEPENDENCIES:
        raise ValueError(f"At most {MAX_DEPENDENCIES} dependencies.")
    out: list[Dependency] = []
    kinds = ", ".join(k.value for k in DependencyKind)
    for item in value:
        if not isinstance(item, dict) or set(item) - {"type", "job", "array"}:
            raise ValueError("Each dependency is {type, job} or {type, array}.")
        try:
            kind = DependencyKind(str(item.get("type")))
        except ValueError:
            raise ValueError(f"type must be one of: {kinds}.") from None
        job, array = item.get("job"), item.get("array")
        if (job is None) == (array is None):
            raise ValueError("Each dependency names exactly one of job and array.")
        ident = job if job is not None else array
        if isinstance(ident, bool) or not isinstance(ident, int) or not 1 <= ident < 2**63:
            raise ValueError("job and array are positive integer ids.")
        dep = Dependency(kind, job=job, array=array)
        if dep not in out:
            out.append(dep)
    return tuple(out)


def dependencies_stored(deps: Iterable[Dependency]) -> list[dict[str, object]]:
    """The stored form of `deps` (what `parse_dependencies` reads back)."""
    return [
        {"type": d.kind.value, **({"array": d.array} if d.array is not None else {"job": d.job})}
        for d in deps
    ]


_SLURM_TYPES = {"afterok": DependencyKind.AFTER_OK, "afterany": DependencyKind.AFTER_ANY,
                "afternotok": DependencyKind.AFTER_NOT_OK}


def parse_slurm_dependencies(text: str) -> list[dict[str, object]]:
    """Slurm's `--dependency` syntax as the web form takes it (the CLI has its own copy:
    it imports no server code): `afterok:12:13,afterany:14`, `a<ID>` for a whole array
    (`afterok:a7`) -> the stored form; ValueError naming the first part that is not."""
    deps: list[Dependency] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, *ids = part.split(":")
        kind = _SLURM_TYPES.get(name.strip().lower())
        if kind is None or not ids:
            raise ValueError(f"Write TYPE:ID[:ID...] with TYPE one of "
                             f"{', '.join(_SLURM_TYPES)}, not {part!r}.")
        for ident in (i.strip() for i in ids):
            array = ident.startswith("a")
            number = ident[1:] if array else ident
            if not number.isdigit() or int(number) < 1:
                raise ValueError(f"{ident!r} is neither a job id nor a<ARRAY ID>.")
            deps.append(Dependency(kind, array=int(number)) if array
                        else Dependency(kind, job=int(number)))
    return dependencies_stored(dict.fromkeys(deps))


def slurm_dependencies_text(stored: object) -> str:
    """The stored form in Slurm's syntax (`afterok:12:a7,afterany:14`), for display."""
    try:
        deps = parse_dependencies(stored)
    except ValueError:
        return ""
    names = {v: k for k, v in _SLURM_TYPES.items()}
    by_kind: dict[DependencyKind, list[str]] = {}
    for d in deps:
        by_kind.setdefault(d.kind, []).append(f"a{d.array}" if d.array is not None else str(d.job))
    return ",".join(f"{names[k]}:{':'.join(ids)}" for k, ids in by_kind.items())
