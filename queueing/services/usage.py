"""Usage writes (docs/scheduling.md, rule F1): charging an attempt to its team's usage
record and decayed accumulator, and importing another scheduler's usage from CSV. The
reads (standings, buckets, the CSV export) are in queueing/selectors/."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TextIO

from django.db import connection, transaction

from accounts.models import Team
from queueing.instants import parse_iso
from queueing.models import FairShareAccumulator, GpuType, Job, UsageRecord
from queueing.policy.fairshare import Accumulator
from queueing.selectors.costs import spot_attempt_price, spot_pools_of
from queueing.selectors.fairshare import half_life_hours
from queueing.selectors.usage import IMPORT_COLUMNS

MAX_REPORTED_ERRORS = 50


@transaction.atomic
def usage_record_attempt(*, job: Job, start: datetime, end: datetime,
                         attempt: int | None = None,
                         lost_gpu_hours: float | None = None) -> UsageRecord | None:
    """Charge one finished attempt interval of `job` to its team: a usage record and the
    team's decayed accumulator, in one transaction. Charging an attempt twice is a no-op
    (one record per job attempt). `attempt` defaults to the job's current one (an earlier
    attempt's pods that ran after fairq moved on are charged to that attempt).

    Rule C4: the record keeps the current attempt's cluster and whether it ran on spot
    nodes, and a spot attempt's price: the GPU-weighted price of the spot pools its GPUs
    ran in (`Job.spot_pools`), frozen here so a later pool price never reprices it; None
    when one of them has none (rule C1 prices it). An earlier attempt's record knows
    neither (the job has moved on): rule C1. `lost_gpu_hours`: a preempted attempt's
    lost work (services/checkpoints.py), None for an attempt that was not preempted."""
    attempt = job.attempt if attempt is None else attempt
    if end < start:
        end = start
    if UsageRecord.objects.filter(job=job, attempt=attempt).exists():
        return None
    gpus = job.gpu_share  # shared GPUs: a 0.25 job is 0.25 GPU-h per hour
    weight = job.gpu_type.billing_weight
    current = attempt == job.attempt
    spot = current and job.on_spot
    record = UsageRecord.objects.create(
        team_id=job.team_id, gpu_type_id=job.gpu_type_id, job=job, attempt=attempt,
        gpus=gpus, billing_weight=weight, start=start, end=end,
        gpu_seconds=gpus * (end - start).total_seconds(),
        cluster_id=job.cluster_id if current else None, spot=spot,
        price_per_gpu_hour=spot_price(job) if spot else None,
        lost_gpu_hours=lost_gpu_hours,
    )
    accumulator_add(team_id=job.team_id, rate=gpus * weight, start=start, end=end)
    return record


def spot_price(job: Job) -> Decimal | None:
    """Rule C4: the price per GPU-hour, now, of the spot pools `job`'s current attempt
    runs in (`spot_attempt_price`); None without a cluster or a price."""
    if job.cluster_id is None:
        return None
    return spot_attempt_price(spot_pools=job.spot_pools, cluster_id=job.cluster_id,
                              gpu_type_id=job.gpu_type_id,
                              pools=spot_pools_of([job.cluster_id]))


def accumulator_add(*, team_id: int, rate: float, start: datetime, end: datetime) -> None:
    """Add a decayed interval to the team's accumulator under a row lock (rule F1)."""
    acc, _ = FairShareAccumulator.objects.select_for_update().get_or_create(
        team_id=team_id, defaults={"value": 0.0, "as_of": end}
    )
    moved = Accumulator(acc.value, acc.as_of).add_interval(
        rate=rate, start=start, end=end, half_life_hours=half_life_hours()
    )
    acc.value, acc.as_of = moved.value, moved.as_of
    acc.save(update_fields=["value", "as_of"])


# `usage_record_attempts`' insert: rows already there (one per job attempt) are skipped,
# as `usage_record_attempt` skips them.
_RECORDS_SQL = """
INSERT INTO queueing_usagerecord (team_id, gpu_type_id, job_id, attempt, gpus,
                                  billing_weight, start, "end", gpu_seconds, source,
                                  cluster_id, spot, price_per_gpu_hour)
SELECT * FROM unnest(%(team_id)s::bigint[], %(gpu_type_id)s::bigint[], %(job_id)s::bigint[],
                     %(attempt)s::integer[], %(gpus)s::float8[], %(weight)s::float8[],
                     %(start)s::timestamptz[], %(end)s::timestamptz[],
                     %(gpu_seconds)s::float8[], %(source)s::text[], %(cluster_id)s::bigint[],
                     %(spot)s::boolean[], %(price)s::numeric[])
ON CONFLICT (job_id, attempt) WHERE job_id IS NOT NULL DO NOTHING
RETURNING job_id
"""


def usage_record_attempts(charges: Sequence[tuple[Job, datetime, datetime]]) -> list[int]:
    """`usage_record_attempt(job=job, start=start, end=end)` for many jobs' current
    attempts at once (PostgreSQL; the scheduler's step 1): the same usage records in one
    insert, an attempt charged already skipped, then every team's accumulator charged
    once for all of its records (`accumulators_add`). Returns the ids of the jobs
    charged now, in the order given. Must run inside `transaction.atomic`."""
    cols: dict[str, list[object]] = {k: [] for k in (
        "team_id", "gpu_type_id", "job_id", "attempt", "gpus", "weight", "start", "end",
        "gpu_seconds", "source", "cluster_id", "spot", "price")}
    intervals: dict[int, tuple[int, float, datetime, datetime]] = {}
    for job, start, end in charges:
        if job.pk in intervals:
            continue
        end = max(start, end)
        gpus = job.gpu_share
        weight = job.gpu_type.billing_weight
        for name, value in (("team_id", job.team_id), ("gpu_type_id", job.gpu_type_id),
                            ("job_id", job.pk), ("attempt", job.attempt), ("gpus", gpus),
                            ("weight", weight), ("start", start), ("end", end),
                            ("gpu_seconds", gpus * (end - start).total_seconds()),
                            ("source", "scheduler"), ("cluster_id", job.cluster_id),
                            ("spot", job.on_spot),
                            ("price", spot_price(job) if job.on_spot else None)):
            cols[name].append(value)
        intervals[job.pk] = (job.team_id, gpus * weight, start, end)
    if not intervals:
        return []
    with connection.cursor() as cur:
        cur.execute(_RECORDS_SQL, cols)
        charged = {job_id for (job_id,) in cur.fetchall()}
    done = [pk for pk in intervals if pk in charged]
    accumulators_add([intervals[pk] for pk in done])
    return done


def accumulators_add(intervals: Sequence[tuple[int, float, datetime, datetime]]) -> None:
    """`accumulator_add(team_id=, rate=, start=, end=)` for each (team_id, rate, start,
    end), each team's sum written once (rule F1): the teams' rows locked in team order
    (one created as `accumulator_add` creates it when missing), each team's intervals
    added in the order given, one UPDATE for every team."""
    if not intervals:
        return
    h = half_life_hours()
    first_end: dict[int, datetime] = {}
    for team_id, _, _, end in intervals:
        first_end.setdefault(team_id, end)
    locked = FairShareAccumulator.objects.select_for_update().filter(
        team_id__in=first_end).order_by("team_id")
    acc = {t: Accumulator(v, at) for t, v, at in locked.values_list("team_id", "value", "as_of")}
    missing = sorted(set(first_end) - set(acc))
    if missing:  # created as `accumulator_add` creates them (one insert), then locked
        with connection.cursor() as cur:
            cur.execute(
                "INSERT INTO queueing_fairshareaccumulator (team_id, value, as_of) "
                "SELECT * FROM unnest(%s::bigint[], %s::float8[], %s::timestamptz[]) "
                "ON CONFLICT (team_id) DO NOTHING",
                [missing, [0.0] * len(missing), [first_end[t] for t in missing]])
        acc.update({t: Accumulator(v, at) for t, v, at in locked.filter(
            team_id__in=missing).values_list("team_id", "value", "as_of")})
    for team_id, rate, start, end in intervals:
        acc[team_id] = acc[team_id].add_interval(rate=rate, start=start, end=end,
                                                 half_life_hours=h)
    teams = sorted(acc)
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE queueing_fairshareaccumulator a SET value = u.value, as_of = u.as_of "
            "FROM unnest(%s::bigint[], %s::float8[], %s::timestamptz[]) AS u(team_id, value, "
            "as_of) WHERE a.team_id = u.team_id",
            [teams, [acc[t].value for t in teams], [acc[t].as_of for t in teams]])


# --- import ----------------------------------------------------------------------------

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
    gpus: float  # GPU-equivalents: a fraction of a shared GPU its share
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
        gpus: float = 0
        text = cells[col["gpus"]].strip()
        try:
            # Shared GPUs: a fraction's share (0.25) as the export writes it.
            gpus = float(text) if "." in text else int(text)
            if not math.isfinite(gpus) or gpus <= 0:
                problems.append(f"gpus must be a number above 0 (2, 0.25), not {text!r}")
        except ValueError:
            problems.append(f"gpus must be a number above 0 (2, 0.25), not {text!r}")
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
