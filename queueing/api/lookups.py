"""Lookups on the submit path, kept to one query each or none.

GPU types and tiers are a handful of rows that change rarely (staff, in the admin): they
are read through the cache for `REFERENCE_TTL` seconds, so a submit does not pay two
database round trips for them. A renamed or added type is visible within that time.
"""

from __future__ import annotations

from typing import Any

from django.core.cache import cache

from accounts.models import Team
from queueing.models import GpuType, Tier

REFERENCE_TTL = 10


def _by_slug(model: type[GpuType] | type[Tier], key: str) -> dict[str, Any]:
    rows: dict[str, Any] | None = cache.get(key)
    if rows is None:
        rows = {row.slug: row for row in model.objects.all()}
        cache.set(key, rows, timeout=REFERENCE_TTL)
    return rows


def gpu_types_by_slug() -> dict[str, GpuType]:
    return _by_slug(GpuType, "fairq:ref:gpu-types")


def tiers_by_slug() -> dict[str, Tier]:
    return _by_slug(Tier, "fairq:ref:tiers")


def team_for_submitter(*, user: Any, slug: str) -> Team | None:
    """The team if `user` may submit to it (a member, or staff), in one query; None
    whether it does not exist or the user is not in it."""
    qs = Team.objects.filter(slug=slug)
    if not user.is_staff:
        qs = qs.filter(memberships__user=user)
    # The slug is unique: [:1], not first() (its ORDER BY costs CPU on every submit).
    return next(iter(qs[:1]), None)
