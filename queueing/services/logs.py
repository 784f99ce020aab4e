"""Job logs for people, without the web touching the cluster (docs/kubernetes.md, "RBAC"),
kept after the pod is gone.

Two copies, one row (`JobLog`) per job, attempt and replica:

- **live**: the worker reads a bounded tail of each running job's logs every
  FAIRQ_LOG_ARCHIVE_SECONDS into `JobLog.text` (`job_logs_archive`, the beat task
  `job-logs-archive`);
- **kept**: when an attempt ends, the tail of each replica's log (FAIRQ_LOG_ARCHIVE_BYTES)
  goes to the "fairq-logs" storage (Django's storage API: files by default, S3 through
  django-storages) and the row becomes `final` (`attempt_logs_keep`). Where an attempt
  ends decides who reads it:
    * succeeded: the pods stay until the Job's TTL; the next run of `job_logs_archive`
      reads them once more and keeps them (the attempts that ended longest ago first);
    * failed (a replica failed and the others still run), preempted, cancelled,
      orphaned: fairq deletes the pods, so the worker reads every replica's log just
      before (`workload_stop_keeping_logs`, the one way the worker stops a workload:
      after the cycle's commit, in the stop task, for workloads no job holds in
      reconcile, never inside a transaction; a cycle's are read concurrently,
      `workloads_stop_keeping_logs`, FAIRQ_LOG_READ_CONCURRENCY at a time);
    * when the cluster does not answer for a replica's log (a timeout, a server error:
      `logs_unanswered`), nothing is deleted: `LogsUnread` is raised and the stop is
      tried again (the stop task's retry, the next cycle) until the read is answered
      or FAIRQ_LOG_KEEP_RETRY_SECONDS have passed since the first unanswered read;
    * when the read finds nothing (the pods were gone), or the retries ran out, the last
      live copy is kept instead (at most one refresh old);
    * a stopped workload's program goes on for its grace (its stop signal, a checkpoint,
      docs/kubernetes.md "Graceful stop"): once the cluster no longer lists it, its logs
      are read once more and the kept copy replaced when that read has the job's lines
      (`stopped_logs_keep_again`, each cycle; the Kubernetes backend remembers a stopped
      pod's last log when its container ends, before the pod goes).

The web and the API read only these rows and the storage (`job_log_read`).

Kept files go with their rows: a JobLog row deleted (alone, or with its job) deletes its
file once the transaction commits (`joblog_file_forget`, connected in queueing/signals.py);
rows kept longer than FAIRQ_LOG_RETENTION_DAYS ago are pruned by `job_logs_prune` (the
beat task `job-logs-prune`), one job event (kind `logs_pruned`) per pruned attempt.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import cast

from django.conf import settings
from django.core.cache import cache
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import transaction
from django.db.models import F, Q

from queueing.backends.base import (
    ClusterBackend,
    logs_unanswered,
    parse_workload_name,
    workload_name,
)
from queueing.composition import backend_class
from queueing.errors import DomainError
from queueing.models import Job, JobEvent, JobLog
from queueing.policy.states import FINAL_STATES, JobState

from .clusters import fleet_open

log = logging.getLogger(__name__)

STORAGE_ALIAS = "fairq-logs"
# Finished attempts older than this are not read any more (their pods are gone).
FINISHED_LOOKBACK = timedelta(hours=2)
# Jobs read per run: bounds the task's time (one or two API calls per job).
BATCH = 200
EMPTY_NOTE = "the pod wrote nothing"
_POD_HEADER = re.compile(r"^==> (.+) <==$")


# Rows pruned per run: bounds the task's time (each row is a file to delete).
PRUNE_BATCH = 1000


class LogsUnread(Exception):
    """The cluster did not answer for the log of some replica of a workload about to be
    stopped, and FAIRQ_LOG_KEEP_RETRY_SECONDS have not passed since it first did not:
    the workload is left as it is (its pods, and their logs, stay) for a later try."""


@dataclass
class ArchiveResult:
    refreshed: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    kept: list[tuple[int, int]] = field(default_factory=list)  # (job, attempt) made final
    left: int = 0  # jobs due but left for the next run (the time budget)


def log_storage() -> Storage:
    return storages[STORAGE_ALIAS]


def bound_log_text(text: str, *, lines: int, max_bytes: int) -> str:
    """The last `lines` lines of `text`, cut further (whole lines first) to `max_bytes`
    of UTF-8."""
    kept = text.splitlines()[-lines:]
    out = "\n".join(kept)
    while len(out.encode()) > max_bytes and len(kept) > 1:
        kept = kept[max(1, len(kept) // 10):]
        out = "\n".join(kept)
    if len(out.encode()) > max_bytes:  # one huge line: its end
        out = out.encode()[-max_bytes:].decode(errors="ignore")
    return out


def split_replicas(text: str) -> dict[int, str]:
    """One workload's `backend.logs()` answer, per replica: a backend with several pods
    heads each with `==> <pod> <==`, in replica order (backends sort their pods so);
    without a header the whole text is replica 0's."""
    chunks: list[list[str]] = []
    for line in text.splitlines():
        if _POD_HEADER.match(line):
            chunks.append([])
        elif chunks:
            chunks[-1].append(line)
        else:
            chunks.append([line])
    return {i: "\n".join(lines) for i, lines in enumerate(chunks)} or {0: ""}


def _nothing_read(text: str) -> bool:
    """The backend's answer holds no line of the job's own (only its "[fairq] ..." notes
    and per-pod headers)."""
    return all(line.startswith(("[fairq]", "==> ")) for line in text.splitlines())


def _archive_name(job_id: int, attempt: int, replica: int) -> str:
    return f"jobs/{job_id}/attempt-{attempt}/replica-{replica}.log"


def _keep(*, job_id: int, attempt: int, texts: dict[int, str] | None, now: datetime) -> None:
    """Make (job, attempt) final: each replica's tail to the storage, rows marked final.
    `texts` None (the read failed) or a replica with nothing read keeps the live copy."""
    rows = {r.replica: r for r in JobLog.objects.filter(job_id=job_id, attempt=attempt)}
    replicas = sorted(set(rows) | set(texts or {}))
    storage = log_storage()
    for replica in replicas:
        row = rows.get(replica)
        if row is not None and row.final:
            continue
        text = (texts or {}).get(replica)
        if text is None or (_nothing_read(text) and row is not None and row.text):
            text = row.text if row is not None else ""
        text = bound_log_text(text, lines=settings.FAIRQ_LOG_ARCHIVE_KEEP_LINES,
                              max_bytes=settings.FAIRQ_LOG_ARCHIVE_BYTES)
        data = text.encode()
        name = _archive_name(job_id, attempt, replica)
        if storage.exists(name):
            storage.delete(name)
        stored = storage.save(name, ContentFile(data))
        JobLog.objects.update_or_create(
            job_id=job_id, attempt=attempt, replica=replica,
            defaults={"text": "", "stored": stored, "size": len(data), "final": True,
                      "fetched_at": now})


def _read(backend: ClusterBackend, name: str, *, lines: int) -> dict[int, str] | None:
    try:
        return split_replicas(backend.logs(name, tail=lines))
    except Exception as exc:  # the cluster is down: keep the last copy
        log.info("reading the logs of %s failed: %s", name, exc)
        return None


def _unanswered(texts: dict[int, str] | None) -> list[int] | None:
    """The replicas whose log the cluster did not answer for; None: the whole read."""
    if texts is None:
        return None
    return [r for r, text in sorted(texts.items()) if logs_unanswered(text)]


def _unread_key(name: str) -> str:
    return f"fairq:logs-unread:{name}"


def _read_again(name: str, now: datetime) -> bool:
    """Whether to leave workload `name` for another read (its logs were not answered):
    until FAIRQ_LOG_KEEP_RETRY_SECONDS after the first unanswered read (noted in the
    cache, so every worker process counts from the same instant)."""
    limit = float(settings.FAIRQ_LOG_KEEP_RETRY_SECONDS)
    if limit <= 0:
        return False
    key = _unread_key(name)
    cache.add(key, now.timestamp(), timeout=int(limit * 4) + 60)
    first = cache.get(key)
    return first is None or now.timestamp() - float(first) < limit


# `attempt_logs_keep`'s `texts` when the caller has not read the logs yet.
_UNREAD: object = object()


def _attempt_ran(job_id: int, attempt: int) -> bool:
    """Whether fairq saw that attempt RUNNING (its transition event)."""
    return JobEvent.objects.filter(job_id=job_id, attempt=attempt,
                                   to_status=JobState.RUNNING).exists()


def _needs_keeping(job_id: int, attempt: int) -> bool:
    return Job.objects.filter(pk=job_id).exists() and not JobLog.objects.filter(
        job_id=job_id, attempt=attempt, final=True).exists()


def attempt_logs_keep(*, backend: ClusterBackend, name: str, now: datetime,
                      texts: dict[int, str] | object | None = _UNREAD) -> bool:
    """Keep the tail of each replica's log of workload `name` (an attempt that ended or
    is about to be stopped), unless kept already. `LogsUnread` when the cluster did not
    answer for some replica's log (nothing is kept then: the caller must not delete the
    pods), until FAIRQ_LOG_KEEP_RETRY_SECONDS after the first such read; after that, or
    when the pods are gone, the last live copy is kept. `texts`: what `_read` answered,
    when the caller read it already (`workloads_stop_keeping_logs` reads many at once).
    True when something was kept."""
    parsed = parse_workload_name(name)
    if parsed is None:
        return False
    job_id, attempt = parsed
    job = Job.objects.filter(pk=job_id).only("attempt", "started_at").first()
    if job is None or JobLog.objects.filter(job_id=job_id, attempt=attempt,
                                            final=True).exists():
        return False
    if texts is _UNREAD:
        texts = _read(backend, name, lines=settings.FAIRQ_LOG_ARCHIVE_KEEP_LINES)
    read = cast(dict[int, str] | None, texts)
    unanswered = _unanswered(read)
    if unanswered is None or unanswered:
        which = "its pods" if unanswered is None else \
            "replica " + ", ".join(str(r) for r in unanswered)
        if _read_again(name, now):
            raise LogsUnread(f"the cluster did not answer for the logs of {name} ({which}); "
                             "it is left running until they are read")
        log.warning("the cluster did not answer for the logs of %s (%s) for %.0f s; keeping "
                    "what fairq has", name, which, settings.FAIRQ_LOG_KEEP_RETRY_SECONDS)
    if not any((read or {}).values()) and not _attempt_ran(job_id, attempt) and \
            not JobLog.objects.filter(job_id=job_id, attempt=attempt).exists():
        # Cancelled or preempted before it ran (a preempted victim's workload is stopped
        # after the commit that requeued it, so its job is on the next attempt by now):
        # no log to keep, not an empty one.
        return False
    try:
        _keep(job_id=job_id, attempt=attempt, texts=read, now=now)
    except Exception:  # the storage is down: the stop must go on
        log.exception("keeping the logs of %s failed", name)
        return False
    cache.delete(_unread_key(name))
    return True


def workload_stop_keeping_logs(*, backend: ClusterBackend, name: str, now: datetime) -> None:
    """Stop workload `name` after keeping its logs (its pods go with it); `LogsUnread`
    (not stopped) while the cluster does not answer for a replica's log. Call it with no
    transaction open: it reads the cluster."""
    attempt_logs_keep(backend=backend, name=name, now=now)
    backend.stop(name, now=now)
    _keep_again_later([name], now=now)


# Stopped workloads whose logs are read once more when the cluster no longer lists them
# (`stopped_logs_keep_again`): name -> when it was stopped (epoch seconds), in the shared
# cache so every worker process sees the same list. Best effort: a lost entry leaves the
# copy kept at the stop.
_AGAIN_KEY = "fairq:logs-keep-again"
_AGAIN_MAX = 1000
_AGAIN_TTL = timedelta(hours=1)
_AGAIN_PER_CYCLE = 20


def _keep_again_later(names: Sequence[str], *, now: datetime) -> None:
    again = dict(cache.get(_AGAIN_KEY) or {})
    for name in names:
        if parse_workload_name(name) is not None:
            again.setdefault(name, now.timestamp())
    if len(again) > _AGAIN_MAX:
        again = dict(sorted(again.items(), key=lambda kv: kv[1])[-_AGAIN_MAX:])
    cache.set(_AGAIN_KEY, again, timeout=int(_AGAIN_TTL.total_seconds()) * 2)


def _keep_again(*, job_id: int, attempt: int, texts: dict[int, str], now: datetime) -> bool:
    """Replace the kept copy of each replica of (job, attempt) that `texts` has lines of
    the job's own for; True when one was replaced."""
    storage = log_storage()
    replaced = False
    for row in JobLog.objects.filter(job_id=job_id, attempt=attempt, final=True):
        text = texts.get(row.replica)
        if text is None or _nothing_read(text):
            continue
        data = bound_log_text(text, lines=settings.FAIRQ_LOG_ARCHIVE_KEEP_LINES,
                              max_bytes=settings.FAIRQ_LOG_ARCHIVE_BYTES).encode()
        name = _archive_name(job_id, attempt, row.replica)
        if storage.exists(name):
            storage.delete(name)
        stored = storage.save(name, ContentFile(data))
        JobLog.objects.filter(pk=row.pk).update(stored=stored, size=len(data), fetched_at=now)
        replaced = True
    return replaced


def stopped_logs_keep_again(*, backend: ClusterBackend, listed: set[str],
                            now: datetime) -> list[str]:
    """The logs of workloads stopped with their logs kept (`workload_stop_keeping_logs`)
    that the cluster no longer lists: read once more and kept in place of the copy made
    at the stop, which was read before the program got its stop signal (what it did in
    its grace - "received SIGUSR1", "saved checkpoint" - comes after). A read that
    fails is tried again next cycle, for an hour; a read with no line of the job's own
    keeps the first copy. At most a few per cycle. Returns the names kept again."""
    again = dict(cache.get(_AGAIN_KEY) or {})
    if not again:
        return []
    horizon = (now - _AGAIN_TTL).timestamp()
    done: list[str] = []
    forget: list[str] = []
    for name, at in sorted(again.items(), key=lambda kv: kv[1]):
        if len(forget) >= _AGAIN_PER_CYCLE:
            break
        if at < horizon:
            forget.append(name)
            continue
        if name in listed:
            continue  # still stopping: its program may still write
        parsed = parse_workload_name(name)
        texts = _read(backend, name, lines=settings.FAIRQ_LOG_ARCHIVE_KEEP_LINES)
        if parsed is None or (texts is not None and not _unanswered(texts)):
            forget.append(name)
            if parsed is not None and texts and \
                    _keep_again(job_id=parsed[0], attempt=parsed[1], texts=texts, now=now):
                done.append(name)
    if forget:
        again = dict(cache.get(_AGAIN_KEY) or {})
        for name in forget:
            again.pop(name, None)
        cache.set(_AGAIN_KEY, again, timeout=int(_AGAIN_TTL.total_seconds()) * 2)
    return done


def logs_read_many(*, backend: ClusterBackend, names: Sequence[str],
                   lines: int) -> dict[str, dict[int, str] | None]:
    """`_read` of each workload in `names`, on up to FAIRQ_LOG_READ_CONCURRENCY threads
    (a read is mostly waiting on the API server and the kubelets; each keeps its own
    timeout, the backend's). No database access in the threads."""
    unique = list(dict.fromkeys(names))
    workers = min(max(1, int(settings.FAIRQ_LOG_READ_CONCURRENCY)), len(unique))
    if workers <= 1:
        return {name: _read(backend, name, lines=lines) for name in unique}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fairq-logs") as pool:
        return dict(zip(unique, pool.map(lambda n: _read(backend, n, lines=lines), unique),
                        strict=True))


def workloads_stop_keeping_logs(*, backend: ClusterBackend, names: Sequence[str],
                                now: datetime) -> dict[str, Exception]:
    """`workload_stop_keeping_logs` for many workloads (a cycle's preemption victims):
    the logs of those whose attempt is not kept yet are read concurrently
    (`logs_read_many`), then each is kept and stopped in this thread, in order. Never
    raises for one workload: returns the ones not stopped, with why (`LogsUnread`: left
    for a later try, its logs unread). Call it with no transaction open."""
    todo: list[str] = []
    for name in names:
        parsed = parse_workload_name(name)
        if parsed is not None and _needs_keeping(*parsed):
            todo.append(name)
    texts = logs_read_many(backend=backend, names=todo,
                           lines=settings.FAIRQ_LOG_ARCHIVE_KEEP_LINES)
    failed: dict[str, Exception] = {}
    for name in names:
        try:
            attempt_logs_keep(backend=backend, name=name, now=now,
                              texts=texts.get(name, _UNREAD))
            backend.stop(name, now=now)
        except Exception as exc:
            failed[name] = exc
    _keep_again_later([n for n in names if n not in failed], now=now)
    return failed


def job_logs_archive(*, backend: ClusterBackend, now: datetime,
                     limit: int = BATCH, budget_seconds: float | None = None) -> ArchiveResult:
    """Refresh the live copy of running jobs (older than FAIRQ_LOG_ARCHIVE_SECONDS), keep
    the logs of attempts that finished since their last read (`attempt_logs_keep`), and
    keep the live copy of earlier attempts nobody kept (their pods are gone).

    Bounded and resumable, so the task's time limit never cuts it short: at most
    `limit` jobs, the finished attempts first (their pods go with the Job's TTL), then
    the longest unread; read FAIRQ_LOG_READ_CONCURRENCY at a time (`logs_read_many`), a
    chunk at a time, each job's copy written (and committed) as soon as it is read; no
    new chunk once `budget_seconds` (FAIRQ_LOG_ARCHIVE_BUDGET_SECONDS) are spent. What is
    left is the next run's, first in line (it is the longest unread). A job whose logs
    cannot be read keeps its last copy and is tried again next run."""
    started = time.perf_counter()
    budget = float(settings.FAIRQ_LOG_ARCHIVE_BUDGET_SECONDS if budget_seconds is None
                   else budget_seconds)
    result = ArchiveResult()
    refresh = timedelta(seconds=settings.FAIRQ_LOG_ARCHIVE_SECONDS)
    jobs = list(
        Job.objects.filter(
            Q(status=JobState.RUNNING)
            | Q(status__in=[str(s) for s in FINAL_STATES], started_at__isnull=False,
                finished_at__gte=now - FINISHED_LOOKBACK))
        .only("id", "attempt", "status", "finished_at")
    )
    rows: dict[tuple[int, int], list[JobLog]] = {}
    for r in JobLog.objects.filter(job_id__in=[j.pk for j in jobs]).only(
            "job_id", "attempt", "fetched_at", "final"):
        rows.setdefault((r.job_id, r.attempt), []).append(r)

    def due(job: Job) -> datetime | None:
        """None: up to date; else when it was last read (the oldest first)."""
        got = rows.get((job.pk, job.attempt))
        if not got:
            return datetime.min.replace(tzinfo=now.tzinfo)
        if all(r.final for r in got):
            return None
        fetched = min(r.fetched_at for r in got)
        if job.state == JobState.RUNNING:
            return fetched if now - fetched >= refresh else None
        return fetched  # finished since the last read: read once more

    dues = [(job.state == JobState.RUNNING, d, job) for job in jobs
            if (d := due(job)) is not None]
    dues.sort(key=lambda p: (p[0], p[1], p[2].pk))
    todo = [job for _, _, job in dues[:limit]]
    chunk = max(1, int(settings.FAIRQ_LOG_READ_CONCURRENCY)) * 2
    for start in range(0, len(todo), chunk):
        if start and time.perf_counter() - started >= budget:
            result.left = len(todo) - start
            log.info("job_logs_archive: %d jobs left for the next run (budget %.0f s)",
                     result.left, budget)
            break
        _archive_chunk(backend=backend, jobs=todo[start:start + chunk], now=now,
                       result=result)
    # Earlier attempts left live (a preemption whose read was missed): keep their copy.
    for job_id, attempt in (JobLog.objects.filter(final=False, attempt__lt=F("job__attempt"))
                            .values_list("job_id", "attempt").distinct()[:limit]):
        _keep(job_id=job_id, attempt=attempt, texts=None, now=now)
        result.kept.append((job_id, attempt))
    return result


def _archive_chunk(*, backend: ClusterBackend, jobs: Sequence[Job], now: datetime,
                   result: ArchiveResult) -> None:
    """`job_logs_archive` for a few jobs: their logs read concurrently, then each job's
    copy written in this thread."""
    finished = [j for j in jobs if j.state in FINAL_STATES]
    running = [j for j in jobs if j.state not in FINAL_STATES]
    kept_texts = logs_read_many(backend=backend, names=[j.backend_name for j in finished],
                                lines=settings.FAIRQ_LOG_ARCHIVE_KEEP_LINES)
    live_texts = logs_read_many(backend=backend, names=[j.backend_name for j in running],
                                lines=settings.FAIRQ_LOG_ARCHIVE_LINES)
    for job in finished:
        try:
            if attempt_logs_keep(backend=backend, name=job.backend_name, now=now,
                                 texts=kept_texts.get(job.backend_name, _UNREAD)):
                result.kept.append((job.pk, job.attempt))
        except LogsUnread as exc:
            result.failed[job.pk] = str(exc)
            continue
        result.refreshed.append(job.pk)
    for job in running:
        texts = live_texts.get(job.backend_name)
        if texts is None:
            result.failed[job.pk] = "the cluster did not answer"
            continue
        for replica, text in texts.items():
            text = bound_log_text(text, lines=settings.FAIRQ_LOG_ARCHIVE_LINES,
                                  max_bytes=settings.FAIRQ_LOG_ARCHIVE_MAX_BYTES)
            row = JobLog.objects.filter(job_id=job.pk, attempt=job.attempt,
                                        replica=replica).first()
            if row is not None and row.text and _nothing_read(text):
                # The pod is gone: that answer must not erase the copy.
                JobLog.objects.filter(pk=row.pk).update(fetched_at=now)
            else:
                JobLog.objects.update_or_create(
                    job_id=job.pk, attempt=job.attempt, replica=replica,
                    defaults={"text": text, "fetched_at": now})
        result.refreshed.append(job.pk)


# --- retention ------------------------------------------------------------------------------

def stored_log_delete(name: str) -> bool:
    """Delete one kept file from the "fairq-logs" storage; a storage that fails is logged,
    never raised (the rows are gone already: a file left behind is the lesser harm).
    True when nothing is left under `name`."""
    try:
        log_storage().delete(name)
    except Exception:
        log.warning("deleting the kept log %s from the log storage failed", name, exc_info=True)
        return False
    return True


def joblog_file_forget(sender: object, instance: JobLog, **kwargs: object) -> None:
    """post_delete of a JobLog (its own delete, its job's cascade, a prune): its kept file
    is deleted once the transaction commits (a rolled-back delete keeps both)."""
    name = instance.stored
    if name:
        transaction.on_commit(lambda: stored_log_delete(name))


@dataclass
class PruneResult:
    rows: int = 0
    bytes: int = 0
    attempts: list[tuple[int, int]] = field(default_factory=list)  # (job, attempt)


def job_logs_prune(*, now: datetime, limit: int = PRUNE_BATCH) -> PruneResult:
    """Delete the kept logs (rows, and their files on commit) of attempts whose logs were
    kept more than FAIRQ_LOG_RETENTION_DAYS days before `now` (a row's `fetched_at` once
    final is when the attempt's tail was kept: its end, or a cycle after); live copies of
    running attempts are never pruned. 0 days keeps everything. Each pruned attempt gets
    one job event (kind `logs_pruned`: which replicas, how many bytes) in the same
    transaction as the delete. At most `limit` rows per call, the oldest first; the rest
    next run."""
    result = PruneResult()
    days = int(settings.FAIRQ_LOG_RETENTION_DAYS)
    if days <= 0:
        return result
    cutoff = now - timedelta(days=days)
    with transaction.atomic():
        rows = list(JobLog.objects.select_for_update(skip_locked=True)
                    .filter(final=True, fetched_at__lt=cutoff)
                    .order_by("fetched_at", "id")[:limit])
        if not rows:
            return result
        by_attempt: dict[tuple[int, int], list[JobLog]] = {}
        for row in rows:
            by_attempt.setdefault((row.job_id, row.attempt), []).append(row)
        JobLog.objects.filter(pk__in=[r.pk for r in rows]).delete()
        JobEvent.objects.bulk_create(
            JobEvent(job_id=job_id, at=now, kind=JobEvent.Kind.LOGS_PRUNED,
                     actor_label="retention", attempt=attempt,
                     reason=f"the kept logs of attempt {attempt} were deleted: kept more "
                            f"than {days} days (FAIRQ_LOG_RETENTION_DAYS)",
                     data={"replicas": sorted(r.replica for r in group),
                           "bytes": sum(r.size for r in group), "retention_days": days})
            for (job_id, attempt), group in sorted(by_attempt.items()))
    result.rows = len(rows)
    result.bytes = sum(r.size for r in rows)
    result.attempts = sorted(by_attempt)
    log.info("pruned the kept logs of %d attempts (%d files, %d bytes) kept more than %d "
             "days ago", len(result.attempts), result.rows, result.bytes, days)
    return result


# --- reading (web and API processes) -----------------------------------------------------

@dataclass(frozen=True)
class LogView:
    """One replica's log of one attempt, as people see it."""

    attempt: int
    replica: int
    source: str  # "live" (the attempt runs), "archived" (it ended), "none" (nothing yet)
    lines: list[str]
    empty: bool  # read, and the pod wrote nothing
    note: str  # a sentence when there are no lines
    exit: str  # how the attempt ended ("" while it runs)
    attempts: list[dict[str, object]]  # [{"attempt": 1, "replicas": [0, 1], "final": True}]
    workload: str = ""  # the attempt's cluster name


def _text(row: JobLog) -> str:
    if not row.final:
        return row.text
    if not row.stored:
        return ""
    try:
        with log_storage().open(row.stored, "rb") as fh:
            return bytes(fh.read()).decode(errors="replace")
    except OSError as exc:
        return f"[fairq] the kept log cannot be read: {exc}"


def _exit_line(job: Job, attempt: int) -> str:
    """How attempt `attempt` ended: the job's exit code and message for its last attempt,
    the transition that ended an earlier one (preempted, requeued)."""
    if attempt == job.attempt:
        if not job.is_final:
            return ""
        parts = []
        if job.exit_code is not None:
            parts.append(f"exit code {job.exit_code}")
        if job.message and job.message not in parts:
            parts.append(job.message)
        return f"{job.status}: {', '.join(parts)}" if parts else str(job.status)
    event = (JobEvent.objects.filter(job=job, attempt=attempt, kind=JobEvent.Kind.TRANSITION)
             .exclude(to_status__in=[JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING])
             .order_by("-at", "-id").first())
    if event is None:
        return f"attempt {attempt} ended"
    return f"{event.to_status}: {event.reason}" if event.reason else str(event.to_status)


def job_log_attempts(*, job: Job) -> list[dict[str, object]]:
    """The attempts and replicas whose logs fairq has, oldest first."""
    out: dict[int, dict[str, object]] = {}
    for attempt, replica, final in (JobLog.objects.filter(job=job)
                                    .order_by("attempt", "replica")
                                    .values_list("attempt", "replica", "final")):
        entry = out.setdefault(attempt, {"attempt": attempt, "replicas": [], "final": True})
        entry["replicas"].append(replica)  # type: ignore[attr-defined]
        entry["final"] = bool(entry["final"]) and final
    return list(out.values())


def job_log_read(*, job: Job, attempt: int | None = None, replica: int = 0,
                 tail: int = 100) -> LogView:
    """The last `tail` lines of one replica's log of one attempt (the current one by
    default): live while it runs, kept once it ended, with how it ended. A DomainError
    naming the field for an attempt or replica the job never had."""
    view = _job_log_read(job=job, attempt=job.attempt if attempt is None else attempt,
                         replica=replica, tail=tail)
    return replace(view, workload=workload_name(job.pk, view.attempt))


def _job_log_read(*, job: Job, attempt: int, replica: int, tail: int) -> LogView:
    if not 1 <= attempt <= job.attempt:
        raise DomainError("No such attempt.", fields={"attempt": [
            f"This job has attempts 1 to {job.attempt}." if job.attempt > 1
            else "This job has only attempt 1."]})
    if not 0 <= replica < job.replicas:
        raise DomainError("No such replica.", fields={"replica": [
            f"This job has replicas 0 to {job.replicas - 1}." if job.replicas > 1
            else "This job has only replica 0."]})
    attempts = job_log_attempts(job=job)
    exit_line = _exit_line(job, attempt)
    row = JobLog.objects.filter(job=job, attempt=attempt, replica=replica).first()
    never_ran = attempt == job.attempt and job.started_at is None and not job.is_final
    if row is None:
        text = ""
        pruned = JobEvent.objects.filter(job=job, attempt=attempt,
                                         kind=JobEvent.Kind.LOGS_PRUNED).order_by("-at").first()
        if attempt == job.attempt and not never_ran and pruned is None and \
                backend_class().in_process:
            # No worker archives in tests or a one-process demo: the in-process cluster.
            # Every cluster's (docs/clusters.md), found by the workload's name.
            text = split_replicas(fleet_open(in_process_only=True).logs(job.backend_name, tail=tail)).get(
                replica, "")
        if text:
            return LogView(attempt, replica, "live", text.splitlines()[-tail:], False, "",
                           exit_line, attempts)
        note = (f"the kept logs of this attempt were deleted after "
                f"{pruned.data.get('retention_days', '?')} days" if pruned is not None
                else "no logs: the job never started" if job.started_at is None
                and attempt == job.attempt and job.is_final
                else "no logs yet: the job has not started" if never_ran
                else "no logs yet" if not job.is_final or attempt != job.attempt
                else "no logs were kept for this attempt")
        return LogView(attempt, replica, "none", [], False, note, exit_line, attempts)
    text = _text(row)
    lines = text.splitlines()[-tail:]
    empty = not lines
    return LogView(attempt, replica, "archived" if row.final else "live", lines, empty,
                   EMPTY_NOTE if empty else "", exit_line, attempts)

