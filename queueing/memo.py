"""Per-process memos of the few slowly changing facts read on every submit (GPU types,
tiers, node sizes), each kept for a few seconds.

Why not the shared cache: on Redis every read is a round trip and an unpickle, three of
them per submit, for rows that change a few times a year; a memo in each process gives the
same promise (a change is seen within the TTL) for free. Tests forget them between tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from cachetools import TTLCache, cached

F = TypeVar("F", bound=Callable[..., Any])
_memos: list[TTLCache[Any, Any]] = []
_forgets: list[Callable[[], None]] = []


def ttl_memo(seconds: float) -> Callable[[F], F]:
    """Memoize a function's answers in this process for `seconds`."""

    def decorate(fn: F) -> F:
        memo: TTLCache[Any, Any] = TTLCache(maxsize=64, ttl=seconds)
        _memos.append(memo)
        return cached(memo, lock=threading.Lock())(fn)  # type: ignore[return-value]

    return decorate


def on_forget(forget: Callable[[], None]) -> None:
    """Have `forget_all` also call `forget` (a per-process cache kept another way, such as
    the cycle's active jobs: queueing/selectors/active_jobs.py)."""
    _forgets.append(forget)


def forget_all() -> None:
    """Drop every memo of this process (tests; after changing the facts in place)."""
    for memo in _memos:
        memo.clear()
    for forget in _forgets:
        forget()
