"""Preemption, the shell around the pure victim search (docs/scheduling.md, R5-R8).

    - `preemptions_apply`    — rules R6-R7: each victim RUNNING/ADMITTED → PREEMPTED →
                               QUEUED (attempt + 1, submit time kept, its GPU time
                               charged), events on both jobs. All victims of one
                               preemptor or none (a savepoint).
    - `preempted_workloads_stop` — after commit: the victims' workloads are stopped.

What the cycle reads for preemption (rules R5 and R8) is in queueing/selectors/preemption.py.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction

from queueing.backends.base import ClusterBackend
from queueing.models import FairShareAccumulator, Job, JobEvent
from queueing.policy import cycle
from queueing.policy.admission import Plan
from queueing.policy.bookings import Booking
from queueing.policy.preemption import Preemption, Victim
from queueing.policy.states import HOLDING_STATES, JobState

from .checkpoints import lost_gpu_hours
from .jobs import attempt_grace_seconds, job_transition, next_attempt
from .logs import workloads_stop_keeping_logs
from .usage import usage_record_attempt

log = logging.getLogger(__name__)


class _VictimMoved(Exception):
    """A victim changed state since the snapshot: drop this preemption, keep the rest."""


@dataclass
class Applied:
    preempted: list[int] = field(default_factory=list)
    # The victims' workloads: the caller stops them once the transaction has committed.
    workloads: list[str] = field(default_factory=list)


def preemptions_apply(*, plan: Plan, now: datetime) -> Applied:
    """Rules R6-R7 for every preemption of the plan, inside the caller's transaction.

    A preemption whose preemptor is no longer queued, or any of whose victims moved
    (finished, cancelled, taken by another cycle), is dropped whole (a savepoint).
    Returns the preempted job ids and the workloads to stop after commit
    (`preempted_workloads_stop`).
    """
    out = Applied()
    if not plan.preemptions:
        return out
    ids = {p.preemptor_id for p in plan.preemptions}
    ids |= {v.job_id for p in plan.preemptions for v in p.victims}
    jobs = Job.objects.select_related("team", "tier", "gpu_type").in_bulk(list(ids))
    # Charging victims locks their teams' accumulators. Take those locks up front in
    # team-id order, the order usage import and recompute use: taking them in victim
    # order could deadlock with those and roll back the whole apply.
    teams = sorted({jobs[v.job_id].team_id for p in plan.preemptions for v in p.victims
                    if v.job_id in jobs})
    list(FairShareAccumulator.objects.select_for_update().filter(team_id__in=teams)
         .order_by("team_id").values_list("pk", flat=True))
    for p in plan.preemptions:
        preemptor = jobs.get(p.preemptor_id)
        # Rule W2: a booking empties its GPUs at its start with no preemptor job.
        by_booking = p.booking is not None and p.preemptor_id == 0
        if not by_booking and (preemptor is None or preemptor.state != JobState.QUEUED):
            continue
        try:
            with transaction.atomic():
                names = [
                    _preempt_one(jobs.get(v.job_id), victim=v, preemptor=preemptor,
                                 owed=p.owed, now=now, booking=p.booking)
                    for v in p.victims
                ]
                if preemptor is not None:
                    _record_preemptor(preemptor, p, names=names, now=now)
        except _VictimMoved:
            continue
        out.preempted.extend(v.job_id for v in p.victims)
        out.workloads.extend(names)
    return out


def preempted_workloads_stop(*, backend: ClusterBackend, names: list[str],
                             now: datetime) -> None:
    """Stop the victims' workloads (after the commit that requeued their jobs), their
    logs read concurrently first (services/logs.py, `workloads_stop_keeping_logs`).

    A stop that fails is retried by the next cycle's reconcile: the workload's attempt no
    longer matches its job's, so it is an orphan and is stopped again.
    """
    failed = workloads_stop_keeping_logs(backend=backend, names=names, now=now)
    for name, exc in failed.items():
        log.warning("stopping preempted workload %s failed; the next cycle retries",
                    name, exc_info=exc)


def _preempt_one(job: Job | None, *, victim: Victim, preemptor: Job | None, owed: bool,
                 now: datetime, booking: Booking | None = None) -> str:
    """Rules R6-R7 for one victim; returns the workload name to stop. `owed`: for a
    claim within its team's nominal quota (rule R11), which the event says. `booking`:
    made for a booking (rules W2, W4; no `preemptor` when the booking's start empties
    its GPUs), which the event says."""
    if job is None or job.state not in HOLDING_STATES:
        raise _VictimMoved
    workload = job.backend_name
    # The work it loses (docs/api.md, "Checkpoints and graceful stop"): from its newest
    # checkpoint, or its start; a checkpoint reported during the grace lowers it
    # (services/checkpoints.py). Its pods get `grace_seconds` and its stop signal first.
    grace = attempt_grace_seconds(job)
    lost = lost_gpu_hours(gpus=job.gpu_share, started_at=job.started_at, stopped_at=now,
                          checkpoint_at=job.checkpointed_at)
    data: dict[str, Any] = {
        "rule": str(victim.rule), "owed": owed,
        "workload": workload, "grace_seconds": grace, "stop_signal": job.stop_signal,
        "lost_gpu_hours": round(lost, 6),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "checkpoint_at": job.checkpointed_at.isoformat() if job.checkpointed_at else None,
    }
    if preemptor is not None:  # rule W2's has none: the attempt shows no "preempted by"
        data.update(preemptor=preemptor.pk, preemptor_team=preemptor.team.slug,
                    preemptor_tier=preemptor.tier.slug)
    if booking is not None:  # rules W2, W4
        data.update(booking=booking.id, booking_team=booking.team)
    reason = _victim_reason(victim, preemptor, owed, booking)
    if not job_transition(job, JobState.PREEMPTED, now=now, reason=reason, data=data):
        raise _VictimMoved
    # Rule R6 (the pure rule the simulator runs too): the next attempt, the submit time
    # kept (`created_at` is not touched), the GPU time charged to the attempt that used it.
    requeued = cycle.requeue_victim(
        attempt=job.attempt, submitted_at=job.created_at, started_at=job.started_at, now=now,
        gpus=job.gpu_share, billing_weight=job.gpu_type.billing_weight)
    if requeued.charge is not None:
        usage_record_attempt(job=job, start=requeued.charge.start, end=requeued.charge.end,
                             lost_gpu_hours=lost)
    JobEvent.objects.create(job=job, at=now, kind=JobEvent.Kind.PREEMPTED, actor_label="scheduler",
                            reason=reason, attempt=job.attempt, data=data)
    if not job_transition(
        job, JobState.QUEUED, now=now, data=data,
        reason="requeued after preemption; keeps its submit time",
        **next_attempt(requeued.attempt),
    ):
        raise _VictimMoved
    return workload


def _victim_reason(victim: Victim, preemptor: Job | None, owed: bool,
                   booking: Booking | None) -> str:
    """A victim's event reason: who preempted it, by which rule."""
    if booking is not None and preemptor is None:  # rule W2
        return (f"preempted: its {booking.gpu_type} GPUs are booked for team {booking.team} "
                f"from {booking.start:%Y-%m-%d %H:%M} to {booking.end:%Y-%m-%d %H:%M} UTC "
                f"(booking #{booking.id}, rule W2)")
    assert preemptor is not None
    return (f"preempted by job #{preemptor.pk} of team {preemptor.team.slug} "
            f"(tier {preemptor.tier.slug}) under rule {victim.rule}"
            + (", owed its team's nominal GPUs (rule R11)" if owed else "")
            + (f", taking back GPUs booked for it (booking #{booking.id}, rule W4)"
               if booking is not None else ""))


def _record_preemptor(preemptor: Job, p: Preemption, *, names: list[str],
                      now: datetime) -> None:
    """Rule R7 on the preemptor: which jobs it preempted, by which rules (and, for rule
    R8, which workloads must go before it is admitted)."""
    JobEvent.objects.create(
        job=preemptor, at=now, kind=JobEvent.Kind.PREEMPTING, actor_label="scheduler",
        reason=_preempting_reason(p.victims),
        attempt=preemptor.attempt,
        data={"victims": [v.job_id for v in p.victims],
              "rules": {str(v.job_id): str(v.rule) for v in p.victims}, "owed": p.owed,
              "workloads": names, "placement": list(p.placement)},
    )


_REASON_MAX = JobEvent._meta.get_field("reason").max_length or 500


def _preempting_reason(victims: tuple[Victim, ...] | list[Victim]) -> str:
    """The preemptor's event reason: the victims that fit in the column, then how many
    more (every one is in the event's `data`). A gang preempting many small jobs once
    made a reason longer than the column, and the whole cycle's preemptions failed."""
    head, tail = f"preempted {len(victims)} job(s) to fit: ", "; admitted once their GPUs are free"
    parts = [f"#{v.job_id} ({v.team}, {v.rule})" for v in victims]
    for shown in range(len(parts), -1, -1):
        more = len(parts) - shown
        listing = ", ".join(parts[:shown]) + (f" and {more} more" if more else "")
        if len(head) + len(listing) + len(tail) <= _REASON_MAX:
            return head + listing + tail
    return (head + tail)[:_REASON_MAX]
