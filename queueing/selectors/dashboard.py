"""Reads for the web dashboard (docs/dashboard.md): running and recent jobs, a page of
jobs, standings over time, the submit form's defaults, and the quota board grid. Reads
only; every state change goes through the job, quota, membership and token services.
Capacity is queueing/selectors/capacity.py; the queue with positions and wait reasons,
and the submit preview, read the cached plan of queueing/selectors/queue_plan.py.

Every function runs a small, constant number of queries whatever the number of jobs: the
job lists are bounded and ride the `(team, status)` and `(status, tier, created_at)`
indexes.
"""

from __future__ import annotations

import dataclasses
import shlex
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, QuerySet, Sum

from accounts.models import Team
from queueing.models import (
    FairShareSnapshot,
    GpuType,
    Job,
    JobEvent,
    NotebookSession,
    Quota,
)
from queueing.policy.fairshare import Standing, forest_parents
from queueing.policy.states import FINAL_STATES, HOLDING_STATES, JobState

from .arrays import arrays_unwritten
from .capacity import CapacityRow, capacity_by_gpu_type, gpus_held, overcommit_warnings
from .fairshare import fairshare_standings
from .gpu_share import DEVICE_SHARE, whole
from .quota_tree import TreeNode, quota_forest, team_standing

DONE_STATES = [*sorted(FINAL_STATES), JobState.PREEMPTED]


# The JSON columns a job list never shows.
LIST_DEFER = ("command", "args", "env", "image")


# --- jobs ------------------------------------------------------------------------------------

def team_running(*, team: Team | None, limit: int = 50) -> list[Job]:
    """The team's jobs holding GPUs (every team's: `team=None`), longest running first."""
    qs = Job.objects.filter(status__in=sorted(HOLDING_STATES))
    if team is not None:
        qs = qs.filter(team=team)
    return list(qs.select_related("gpu_type", "tier", "team").defer(*LIST_DEFER)
                .order_by("started_at", "id")[:limit])


@dataclass
class TeamOverview:
    """One team's line of the staff's cluster view."""

    team: Team
    standing: Standing | None
    queued_jobs: int = 0
    running_jobs: int = 0
    # GPUs per GPU type: asked for by queued jobs, held by admitted and running ones.
    queued_gpus: dict[str, int | float] = field(default_factory=dict)
    held_gpus: dict[str, int | float] = field(default_factory=dict)


def cluster_overview(*, standings: list[Standing]) -> list[TeamOverview]:
    """Every team: its standing (rules F1-F3, from `standings`), its queued and running
    jobs and GPUs per type (array members not yet written included). Four queries at
    most, whatever the number of jobs."""
    by_team = {s.team: s for s in standings}
    out = {t.slug: TeamOverview(t, by_team.get(t.slug))
           for t in Team.objects.order_by("slug")}
    rows = (Job.objects.filter(status__in=[JobState.QUEUED, *sorted(HOLDING_STATES)])
            .values("team__slug", "status", "gpu_type__slug")
            .annotate(n=Count("id"), gpus=Sum(DEVICE_SHARE)))
    for r in rows:
        o = out.get(r["team__slug"])
        if o is None:
            continue
        queued = r["status"] == JobState.QUEUED
        gpus = o.queued_gpus if queued else o.held_gpus
        gpus[r["gpu_type__slug"]] = whole(gpus.get(r["gpu_type__slug"], 0) + (r["gpus"] or 0))
        if queued:
            o.queued_jobs += r["n"]
        else:
            o.running_jobs += r["n"]
    # Array members not yet written as rows are queued all the same.
    for team, gpu_type, _, n, asked in arrays_unwritten():
        o = out.get(team)
        if o is not None:
            o.queued_jobs += n
            o.queued_gpus[gpu_type] = o.queued_gpus.get(gpu_type, 0) + asked
    return list(out.values())


def team_recent_done(*, team: Team, limit: int = 10) -> list[Job]:
    """The team's latest finished, cancelled and preempted jobs (newest first)."""
    return list(
        Job.objects.filter(team=team, status__in=DONE_STATES)
        .select_related("gpu_type", "tier").defer(*LIST_DEFER, "placement")
        .order_by("-id")[:limit]
    )


def team_recent_preemptions(*, team: Team, now: datetime, hours: float = 24.0,
                            limit: int = 5) -> list[JobEvent]:
    """The team's jobs preempted in the last `hours` (newest first): a preempted job is
    requeued at once, so its status no longer says so; its "preempted" event does, with
    the preemptor and the rule in `data`. The time bound keeps the scan on the `at` index."""
    return list(
        JobEvent.objects.filter(kind=JobEvent.Kind.PREEMPTED, job__team=team,
                                at__gte=now - timedelta(hours=hours))
        .select_related("job").defer(*(f"job__{f}" for f in LIST_DEFER))
        .order_by("-at", "-id")[:limit]
    )


def job_page(*, jobs: QuerySet[Job], before: int | None, status: str | None,
             size: int = 50) -> tuple[list[Job], int | None]:
    """One page of `jobs`, newest first, keyset-paginated by id (no COUNT, no OFFSET):
    the page and the id to pass as `before` for the next one (None on the last page)."""
    if status:
        jobs = jobs.filter(status=status)
    if before is not None:
        jobs = jobs.filter(pk__lt=before)
    page = list(jobs.defer(*LIST_DEFER, "placement").order_by("-id")[: size + 1])
    more = len(page) > size
    page = page[:size]
    return page, (page[-1].pk if more and page else None)


# --- standings ----------------------------------------------------------------------------

def standings(*, now: datetime, cached: bool = False) -> list[Standing]:
    """Every team's standing, highest factor first. `cached`: as computed by a page
    request of the last PAGE_CACHE_SECONDS (the dashboard and its live fragment)."""
    by_team = standings_by_team(now=now) if cached else fairshare_standings(now=now)
    return sorted(by_team.values(), key=lambda s: (-s.factor, s.team))


def standings_by_team(*, now: datetime) -> dict[str, Standing]:
    """`fairshare_standings` as computed by a page request of the last
    PAGE_CACHE_SECONDS (the dashboard, its live fragment, a job's priority)."""
    by_team: dict[str, Standing] = page_cached(_STANDINGS_KEY,
                                               lambda: fairshare_standings(now=now))
    return by_team


# --- what every dashboard request reads of the whole fleet, kept a few seconds ---------------
#
# The standings (rules F1-F6) and the quota forest are O(teams + jobs holding GPUs): with
# 1,000 teams and 5,000 running jobs 0.45 s and 0.7 s of CPU per request (docs/
# performance.md, "pages with 1,000,000 jobs"), the same for every user. Like the queue
# plan they are a read model: computed by one request, shared by every process for
# PAGE_CACHE_SECONDS (the dashboard polls every 3 s), dropped with the plan when a cycle
# changed something (`queue_plan_forget`). The scheduler cycle computes them itself
# (`page_reads_publish`, step 6) when it moved something or they are older than
# PAGE_CACHE_SECONDS, kept PAGE_PUBLISHED_SECONDS: while cycles run no request pays
# them (1-1.5 s at 1,000 teams on a loaded machine); a request computes them only when
# none is kept (no cycle for that long, the cache flushed), as before.
# (PAGE_READS_PUBLISHED False: the path before, a request refreshing them: the bench's A/B.)

PAGE_CACHE_SECONDS = 5.0
_STANDINGS_KEY = "fairq:web:standings"
_FOREST_KEY = "fairq:web:quota-forest"
_CAPACITY_KEY = "fairq:web:capacity-held"
PAGE_CACHE_KEYS = tuple(k + sfx for k in (_STANDINGS_KEY, _FOREST_KEY, _CAPACITY_KEY)
                        for sfx in ("", ":generation"))
# This process's copy of each kept value, by key: (generation, value). Unpickling the
# forest of 1,000 teams costs ~50 ms: a request fetches the short generation and reuses
# its copy while it is current (as queue_plan.py does with the plan).
_local: dict[str, tuple[str, Any]] = {}


PAGE_PUBLISHED_SECONDS = 60.0
PAGE_READS_PUBLISHED = True
_PUBLISHED_AT_KEY = "fairq:web:published-at"


def _keep(key: str, value: Any, timeout: float) -> None:
    kept = (uuid.uuid4().hex, value)
    cache.set_many({key: kept, key + ":generation": kept[0]}, timeout=timeout)
    _local[key] = kept


def page_reads_publish(*, now: datetime, moved: bool,
                       standings: Callable[[], dict[str, Standing]] | None = None) -> bool:
    """The scheduler cycle's part of the kept reads (above): the standings, the quota
    forest and the capacity card computed afresh and kept PAGE_PUBLISHED_SECONDS, when
    the cycle `moved` a job or the kept ones are older than PAGE_CACHE_SECONDS (or
    missing). Whether it computed them. `standings`: what gives the standings at `now`
    instead of `fairshare_standings(now=now)`, called only when they are published (the
    cycle's, from its kept inputs: services/scheduler.py)."""
    if not PAGE_READS_PUBLISHED:
        return False
    at: datetime | None = cache.get(_PUBLISHED_AT_KEY)
    if not moved and at is not None and (now - at).total_seconds() < PAGE_CACHE_SECONDS \
            and all(cache.get(k) is not None for k in PAGE_CACHE_KEYS[1::2]):
        return False
    _keep(_STANDINGS_KEY, fairshare_standings(now=now) if standings is None else standings(),
          PAGE_PUBLISHED_SECONDS)
    _keep(_FOREST_KEY, quota_forest(), PAGE_PUBLISHED_SECONDS)
    _keep(_CAPACITY_KEY, capacity_by_gpu_type(held_only=True), PAGE_PUBLISHED_SECONDS)
    cache.set(_PUBLISHED_AT_KEY, now, timeout=PAGE_PUBLISHED_SECONDS)
    return True


def page_cached(key: str, compute: Any) -> Any:
    """`compute()`, or what it gave for `key` in the last PAGE_CACHE_SECONDS."""
    generation = cache.get(key + ":generation")
    mine = _local.get(key)
    if generation is not None and mine is not None and mine[0] == generation:
        return mine[1]
    if generation is not None:
        shared = cache.get(key)
        if shared is not None and shared[0] == generation:
            _local[key] = shared
            return shared[1]
    value = compute()
    _keep(key, value, PAGE_CACHE_SECONDS)
    return value


def capacity_held_cached() -> tuple[list[CapacityRow], str]:
    """`capacity_by_gpu_type(held_only=True)` of the last PAGE_CACHE_SECONDS (the
    dashboard's card), each row a copy the caller may change."""
    rows, error = page_cached(_CAPACITY_KEY, lambda: capacity_by_gpu_type(held_only=True))
    return [dataclasses.replace(r) for r in rows], error


def team_standing_cached(*, team: str) -> list[Any]:
    """`quota_tree.team_standing` on the quota forest of the last PAGE_CACHE_SECONDS."""
    return team_standing(team=team, forest=page_cached(_FOREST_KEY, quota_forest))


_HISTORY_KEY = "fairq:web:usage-history"
HISTORY_TTL = 60.0  # seconds; snapshots are taken every FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS
# Off: every request unpickles the shared series and every user's dashboard reads the
# sessions' join, as before either was kept apart (bench/bench_dashboard.py --dash-ab
# times both sides in one process).
SERIES_KEPT_PER_PROCESS = True
SESSIONS_OF_OWNERS_ONLY = True


def _snapshot_series(*, now: datetime, days: float, max_points: int
                     ) -> tuple[list[int], dict[str, list[float | None]]]:
    """The snapshots of the last `days`, thinned to `max_points`, as columns; cached for
    HISTORY_TTL seconds (they change once per snapshot interval)."""
    key = f"{_HISTORY_KEY}:{days}:{max_points}"
    # Every team's series (1,000 teams × 168 points at the fleet's size) costs a request
    # more to unpickle than it uses of them (a member reads one): each process keeps its
    # copy while the shared generation is current, as `page_cached` does.
    generation = cache.get(key + ":generation")
    mine = _local.get(key) if SERIES_KEPT_PER_PROCESS else None
    if generation is not None and mine is not None and mine[0] == generation:
        kept: tuple[list[int], dict[str, list[float | None]]] = mine[1]
        return kept
    shared = cache.get(key) if generation is not None else None
    if shared is not None and shared[0] == generation:
        if SERIES_KEPT_PER_PROCESS:
            _local[key] = shared
        return cast(tuple[list[int], dict[str, list[float | None]]], shared[1])
    qs = FairShareSnapshot.objects.filter(at__gte=now - timedelta(days=days), at__lt=now)
    ids = list(qs.order_by("at").values_list("id", flat=True))
    step = max(1, -(-len(ids) // max_points))
    keep = ids[::-1][::step][::-1]  # thin from the newest backwards: the last one stays
    rows = list(FairShareSnapshot.objects.filter(pk__in=keep).order_by("at")
                .values_list("at", "standings"))
    teams = sorted({t for _, data in rows for t in data})
    series: dict[str, list[float | None]] = {t: [] for t in teams}
    times: list[int] = []
    for at, data in rows:
        times.append(int(at.timestamp()))
        for t in teams:
            v = data.get(t)
            series[t].append(float(v[0]) if v else None)
    _keep(key, (times, series), HISTORY_TTL)
    return times, series


def usage_history(*, now: datetime, days: float = 7.0,
                  current: list[Standing] | None = None,
                  max_points: int = 168, only: set[str] | None = None) -> dict[str, Any]:
    """Decayed GPU-hours per team over time, for the chart: the standings snapshots of the
    last `days` (thinned to at most `max_points`) plus the current standings as the last
    point. {"t": [unix seconds], "series": {team: [gpu-hours or None]}, "start": the
    left end of the x axis, "snapshots": how many snapshots are drawn}. `only`: the
    series of these teams alone (a member's own: not 1,000 series copied to be dropped)."""
    snap_times, snap_series = _snapshot_series(now=now, days=days, max_points=max_points)
    current = current if current is not None else standings(now=now)
    teams = sorted(set(snap_series) | {s.team for s in current})
    if only is not None:
        teams = [t for t in teams if t in only]
    times = list(snap_times)
    blank: list[float | None] = [None] * len(times)
    series = {t: list(snap_series.get(t, blank)) for t in teams}
    times.append(int(now.timestamp()))
    now_usage = {s.team: s.usage for s in current}
    for t in teams:
        series[t].append(round(now_usage[t], 6) if t in now_usage else None)
    # The x axis starts at the first snapshot, or an hour back when there is none yet.
    start = min(times[0], int(now.timestamp()) - 3600)
    return {"t": times, "series": series, "start": start, "snapshots": len(snap_times)}


def owns_sessions(*, user_id: int | None) -> bool:
    """Whether the user started any notebook session (one query on the sessions'
    owner): most users own none, and the dashboard's list of them is a join of eight
    tables, costlier to plan than to run."""
    if not SESSIONS_OF_OWNERS_ONLY:
        return True
    return NotebookSession.objects.filter(owner_id=user_id).exists()


def team_submit_defaults(*, team: Team, user: Any, web_job_id: int | None = None
                         ) -> dict[str, Any]:
    """Initial values of the submit form: the image, command, arguments, GPU type, size,
    tier and max runtime (not the environment) of `user`'s own last web submission to the
    team (`web_job_id`, remembered by the page), else of their own last job in the team;
    otherwise the GPU type of the team's largest quota and the default tier. Other
    people's jobs (a pipeline's) never fill in someone's form."""
    mine = Job.objects.filter(team=team, submitter=user).select_related("gpu_type", "tier")
    last = mine.filter(pk=web_job_id).first() if web_job_id else None
    if last is None:
        last = mine.order_by("-id").first()
    if last is not None:
        return {"image": last.image, "command": shlex.join(last.command or []),
                "args": shlex.join(last.args or []), "gpu_type": last.gpu_type.slug,
                "gpus": last.gpus_per_replica, "replicas": last.replicas,
                "tier": last.tier.slug, "max_runtime_seconds": last.max_runtime_seconds}
    quota = Quota.objects.filter(team=team).select_related("gpu_type").order_by(
        "-nominal", "gpu_type__slug").first()
    return {"gpu_type": quota.gpu_type.slug if quota else None, "gpus": 1, "replicas": 1,
            "tier": settings.FAIRQ_DEFAULT_TIER}


# --- quota board -----------------------------------------------------------------------------

@dataclass
class QuotaCell:
    team: Team
    gpu_type: GpuType
    quota: Quota | None
    allocated: int | float  # GPUs held (a fraction counts its share: shared GPUs)
    # The node's figures in the type's quota tree (docs/scheduling.md, "Quotas in a
    # tree: what admins write and see"); None where the board did not compute them.
    node: TreeNode | None = None

    @property
    def carved(self) -> int | float:
        """A department's teams' nominals (rule Q8: at most its own row's)."""
        return whole(sum(c.nominal for c in self.node.children)) if self.node else 0


@dataclass
class BoardRow:
    """One team of the board, in tree order: depth first, each department before its
    teams, siblings by slug."""

    team: Team
    cells: list[QuotaCell]
    standing: Standing | None
    depth: int
    is_department: bool
    parent: str | None
    parent_choices: list[str]  # every team but itself and those below it (rule F4)


@dataclass
class QuotaBoard:
    gpu_types: list[GpuType]
    rows: list[tuple[Team, list[QuotaCell], Standing | None]]
    capacity: list[CapacityRow]  # one per GPU type, in the order of `gpu_types`
    warnings: list[str]
    error: str = ""
    tree: list[BoardRow] = field(default_factory=list)  # `rows` in tree order


def _tree_order(teams: list[Team]) -> list[tuple[Team, int]]:
    """`teams` depth first (rule F4's forest; a team whose parent is unknown or on a
    cycle is top level), each with its depth."""
    safe = forest_parents({t.slug: (t.parent.slug if t.parent is not None else None)
                           for t in teams})
    kids: dict[str | None, list[Team]] = {}
    for t in sorted(teams, key=lambda t: t.slug):
        kids.setdefault(safe.get(t.slug), []).append(t)
    out: list[tuple[Team, int]] = []
    stack = [(t, 0) for t in reversed(kids.get(None, []))]
    while stack:
        team, depth = stack.pop()
        out.append((team, depth))
        stack.extend((c, depth + 1) for c in reversed(kids.get(team.slug, [])))
    return out


def _below(slug: str, order: list[tuple[Team, int]]) -> set[str]:
    """`slug` and every team under it (they follow it, deeper, in tree order)."""
    out: set[str] = set()
    start = None
    for team, depth in order:
        if start is not None:
            if depth <= start:
                break
            out.add(team.slug)
        elif team.slug == slug:
            start = depth
            out.add(slug)
    return out


def quota_board(*, now: datetime) -> QuotaBoard:
    """Teams × GPU types in tree order: each quota beside the team's allocation, its
    node's figures in the quota tree (a department's teams' nominals, its subtree's
    held, borrowing and lent) and decayed usage."""
    gpu_types = list(GpuType.objects.order_by("slug"))
    teams = list(Team.objects.select_related("parent").order_by("slug"))
    quotas = {(q.team_id, q.gpu_type_id): q for q in Quota.objects.all()}
    cap, error = capacity_by_gpu_type()
    alloc = {(team, c.gpu_type): gpus for c in cap for team, gpus in c.by_team.items()}
    by_team = {s.team: s for s in fairshare_standings(now=now).values()}
    nodes = {(t.gpu_type, n.team): n for t in quota_forest().trees for n in t.walk()}
    order = _tree_order(teams)
    departments = {t.parent.slug for t in teams if t.parent is not None}
    slugs = [t.slug for t, _ in order]
    rows, tree = [], []
    for team, depth in order:
        cells = [QuotaCell(team, g, quotas.get((team.pk, g.pk)),
                           alloc.get((team.slug, g.slug), 0), nodes.get((g.slug, team.slug)))
                 for g in gpu_types]
        rows.append((team, cells, by_team.get(team.slug)))
        below = _below(team.slug, order)
        tree.append(BoardRow(team, cells, by_team.get(team.slug), depth,
                             team.slug in departments,
                             team.parent.slug if team.parent is not None else None,
                             [s for s in slugs if s not in below]))
    by_type = {c.gpu_type: c for c in cap}
    columns = [by_type.get(g.slug, CapacityRow(g.slug)) for g in gpu_types]
    return QuotaBoard(gpu_types, rows, columns, overcommit_warnings(cap), error, tree)


def quota_cell(*, team: Team, gpu_type: GpuType) -> QuotaCell:
    quota = Quota.objects.filter(team=team, gpu_type=gpu_type).first()
    allocated = gpus_held(team=team, gpu_type=gpu_type).get((team.slug, gpu_type.slug), 0)
    [tree] = quota_forest(gpu_type=gpu_type.slug).trees
    return QuotaCell(team, gpu_type, quota, allocated, tree.by_team.get(team.slug))


def quota_cells_above(*, team: Team, gpu_type: GpuType) -> list[QuotaCell]:
    """The cells of the departments above `team` of `gpu_type`, nearest first: their
    teams' nominals and subtree's figures move with the team's quota."""
    [tree] = quota_forest(gpu_type=gpu_type.slug).trees
    above = [n.team for n in tree.path(team.slug)[1:]]
    if not above:
        return []
    teams = {t.slug: t for t in Team.objects.filter(slug__in=above)}
    quotas = {q.team_id: q for q in Quota.objects.filter(team__slug__in=above,
                                                          gpu_type=gpu_type)}
    held = gpus_held(gpu_type=gpu_type)
    return [QuotaCell(teams[s], gpu_type, quotas.get(teams[s].pk),
                      held.get((s, gpu_type.slug), 0), tree.by_team.get(s))
            for s in above if s in teams]


def team_quotas(*, team: Team) -> list[QuotaCell]:
    alloc = gpus_held(team=team)
    quotas = {q.gpu_type_id: q for q in Quota.objects.filter(team=team)}
    return [QuotaCell(team, g, quotas.get(g.pk), alloc.get((team.slug, g.slug), 0))
            for g in GpuType.objects.order_by("slug")
            if g.pk in quotas or alloc.get((team.slug, g.slug))]
