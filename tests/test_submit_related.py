"""Step 5 reads each chunk's jobs without a join and attaches their teams, tiers and GPU
types from rows read once per cycle (`scheduler._Related`): the launch specs are the
ones the joined rows give."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.models import Job
from queueing.services.scheduler import _Related, launch_spec

from .factories import JobFactory

pytestmark = pytest.mark.django_db


def test_specs_from_shared_related_rows_are_the_joined_rows_specs(world: Any) -> None:
    for i in range(9):
        JobFactory(team=(world.vision, world.nlp, world.speech)[i % 3],
                   tier=(world.low, world.normal, world.high)[i // 3 % 3],
                   gpu_type=(world.h100, world.a100)[i % 2], gpus_per_replica=1 + i % 2,
                   placement=["sim-h100-000"], memory_bytes=2**30)
    ids = sorted(Job.objects.values_list("pk", flat=True))
    joined = [launch_spec(j) for j in Job.objects.filter(pk__in=ids).select_related(
        "team", "tier", "gpu_type").order_by("pk")]
    related = _Related()
    specs = []
    for part in (ids[:4], ids[4:]):  # two chunks: the second reuses the first's rows
        rows = list(Job.objects.filter(pk__in=part).order_by("pk"))
        related.attach(rows)
        specs += [launch_spec(j) for j in rows]
    assert specs == joined
