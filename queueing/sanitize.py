"""The one place where text and numbers from outside fairq's own code (the cluster's
workload statuses, exception messages, old rows) are made safe to store.

PostgreSQL refuses NUL in text and in JSON strings, lone UTF-16 surrogates cannot be
encoded, and `integer` columns hold 32 bits: any of these in one job's row would fail the
UPDATE, and before this module, every cycle. `job_transition` passes
every value it saves through `clean_fields`; the reconcile passes every status through
`clean_status`.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations

from queueing.backends.base import Phase, WorkloadStatus

# C0 and C1 controls except tab and newline, DEL, and lone surrogates.
_UNSAFE_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_ELLIPSIS = "…"
# A workload name is fq-<id>-<attempt>; reasons, node names and names are bounded so a
# status of megabytes costs nothing downstream.
MAX_STATUS_REASON = 2000
MAX_NODE_NAME = 253
MAX_NODES = 1024
INT32 = BaseDatabaseOperations.integer_field_ranges["IntegerField"]
BIGINT = BaseDatabaseOperations.integer_field_ranges["BigIntegerField"]


def clean_text(value: Any, *, max_length: int | None = None) -> str:
    """`value` as text without control characters (tab and newline kept) or surrogates,
    cut to `max_length` characters (the last one an ellipsis when cut)."""
    text = value if isinstance(value, str) else _safe_str(value)
    if max_length is not None and len(text) > 4 * max_length:
        text = text[: 4 * max_length]  # bound the regex's work on a huge input
    text = _UNSAFE_TEXT.sub("", text)
    if max_length is not None and len(text) > max_length:
        text = text[: max(0, max_length - 1)] + _ELLIPSIS
    return text


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:  # a hostile __str__
        return f"<unprintable {type(value).__name__}>"


def clamp_int(value: Any, lo: int, hi: int) -> int | None:
    """`value` as an int within [lo, hi]; None when it is not a number at all."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return hi if value > hi else lo if value < lo else int(value)
    try:
        number = value if isinstance(value, int) else int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return max(lo, min(hi, number))


def clean_json(value: Any, *, depth: int = 0) -> Any:
    """JSON-ready `value` with every string cleaned (PostgreSQL's jsonb refuses \\u0000)."""
    if depth > 20:
        return None
    if isinstance(value, str):
        return clean_text(value, max_length=10_000)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return clamp_int(value, *BIGINT)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clean_text(k, max_length=1000): clean_json(v, depth=depth + 1)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v, depth=depth + 1) for v in value]
    return clean_text(value, max_length=10_000)


def clean_value(field: models.Field[Any, Any], value: Any) -> Any:
    """`value` as `field` can store it: text cleaned and cut to max_length, integers
    clamped to the column's range, JSON strings cleaned. Other values pass unchanged."""
    if value is None:
        return None
    if isinstance(field, models.CharField | models.TextField):
        return clean_text(value, max_length=field.max_length)
    if isinstance(field, models.JSONField):
        return clean_json(value)
    if isinstance(field, models.IntegerField) and not isinstance(field, models.AutoField):
        lo, hi = BaseDatabaseOperations.integer_field_ranges.get(
            field.get_internal_type(), BIGINT)
        if isinstance(field, models.PositiveIntegerField | models.PositiveSmallIntegerField
                      | models.PositiveBigIntegerField):
            lo = 0
        return clamp_int(value, lo, hi)
    return value


def clean_fields(model: type[models.Model], values: dict[str, Any]) -> dict[str, Any]:
    """`clean_value` for each `name: value` of `model`'s fields (unknown names pass: the
    ORM reports them)."""
    out = {}
    for name, value in values.items():
        try:
            field = model._meta.get_field(name)
        except Exception:
            out[name] = value
            continue
        out[name] = clean_value(field, value) if isinstance(field, models.Field) else value
    return out


def _aware(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        return value.replace(tzinfo=UTC)
    return value


# An IPv4 or IPv6 address or a DNS name: nothing that could change the URL built on it.
_ADDRESS = re.compile(r"[0-9A-Za-z.:-]*", re.ASCII)


def clean_status(status: Any) -> WorkloadStatus | None:
    """A workload status fairq can act on, or None when it names no job at all.

    Ids and attempts must be integers in range; the phase must be one fairq knows
    (anything else counts as PENDING: not yet something to record); times are made
    aware (UTC when naive) and a finish before the start is moved to the start; the exit
    code is clamped to a 32-bit integer; the reason and node names are cleaned and
    bounded."""
    try:
        name = clean_text(status.name, max_length=253)
        job_id = status.job_id
        attempt = status.attempt
        if isinstance(job_id, bool) or not isinstance(job_id, int) or \
                not 0 < job_id <= BIGINT[1]:
            return None
        if isinstance(attempt, bool) or not isinstance(attempt, int) or \
                not 0 < attempt <= INT32[1]:
            attempt = 0  # owned by no attempt: an orphan, stopped by the reconcile
        try:
            phase = Phase(status.phase)
        except ValueError:
            phase = Phase.PENDING
        started = _aware(status.started_at)
        finished = _aware(status.finished_at)
        if started is not None and finished is not None and finished < started:
            finished = started
        exit_code = None if status.exit_code is None else clamp_int(status.exit_code, *INT32)
        raw_nodes = status.nodes if isinstance(status.nodes, list | tuple) else ()
        nodes = tuple(n for n in (clean_text(n, max_length=MAX_NODE_NAME)
                                  for n in list(raw_nodes)[:MAX_NODES] if isinstance(n, str))
                      if n)
        reason = "" if status.reason is None else clean_text(status.reason,
                                                               max_length=MAX_STATUS_REASON)
        stopping = getattr(status, "stopping", False) is True
        restarts = getattr(status, "restarts", 0)
        restarts = (clamp_int(restarts, 0, INT32[1]) or 0) if isinstance(restarts, int) \
            and not isinstance(restarts, bool) else 0
        # A session server's address (docs/sessions.md): an IP or host name, a port.
        address = getattr(status, "address", "")
        address = clean_text(address, max_length=253) if isinstance(address, str) else ""
        if not _ADDRESS.fullmatch(address):
            address = ""
        port = getattr(status, "port", None)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            port = None
        return WorkloadStatus(name=name, job_id=job_id, attempt=attempt, phase=phase,
                              started_at=started, finished_at=finished, exit_code=exit_code,
                              reason=reason, nodes=nodes, stopping=stopping,
                              restarts=restarts, address=address, port=port)
    except Exception:
        return None
