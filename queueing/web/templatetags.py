"""Small formatting filters of the web pages."""

from __future__ import annotations

from datetime import datetime
from fractions import Fraction
from typing import Any

from django import template
from django.utils import timezone

from queueing import validation as v
from queueing.selectors.clusters import cluster_name, node_short_name

register = template.Library()


@register.filter
def duration(seconds: float | int | None) -> str:
    """1h 02m, 3m 05s, 12s."""
    if seconds is None:
        return "—"
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h}h {m:02d}m"
    if m:
        return f"{m}m {sec:02d}s"
    return f"{sec}s"


@register.filter
def ago(when: datetime | None, now: datetime | None = None) -> str:
    """"just now", "5 minutes ago", "2 hours, 3 minutes ago"."""
    if when is None:
        return "—"
    now = now or timezone.now()
    seconds = int((now - when).total_seconds())
    if seconds < 60:
        return "just now"
    # Cheaper than `timesince` (this runs for every row of the dashboard's tables).
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = seconds // size
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return "just now"


@register.filter
def since(when: datetime | None, now: datetime | None = None) -> str:
    """How long from `when` to `now` as a duration ("12m 05s", "2h 03m"): a job's wait."""
    if when is None:
        return "—"
    return duration(max(0.0, ((now or timezone.now()) - when).total_seconds()))


@register.filter
def gpus(job: Any) -> str:
    """A job's GPUs, written one way on every page: replicas × GPUs per replica, type
    ("2 × 4 h100"); while a job accepting several GPU types waits, each of them
    ("2 × 4 h100 or a100"), once admitted the type chosen."""
    if job.gpu_slices:
        return f"{job.replicas} × {fraction(job)} {job.gpu_type.slug}"
    types = job.gpu_types or ()
    if job.status == "QUEUED" and len(types) > 1:
        return f"{job.replicas} × {job.gpus_per_replica} {' or '.join(map(str, types))}"
    return f"{job.replicas} × {job.gpus_per_replica} {job.gpu_type.slug}"


@register.filter
def fraction(job: Any) -> str:
    """A fraction of a shared GPU as people read it: "0.5 GPU (2 of 4 slices,
    time-sliced)"; "" for whole GPUs."""
    if not job.gpu_slices:
        return ""
    per = job.gpu_type.slices_per_gpu
    return (f"{v.gpus_text(Fraction(job.gpu_slices, per))} GPU ({job.gpu_slices} of {per} "
            f"slices, {job.gpu_type.sharing})")


@register.filter
def gpu_amount(value: Any) -> str:
    """GPUs as a number: 8, 0.25, 2.75 (shared GPUs)."""
    try:
        return v.gpus_text(float(value))
    except (TypeError, ValueError):
        return str(value)


@register.filter
def tier_name(tier: Any) -> str:
    """A tier as people know it: its name, else its slug."""
    return str(getattr(tier, "name", "") or tier.slug)


@register.filter
def runtime(job: Any, now: datetime) -> str:
    return duration(job.runtime_seconds(now))


@register.filter
def pct(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{100 * value:.1f}%"


@register.filter
def factor_label(name: str) -> str:
    """fair_share -> Fair share."""
    return name.replace("_", " ").capitalize()


@register.filter
def node_name(node: Any) -> str:
    """A node's own name, without the "<cluster>/" the policy qualifies it with (the page
    shows its cluster above it)."""
    return node_short_name(node)


@register.filter
def cluster_of(job: Any) -> str:
    """The name of the cluster the job's attempt runs in (rule K1), "" when none: from a
    per-process memo, so a table of jobs reads no cluster row."""
    return cluster_name(getattr(job, "cluster_id", None)) or ""
