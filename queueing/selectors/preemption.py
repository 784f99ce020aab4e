"""What the policy needs to know about past preemptions (docs/scheduling.md, R5, R8),
read from the "preempted" and "preempting" events: no extra table. The cycle's snapshot
and every reader of the queue plan take them from here; the writes (rules R6-R7) are in
queueing/services/preemption.py.

    - `preemption_settings`  — rule R5: the rate limit, counted from the "preempted"
                               events of the window.
    - `nominated_preemptors` — rule R8: queued jobs whose victims may still hold GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings

from queueing.models import JobEvent
from queueing.policy import cycle
from queueing.policy.settings import PreemptionPolicy
from queueing.policy.snapshot import PreemptionSettings
from queueing.policy.states import JobState


def preemption_policy() -> PreemptionPolicy:
    """Rules R1-R8's settings: the policy's defaults (queueing/policy/settings.py) as the
    FAIRQ_PREEMPTION_* settings override them (-1 = no limit)."""
    limit = settings.FAIRQ_PREEMPTION_MAX_PER_TEAM
    per_job = settings.FAIRQ_PREEMPTION_MAX_PER_JOB
    ratio = settings.FAIRQ_PREEMPTION_LOST_PER_WAIT
    return PreemptionPolicy(
        enabled=settings.FAIRQ_PREEMPTION_ENABLED,
        max_per_team=limit if limit >= 0 else None,
        window_seconds=float(settings.FAIRQ_PREEMPTION_WINDOW_SECONDS),
        termination_grace_seconds=float(settings.FAIRQ_PREEMPTION_TERMINATION_GRACE_SECONDS),
        nomination_seconds=float(settings.FAIRQ_PREEMPTION_NOMINATION_SECONDS),
        max_searches=settings.FAIRQ_PREEMPTION_MAX_SEARCHES,
        max_preemptions_per_job=per_job if per_job >= 0 else None,
        lost_per_wait=ratio if ratio >= 0 else None,
    )


def preemption_settings(*, now: datetime) -> PreemptionSettings:
    """Rule R5: the settings with how many preemptions each team made in the current
    window (`cycle.preemptions_in_window` over the "preempted" events)."""
    policy = preemption_policy()
    window = timedelta(seconds=policy.window_seconds)
    made = []
    rows = JobEvent.objects.filter(kind=JobEvent.Kind.PREEMPTED, at__gt=now - window).values_list(
        "at", "data")
    for at, data in rows:
        team = (data or {}).get("preemptor_team")
        if team:
            made.append((at, str(team)))
    used = cycle.preemptions_in_window(made, now=now, window_seconds=policy.window_seconds)
    made_at: dict[str, list[datetime]] = {}
    for at, team in made:
        if 0 <= (now - at).total_seconds() < policy.window_seconds:
            made_at.setdefault(team, []).append(at)
    return PreemptionSettings.of(policy, used=used,
                                 made_at={t: tuple(sorted(a)) for t, a in made_at.items()})


def nominated_preemptors(*, now: datetime, live_workloads: Iterable[str]) -> dict[int, int]:
    """Rule R8: `nominations(...)`'s first part."""
    return nominations(now=now, live_workloads=live_workloads)[0]


def nominations(*, now: datetime, live_workloads: Iterable[str]
                ) -> tuple[dict[int, int], dict[int, tuple[str, ...]]]:
    """Rule R8: queued jobs that preempted (for their current attempt, recently) mapped
    to how many of their victims' workloads may still hold GPUs
    (`cycle.nominated_preemptors` over the "preempting" events); and rule E2: the
    placement each of those whose victims may still hold GPUs was planned on
    (`cycle.nominated_placements`, the events' `placement`). One query.

    A victim's workload counts while the cluster still lists it, and, whatever the list
    says, during the termination grace after the preemption (a Kubernetes pod releases
    its GPUs only once it is gone, which the list may not show yet).
    """
    policy = preemption_policy()
    since = now - timedelta(seconds=policy.nomination_seconds)
    rows = JobEvent.objects.filter(
        kind=JobEvent.Kind.PREEMPTING, at__gte=since, job__status=JobState.QUEUED
    ).values_list("job_id", "attempt", "job__attempt", "at", "data")
    found = []
    current: dict[int, int] = {}
    for job_id, attempt, job_attempt, at, data in rows:
        current[job_id] = job_attempt
        names = tuple(str(n) for n in (data or {}).get("workloads", []))
        placement = (data or {}).get("placement") or []
        found.append(cycle.Nomination(job_id, attempt, at, names,
                                      tuple(str(n) for n in placement)
                                      if isinstance(placement, list) else ()))
    nominated = cycle.nominated_preemptors(
        found, now=now, queued_attempts=current, live_workloads=live_workloads,
        grace_seconds=policy.termination_grace_seconds,
        nomination_seconds=policy.nomination_seconds)
    return nominated, cycle.nominated_placements(found, nominated)
