"""What the policy needs to know about past preemptions (docs/scheduling.md, R5, R8),
read from the "preempted" and "preempting" events: no extra table. The cycle's snapshot
and every reader of the queue plan take them from here; the writes (rules R6-R7) are in
queueing/services/preemption.py.

    - `preemption_settings`  — rule R5: the rate limit, counted from the "preempted"
                               events of the window.
    - `nominated_preemptors` — rule R8: queued jobs whose victims may still hold GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings

from queueing.models import JobEvent
from queueing.policy.snapshot import PreemptionSettings
from queueing.policy.states import JobState


def preemption_settings(*, now: datetime) -> PreemptionSettings:
    """Rule R5: how many preemptions each team made in the current window."""
    window = timedelta(seconds=settings.FAIRQ_PREEMPTION_WINDOW_SECONDS)
    used: Counter[str] = Counter()
    rows = JobEvent.objects.filter(kind=JobEvent.Kind.PREEMPTED, at__gt=now - window).values_list(
        "data", flat=True)
    for data in rows:
        team = (data or {}).get("preemptor_team")
        if team:
            used[str(team)] += 1
    limit = settings.FAIRQ_PREEMPTION_MAX_PER_TEAM
    return PreemptionSettings(
        enabled=settings.FAIRQ_PREEMPTION_ENABLED,
        max_per_team=limit if limit >= 0 else None,
        used=dict(used),
        max_searches=settings.FAIRQ_PREEMPTION_MAX_SEARCHES,
    )


def nominated_preemptors(*, now: datetime, live_workloads: Iterable[str]) -> dict[int, int]:
    """Rule R8: queued jobs that preempted (for their current attempt, recently) mapped
    to how many of their victims' workloads may still hold GPUs.

    A victim's workload counts while the cluster still lists it, and, whatever the list
    says, during the termination grace after the preemption (a Kubernetes pod releases
    its GPUs only once it is gone, which the list may not show yet).
    """
    live = set(live_workloads)
    since = now - timedelta(seconds=settings.FAIRQ_PREEMPTION_NOMINATION_SECONDS)
    grace = timedelta(seconds=settings.FAIRQ_PREEMPTION_TERMINATION_GRACE_SECONDS)
    out: dict[int, int] = {}
    rows = JobEvent.objects.filter(
        kind=JobEvent.Kind.PREEMPTING, at__gte=since, job__status=JobState.QUEUED
    ).values_list("job_id", "attempt", "job__attempt", "at", "data")
    for job_id, attempt, current, at, data in rows:
        if attempt != current:
            continue
        names = [str(n) for n in (data or {}).get("workloads", [])]
        held = len(names) if now - at < grace else sum(1 for n in names if n in live)
        out[job_id] = max(out.get(job_id, 0), held)
    return out
