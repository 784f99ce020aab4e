"""Fields every log line carries while a piece of work runs (docs/deployment.md, "Logs").

`log_context(cycle_id=..., job_id=..., team=...)` sets them for the block (a ContextVar:
per thread and per task, restored on exit); `ContextFilter`, on the log handler, copies
them onto each record, where the JSON formatter (FAIRQ_LOG_FORMAT=json) prints them as
keys and the plain one ignores them. Standard library only: any layer may use it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

FIELDS = ("cycle_id", "job_id", "team")

_context: ContextVar[dict[str, Any] | None] = ContextVar("fairq_log_context", default=None)


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add `fields` (of FIELDS; None values are left out) to every record logged in the
    block, over the enclosing block's."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown log context fields: {sorted(unknown)}")
    current = _context.get() or {}
    token = _context.set({**current, **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def current() -> dict[str, Any]:
    return dict(_context.get() or {})


class ContextFilter(logging.Filter):
    """Copies the current log context onto the record; a field the call passed itself
    (`extra={"job_id": ...}`) wins. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_context.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True
