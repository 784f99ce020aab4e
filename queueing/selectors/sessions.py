"""Reads of notebook sessions (docs/sessions.md): the lists and the one row every front end
shows (API, CLI through the API, the dashboard's "My sessions", the session page)."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet

from queueing.models import Job, NotebookSession
from queueing.policy.costs import cost_pieces, money
from queueing.policy.states import FINAL_STATES, JobState

from .costs import currency, price_lists
from .jobs import jobs_visible_to

LAB_PATH = "/sessions/{id}/lab/"
PAGE_PATH = "/sessions/{id}/"


def sessions_visible_to(*, actor: Any, mine: bool = True) -> QuerySet[Job]:
    """Session jobs `actor` may see (their team's, staff every one), newest first; with
    `mine`, only those `actor` started."""
    qs = jobs_visible_to(actor=actor).filter(notebook__isnull=False).select_related(
        "notebook", "notebook__owner")
    if mine:
        qs = qs.filter(notebook__owner=actor)
    return qs.order_by("-pk")


def session_live(job: Job) -> bool:
    return job.state not in FINAL_STATES


def session_row(job: Job, *, now: datetime,
                prices: dict[int, Any] | None = None) -> dict[str, Any]:
    """One session as every front end shows it. `url` is the proxy's path of its
    JupyterLab (open while it runs); the token is never in it. `cost` counts its current
    attempt's GPU time so far at its type's price (rule C2), a fraction by its share;
    None without a price."""
    s: NotebookSession = job.notebook
    running = job.state == JobState.RUNNING
    start = job.started_at
    end = job.finished_at or now
    share = float(job.gpu_share)
    gpu_hours = 0.0
    cost: Decimal | None = None
    if start is not None and end > start:
        gpu_hours = (end - start).total_seconds() / 3600 * share
        plist = (prices if prices is not None else price_lists()).get(job.gpu_type_id, [])
        pieces = list(cost_pieces(gpus=1, start=start, end=end, prices=plist))
        priced = [(p.gpu_hours, p.price) for p in pieces if p.price is not None]
        if pieces and len(priced) == len(pieces):
            cost = money(sum((Decimal(str(h)) * price for h, price in priced), Decimal(0))
                         * Decimal(str(share)))
    stops_at = None
    if running and s.idle_since is not None:
        stops_at = s.idle_since + timedelta(minutes=s.idle_limit_minutes)
    limit_at = (start + timedelta(seconds=job.max_runtime_seconds)
                if start is not None and job.max_runtime_seconds else None)
    gpu_type = job.gpu_type
    if job.gpu_slices:
        gpu = f"{job.gpu_slices}/{gpu_type.slices_per_gpu} {gpu_type.slug}"
    else:
        gpu = f"{job.gpus_per_replica} {gpu_type.slug}"
    return {
        "id": job.pk, "team": job.team.slug, "name": job.name,
        "owner": s.owner.username if s.owner else None,
        "state": job.status, "message": job.message,
        "image": job.image, "gpu_type": gpu_type.slug,
        "gpus": share if job.gpu_slices else job.gpus_per_replica,
        "gpu_slices": job.gpu_slices, "slices_per_gpu": gpu_type.slices_per_gpu,
        "gpu_share": share, "gpu": gpu, "sharing": gpu_type.sharing,
        "memory_isolated": gpu_type.sharing in ("exclusive", "mig"),
        "url": LAB_PATH.format(id=job.pk) if running else None,
        "page": PAGE_PATH.format(id=job.pk),
        "ready": running and bool(s.host) and s.host_attempt == job.attempt,
        "root_dir": s.root_dir,
        "volumes": [v.get("pvc") for v in job.volumes or () if v.get("pvc")],
        "created_at": s.created_at, "started_at": start, "finished_at": job.finished_at,
        "age_seconds": max(0, int((now - s.created_at).total_seconds())),
        "idle_minutes": int(s.idle_minutes(now)) if running else 0,
        "idle_since": s.idle_since if running else None,
        "idle_limit_minutes": s.idle_limit_minutes,
        "warn_minutes": s.warn_lead_minutes,
        "warned_at": s.warned_at if running else None,
        "stops_at": stops_at, "time_limit_at": limit_at,
        "max_runtime_seconds": job.max_runtime_seconds,
        "last_activity_at": s.last_activity_at, "last_checked_at": s.last_checked_at,
        "check_error": s.check_error,
        "culled_at": s.culled_at,
        "gpu_hours": round(gpu_hours, 4),
        "cost": None if cost is None else str(cost), "currency": currency(),
    }


def session_rows(jobs: QuerySet[Job] | list[Job], *, now: datetime) -> list[dict[str, Any]]:
    prices = price_lists()
    return [session_row(j, now=now, prices=prices) for j in jobs]
