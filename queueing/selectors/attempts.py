"""A job's attempts as a poller wants them (docs/api.md, "Attempts"): when each started
and ended, how it ended (preempted by whom, reclaimed idle, failed, its node lost,
succeeded, cancelled, or still running) and the GPU-hours it was charged.

Derived, not stored: the transition events say when and how (rule S1 writes one for
every move, rules R7 and U3 put the preemptor and the reclaim in their `data`), the
usage records what each attempt was charged (one per attempt). Two queries for any
number of jobs, so the job list pays two queries per page, not per job."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from queueing.models import Job, JobEvent, UsageRecord
from queueing.policy.states import JobState

_ENDS = {
    JobState.SUCCEEDED.value: "succeeded",
    JobState.CANCELLED.value: "cancelled",
    JobState.FAILED.value: "failed",
    JobState.PREEMPTED.value: "preempted",
}


def _never_started(job: Job) -> bool:
    """A job whose first attempt was never admitted has no attempt to show (no query)."""
    return job.attempt == 1 and job.admitted_at is None and job.started_at is None


def jobs_attempts(jobs: Sequence[Job], *, now: datetime) -> dict[int, list[dict[str, Any]]]:
    """Job id -> its attempts that were admitted, oldest first (`job_attempts`' shape)."""
    out: dict[int, list[dict[str, Any]]] = {j.pk: [] for j in jobs}
    ids = [j.pk for j in jobs if not _never_started(j)]
    if not ids:
        return out
    events: dict[int, list[dict[str, Any]]] = {}
    for e in (
        JobEvent.objects.filter(job_id__in=ids, kind=JobEvent.Kind.TRANSITION)
        .order_by("job_id", "at", "id")
        .values("job_id", "at", "from_status", "to_status", "attempt", "data", "reason")
    ):
        events.setdefault(e["job_id"], []).append(dict(e))
    charged: dict[tuple[int, int], tuple[float, datetime, datetime, float | None]] = {
        (job_id, attempt): (seconds, start, end, lost)
        for job_id, attempt, seconds, start, end, lost in UsageRecord.objects.filter(
            job_id__in=ids).values_list(
            "job_id", "attempt", "gpu_seconds", "start", "end", "lost_gpu_hours"
        )
        if attempt is not None
    }
    by_id = {j.pk: j for j in jobs}
    for pk in ids:
        out[pk] = attempts_from_events(by_id[pk], events.get(pk, ()), charged, now=now)
    return out


def job_attempts(job: Job, *, now: datetime) -> list[dict[str, Any]]:
    """The job's attempts: [{attempt, admitted_at, started_at, ended_at, ended_how,
    preempted_by, gpu_hours, charged}], oldest first. `ended_how` is one of preempted,
    reclaimed (idle, rule U3), spot_reclaimed (its spot node was reclaimed, rule K6),
    cluster_unreachable (its cluster could not be read past the grace, rule K5), failed,
    node_lost (its workload vanished), requeued (handed back before it ran), succeeded,
    cancelled; admitted or running for the current one. `preempted_by` is {job, team,
    tier} for a preempted attempt (rule R7), with `lost_gpu_hours` (the work its
    preemption lost: from its newest checkpoint reported by the end of its grace, or its
    start), `checkpoint_at` (that checkpoint, or None) and `lost_note` ("preempted,
    nothing lost: checkpoint 4 s before"); all three None for other attempts.
    `gpu_hours` is what the attempt was charged (GPUs × hours, before the billing weight);
    a running attempt's so far, with `charged` false."""
    return jobs_attempts([job], now=now)[job.pk]


def attempts_from_events(
    job: Job,
    events: Iterable[dict[str, Any]],
    charged: dict[tuple[int, int], tuple[float, datetime, datetime, float | None]],
    *,
    now: datetime,
) -> list[dict[str, Any]]:
    """`job_attempts` from the job's transition events (oldest first) and its charges
    (job id, attempt) -> (GPU-seconds, start, end). Times are the cluster's where fairq
    has them (a charged attempt's interval, the current attempt's `started_at` and
    `finished_at`), else when fairq saw the move (the event)."""
    attempts: dict[int, dict[str, Any]] = {}

    def of(n: int) -> dict[str, Any]:
        a = attempts.get(n)
        if a is None:
            a = attempts[n] = {
                "attempt": n,
                "admitted_at": None,
                "started_at": None,
                "ended_at": None,
                "ended_how": None,
                "preempted_by": None,
                "lost_gpu_hours": None,
                "checkpoint_at": None,
                "lost_note": None,
            }
        return a

    for e in events:
        to, n, data = e["to_status"], e["attempt"], e["data"] or {}
        if to == JobState.ADMITTED:
            of(n)["admitted_at"] = e["at"]
        elif to == JobState.RUNNING:
            of(n)["started_at"] = e["at"]
        elif to == JobState.QUEUED and e["from_status"] in (JobState.ADMITTED, JobState.RUNNING):
            # Handed back before it ran: the event carries the new attempt (n).
            if n - 1 in attempts and attempts[n - 1]["ended_how"] is None:
                lost = data.get("ended_how") == "node_lost" or str(e["reason"]).startswith(
                    "its cluster workload"
                )
                _end(attempts[n - 1], e["at"],
                     "cluster_unreachable" if data.get("ended_how") == "cluster_unreachable"
                     else "node_lost" if lost else "requeued")
        elif to in _ENDS and n in attempts and attempts[n]["ended_how"] is None:
            how = _ENDS[to]
            if data.get("rule") == "U3":
                how = "reclaimed"
            elif data.get("ended_how") in ("spot_reclaimed", "cluster_unreachable"):
                how = str(data["ended_how"])  # rules K6 (its spot node) and K5 (its cluster)
            elif data.get("ended_how") == "node_lost" or str(e["reason"]).startswith("its cluster workload"):
                how = "node_lost"
            a = _end(attempts[n], e["at"], how)
            if how == "preempted" and "preemptor" in data:
                a["preempted_by"] = {
                    "job": data.get("preemptor"),
                    "team": data.get("preemptor_team"),
                    "tier": data.get("preemptor_tier"),
                }
            if how == "preempted":
                a["lost_gpu_hours"] = data.get("lost_gpu_hours")
                a["checkpoint_at"] = data.get("checkpoint_at")
                a["_stopped_at"] = e["at"]
    out = []
    gpus = job.gpu_share  # shared GPUs: a fraction's share of one GPU
    for n in sorted(attempts):
        a = attempts[n]
        charge = charged.get((job.pk, n))
        if a["ended_how"] is None:
            a["ended_how"] = "running" if a["started_at"] is not None else "admitted"
        if n == job.attempt and job.started_at is not None:
            a["started_at"] = job.started_at
        if n == job.attempt and job.finished_at is not None and a["ended_at"] is not None:
            a["ended_at"] = job.finished_at
        if charge is not None:
            a["gpu_hours"], a["charged"] = charge[0] / 3600.0, True
            a["started_at"], a["ended_at"] = charge[1], charge[2]
            if a["ended_how"] == "preempted" and charge[3] is not None:
                a["lost_gpu_hours"] = charge[3]  # the record is what a grace lowers
        elif a["ended_how"] == "running" and a["started_at"] is not None:
            ran = max(0.0, (now - a["started_at"]).total_seconds())
            a["gpu_hours"], a["charged"] = gpus * ran / 3600.0, False
        else:
            a["gpu_hours"], a["charged"] = 0.0, a["ended_at"] is not None
        stopped = a.pop("_stopped_at", None)
        if a["ended_how"] == "preempted" and stopped is not None:
            if a["lost_gpu_hours"] is None:
                a["lost_gpu_hours"] = 0.0 if a["started_at"] is None else None
            a["lost_note"] = lost_note(a["lost_gpu_hours"], stopped=stopped,
                                       checkpoint_at=parse_instant(a["checkpoint_at"]))
        for k in ("admitted_at", "started_at", "ended_at"):
            a[k] = a[k].isoformat() if a[k] is not None else None
        out.append(a)
    return out


def _end(a: dict[str, Any], at: datetime, how: str) -> dict[str, Any]:
    a["ended_at"], a["ended_how"] = at, how
    return a


def parse_instant(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _ago(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def lost_note(lost: float | None, *, stopped: datetime,
              checkpoint_at: datetime | None) -> str:
    """What a preemption cost, in words: "preempted, nothing lost: checkpoint 4 s
    before", "... checkpoint 3 s into its grace", "preempted, 1.25 GPU-h lost since the
    checkpoint 20 min before", "preempted, 2.00 GPU-h lost (no checkpoint)"."""
    if lost is None:
        return "preempted (loss not recorded)"
    if checkpoint_at is not None:
        gap = (stopped - checkpoint_at).total_seconds()
        when = (f"checkpoint {_ago(gap)} before" if gap >= 0
                else f"checkpoint {_ago(gap)} into its grace")
        if lost <= 0:
            return f"preempted, nothing lost: {when}"
        return f"preempted, {lost:.2f} GPU-h lost since the {when}"
    if lost <= 0:
        return "preempted, nothing lost: it had not started"
    return f"preempted, {lost:.2f} GPU-h lost (no checkpoint)"
