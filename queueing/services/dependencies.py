"""Job dependencies (docs/scheduling.md, rules D1-D3): the submit check, changing a queued
job's dependencies, and the cycle's failing of jobs whose dependencies can never be met.
Whether a dependency is met is the policy's (`queueing/policy/dependencies.py`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.models import Team
from queueing.errors import DomainError, InvalidTransition
from queueing.models import Job, JobArray, JobEvent
from queueing.policy.dependencies import (
    Dependency,
    dependencies_stored,
    dependency_cycle,
    parse_dependencies,
)
from queueing.policy.states import JobState
from queueing.selectors.queue_plan import queue_plan_forget

from .access import check_job_access
from .jobs import INVALID_FIELDS, JobInput, job_transition

# A cycle check walks at most this many jobs (a graph larger than that is refused).
MAX_DEPENDENCY_WALK = 100_000


def dependencies_checked(
    *, team: Team, dependencies: object, job_id: int | None = None
) -> list[dict[str, object]]:
    """Rule D3: the dependencies in their stored form, each naming a job or an array of
    `team` (another team's and one that does not exist get the same answer: no
    disclosure); for an existing job (`job_id`), none that leads back to it. DomainError
    (400) on `dependencies` otherwise."""
    try:
        deps = parse_dependencies(dependencies)
    except ValueError as exc:
        raise DomainError(INVALID_FIELDS, fields={"dependencies": [str(exc)]}) from None
    if not deps:
        return []
    job_ids = {d.job for d in deps if d.job is not None}
    array_ids = {d.array for d in deps if d.array is not None}
    found_jobs = set(Job.objects.filter(team=team, pk__in=job_ids).values_list("pk", flat=True))
    found_arrays = set(JobArray.objects.filter(team=team, pk__in=array_ids).values_list("pk", flat=True))
    unknown = [
        d.label
        for d in deps
        if (d.job is not None and d.job not in found_jobs)
        or (d.array is not None and d.array not in found_arrays)
    ]
    if unknown:
        raise DomainError(
            INVALID_FIELDS,
            fields={"dependencies": [f"Unknown {', '.join(unknown)}, or not of team {team.slug}."]},
        )
    if job_id is not None:
        if job_id in job_ids:
            raise DomainError(
                INVALID_FIELDS, fields={"dependencies": [f"Job {job_id} cannot depend on itself."]}
            )
        cycle = dependency_cycle(job_id, _edges_from(job_id, deps))
        if cycle is not None:
            raise DomainError(
                INVALID_FIELDS,
                fields={
                    "dependencies": [
                        "These dependencies would make a cycle: "
                        + " -> ".join(f"job {j}" for j in cycle)
                        + " (rule D3)."
                    ]
                },
            )
    return dependencies_stored(deps)


def job_input_with_dependencies(data: JobInput, dependencies: object) -> JobInput:
    """`data` with its dependencies checked (rule D3) and set; `data` itself when none."""
    stored = dependencies_checked(team=data.team, dependencies=dependencies)
    return dataclasses.replace(data, dependencies=stored) if stored else data


def _edges_from(job_id: int, deps: Iterable[Dependency]) -> dict[int, set[int]]:
    """The dependency graph reachable from `job_id` with its new `deps` (arrays expanded
    to their members), read level by level: two queries per level."""
    edges: dict[int, set[int]] = {}
    edges[job_id] = _targets(list(deps))
    frontier = set(edges[job_id]) - {job_id}
    while frontier:
        if len(edges) > MAX_DEPENDENCY_WALK:
            raise DomainError(
                INVALID_FIELDS,
                fields={
                    "dependencies": [
                        f"The jobs these depend on depend on more than {MAX_DEPENDENCY_WALK} others."
                    ]
                },
            )
        rows = dict(Job.objects.filter(pk__in=frontier).values_list("pk", "dependencies"))
        parsed: dict[int, list[Dependency]] = {}
        for pk, stored in rows.items():
            try:
                parsed[pk] = list(parse_dependencies(stored))
            except ValueError:
                parsed[pk] = []  # a row older than the check: it waits for nothing
        arrays = {d.array for ds in parsed.values() for d in ds if d.array is not None}
        members: dict[int, set[int]] = {}
        for array_id, pk in Job.objects.filter(array_id__in=arrays).values_list("array_id", "pk"):
            members.setdefault(array_id, set()).add(pk)
        nxt: set[int] = set()
        for pk in frontier:
            targets = _targets(parsed.get(pk, []), members)
            edges[pk] = targets
            nxt |= targets
        frontier = nxt - set(edges)
    return edges


def _targets(deps: list[Dependency], members: dict[int, set[int]] | None = None) -> set[int]:
    out: set[int] = set()
    arrays = [d.array for d in deps if d.array is not None]
    if members is None and arrays:
        members = {}
        for array_id, pk in Job.objects.filter(array_id__in=arrays).values_list("array_id", "pk"):
            members.setdefault(array_id, set()).add(pk)
    for d in deps:
        if d.job is not None:
            out.add(d.job)
        elif members is not None and d.array is not None:
            out |= members.get(d.array, set())
    return out


@transaction.atomic
def job_dependencies_set(*, actor: Any, job: Job, dependencies: object, now: datetime | None = None) -> Job:
    """Replace a queued job's dependencies (like `scontrol update dependency=`): rule D3's
    checks, a cycle included; a `dependencies` event in the same transaction. A job that
    is not queued is an InvalidTransition (409)."""
    now = now or timezone.now()
    check_job_access(actor=actor, job_id=job.pk)
    job = Job.objects.select_for_update().select_related("team").get(pk=job.pk)
    if job.state != JobState.QUEUED:
        raise InvalidTransition(f"job {job.pk} is {job.status}; only a queued job's dependencies can change")
    stored = dependencies_checked(team=job.team, dependencies=dependencies, job_id=job.pk)
    before = job.dependencies
    Job.objects.filter(pk=job.pk).update(dependencies=stored, updated_at=now)
    job.dependencies, job.updated_at = stored, now
    JobEvent.objects.create(
        job=job,
        at=now,
        kind=JobEvent.Kind.DEPENDENCIES,
        actor_label=str(actor),
        actor=actor if getattr(actor, "is_authenticated", False) else None,
        reason="dependencies changed",
        attempt=job.attempt,
        data={"from": before, "to": stored},
    )
    transaction.on_commit(queue_plan_forget)
    return job


NEVER_MET = "dependency_never_met"


def dependencies_fail_never_met(*, never_met: dict[int, str] | Any, now: datetime) -> list[int]:
    """Rule D2 (the cycle's step 4): each queued job whose dependencies can never be met
    goes QUEUED -> FAILED with message `dependency_never_met` and the reason, one
    compare-and-swap and event each. Returns the ids failed."""
    failed: list[int] = []
    if not never_met:
        return failed
    jobs = Job.objects.in_bulk(list(never_met))
    for job_id, why in sorted(never_met.items()):
        job = jobs.get(job_id)
        if job is None or job.state != JobState.QUEUED:
            continue
        with transaction.atomic():
            if job_transition(
                job,
                JobState.FAILED,
                now=now,
                finished_at=now,
                reason=f"{why} (rule D2)",
                message=NEVER_MET,
                data={"code": NEVER_MET, "rule": "D2"},
            ):
                failed.append(job_id)
    return failed
