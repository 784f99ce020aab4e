"""Quota changes (staff only: `quota_set` checks its actor, as every front end does)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from accounts.models import Team
from accounts.services import audited_upsert
from queueing.models import GpuType, Quota

from .access import check_staff

_UNSET: Any = object()


@transaction.atomic
def quota_set(
    *, actor: Any, team: Team, gpu_type: GpuType, nominal: int | None = None,
    borrowing_limit: int | None = _UNSET, lending_limit: int | None = _UNSET,
) -> tuple[Quota, bool]:
    """Create or update the quota of `team` for `gpu_type`, audited field by field.
    Returns (quota, created). Fields not given keep their value. Staff only
    (`actor=None`: fairq itself)."""
    if actor is not None:
        check_staff(actor=actor, doing="change quotas")
    values: dict[str, Any] = {}
    if nominal is not None:
        values["nominal"] = nominal
    if borrowing_limit is not _UNSET:
        values["borrowing_limit"] = borrowing_limit
    if lending_limit is not _UNSET:
        values["lending_limit"] = lending_limit
    return audited_upsert(actor=actor, model=Quota,
                          lookup={"team": team, "gpu_type": gpu_type}, values=values)
