"""An array job's rows written by COPY from a template encoded once are the
rows psycopg's own adaptation writes (the fallback path), whatever the env holds."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.forms.models import model_to_dict

from queueing.models import Job, JobEvent
from queueing.services import jobs
from queueing.services.jobs import JobInput, jobs_submit_bulk

from .conftest import World

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql",
                                reason="COPY: PostgreSQL only (bulk_create elsewhere)")

TRICKY = {"TAB": "a\tb", "NL": "a\nb\r", "BACKSLASH": "C:\\dir\\", "QUOTE": 'say "hi"',
          "MARKER": '"FAIRQ_ARRAY_INDEX": ""', "UNICODE": "Grüße ☃", "NULLISH": "\\N"}


def _input(world: World) -> JobInput:
    return JobInput(team=world.vision, name="arr", image="ghcr.io/acme/train:1.4",
                    command=["python", "-c", "print('\\t')"], args=["--x", "a\tb"],
                    env=dict(TRICKY), gpu_type=world.h100, gpus_per_replica=1, replicas=1,
                    tier=world.normal, max_runtime_seconds=None)


def _rows(ids: list[int]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out = []
    for job in Job.objects.filter(pk__in=ids).order_by("pk"):
        j = model_to_dict(job)
        j.pop("id")
        e = model_to_dict(JobEvent.objects.get(job=job))
        e.pop("id"), e.pop("job")
        out.append((j, e))
    return out


def test_the_prepared_copy_writes_what_psycopg_adaptation_writes(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = jobs_submit_bulk(actor=world.member, data=_input(world), count=3)

    def unknown(value: Any) -> str:
        raise TypeError("force the fallback")

    monkeypatch.setattr(jobs, "_copy_text", unknown)
    adapted = jobs_submit_bulk(actor=world.member, data=_input(world), count=3)
    mine, theirs = _rows(prepared), _rows(adapted)
    for (j, e), (tj, te) in zip(mine, theirs, strict=True):
        for row in (j, tj, e, te):  # the instants and arrays of two submits differ
            for name in ("created_at", "updated_at", "at", "array", "array_id"):
                row.pop(name, None)
        assert e.pop("reason").startswith("submitted (array ")
        assert te.pop("reason").startswith("submitted (array ")
        assert (j, e) == (tj, te)
    assert [j["name"] for j, _ in mine] == ["arr-0", "arr-1", "arr-2"]
    assert mine[2][0]["env"] == {**TRICKY, "FAIRQ_ARRAY_INDEX": "2", "FAIRQ_ARRAY_SIZE": "3"}
    assert mine[0][0]["args"] == ["--x", "a\tb"]
    assert [j["array_index"] for j, _ in mine] == [0, 1, 2]
