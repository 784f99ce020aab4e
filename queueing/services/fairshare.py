"""Fair-share services (docs/scheduling.md, rules F1-F6, P1-P3): standings at any
instant, the full recompute from raw usage, CSV import/export of usage, standings
snapshots for charts, and "why is my job waiting".

The hot path (`queueing.services.usage.fairshare_standings`) reads one accumulator per
team. Everything here that scans the usage history (`fairshare_recompute`, standings at a
past instant) is for repair, audit and the command line, never for a scheduling cycle.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TextIO

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q

from accounts.models import Team
from queueing.instants import parse_iso
from queueing.models import FairShareAccumulator, FairShareSnapshot, GpuType, Job, UsageRecord
from queueing.policy.fairshare import (
    Accumulator,
    FairShareState,
    Standing,
    TeamUsageInput,
    compute_standings,
    decayed_interval_usage,
    forest_parents,
)
from queueing.policy.priority import PriorityWeights, job_priority
from queueing.policy.snapshot import QueuedJob
from queueing.policy.states import JobState

from .usage import fairshare_standings, half_life_hours

IMPORT_COLUMNS = ("team", "gpu_type", "gpus", "start", "end")
MAX_REPORTED_ERRORS = 50


# --- settings -----------------------------------------------------------------------------

def priority_weights() -> PriorityWeights:
    """Rule P1 weights from the settings (FAIRQ_PRIORITY_*)."""
    return PriorityWeights(
        fair_share=float(settings.FAIRQ_PRIORITY_WEIGHT_FAIRSHARE),
        age=float(settings.FAIRQ_PRIORITY_WEIGHT_AGE),
        size=float(settings.FAIRQ_PRIORITY_WEIGHT_SIZE),
        max_age_seconds=float(settings.FAIRQ_PRIORITY_MAX_AGE_HOURS) * 3600.0,
        favor_small=bool(settings.FAIRQ_PRIORITY_FAVOR_SMALL),
    )


# --- standings ----------------------------------------------------------------------------

def standing_as_dict(s: Standing) -> dict[str, Any]:
    """One standing with the field names of the API (`StandingSerializer`) and the
    `fairshare --json` command, so both print the same numbers under the same names."""
    return {
        "team": s.team,
        "parent": s.parent,
        "weight": s.weight,
        "share": s.share,
        "level_share": s.share if s.level_share is None else s.level_share,
        "usage_gpu_hours": s.usage,
        "usage_fraction": s.normalized_usage if s.usage_fraction is None else s.usage_fraction,
        "normalized_usage": s.normalized_usage,
        "fair_share_factor": s.factor,
        "active": s.active,
    }


def fairshare_standings_at(*, at: datetime, now: datetime) -> dict[str, Standing]:
    """Rules F1-F6 as of `at`.

    At or after `now`: from the accumulators, O(teams) (running attempts count up to
    `at`). Before `now`: recomputed from the raw usage records, each interval cut at
    `at`, plus the attempts still running that had started by then: exact for the past,
    O(history). Activity (rule F2) at a past instant: usage, or a job submitted by then
    and not finished by then.
    """
    if at >= now:
        return fairshare_standings(now=at)
    raw = raw_decayed_usage(at=at)
    running: dict[int, list[tuple[float, datetime]]] = {}
    for team_id, gpus, replicas, weight, started_at in Job.objects.filter(
        status=JobState.RUNNING, started_at__lt=at
    ).values_list("team_id", "gpus_per_replica", "replicas", "gpu_type__billing_weight",
                  "started_at"):
        if started_at is not None:
            running.setdefault(team_id, []).append((gpus * replicas * weight, started_at))
    # Rule F2 at a past instant: a job submitted by then and not finished by then.
    waiting = set(
        Job.objects.filter(created_at__lte=at)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gt=at))
        .values_list("team_id", flat=True).distinct()
    )
    teams = list(Team.objects.values_list("pk", "slug", "weight", "parent_id"))
    slug_of = {pk: slug for pk, slug, _, _ in teams}
    inputs = [
        TeamUsageInput(
            team=slug, weight=weight, accumulator=Accumulator(raw.get(pk, 0.0), at),
            running=tuple(running.get(pk, ())),
            parent=slug_of.get(parent_id) if parent_id is not None else None,
            active=pk in waiting,
        )
        for pk, slug, weight, parent_id in teams
    ]
    return compute_standings(inputs, now=at, half_life_hours=half_life_hours())


def raw_decayed_usage(*, at: datetime, team_ids: Iterable[int] | None = None) -> dict[int, float]:
    """Rule F1 from the raw usage records, each cut at `at` and decayed to `at`: weighted
    GPU-hours per team id. One aggregate query on PostgreSQL; a streamed scan elsewhere."""
    h = half_life_hours()
    ids = list(team_ids) if team_ids is not None else None
    if connection.vendor == "postgresql":
        # 2^x underflows to an error in PostgreSQL below about 2^-1074: clamp the
        # exponent (2^-1000 is already 0 for any sum of GPU-hours).
        sql = """
            SELECT team_id, SUM(gpus * billing_weight * %(k)s
                * power(2.0::float8, GREATEST(-1000.0,
                    -date_part('epoch', %(at)s::timestamptz - LEAST("end", %(at)s::timestamptz))
                    / %(hs)s))
                * (1.0 - power(2.0::float8, GREATEST(-1000.0,
                    -date_part('epoch', LEAST("end", %(at)s::timestamptz) - start) / %(hs)s))))
            FROM queueing_usagerecord
            WHERE start < %(at)s::timestamptz AND "end" > start
        """
        params: dict[str, Any] = {"k": h / math.log(2), "at": at, "hs": h * 3600.0}
        if ids is not None:
            sql += " AND team_id = ANY(%(ids)s)"
            params["ids"] = ids
        sql += " GROUP BY team_id"
        with connection.cursor() as cur:
            cur.execute(sql, params)
            return {int(team_id): float(v or 0.0) for team_id, v in cur.fetchall()}
    out: dict[int, float] = {}
    qs = UsageRecord.objects.filter(start__lt=at)
    if ids is not None:
        qs = qs.filter(team_id__in=ids)
    for team_id, gpus, weight, start, end in qs.values_list(
        "team_id", "gpus", "billing_weight", "start", "end"
    ).iterator(chunk_size=10_000):
        out[team_id] = out.get(team_id, 0.0) + decayed_interval_usage(
            rate=gpus * weight, start=start, end=min(end, at), as_of=at, half_life_hours=h)
    return out


@dataclass(frozen=True, slots=True)
class RecomputeResult:
    teams: int
    max_abs_diff: float  # between the accumulators before and the recompute, GPU-hours
    max_rel_diff: float
    seconds: float
    written: bool


def fairshare_recompute(*, now: datetime, write: bool = True) -> RecomputeResult:
    """Rule F1 from scratch: every team's accumulator recomputed from the raw usage
    records as of `now`, compared with the stored one and (with `write`) replaced.

    Runs in one transaction holding every accumulator row lock, so a usage record
    charged meanwhile waits and is added on top of the recomputed value.
    """
    t0 = time.perf_counter()
    h = half_life_hours()
    with transaction.atomic():
        # Locked in team order, the order usage_import_csv locks them in: no deadlock.
        stored = {a.team_id: a for a in
                  FairShareAccumulator.objects.select_for_update().order_by("team_id")}
        raw = raw_decayed_usage(at=now)
        max_abs = max_rel = 0.0
        for team_id in set(stored) | set(raw):
            old = stored.get(team_id)
            before = Accumulator(old.value, old.as_of).at(now, h) if old is not None else 0.0
            after = raw.get(team_id, 0.0)
            diff = abs(before - after)
            max_abs = max(max_abs, diff)
            if max(abs(before), abs(after)) > 0:
                max_rel = max(max_rel, diff / max(abs(before), abs(after)))
        if write:
            _accumulators_set(stored, raw, now)
            FairShareAccumulator.objects.bulk_create(
                [FairShareAccumulator(team_id=t, value=v, as_of=now)
                 for t, v in raw.items() if t not in stored],
                batch_size=1000,
            )
    return RecomputeResult(teams=len(set(stored) | set(raw)), max_abs_diff=max_abs,
                           max_rel_diff=max_rel, seconds=time.perf_counter() - t0,
                           written=write)


def _accumulators_set(stored: Mapping[int, FairShareAccumulator], raw: Mapping[int, float],
                      now: datetime) -> None:
    """Set every stored accumulator to its recomputed value as of `now`."""
    if not stored:
        return
    if connection.vendor == "postgresql":
        # One statement for all teams (bulk_update's CASE chains are slow at 1,000 rows).
        ids = list(stored)
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE queueing_fairshareaccumulator AS a SET value = v.value, as_of = %s "
                "FROM (SELECT unnest(%s::bigint[]) AS team_id, unnest(%s::float8[]) AS value) v "
                "WHERE a.team_id = v.team_id",
                [now, ids, [raw.get(t, 0.0) for t in ids]],
            )
        return
    changed = []
    for team_id, acc in stored.items():
        acc.value, acc.as_of = raw.get(team_id, 0.0), now
        changed.append(acc)
    FairShareAccumulator.objects.bulk_update(changed, ["value", "as_of"], batch_size=500)


# --- import / export ----------------------------------------------------------------------

class UsageImportError(Exception):
    """The file was refused; nothing was imported. `errors` name the lines."""

    def __init__(self, errors: list[str]) -> None:
        shown = errors[:MAX_REPORTED_ERRORS]
        more = len(errors) - len(shown)
        text = "\n".join(shown) + (f"\n... and {more} more" if more > 0 else "")
        super().__init__(f"nothing imported: {len(errors)} error(s)\n{text}")
        self.errors = errors


@dataclass(frozen=True, slots=True)
class ImportedRow:
    line: int
    team: str
    gpu_type: str
    gpus: int
    start: datetime
    end: datetime


def _parse_instant(value: str) -> datetime:
    when = parse_iso(value)
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError("has no UTC offset (write e.g. 2026-01-05T08:00:00+00:00)")
    return when


def parse_usage_csv(stream: TextIO, *, now: datetime) -> tuple[list[ImportedRow], list[str]]:
    """Read and check every row of a usage CSV (columns team, gpu_type, gpus, start, end;
    ISO 8601 instants with an offset). Returns the rows and every error found, each with
    its line number; checks names against the database but writes nothing."""
    errors: list[str] = []
    reader = csv.reader(stream)
    try:
        header = next(reader)
    except StopIteration:
        return [], ["line 1: the file is empty (expected a header: team,gpu_type,gpus,start,end)"]
    except csv.Error as exc:
        return [], [f"line 1: not CSV: {exc}"]
    names = [h.strip().lower() for h in header]
    if sorted(names) != sorted(IMPORT_COLUMNS) or len(set(names)) != len(names):
        return [], [f"line 1: the header must name the columns {', '.join(IMPORT_COLUMNS)} "
                    f"(got {', '.join(header) or 'nothing'})"]
    col = {n: i for i, n in enumerate(names)}
    teams = set(Team.objects.values_list("slug", flat=True))
    gpu_types = set(GpuType.objects.values_list("slug", flat=True))
    rows: list[ImportedRow] = []
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            errors.append(f"line {reader.line_num}: not CSV: {exc}")
            break
        line = reader.line_num
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) != len(names):
            errors.append(f"line {line}: expected {len(names)} columns, got {len(cells)}")
            continue
        problems: list[str] = []
        team = cells[col["team"]].strip()
        gpu_type = cells[col["gpu_type"]].strip()
        if team not in teams:
            problems.append(f"unknown team {team!r}")
        if gpu_type not in gpu_types:
            problems.append(f"unknown gpu_type {gpu_type!r}")
        gpus = 0
        try:
            gpus = int(cells[col["gpus"]].strip())
            if gpus < 1:
                problems.append(f"gpus must be a whole number >= 1, not {gpus}")
        except ValueError:
            problems.append(f"gpus must be a whole number >= 1, not {cells[col['gpus']]!r}")
        instants: dict[str, datetime] = {}
        for name in ("start", "end"):
            try:
                instants[name] = _parse_instant(cells[col[name]])
            except ValueError as exc:
                reason = str(exc) if "offset" in str(exc) else "is not an ISO 8601 instant"
                problems.append(f"{name} {cells[col[name]]!r} {reason}")
        if len(instants) == 2:
            if instants["end"] < instants["start"]:
                problems.append("end is before start")
            if instants["end"] > now:
                problems.append(f"end {instants['end'].isoformat()} is in the future")
        if problems:
            errors.append(f"line {line}: " + "; ".join(problems))
            continue
        rows.append(ImportedRow(line, team, gpu_type, gpus, instants["start"], instants["end"]))
    if not rows and not errors:
        errors.append("the file has a header but no rows")
    return rows, errors


def usage_import_csv(*, stream: TextIO, now: datetime) -> int:
    """Import historical usage from another scheduler (rule F1), all or nothing.

    Every row is checked first; any bad row raises UsageImportError listing every bad
    line and nothing is written. A row identical to one imported before (same team,
    GPU type, GPUs, start and end) is refused too, so importing a file twice cannot
    double a team's usage. Good files become `UsageRecord`s (source "import", billed at
    the GPU type's current weight) and are added to the teams' accumulators, in one
    transaction. Returns the number of rows imported.
    """
    rows, errors = parse_usage_csv(stream, now=now)
    if errors:
        raise UsageImportError(errors)
    team_ids = dict(Team.objects.values_list("slug", "pk"))
    weights = {slug: (pk, w) for slug, pk, w in
               GpuType.objects.values_list("slug", "pk", "billing_weight")}
    h = half_life_hours()
    with transaction.atomic():
        # Lock the accumulators first (the order usage_record_attempt uses).
        touched = {team_ids[r.team] for r in rows}
        for t in sorted(touched):
            FairShareAccumulator.objects.select_for_update().get_or_create(
                team_id=t, defaults={"value": 0.0, "as_of": min(r.end for r in rows)})
        existing = set(
            UsageRecord.objects.filter(
                source="import", team_id__in=touched,
                start__gte=min(r.start for r in rows), start__lte=max(r.start for r in rows),
            ).values_list("team_id", "gpu_type_id", "gpus", "start", "end")
        )
        dupes = [
            f"line {r.line}: already imported (same team, gpu_type, gpus, start and end)"
            for r in rows
            if (team_ids[r.team], weights[r.gpu_type][0], r.gpus, r.start, r.end) in existing
        ]
        if dupes:
            raise UsageImportError(dupes)
        UsageRecord.objects.bulk_create(
            [
                UsageRecord(
                    team_id=team_ids[r.team], gpu_type_id=weights[r.gpu_type][0],
                    gpus=r.gpus, billing_weight=weights[r.gpu_type][1], start=r.start,
                    end=r.end, gpu_seconds=r.gpus * (r.end - r.start).total_seconds(),
                    source="import",
                )
                for r in rows
            ],
            batch_size=5000,
        )
        per_team: dict[int, Accumulator] = {}
        for r in rows:
            t = team_ids[r.team]
            acc = per_team.get(t) or Accumulator(0.0, r.end)
            per_team[t] = acc.add_interval(rate=r.gpus * weights[r.gpu_type][1], start=r.start,
                                           end=r.end, half_life_hours=h)
        for t, added in per_team.items():
            row = FairShareAccumulator.objects.get(team_id=t)
            merged = Accumulator(row.value, row.as_of).merge(added, h)
            row.value, row.as_of = merged.value, merged.as_of
            row.save(update_fields=["value", "as_of"])
    return len(rows)


def usage_export_csv(*, out: TextIO, source: str | None = None) -> int:
    """Write the usage records as the CSV `usage_import_csv` reads (instants in UTC with
    an offset). `source` keeps only "import" or "scheduler" records. Returns the rows."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(IMPORT_COLUMNS)
    qs = UsageRecord.objects.order_by("start", "id")
    if source:
        qs = qs.filter(source=source)
    n = 0
    for team, gpu_type, gpus, start, end in qs.values_list(
        "team__slug", "gpu_type__slug", "gpus", "start", "end"
    ).iterator(chunk_size=10_000):
        writer.writerow([team, gpu_type, gpus, _iso(start), _iso(end)])
        n += 1
    return n


def _iso(when: datetime) -> str:
    from datetime import UTC

    return when.astimezone(UTC).isoformat()


# --- snapshots ----------------------------------------------------------------------------

def _round(x: float) -> float:
    return float(f"{x:.6g}")


def fairshare_snapshot_take(*, now: datetime) -> FairShareSnapshot:
    """Store the standings at `now` as one row (for charts) and drop rows older than
    FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS. Taking two at the same instant keeps one."""
    standings = fairshare_standings(now=now)
    data = {
        t: [_round(s.usage), _round(s.normalized_usage), _round(s.share), _round(s.factor)]
        for t, s in sorted(standings.items())
    }
    with transaction.atomic():
        snap, _ = FairShareSnapshot.objects.update_or_create(
            at=now, defaults={"half_life_hours": half_life_hours(), "standings": data})
        keep = timedelta(days=float(settings.FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS))
        FairShareSnapshot.objects.filter(at__lt=now - keep).delete()
    return snap


def fairshare_history(*, team: str, since: datetime | None = None,
                      until: datetime | None = None) -> list[dict[str, Any]]:
    """One team's standings over time from the snapshots, oldest first."""
    qs = FairShareSnapshot.objects.order_by("at")
    if since is not None:
        qs = qs.filter(at__gte=since)
    if until is not None:
        qs = qs.filter(at__lte=until)
    out = []
    for at, data in qs.values_list("at", "standings"):
        row = data.get(team)
        if row:
            out.append({"at": at, "usage_gpu_hours": row[0], "normalized_usage": row[1],
                        "share": row[2], "fair_share_factor": row[3]})
    return out


# --- explain ------------------------------------------------------------------------------

def job_explain(*, job: Job, now: datetime, with_queue: bool = True) -> dict[str, Any]:
    """Rules P1-P3 for one job: its priority per factor (like `sprio`) and, while it is
    queued and `with_queue`, its place in the queue and why it waits (quota, capacity,
    gang that fits no node, jobs ahead of it).

    Reads only. The queue part comes from the plan of the whole queue that every reader
    shares (`queue_plan.queue_standing`: cached, at most one cycle old), not from planning
    again per job. A cluster that cannot be reached gives the reason `cluster_unreachable`
    rather than failing the request.
    """
    from queueing.cluster import cluster_view

    from .queue_plan import queue_standing

    # The published view: no call to the cluster (an unpublished one counts 0 GPUs, and
    # the queue part below says why).
    cluster_gpus = sum(n.capacity for n in cluster_view(now=now).nodes())
    state = FairShareState.from_standings(fairshare_standings(now=now))
    breakdown = job_priority(_queued_job(job), now=now,
                             fair_share_factor=state.factor(job.team.slug),
                             weights=priority_weights(), cluster_gpus=cluster_gpus)
    out: dict[str, Any] = {"priority": breakdown.as_dict(), "queue": None}
    if with_queue and job.state == JobState.QUEUED:
        out["queue"] = queue_standing(job_id=job.pk, now=now)
    return out


def _queued_job(job: Job) -> QueuedJob:
    return QueuedJob(id=job.pk, team=job.team.slug, gpu_type=job.gpu_type.slug,
                     gpus_per_replica=job.gpus_per_replica, replicas=job.replicas,
                     tier_rank=job.tier.rank, submitted_at=job.created_at)


def standings_sorted(standings: Mapping[str, Standing]) -> list[Standing]:
    """Parents before their children, siblings by name (the order `sshare` prints).
    Every team once: a parent cycle (rule F4) lists its teams as top-level."""
    up = forest_parents({t: s.parent for t, s in standings.items()})
    children: dict[str | None, list[Standing]] = {}
    for t, s in standings.items():
        children.setdefault(up[t], []).append(s)
    out: list[Standing] = []

    def walk(parent: str | None) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: s.team):
            out.append(s)
            walk(s.team)

    walk(None)
    return out
