"""An in-process cluster of GPU nodes: the embedded default for the demo and fast tests.

A workload's replicas are placed on nodes with room (all or none, best fit), run for
`FAIRQ_SIM_SECONDS` from the job's env (or a default), then succeed, or fail with
`FAIRQ_SIM_EXIT_CODE` when it is set and not 0. Time comes from the caller (`now`), so
a simulator can drive it with a virtual clock.

Replicas are all or nothing, as on Kubernetes (docs/kubernetes.md, "Replicas that
rendezvous"): with `FAIRQ_SIM_FAIL_REPLICA=<index>` (0-based, below the job's replicas)
that one replica fails at the end of its run (with `FAIRQ_SIM_EXIT_CODE`, or 1 when that
is unset or 0), the others are stopped with it, and the workload fails with the reason
"replica <index> failed: exit code <n>".

The knobs are validated at submit (`queueing.validation.sim_seconds`, `sim_exit_code`,
`sim_fail_replica`);
a workload whose knobs are invalid anyway (a row older than that validation) fails at
once with the reason, and nothing in here raises for one workload's values.

State lives in this process: run it in one worker process (the demo does; docker-compose
runs the worker with --concurrency=1 when the simulated backend is selected).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar

from queueing.validation import (
    MAX_RUNTIME_SECONDS,
    sim_exit_code,
    sim_fail_replica,
    sim_seconds,
)

from .base import LaunchSpec, NodeInfo, Phase, WorkloadStatus


class SimulatedClusterError(Exception):
    pass


@dataclass
class _Node:
    name: str
    gpu_type: str
    capacity: int
    allocated: int = 0


@dataclass
class _Workload:
    spec: LaunchSpec
    nodes: tuple[str, ...]
    started_at: datetime
    run_seconds: float
    exit_code: int
    finished_at: datetime | None = None
    problem: str = ""  # why it failed at once (invalid knobs), else empty
    failed_replica: int | None = None  # the replica that fails (the others stop with it)
    released: bool = False
    stopped: bool = False
    log: list[str] = field(default_factory=list)


def parse_node_spec(spec: str) -> list[tuple[int, int, str]]:
    """'4x8xh100,2x7xmig-1g-10gb' -> [(4, 8, 'h100'), (2, 7, 'mig-1g-10gb')]."""
    pools: list[tuple[int, int, str]] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        count, _, rest = part.partition("x")
        gpus, _, gpu_type = rest.partition("x")
        try:
            pools.append((int(count), int(gpus), gpu_type))
        except ValueError as exc:
            raise SimulatedClusterError(
                f"bad FAIRQ_SIM_NODES pool {part!r}: want COUNTxGPUSxTYPE, e.g. 4x8xh100"
            ) from exc
        if not gpu_type or int(count) <= 0 or int(gpus) <= 0:
            raise SimulatedClusterError(f"bad FAIRQ_SIM_NODES pool {part!r}")
    return pools


class SimulatedCluster:
    # Capabilities (base.ClusterBackend): in this process, no cluster client (web
    # processes may read it when the worker published nothing); nothing to provision.
    in_process: ClassVar[bool] = True
    provisions: ClassVar[bool] = False

    def __init__(self, nodes: list[tuple[str, str, int]], *, default_seconds: float = 60.0):
        self._lock = threading.Lock()
        self._nodes = {name: _Node(name, t, cap) for name, t, cap in nodes}
        self._workloads: dict[str, _Workload] = {}
        self.default_seconds = min(max(0.0, default_seconds), float(MAX_RUNTIME_SECONDS))

    @classmethod
    def from_spec(cls, spec: str, *, default_seconds: float = 60.0) -> SimulatedCluster:
        nodes = []
        for count, gpus, gpu_type in parse_node_spec(spec):
            for i in range(count):
                nodes.append((f"sim-{gpu_type}-{i:03d}", gpu_type, gpus))
        return cls(nodes, default_seconds=default_seconds)

    def nodes(self) -> list[NodeInfo]:
        with self._lock:
            return [NodeInfo(n.name, n.gpu_type, n.capacity, n.allocated)
                    for n in self._nodes.values()]

    def _place(self, spec: LaunchSpec) -> tuple[str, ...] | None:
        """The planned placement when it still fits, else best fit; all or none."""
        free = {n.name: n.capacity - n.allocated for n in self._nodes.values()
                if n.gpu_type == spec.gpu_type}
        planned = list(spec.placement)
        if len(planned) == spec.replicas and all(p in free for p in planned):
            need: dict[str, int] = {}
            for p in planned:
                need[p] = need.get(p, 0) + spec.gpus_per_replica
            if all(free[p] >= n for p, n in need.items()):
                return tuple(planned)
        taken: list[str] = []
        for _ in range(spec.replicas):
            fits = [(f, name) for name, f in free.items() if f >= spec.gpus_per_replica]
            if not fits:
                return None
            _, best = min(fits)
            free[best] -= spec.gpus_per_replica
            taken.append(best)
        return tuple(taken)

    def submit(self, spec: LaunchSpec, *, now: datetime) -> None:
        with self._lock:
            if spec.name in self._workloads:
                return  # idempotent: the name is the identity
            placement = self._place(spec)
            if placement is None:
                raise SimulatedClusterError(
                    f"{spec.name}: {spec.replicas} × {spec.gpus_per_replica} {spec.gpu_type} "
                    "GPUs do not fit on the simulated nodes"
                )
            for name in placement:
                self._nodes[name].allocated += spec.gpus_per_replica
            seconds, exit_code, problem = self.default_seconds, 0, ""
            failed_replica: int | None = None
            try:
                if "FAIRQ_SIM_SECONDS" in spec.env:
                    seconds = sim_seconds(spec.env["FAIRQ_SIM_SECONDS"])
                if "FAIRQ_SIM_EXIT_CODE" in spec.env:
                    exit_code = sim_exit_code(spec.env["FAIRQ_SIM_EXIT_CODE"])
                if "FAIRQ_SIM_FAIL_REPLICA" in spec.env:
                    index = sim_fail_replica(spec.env["FAIRQ_SIM_FAIL_REPLICA"])
                    if index < spec.replicas:
                        failed_replica, exit_code = index, exit_code or 1
            except ValueError as exc:
                seconds, exit_code, problem = 0.0, 1, str(exc)
                failed_replica = None
            self._workloads[spec.name] = _Workload(
                spec=spec, nodes=placement, started_at=now, run_seconds=seconds,
                exit_code=exit_code, problem=problem, failed_replica=failed_replica,
                log=[f"{now.isoformat()} started {spec.name} on {', '.join(placement)}"],
            )

    def _advance(self, w: _Workload, now: datetime) -> None:
        if w.finished_at is None:
            try:
                end = w.started_at + timedelta(seconds=w.run_seconds)
            except OverflowError:  # only a workload built around the checks: end it now
                end, w.exit_code = w.started_at, 1
                w.problem = w.problem or "its run time is out of range"
            if now >= end:
                w.finished_at = end
                if w.failed_replica is not None and not w.problem:
                    w.log.append(f"{end.isoformat()} replica {w.failed_replica} exited with "
                                 f"code {w.exit_code}; the other replicas were stopped")
                else:
                    w.log.append(f"{end.isoformat()} " + (
                        w.problem or f"exited with code {w.exit_code}"))
        if w.finished_at is not None and not w.released:
            for name in w.nodes:
                self._nodes[name].allocated -= w.spec.gpus_per_replica
            w.released = True

    def stop(self, name: str, *, now: datetime) -> None:
        with self._lock:
            w = self._workloads.pop(name, None)
            if w is None:
                return
            self._advance(w, now)
            if not w.released:
                for node in w.nodes:
                    self._nodes[node].allocated -= w.spec.gpus_per_replica

    def statuses(self, *, now: datetime) -> list[WorkloadStatus]:
        with self._lock:
            out = []
            for w in self._workloads.values():
                self._advance(w, now)
                if w.finished_at is None:
                    phase = Phase.RUNNING
                else:
                    phase = Phase.SUCCEEDED if w.exit_code == 0 and not w.problem \
                        else Phase.FAILED
                reason = "" if phase != Phase.FAILED else (
                    f"not run: {w.problem}" if w.problem else
                    f"replica {w.failed_replica} failed: exit code {w.exit_code}"
                    if w.failed_replica is not None else f"exit code {w.exit_code}")
                out.append(WorkloadStatus(
                    name=w.spec.name, job_id=w.spec.job_id, attempt=w.spec.attempt,
                    phase=phase, started_at=w.started_at, finished_at=w.finished_at,
                    exit_code=None if w.finished_at is None or w.problem else w.exit_code,
                    reason=reason, nodes=w.nodes,
                ))
            return out

    def logs(self, name: str, *, tail: int = 100) -> str:
        with self._lock:
            w = self._workloads.get(name)
            return "" if w is None else "\n".join(w.log[-tail:])
