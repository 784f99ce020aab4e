"""History retention (services/history.py; docs/deployment.md, "History retention"):
what is older than the retentions is archived (read back and compared with the rows it
was), then deleted; newer rows, live jobs and what they need are kept; the reports,
the standings and `fairshare_recompute` read the same before and after; a run stopped
after its archive re-runs without duplicates or losses; 0 keeps everything."""

from __future__ import annotations

import io
import json
import random
from dataclasses import asdict
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.db import models, transaction

from accounts.models import Team
from queueing.models import (
    AttemptUtilization,
    Checkpoint,
    HistoryPrune,
    Job,
    JobEvent,
    JobLog,
    UsagePruned,
    UsageRecord,
    UtilizationSample,
    WebhookDelivery,
)
from queueing.selectors.fairshare import fairshare_standings, fairshare_standings_at, raw_decayed_usage
from queueing.selectors.reports import first_usage_day, report_buckets
from queueing.services import history
from queueing.services.costs import gpu_price_set
from queueing.services.fairshare import fairshare_recompute
from queueing.services.reports import usage_days_roll_up
from tests.accounting.history import finished_attempt, job
from tests.conftest import World

NOW = datetime(2026, 11, 20, 12, 30, tzinfo=UTC)
TABLES: tuple[type[models.Model], ...] = (Job, JobEvent, AttemptUtilization, UtilizationSample,
                                          Checkpoint, JobLog, UsageRecord, WebhookDelivery)


def _history(world: World, rng: random.Random, n: int = 40) -> dict[str, Any]:
    """`n` finished jobs over the last 200 days (some spot, some preempted), imported
    records, a queued and a running job with old history, a finished old job a queued
    one depends on; rolled up."""
    gpu_price_set(actor=world.staff, gpu_type=world.h100, effective_from=date(2026, 1, 1),
                  price_per_gpu_hour=Decimal("2"))
    teams = [world.vision, world.nlp, world.speech]
    types = [world.h100, world.a100]
    for _ in range(n):
        start = NOW - timedelta(days=rng.uniform(1, 200))
        attempts = rng.choice([1, 1, 2])
        j = job(team=rng.choice(teams), gpu_type=rng.choice(types), tier=world.normal,
                gpus_per_replica=rng.choice([1, 2, 4]), attempt=attempts,
                status=rng.choice(["SUCCEEDED", "FAILED", "CANCELLED"]),
                created_at=start - timedelta(hours=1))
        t = start
        for a in range(1, attempts + 1):
            hours = rng.uniform(0.1, 30)
            rec = finished_attempt(job=j, attempt=a, start=t, hours=hours,
                                   ended="PREEMPTED" if a < attempts else str(j.status),
                                   sm_mean=rng.choice([None, 20.0, 70.0]))
            # Minutes per SM-activity percent: some idle (rule U5; the reports' idle hours).
            AttemptUtilization.objects.filter(job=j, attempt=a).update(
                sm_hist={"1": int(hours * 20), "60": int(hours * 40)})
            if rng.random() < 0.15:  # rule C4: a spot attempt at its own price
                UsageRecord.objects.filter(pk=rec.pk).update(
                    spot=True, price_per_gpu_hour=Decimal("0.9"))
            for m in range(3):
                UtilizationSample.objects.create(job=j, attempt=a, sm=rng.uniform(0, 100),
                                                 minute=t + timedelta(minutes=m),
                                                 mem_bytes=rng.randrange(1 << 30))
            Checkpoint.objects.create(job=j, attempt=a, created_at=t + timedelta(minutes=5),
                                      step=rng.randrange(1000), progress=0.5, path="s3://x")
            JobLog.objects.create(job=j, attempt=a, text="", fetched_at=rec.end, final=True)
            t = rec.end + timedelta(minutes=rng.uniform(1, 60))
        Job.objects.filter(pk=j.pk).update(finished_at=t, started_at=rec.start)
        if rng.random() < 0.3:  # a webhook delivery of its last event (kept, unlinked)
            WebhookDelivery.objects.create(
                team=j.team, job=j, event=JobEvent.objects.filter(job=j).last(),
                url="https://hooks.example.com/x", message_id=f"msg_{j.pk}",
                event_type="job.succeeded", payload={"id": j.pk}, created_at=t)
    for _ in range(5):  # imported: no job
        start = NOW - timedelta(days=rng.uniform(1, 200))
        UsageRecord.objects.create(team=rng.choice(teams), gpu_type=world.a100, gpus=8,
                                   billing_weight=1.0, start=start,
                                   end=start + timedelta(hours=5), gpu_seconds=8 * 5 * 3600,
                                   source="import")
    old = NOW - timedelta(days=180)
    running = job(team=world.vision, gpu_type=world.a100, tier=world.normal, attempt=2,
                  status="RUNNING", started_at=NOW - timedelta(days=150),
                  created_at=old)
    finished_attempt(job=running, attempt=1, start=old, hours=3, ended="PREEMPTED")
    queued = job(team=world.nlp, gpu_type=world.a100, tier=world.normal, attempt=2,
                 status="QUEUED", created_at=old)
    finished_attempt(job=queued, attempt=1, start=old, hours=2, ended="PREEMPTED")
    needed = job(team=world.nlp, gpu_type=world.a100, tier=world.normal, created_at=old,
                 finished_at=old + timedelta(hours=4))
    finished_attempt(job=needed, attempt=1, start=old, hours=4, ended="SUCCEEDED")
    waiting = job(team=world.nlp, gpu_type=world.a100, tier=world.normal, status="QUEUED",
                  dependencies=[{"type": "after_ok", "job": needed.pk}], created_at=old)
    while usage_days_roll_up(now=NOW):
        pass
    return {"running": running, "queued": queued, "needed": needed, "waiting": waiting}


def _rows(model: type[models.Model]) -> dict[int, dict[str, Any]]:
    """Every row of `model` (its columns as the ORM reads them), by id."""
    pk = model._meta.pk.attname
    return {r[pk]: r for r in
            model._default_manager.order_by("pk").values(*history.columns(model))}


def _archived(model: type[models.Model]) -> dict[int, dict[str, Any]]:
    """Every row of `model` in the archive, read back, by id; each id once."""
    out: dict[int, dict[str, Any]] = {}
    pk = model._meta.pk.attname
    store = history.storage()
    table = model._meta.db_table
    if not store.exists(table):
        return out
    for name in sorted(store.listdir(table)[1]):
        for r in history.archive_read(f"{table}/{name}"):
            assert r[pk] not in out, f"{table} row {r[pk]} archived twice"
            out[r[pk]] = r
    return out


def _answers() -> dict[str, Any]:
    """What the pages and the scheduler read of the history."""
    cache.clear()
    teams = list(Team.objects.order_by("slug"))
    reports = {p: [asdict(b) for b in report_buckets(
        teams=teams, start=date(2026, 1, 1), end=NOW.date() + timedelta(days=1), period=p,
        now=NOW).buckets] for p in ("day", "month")}
    return {
        "reports": reports,
        "first_day": first_usage_day(teams=teams, now=NOW),
        "standings": fairshare_standings(now=NOW),
        "standings_yesterday": fairshare_standings_at(at=NOW - timedelta(days=1), now=NOW),
        "raw": raw_decayed_usage(at=NOW),
        "recompute": fairshare_recompute(now=NOW, write=False).max_abs_diff,
    }


def _same(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["reports"] == before["reports"]
    assert after["first_day"] == before["first_day"]
    assert after["standings"] == before["standings"]
    assert set(after["raw"]) == set(before["raw"])
    for team, v in before["raw"].items():
        assert after["raw"][team] == pytest.approx(v, rel=1e-9, abs=1e-9)
    assert after["recompute"] == pytest.approx(before["recompute"], abs=1e-6)
    for team, s in before["standings_yesterday"].items():
        assert after["standings_yesterday"][team].usage == pytest.approx(s.usage, rel=1e-9)
        assert after["standings_yesterday"][team].factor == pytest.approx(s.factor, rel=1e-9)


@pytest.fixture(autouse=True)
def _archive(settings: Any, tmp_path: Any) -> None:
    """An archive of this test's own."""
    settings.STORAGES = {**settings.STORAGES, history.STORAGE_ALIAS: {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path / "fairq-history")}}}


@pytest.fixture
def retention(settings: Any) -> Any:
    settings.FAIRQ_JOB_RETENTION_DAYS = 90
    settings.FAIRQ_USAGE_RETENTION_DAYS = 100
    settings.FAIRQ_UTIL_RETENTION_DAYS = 30
    settings.FAIRQ_UTIL_ARCHIVE = True
    return settings


@pytest.mark.django_db
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_both_paths_archive_the_same_rows(world: World, seed: int, on_postgres: bool,
                                          monkeypatch: pytest.MonkeyPatch,
                                          tmp_path: Any) -> None:
    """PostgreSQL's lines (`row_to_json`) and the plain path's (Python's json over the
    ORM's rows) read back to the same rows, each as the table holds it."""
    if not on_postgres:
        pytest.skip("the fast path is PostgreSQL's")
    _history(world, random.Random(seed))
    for m in TABLES:
        rows = _rows(m)
        read: dict[bool, list[dict[str, Any]]] = {}
        for fast in (True, False):
            monkeypatch.setattr(history, "_FAST", fast)
            path = tmp_path / f"{m._meta.db_table}-{fast}"
            path.write_text("".join(line + "\n" for _, line in history._rows(m, list(rows))))
            with path.open() as f:
                fields = {f.attname: f for f in m._meta.concrete_fields}
                read[fast] = [{k: history._value(fields[k], v)
                               for k, v in json.loads(line).items()} for line in f]
        assert read[True] == read[False] == list(rows.values()), m


class _Undo(Exception):
    pass


@pytest.mark.django_db
@pytest.mark.parametrize("seed", [4, 5, 6])
def test_both_paths_delete_the_same_jobs(world: World, seed: int, on_postgres: bool,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL's statements per related table and Django's collector leave the same
    rows behind (events, samples, ... gone; usage records and deliveries unlinked)."""
    if not on_postgres:
        pytest.skip("the fast path is PostgreSQL's")
    rng = random.Random(seed)
    _history(world, rng)
    ids = rng.sample(list(Job.objects.filter(status__in=["SUCCEEDED", "FAILED", "CANCELLED"])
                          .values_list("pk", flat=True)), 15)
    left: dict[bool, Any] = {}
    counts: dict[bool, dict[str, int]] = {}

    def delete_then_undo(fast: bool) -> None:
        with transaction.atomic():
            counts[fast] = history._delete_jobs(ids)
            left[fast] = {m: _rows(m) for m in TABLES}
            raise _Undo

    for fast in (True, False):
        monkeypatch.setattr(history, "_FAST", fast)
        with pytest.raises(_Undo):
            delete_then_undo(fast)
    assert left[True] == left[False]
    assert {k: v for k, v in counts[True].items() if v} == \
        {k: v for k, v in counts[False].items() if v}
    assert not any(pk in left[True][Job] for pk in ids)
    assert any(r["job_id"] is None for r in left[True][WebhookDelivery].values())


@pytest.mark.django_db
@pytest.mark.parametrize(("seed", "fast"), [(1, True), (2, True), (3, False)])
def test_old_rows_archived_then_deleted_and_answers_unchanged(
        world: World, retention: Any, seed: int, fast: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "_FAST", fast)
    live = _history(world, random.Random(seed))
    before = {m: _rows(m) for m in TABLES}
    answers = _answers()
    job_cut, usage_cut = history.cutoff(NOW, 90), history.cutoff(NOW, 100)
    sample_cut = history.cutoff(NOW, 30)

    dry = history.history_prune(now=NOW, dry_run=True)
    assert {m: _rows(m) for m in TABLES} == before  # a dry run changes nothing
    assert not HistoryPrune.objects.exists()
    result = history.history_prune(now=NOW, actor_label="test")

    after = {m: _rows(m) for m in TABLES}
    for m in TABLES:
        gone = set(before[m]) - set(after[m])
        archived = _archived(m)
        # What went is in the archive, as it was; nothing else is.
        assert archived == {pk: before[m][pk] for pk in gone}, m
        assert set(after[m]) <= set(before[m])
        assert dry.table(m).rows == len(gone) == result.table(m).deleted, m
    jobs_gone = set(before[Job]) - set(after[Job])
    assert jobs_gone, "the history has old jobs"
    for pk in before[Job]:
        j = Job.objects.filter(pk=pk).first()
        if j is None:
            continue
        if j.status in ("SUCCEEDED", "FAILED", "CANCELLED") and j.finished_at < job_cut and \
                j.pk != live["needed"].pk:
            # only kept for a spot record of theirs (reports read it with the job)
            assert j.usage_records.filter(spot=True).exists()
    for j in live.values():  # live jobs, and the finished one a queued job depends on
        assert Job.objects.filter(pk=j.pk).exists()
        assert JobEvent.objects.filter(job=j).count() == sum(
            1 for r in before[JobEvent].values() if r["job_id"] == j.pk)
    for pk in set(before[JobEvent]) - set(after[JobEvent]):  # events went with their job
        assert JobEvent.objects.filter(pk=pk).count() == 0
    assert not JobEvent.objects.filter(job_id__in=jobs_gone).exists()
    assert UsageRecord.objects.filter(end__gte=usage_cut).count() == sum(
        1 for r in before[UsageRecord].values() if r["end"] >= usage_cut)
    assert not UsageRecord.objects.filter(end__lt=usage_cut, spot=False,
                                          job__isnull=True).exists()
    assert not UtilizationSample.objects.filter(minute__lt=sample_cut).exists()
    assert UsagePruned.objects.exists()

    _same(answers, _answers())
    run = HistoryPrune.objects.get()
    assert run.actor_label == "test" and run.finished_at is not None and not run.error
    assert run.tables["queueing_job"]["deleted"] == len(jobs_gone)
    assert run.retention["FAIRQ_JOB_RETENTION_DAYS"] == 90

    # A second run finds nothing more and writes nothing.
    again = history.history_prune(now=NOW)
    assert all(t.rows == 0 and not t.files for t in again.tables.values())
    assert {m: _rows(m) for m in TABLES} == after


@pytest.mark.django_db
@pytest.mark.parametrize("where", ["usage", "jobs", "usage-midway"])
def test_a_run_stopped_after_its_archive_reruns_cleanly(world: World, retention: Any,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        where: str) -> None:
    _history(world, random.Random(7))
    before = {m: _rows(m) for m in TABLES}
    answers = _answers()
    real_write, real_delete = history.archive_write, history._delete_usage
    calls = {"n": 0}

    def write(model: Any, day: Any, rows: Any) -> Any:
        out = real_write(model, day, rows)
        if (where == "usage" and model is UsageRecord) or (where == "jobs" and model is Job):
            raise RuntimeError("stopped after the archive")
        return out

    def delete(ids: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("stopped between two batches")
        return real_delete(ids)

    monkeypatch.setattr(history, "archive_write", write)
    if where == "usage-midway":
        monkeypatch.setattr(history, "BATCH", 2)
        monkeypatch.setattr(history, "_delete_usage", delete)
    with pytest.raises(RuntimeError):
        history.history_prune(now=NOW)
    failed = HistoryPrune.objects.get()
    assert failed.error.startswith("RuntimeError") and failed.finished_at is None
    monkeypatch.setattr(history, "archive_write", real_write)
    monkeypatch.setattr(history, "_delete_usage", real_delete)

    history.history_prune(now=NOW)
    for m in TABLES:
        gone = set(before[m]) - set(_rows(m))
        assert _archived(m) == {pk: before[m][pk] for pk in gone}, m  # once each
    assert UsageRecord.objects.count() < len(before[UsageRecord])
    _same(answers, _answers())


@pytest.mark.django_db
def test_zero_keeps_everything(world: World, settings: Any) -> None:
    settings.FAIRQ_JOB_RETENTION_DAYS = 0
    settings.FAIRQ_USAGE_RETENTION_DAYS = 0
    settings.FAIRQ_UTIL_RETENTION_DAYS = 0
    _history(world, random.Random(3))
    before = {m: _rows(m) for m in TABLES}
    result = history.history_prune(now=NOW + timedelta(days=3650))
    assert {m: _rows(m) for m in TABLES} == before
    assert not result.tables
    assert HistoryPrune.objects.get().tables == {}
    assert all(not _archived(m) for m in TABLES)


@pytest.mark.django_db
def test_the_command_prints_what_a_dry_run_would_do(world: World, retention: Any) -> None:
    _history(world, random.Random(5))
    before = {m: _rows(m) for m in TABLES}
    out = io.StringIO()
    call_command("history_prune", "--dry-run", stdout=out)
    text = out.getvalue()
    assert "FAIRQ_JOB_RETENTION_DAYS=90" in text
    assert "queueing_job: would archive and delete" in text
    assert {m: _rows(m) for m in TABLES} == before
    assert not HistoryPrune.objects.exists()


@pytest.mark.django_db
def test_samples_are_deleted_unarchived_by_default(world: World, settings: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """FAIRQ_UTIL_ARCHIVE off (the default): old samples go as the purge always took them,
    with no storage at all (a worker whose root filesystem is read-only has none)."""
    settings.FAIRQ_JOB_RETENTION_DAYS = 0
    settings.FAIRQ_USAGE_RETENTION_DAYS = 0
    settings.FAIRQ_UTIL_RETENTION_DAYS = 30
    assert settings.FAIRQ_UTIL_ARCHIVE is False
    _history(world, random.Random(4))
    cut = history.cutoff(NOW, 30)
    old = UtilizationSample.objects.filter(minute__lt=cut).count()
    kept = UtilizationSample.objects.filter(minute__gte=cut).count()
    assert old and kept

    def no_storage(*args: Any, **kwargs: Any) -> Any:
        raise OSError("read-only file system")

    monkeypatch.setattr(history, "archive_write", no_storage)
    result = history.history_prune(now=NOW)
    assert result.table(UtilizationSample).deleted == old
    assert result.table(UtilizationSample).archived == 0
    assert not UtilizationSample.objects.filter(minute__lt=cut).exists()
    assert UtilizationSample.objects.count() == kept
    assert not HistoryPrune.objects.get().error
