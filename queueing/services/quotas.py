"""Quota and GPU type sharing changes (staff only: `quota_set` and `gpu_type_sharing_set`
check their actor, as every front end does)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from accounts.models import Team
from accounts.services import audited_upsert, hierarchy_lock
from queueing import validation as v
from queueing.errors import DomainError
from queueing.models import GpuType, Quota
from queueing.selectors.gpu_share import gpu_type_jobs_not_final
from queueing.selectors.quota_tree import carve_problems

from .access import check_staff

_UNSET: Any = object()


@transaction.atomic
def quota_set(
    *, actor: Any, team: Team, gpu_type: GpuType, nominal: int | None = None,
    borrowing_limit: int | None = _UNSET, lending_limit: int | None = _UNSET,
) -> tuple[Quota, bool]:
    """Create or update the quota of `team` for `gpu_type`, audited field by field.
    Returns (quota, created). Fields not given keep their value. Staff only
    (`actor=None`: fairq itself).

    Rule Q8: a nominal that makes a department's children's nominals pass the
    department's own (this team's row, or a row above it) is refused: ValidationError on
    `nominal`, nothing written. Rule Q1's lending limit: `Quota.clean()`."""
    if actor is not None:
        check_staff(actor=actor, doing="change quotas")
    values: dict[str, Any] = {}
    if nominal is not None:
        values["nominal"] = nominal
    if borrowing_limit is not _UNSET:
        values["borrowing_limit"] = borrowing_limit
    if lending_limit is not _UNSET:
        values["lending_limit"] = lending_limit
    hierarchy_lock()  # rule Q8 checks the tree as the last change left it
    row = Quota.objects.filter(team=team, gpu_type=gpu_type).first()
    new_nominal = values.get("nominal", row.nominal if row is not None else 0)
    if row is None or row.nominal != new_nominal:
        problems = carve_problems(quota=(team.slug, gpu_type.slug, new_nominal))
        if problems:
            raise ValidationError({"nominal": problems})
    return audited_upsert(actor=actor, model=Quota,
                          lookup={"team": team, "gpu_type": gpu_type}, values=values)


@transaction.atomic
def gpu_type_sharing_set(*, actor: Any, gpu_type: GpuType, sharing: str | None = None,
                         slices_per_gpu: int | None = None) -> GpuType:
    """Shared GPUs: how one GPU of `gpu_type` is shared and its slices per GPU (staff;
    audited). `validation.gpu_sharing_problems` on the two together (exclusive: 1; mig,
    time-sliced, mps: 2-64); refused while jobs of the type are queued, admitted or
    running, whose slices (and whose nodes' units) are counted in them. DomainError
    (400) naming the field otherwise. A value not given keeps the type's."""
    if actor is not None:
        check_staff(actor=actor, doing="change GPU types")
    new_sharing = gpu_type.sharing if sharing is None else sharing
    new_slices = gpu_type.slices_per_gpu if slices_per_gpu is None else slices_per_gpu
    problems = v.gpu_sharing_problems(new_sharing, new_slices)
    if problems:
        raise DomainError("The request has invalid fields.",
                          fields={k: [m] for k, m in problems.items()})
    if (new_sharing, new_slices) == (gpu_type.sharing, gpu_type.slices_per_gpu):
        return gpu_type
    busy = gpu_type_jobs_not_final(gpu_type.pk)
    if busy:
        raise DomainError("The request has invalid fields.", fields={"sharing": [
            f"{busy} job{'s' if busy != 1 else ''} of {gpu_type.slug} "
            f"{'are' if busy != 1 else 'is'} queued, admitted or running: sharing and "
            "slices per GPU change only when none is (their slices are counted in them). "
            "Drain the type first, or add a new type."]})
    row, _ = audited_upsert(actor=actor, model=GpuType, lookup={"pk": gpu_type.pk},
                            values={"sharing": new_sharing, "slices_per_gpu": new_slices})
    return row
