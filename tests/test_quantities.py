"""The quantity parser of queueing/validation.py (no database): Kubernetes' grammar
without a sign, rounded up as Kubernetes rounds, bounded far below int64."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.validation import (
    MAX_CPU_MILLICORES,
    MAX_RESOURCE_BYTES,
    format_bytes,
    format_cpu,
    parse_bytes,
    parse_cpu,
)

GI = 2**30


@pytest.mark.parametrize(("text", "millicores"), [
    ("4", 4000), ("500m", 500), ("0.5", 500), (".5", 500), ("1.0005", 1001), ("1e3", 10**6),
    ("1E-3", 1), ("1n", 1), ("100k", MAX_CPU_MILLICORES), (" 2 ", 2000),
])
def test_cpu_quantities_become_millicores_rounded_up(text: str, millicores: int) -> None:
    assert parse_cpu(text) == millicores


@pytest.mark.parametrize(("text", "size"), [
    ("16Gi", 16 * GI), ("1.5Gi", 3 * GI // 2), ("100G", 10**11), ("500M", 5 * 10**8),
    ("1", 1), ("500m", 1), ("1Ki", 1024), ("1e9", 10**9), ("1Ei", MAX_RESOURCE_BYTES),
])
def test_byte_quantities_become_bytes_rounded_up(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", [
    "-1", "0", "0.0", "0m", "", " ", "four", "4 Gi", "4GB", "4gi", "+4", "0x10", "1e", "1e1000",
    "1e999", "4Gi\n5", "１６", "9" * 33, "1..5", "Infinity", "NaN", None, 4, True, ["4"],
])
def test_hostile_quantities_are_refused_with_a_message(text: Any) -> None:
    for parse in (parse_cpu, parse_bytes):
        with pytest.raises(ValueError, match=r"\w"):
            parse(text)


def test_values_past_the_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="At most 100,000 CPUs"):
        parse_cpu("100001")
    with pytest.raises(ValueError, match="At most 1Ei"):
        parse_bytes("1025Pi")
    with pytest.raises(ValueError, match="At most 1Ei"):
        parse_bytes("9223372036854775808")  # int64 + 1


def test_formatting_writes_what_kubernetes_writes() -> None:
    assert [format_cpu(m) for m in (4000, 500, 1500, 1)] == ["4", "500m", "1500m", "1m"]
    assert [format_bytes(b) for b in (16 * GI, 1024, 1000, GI + 1)] == [
        "16Gi", "1Ki", "1000", str(GI + 1)]
