"""Per-user usage inside each team, like `sshare -a`: rule F1's decayed, weighted
GPU-hours summed over the attempts each user submitted (charged records cut and decayed
to `at`, plus the attempts running now). fair-share is computed per team, not per user:
these numbers say who in a team spent its standing."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection

from accounts.models import Team
from queueing.models import Job, UsageRecord
from queueing.policy.fairshare import decayed_interval_usage
from queueing.policy.states import JobState
from queueing.selectors.fairshare import half_life_hours
from queueing.selectors.gpu_share import GPU_SHARE


@dataclass(frozen=True)
class UserUsage:
    team: str
    user: str | None  # None: imported records and jobs whose submitter was deleted
    usage_gpu_hours: float  # decayed, weighted (rule F1)
    usage_fraction: float  # of the team's usage; 0 when the team has none
    running_jobs: int


def user_usage(*, teams: Iterable[str], at: datetime) -> dict[str, list[UserUsage]]:
    """Per team slug in `teams`: its users with usage, most usage first (then by name).
    One aggregate query on PostgreSQL (a streamed scan elsewhere) and one for the
    running attempts."""
    slugs = sorted(set(teams))
    h = half_life_hours()
    usage: dict[tuple[str, str | None], float] = defaultdict(float)
    if connection.vendor == "postgresql":
        sql = f"""
            SELECT t.slug, u.username, SUM(r.gpus * r.billing_weight * %(k)s
                * power(2.0::float8, GREATEST(-1000.0,
                    -date_part('epoch', %(at)s::timestamptz - LEAST(r."end", %(at)s::timestamptz))
                    / %(hs)s))
                * (1.0 - power(2.0::float8, GREATEST(-1000.0,
                    -date_part('epoch', LEAST(r."end", %(at)s::timestamptz) - r.start) / %(hs)s))))
            FROM {UsageRecord._meta.db_table} r
            JOIN {Team._meta.db_table} t ON t.id = r.team_id
            LEFT JOIN {Job._meta.db_table} j ON j.id = r.job_id
            LEFT JOIN {get_user_model()._meta.db_table} u ON u.id = j.submitter_id
            WHERE r.start < %(at)s::timestamptz AND r."end" > r.start AND t.slug = ANY(%(slugs)s)
            GROUP BY t.slug, u.username
        """
        params: dict[str, Any] = {"k": h / math.log(2), "at": at, "hs": h * 3600.0,
                                  "slugs": slugs}
        with connection.cursor() as cur:
            cur.execute(sql, params)
            for slug, username, v in cur.fetchall():
                usage[(slug, username)] += float(v or 0.0)
    else:
        for slug, username, gpus, weight, start, end in UsageRecord.objects.filter(
            team__slug__in=slugs, start__lt=at,
        ).values_list("team__slug", "job__submitter__username", "gpus", "billing_weight",
                      "start", "end").iterator(chunk_size=10_000):
            usage[(slug, username)] += decayed_interval_usage(
                rate=gpus * weight, start=start, end=min(end, at), as_of=at, half_life_hours=h)
    running: dict[tuple[str, str | None], int] = defaultdict(int)
    for slug, username, share, weight, started in Job.objects.filter(
        team__slug__in=slugs, status=JobState.RUNNING.value, started_at__isnull=False,
        started_at__lt=at,
    ).annotate(share=GPU_SHARE).values_list("team__slug", "submitter__username", "share",
                                            "gpu_type__billing_weight", "started_at"):
        if started is None:  # excluded by the filter; for the type checker
            continue
        usage[(slug, username)] += decayed_interval_usage(
            rate=share * weight, start=started, end=at, as_of=at, half_life_hours=h)
        running[(slug, username)] += 1
    totals: dict[str, float] = defaultdict(float)
    for (slug, _), v in usage.items():
        totals[slug] += v
    out: dict[str, list[UserUsage]] = {slug: [] for slug in slugs}
    for (slug, username), v in usage.items():
        total = totals[slug]
        out[slug].append(UserUsage(
            team=slug, user=username, usage_gpu_hours=round(v, 6),
            usage_fraction=round(v / total, 6) if total > 0 else 0.0,
            running_jobs=running.get((slug, username), 0)))
    for rows in out.values():
        rows.sort(key=lambda u: (-u.usage_gpu_hours, u.user or ""))
    return out
