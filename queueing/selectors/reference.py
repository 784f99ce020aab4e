"""Reads of the reference rows staff keep (GPU types, tiers) and of quotas, as the pages
and the API list them. The submit path's own lookups are `lookups` (kept per process)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from queueing.models import GpuType, Quota, Tier


def all_gpu_types() -> QuerySet[GpuType]:
    """Every GPU type (the model's order): lists, and a serializer field's choices."""
    return GpuType.objects.all()


def gpu_types_by_slug_order() -> QuerySet[GpuType]:
    return GpuType.objects.order_by("slug")


def gpu_type_by_slug(*, slug: str) -> GpuType | None:
    return GpuType.objects.filter(slug=slug).first()


def all_tiers() -> QuerySet[Tier]:
    """Every tier (the model's order): lists, and a serializer field's choices."""
    return Tier.objects.all()


def tiers_by_rank() -> QuerySet[Tier]:
    """Tiers, highest rank (scheduled first) first."""
    return Tier.objects.order_by("-rank")


def quotas_of_teams(*, teams: QuerySet[Any]) -> QuerySet[Quota]:
    """The quotas of `teams` (a queryset: one query, a subquery), team and GPU type
    loaded."""
    return Quota.objects.filter(team__in=teams).select_related("team", "gpu_type")


def quota_of_teams(*, quota_id: int, teams: QuerySet[Any]) -> Quota | None:
    """The quota if it is one of `teams`'; None otherwise, so callers answer 404."""
    return (Quota.objects.filter(pk=quota_id, team__in=teams)
            .select_related("team", "gpu_type").first())
