"""Fair-share reads (docs/scheduling.md, rules F1-F6, P1): the settings, the inputs of
the standings (built once, for the cycle and for every reader), the standings now and at
a past instant, their history from the snapshots, and a job's priority breakdown.

The hot path (`fairshare_standings`) reads one accumulator per team. Standings at a past
instant scan the usage history: for repair, audit and the command line, never a cycle.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Exists, OuterRef, Q
from django.db.models.expressions import RawSQL

from accounts.models import Team
from queueing.models import (
    FairShareAccumulator,
    FairShareSnapshot,
    Job,
    UsagePruned,
    UsageRecord,
)
from queueing.policy.cycle import Holding, active_teams, standings_running_and_penalty
from queueing.policy.fairshare import (
    Accumulator,
    FairShareState,
    Standing,
    TeamUsageInput,
    compute_standings,
    decayed_interval_usage,
    forest_parents,
)
from queueing.policy.priority import PriorityBreakdown, PriorityWeights, job_priority
from queueing.policy.snapshot import QueuedJob
from queueing.policy.states import JobState

from . import active_jobs
from .active_jobs import PACKED_SHARING, ActiveJobs, JobRow, Lookups

# Rule F2: a team with work in these states is active even before it has any usage.
_ACTIVE_STATES = (JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING)

# A team's running attempts: (weighted GPUs, started at) per team id.
Running = Mapping[int, Sequence[tuple[float, datetime]]]


# --- settings -----------------------------------------------------------------------------

def half_life_hours() -> float:
    return float(settings.FAIRQ_DECAY_HALF_LIFE_HOURS)


def entry_penalty_interval_seconds() -> float:
    """Rule F6: the recompute interval an admission is charged for (seconds)."""
    return float(settings.FAIRQ_FAIRSHARE_RECOMPUTE_SECONDS)


def priority_weights() -> PriorityWeights:
    """Rule P1 weights from the settings (FAIRQ_PRIORITY_*)."""
    return PriorityWeights(
        fair_share=float(settings.FAIRQ_PRIORITY_WEIGHT_FAIRSHARE),
        age=float(settings.FAIRQ_PRIORITY_WEIGHT_AGE),
        size=float(settings.FAIRQ_PRIORITY_WEIGHT_SIZE),
        max_age_seconds=float(settings.FAIRQ_PRIORITY_MAX_AGE_HOURS) * 3600.0,
        favor_small=bool(settings.FAIRQ_PRIORITY_FAVOR_SMALL),
    )


def teams_in_standings_for(*, actor: Any) -> set[str] | None:
    """Slugs of the teams whose fair-share standing, usage and GPUs held `actor` may see:
    the teams they are in. None means every team: staff, or FAIRQ_FAIRSHARE_PUBLIC
    (docs/api.md, "Who sees which team"). The API's /fairshare/, the CLI's `share` and
    the dashboard all go through here."""
    if actor.is_staff or settings.FAIRQ_FAIRSHARE_PUBLIC:
        return None
    return set(Team.objects.filter(memberships__user=actor).values_list("slug", flat=True))


# --- the inputs of the standings ----------------------------------------------------------

def team_usage_inputs(*, at: datetime, teams: Iterable[tuple[int, str, float, int | None]],
                      banked: Mapping[int, float], running: Running,
                      active: Collection[int]) -> list[TeamUsageInput]:
    """Rules F1-F2's input per team (`teams`: id, slug, weight, parent id): its usage
    banked as of `at`, its running attempts, its parent's slug and whether it is active.
    The one place standings inputs are built, now (`fairshare_inputs`) or in the past
    (`fairshare_standings_at`)."""
    rows = list(teams)
    slug_of = {pk: slug for pk, slug, _, _ in rows}
    return [
        TeamUsageInput(
            team=slug, weight=weight, accumulator=Accumulator(banked.get(pk, 0.0), at),
            running=tuple(running.get(pk, ())),
            parent=slug_of.get(parent_id) if parent_id is not None else None,
            active=pk in active,
        )
        for pk, slug, weight, parent_id in rows
    ]


def decayed_accumulators(*, now: datetime) -> dict[int, float]:
    """Every team's banked usage decayed to `now` (rule F1), by team id. On PostgreSQL the
    decay is computed in the query: no timestamps to parse, one float per team."""
    h = half_life_hours()
    if connection.vendor == "postgresql":
        # The exponent is clamped: power() raises on underflow or overflow in PostgreSQL.
        rows = FairShareAccumulator.objects.annotate(decayed=RawSQL(
            "value * power(2.0::float8, LEAST(1000.0, GREATEST(-1000.0, "
            "-date_part('epoch', %s::timestamptz - as_of) / %s)))", (now, h * 3600.0),
        )).values_list("team_id", "decayed")
        return {team_id: float(v) for team_id, v in rows}
    return {
        team_id: Accumulator(value, as_of).at(now, h)
        for team_id, value, as_of in FairShareAccumulator.objects.values_list(
            "team_id", "value", "as_of")
    }


def fairshare_inputs(*, now: datetime, jobs: ActiveJobs | None = None
                     ) -> tuple[list[TeamUsageInput], dict[str, float]]:
    """Each team's weight, parent, banked usage, running attempts and activity, and the
    entry penalty (rule F6) of jobs admitted but not yet running, per team.

    The rules are the pure ones of queueing/policy/cycle.py (the simulator's too): active
    teams (F2, `active_teams`), running intervals and entry penalties (F1/F6,
    `standings_running_and_penalty`). O(teams + jobs holding GPUs) in three queries, none
    over the usage history; with `jobs` (the cycle's active jobs, just refreshed) the jobs
    come from them instead of two of the queries.
    """
    banked = decayed_accumulators(now=now)
    if jobs is None:
        teams = list(
            Team.objects.annotate(
                has_work=Exists(Job.objects.filter(team=OuterRef("pk"),
                                                   status__in=list(_ACTIVE_STATES))),
            ).values_list("pk", "slug", "weight", "parent_id", "has_work")
        )
        rows = [(team_id, status, gpu_equivalents(gpus, 1, slices, sharing, spg), replicas,
                 weight, started_at)
                for team_id, status, gpus, replicas, weight, started_at, slices, sharing, spg
                # In job id order, as the kept path sums them (`Job`'s own order is
                # newest first): the same sums to the bit.
                in Job.objects.filter(status__in=[JobState.RUNNING, JobState.ADMITTED])
                .order_by("id").values_list("team_id", "status", "gpus_per_replica", "replicas",
                             "gpu_type__billing_weight", "started_at", "gpu_slices",
                             "gpu_type__sharing", "gpu_type__slices_per_gpu")]
    else:
        working = {r.team_id for r in jobs.queued.values()} | {
            r.team_id for r in jobs.holding.values()}
        teams = [(pk, slug, weight, parent, pk in working) for pk, slug, weight, parent in
                 Team.objects.values_list("pk", "slug", "weight", "parent_id")]
    slug_of = {pk: slug for pk, slug, *_ in teams}
    interval = entry_penalty_interval_seconds()
    if jobs is None:
        running, penalty = _running_and_penalty(rows, slug_of, now=now, interval=interval)
    elif active_jobs.LEGACY:
        running, penalty = holding_running_and_penalty(jobs, slug_of, now=now,
                                                       interval=interval)
    else:  # the same, kept between cycles (held to the above by a test)
        if jobs.standings is None:
            jobs.standings = KeptHolding()
        running, penalty = jobs.standings(jobs, slug_of, now=now, interval=interval)
    active = active_teams(usage={slug_of[pk]: v for pk, v in banked.items() if pk in slug_of},
                          with_work={slug for _, slug, *_, has_work in teams if has_work})
    inputs = team_usage_inputs(
        at=now, teams=[(pk, slug, w, parent) for pk, slug, w, parent, _ in teams],
        banked=banked, running={pk: running.get(slug, ()) for pk, slug in slug_of.items()},
        active={pk for pk, slug in slug_of.items() if slug in active})
    return inputs, penalty


def _running_and_penalty(rows: Iterable[tuple[int, str, float, int, float, datetime | None]],
                         slug_of: Mapping[int, str], *, now: datetime, interval: float
                         ) -> tuple[dict[str, list[tuple[float, datetime]]], dict[str, float]]:
    """Rules F1, F6 (`standings_running_and_penalty`) over rows (team id, status, GPUs a
    replica, replicas, billing weight, started at) in job id order: the same sums each
    time. An admitted job has not started yet, whatever its row says (rule F6 until it
    runs); a team not in `slug_of` is left out."""
    holding = [
        Holding(slug_of[team_id], gpus * replicas, weight,
                started_at if status == JobState.RUNNING else None)
        for team_id, status, gpus, replicas, weight, started_at in rows if team_id in slug_of
    ]
    return standings_running_and_penalty(holding, now=now, interval_seconds=interval)


def _holding_row(r: JobRow, lookups: Lookups
                 ) -> tuple[int, str, float, int, float, datetime | None]:
    return (r.team_id, r.status, _replica_gpus(r, lookups) if lookups.units
            else r.gpus_per_replica, r.replicas, lookups.billing_weights.get(r.gpu_type_id, 1.0),
            r.started_at)


def holding_running_and_penalty(jobs: ActiveJobs, slug_of: Mapping[int, str], *,
                                now: datetime, interval: float
                                ) -> tuple[dict[str, list[tuple[float, datetime]]],
                                           dict[str, float]]:
    """`_running_and_penalty` of the jobs holding GPUs (the plain path, every row every
    cycle)."""
    lookups = jobs.lookups
    return _running_and_penalty((_holding_row(r, lookups) for r in sorted(jobs.holding.values())),
                                slug_of, now=now, interval=interval)


class KeptHolding:
    """`holding_running_and_penalty` kept between cycles (`ActiveJobs.standings`): each
    team's running intervals and entry penalty, made again only for the teams one of
    whose jobs changed (a row is the same object until it changes: one identity check a
    job), and for a team with an attempt that starts after `now` (rare: it counts once
    `now` reaches it). Per team the rows go in job id order, as in the plain path, so
    the sums are the same to the bit. Held to it by tests/test_cycle_fleet.py."""

    def __init__(self) -> None:
        self.key: tuple[Any, ...] = ()
        self.now: datetime | None = None
        self.rows: dict[int, tuple[JobRow, tuple[Any, ...]]] = {}
        self.members: dict[int, dict[int, tuple[Any, ...]]] = {}
        # team id -> (its running intervals, its penalty or None, its latest start when
        # after the `now` they were made for, else None)
        self.made: dict[int, tuple[list[tuple[float, datetime]], float | None,
                                   datetime | None]] = {}

    def __call__(self, jobs: ActiveJobs, slug_of: Mapping[int, str], *, now: datetime,
                 interval: float) -> tuple[dict[str, list[tuple[float, datetime]]],
                                           dict[str, float]]:
        lookups = jobs.lookups
        key = (lookups, dict(slug_of), interval)
        if key != self.key:
            self.key, self.rows, self.members, self.made = key, {}, {}, {}
        old, members, dirty = self.rows, self.members, set()
        rows: dict[int, tuple[JobRow, tuple[Any, ...]]] = {}
        for pk, row in jobs.holding.items():
            entry = old.pop(pk, None)
            if entry is not None and entry[0] is row:
                rows[pk] = entry
                continue
            if entry is not None:
                dirty.add(entry[1][0])
                members[entry[1][0]].pop(pk, None)
            item = _holding_row(row, lookups)
            rows[pk] = (row, item)
            members.setdefault(item[0], {})[pk] = item
            dirty.add(item[0])
        for pk, (_, item) in old.items():  # no longer holding GPUs
            dirty.add(item[0])
            members[item[0]].pop(pk, None)
        self.rows = rows
        made = self.made
        # A team with an attempt starting after the `now` it was made for is made again
        # (the attempt counts once `now` reaches it); every team when time went back.
        went_back = self.now is not None and now < self.now
        self.now = now
        dirty.update(team_id for team_id, (_, _, latest) in made.items()
                     if went_back or latest is not None)
        for team_id in dirty:
            of_team = members.get(team_id)
            if not of_team:
                members.pop(team_id, None)
                made.pop(team_id, None)
                continue
            ordered = [of_team[pk] for pk in sorted(of_team)]
            running, penalty = _running_and_penalty(ordered, slug_of, now=now,
                                                    interval=interval)
            slug = slug_of.get(team_id)
            starts = [i[5] for i in ordered if i[1] == JobState.RUNNING and i[5] is not None]
            latest = max(starts) if starts else None
            made[team_id] = (running.get(slug, []) if slug else [], penalty.get(slug)
                             if slug else None, latest if latest is not None and latest > now
                             else None)
        out_running: dict[str, list[tuple[float, datetime]]] = {}
        out_penalty: dict[str, float] = {}
        for team_id, (running_, penalty_, _) in made.items():
            slug = slug_of.get(team_id)
            if slug is None:
                continue
            if running_:
                out_running[slug] = running_
            if penalty_ is not None:
                out_penalty[slug] = penalty_
        return out_running, out_penalty


def gpu_equivalents(gpus_per_replica: int, replicas: int, gpu_slices: int, sharing: str,
                    slices_per_gpu: int) -> float:
    """Rule H4: what a job holds in GPU-equivalents (`Job.gpu_share` from its columns): a
    fraction's slices / S, MIG instances / S, whole GPUs as they are."""
    if sharing in PACKED_SHARING:
        if gpu_slices:
            return gpu_slices * replicas / slices_per_gpu
        return float(gpus_per_replica * replicas)
    if sharing == "mig" and slices_per_gpu > 1:
        return gpus_per_replica * replicas / slices_per_gpu
    return float(gpus_per_replica * replicas)


def _replica_gpus(r: JobRow, lookups: Lookups) -> float:
    """Rule H4: one replica of an active job row in GPU-equivalents."""
    gpu_type = lookups.gpu_types.get(r.gpu_type_id, "")
    per_device, spg = lookups.units.get(gpu_type, (1, 1))
    if spg <= 1:
        return float(r.gpus_per_replica)
    if per_device > 1:  # time-sliced or MPS
        return r.gpu_slices / spg if r.gpu_slices else float(r.gpus_per_replica)
    return r.gpus_per_replica / spg  # MIG


# --- standings ----------------------------------------------------------------------------

def fairshare_standings(*, now: datetime, jobs: ActiveJobs | None = None
                        ) -> dict[str, Standing]:
    """Rules F1-F6 for every team at `now`, from the accumulators: O(teams), whatever the
    length of the usage history. `jobs`: see `fairshare_inputs`."""
    inputs, extra = fairshare_inputs(now=now, jobs=jobs)
    return compute_standings(inputs, now=now, half_life_hours=half_life_hours(),
                             extra_usage=extra)


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
    for team_id, gpus, replicas, weight, started_at, slices, sharing, spg in Job.objects.filter(
        status=JobState.RUNNING, started_at__lt=at
    ).values_list("team_id", "gpus_per_replica", "replicas", "gpu_type__billing_weight",
                  "started_at", "gpu_slices", "gpu_type__sharing", "gpu_type__slices_per_gpu"):
        if started_at is not None:
            running.setdefault(team_id, []).append(
                (gpu_equivalents(gpus, replicas, slices, sharing, spg) * weight, started_at))
    # Rule F2 at a past instant: a job submitted by then and not finished by then.
    waiting = set(
        Job.objects.filter(created_at__lte=at)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gt=at))
        .values_list("team_id", flat=True).distinct()
    )
    inputs = team_usage_inputs(
        at=at, teams=Team.objects.values_list("pk", "slug", "weight", "parent_id"),
        banked=raw, running=running, active=waiting)
    return compute_standings(inputs, now=at, half_life_hours=half_life_hours())


def raw_decayed_usage(*, at: datetime, team_ids: Iterable[int] | None = None) -> dict[int, float]:
    """Rule F1 from the raw usage records, each cut at `at` and decayed to `at`: weighted
    GPU-hours per team id. One aggregate query on PostgreSQL; a streamed scan elsewhere.

    The records pruned by `history_prune` count through their team's `UsagePruned` (their
    contribution as of the last prune, decayed to `at`), read in the same statement as
    the records (one snapshot: a prune deleting records meanwhile is seen whole or not at
    all). Exact for `at` at or after the last prune's records' end; before it the pruned
    records are left out (they are in the archive: docs/deployment.md)."""
    h = half_life_hours()
    ids = list(team_ids) if team_ids is not None else None
    if connection.vendor == "postgresql":
        # 2^x underflows to an error in PostgreSQL below about 2^-1074: clamp the
        # exponent (2^-1000 is already 0 for any sum of GPU-hours).
        only = " AND team_id = ANY(%(ids)s)" if ids is not None else ""
        sql = f"""
            SELECT team_id, SUM(v) FROM (
                SELECT team_id, gpus * billing_weight * %(k)s
                    * power(2.0::float8, GREATEST(-1000.0,
                        -date_part('epoch', %(at)s::timestamptz - LEAST("end", %(at)s::timestamptz))
                        / %(hs)s))
                    * (1.0 - power(2.0::float8, GREATEST(-1000.0,
                        -date_part('epoch', LEAST("end", %(at)s::timestamptz) - start) / %(hs)s)))
                    AS v
                FROM queueing_usagerecord
                WHERE start < %(at)s::timestamptz AND "end" > start{only}
                UNION ALL
                SELECT team_id, value * power(2.0::float8, GREATEST(-1000.0,
                    -date_part('epoch', %(at)s::timestamptz - as_of) / %(hs)s))
                FROM queueing_usagepruned
                WHERE as_of <= %(at)s::timestamptz{only}
            ) u GROUP BY team_id
        """
        params: dict[str, Any] = {"k": h / math.log(2), "at": at, "hs": h * 3600.0}
        if ids is not None:
            params["ids"] = ids
        with connection.cursor() as cur:
            cur.execute(sql, params)
            return {int(team_id): float(v or 0.0) for team_id, v in cur.fetchall()}
    out: dict[int, float] = {}
    qs = UsageRecord.objects.filter(start__lt=at)
    pruned = UsagePruned.objects.filter(as_of__lte=at)
    if ids is not None:
        qs = qs.filter(team_id__in=ids)
        pruned = pruned.filter(team_id__in=ids)
    for team_id, gpus, weight, start, end in qs.values_list(
        "team_id", "gpus", "billing_weight", "start", "end"
    ).iterator(chunk_size=10_000):
        out[team_id] = out.get(team_id, 0.0) + decayed_interval_usage(
            rate=gpus * weight, start=start, end=min(end, at), as_of=at, half_life_hours=h)
    for team_id, value, as_of in pruned.values_list("team_id", "value", "as_of"):
        out[team_id] = out.get(team_id, 0.0) + Accumulator(value, as_of).at(at, h)
    return out


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


# --- a job's priority ---------------------------------------------------------------------

def queued_job_of(job: Job) -> QueuedJob:
    """The policy's view of one job row (its team, GPU type and tier loaded): its replica
    in the type's units (rule H1)."""
    return QueuedJob(id=job.pk, team=job.team.slug, gpu_type=job.gpu_type.slug,
                     gpus_per_replica=job.units_per_replica, replicas=job.replicas,
                     tier_rank=job.tier.rank, submitted_at=job.created_at)


def jobs_priority_breakdowns(*, jobs: Iterable[Job], now: datetime,
                             cluster_gpus: float) -> dict[int, PriorityBreakdown]:
    """Rule P1 for many jobs (`sprio` with no job: every pending one), the standings and
    weights read once. Each job's team, GPU type and tier loaded."""
    state = FairShareState.from_standings(fairshare_standings(now=now))
    weights = priority_weights()
    return {job.pk: job_priority(queued_job_of(job), now=now,
                                 fair_share_factor=state.factor(job.team.slug),
                                 weights=weights, cluster_gpus=cluster_gpus,
                                 units_per_gpu=job.gpu_type.slices_per_gpu)  # rule H4
            for job in jobs}


def job_priority_breakdown(*, job: Job, now: datetime, cluster_gpus: float,
                           standings: Mapping[str, Standing] | None = None
                           ) -> PriorityBreakdown:
    """Rule P1 for one job, per factor (like `sprio`): the live standings (or
    `standings`, the web pages' kept ones) and weights, on a cluster of `cluster_gpus`
    GPUs."""
    state = FairShareState.from_standings(
        dict(standings) if standings is not None else fairshare_standings(now=now))
    return job_priority(queued_job_of(job), now=now,
                        fair_share_factor=state.factor(job.team.slug),
                        weights=priority_weights(), cluster_gpus=cluster_gpus,
                        units_per_gpu=job.gpu_type.slices_per_gpu)  # rule H4
