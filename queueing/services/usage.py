"""Usage recording and fair-share standings (docs/scheduling.md, rules F1-F6)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.db.models.expressions import RawSQL

from accounts.models import Team
from queueing.models import FairShareAccumulator, Job, UsageRecord
from queueing.policy.fairshare import (
    Accumulator,
    Standing,
    TeamUsageInput,
    compute_standings,
    entry_penalty_gpu_hours,
)
from queueing.policy.states import JobState

# Rule F2: a team with work in these states is active even before it has any usage.
_ACTIVE_STATES = (JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING)


def half_life_hours() -> float:
    return float(settings.FAIRQ_DECAY_HALF_LIFE_HOURS)


def entry_penalty_interval_seconds() -> float:
    """Rule F6: the recompute interval an admission is charged for (seconds)."""
    return float(settings.FAIRQ_FAIRSHARE_RECOMPUTE_SECONDS)


@transaction.atomic
def usage_record_attempt(*, job: Job, start: datetime, end: datetime,
                         attempt: int | None = None) -> UsageRecord | None:
    """Charge one finished attempt interval of `job` to its team: a usage record and the
    team's decayed accumulator, in one transaction. Charging an attempt twice is a no-op
    (one record per job attempt). `attempt` defaults to the job's current one (an earlier
    attempt's pods that ran after fairq moved on are charged to that attempt)."""
    attempt = job.attempt if attempt is None else attempt
    if end < start:
        end = start
    if UsageRecord.objects.filter(job=job, attempt=attempt).exists():
        return None
    gpus = job.total_gpus
    weight = job.gpu_type.billing_weight
    record = UsageRecord.objects.create(
        team_id=job.team_id, gpu_type_id=job.gpu_type_id, job=job, attempt=attempt,
        gpus=gpus, billing_weight=weight, start=start, end=end,
        gpu_seconds=gpus * (end - start).total_seconds(),
    )
    accumulator_add(team_id=job.team_id, rate=gpus * weight, start=start, end=end)
    return record


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


def fairshare_inputs(*, now: datetime) -> tuple[list[TeamUsageInput], dict[str, float]]:
    """Each team's weight, parent, banked usage, running attempts and activity, and the
    entry penalty (rule F6) of jobs admitted but not yet running, per team.

    O(teams + jobs holding GPUs) in three queries, none over the usage history.
    """
    banked = decayed_accumulators(now=now)
    running: dict[int, list[tuple[float, datetime]]] = {}
    penalty: dict[int, float] = {}
    interval = entry_penalty_interval_seconds()
    rows = Job.objects.filter(status__in=[JobState.RUNNING, JobState.ADMITTED]).values_list(
        "team_id", "status", "gpus_per_replica", "replicas", "gpu_type__billing_weight",
        "started_at",
    )
    for team_id, status, gpus, replicas, weight, started_at in rows:
        if status == JobState.RUNNING and started_at is not None and started_at <= now:
            running.setdefault(team_id, []).append((gpus * replicas * weight, started_at))
        else:
            # Rule F6 across cycles: an admitted job not yet running keeps its entry
            # penalty until its real usage starts counting.
            penalty[team_id] = penalty.get(team_id, 0.0) + entry_penalty_gpu_hours(
                gpus * replicas, weight, interval)
    teams = list(
        Team.objects.annotate(
            has_work=Exists(Job.objects.filter(team=OuterRef("pk"),
                                               status__in=list(_ACTIVE_STATES))),
        ).values_list("pk", "slug", "weight", "parent_id", "has_work")
    )
    slug_of = {pk: slug for pk, slug, *_ in teams}
    inputs = [
        TeamUsageInput(
            team=slug,
            weight=weight,
            accumulator=Accumulator(banked.get(pk, 0.0), now),
            running=tuple(running.get(pk, ())),
            parent=slug_of.get(parent_id) if parent_id is not None else None,
            active=bool(has_work),
        )
        for pk, slug, weight, parent_id, has_work in teams
    ]
    extra = {slug_of[pk]: v for pk, v in penalty.items() if pk in slug_of}
    return inputs, extra


def fairshare_standings(*, now: datetime) -> dict[str, Standing]:
    """Rules F1-F6 for every team at `now`, from the accumulators: O(teams), whatever the
    length of the usage history."""
    inputs, extra = fairshare_inputs(now=now)
    return compute_standings(inputs, now=now, half_life_hours=half_life_hours(),
                             extra_usage=extra)
