"""queueing/instants.py: the one parser of instants people give fairq."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from queueing.instants import InstantError, parse_instant, parse_iso

AT = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize("text", [
    "2026-01-05T08:00:00Z", "2026-01-05T08:00:00z", " 2026-01-05T08:00:00Z\n",
    "2026-01-05T08:00:00+00:00", "2026-01-05T10:30:00+02:30", "2026-01-05T03:00-05:00",
    "2026-01-05 08:00Z", "20260105T080000Z", "2026-01-05t08:00:00Z",
])
def test_parse_instant_reads_iso_8601_with_an_offset_into_utc(text: str) -> None:
    when = parse_instant(text)
    assert when == AT and when.utcoffset() == timedelta(0) and when.tzinfo is UTC


@pytest.mark.parametrize(("text", "message"), [
    ("2026-01-05T08:00:00", "needs an offset"), ("yesterday", "Not an ISO 8601 instant"),
    ("", "Not an ISO 8601 instant"), ("0001-01-01T00:00+20:00", "out of range"),
])
def test_parse_instant_refuses_with_a_message_for_people(text: str, message: str) -> None:
    with pytest.raises(InstantError, match=message):
        parse_instant(text)


def test_parse_iso_is_fromisoformat_with_blanks_and_lower_case_z() -> None:
    assert parse_iso(" 2026-01-05T08:00:00z ") == datetime.fromisoformat("2026-01-05T08:00:00Z")
    assert parse_iso("2026-01-05T08:00:00").tzinfo is None  # the caller decides about naive
    assert parse_iso("2026-01-05T09:00+01:00").tzinfo == timezone(timedelta(hours=1))
    with pytest.raises(ValueError):
        parse_iso("2026-01-05T08:00:00ZZ")
