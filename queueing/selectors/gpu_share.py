"""Shared GPUs in GPU-equivalents (docs/scheduling.md, "Shared GPUs"): what a job holds
while it runs, as quotas shown, fair share, usage, costs and reports count it - a
fraction of a time-sliced or MPS GPU its slices / slices per GPU (a 0.25 job is charged
0.25 GPU-hour per hour), a MIG instance 1 / the profile's instances per GPU, whole GPUs
their number. `Job.gpu_share` for one row; `GPU_SHARE` for a queryset."""

from __future__ import annotations

from typing import Any

from django.db.models import Case, F, FloatField, When
from django.db.models.functions import Cast


def gpu_share_expression(prefix: str = "") -> Any:
    """The GPU-equivalents of the job row at `prefix` ("" for a Job queryset, "job__" for
    one of its related rows): replicas x (slices / S for a fraction; devices / S on a
    MIG type; devices otherwise), as a float."""
    def f(name: str) -> Any:
        return Cast(F(f"{prefix}{name}"), FloatField())

    per_replica = Case(
        When(**{f"{prefix}gpu_slices__gt": 0},
             then=f("gpu_slices") / f("gpu_type__slices_per_gpu")),
        When(**{f"{prefix}gpu_type__sharing": "mig"},
             then=f("gpus_per_replica") / f("gpu_type__slices_per_gpu")),
        default=f("gpus_per_replica"), output_field=FloatField())
    return per_replica * f("replicas")


GPU_SHARE = gpu_share_expression()


def device_share_expression(prefix: str = "") -> Any:
    """What the job row holds in its type's devices, as quotas count them (GPUs; a MIG
    type's instances): replicas x (slices / S for a fraction of a time-sliced or MPS
    GPU; devices per replica otherwise), as a float."""
    def f(name: str) -> Any:
        return Cast(F(f"{prefix}{name}"), FloatField())

    per_replica = Case(
        When(**{f"{prefix}gpu_slices__gt": 0},
             then=f("gpu_slices") / f("gpu_type__slices_per_gpu")),
        default=f("gpus_per_replica"), output_field=FloatField())
    return per_replica * f("replicas")


DEVICE_SHARE = device_share_expression()


def whole(value: float) -> int | float:
    """`value` as an int when it is whole (2.0 -> 2), else rounded to 1e-6 (0.25)."""
    rounded = round(float(value), 6)
    return int(rounded) if rounded == int(rounded) else rounded


def gpu_type_jobs_not_final(gpu_type_id: int) -> int:
    """How many jobs of the GPU type are queued, admitted or running (its sharing and
    slices per GPU cannot change under them: a fraction's slices, and its nodes' units,
    are relative to them)."""
    from queueing.models import Job
    from queueing.policy.states import FINAL_STATES

    return Job.objects.filter(gpu_type_id=gpu_type_id).exclude(
        status__in=sorted(str(s) for s in FINAL_STATES)).count()
