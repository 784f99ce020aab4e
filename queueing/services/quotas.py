"""Quota changes (staff only: `quota_set` checks its actor, as every front end does)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from accounts.models import Team
from accounts.services import audit_record, model_changes
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
    quota = Quota.objects.select_for_update().filter(team=team, gpu_type=gpu_type).first()
    created = quota is None
    before = None
    if quota is None:
        quota = Quota(team=team, gpu_type=gpu_type)
    else:
        before = Quota.objects.get(pk=quota.pk)
    if nominal is not None:
        quota.nominal = nominal
    if borrowing_limit is not _UNSET:
        quota.borrowing_limit = borrowing_limit
    if lending_limit is not _UNSET:
        quota.lending_limit = lending_limit
    quota.full_clean()
    quota.save()
    audit_record(actor=actor, action="create" if created else "update", instance=quota,
                 changes=model_changes(before, quota))
    return quota, created
