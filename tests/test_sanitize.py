"""queueing.sanitize: what fairq stores from the cluster is always storable."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queueing.backends.base import Phase, WorkloadStatus
from queueing.models import Job, JobEvent
from queueing.sanitize import clamp_int, clean_fields, clean_json, clean_status, clean_text


@pytest.mark.parametrize(("raw", "max_length", "clean"), [
    ("plain", None, "plain"),
    ("a\x00b\x1b[1mc\x7f\x85d", None, "ab[1mcd"),
    ("keeps\nnew lines\tand tabs", None, "keeps\nnew lines\tand tabs"),
    ("lone \ud800 surrogate", None, "lone  surrogate"),
    ("é☃ stays", None, "é☃ stays"),
    ("x" * 600, 500, "x" * 499 + "…"),
    ("\x00" * 10_000 + "tail", 10, ""),  # bounded work: a huge input is cut before cleaning
    (b"\x00", None, "b'\\x00'"),
    (None, None, "None"),
])
def test_clean_text(raw: Any, max_length: int | None, clean: str) -> None:
    assert clean_text(raw, max_length=max_length) == clean


@pytest.mark.parametrize(("raw", "clean"), [
    (5, 5), (2**70, 2**31 - 1), (-(2**70), -(2**31)), (math.inf, 2**31 - 1),
    (math.nan, None), ("12", 12), ("x", None), (None, None), (True, 1), (3.9, 3),
])
def test_clamp_int(raw: Any, clean: int | None) -> None:
    assert clamp_int(raw, -(2**31), 2**31 - 1) == clean


def test_clean_json_cleans_every_string_and_number() -> None:
    assert clean_json({"a\x00": ["n\x00de", 2**70, math.nan, {"k": "\x07v"}], "b": True}) == \
        {"a": ["nde", 2**63 - 1, None, {"k": "v"}], "b": True}


def test_clean_fields_fits_each_value_to_its_column() -> None:
    assert clean_fields(Job, {"message": "m\x00" * 600, "exit_code": 99999999999,
                              "attempt": -3, "placement": ["a\x00"], "status": "X"}) == {
        "message": "m" * 499 + "…", "exit_code": 2**31 - 1, "attempt": 0,
        "placement": ["a"], "status": "X"}
    assert clean_fields(JobEvent, {"reason": "r" * 501})["reason"] == "r" * 499 + "…"


def test_clean_status() -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    raw = WorkloadStatus(name="fq-1-1\x00", job_id=1, attempt=1, phase="WHAT",  # type: ignore[arg-type]
                         started_at=t, finished_at=t - timedelta(hours=1),
                         exit_code=2**40, reason="r\x00" * 5000,
                         nodes=("n\x00", None, "", "ok"))  # type: ignore[arg-type]
    s = clean_status(raw)
    assert s is not None
    assert (s.name, s.phase, s.finished_at, s.exit_code, s.nodes) == (
        "fq-1-1", Phase.PENDING, t, 2**31 - 1, ("n", "ok"))
    assert len(s.reason) == 2000 and "\x00" not in s.reason
    naive = datetime(2026, 1, 1)  # naive on purpose
    assert clean_status(WorkloadStatus("n", 1, 1, Phase.RUNNING, started_at=naive)) \
        .started_at == t  # type: ignore[union-attr]
    assert clean_status(WorkloadStatus("n", 1, 2**40, Phase.RUNNING)).attempt == 0  # type: ignore[union-attr]
    for job_id in (0, -1, 2**63, "1", True, None, 1.0):
        assert clean_status(WorkloadStatus("n", job_id, 1, Phase.RUNNING)) is None  # type: ignore[arg-type]
    assert clean_status(object()) is None


def test_clean_status_keeps_what_the_reconcile_reads_besides_the_phase() -> None:
    """`stopping` (a Job the cluster is removing is not stopped or counted again) and
    `restarts` (a pod restart writes an event) survive the cleaning; odd values do not."""
    s = clean_status(WorkloadStatus("n", 1, 1, Phase.RUNNING, stopping=True, restarts=3))
    assert s is not None and s.stopping is True and s.restarts == 3
    odd = clean_status(WorkloadStatus("n", 1, 1, Phase.RUNNING, stopping="yes",  # type: ignore[arg-type]
                                      restarts=-5))
    assert odd is not None and odd.stopping is False and odd.restarts == 0
    big = clean_status(WorkloadStatus("n", 1, 1, Phase.RUNNING, restarts=2**40))
    assert big is not None and big.restarts == 2**31 - 1
