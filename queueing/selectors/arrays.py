"""Reads of array jobs (`JobArray`), scoped like jobs: a member of the team, or staff."""

from __future__ import annotations

from typing import Any

from django.db.models import Count

from queueing.errors import NotFound
from queueing.models import Job, JobArray
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
    (0 included), `active` the members holding GPUs (rule A8 counts these), `ended` the
    final ones, `done` whether all have ended."""
    counts = {s.value: 0 for s in JobState}
    for state, n in (
        array.members.order_by().values_list("status").annotate(n=Count("id")).values_list("status", "n")
    ):
        counts[state] = n
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
    }


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
