"""Every active job (QUEUED, ADMITTED, RUNNING) as the cycle reads it, kept in the
worker's memory between cycles and brought up to date from the rows that changed
(docs/architecture.md, "The incremental snapshot").

How it stays correct (PostgreSQL):
  * Every write of a job row stamps it with the id of its transaction
    (`queueing_job.change_xid`: the column's default on INSERT, a trigger on UPDATE;
    migration 0016), whoever wrote it: a service, a bulk COPY, raw SQL, the admin.
  * A refresh reads, in one REPEATABLE READ snapshot, the oldest transaction still
    running (`txid_snapshot_xmin`), the rows stamped with an id at or above the previous
    refresh's (every transaction not visible then is at or above it, whatever order they
    commit in) and the number of active rows. A row that left the active states is
    dropped; a changed one replaces its old copy.
  * A deleted row leaves no stamp: the count catches it (the rows kept must be exactly
    the active rows of the snapshot), and so it catches any row the feed would miss; a
    mismatch reloads everything and logs a warning.
  * Only what is read outside a transaction is kept (committed rows, never a write that
    could still be rolled back); inside one (the tests' transactions, or a caller's) and
    on SQLite, which has no transaction ids, each refresh reads every active job.
  * A new process starts empty: its first refresh is a full read.

The columns are listed once (`ACTIVE_JOB_COLUMNS`): what the snapshot and reconcile need
of a job is added there. Team, GPU type and tier are kept as ids; their slugs and the
tier's rank are read every refresh (a few rows), so an edited tier counts at once.
"""

from __future__ import annotations

import gc
import itertools
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection, transaction
from django.db.models import Count, Max

from accounts.models import Team
from queueing.memo import on_forget
from queueing.models import GpuType, Job, JobEvent, Tier
from queueing.policy.states import HOLDING_STATES, JobState

from .cluster import ClusterFacts, clusters_facts

log = logging.getLogger(__name__)

_VERSIONS = itertools.count(1)  # `ActiveJobs.version`


class JobRow(NamedTuple):
    """The columns of an active job the cycle reads: the snapshot's queued and running
    jobs (selectors/snapshot.py) and reconcile's owners of workloads
    (services/scheduler.py). A field the policy needs is added here, and only here: the
    query reads `ACTIVE_JOB_COLUMNS`, the field names of this row."""

    id: int
    status: str
    attempt: int
    team_id: int
    gpu_type_id: int
    tier_id: int
    gpus_per_replica: int
    replicas: int
    created_at: datetime
    cpu_millicores: int | None
    memory_bytes: int | None
    topology_level: str
    topology_mode: str
    placement: Any  # JSON: a list of node names when well formed (checked on use)
    submitted_to_backend_at: datetime | None
    started_at: datetime | None
    updated_at: datetime
    message: str
    dependencies: Any  # JSON: rules D1-D3, parsed on use (selectors/snapshot.py)
    array_id: int | None  # rule A8
    max_runtime_seconds: int | None  # rule A9: the runtime estimate
    # Rules K1-K5 (docs/clusters.md): where the current attempt runs (None: the only
    # cluster), the job's pin and cluster selector (JSON, checked on use), its spot opt-in.
    cluster_id: int | None
    requested_cluster_id: int | None
    cluster_selector: Any
    allow_spot: bool
    # Every GPU type it accepts, by slug, most preferred first (JSON, checked on use;
    # [] = only its GPU type): docs/api.md, "Several GPU types".
    gpu_types: Any
    # Graceful stop: its pods' own grace (None: the setting) and the newest checkpoint
    # of the current attempt (RunningJob.grace_seconds, .checkpointed_at).
    termination_grace_seconds: int | None
    checkpointed_at: datetime | None
    # Shared GPUs (docs/scheduling.md, rule H1): the slices of one GPU each replica asks
    # (0 = whole devices) and the GPU indexes its attempt holds (JSON, checked on use).
    gpu_slices: int
    gpu_slots: Any


ACTIVE_JOB_COLUMNS: tuple[str, ...] = JobRow._fields
ACTIVE_STATES: tuple[str, ...] = (JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING)
_HOLDING = frozenset(str(s) for s in HOLDING_STATES)


@dataclass(frozen=True, slots=True)
class TierFacts:
    slug: str
    rank: int
    preemptible: bool
    min_runtime_seconds: int
    flavor_fallback: str = "borrow"  # jobs of several GPU types (Tier.flavor_fallback)
    # Rule R10's cap on its jobs' grace (None: the setting's, for a preemptible tier),
    # rule R9's own ratio (None: the global one; -1: none) and rule R11's choice.
    max_termination_grace_seconds: int | None = None
    preemption_lost_per_wait: float | None = None
    owed_preempts_at_once: bool = True


@dataclass(frozen=True, slots=True)
class Lookups:
    """The few rows a job's ids point at, read every refresh."""

    teams: Mapping[int, str] = field(default_factory=dict)
    gpu_types: Mapping[int, str] = field(default_factory=dict)
    tiers: Mapping[int, TierFacts] = field(default_factory=dict)
    # Rule F1's billing weight per GPU type id.
    billing_weights: Mapping[int, float] = field(default_factory=dict)
    # Every `Cluster` row by id ({}: the one implicit cluster of settings; K1-K5).
    clusters: Mapping[int, ClusterFacts] = field(default_factory=dict)
    # Team.flavor_fallback by team slug, for the teams that set one ("" = the tier's).
    team_fallbacks: Mapping[str, str] = field(default_factory=dict)
    # Rule H1, per GPU type slug: (units per device, slices per GPU) - (S, S) for a
    # time-sliced or MPS type, (1, S) for MIG, (1, 1) exclusive; absent = (1, 1).
    units: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def units_per_device(self, gpu_type: str) -> int:
        return self.units.get(gpu_type, (1, 1))[0]

    def packs_slices(self, gpu_type: str) -> bool:
        """Rule H1: a time-sliced or MPS type (its units are slices of a GPU)."""
        return self.units.get(gpu_type, (1, 1))[0] > 1


@dataclass
class Refresh:
    """What one refresh did: `full` when it read every active job, `changed` the ids it
    (re)read (every one on a full read), `reason` why it was a full read."""

    full: bool
    changed: set[int]
    reason: str = ""


class ActiveJobs:
    """The active jobs, by id, with what the snapshot needs beside each row: when a
    requeued job last re-entered the queue (rule R9) and how often a job holding GPUs
    was preempted before (rule R3). `memo` keeps what callers derive from one row (the
    policy's QueuedJob, RunningJob) until the row or the lookups change."""

    def __init__(self) -> None:
        self.queued: dict[int, JobRow] = {}
        self.holding: dict[int, JobRow] = {}
        self.queued_at: dict[int, datetime] = {}
        self.preemptions: dict[int, int] = {}
        self.lookups = Lookups()
        self.memo: dict[int, Any] = {}
        # The transaction id below which every row was seen (None: read everything).
        self.since: int | None = None
        # Whether the rows can be trusted after this refresh: read outside a transaction
        # on PostgreSQL (reconcile skips unchanged workloads only then).
        self.kept = False
        self.last = Refresh(full=True, changed=set())
        # A new number (process-wide, never reused) at every refresh that found a row
        # new, changed or gone (or read them all): the same `version` means no active
        # job's row changed between (the published plan's "queue changed" mark,
        # selectors/queue_plan.py). A row read again as it was kept (the feed reads every
        # row stamped at or above the oldest transaction then running, anyone's) is no
        # change.
        self.version = next(_VERSIONS)
        self.moved = False
        # Reconcile's memory (services/scheduler.py): per workload name, the status it
        # last handled and the row its job had then.
        self.reconciled: dict[str, tuple[Any, Any]] = {}
        # ... and the raw statuses it cleaned last, with what cleaning gave.
        self.cleaned: dict[str, tuple[Any, Any]] = {}
        # The snapshot's slices per GPU of the slice-packed nodes, kept between cycles
        # (selectors/snapshot.py, `KeptPackedGpus`); None until the first snapshot.
        self.packed: Any = None
        # ... and the standings' running intervals per team (selectors/fairshare.py,
        # `KeptHolding`).
        self.standings: Any = None

    def __len__(self) -> int:
        return len(self.queued) + len(self.holding)

    def row(self, job_id: int) -> JobRow | None:
        return self.queued.get(job_id) or self.holding.get(job_id)

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]  # back to a new process's state

    def refresh(self, *, count: bool = True) -> Refresh:
        """Bring the rows up to date with the database (see the module's docstring).
        `count=False` skips the count of active rows (deleted rows stay until a refresh
        that counts): for a reader a row that is gone cannot mislead (reconcile, whose
        refresh the snapshot's follows within the same cycle)."""
        if connection.vendor != "postgresql" or connection.in_atomic_block:
            self.since, self.kept = None, False
            read = self._replace(_rows(Job.objects.filter(status__in=ACTIVE_STATES)))
            self.lookups = _lookups()  # after the rows: a team of a new job is in it
            self.last = Refresh(
                full=True,
                changed=read,
                reason="not kept: SQLite or inside a transaction",
            )
            self.version = next(_VERSIONS)
            return self.last
        with transaction.atomic():
            with connection.cursor() as cur:
                # Every read below sees one snapshot: the stamp, the rows, the count.
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                cur.execute(
                    "SELECT txid_snapshot_xmin(txid_current_snapshot()), "
                    + ("(SELECT count(*) FROM queueing_job WHERE status = ANY(%s))" if count else "NULL"),
                    [list(ACTIVE_STATES)] if count else [],
                )
                xmin, active = cur.fetchone()
            self.lookups = _lookups()
            if self.since is None:
                read = self._replace(_rows(Job.objects.filter(status__in=ACTIVE_STATES)))
                self.last = Refresh(full=True, changed=read, reason="first read")
            else:
                changed = self._apply(_rows(Job.objects.filter(_changed_since(self.since))))
                self.last = Refresh(full=False, changed=changed)
                if active is not None and len(self) != active:
                    log.warning(
                        "active jobs: %d kept but %d in the database (a deleted "
                        "or missed row); reading them all again",
                        len(self),
                        active,
                    )
                    read = self._replace(_rows(Job.objects.filter(status__in=ACTIVE_STATES)))
                    self.last = Refresh(
                        full=True,
                        changed=read,
                        reason=f"count {len(self)} != {active}",
                    )
        self.since, self.kept = int(xmin), True
        if self.last.full or self.moved:
            self.version = next(_VERSIONS)
        self.moved = False
        return self.last

    def _replace(self, rows: Iterable[JobRow]) -> set[int]:
        """Keep `rows` alone; the ids kept (every row is an active job's: the set
        `_apply` makes anyway, not two more of a million ids each)."""
        self.queued, self.holding = {}, {}
        self.queued_at, self.preemptions, self.memo = {}, {}, {}
        return self._apply(rows)

    def _apply(self, rows: Iterable[JobRow]) -> set[int]:
        """Put each row where its state says (or drop it), and read its extras."""
        changed: set[int] = set()
        moved = False  # a row read differs from the one kept (new, changed or gone)
        requeued: list[int] = []
        preempted: list[int] = []
        queued, holding = self.queued, self.holding
        for row in rows:
            pk = row.id
            changed.add(pk)
            if not moved:
                old = queued.get(pk) or holding.get(pk)
                moved = old != row if old is not None else row.status in ACTIVE_STATES
            queued.pop(pk, None)
            holding.pop(pk, None)
            self.queued_at.pop(pk, None)
            self.preemptions.pop(pk, None)
            self.memo.pop(pk, None)
            if row.status == JobState.QUEUED:
                queued[pk] = row
                if row.attempt > 1:
                    requeued.append(pk)
            elif row.status in _HOLDING:
                holding[pk] = row
                if row.attempt > 1:
                    preempted.append(pk)
        if requeued:
            # Rule R9: a requeued job's wait counts from its last return to the queue
            # (the event is written with the row, so it is in the same snapshot).
            self.queued_at.update(
                JobEvent.objects.order_by()
                .filter(kind=JobEvent.Kind.TRANSITION, to_status=JobState.QUEUED, job_id__in=requeued)
                .values_list("job_id")
                .annotate(last=Max("at"))
                .values_list("job_id", "last")
            )
        if preempted:
            # Rule R3: how often it was preempted before (only past its first attempt;
            # a preemption moves the row, so the count is read again then).
            self.preemptions.update(
                JobEvent.objects.order_by()
                .filter(kind=JobEvent.Kind.PREEMPTED, job_id__in=preempted)
                .values_list("job_id")
                .annotate(n=Count("id"))
                .values_list("job_id", "n")
            )
        self.moved = self.moved or moved
        return changed


def holding_jobs() -> ActiveJobs:
    """The jobs holding GPUs alone (no queued job), read once: for a reader that needs the
    fleet's running work and not the queue (rule W5's holds of a booking), so a million
    queued rows are not read for it."""
    jobs = ActiveJobs()
    jobs._replace(_rows(Job.objects.filter(status__in=_HOLDING)))
    jobs.lookups = _lookups()
    jobs.last = Refresh(full=True, changed=set(jobs.holding), reason="holding jobs only")
    return jobs


def _changed_since(xid: int) -> Any:
    from django.db.models import BooleanField
    from django.db.models.expressions import RawSQL

    return RawSQL('"queueing_job"."change_xid" >= %s', [xid], output_field=BooleanField())


def _rows(qs: Any) -> list[JobRow]:
    values = qs.order_by().values_list(*ACTIVE_JOB_COLUMNS).iterator(chunk_size=10_000)
    with gc_paused():
        if LEGACY or not COMPACT_ROWS:
            make = JobRow._make
            return [make(r) for r in values]
        return list(compact_rows(values))


# The columns whose values repeat across rows (a state, ids of a team, GPU type, tier or
# cluster, a topology word, a message) and the JSON columns, most of them empty.
_SHARED = tuple(JobRow._fields.index(c) for c in (
    "status", "team_id", "gpu_type_id", "tier_id", "topology_level", "topology_mode",
    "message", "cluster_id", "requested_cluster_id", "termination_grace_seconds",
    "max_runtime_seconds", "cpu_millicores", "memory_bytes"))
_JSON = tuple(JobRow._fields.index(c) for c in (
    "placement", "dependencies", "cluster_selector", "gpu_types", "gpu_slots"))
_CREATED, _UPDATED = JobRow._fields.index("created_at"), JobRow._fields.index("updated_at")


def compact_rows(values: Iterable[Sequence[Any]]) -> Iterator[JobRow]:
    """The rows as `JobRow`s, equal to the plain ones (`JobRow._make`), each value that
    repeats made once per read: one object per distinct value of the columns above, one
    empty list and one empty dict for every empty JSON value, `updated_at` the
    `created_at` object when they are equal. At 1,000,000 queued a row is then its tuple
    and its id, dates and the few values of its own (docs/performance.md, "Memory at
    1,000,000 queued, and submits during cycles"). The rows are read-only: no caller
    changes a value of a kept row, so shared values are safe."""
    make = JobRow._make
    shared: list[dict[Any, Any]] = [{} for _ in _SHARED]
    pairs = tuple(zip(_SHARED, (d.setdefault for d in shared), strict=True))
    empty: dict[type, Any] = {list: [], dict: {}}
    json_columns = _JSON
    created, updated = _CREATED, _UPDATED
    for r in values:
        v = list(r)
        for i, keep in pairs:
            x = v[i]
            if x is not None:
                v[i] = keep(x, x)
        for i in json_columns:
            x = v[i]
            if not x and x is not None:
                v[i] = empty.get(type(x), x)
        if v[updated] == v[created]:
            v[updated] = v[created]
        yield make(v)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off while many objects that make no reference cycles are made (a
    full read of 1,000,000 rows, the policy's jobs built from them): each of its passes
    would walk everything kept so far, for nothing to collect (docs/performance.md, "A
    fleet of 5,000 nodes: the cycle on PostgreSQL")."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _lookups() -> Lookups:
    gpu_types = list(GpuType.objects.values_list("id", "slug", "billing_weight"))
    units = {slug: (spg if sharing in PACKED_SHARING else 1, spg)
             for slug, sharing, spg in GpuType.objects.values_list(
                 "slug", "sharing", "slices_per_gpu") if spg > 1}
    return Lookups(
        teams=dict(Team.objects.values_list("id", "slug")),
        units=units,
        gpu_types={pk: slug for pk, slug, _ in gpu_types},
        tiers={
            pk: TierFacts(slug, rank, preemptible, min_runtime, fallback, grace_cap, ratio, owed)
            for pk, slug, rank, preemptible, min_runtime, fallback, grace_cap, ratio, owed
            in Tier.objects.values_list(
                "id", "slug", "rank", "preemptible", "min_runtime_seconds", "flavor_fallback",
                "max_termination_grace_seconds", "preemption_lost_per_wait",
                "owed_preempts_at_once",
            )
        },
        billing_weights={pk: weight for pk, _, weight in gpu_types},
        clusters=clusters_facts(),
        team_fallbacks=dict(Team.objects.exclude(flavor_fallback="")
                            .values_list("slug", "flavor_fallback")),
    )


# The cycle's paths before the fleet's kept state (bench/bench_fleet_cycle.py --legacy):
# each kept thing is held to what it replaces by a test, and this flag lets a bench run
# both in one process.
LEGACY = False
# The rows read with their repeated values shared (`compact_rows`); False: each row as
# the database driver gives it (bench/bench_fleet_cycle.py --alternate's "before").
COMPACT_ROWS = True

# Rule H1: the sharings whose units are slices of one GPU (`GpuType.packs_slices`).
PACKED_SHARING = ("time-sliced", "mps")

_lock = threading.Lock()
_cycle_jobs = ActiveJobs()
on_forget(_cycle_jobs.clear)


def cycle_active_jobs(*, count: bool = True) -> ActiveJobs:
    """The scheduler process's active jobs, refreshed (one cycle at a time holds the
    scheduler lock, so one refresh at a time; the lock guards other threads). `count`:
    see `ActiveJobs.refresh`."""
    with _lock:
        _cycle_jobs.refresh(count=count)
    return _cycle_jobs


def cycle_active_jobs_forget() -> None:
    """Start again from an empty cache (tests; a worker restart starts empty anyway)."""
    with _lock:
        _cycle_jobs.clear()
