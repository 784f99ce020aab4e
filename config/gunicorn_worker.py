"""gunicorn's gthread worker, taking new connections by least connections.

gunicorn's worker processes share one listening socket, and whichever is awake first
accepts a new connection; a kept-alive connection then stays with that worker for its
life. Clients that keep their connections (pipelines with a session, an ingress
controller's upstream pool, the benches) so often end up mostly on one worker, which
serves them on one core under the GIL while the other workers idle: gunicorn#2817,
gunicorn#3071 and gunicorn#3433 describe it; gunicorn leaves it to the kernel. Measured here
(8 keep-alive clients on 3 workers under load): connections per worker of
[8], [7, 1] and [5, 2, 1] as often as [3, 3, 2].

`BalancedThreadWorker` is gthread with one change: each worker posts how many
connections it holds on a board the workers share (an anonymous shared mapping made
before the fork), and a worker holding more connections than another live worker leaves
a new connection to it for `defer` seconds before taking it itself (so a stalled worker
cannot strand a connection). The least busy worker takes a connection at once, as
before. Use it with `--worker-class config.gunicorn_worker.BalancedThreadWorker`; the
image does (platform/Dockerfile, docs/deployment.md).
"""

from __future__ import annotations

import mmap
import time
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

SLOTS = 128  # workers of one gunicorn that can share the board (more: they take plainly)
FRESH = 5.0  # s: a slot not posted to for this long belongs to no live worker

# Per slot: [last posted (time.monotonic(), the same clock in every process), connections].
# Made when gunicorn's arbiter loads the worker class, so every worker forked from it
# shares it (MAP_SHARED); 8-byte aligned doubles are written whole.
_board = memoryview(mmap.mmap(-1, SLOTS * 16)).cast("d")
NEVER = float("-inf")
for _i in range(SLOTS):
    _board[2 * _i] = NEVER


class BalancedThreadWorker(ThreadWorker):
    """gthread, accepting by least connections (see the module's docstring)."""

    defer = 0.01  # s: how long a busier worker leaves a new connection to a less busy one

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # In the arbiter, before the fork, one worker at a time: take the slot posted to
        # longest ago, if no live worker holds it.
        now = time.monotonic()
        slot = min(range(SLOTS), key=lambda i: _board[2 * i])
        self.slot: int | None = None
        if now - _board[2 * slot] >= FRESH:
            self.slot = slot
            _board[2 * slot], _board[2 * slot + 1] = now, 0.0
        self._deferred_until = 0.0  # listening paused until then (0: not paused)
        self._take_until = 0.0  # after a pause: take a connection still waiting, by then

    def post(self) -> None:
        """Post this worker's connection count (and that it lives) on the board."""
        if self.slot is not None:
            _board[2 * self.slot] = time.monotonic()
            _board[2 * self.slot + 1] = float(self.nr_conns)

    def fewest_elsewhere(self, now: float) -> float:
        """The fewest connections another live worker holds (inf: no other)."""
        fewest = float("inf")
        for i in range(SLOTS):
            if i != self.slot and now - _board[2 * i] < FRESH:
                fewest = min(fewest, _board[2 * i + 1])
        return fewest

    def accept(self, listener: Any) -> None:
        now = time.monotonic()
        if (self.slot is not None and now > self._take_until
                and self.fewest_elsewhere(now) < self.nr_conns):
            # Another worker holds fewer: leave it the connection for `defer`, then take
            # it if it is still waiting.
            self._deferred_until = now + self.defer
            self._take_until = self._deferred_until + self.defer
            super().set_accept_enabled(False)
            return
        super().accept(listener)
        self._take_until = 0.0
        self.post()

    def set_accept_enabled(self, enabled: bool) -> None:
        # The main loop asks to listen on every turn; a deferring worker waits its turn.
        if enabled and self._deferred_until:
            return
        super().set_accept_enabled(enabled)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        if self._deferred_until:
            left = self._deferred_until - time.monotonic()
            if left > 0:
                timeout = min(timeout, left)
            else:
                self._deferred_until = 0.0
                if self.alive:
                    super().set_accept_enabled(self.nr_conns < self.worker_connections)
        super().wait_for_and_dispatch_events(timeout)
        self.post()

    def run(self) -> None:
        try:
            super().run()
        finally:
            if self.slot is not None:  # free the slot at once for the next worker
                _board[2 * self.slot], _board[2 * self.slot + 1] = NEVER, 0.0

