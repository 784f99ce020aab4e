"""Where every queued job stands and why it waits (rule P3), for everyone who asks: the
API's job detail, the CLI's `fairq prio`, the dashboard's queue and job pages, and the
submit form's preview of a job not submitted yet.

One admission plan of the whole queue answers all of them: the one each scheduler cycle
made from its snapshot (step 3) and publishes right after applying it (step 4), its
admitted jobs left out (`queue_plan_publish`, in columns: `PublishedPlan`). No web
request plans a long queue: with no plan published (no cycle yet, the cache flushed)
a request plans the queue itself only when at most FAIRQ_QUEUE_PLAN_WEB_MAX jobs are
queued, and answers "planning" otherwise; a job queued after the cycle's plan gets one
fresh plan on such a short queue, and "planning" (the next cycle places it) on a long
one. The request's own plan (`_plan_compute`, the path before cycles published theirs,
kept as `PUBLISHED = False`) is cached for `QUEUE_PLAN_TTL` seconds and dropped by
`queue_plan_forget`. The preview needs the snapshot a plan was made from: once a
preview asks, it is planned here and kept beside its plan until the plan changes, in
plain rows (100,000 queued jobs pickle in 1.7 s as dataclasses, 0.17 s as rows).

A read fetches only the current plan's generation (a short string) from the shared cache;
each process keeps the last plan (and snapshot) it unpickled and reuses it while the
generation is the same. Unpickling the plan itself cost every read ~30 ms per 10,000
queued jobs (218 ms against `sprio`'s 10 ms); the generation key lives and dies
with the plan (same TTL, dropped together), so the local copy is never older than the
shared one; the published plan is read the same way. After a miss one process plans (it
holds the build mark) and the readers of the others wait for its plan, so a miss costs
the cores one plan, not one per process.

A read model: the plan is made from the cycle's own snapshot (`selectors.snapshot`) and
the published cluster view, and nothing here writes fairq's state. `queue_plan_forget`
drops the cached plan and its snapshot; it lives here, beside the cache keys it deletes,
so the cycle and the front ends that call it never name them; the cycle's published plan
is not dropped by it, only replaced by the next cycle's.
"""

from __future__ import annotations

import hashlib
import operator
import pickle
import time
import uuid
from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from datetime import datetime
from itertools import chain, repeat
from operator import attrgetter
from typing import Any, cast

import numpy as np
from django.conf import settings
from django.core.cache import cache
from django.db.models import QuerySet

from accounts.models import Team
from queueing.models import GpuType, Job
from queueing.policy.admission import Order, Plan, plan_admissions
from queueing.policy.explain import PlanEntry, explain_queue, explain_queued
from queueing.policy.snapshot import FlavorFallback, QueuedJob, Snapshot
from queueing.policy.stages.waits import REASONS, Wait, WaitReason, Waits, wording
from queueing.policy.states import JobState

from .cluster import cluster_view
from .dashboard import LIST_DEFER, PAGE_CACHE_KEYS
from .fairshare import job_priority_breakdown
from .snapshot import build_snapshot, topology_of

QUEUE_PLAN_TTL = 3.0  # seconds: about one scheduler cycle
_PLAN_KEY = "fairq:queue-plan"
# The generation of the cached plan alone: what a read fetches to know its local copy is current.
_GEN_KEY = "fairq:queue-plan:generation"
# Set (add-if-absent) by the process planning the queue after a miss; the others wait for it.
_BUILD_KEY = "fairq:queue-plan:building"
PLAN_BUILD_WAIT = 10.0  # seconds a reader waits for another process's plan, then plans itself
# (plan generation, the snapshot it was made from): the preview places a candidate on it.
_SNAPSHOT_KEY = "fairq:queue-plan:snapshot"
_PREVIEW_KEY = "fairq:queue-plan:preview"


class _Answers:
    """Rules P3 and E5 read from one plan of the queue, whatever keeps it: `entry` gives a
    job's `PlanEntry` (None when the plan does not know it)."""

    queued: int
    error: str
    generation: str
    planning: bool

    def entry(self, job_id: int) -> PlanEntry | None:
        raise NotImplementedError

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, int) and self.entry(job_id) is not None

    def position(self, job_id: int) -> int | None:
        e = self.entry(job_id)
        return None if e is None else e.position

    def reasons(self, job_id: int) -> list[dict[str, Any]]:
        e = self.entry(job_id)
        if e is None:
            return []
        return [r.as_dict() for r in e.reasons()]

    def brief(self, job_id: int) -> dict[str, Any] | None:
        """Rule E5: what a list shows of a queued job: `position`, `jobs_ahead` (of its GPU
        type, rule E1) and `reason` ({code, message, until?}); None when not in the plan."""
        e = self.entry(job_id)
        if e is None:
            return None
        reason = e.reason()
        return {"position": e.position, "jobs_ahead": e.ahead_same_gpu_type,
                "reason": reason.as_dict() if reason is not None else None}

    def standing(self, job_id: int) -> dict[str, Any] | None:
        """The `queue` part of a job's detail: rule E5's `brief` (position, jobs_ahead,
        reason) and every reason, the jobs ahead of any type and the queue's length."""
        e = self.entry(job_id)
        brief = self.brief(job_id)
        if brief is None or e is None:
            return None
        return {**brief, "ahead": e.ahead, "ahead_same_gpu_type": e.ahead_same_gpu_type,
                "queued": self.queued, "reasons": self.reasons(job_id)}


@dataclass(frozen=True)
class QueuePlan(_Answers):
    """Rule P3 for the whole queue, from one admission plan. `entries`: job id ->
    `PlanEntry` (named tuples: see there). `planning`: no plan is there to read (the
    scheduler has published none and the queue is too long for a request to plan it)."""

    entries: dict[int, PlanEntry]
    queued: int
    error: str = ""
    generation: str = ""  # names one computed plan (and its snapshot) in the cache
    planning: bool = False

    def entry(self, job_id: int) -> PlanEntry | None:
        return self.entries.get(job_id)

    def positions(self) -> dict[int, int]:
        return {job_id: e.position for job_id, e in self.entries.items()}

    def team_order(self, team: str | None, limit: int | None = None) -> list[int]:
        """The ids of `team`'s jobs in the plan (every team's: None) in queue order
        (rule P2's positions), the first `limit`. Built for every team at once on the
        first ask and kept with this plan (per process: not pickled), so a page costs
        O(its team's jobs), not a walk and a sort of the whole queue;
        `team_order_reference` is the plain walk it is held to."""
        by_team: dict[str | None, list[int]] | None = self.__dict__.get("_by_team")
        if by_team is None:
            ordered = sorted(self.entries.items(), key=lambda kv: (kv[1].position, kv[0]))
            by_team = {None: [job_id for job_id, _ in ordered]}
            for job_id, e in ordered:
                by_team.setdefault(e.team, []).append(job_id)
            object.__setattr__(self, "_by_team", by_team)  # frozen: kept beside the fields
        return by_team.get(team, [])[:limit]

    def team_order_reference(self, team: str | None) -> list[int]:
        """`team_order` the plain way: every entry walked and sorted (the reference path)."""
        return [job_id for _, job_id in sorted(
            (e.position, job_id) for job_id, e in self.entries.items()
            if team is None or e.team == team)]

    def __getstate__(self) -> dict[str, Any]:
        """The fields only: the team index is rebuilt by whoever reads the plan."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


# --- the plan the scheduler cycle publishes ---------------------------------------------------
#
# The cycle plans the whole queue from its snapshot (step 3); after applying it (step 4)
# it publishes that plan for the pages (`queue_plan_publish`), so no web request plans a
# long queue again. Compact: one column per field (arrays of machine integers; strings and
# instants as indexes into small tables of the distinct ones), which pickle and unpickle
# as a few byte strings whatever the queue's length, not one object per job; a reader
# finds a job by binary search on the sorted ids and a team's jobs from a per-team index
# of positions, and builds `PlanEntry`s only for the jobs it shows.

PUBLISHED = True  # False: the path before (the cycle drops the plan; a request plans it)
PUBLISHED_TTL = 300.0  # seconds a published plan answers when no cycle replaces it
_PUB_KEY = "fairq:queue-plan:published"
_PUB_GEN_KEY = "fairq:queue-plan:published:generation"


@dataclass(frozen=True)
class PublishedPlan(_Answers):
    """Rule P3 for the whole queue as the last cycle planned it, in columns (above).
    Row i is position i + 1: `ids`, `ahead_same` (rule E1), and indexes into `teams`,
    `types`, `codes`, `messages`, `untils` (-1: none). `by_id`/`by_id_row`: the ids
    sorted and their rows; `team_rows[team_start[k]:team_start[k + 1]]` the rows of
    `teams[k]`, in queue order."""

    generation: str
    queued: int
    made_at: float
    ids: array[int]
    ahead_same: array[int]
    team_ix: array[int]
    type_ix: array[int]
    code_ix: array[int]
    message_ix: array[int]
    until_ix: array[int]
    teams: tuple[str, ...]
    types: tuple[str, ...]
    codes: tuple[str, ...]
    messages: tuple[str, ...]
    untils: tuple[datetime, ...]
    by_id: array[int]
    by_id_row: array[int]
    team_rows: array[int]
    team_start: array[int]
    error: str = ""
    planning: bool = False

    def _row(self, job_id: int) -> int | None:
        i = bisect_left(self.by_id, job_id)
        if i < len(self.by_id) and self.by_id[i] == job_id:
            return int(self.by_id_row[i])
        return None

    def _entry_at(self, row: int) -> PlanEntry:
        u = self.until_ix[row]
        return PlanEntry(row + 1, self.ahead_same[row], self.teams[self.team_ix[row]],
                         self.types[self.type_ix[row]], self.codes[self.code_ix[row]],
                         self.messages[self.message_ix[row]], self.untils[u] if u >= 0 else None)

    def entry(self, job_id: int) -> PlanEntry | None:
        row = self._row(job_id)
        return None if row is None else self._entry_at(row)

    def positions(self) -> dict[int, int]:
        return {job_id: row + 1 for row, job_id in enumerate(self.ids)}

    def team_order(self, team: str | None, limit: int | None = None) -> list[int]:
        """`QueuePlan.team_order` read from the per-team index: O(the ids returned)."""
        if team is None:
            return list(self.ids[:limit])
        try:
            k = self.teams.index(team)
        except ValueError:
            return []
        start, end = self.team_start[k], self.team_start[k + 1]
        if limit is not None:
            end = min(end, start + limit)
        return [self.ids[r] for r in self.team_rows[start:end]]


class _Interned:
    """Distinct values in first-seen order and each one's index."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.index: dict[Any, int] = {}

    def __call__(self, value: Any) -> int:
        i = self.index.get(value)
        if i is None:
            i = self.index[value] = len(self.values)
            self.values.append(value)
        return i


# True: `published_plan_of` reads the plan's waits per class (`_in_order_per_class`);
# False: a `Wait` per job (`_in_order`, the reference, held to it by
# tests/test_published_plan.py).
_PER_CLASS_READ = True
_id_of = attrgetter("id")
_Words = tuple[WaitReason, str, datetime | None]


def _in_order(snapshot: Snapshot, plan: Plan) -> Iterator[tuple[QueuedJob, _Words | None]]:
    """`snapshot`'s queued jobs in the order the pass used (rules P2, F6), then those it
    did not order, each with its wait (reason, message, until; None: none), one `Wait`
    read per job."""
    by_id = {q.id: q for q in snapshot.queued}
    order = [by_id[i] for i in plan.order if i in by_id]
    seen = {q.id for q in order}
    order += [q for q in snapshot.queued if q.id not in seen]
    waits = plan.waits
    for job in order:
        w = waits.get(job.id)
        yield job, None if w is None else (w.reason, w.message, w.until)


def _in_order_per_class(snapshot: Snapshot, plan: Plan
                        ) -> Iterator[tuple[QueuedJob, _Words | None]]:
    """`_in_order` without a `Wait` per job or the order's tuple of ids: the order read
    as the pass kept it (`Order.read`) and the waits put in words once per class
    (`Waits.words`, whose bulk is not expanded)."""
    by_id = {q.id: q for q in snapshot.queued}
    order = plan.order
    if isinstance(order, Order):
        indices, ids = order.read()
    else:
        indices, ids = range(len(order)), order
    waits = plan.waits
    get = by_id.get
    found = 0
    if isinstance(waits, Waits):
        for index, w in zip(indices, waits.words(indices, ids), strict=True):
            job = get(ids[index])
            if job is not None:
                found += 1
                yield job, w
    else:
        for index in indices:
            job = get(ids[index])
            if job is not None:
                found += 1
                x = waits.get(job.id)
                yield job, None if x is None else (x.reason, x.message, x.until)
    if found == len(by_id):
        return
    seen = {ids[index] for index in indices}
    for job in snapshot.queued:
        if job.id not in seen:
            x = waits.get(job.id)
            yield job, None if x is None else (x.reason, x.message, x.until)


def published_plan_of(snapshot: Snapshot, plan: Plan, *, leave_out: Collection[int] = (),
                      unprovisioned: Iterable[tuple[int, str, str]] = ()) -> PublishedPlan:
    """The compact plan of `snapshot`'s queue as `plan` decided it: the order the pass used
    (rules P2, F6), the waits it gave (rule E4's instants), "next_cycle" for what it
    admits, less `leave_out` (the jobs the cycle admitted: no longer queued) and with
    positions counted among the jobs left; then the jobs of teams whose namespace is not
    provisioned (`unprovisioned`: id, team, GPU type, oldest first). The same answers as
    `_plan_compute`'s on that snapshot, column by column."""
    left_out = set(leave_out)
    admitted = {a.job_id for a in plan.admissions}
    if _IN_CLASSES:
        fast = _published_in_classes(snapshot, plan, left_out, admitted, list(unprovisioned))
        if fast is not None:
            return fast
    teams, types, codes, messages, untils = (_Interned() for _ in range(5))
    codes("")
    messages("")
    ids, ahead_same = array("q"), array("i")
    team_ix, type_ix, code_ix, message_ix, until_ix = (array("i") for _ in range(5))
    same: dict[str, int] = {}
    sets: dict[tuple[str, ...], int] = {}
    for job, w in (_in_order_per_class if _PER_CLASS_READ else _in_order)(snapshot, plan):
        if job.id in left_out:
            continue
        kinds = job.accepted_types
        if len(kinds) == 1:
            ahead_same.append(same.get(job.gpu_type, 0))
        else:  # rules E1, G5 (as `explain_queue`)
            wanted = frozenset(kinds)
            ahead_same.append(sum(n for s, n in sets.items() if not wanted.isdisjoint(s)))
        for gt in kinds:
            same[gt] = same.get(gt, 0) + 1
        sets[kinds] = sets.get(kinds, 0) + 1
        ids.append(job.id)
        team_ix.append(teams(job.team))
        type_ix.append(types(job.gpu_type))
        if job.id in admitted:
            code_ix.append(codes("next_cycle"))
            message_ix.append(0)
        elif w is not None:
            code_ix.append(codes(str(w[0])))
            message_ix.append(messages(w[1] or str(w[0])))
        else:
            code_ix.append(0)
            message_ix.append(0)
        until_ix.append(untils(w[2]) if w is not None and w[2] is not None else -1)
    for job_id, team, gpu_type in unprovisioned:
        ids.append(job_id)
        ahead_same.append(0)
        team_ix.append(teams(team))
        type_ix.append(types(gpu_type))
        code_ix.append(codes("namespace_not_provisioned"))
        message_ix.append(messages(_unprovisioned_message(team)))
        until_ix.append(-1)
    sorted_rows = sorted(range(len(ids)), key=ids.__getitem__)
    by_team: list[list[int]] = [[] for _ in teams.values]
    for row, k in enumerate(team_ix):
        by_team[k].append(row)
    team_rows, team_start = array("i"), array("q", [0])
    for rows in by_team:
        team_rows.extend(rows)
        team_start.append(len(team_rows))
    return PublishedPlan(
        generation=uuid.uuid4().hex, queued=len(ids), made_at=time.time(), ids=ids,
        ahead_same=ahead_same, team_ix=team_ix, type_ix=type_ix, code_ix=code_ix,
        message_ix=message_ix, until_ix=until_ix, teams=tuple(teams.values),
        types=tuple(types.values), codes=tuple(codes.values),
        messages=tuple(messages.values), untils=tuple(untils.values),
        by_id=array("q", [ids[r] for r in sorted_rows]), by_id_row=array("i", sorted_rows),
        team_rows=team_rows, team_start=team_start)


# True: `published_plan_of` builds the columns per class of equal jobs and per distinct
# wait, over arrays (`_published_in_classes`), when the plan's jobs are the snapshot's
# and the pass found their classes; False: the loop per job above (the reference, held
# to it by tests/test_published_plan.py).
_IN_CLASSES = True
_RESERVED = REASONS.index(WaitReason.RESERVED)


def _np_array(values: Any, typecode: str) -> array[int]:
    """A numpy vector as the `array` of `typecode` the published plan keeps."""
    return array(typecode, np.ascontiguousarray(values, dtype=_NP_TYPE[typecode]).tobytes())


_NP_TYPE = {"i": np.int32, "q": np.int64}


def _first_seen(keys: Any, size: int) -> tuple[Any, Any]:
    """(the distinct values of `keys`, integers in [0, size), in the order they first
    occur; per position the index of its value in that order). No sort of `keys`."""
    first = np.full(size, len(keys), dtype=np.int64)
    np.minimum.at(first, keys, np.arange(len(keys), dtype=np.int64))
    present = np.flatnonzero(first < len(keys))
    distinct = present[np.argsort(first[present], kind="stable")]
    rank = np.empty(size, dtype=np.int64)
    rank[distinct] = np.arange(len(distinct), dtype=np.int64)
    return distinct, rank[keys]


def _published_in_classes(snapshot: Snapshot, plan: Plan, left_out: set[int],
                          admitted: set[int], unprovisioned: list[tuple[int, str, str]]
                          ) -> PublishedPlan | None:
    """`published_plan_of`'s columns built per class of equal jobs (`Waits.classes`)
    and per distinct wait, not per job: a job's team, GPU type and accepted types read
    once per class; a wait kept in bulk (`Waits.bulk`) put in words once per replayed
    entry and class, any other once per raw entry and class (rule A9's reserved waits,
    which read the job's runtime, and the jobs of `Waits.own_words` per job); rule E1's
    jobs ahead by running counts per set of accepted types; the interned tables in the
    order the rows first name them. None when it does not apply (the plan's jobs are not
    the snapshot's, or their classes were not found): the caller reads per job."""
    waits, order = plan.waits, plan.order
    if not isinstance(waits, Waits):
        return None
    jobs, classes = waits.jobs, waits.classes
    queued = snapshot.queued
    n = len(jobs)
    if (len(classes) != n or len(queued) != n
            or not all(map(operator.is_, jobs, queued))):
        return None
    read, ids_of = order.read() if isinstance(order, Order) else (None, order)
    lazy = read is not None and not isinstance(read, range)  # ids_of: the id per job index
    job_ids = np.fromiter(ids_of if lazy else map(_id_of, jobs), dtype=np.int64, count=n)
    by_job_id = (np.arange(n) if n < 2 or bool((job_ids[1:] > job_ids[:-1]).all())
                 else np.argsort(job_ids, kind="stable"))
    sorted_job_ids = job_ids[by_job_id]

    def indices_of(ids_: Any) -> Any:
        """The jobs' indices of `ids_` (each one of the plan's jobs)."""
        return by_job_id[np.searchsorted(sorted_job_ids, ids_)]

    def known_indices(ids_: Iterable[int]) -> Any:
        """The jobs' indices of the ids of `ids_` that are the plan's jobs', in turn."""
        got = np.fromiter(ids_, dtype=np.int64)
        return indices_of(got[np.isin(got, job_ids)])

    # The plan's job indices in rule O1's order, as the pass kept them or from its ids.
    ordered = (np.fromiter(read, dtype=np.int64, count=len(read)) if read is not None and lazy
               else known_indices(ids_of))
    in_order = np.zeros(n, dtype=bool)
    in_order[ordered] = True
    rows = np.concatenate([ordered, np.flatnonzero(~in_order)])  # then the rest, in queue order
    if left_out:
        rows = rows[~np.isin(job_ids[rows], np.fromiter(left_out, dtype=np.int64))]

    # Per class (indexed by its value, a job index): its wording (what a wait's words
    # read of the job but its runtime), team, GPU type and accepted types, each as an
    # index into a table of distinct ones.
    cls_np = np.asarray(classes, dtype=np.int64)
    heads = np.zeros(n, dtype=bool)
    heads[cls_np] = True
    wording_of, team_key, type_key, kind_of = (np.zeros(n, dtype=np.int64) for _ in range(4))
    wordings: dict[tuple[Any, ...], int] = {}
    team_names: list[str] = []
    type_names: list[str] = []
    team_index: dict[str, int] = {}
    type_index: dict[str, int] = {}
    kinds_of: list[tuple[str, ...]] = []
    kinds_index: dict[tuple[str, ...], int] = {}
    for c in np.flatnonzero(heads).tolist():
        job = jobs[c]
        wording_of[c] = wordings.setdefault(wording(job), len(wordings))
        team_key[c] = team_index.setdefault(job.team, len(team_names))
        if team_key[c] == len(team_names):
            team_names.append(job.team)
        type_key[c] = type_index.setdefault(job.gpu_type, len(type_names))
        if type_key[c] == len(type_names):
            type_names.append(job.gpu_type)
        kinds = job.accepted_types
        kind_of[c] = kinds_index.setdefault(kinds, len(kinds_of))
        if kind_of[c] == len(kinds_of):
            kinds_of.append(kinds)

    # Each job's wait as an index into `said` (-1: none).
    said: list[_Words] = []
    word_of = np.full(n, -1, dtype=np.int64)
    # (reason code, held, ceiling, wording) -> its index in `said`: raw and bulk alike.
    shared_said: dict[tuple[int, int, int, int], int] = {}

    def said_once(key: tuple[int, int, int, int], job_id: int,
                  raw: tuple[int, int, int, int]) -> int:
        w = shared_said.get(key)
        if w is None:
            w = shared_said[key] = len(said)
            said.append(waits.words_of(job_id, raw))
        return w

    own = waits.own_words()
    raw_ids = np.fromiter(waits._raw, dtype=np.int64, count=len(waits._raw))
    raw_values = list(waits._raw.values())
    is_raw = np.fromiter(map(isinstance, raw_values, repeat(tuple)), dtype=bool,
                         count=len(raw_values))
    others: list[tuple[int, Wait | tuple[int, int, int, int]]] = []  # words per job
    if is_raw.any():
        at = np.flatnonzero(is_raw)
        # (reason code, job index, held, ceiling) per raw wait
        tuples = cast(list[tuple[int, int, int, int]], [raw_values[k] for k in at.tolist()])
        raws = np.fromiter(chain.from_iterable(tuples),
                           dtype=np.int64, count=4 * len(at)).reshape(-1, 4)
        alone = (raws[:, 0] == _RESERVED) | np.isin(raw_ids[at], np.fromiter(own, np.int64))
        for k in np.flatnonzero(alone).tolist():
            others.append((int(raw_ids[at[k]]), raw_values[at[k]]))
        shared = np.flatnonzero(~alone)
        if len(shared):
            index = raws[shared, 1]
            keys = np.stack([raws[shared, 0], raws[shared, 2], raws[shared, 3],
                             wording_of[cls_np[index]]], axis=1)
            by_key = np.lexsort(keys.T[::-1])
            in_key = keys[by_key]
            starts = np.flatnonzero(np.concatenate(
                [[True], (in_key[1:] != in_key[:-1]).any(axis=1)]))
            firsts = at[shared[by_key[starts]]].tolist()  # a raw wait of each key
            word = np.array([said_once(tuple(key), job_id, raw_values[k]) for key, job_id, k
                             in zip(in_key[starts].tolist(), raw_ids[firsts].tolist(),
                                    firsts, strict=True)], dtype=np.int64)
            word_of[index[by_key]] = np.repeat(word, np.diff(np.append(starts, len(by_key))))
    others += [(int(raw_ids[k]), raw_values[k]) for k in np.flatnonzero(~is_raw).tolist()]
    index_of = dict(zip(job_ids[known_indices(j for j, _ in others)].tolist(),
                        known_indices(j for j, _ in others).tolist(), strict=True))
    for job_id, raw in others:
        if job_id in index_of:
            word_of[index_of[job_id]] = len(said)
            said.append(waits.words_of(job_id, raw))
    bulk, bulk_held = waits.bulk, waits.bulk_held
    if bulk:
        at = np.array(bulk, dtype=np.int64)
        wording_at = wording_of[cls_np[at]]
        # One key per replayed entry (the same object) and wording.
        _, entry = np.unique(np.fromiter(map(id, bulk_held), dtype=np.int64,
                                         count=len(bulk_held)), return_inverse=True)
        _, firsts, inverse = np.unique(entry.reshape(-1) * (n + 1) + wording_at,
                                       return_index=True, return_inverse=True)
        per_job = np.isin(at, known_indices(own))
        word = np.empty(len(firsts), dtype=np.int64)
        for k, b in enumerate(firsts.tolist()):
            h, index = bulk_held[b], bulk[b]
            if h[1] == _RESERVED:  # rule A9 reads the job's runtime: per job below
                word[k] = -2
                continue
            word[k] = said_once((h[1], h[2], h[3], int(wording_at[b])),
                                int(job_ids[index]), (h[1], index, h[2], h[3]))
        words = word[inverse.reshape(-1)]
        per_job |= words == -2
        word_of[at] = words
        for b in np.flatnonzero(per_job).tolist():
            h, index = bulk_held[b], bulk[b]
            word_of[index] = len(said)
            said.append(waits.words_of(int(job_ids[index]), (h[1], index, h[2], h[3])))

    # The rows' waits, codes, messages and instants, interned in the order rows name them.
    teams, types, codes, messages, untils = (_Interned() for _ in range(5))
    codes("")
    messages("")
    row_ids = job_ids[rows]
    is_admitted = (np.isin(row_ids, np.fromiter(admitted, dtype=np.int64))
                   if admitted else np.zeros(len(rows), dtype=bool))
    said_keys, said_rank = _first_seen((word_of[rows] + 1) * 2 + is_admitted,
                                       2 * len(said) + 2)
    code_of, message_of, until_of = (np.empty(len(said_keys), dtype=np.int64)
                                     for _ in range(3))
    for k, x in enumerate(said_keys.tolist()):
        w = said[x // 2 - 1] if x >= 2 else None
        if x % 2:
            code_of[k], message_of[k] = codes("next_cycle"), 0
        elif w is not None:
            code_of[k], message_of[k] = codes(str(w[0])), messages(w[1] or str(w[0]))
        else:
            code_of[k] = message_of[k] = 0
        until_of[k] = untils(w[2]) if w is not None and w[2] is not None else -1

    # Team, GPU type and rule E1's jobs ahead, per class.
    row_classes = cls_np[rows]
    row_kind = kind_of[row_classes]
    team_keys, team_rank = _first_seen(team_key[row_classes], len(team_names))
    type_keys, type_rank = _first_seen(type_key[row_classes], len(type_names))
    team_of = np.array([teams(team_names[k]) for k in team_keys.tolist()], dtype=np.int64)
    type_of = np.array([types(type_names[k]) for k in type_keys.tolist()], dtype=np.int64)
    ahead_same = np.zeros(len(rows), dtype=np.int64)
    before: list[Any] = []  # per set of accepted types: its rows before each row
    for s_ in range(len(kinds_of)):
        mine = row_kind == s_
        before.append(np.cumsum(mine) - mine)
    for w_, wanted in enumerate(kinds_of):
        mine = row_kind == w_
        for s_, kinds in enumerate(kinds_of):
            if not set(wanted).isdisjoint(kinds):
                ahead_same[mine] += before[s_][mine]

    ids = row_ids
    team_ix = team_of[team_rank] if len(team_of) else team_rank
    type_ix = type_of[type_rank] if len(type_of) else type_rank
    code_ix, message_ix = code_of[said_rank], message_of[said_rank]
    until_ix = until_of[said_rank]
    if unprovisioned:
        extra = len(unprovisioned)
        ids = np.concatenate([ids, np.fromiter((j for j, _, _ in unprovisioned),
                                               dtype=np.int64, count=extra)])
        ahead_same = np.concatenate([ahead_same, np.zeros(extra, dtype=np.int64)])
        team_ix = np.concatenate([team_ix, [teams(t) for _, t, _ in unprovisioned]])
        type_ix = np.concatenate([type_ix, [types(g) for _, _, g in unprovisioned]])
        code_ix = np.concatenate([code_ix, [codes("namespace_not_provisioned")] * extra])
        message_ix = np.concatenate([message_ix, [messages(_unprovisioned_message(t))
                                                  for _, t, _ in unprovisioned]])
        until_ix = np.concatenate([until_ix, np.full(extra, -1, dtype=np.int64)])
    sorted_rows = np.argsort(ids)  # the ids are distinct
    team_rows = np.argsort(team_ix.astype(np.uint16) if len(teams.values) < 1 << 16
                           else team_ix, kind="stable")  # 16 bits: a radix sort
    team_start = np.concatenate([[0], np.cumsum(np.bincount(team_ix.astype(np.int64),
                                                            minlength=len(teams.values)))])
    return PublishedPlan(
        generation=uuid.uuid4().hex, queued=len(ids), made_at=time.time(),
        ids=_np_array(ids, "q"), ahead_same=_np_array(ahead_same, "i"),
        team_ix=_np_array(team_ix, "i"), type_ix=_np_array(type_ix, "i"),
        code_ix=_np_array(code_ix, "i"), message_ix=_np_array(message_ix, "i"),
        until_ix=_np_array(until_ix, "i"), teams=tuple(teams.values),
        types=tuple(types.values), codes=tuple(codes.values),
        messages=tuple(messages.values), untils=tuple(untils.values),
        by_id=_np_array(ids[sorted_rows], "q"), by_id_row=_np_array(sorted_rows, "i"),
        team_rows=_np_array(team_rows, "i"), team_start=_np_array(team_start, "q"))


# A quiet cycle (nothing the plan depends on changed since the last plan published)
# publishes nothing: the plan standing is the one it would publish. Its waits are
# instants and fair-share usage decays, so a plan is published again once older than
# PUBLISH_MAX_AGE seconds whatever the mark says. (PUBLISH_SKIP False: every cycle
# publishes, the path before.)
PUBLISH_SKIP = True
PUBLISH_MAX_AGE = 30.0
# The snapshot's fields the mark leaves out: the jobs (the active jobs' `version` stands
# for their rows), the clock and what only time moves (PUBLISH_MAX_AGE bounds those).
_MARK_LEAVES_OUT = frozenset({"now", "queued", "running", "fair_share", "fair_share_state"})


@dataclass
class _Mark:
    """The mark of the plan this process published last, and its generation and age."""

    mark: str
    generation: str
    made_at: float


_LAST_MARK: list[_Mark] = []  # at most one


def plan_inputs_mark(snapshot: Snapshot, *, jobs_version: int, extra: Any = ()) -> str | None:
    """What the queue's plan depends on, as a short digest: the active jobs' rows (their
    `ActiveJobs.version`, new whenever a row was read: a submit, cancel, edit or any
    move), every field of `snapshot` but the jobs and what only time moves (the nodes,
    quotas, tiers' and teams' settings, GPU types, clusters, bookings, dependencies,
    arrays' limits...), the teams' tree and weights (rules F2, F4) but not their decayed
    usage, and `extra` (the lookups, the unprovisioned teams). The same mark means the
    same plan but for what time moves. None when it cannot be made (the cycle
    publishes)."""
    parts = [jobs_version, extra] + [(f.name, getattr(snapshot, f.name))
                                     for f in fields(snapshot)
                                     if f.name not in _MARK_LEAVES_OUT]
    state = snapshot.fair_share_state
    if state is not None:  # the teams' tree and shares (weights); not the decaying usage
        parts.append([getattr(state, name, None) for name in ("_share", "_level", "_ancestors")])
    try:
        raw = pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # something unpicklable: no mark, so the plan is published
        return None
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def queue_plan_publish(*, snapshot: Snapshot, plan: Plan, admitted: Collection[int],
                       unprovisioned: Collection[str],
                       mark: str | None = None) -> PublishedPlan | None:
    """The cycle's step 6: its plan (`published_plan_of`, `admitted` left out) for every
    reader of rule P3, replacing the last one; a plan a request made is dropped (older).
    Nothing with `PUBLISHED` off. `mark` (`plan_inputs_mark`; None: always publish):
    the same as the last plan's, that plan still in the cache and younger than
    PUBLISH_MAX_AGE, nothing is published (a quiet cycle) and that plan is returned."""
    if not PUBLISHED:
        return None
    if PUBLISH_SKIP and mark is not None and _LAST_MARK:
        last = _LAST_MARK[0]
        if (last.mark == mark and time.time() - last.made_at < PUBLISH_MAX_AGE
                and cache.get(_PUB_GEN_KEY) == last.generation):
            standing = _published(last.generation)
            if standing is not None:
                return standing
    published = published_plan_of(snapshot, plan, leave_out=admitted,
                                   unprovisioned=_unprovisioned_waiting(unprovisioned))
    cache.set_many({_PUB_KEY: published, _PUB_GEN_KEY: published.generation},
                   timeout=PUBLISHED_TTL)
    cache.delete_many([_GEN_KEY, _PLAN_KEY, _SNAPSHOT_KEY])
    _Local.published = published
    _LAST_MARK[:] = [_Mark(mark, published.generation, published.made_at)] if mark else []
    return published


def _published(generation: str | None) -> PublishedPlan | None:
    """The plan the last cycle published, named `generation` (this process's copy while
    current); None when there is none or `PUBLISHED` is off."""
    if not PUBLISHED:
        return None
    found: PublishedPlan | None = _kept(generation, "published", _PUB_KEY)
    return found


def _kept(generation: str | None, local: str, key: str) -> Any:
    """The plan cached under `key` named `generation`: this process's copy (`_Local`'s
    attribute `local`) when it has it, else the shared one, then kept locally; None when
    there is none or the shared one is another."""
    if not generation:
        return None
    mine = getattr(_Local, local)
    if mine is not None and mine.generation == generation:
        return mine
    shared = cache.get(key)
    if shared is None or shared.generation != generation:
        return None
    setattr(_Local, local, shared)
    return shared


def _unprovisioned_waiting(teams: Collection[str]) -> list[tuple[int, str, str]]:
    """(id, team, GPU type) of the queued jobs of `teams`, oldest first."""
    if not teams:
        return []
    waiting = Job.objects.filter(status=JobState.QUEUED,
                                 team__slug__in=sorted(teams)).order_by("created_at", "id")
    return list(waiting.values_list("id", "team__slug", "gpu_type__slug"))


def _unprovisioned_message(team: str) -> str:
    return (f"the Kubernetes namespace of team {team} is not provisioned "
            "for fairq yet (an admin runs `manage.py sync_cluster`)")


def _queue_small() -> bool:
    """Whether a request may plan the queue itself: at most FAIRQ_QUEUE_PLAN_WEB_MAX
    queued jobs."""
    limit: int = settings.FAIRQ_QUEUE_PLAN_WEB_MAX
    return Job.objects.filter(status=JobState.QUEUED)[:limit + 1].count() <= limit


class _Local:
    """This process's copy of the last plan (and snapshot) it read or made, by generation."""

    plan: QueuePlan | None = None
    snapshot: tuple[str, Snapshot] | None = None
    published: PublishedPlan | None = None


def _plan_of(generation: str | None) -> QueuePlan | None:
    """The cached plan named `generation` (`_kept`)."""
    found: QueuePlan | None = _kept(generation, "plan", _PLAN_KEY)
    return found


AnyPlan = QueuePlan | PublishedPlan


def queue_plan(*, now: datetime, fresh: bool = False) -> AnyPlan:
    """The plan of the queue as it is: the one the last cycle published, or one a request
    made since (a job queued after the cycle's plan, on a short queue); with neither, one
    planned here when the queue is short (FAIRQ_QUEUE_PLAN_WEB_MAX), else an empty plan
    saying `planning`. `fresh`: planned here, now. A cluster that does not answer gives
    an empty plan with `error` set, never a failed request."""
    if fresh:
        return _plan_compute(now=now)[0]
    generations = cache.get_many([_GEN_KEY, _PUB_GEN_KEY])
    cached = _plan_of(generations.get(_GEN_KEY))
    if cached is not None:
        return cached
    published = _published(generations.get(_PUB_GEN_KEY))
    if published is not None:
        return published
    if PUBLISHED and not _queue_small():
        return QueuePlan({}, 0, planning=True)
    # A miss (a cycle moved a job, or the plan expired): one process plans, the readers of
    # the others wait for its plan instead of each planning the same queue on the same cores.
    mark = uuid.uuid4().hex
    if not cache.add(_BUILD_KEY, mark, timeout=PLAN_BUILD_WAIT):
        waited = _plan_of_another_process()
        if waited is not None:
            return waited
    try:
        return _plan_compute(now=now)[0]
    finally:
        if cache.get(_BUILD_KEY) == mark:
            cache.delete(_BUILD_KEY)


def queue_plan_for(*, job_ids: Collection[int], now: datetime) -> AnyPlan:
    """`queue_plan`, planned again here once when one of `job_ids` is missing from it
    (queued since) and a request may plan the queue (`_queue_small`); on a long queue
    such a job waits for the next cycle's plan (`not_planned`)."""
    plan = queue_plan(now=now)
    if (not plan.error and any(i not in plan for i in job_ids)
            and (not PUBLISHED or _queue_small())):
        plan = queue_plan(now=now, fresh=True)
    return plan


def not_planned(plan: AnyPlan) -> dict[str, str] | None:
    """Rule E5's reason for a queued job `plan` does not know, when a cycle's plan will
    place it (`planning`); None when the plan was made here (nothing to wait for)."""
    if PUBLISHED and plan.planning:
        return {"code": "planning", "message": "the scheduler has not published its plan of "
                "the queue yet: the next cycle places this job"}
    if isinstance(plan, PublishedPlan):
        return {"code": "planning", "message": "queued after the scheduler's last plan: the "
                "next cycle places this job"}
    return None


def _plan_of_another_process() -> QueuePlan | None:
    """The plan the process holding the build mark caches, once it does; None when it
    gives up (an error plan is not cached), dies (the mark expires) or takes longer than
    `PLAN_BUILD_WAIT`."""
    deadline = time.monotonic() + PLAN_BUILD_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.05)
        got = cache.get_many([_GEN_KEY, _BUILD_KEY])
        plan = _plan_of(got.get(_GEN_KEY))
        if plan is not None:
            return plan
        if got.get(_BUILD_KEY) is None:
            return None
    return None


def _plan_with_snapshot(*, now: datetime) -> tuple[QueuePlan, Snapshot | None]:
    """The cached plan and the snapshot it was made from, or a fresh pair, both kept, when
    either is missing or they are of different plans; no snapshot when the plan has an
    error."""
    local = _Local.snapshot
    generation: str | None = cache.get(_GEN_KEY)
    plan = _plan_of(generation)
    if plan is not None and local is not None and local[0] == plan.generation:
        return plan, local[1]
    kept = cache.get(_SNAPSHOT_KEY)
    if plan is not None and kept is not None and kept[0] == plan.generation:
        snapshot = _snapshot_unpack(kept[1])
        _Local.snapshot = (plan.generation, snapshot)
        return plan, snapshot
    return _plan_compute(now=now, keep_snapshot=True)


def _plan_compute(*, now: datetime,
                  keep_snapshot: bool = False) -> tuple[QueuePlan, Snapshot | None]:
    """One admission plan of the whole queue from the cycle's snapshot, cached (with the
    snapshot when `keep_snapshot`)."""
    view = cluster_view(now=now)
    if view.published_at is None and view.error:
        return QueuePlan({}, 0, error=view.error[:200]), None
    try:
        snapshot = build_snapshot(backend=view, now=now, live_workloads=set(view.workloads))
    except Exception as exc:  # a broken view must not break a page or a poll
        return QueuePlan({}, 0, error=str(exc)[:200]), None
    entries = plan_entries(snapshot, plan_admissions(snapshot))
    order_len = len(entries)
    # Jobs of teams whose namespace is not provisioned stay out of the plan: after the rest.
    if view.unprovisioned:
        for n, (pk, team, gpu_type) in enumerate(
                _unprovisioned_waiting(view.unprovisioned), start=order_len + 1):
            entries[pk] = PlanEntry(n, 0, team, gpu_type, "namespace_not_provisioned",
                                    _unprovisioned_message(team))
    result = QueuePlan(entries, len(entries), generation=uuid.uuid4().hex)
    values: dict[str, Any] = {_PLAN_KEY: result, _GEN_KEY: result.generation}
    if keep_snapshot:
        values[_SNAPSHOT_KEY] = (result.generation, _snapshot_pack(snapshot))
        _Local.snapshot = (result.generation, snapshot)
    cache.set_many(values, timeout=QUEUE_PLAN_TTL)
    _Local.plan = result
    return result, snapshot


def plan_entries(snapshot: Snapshot, plan: Plan, *,
                 leave_out: Collection[int] = ()) -> dict[int, PlanEntry]:
    """Rule P3 for every queued job of `snapshot` as `plan` decided (`explain_queue` on the
    order the pass used, rules P2, F6), less `leave_out`: what a request's plan holds, and
    the reference `published_plan_of` is held to."""
    by_id = {q.id: q for q in snapshot.queued}
    order = [by_id[i] for i in plan.order if i in by_id]  # the order the pass used (P2, F6)
    seen = {q.id for q in order}
    order += [q for q in snapshot.queued if q.id not in seen]
    if leave_out:
        order = [q for q in order if q.id not in leave_out]
    admitted = {a.job_id for a in plan.admissions}
    waits: dict[int, tuple[str, str]] = {}
    until: dict[int, datetime] = {}
    for job_id, w in plan.waits.items():
        waits[job_id] = (str(w.reason), w.message or str(w.reason))
        if w.until is not None:
            until[job_id] = w.until
    explained = explain_queue(order, waits=waits, admitted=admitted, until=until)
    entries: dict[int, PlanEntry] = {}
    for q in order:
        x = explained[q.id]
        code, message = ("next_cycle", "") if q.id in admitted else waits.get(q.id, ("", ""))
        entries[q.id] = PlanEntry(x.position, x.ahead_same_gpu_type, q.team, q.gpu_type, code,
                                  message, until.get(q.id))
    return entries


def _snapshot_pack(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot's fields, each tuple of dataclasses (jobs, nodes) as its class and
    plain rows: several times faster to pickle and unpickle than the dataclasses."""
    out: dict[str, Any] = {}
    for f in fields(snapshot):
        value = getattr(snapshot, f.name)
        if isinstance(value, tuple) and value and is_dataclass(first := value[0]):
            cls = type(first)
            names = [g.name for g in fields(first)]
            if all(type(v) is cls for v in value):
                value = _Rows(cls, [tuple([getattr(v, n) for n in names]) for v in value])
        out[f.name] = value
    return out


def _snapshot_unpack(packed: dict[str, Any]) -> Snapshot:
    values: dict[str, Any] = {
        name: tuple(v.cls(*row) for row in v.rows) if isinstance(v, _Rows) else v
        for name, v in packed.items()}
    return Snapshot(**values)


@dataclass(frozen=True)
class _Rows:
    cls: Any
    rows: list[tuple[Any, ...]]


def queue_standing(*, job_id: int, now: datetime) -> dict[str, Any]:
    """Rule P3 for one queued job: its `QueuePlan.standing`, from the cached plan, or a
    fresh one when the job is newer than the cached plan; `cluster_unreachable` when the
    cluster does not answer."""
    plan = queue_plan_for(job_ids=(job_id,), now=now)
    if plan.error:
        unreachable = _unreachable(plan)
        return {"position": None, "jobs_ahead": None, "reason": unreachable, "ahead": None,
                "ahead_same_gpu_type": None, "queued": None, "reasons": [unreachable]}
    standing = plan.standing(job_id)
    if standing is not None:
        return standing
    later = not_planned(plan)
    return {"position": None, "jobs_ahead": None, "reason": later, "ahead": None,
            "ahead_same_gpu_type": None, "queued": plan.queued if not plan.planning else None,
            "reasons": [later] if later else []}


def _unreachable(plan: AnyPlan) -> dict[str, str]:
    return {"code": "cluster_unreachable", "message": f"the cluster did not answer: {plan.error}"}


def queue_briefs(*, job_ids: Collection[int], now: datetime) -> dict[int, dict[str, Any]]:
    """Rule E5 for a page of queued jobs (`QueuePlan.brief` per job): one cached plan for
    all of them, planned again once when one is newer than the cached plan; a job the
    plan does not know (its team's namespace is not provisioned and the view says so
    later) gets nulls, and an unreachable cluster gives every job that reason."""
    if not job_ids:
        return {}
    plan = queue_plan_for(job_ids=job_ids, now=now)
    if plan.error:
        unreachable = _unreachable(plan)
        return {i: {"position": None, "jobs_ahead": None, "reason": unreachable}
                for i in job_ids}
    empty = {"position": None, "jobs_ahead": None, "reason": not_planned(plan)}
    return {i: plan.brief(i) or dict(empty) for i in job_ids}


def queue_plan_forget() -> None:
    """Drop the cached plan, and the standings and quota forest the dashboard keeps
    (`dashboard.PAGE_CACHE_KEYS`): after a scheduler cycle changed something, or a
    submit or cancel from the web (whose next page should show it)."""
    # The generation key goes first: a process holding this plan locally stops using it.
    cache.delete_many([_GEN_KEY, _PLAN_KEY, _SNAPSHOT_KEY, *PAGE_CACHE_KEYS])


# --- readers of the plan ---------------------------------------------------------------------

@dataclass(frozen=True)
class QueueRow:
    job: Job
    position: int | None
    reason: str


def team_queue(*, team: Team | None, now: datetime, limit: int = 50
               ) -> tuple[list[QueueRow], int]:
    """The team's queued jobs (every team's: `team=None`, the staff's cluster view) in
    queue order with position and wait reason (the first `limit`), and how many are
    queued in all. Jobs queued since the plan was cached come last, without a position,
    until the next refresh."""
    plan = queue_plan(now=now)
    qs: QuerySet[Job] = Job.objects.filter(status=JobState.QUEUED)
    if team is not None:
        qs = qs.filter(team=team)
    total = qs.count()
    ids = plan.team_order(team.slug if team is not None else None, limit)
    found = qs.select_related("gpu_type", "tier", "team").defer(*LIST_DEFER).in_bulk(ids)
    jobs = [found[i] for i in ids if i in found]
    if len(jobs) < limit:
        # Queued after the plan was cached (or the plan is unavailable).
        jobs += list(qs.exclude(pk__in=ids).select_related("gpu_type", "tier", "team")
                     .defer(*LIST_DEFER).order_by("-tier__rank", "created_at", "id")
                     [: limit - len(jobs)])
    rows = []
    for j in jobs:
        reasons = plan.reasons(j.pk)
        rows.append(QueueRow(j, plan.position(j.pk), "; ".join(r["message"] for r in reasons)))
    return rows, total


@dataclass(frozen=True)
class Preview:
    position: int | None
    queued: int  # queued jobs now, before this one
    admitted_next: bool
    reason: str
    error: str = ""


def submit_preview(*, team: Team, gpu_type: GpuType, gpus_per_replica: int, replicas: int,
                   tier_rank: int, now: datetime, cpu_millicores: int | None = None,
                   memory_bytes: int | None = None,
                   topology: Mapping[str, str] | None = None,
                   gpu_types: Sequence[str] = (), flavor_fallback: str = "",
                   gpu_slices: int = 0) -> Preview:
    """Where a job would stand if submitted now: the candidate added in memory to the
    snapshot of the cached plan (the one "why it waits" reads) and planned with the same
    policy as the next cycle; nothing is written. The answer for one shape (team, GPU
    type, size, tier) is cached with the plan, so typing in the other fields of the form
    plans nothing. `gpu_types`: every type it would accept, most preferred first (()
    for one type), with `flavor_fallback` its team's or tier's setting. `gpu_slices`: a
    fraction of one GPU of a time-sliced or MPS type (rule H1: planned in its slices; a
    whole-GPU job of such a type in GPUs x its slices per GPU)."""
    plan, snapshot = _plan_with_snapshot(now=now)
    if snapshot is None:
        return Preview(None, 0, False, "", error=plan.error[:200])
    topo = topology_of((topology or {}).get("level", ""), (topology or {}).get("mode", ""))
    key = (f"{_PREVIEW_KEY}:{plan.generation}:{team.slug}:{gpu_type.slug}:"
           f"{gpus_per_replica}:{replicas}:{tier_rank}:{cpu_millicores}:{memory_bytes}:"
           f"{topo.level if topo else ''}:{topo.mode if topo else ''}:"
           f"{','.join(gpu_types)}:{flavor_fallback}:{gpu_slices}")
    cached: Preview | None = cache.get(key)
    if cached is not None:
        return cached
    several = tuple(gpu_types) if len(gpu_types) > 1 else ()
    units = gpus_per_replica * gpu_type.units_per_device  # rule H1
    if gpu_type.packs_slices:
        several = ()  # rule H7: its only type
        if gpu_slices:
            units = gpu_slices
    if several and flavor_fallback in {f.value for f in FlavorFallback}:
        snapshot = replace(snapshot, flavor_fallback={
            **snapshot.flavor_fallback, (team.slug, tier_rank): FlavorFallback(flavor_fallback)})
    preview = _preview_place(snapshot, QueuedJob(
        id=-1,  # no real job has a negative id
        team=team.slug, gpu_type=gpu_type.slug, gpus_per_replica=units,
        replicas=replicas, tier_rank=tier_rank, submitted_at=snapshot.now,
        cpu_millicores=cpu_millicores, memory_bytes=memory_bytes, topology=topo,
        gpu_types=several))
    cache.set(key, preview, timeout=QUEUE_PLAN_TTL)
    return preview


def _preview_place(snapshot: Snapshot, probe: QueuedJob) -> Preview:
    """Rule P3 for `probe` planned with the rest of `snapshot`'s queue."""
    snapshot = replace(snapshot, queued=(*snapshot.queued, probe))
    plan = plan_admissions(snapshot)
    by_id = {q.id: q for q in snapshot.queued}
    order = [by_id[i] for i in plan.order if i in by_id] if plan.order else list(snapshot.queued)
    seen = {q.id for q in order}
    order += [q for q in snapshot.queued if q.id not in seen]
    wait = plan.waits.get(probe.id)
    admitted = any(a.job_id == probe.id for a in plan.admissions)
    exp = explain_queued(probe.id, order, wait_code=str(wait.reason) if wait else None,
                         wait_message=wait.message if wait else None, admitted_next=admitted,
                         wait_until=wait.until if wait else None)
    if exp is None:
        return Preview(None, len(snapshot.queued) - 1, admitted, "")
    return Preview(exp.position, exp.queued - 1, admitted,
                   "; ".join(r.message for r in exp.reasons))


def job_explain(*, job: Job, now: datetime, with_queue: bool = True,
                standings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Rules P1-P3 for one job: its priority per factor (like `sprio`) and, while it is
    queued and `with_queue`, its place in the queue and why it waits (quota, capacity,
    gang that fits no node, jobs ahead of it).

    Reads only. The queue part comes from the plan of the whole queue that every reader
    shares (`queue_standing`: cached, at most one cycle old), not from planning again per
    job. A cluster that cannot be reached gives the reason `cluster_unreachable` rather
    than failing the request. `standings`: the fair-share standings to price it with
    (the web page's kept ones, `dashboard.standings_by_team`); the live ones otherwise.
    """
    # The published view: no call to the cluster (an unpublished one counts 0 GPUs, and
    # the queue part below says why).
    breakdown = job_priority_breakdown(job=job, now=now,
                                       cluster_gpus=cluster_view(now=now).total_gpus(),
                                       standings=standings)
    out: dict[str, Any] = {"priority": breakdown.as_dict(), "queue": None}
    if with_queue and job.state == JobState.QUEUED:
        out["queue"] = queue_standing(job_id=job.pk, now=now)
    return out
