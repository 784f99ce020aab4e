"""Where every queued job stands and why it waits (rule P3), for everyone who asks: the
API's job detail, the CLI's `fairq prio`, the dashboard's queue and job pages.

One admission plan of the whole queue (the scheduler's own snapshot and policy) answers
all of them, cached for `QUEUE_PLAN_TTL` seconds in the shared cache: planning costs
O(queue) and pollers ask about many jobs. A scheduler cycle that changed something drops
the cached plan, and a job missing from it (queued since) gets one fresh plan, so an
answer is at most one cycle old.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.cache import cache

from queueing.cluster import cluster_view
from queueing.policy.admission import plan_admissions
from queueing.policy.explain import PlanEntry, explain_queue

QUEUE_PLAN_TTL = 3.0  # seconds: about one scheduler cycle
_PLAN_KEY = "fairq:queue-plan"


@dataclass(frozen=True)
class QueuePlan:
    """Rule P3 for the whole queue, from one admission plan. `entries`: job id ->
    `PlanEntry` (named tuples: see there)."""

    entries: dict[int, PlanEntry]
    queued: int
    error: str = ""

    def position(self, job_id: int) -> int | None:
        e = self.entries.get(job_id)
        return None if e is None else e.position

    def reasons(self, job_id: int) -> list[dict[str, str]]:
        e = self.entries.get(job_id)
        if e is None:
            return []
        return [{"code": r.code, "message": r.message} for r in e.reasons()]

    def standing(self, job_id: int) -> dict[str, Any] | None:
        """The `queue` part of a job's detail (position, jobs ahead, reasons)."""
        e = self.entries.get(job_id)
        if e is None:
            return None
        return {"position": e.position, "ahead": e.ahead, "ahead_same_gpu_type": e.ahead_same_gpu_type,
                "queued": self.queued, "reasons": self.reasons(job_id)}


def queue_plan(*, now: datetime, fresh: bool = False) -> QueuePlan:
    """The plan of the queue as it is (from the cache unless `fresh`). A cluster that does
    not answer gives an empty plan with `error` set, never a failed request."""
    if not fresh:
        cached: QueuePlan | None = cache.get(_PLAN_KEY)
        if cached is not None:
            return cached
    from .scheduler import build_snapshot

    view = cluster_view(now=now)
    if view.published_at is None and view.error:
        return QueuePlan({}, 0, error=view.error[:200])
    try:
        snapshot = build_snapshot(backend=view, now=now, live_workloads=set(view.workloads))
    except Exception as exc:  # a broken view must not break a page or a poll
        return QueuePlan({}, 0, error=str(exc)[:200])
    plan = plan_admissions(snapshot)
    by_id = {q.id: q for q in snapshot.queued}
    order = [by_id[i] for i in plan.order if i in by_id]  # the order the pass used (P2, F6)
    seen = {q.id for q in order}
    order += [q for q in snapshot.queued if q.id not in seen]
    admitted = {a.job_id for a in plan.admissions}
    waits = {job_id: (str(w.reason), w.message or str(w.reason))
             for job_id, w in plan.waits.items()}
    explained = explain_queue(order, waits=waits, admitted=admitted)
    entries: dict[int, PlanEntry] = {}
    for q in order:
        x = explained[q.id]
        code, message = ("next_cycle", "") if q.id in admitted else waits.get(q.id, ("", ""))
        entries[q.id] = PlanEntry(x.position, x.ahead_same_gpu_type, q.team, q.gpu_type, code, message)
    # Jobs of teams whose namespace is not provisioned stay out of the plan: after the rest.
    if view.unprovisioned:
        from queueing.models import Job
        from queueing.policy.states import JobState

        waiting = Job.objects.filter(status=JobState.QUEUED,
                                     team__slug__in=view.unprovisioned).order_by("created_at", "id")
        for n, (pk, team, gpu_type) in enumerate(
                waiting.values_list("id", "team__slug", "gpu_type__slug"), start=len(order) + 1):
            entries[pk] = PlanEntry(n, 0, team, gpu_type, "namespace_not_provisioned",
                                    f"the Kubernetes namespace of team {team} is not provisioned "
                                    "for fairq yet (an admin runs `manage.py sync_cluster`)")
    result = QueuePlan(entries, len(entries))
    cache.set(_PLAN_KEY, result, timeout=QUEUE_PLAN_TTL)
    return result


def queue_standing(*, job_id: int, now: datetime) -> dict[str, Any]:
    """Rule P3 for one queued job: its `QueuePlan.standing`, from the cached plan, or a
    fresh one when the job is newer than the cached plan; `cluster_unreachable` when the
    cluster does not answer."""
    plan = queue_plan(now=now)
    if job_id not in plan.entries and not plan.error:
        plan = queue_plan(now=now, fresh=True)
    if plan.error:
        return {"position": None, "ahead": None, "ahead_same_gpu_type": None, "queued": None,
                "reasons": [{"code": "cluster_unreachable",
                             "message": f"the cluster did not answer: {plan.error}"}]}
    return plan.standing(job_id) or {
        "position": None, "ahead": None, "ahead_same_gpu_type": None, "queued": plan.queued,
        "reasons": []}


def queue_plan_forget() -> None:
    """Drop the cached plan: after a scheduler cycle changed something, or a submit or
    cancel from the web (whose next page should show it)."""
    cache.delete(_PLAN_KEY)
