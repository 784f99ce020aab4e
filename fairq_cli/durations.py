"""Durations as people write them, one parser for the CLI (`--time`, `--grace`, a job
file's `time:`) and the web's submit form (max runtime). Pure standard library: the CLI
is an HTTP client and imports none of the server's code; the server may import this."""

from __future__ import annotations

import re

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# One or more number-unit pairs, largest unit first: 2h, 90m, 1h30m, 1d2h, 45s.
_COMPOUND = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
DURATION_HELP = "seconds (3600) or 2h, 90m, 1h30m, 1d, h:mm:ss"


def parse_duration(text: str) -> int:
    """`90` (seconds), `30m`, `2h`, `1d`, `1h30m`, `1d2h30m15s`, `1:30:00` (h:m:s) or
    `45:00` (m:s) -> whole seconds. Raises ValueError (saying what is accepted) for
    anything else, an empty text included."""
    t = text.strip().lower().replace(" ", "")
    if t.isdigit():
        return int(t)
    m = _COMPOUND.fullmatch(t)
    if t and m and any(m.groups()):
        return sum(int(g) * unit for g, unit in zip(m.groups(), _UNITS.values(), strict=True)
                   if g)
    parts = t.split(":")
    if 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
        nums = [int(p) for p in parts]
        while len(nums) < 3:
            nums.insert(0, 0)
        return nums[0] * 3600 + nums[1] * 60 + nums[2]
    raise ValueError(f"bad duration {text.strip()!r}: use {DURATION_HELP}")


def format_duration(seconds: int) -> str:
    """The short form `parse_duration` reads back: 7200 -> 2h, 5400 -> 1h30m, 90 -> 1m30s."""
    if seconds <= 0:
        return "0s"
    out = ""
    for unit, size in _UNITS.items():
        n, seconds = divmod(seconds, size)
        if n:
            out += f"{n}{unit}"
    return out
