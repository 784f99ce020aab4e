"""What the Kubernetes backend remembers about its workloads between two reads of the
watch cache, under one lock (watch threads, the cycle and its submit threads share it).
Pure bookkeeping: no client, no clock of its own (monotonic times are passed in), so it
is tested without a cluster (tests/test_k8s_tracker.py).

- where    — workload name → namespace, for stop without a cluster-wide list;
- stopping — names fairq asked to delete (reported `stopping` until the watch says so);
- hidden   — finished Jobs fairq forgot on stop (kept for their logs): name → finished;
- ran      — names seen running → when they started;
- tombstones — the last status of a Job deleted outside fairq, reported for a while so
  its job does not stay RUNNING for ever;
- replicas — per multi-replica workload, the indexes of its replica Jobs (i > 0) seen in
  the cache: one missing later was deleted, not merely not created yet;
- abandoned — uids of workload Jobs fairq deleted itself when a replica was refused (the
  next submit must not adopt one the watch cache still lists);
- reclaimed nodes — spot nodes deleted or marked for termination (rule K6): name → how
  and when; and reclaimed workloads — those with a pod bound to one when it happened,
  reported FAILED `spot_reclaimed` until fairq stops them (sticky: once the pods are
  gone the Job controller would make new ones elsewhere, and the workload would look
  merely moved).
"""

from __future__ import annotations

import threading
from collections.abc import Container, Iterable
from dataclasses import replace
from datetime import datetime

from .base import WorkloadStatus

# How long a Job deleted outside fairq after it ran is still reported (as FAILED), so
# the job that owned it does not stay RUNNING for ever.
TOMBSTONE_SECONDS = 600.0


class WorkloadTracker:
    def __init__(self, *, tombstone_seconds: float = TOMBSTONE_SECONDS) -> None:
        self._lock = threading.Lock()
        self._tombstone_seconds = tombstone_seconds
        self._where: dict[str, str] = {}
        self._stopping: set[str] = set()
        self._hidden: dict[str, datetime] = {}
        self._ran: dict[str, datetime] = {}
        self._tombstones: dict[str, tuple[float, WorkloadStatus]] = {}
        self._replicas: dict[str, set[int]] = {}
        self._abandoned: dict[str, float] = {}
        self._reclaimed_nodes: dict[str, tuple[str, datetime]] = {}
        self._reclaimed: dict[str, tuple[str, str, datetime]] = {}

    # --- where --------------------------------------------------------------------------

    def placed(self, name: str, namespace: str) -> None:
        """The workload `name` lives in `namespace` (created, adopted or watched)."""
        with self._lock:
            self._where[name] = namespace

    def namespace_of(self, name: str) -> str | None:
        with self._lock:
            return self._where.get(name)

    # --- stop ---------------------------------------------------------------------------

    def stop_asked(self, name: str) -> None:
        """fairq is deleting it: reported as stopping from now on."""
        with self._lock:
            self._stopping.add(name)

    def stop_failed(self, name: str) -> None:
        """The delete was not accepted: not stopping after all (the cycle asks again)."""
        with self._lock:
            self._stopping.discard(name)

    def stop_requested(self, name: str) -> None:
        """A stop came for `name`: whatever it was, its tombstone is answered."""
        with self._lock:
            self._tombstones.pop(name, None)

    def hide(self, name: str, finished: datetime) -> None:
        """A finished Job fairq stopped without deleting it (its logs stay readable)."""
        with self._lock:
            self._hidden[name] = finished

    def hidden(self) -> dict[str, datetime]:
        with self._lock:
            return dict(self._hidden)

    def unhide(self, name: str) -> None:
        """A hidden Job runs pods again: report it, so the cycle stops it."""
        with self._lock:
            self._hidden.pop(name, None)

    # --- statuses -----------------------------------------------------------------------

    def seen(self, status: WorkloadStatus) -> WorkloadStatus:
        """`status` as read from the cache, with what the cache may lag behind on: its
        start remembered (for a deletion later), and `stopping` once fairq asked."""
        with self._lock:
            if status.started_at is not None:
                self._ran.setdefault(status.name, status.started_at)
            if status.name in self._stopping and not status.stopping:
                return replace(status, stopping=True)
        return status

    def seen_all(self, statuses: list[WorkloadStatus]) -> list[WorkloadStatus]:
        """`seen` of each of `statuses`, under the lock once (a cycle's 100,000)."""
        out: list[WorkloadStatus] = []
        with self._lock:
            ran, stopping = self._ran, self._stopping
            for status in statuses:
                if status.started_at is not None:
                    ran.setdefault(status.name, status.started_at)
                if status.name in stopping and not status.stopping:
                    status = replace(status, stopping=True)
                out.append(status)
        return out

    def started(self, statuses: Iterable[WorkloadStatus]) -> None:
        """The start of each of `statuses` remembered (`seen`'s memory alone), under the
        lock once: what `seen_all` learns from a status, given only the statuses that
        are new or changed since (a start, once known, stays: `setdefault`)."""
        with self._lock:
            ran = self._ran
            for status in statuses:
                if status.started_at is not None:
                    ran.setdefault(status.name, status.started_at)

    def stopping(self) -> set[str]:
        """The names fairq asked to delete that the watch has not seen go (a copy)."""
        with self._lock:
            return set(self._stopping)

    def deleted(self, name: str) -> tuple[bool, datetime | None]:
        """The Job `name` is gone: everything about it forgotten. Returns whether fairq
        expected it (it stopped or forgot it) and when it was seen starting."""
        with self._lock:
            self._where.pop(name, None)
            self._replicas.pop(name, None)
            self._reclaimed.pop(name, None)
            acknowledged = name in self._stopping or name in self._hidden
            self._hidden.pop(name, None)
            self._stopping.discard(name)
            return acknowledged, self._ran.pop(name, None)

    def bury(self, status: WorkloadStatus, *, at: float) -> None:
        """Report `status` (a Job deleted outside fairq) for `tombstone_seconds` after
        `at` (monotonic). Gone, not going: never `stopping` (a pod it left behind is
        the cycle's to stop)."""
        with self._lock:
            self._tombstones[status.name] = (at + self._tombstone_seconds,
                                             replace(status, stopping=False))

    def tombstones(self, *, at: float, listed: Container[str]) -> list[WorkloadStatus]:
        """The tombstones still due at `at` (monotonic) whose name is not in `listed`;
        expired ones are dropped."""
        out: list[WorkloadStatus] = []
        with self._lock:
            for name, (until, tomb) in list(self._tombstones.items()):
                if until < at:
                    del self._tombstones[name]
                elif name not in listed:
                    out.append(tomb)
        return out

    # --- replicas -----------------------------------------------------------------------

    def replica_seen(self, workload: str, index: int) -> None:
        """Replica `index`'s Job of `workload` is in the cache."""
        with self._lock:
            self._replicas.setdefault(workload, set()).add(index)

    def replicas_seen(self, seen: list[tuple[str, int]]) -> None:
        """`replica_seen` of each (workload, index), under the lock once."""
        with self._lock:
            for workload, index in seen:
                self._replicas.setdefault(workload, set()).add(index)

    def replica_was_seen(self, workload: str, index: int) -> bool:
        with self._lock:
            return index in self._replicas.get(workload, ())

    def abandon(self, uid: str, *, at: float) -> None:
        """fairq deleted the workload Job with `uid` itself (a replica was refused): not to
        be adopted from the cache by the retry. Remembered for 300 s after `at`."""
        with self._lock:
            self._abandoned = {u: t for u, t in self._abandoned.items() if at - t < 300}
            self._abandoned[uid] = at

    def abandoned(self, uid: str) -> bool:
        with self._lock:
            return uid in self._abandoned

    # --- spot reclamation (rule K6) -------------------------------------------------------

    def node_reclaimed(self, node: str, how: str, *, at: datetime) -> None:
        """Spot node `node` is going (`how`: 'deleted', 'tainted <key>', ...) since `at`;
        the first word stays (a taint then a delete is one reclamation)."""
        with self._lock:
            self._reclaimed_nodes.setdefault(node, (how, at))

    def node_back(self, node: str) -> None:
        """`node` is there again without a termination mark: schedulable spot capacity."""
        with self._lock:
            self._reclaimed_nodes.pop(node, None)

    def reclaimed_nodes(self) -> dict[str, tuple[str, datetime]]:
        with self._lock:
            return dict(self._reclaimed_nodes)

    def workload_reclaimed(self, name: str, node: str, how: str, *, at: datetime) -> None:
        """Workload `name` had a pod on `node` when it was reclaimed: reported FAILED
        `spot_reclaimed` from now on, until its Job is gone. The first node counts."""
        with self._lock:
            self._reclaimed.setdefault(name, (node, how, at))

    def reclaimed_workloads(self) -> dict[str, tuple[str, str, datetime]]:
        with self._lock:
            return dict(self._reclaimed)

    def reclaimed(self, name: str) -> tuple[str, str, datetime] | None:
        """(node, how, when) of the reclamation that ended workload `name`, if one did."""
        with self._lock:
            return self._reclaimed.get(name)
