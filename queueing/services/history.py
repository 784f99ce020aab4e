"""History retention (docs/deployment.md, "History retention"): finished jobs (with
everything that is theirs), usage records and per-minute utilization samples older than
their retention are written to an archive, then deleted (samples are archived only with
FAIRQ_UTIL_ARCHIVE; by default they are deleted as they always were).

The archive is gzipped JSON lines, one object a row (its columns by their database
names; instants in ISO 8601, UTC), one file per table
and UTC day in the "fairq-history" storage: `<table>/<YYYY-MM-DD>.jsonl.gz`. The day is
a job's `finished_at` (its own rows go in the same day's files of their tables), a usage
record's `end`, a sample's `minute`. A run that finds rows of a day already archived
(a run stopped between its archive and its deletes, or rows that came late) writes the
ones not yet in the day's files to a next part, `<YYYY-MM-DD>.<n>.jsonl.gz`: each row is
in the archive once, and no row is deleted before a file holding it was saved.

Deletes go in batches (BATCH rows, JOB_BATCH jobs) each in its own transaction: no long
locks. Nothing the scheduler or the reports page reads changes:
- fair share reads the accumulators (rule F1); the recompute from the raw records adds
  each team's `UsagePruned` (the pruned records' decayed contribution, written in the
  transaction that deletes them) instead of the records;
- the reports page reads the roll-up (`UsageDay`): only records it holds are pruned, and
  never those priced apart (rule C4), which it reads again, nor a job of theirs;
- jobs still queued, admitted, running or preempted are never touched, nor a finished
  job a live job depends on (rules D1-D3) or in an array with a live member, nor a job
  with a usage record the roll-up has not read yet (it reads the job's events).

Each run is recorded (`HistoryPrune`): the retentions, per table the rows archived and
deleted and the files written.
"""

from __future__ import annotations

import gzip
import json
import logging
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.files import File
from django.core.files.storage import Storage, storages
from django.db import connection, models, transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import TruncDate
from django.db.models.signals import post_delete, pre_delete

from queueing.models import (
    AttemptUtilization,
    Checkpoint,
    HistoryPrune,
    Job,
    JobEvent,
    JobLog,
    NotebookSession,
    UsagePruned,
    UsageRecord,
    UsageRollup,
    UtilizationSample,
)
from queueing.policy.fairshare import Accumulator, decayed_interval_usage
from queueing.policy.states import FINAL_STATES
from queueing.selectors.fairshare import half_life_hours

log = logging.getLogger(__name__)

STORAGE_ALIAS = "fairq-history"
# Rows deleted per transaction; jobs per transaction (each with its events and the rest).
BATCH = 10_000
JOB_BATCH = 1_000
# Rows of one table one run takes at most (its memory and time; the next run goes on).
MAX_ROWS = 2_000_000
# The rows that are a job's, archived with it (same day) and deleted with it (cascade).
JOB_OWNED: tuple[type[models.Model], ...] = (
    JobEvent, AttemptUtilization, UtilizationSample, Checkpoint, JobLog, NotebookSession)
_LOCK_KEY = 0x66616972_7170  # pg advisory lock: one run at a time


def storage() -> Storage:
    return storages[STORAGE_ALIAS]


# --- the archive ------------------------------------------------------------------------

# PostgreSQL writes the archive's lines itself (`row_to_json`, one statement per 10,000
# rows); False: the plain path, Python's `json` over the ORM's rows (every database).
# Both give the same rows when read back (`archive_read`): tests/test_history_retention.py.
_FAST = True


def _json_default(o: object) -> object:
    if isinstance(o, datetime | date | time):
        return o.isoformat()
    if isinstance(o, Decimal):
        return float(o)  # a JSON number, as PostgreSQL writes it (at most 14 digits here)
    if isinstance(o, uuid.UUID):
        return str(o)
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def row_json(row: dict[str, Any]) -> str:
    """One row as the plain path writes its line (without the newline)."""
    return json.dumps(row, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def columns(model: type[models.Model]) -> list[str]:
    """The columns archived: every concrete field, by its database attribute name."""
    return [f.attname for f in model._meta.concrete_fields]


def archive_name(model: type[models.Model], day: date, part: int = 0) -> str:
    suffix = f".{part}" if part else ""
    return f"{model._meta.db_table}/{day.isoformat()}{suffix}.jsonl.gz"


def archive_parts(model: type[models.Model], day: date) -> list[str]:
    """The day's files of `model` there are, in order (parts are numbered without gaps)."""
    out, part = [], 0
    while storage().exists(name := archive_name(model, day, part)):
        out.append(name)
        part += 1
    return out


def _lines(name: str) -> Iterator[dict[str, Any]]:
    with storage().open(name, "rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _model_of(name: str) -> type[models.Model]:
    table = name.split("/", 1)[0]
    for model in apps.get_app_config("queueing").get_models():
        if model._meta.db_table == table:
            return model
    raise ValueError(f"{name}: no table {table!r} in fairq's models")


def _value(f: models.Field[Any, Any], v: Any) -> Any:
    if v is None:
        return None
    if isinstance(f, models.DateTimeField):
        return datetime.fromisoformat(v)
    if isinstance(f, models.DateField):
        return date.fromisoformat(v)
    if isinstance(f, models.DecimalField):
        return Decimal(repr(v)) if isinstance(v, float) else Decimal(str(v))
    if isinstance(f, models.FloatField):
        return float(v)
    return v


def archive_read(name: str) -> Iterator[dict[str, Any]]:
    """The rows of one archive file (`zcat NAME | jq` reads it too), each a dict of its
    columns as the ORM's `values()` gives them: instants and days parsed, decimals as
    `Decimal`, JSON columns as they were."""
    fields = {f.attname: f for f in _model_of(name)._meta.concrete_fields}
    for row in _lines(name):
        yield {k: _value(fields[k], v) if k in fields else v for k, v in row.items()}


def _archived_ids(model: type[models.Model], day: date) -> tuple[set[int], int]:
    """Ids of `model` already in the day's files, and the next part's number."""
    names = archive_parts(model, day)
    pk = model._meta.pk.attname
    return {int(r[pk]) for name in names for r in _lines(name)}, len(names)


def _rows(model: type[models.Model], ids: Sequence[int], by: str = "pk"
          ) -> Iterator[tuple[int, str]]:
    """(id, its line) of the rows of `model` whose `by` is in `ids`, by id."""
    fast = _FAST and connection.vendor == "postgresql"
    cols = columns(model)
    pk = model._meta.pk.attname
    q = connection.ops.quote_name
    column = pk if by == "pk" else by  # "job_id": the column of the job's own rows
    # The model's columns only, by name (a table may have more: Job's `change_xid`).
    select = (f"SELECT t.{q(pk)}, (SELECT row_to_json(r) FROM (SELECT "
              f"{', '.join(f't.{q(c)}' for c in cols)}) r)::text "
              f"FROM {q(model._meta.db_table)} t WHERE t.{q(column)} = ANY(%s) ORDER BY t.{q(pk)}")
    for i in range(0, len(ids), BATCH):
        chunk = list(ids[i:i + BATCH])
        if fast:
            with connection.cursor() as cur:
                cur.execute(select, [chunk])
                yield from cur.fetchall()
            continue
        for row in model._default_manager.filter(**{f"{by}__in": chunk}).order_by(
                "pk").values(*cols).iterator(chunk_size=2000):
            yield row[pk], row_json(row)


def archive_write(model: type[models.Model], day: date, rows: Iterable[tuple[int, str]]
                  ) -> tuple[str | None, int]:
    """Write the rows (id, line) not yet in the day's files of `model` to its next part;
    returns (the file's name or None when every row was there already, rows written)."""
    have, part = _archived_ids(model, day)
    n = 0
    with tempfile.SpooledTemporaryFile(max_size=32 << 20) as tmp:
        with gzip.GzipFile(fileobj=tmp, mode="wb", compresslevel=6, mtime=0) as gz:
            chunk: list[str] = []
            for pk, line in rows:
                if pk in have:
                    continue
                chunk.append(line)
                n += 1
                if len(chunk) >= 1000:  # one write a thousand lines
                    gz.write(("\n".join(chunk) + "\n").encode())
                    chunk = []
            if chunk:
                gz.write(("\n".join(chunk) + "\n").encode())
        if not n:
            return None, 0
        tmp.seek(0)
        name = archive_name(model, day, part)
        saved = storage().save(name, File(tmp, name=name))
    if saved != name:  # a concurrent writer took the name: never leave rows half-named
        raise RuntimeError(f"history archive {name} was saved as {saved}")
    return name, n


# --- what may go --------------------------------------------------------------------------

def _midnight(d: date) -> datetime:
    return datetime.combine(d, time(0), tzinfo=UTC)


def cutoff(now: datetime, days: float) -> datetime:
    """Rows of UTC days before the one `days` before `now` go: whole days, so each day's
    file is written once."""
    return _midnight((now - timedelta(days=days)).astimezone(UTC).date())


def jobs_prunable(*, before: datetime) -> models.QuerySet[Job]:
    """Finished jobs finished before `before` that may go (see the module's docstring)."""
    live = Job.objects.exclude(status__in=[s.value for s in FINAL_STATES])
    needed_jobs: set[int] = set()
    needed_arrays: set[int] = set()
    for deps in live.exclude(dependencies=[]).values_list("dependencies", flat=True).iterator():
        for d in deps if isinstance(deps, list) else ():
            if isinstance(d, dict):
                if isinstance(d.get("job"), int):
                    needed_jobs.add(d["job"])
                if isinstance(d.get("array"), int):
                    needed_arrays.add(d["array"])
    needed_arrays |= set(live.filter(array__isnull=False).values_list("array_id", flat=True))
    mark = UsageRollup.objects.filter(pk=1).values_list("last_record_id", flat=True).first() or 0
    kept_usage = UsageRecord.objects.filter(job=OuterRef("pk")).filter(
        Q(pk__gt=mark) | Q(spot=True) | Q(price_per_gpu_hour__isnull=False))
    return (Job.objects.filter(status__in=[s.value for s in FINAL_STATES],
                               finished_at__lt=before)
            .exclude(pk__in=needed_jobs).exclude(array_id__in=needed_arrays)
            .exclude(Exists(kept_usage)))


def usage_prunable(*, before: datetime) -> models.QuerySet[UsageRecord]:
    """Usage records ended before `before` that may go: rolled up, not priced apart,
    of no live job."""
    mark = UsageRollup.objects.filter(pk=1).values_list("last_record_id", flat=True).first() or 0
    return (UsageRecord.objects.filter(end__lt=before, pk__lte=mark, spot=False,
                                       price_per_gpu_hour__isnull=True)
            .filter(Q(job__isnull=True) | Q(job__status__in=[s.value for s in FINAL_STATES])))


def samples_prunable(*, before: datetime) -> models.QuerySet[UtilizationSample]:
    return UtilizationSample.objects.filter(minute__lt=before)


def _by_day(qs: models.QuerySet[Any], day_field: str, limit: int) -> dict[date, list[int]]:
    """Ids of `qs` by the UTC day of `day_field`, oldest days first, at most `limit`."""
    out: dict[date, list[int]] = {}
    for pk, day in (qs.annotate(_day=TruncDate(day_field, tzinfo=UTC))
                    .order_by(day_field, "pk").values_list("pk", "_day")[:limit].iterator(
                        chunk_size=10_000)):
        out.setdefault(day, []).append(pk)
    return out


# --- deletes ------------------------------------------------------------------------------

def _delete_usage(ids: Sequence[int]) -> int:
    """Delete usage records and add their rule F1 contribution to their teams'
    `UsagePruned`, in one transaction (a recompute never sees one without the other)."""
    h = half_life_hours()
    with transaction.atomic():
        rows = list(UsageRecord.objects.filter(pk__in=ids).values_list(
            "team_id", "gpus", "billing_weight", "start", "end", "gpu_seconds"))
        if not rows:
            return 0
        as_of = max(end for *_, end, _ in rows)
        add: dict[int, list[Any]] = {}
        for team_id, gpus, weight, start, end, seconds in rows:
            a = add.setdefault(team_id, [0.0, 0, 0.0, start])
            a[0] += decayed_interval_usage(rate=gpus * weight, start=start, end=end,
                                           as_of=as_of, half_life_hours=h)
            a[1] += 1
            a[2] += seconds
            a[3] = min(a[3], start)
        have = {p.team_id: p for p in
                UsagePruned.objects.select_for_update().filter(team_id__in=add).order_by("team_id")}
        new, changed = [], []
        for team_id, (value, n, seconds, first) in add.items():
            p = have.get(team_id)
            if p is None:
                new.append(UsagePruned(team_id=team_id, value=value, as_of=as_of, records=n,
                                       gpu_seconds=seconds, first_start=first))
                continue
            acc = Accumulator(p.value, p.as_of).merge(Accumulator(value, as_of), h)
            p.value, p.as_of = acc.value, acc.as_of
            p.records += n
            p.gpu_seconds += seconds
            p.first_start = min(p.first_start, first) if p.first_start else first
            changed.append(p)
        UsagePruned.objects.bulk_create(new)
        UsagePruned.objects.bulk_update(changed, ["value", "as_of", "records", "gpu_seconds",
                                                  "first_start"])
        return UsageRecord.objects.filter(pk__in=ids).delete()[0]


def _delete_plain(model: type[models.Model]) -> Callable[[Sequence[int]], int]:
    """Delete rows of a model nothing references, by id: on PostgreSQL (`_FAST`) one
    statement with the ids as one array (the ORM's `IN` of 10,000 placeholders took
    most of the samples' prune: docs/performance.md, "history retention")."""
    def delete(ids: Sequence[int]) -> int:
        with transaction.atomic():
            if _FAST and connection.vendor == "postgresql" and \
                    not model._meta.related_objects:
                q = connection.ops.quote_name
                with connection.cursor() as cur:
                    cur.execute(f"DELETE FROM {q(model._meta.db_table)} "
                                f"WHERE {q(str(model._meta.pk.column))} = ANY(%s)", [list(ids)])
                    return int(cur.rowcount)
            return model._default_manager.filter(pk__in=ids).delete()[1].get(
                model._meta.label, 0)
    return delete


def _delete_jobs(ids: Sequence[int]) -> dict[str, int]:
    """Delete jobs and everything that is theirs in one transaction; rows deleted per
    model label. On PostgreSQL (`_FAST`) one statement per related table, from the
    models' own relations (CASCADE: deleted, their SET_NULL references cleared; SET_NULL:
    cleared; a model with delete receivers, JobLog's kept files, through the ORM);
    otherwise, or for a relation of another kind, Django's collector (the plain path,
    which loads every event first). Both leave the same rows: tests/test_history_retention.py."""
    plan = _job_delete_plan() if _FAST and connection.vendor == "postgresql" else None
    with transaction.atomic():
        if plan is None:
            return Job.objects.filter(pk__in=ids).delete()[1]
        ids = list(ids)
        per: dict[str, int] = {}
        q = connection.ops.quote_name
        with connection.cursor() as cur:
            for child, fk, how, grand in plan:
                table = q(child._meta.db_table)
                if how == "orm":
                    for label, n in child._default_manager.filter(
                            **{f"{fk}__in": ids}).delete()[1].items():
                        per[label] = per.get(label, 0) + n
                    continue
                if how == "null":
                    cur.execute(f"UPDATE {table} SET {q(fk)} = NULL WHERE {q(fk)} = ANY(%s)",
                                [ids])
                    continue
                for g, gfk in grand:
                    cur.execute(f"UPDATE {q(g._meta.db_table)} SET {q(gfk)} = NULL "
                                f"WHERE {q(gfk)} IN (SELECT {q(str(child._meta.pk.column))} "
                                f"FROM {table} WHERE {q(fk)} = ANY(%s))", [ids])
                cur.execute(f"DELETE FROM {table} WHERE {q(fk)} = ANY(%s)", [ids])
                per[child._meta.label] = per.get(child._meta.label, 0) + cur.rowcount
            cur.execute(f"DELETE FROM {q(Job._meta.db_table)} WHERE id = ANY(%s)", [ids])
            per[Job._meta.label] = cur.rowcount
        return per


JobDeletePlan = list[tuple[type[models.Model], str, str,
                           list[tuple[type[models.Model], str]]]]


def _job_delete_plan() -> JobDeletePlan | None:
    """What deleting a job touches, from the models' relations: (model, its column naming
    the job, "delete" | "null" | "orm", the SET_NULL references to its rows to clear).
    None when a relation is of another kind (then the collector does it)."""
    plan: JobDeletePlan = []
    for rel in Job._meta.related_objects:
        child = rel.related_model
        if not isinstance(child, type) or rel.many_to_many or rel.field is None:
            return None
        fk = str(rel.field.column)
        if rel.on_delete is models.SET_NULL:
            plan.append((child, fk, "null", []))
            continue
        if rel.on_delete is not models.CASCADE:
            return None
        if post_delete.has_listeners(child) or pre_delete.has_listeners(child):
            if child._meta.related_objects:
                return None
            plan.append((child, rel.field.name, "orm", []))
            continue
        grand = []
        for r2 in child._meta.related_objects:
            if r2.on_delete is not models.SET_NULL or not isinstance(r2.related_model, type):
                return None
            grand.append((r2.related_model, str(r2.field.column)))
        plan.append((child, fk, "delete", grand))
    if post_delete.has_listeners(Job) or pre_delete.has_listeners(Job):
        return None
    return plan


# --- a run --------------------------------------------------------------------------------

@dataclass
class TableResult:
    rows: int = 0  # found to go (a dry run: would go)
    archived: int = 0  # written to the archive by this run
    deleted: int = 0
    files: list[str] = field(default_factory=list)
    days: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "archived": self.archived, "deleted": self.deleted,
                "days": self.days, "files": self.files}


@dataclass
class PruneResult:
    tables: dict[str, TableResult] = field(default_factory=dict)
    run: HistoryPrune | None = None  # None: a dry run, or another run held the lock
    skipped: bool = False

    def table(self, model: type[models.Model]) -> TableResult:
        return self.tables.setdefault(model._meta.db_table, TableResult())


def retention() -> dict[str, float]:
    return {"FAIRQ_JOB_RETENTION_DAYS": float(settings.FAIRQ_JOB_RETENTION_DAYS),
            "FAIRQ_USAGE_RETENTION_DAYS": float(settings.FAIRQ_USAGE_RETENTION_DAYS),
            "FAIRQ_UTIL_RETENTION_DAYS": float(settings.FAIRQ_UTIL_RETENTION_DAYS)}


def _lock() -> bool:
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(%s)", [_LOCK_KEY])
        return bool(cur.fetchone()[0])


def _unlock() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", [_LOCK_KEY])


def history_prune(*, now: datetime, dry_run: bool = False, actor_label: str = "",
                  max_rows: int = MAX_ROWS) -> PruneResult:
    """Archive, then delete, what is older than the retentions (module docstring): the
    utilization samples, the usage records, then the finished jobs with theirs. A dry
    run only counts (and writes nothing, not even its record). One run at a time on
    PostgreSQL (an advisory lock): a second one returns `skipped`."""
    result = PruneResult()
    if not _lock():
        result.skipped = True
        return result
    try:
        if not dry_run:
            result.run = HistoryPrune.objects.create(started_at=now, actor_label=actor_label,
                                                     retention=retention())
        try:
            _prune(result, now=now, dry_run=dry_run, max_rows=max_rows)
        except Exception as exc:
            if result.run is not None:
                result.run.tables = {k: v.as_dict() for k, v in result.tables.items()}
                result.run.error = f"{type(exc).__name__}: {exc}"[:500]
                result.run.save(update_fields=["tables", "error"])
            raise
        if result.run is not None:
            result.run.tables = {k: v.as_dict() for k, v in result.tables.items()}
            result.run.finished_at = max(now, datetime.now(UTC))
            result.run.save(update_fields=["tables", "finished_at"])
            log.info("history prune: %s", ", ".join(
                f"{k} {v.deleted} deleted ({v.archived} archived)"
                for k, v in result.tables.items()) or "nothing to do")
    finally:
        _unlock()
    return result


def _prune(result: PruneResult, *, now: datetime, dry_run: bool, max_rows: int) -> None:
    days = retention()
    if days["FAIRQ_UTIL_RETENTION_DAYS"] > 0:
        before = cutoff(now, days["FAIRQ_UTIL_RETENTION_DAYS"])
        _prune_table(result, UtilizationSample, _by_day(samples_prunable(before=before),
                                                        "minute", max_rows),
                     _delete_plain(UtilizationSample), dry_run=dry_run,
                     archive=bool(settings.FAIRQ_UTIL_ARCHIVE))
    if days["FAIRQ_USAGE_RETENTION_DAYS"] > 0:
        before = cutoff(now, days["FAIRQ_USAGE_RETENTION_DAYS"])
        _prune_table(result, UsageRecord, _by_day(usage_prunable(before=before), "end",
                                                  max_rows),
                     _delete_usage, dry_run=dry_run)
    if days["FAIRQ_JOB_RETENTION_DAYS"] > 0:
        before = cutoff(now, days["FAIRQ_JOB_RETENTION_DAYS"])
        samples_before = (cutoff(now, days["FAIRQ_UTIL_RETENTION_DAYS"])
                          if days["FAIRQ_UTIL_RETENTION_DAYS"] > 0 else None)
        _prune_jobs(result, _by_day(jobs_prunable(before=before), "finished_at",
                                    max_rows // 10), dry_run=dry_run,
                    samples_before=samples_before)


def _prune_table(result: PruneResult, model: type[models.Model], by_day: dict[date, list[int]],
                 delete: Callable[[Sequence[int]], int], *, dry_run: bool,
                 archive: bool = True) -> None:
    """Each day's rows of `model` archived (`archive`: else only deleted), then deleted."""
    res = result.table(model)
    every: list[int] = []
    for day, ids in by_day.items():  # every day's file saved before any row is deleted
        res.rows += len(ids)
        res.days.append(day.isoformat())
        every += ids
        if dry_run or not archive:
            continue
        name, n = archive_write(model, day, _rows(model, ids))
        res.archived += n
        if name:
            res.files.append(name)
    if dry_run:
        return
    for i in range(0, len(every), BATCH):
        res.deleted += delete(every[i:i + BATCH])


def _prune_jobs(result: PruneResult, by_day: dict[date, list[int]], *, dry_run: bool,
                samples_before: datetime | None) -> None:
    res = result.table(Job)
    owned = {m: result.table(m) for m in JOB_OWNED}
    every: list[int] = []
    for day, ids in by_day.items():  # every day's files saved before any job is deleted
        res.rows += len(ids)
        res.days.append(day.isoformat())
        if dry_run:
            for m, r in owned.items():
                qs = m._default_manager.filter(job_id__in=ids)
                if m is UtilizationSample and samples_before is not None:
                    qs = qs.filter(minute__gte=samples_before)  # counted above
                n = qs.count()
                r.rows += n
                if n:
                    r.days.append(day.isoformat())
            continue
        # The job's own rows first: a run stopped here leaves every job whole.
        for m, r in owned.items():
            name, n = archive_write(m, day, _rows(m, ids, by="job_id"))
            r.archived += n
            if name:
                r.files.append(name)
                r.days.append(day.isoformat())
        name, n = archive_write(Job, day, _rows(Job, ids))
        res.archived += n
        if name:
            res.files.append(name)
        every += ids
    if dry_run:
        return
    for i in range(0, len(every), JOB_BATCH):
        per = _delete_jobs(every[i:i + JOB_BATCH])
        res.deleted += per.get(Job._meta.label, 0)
        for m, r in owned.items():
            r.rows += per.get(m._meta.label, 0)
            r.deleted += per.get(m._meta.label, 0)
