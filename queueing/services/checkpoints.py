"""Checkpoints and graceful stop (docs/api.md, "Checkpoints and graceful stop").

    - `checkpoint_token` / `checkpoint_claim` — the per-attempt token a job's pods get as
      FAIRQ_CHECKPOINT_TOKEN: `django.core.signing` with its own salt, binding the job id
      and the attempt (no table: the signature is the proof).
    - `checkpoint_url`     — FAIRQ_CHECKPOINT_URL, from FAIRQ_PUBLIC_URL ("" unset: the
      job is offered no reporting, the env is not set).
    - `checkpoint_report`  — a reported checkpoint, accepted for the current attempt
      while ADMITTED/RUNNING and for an attempt preempted or cancelled during its grace
      (rule R6 moves the attempt on at once, while its pods still run their grace).
    - `lost_gpu_hours`     — the work a preemption loses: GPUs x (the preemption - the
      later of the start and the newest checkpoint reported by the end of the grace).

Where the loss is kept: the preempted attempt's UsageRecord (`lost_gpu_hours`, what the
per-team reports sum) and its "preempted" event's data (`lost_gpu_hours`,
`checkpoint_at`, `grace_seconds`: what the job page and the API say of each
preemption). Both are written by the preemption (services/preemption.py) and lowered here
when a checkpoint arrives during the grace; the day's UsageDay too when the roll-up
already holds the record.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core import signing
from django.db import transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from queueing import validation as v
from queueing.errors import Conflict, DomainError, NotFound, PermissionDenied
from queueing.models import Checkpoint, Job, JobEvent, UsageDay, UsageRecord, UsageRollup
from queueing.policy.states import HOLDING_STATES, JobState

from .jobs import attempt_grace_seconds

# The token's own salt: a value signed for anything else in fairq never passes as one.
CHECKPOINT_TOKEN_SALT = "fairq.checkpoint-token"
# What starts every checkpoint token: a user's API token never does, so the API can
# tell the two apart before it checks either (accounts/authentication.py).
CHECKPOINT_TOKEN_PREFIX = "fqc."


@dataclass(frozen=True)
class CheckpointClaim:
    """What a valid checkpoint token proves: it was given to `attempt` of job `job_id`."""

    job_id: int
    attempt: int


def checkpoint_token(*, job_id: int, attempt: int) -> str:
    """The token of one attempt of a job (FAIRQ_CHECKPOINT_TOKEN): signed with
    SECRET_KEY and this module's salt; it never expires, an attempt that is over is
    refused by `checkpoint_report` (409)."""
    return CHECKPOINT_TOKEN_PREFIX + signing.dumps({"j": job_id, "a": attempt},
                                                   salt=CHECKPOINT_TOKEN_SALT)


def is_checkpoint_token(key: str) -> bool:
    return key.startswith(CHECKPOINT_TOKEN_PREFIX)


def checkpoint_claim(key: str) -> CheckpointClaim | None:
    """The job and attempt `key` was signed for; None when it is not a valid token."""
    if not is_checkpoint_token(key):
        return None
    try:
        data = signing.loads(key[len(CHECKPOINT_TOKEN_PREFIX):], salt=CHECKPOINT_TOKEN_SALT)
    except signing.BadSignature:
        return None
    job_id, attempt = (data.get("j"), data.get("a")) if isinstance(data, dict) else (None, None)
    if not isinstance(job_id, int) or not isinstance(attempt, int):
        return None
    return CheckpointClaim(job_id=job_id, attempt=attempt)


def checkpoint_url(job_id: int) -> str:
    """FAIRQ_CHECKPOINT_URL of a job: FAIRQ_PUBLIC_URL + the endpoint's path; "" when no
    public URL is set (the pods could not reach fairq: reporting is not offered)."""
    base = str(getattr(settings, "FAIRQ_PUBLIC_URL", "") or "").rstrip("/")
    if not base:
        return ""
    return f"{base}/api/v1/jobs/{job_id}/checkpoints/"


def lost_gpu_hours(*, gpus: float, started_at: datetime | None, stopped_at: datetime,
                   checkpoint_at: datetime | None) -> float:
    """The work a preemption at `stopped_at` loses, in GPU-hours: `gpus` x the time from
    the later of the start and the checkpoint to the preemption. A checkpoint at or after
    the preemption (reported during the grace) saves all of it: 0. Never started: 0."""
    if started_at is None:
        return 0.0
    base = started_at if checkpoint_at is None else max(started_at, checkpoint_at)
    return gpus * max(0.0, (stopped_at - base).total_seconds()) / 3600.0


def checkpoint_fields_problems(*, step: Any, progress: Any, path: Any) -> dict[str, list[str]]:
    """Each refused field of a checkpoint report on its own (all are optional)."""
    problems: dict[str, list[str]] = {}
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)
                             or not 0 <= step <= 2**62):
        problems["step"] = ["A whole number, at least 0."]
    if progress is not None and (isinstance(progress, bool)
                                 or not isinstance(progress, int | float)
                                 or not 0.0 <= float(progress) <= 1.0):
        problems["progress"] = ["A number within 0..1 (0.4: 40 % done)."]
    if path is not None and (not isinstance(path, str) or len(path) > v.MAX_CHECKPOINT_PATH_LEN
                             or "\x00" in path):
        problems["path"] = [f"Text of at most {v.MAX_CHECKPOINT_PATH_LEN} characters."]
    return problems


def _stop_of(job: Job, attempt: int) -> tuple[JobEvent | None, datetime | None]:
    """How `attempt` of `job` was stopped by fairq: its "preempted" event, or its move to
    CANCELLED (None, None when neither), and the end of its grace window."""
    ended = (JobEvent.objects.filter(job=job, attempt=attempt)
             .filter(Q(kind=JobEvent.Kind.PREEMPTED)
                     | Q(kind=JobEvent.Kind.TRANSITION, to_status=JobState.CANCELLED))
             .order_by("-at", "-id").first())
    if ended is None:
        return None, None
    grace = (ended.data or {}).get("grace_seconds")
    if not isinstance(grace, int):
        grace = attempt_grace_seconds(job)
    return ended, ended.at + timedelta(seconds=grace)


@transaction.atomic
def checkpoint_report(*, claim: CheckpointClaim | None, job_id: int, step: Any = None,
                      progress: Any = None, path: Any = None,
                      now: datetime | None = None) -> Checkpoint:
    """Record a checkpoint reported with a checkpoint token.

    PermissionDenied (403) without a checkpoint token (`claim` None: a user's token) or
    with one of another job; NotFound (404) for a job that is gone; DomainError (400)
    naming each bad field; Conflict (409) for an attempt that is over: neither the
    current one while ADMITTED/RUNNING nor one preempted or cancelled less than its
    grace ago. A checkpoint of the current attempt moves `Job.checkpointed_at` (what the
    cycle's snapshot reads); one reported during a preempted attempt's grace lowers that
    preemption's lost GPU-hours (to 0: the work up to the preemption is saved) and is an
    event on the job."""
    now = now or timezone.now()
    if claim is None:
        raise PermissionDenied(
            "Checkpoints are reported with the attempt's FAIRQ_CHECKPOINT_TOKEN "
            "(Authorization: Bearer ...), not with a user's API token.")
    if claim.job_id != job_id:
        raise PermissionDenied(
            f"This token reports checkpoints of job {claim.job_id} only, not of job {job_id}.")
    problems = checkpoint_fields_problems(step=step, progress=progress, path=path)
    if problems:
        raise DomainError("The checkpoint has invalid fields.", fields=problems)
    job = Job.objects.select_for_update().select_related("tier").filter(pk=job_id).first()
    if job is None:
        raise NotFound(f"Job {job_id} not found.")
    current = claim.attempt == job.attempt and job.state in HOLDING_STATES
    stop: JobEvent | None = None
    if not current:
        stop, grace_end = _stop_of(job, claim.attempt)
        if stop is None or grace_end is None or now > grace_end:
            raise Conflict(
                f"Attempt {claim.attempt} of job {job_id} is over (the job is "
                f"{job.status}, attempt {job.attempt}): checkpoints are taken from the "
                "current attempt, and from a preempted or cancelled one during its grace.")
    checkpoint = Checkpoint.objects.create(
        job=job, attempt=claim.attempt, created_at=now, step=step,
        progress=None if progress is None else float(progress), path=path or "")
    if current:
        # Only forward: a report delayed behind a newer one does not move it back.
        Job.objects.filter(pk=job.pk, attempt=claim.attempt).filter(
            Q(checkpointed_at__isnull=True) | Q(checkpointed_at__lt=now)
        ).update(checkpointed_at=now, updated_at=now)  # a poller's ETag moves with it
    elif stop is not None and stop.kind == JobEvent.Kind.PREEMPTED:
        _saved_in_grace(job, stop, checkpoint)
    return checkpoint


def _saved_in_grace(job: Job, stop: JobEvent, checkpoint: Checkpoint) -> None:
    """A checkpoint reported during a preempted attempt's grace: the preemption loses
    nothing now. Its event's data, its usage record and the roll-up's day say so, and an
    event on the job tells when."""
    before = (stop.data or {}).get("lost_gpu_hours")
    saved = {"lost_gpu_hours": 0.0, "checkpoint_at": checkpoint.created_at.isoformat(),
             "checkpoint_id": checkpoint.pk, "checkpoint_in_grace": True}
    # The "preempted" event and the attempt's move to PREEMPTED carry the same data.
    for pk, data in JobEvent.objects.filter(job=job, attempt=stop.attempt).filter(
            Q(kind=JobEvent.Kind.PREEMPTED)
            | Q(kind=JobEvent.Kind.TRANSITION, to_status=JobState.PREEMPTED)
    ).values_list("pk", "data"):
        JobEvent.objects.filter(pk=pk).update(data={**(data or {}), **saved})
    record = UsageRecord.objects.filter(job=job, attempt=stop.attempt).first()
    if record is not None and record.lost_gpu_hours:
        was = float(record.lost_gpu_hours)
        UsageRecord.objects.filter(pk=record.pk).update(lost_gpu_hours=0.0)
        # A rolled-up day corrected: `updated_at` stamped, so that the reports page's
        # kept sums of the roll-up (selectors/reports.py) are read again.
        rolled = UsageRollup.objects.filter(pk=1, last_record_id__gte=record.pk).update(
            updated_at=timezone.now())
        if rolled:
            UsageDay.objects.filter(day=record.end.date(), team_id=record.team_id,
                                    gpu_type_id=record.gpu_type_id).update(
                lost_gpu_hours=F("lost_gpu_hours") - was)
    if before:
        after = (checkpoint.created_at - stop.at).total_seconds()
        JobEvent.objects.create(
            job=job, at=checkpoint.created_at, kind=JobEvent.Kind.CHECKPOINT,
            actor_label="job", attempt=stop.attempt,
            reason=(f"checkpoint {after:.0f} s into the grace of preempted attempt "
                    f"{stop.attempt}: nothing lost (was {float(before):.2f} GPU-h)"),
            data={"checkpoint_id": checkpoint.pk, "lost_gpu_hours": 0.0,
                  "was_lost_gpu_hours": before})


def resume_note(checkpoint: Checkpoint | None) -> tuple[str, dict[str, Any]]:
    """What the ADMITTED event of a resumed attempt says of the checkpoint it resumes
    from: a phrase for its reason and the data ({} and "" without one)."""
    if checkpoint is None:
        return "", {}
    parts = [f"attempt {checkpoint.attempt}", checkpoint.created_at.strftime("%Y-%m-%dT%H:%M:%SZ")]
    if checkpoint.step is not None:
        parts.append(f"step {checkpoint.step}")
    if checkpoint.path:
        parts.append(checkpoint.path[:200])
    return (f"; resumes from checkpoint {checkpoint.pk} ({', '.join(parts)})",
            {"id": checkpoint.pk, "attempt": checkpoint.attempt,
             "at": checkpoint.created_at.isoformat(), "step": checkpoint.step,
             "progress": checkpoint.progress, "path": checkpoint.path})


def checkpoints_purge(*, now: datetime, days: float, batch: int = 10_000) -> int:
    """Delete the checkpoint rows created more than `days` ago, each job's newest kept
    (what a resumed attempt names), in batches (no long locks). Returns how many. Beat
    runs it hourly (`checkpoints-purge`, FAIRQ_CHECKPOINT_RETENTION_DAYS; 0 keeps them).
    Lost GPU-hours are kept on the usage records, so no accounting reads old rows."""
    if days <= 0:
        return 0
    newest = Checkpoint.objects.filter(job=OuterRef("job")).order_by("-created_at", "-pk")
    old = (Checkpoint.objects.filter(created_at__lt=now - timedelta(days=days))
           .exclude(pk=Subquery(newest.values("pk")[:1])))
    deleted = 0
    while ids := list(old.values_list("pk", flat=True)[:batch]):
        deleted += Checkpoint.objects.filter(pk__in=ids).delete()[0]
    return deleted
