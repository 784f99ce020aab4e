"""Usage recording and fair-share standings (docs/scheduling.md, rules F1-F3)."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import transaction

from accounts.models import Team
from queueing.models import FairShareAccumulator, Job, UsageRecord
from queueing.policy.fairshare import Accumulator, Standing, TeamUsageInput, compute_standings
from queueing.policy.states import JobState


def half_life_hours() -> float:
    return float(settings.FAIRQ_DECAY_HALF_LIFE_HOURS)


@transaction.atomic
def usage_record_attempt(*, job: Job, start: datetime, end: datetime) -> UsageRecord | None:
    """Charge one finished attempt interval of `job` to its team: a usage record and the
    team's decayed accumulator, in one transaction. Charging an attempt twice is a no-op
    (one record per job attempt)."""
    if end < start:
        end = start
    if UsageRecord.objects.filter(job=job, attempt=job.attempt).exists():
        return None
    gpus = job.total_gpus
    weight = job.gpu_type.billing_weight
    record = UsageRecord.objects.create(
        team_id=job.team_id, gpu_type_id=job.gpu_type_id, job=job, attempt=job.attempt,
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


def fairshare_inputs(*, now: datetime) -> list[TeamUsageInput]:
    """Each team's weight, accumulator and running attempts: O(teams + running jobs)."""
    accs = {a.team_id: a for a in FairShareAccumulator.objects.all()}
    running: dict[int, list[tuple[float, datetime]]] = {}
    rows = Job.objects.filter(status=JobState.RUNNING, started_at__isnull=False).values_list(
        "team_id", "gpus_per_replica", "replicas", "gpu_type__billing_weight", "started_at"
    )
    for team_id, gpus, replicas, weight, started_at in rows:
        if started_at is None:  # excluded by the filter; narrows the type
            continue
        running.setdefault(team_id, []).append((gpus * replicas * weight, started_at))
    inputs = []
    for team in Team.objects.select_related("parent").all():
        acc = accs.get(team.pk)
        inputs.append(TeamUsageInput(
            team=team.slug,
            weight=team.weight,
            accumulator=Accumulator(acc.value, acc.as_of) if acc else Accumulator(0.0, now),
            running=tuple(running.get(team.pk, ())),
            parent=team.parent.slug if team.parent else None,
        ))
    return inputs


def fairshare_standings(*, now: datetime) -> dict[str, Standing]:
    return compute_standings(fairshare_inputs(now=now), now=now, half_life_hours=half_life_hours())
