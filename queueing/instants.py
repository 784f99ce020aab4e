"""The one parser of instants people give fairq: the API (`?updated_after=`, `?at=`,
`?from=`, `?to=`), `manage.py fairshare --at` and the usage CSV of `import_usage`.

An instant is ISO 8601 with an offset; it comes back in UTC. Python accepts offsets up to
±23:59 and PostgreSQL refuses past ±15:59 ("time zone displacement out of range", a 500),
so nothing leaves here with the caller's offset. An instant that exists in no year
1..9999 once in UTC (0001-01-01T00:00+20:00) is refused, not an OverflowError.

Machine-written timestamps (Kubernetes', the API's, fairq's own `isoformat()`) need none
of this: `datetime.fromisoformat` reads them, `Z` included (Python 3.11+)."""

from __future__ import annotations

from datetime import UTC, datetime

EXAMPLE = "2026-01-05T08:00:00+00:00"


class InstantError(ValueError):
    """Why a text or a datetime is not an instant fairq takes; the message is for users."""


def as_utc(value: datetime) -> datetime:
    """`value` (aware) in UTC; InstantError when naive or out of range in UTC."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InstantError(f"An instant needs an offset or Z, e.g. {EXAMPLE}.")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InstantError("The instant is out of range (years 1..9999 in UTC).") from None


def parse_iso(text: str) -> datetime:
    """`datetime.fromisoformat` of `text` without surrounding blanks, also taking the
    lower-case `z` RFC 3339 allows; naive when the text has no offset. ValueError when it
    is not ISO 8601."""
    text = text.strip()
    if text.endswith("z"):
        text = text[:-1] + "Z"
    return datetime.fromisoformat(text)


def parse_instant(text: str) -> datetime:
    """ISO 8601 text with an offset (or Z) as an aware datetime in UTC."""
    try:
        when = parse_iso(text)
    except ValueError:
        raise InstantError(f"Not an ISO 8601 instant, e.g. {EXAMPLE}.") from None
    return as_utc(when)
