"""Reads of array jobs (`JobArray`), scoped like jobs: a member of the team, or staff."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, F

from queueing.errors import NotFound
from queueing.models import GpuType, Job, JobArray, Tier
from queueing.policy.dependencies import dependency_verdict, parse_dependencies
from queueing.policy.states import FINAL_STATES, HOLDING_STATES, JobState

from .snapshot import dependency_counts


def array_get_for_actor(*, actor: Any, array_id: int) -> JobArray:
    """The array if `actor` may see it (a member of its team, or staff); NotFound (404)
    otherwise, the same answer as for an array that does not exist."""
    qs = JobArray.objects.select_related("team", "created_by")
    if not actor.is_staff:
        qs = qs.filter(team__memberships__user=actor)
    array = qs.filter(pk=array_id).first()
    if array is None:
        raise NotFound(f"array {array_id} not found")
    return array


def array_summary(array: JobArray) -> dict[str, Any]:
    """The array with its members counted by state (one query): `counts` has every state
    (0 included), the members not yet written as rows among QUEUED (CANCELLED once the
    rest was cancelled: docs/scheduling.md "Arrays"), `active` the members holding GPUs (rule A8 counts
    these), `ended` the final ones, `done` whether all have ended; `materialized` how
    many members are rows, `events` the array's own history."""
    counts = {s.value: 0 for s in JobState}
    for state, n in (
        array.members.order_by().values_list("status").annotate(n=Count("id")).values_list("status", "n")
    ):
        counts[state] = n
    counts[JobState.QUEUED.value] += array.unmaterialized
    counts[JobState.CANCELLED.value] += array.never_materialized
    ended = sum(counts[s.value] for s in FINAL_STATES)
    return {
        "id": array.pk,
        "team": array.team.slug,
        "name": array.name,
        "count": array.count,
        "max_running": array.max_running,
        "created_by": array.created_by.username if array.created_by else None,
        "created_at": array.created_at.isoformat(),
        "counts": counts,
        "active": sum(counts[s.value] for s in HOLDING_STATES),
        "ended": ended,
        "done": ended == array.count,
        "materialized": array.materialized,
        "events": list(array.events),
    }


def arrays_unwritten() -> list[tuple[str, str, str, int, int]]:
    """The queued members of arrays not yet written as rows, per (team slug,
    GPU type slug, tier slug): (team, gpu type, tier, members, GPUs), for the counts of
    queued jobs and GPUs that read rows (the dashboard, the quota board, /metrics). One
    query over the arrays with such members, two for the slugs when there are any."""
    rows = list(JobArray.objects.filter(rest_cancelled_at__isnull=True,
                                        materialized__lt=F("count"))
                .values_list("team__slug", "count", "materialized", "spec"))
    if not rows:
        return []
    gpu_types = dict(GpuType.objects.values_list("pk", "slug"))
    tiers = dict(Tier.objects.values_list("pk", "slug"))
    out: dict[tuple[str, str, str], list[int]] = {}
    for team, count, materialized, spec in rows:
        rest = count - materialized
        gpus = int(spec.get("gpus_per_replica") or 1) * int(spec.get("replicas") or 1)
        key = (team, gpu_types.get(spec.get("gpu_type_id"), "?"),
               tiers.get(spec.get("tier_id"), "?"))
        acc = out.setdefault(key, [0, 0])
        acc[0] += rest
        acc[1] += rest * gpus
    return [(t, g, tier, n, gp) for (t, g, tier), (n, gp) in sorted(out.items())]


def job_array(job: Job) -> JobArray | None:
    """The array `job` is a member of (None: none), for its page."""
    if job.array_id is None:
        return None
    return JobArray.objects.filter(pk=job.array_id).first()


def job_dependencies(job: Job) -> list[dict[str, Any]]:
    """The job's dependencies for its page: each with its target ("job 12", "array 7"),
    kind, and whether it is met, waited for or never met now (rules D1-D2)."""
    try:
        deps = parse_dependencies(job.dependencies)
    except ValueError:
        return []
    if not deps:
        return []
    counts = dependency_counts(deps)
    return [{"kind": str(d.kind), "job": d.job, "array": d.array, "label": d.label,
             "verdict": str(dependency_verdict(d.kind, counts.get(d.target)))}
            for d in deps]


def array_reload(*, array: JobArray) -> None:
    """`array` as stored now."""
    array.refresh_from_db()
