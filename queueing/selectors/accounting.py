"""Accounting like Slurm's `sacct`: one row per job attempt that held GPUs, finished
(its usage record, rule F1) or running now, with who, where, how long, how it ended and
how well it used its GPUs (rule U1's per-attempt summary). Callers scope the teams to the
actor first (`accounts.selectors.teams_for_user`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import (
    Case,
    CharField,
    F,
    IntegerField,
    OuterRef,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from accounts.models import Team
from queueing.models import AttemptUtilization, Job, JobEvent, UsageRecord
from queueing.policy.states import JobState

# The states an attempt can end in (its job's state then) and RUNNING for one running now.
ATTEMPT_STATES = ("RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "PREEMPTED", "REQUEUED")
_HELD = [JobState.ADMITTED.value, JobState.RUNNING.value]


@dataclass(frozen=True)
class AccountingFilter:
    """What `accounting_rows` keeps: attempts of `teams` overlapping [start, end)."""

    teams: Iterable[Team]
    user: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    states: tuple[str, ...] = ()
    gpu_type: str | None = None


@dataclass(frozen=True)
class AccountingRow:
    job_id: int
    attempt: int
    name: str
    user: str | None
    team: str
    gpu_type: str
    tier: str
    gpus: int | float  # a fraction of a shared GPU counts its share (0.25)
    start: datetime
    end: datetime | None  # None while running
    elapsed_seconds: int
    gpu_hours: float
    state: str
    exit_code: int | None
    reason: str
    sm_mean: float | None  # percent; None without readings
    efficiency: float | None  # sm_mean / 100

    @property
    def running(self) -> bool:
        return self.end is None


def ended_transition(field: str) -> Subquery:
    """The transition that ended the record's attempt: the first one of that attempt out
    of ADMITTED/RUNNING to anything but RUNNING (rule S1)."""
    return Subquery(
        JobEvent.objects.filter(
            job_id=OuterRef("job_id"), attempt=OuterRef("attempt"),
            kind=JobEvent.Kind.TRANSITION, from_status__in=_HELD,
        ).exclude(to_status=JobState.RUNNING.value).order_by("at", "id").values(field)[:1]
    )


def finished_attempts(f: AccountingFilter) -> QuerySet[UsageRecord]:
    """Usage records of job attempts (imported records have no job and are left out),
    annotated with `end_state` (QUEUED for an admitted attempt requeued before it ran
    reads as REQUEUED), `end_reason` and `end_exit_code`, newest first."""
    qs = (
        UsageRecord.objects.filter(team__in=list(f.teams), job__isnull=False)
        .annotate(
            _to=ended_transition("to_status"),
            end_reason=Coalesce(ended_transition("reason"), Value("")),
            end_state=Case(
                When(_to=JobState.QUEUED.value, then=Value("REQUEUED")),
                When(_to__isnull=True, then=F("job__status")),
                default=F("_to"), output_field=CharField()),
            end_exit_code=Case(
                When(attempt=F("job__attempt"), then=F("job__exit_code")),
                default=None, output_field=IntegerField()),
        )
        .select_related("team", "gpu_type", "job", "job__tier", "job__submitter")
        .order_by("-start", "-id")
    )
    if f.user:
        qs = qs.filter(job__submitter__username=f.user)
    if f.gpu_type:
        qs = qs.filter(gpu_type__slug=f.gpu_type)
    if f.start is not None:
        qs = qs.filter(end__gt=f.start)
    if f.end is not None:
        qs = qs.filter(start__lt=f.end)
    finished = [s for s in f.states if s != "RUNNING"]
    if f.states:
        qs = qs.filter(end_state__in=finished) if finished else qs.none()
    return qs


def running_attempts(f: AccountingFilter, *, now: datetime) -> list[Job]:
    """Jobs running now (their current attempt started), newest start first."""
    if f.states and "RUNNING" not in f.states:
        return []
    if f.start is not None and now <= f.start:
        return []
    qs = Job.objects.filter(team__in=list(f.teams), status=JobState.RUNNING.value,
                            started_at__isnull=False)
    if f.user:
        qs = qs.filter(submitter__username=f.user)
    if f.gpu_type:
        qs = qs.filter(gpu_type__slug=f.gpu_type)
    if f.end is not None:
        qs = qs.filter(started_at__lt=f.end)
    return list(qs.select_related("team", "gpu_type", "tier", "submitter")
                .order_by("-started_at", "-id"))


def accounting_page(f: AccountingFilter, *, now: datetime, offset: int,
                    limit: int) -> tuple[list[AccountingRow], bool]:
    """Rows [offset, offset + limit): the running attempts first (newest start first),
    then the finished ones (newest start first). Returns the rows and whether more
    follow. Two queries for the rows plus one for their utilization."""
    running = running_attempts(f, now=now)
    rows: list[AccountingRow] = [_running_row(j, now) for j in running[offset:offset + limit]]
    more = offset + limit < len(running)
    if len(rows) < limit:
        skip = max(0, offset - len(running))
        want = limit - len(rows)
        records = list(finished_attempts(f)[skip:skip + want + 1])
        more = len(records) > want
        rows += [_finished_row(r) for r in records[:want]]
    return _with_utilization(rows), more


def accounting_rows(f: AccountingFilter, *, now: datetime) -> list[AccountingRow]:
    """Every row `f` keeps (for exports and tests; the API pages)."""
    rows = [_running_row(j, now) for j in running_attempts(f, now=now)]
    rows += [_finished_row(r) for r in finished_attempts(f).iterator(chunk_size=2000)]
    return _with_utilization(rows)


def _running_row(job: Job, now: datetime) -> AccountingRow:
    assert job.started_at is not None  # running_attempts keeps started jobs only
    seconds = max(0.0, (now - job.started_at).total_seconds())
    gpus = job.gpu_share
    return AccountingRow(
        job_id=job.pk, attempt=job.attempt, name=job.name,
        user=job.submitter.username if job.submitter else None, team=job.team.slug,
        gpu_type=job.gpu_type.slug, tier=job.tier.slug, gpus=gpus, start=job.started_at,
        end=None, elapsed_seconds=int(seconds), gpu_hours=round(gpus * seconds / 3600, 6),
        state=JobState.RUNNING.value, exit_code=None, reason="", sm_mean=None,
        efficiency=None)


def _finished_row(r: UsageRecord) -> AccountingRow:
    job = r.job
    assert job is not None and r.attempt is not None  # finished_attempts keeps job records
    return AccountingRow(
        job_id=job.pk, attempt=r.attempt, name=job.name,
        user=job.submitter.username if job.submitter else None, team=r.team.slug,
        gpu_type=r.gpu_type.slug, tier=job.tier.slug, gpus=r.gpus, start=r.start, end=r.end,
        elapsed_seconds=int((r.end - r.start).total_seconds()),
        gpu_hours=round(r.gpu_seconds / 3600, 6), state=r.end_state,  # type: ignore[attr-defined]
        exit_code=r.end_exit_code, reason=r.end_reason,  # type: ignore[attr-defined]
        sm_mean=None, efficiency=None)


def _with_utilization(rows: list[AccountingRow]) -> list[AccountingRow]:
    if not rows:
        return rows
    means: dict[tuple[int, int], float] = {}
    ids = sorted({r.job_id for r in rows})
    for i in range(0, len(ids), 5000):
        means.update({
            (job_id, attempt): sm_mean
            for job_id, attempt, sm_mean in AttemptUtilization.objects.filter(
                job_id__in=ids[i:i + 5000], samples__gt=0)
            .values_list("job_id", "attempt", "sm_mean")})
    out = []
    for r in rows:
        sm = means.get((r.job_id, r.attempt))
        if sm is None:
            out.append(r)
            continue
        out.append(AccountingRow(**{**r.__dict__, "sm_mean": round(sm, 2),
                                    "efficiency": round(sm / 100, 4)}))
    return out
