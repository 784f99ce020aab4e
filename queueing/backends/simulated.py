"""An in-process cluster of GPU nodes: the embedded default for the demo and fast tests.

A workload's replicas are placed on nodes with room (all or none, best fit), run for
`FAIRQ_SIM_SECONDS` from the job's env (or a default), then succeed, or fail with
`FAIRQ_SIM_EXIT_CODE` when it is set and not 0. Time comes from the caller (`now`), so
a simulator can drive it with a virtual clock.

Replicas are all or nothing, as on Kubernetes (docs/kubernetes.md, "Replicas that
rendezvous"): with `FAIRQ_SIM_FAIL_REPLICA=<index>` (0-based, below the job's replicas)
that one replica fails at the end of its run (with `FAIRQ_SIM_EXIT_CODE`, or 1 when that
is unset or 0), the others are stopped with it, and the workload fails with the reason
"replica <index> failed: exit code <n>". Each replica has its own log, headed
`==> <replica host> <==` as the Kubernetes backend heads each pod's.

It is a utilization source too (base.UtilizationSource, docs/scheduling.md "Idle GPUs"):
a running workload whose env has `FAIRQ_SIM_GPU_UTIL` ('90,90,3': SM activity per minute
of its run, the last value holding) reports one reading per replica pod; one without it
reports none (no data is not idle).

The knobs are validated at submit (`queueing.validation.sim_seconds`, `sim_exit_code`,
`sim_fail_replica`);
a workload whose knobs are invalid anyway (a row older than that validation) fails at
once with the reason, and nothing in here raises for one workload's values.

A stopped workload (preempted, cancelled, reclaimed as idle) stops gracefully, as a pod
does (docs/kubernetes.md, "Graceful stop"): each replica's log records the job's stop
signal, and the workload keeps its GPUs, listed as `stopping`, while its simulated
program saves and exits (`stop_seconds`, FAIRQ_SIM_STOP_SECONDS), at most its grace
(`termination_grace_seconds`: past it, it is killed); then it frees them and leaves the
list. Time moves on through `statuses(now=...)`, which the cycle calls first.

State lives in this process: run it in one worker process (the demo does; docker-compose
runs the worker with --concurrency=1 when the simulated backend is selected).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar

from queueing.validation import (
    MAX_RUNTIME_SECONDS,
    parse_bytes,
    parse_cpu,
    sim_exit_code,
    sim_fail_replica,
    sim_gpu_util,
    sim_seconds,
)

from .base import (
    LaunchSpec,
    NodeInfo,
    Phase,
    PodReading,
    WorkloadStatus,
    replica_host,
    spot_reclaimed_reason,
)
from .notebook_local import LocalNotebooks

# `statuses` gives a workload's last status object again while it says the same
# (False: the plain path, `statuses_reference`'s; bench/bench_fleet_cycle.py --legacy).
KEEP_STATUSES = True

# How many stopped workloads' logs stay readable (the newest ones).
STOPPED_LOGS_KEPT = 10_000


class SimulatedClusterError(Exception):
    pass


@dataclass
class _Node:
    name: str
    gpu_type: str
    capacity: int
    allocated: int = 0
    cpu_millicores: int | None = None  # None: not said, no constraint (rule A6)
    memory_bytes: int | None = None
    cpu_allocated: int = 0
    memory_allocated: int = 0
    topology: dict[str, str] = field(default_factory=dict)
    spot: bool = False  # rules K4, K6: interruptible capacity (the spec's `:spot`)
    labels: dict[str, str] = field(default_factory=dict)  # the spec's `+KEY=VALUE`s

    def holds(self, spec: LaunchSpec, n: int = 1) -> bool:
        """Room for `n` more replicas of `spec`: GPUs, CPU and memory (rule A6)."""
        return (self.capacity - self.allocated >= n * spec.units
                and (self.cpu_millicores is None or self.cpu_millicores - self.cpu_allocated
                     >= n * (spec.cpu_millicores or 0))
                and (self.memory_bytes is None or self.memory_bytes - self.memory_allocated
                     >= n * (spec.memory_bytes or 0)))

    def take(self, spec: LaunchSpec, sign: int = 1) -> None:
        self.allocated += sign * spec.units
        self.cpu_allocated += sign * (spec.cpu_millicores or 0)
        self.memory_allocated += sign * (spec.memory_bytes or 0)


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
    gpu_util: tuple[float, ...] = ()  # FAIRQ_SIM_GPU_UTIL, per minute of its run
    released: bool = False
    stopped: bool = False
    # Graceful stop: when it ends (its program saved and exited, or its grace ran out);
    # None while it is not stopping.
    stop_at: datetime | None = None
    reclaimed: str = ""  # rule K6: spot_reclaimed_reason when its node was reclaimed
    # One log per replica, in replica order (`logs` heads each, as the Kubernetes backend
    # heads each pod's).
    log: list[list[str]] = field(default_factory=list)
    # A notebook session's local server (`LocalNotebooks`): its port, None without one.
    notebook_port: int | None = None
    # `statuses` keeps the last status it built, with what it was built from: the same
    # object again while nothing it says changed (150,000 workloads a cycle at fleet
    # size; reconcile compares them by identity first).
    kept: tuple[object, WorkloadStatus] | None = None


# Per GPU when a pool does not say (docs/kubernetes.md, "The simulated cluster"): an
# 8-GPU node gets 96 CPUs and 1 TiB of memory, a 7-slice MIG node 84 CPUs and 896 GiB.
SIM_CPU_MILLICORES_PER_GPU = 12_000
SIM_MEMORY_BYTES_PER_GPU = 128 * 2**30

_POOL_RE = re.compile(
    r"^(?P<count>\d+)x(?P<gpus>\d+)x(?P<type>[a-z0-9]([-a-z0-9]*[a-z0-9])?)"
    r"(?::(?P<cpu>[0-9.]+m?)c)?(?::(?P<memory>[0-9.]+[KMGTPE]i?))?(?P<spot>:spot)?"
    r"(?P<labels>(?:\+[A-Za-z0-9][-A-Za-z0-9_./]*=[-A-Za-z0-9_.]*)*)"
    r"(?P<levels>(?:@[a-z][-a-z0-9]*=\d+)*)\Z", re.ASCII)


@dataclass(frozen=True)
class SimPool:
    """One FAIRQ_SIM_NODES item: `count` nodes of `gpus` GPUs of `gpu_type`, each with
    `cpu_millicores` and `memory_bytes` to allocate; `domains`: per topology level, how
    many consecutive nodes share one domain (rule A7)."""

    count: int
    gpus: int
    gpu_type: str
    cpu_millicores: int
    memory_bytes: int
    domains: tuple[tuple[str, int], ...] = ()
    spot: bool = False  # rules K4, K6: `:spot`, interruptible capacity
    # `+KEY=VALUE`: labels every node of the pool carries (its `NodePool`, rule C4).
    labels: tuple[tuple[str, str], ...] = ()


def parse_node_spec(spec: str) -> list[SimPool]:
    """'4x8xh100:96c:1Ti@rack=2,2x7xmig-1g-10gb,2x8xa100:spot+zone=b' -> the pools:
    COUNTxGPUSxTYPE, then optionally :<cpus>c and :<memory> (default 12 CPUs and 128Gi
    per GPU), then optionally :spot (interruptible nodes, rules K4 and K6), then any
    number of +<label>=<value> (labels of its nodes: which `NodePool` they are in, rule
    C4), then any number of @<level>=<nodes per domain>."""
    pools: list[SimPool] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = _POOL_RE.match(part)
        if m is None:
            raise SimulatedClusterError(
                f"bad FAIRQ_SIM_NODES pool {part!r}: want COUNTxGPUSxTYPE[:CPUSc][:MEMORY]"
                "[:spot][+LABEL=VALUE...][@LEVEL=NODES...], e.g. 4x8xh100, 4x8xh100:96c:1Ti@rack=2 or "
                "2x8xa100:spot")
        count, gpus = int(m["count"]), int(m["gpus"])
        if count <= 0 or gpus <= 0:
            raise SimulatedClusterError(f"bad FAIRQ_SIM_NODES pool {part!r}: count and GPUs "
                                        "must be at least 1")
        try:
            cpu = parse_cpu(m["cpu"]) if m["cpu"] else gpus * SIM_CPU_MILLICORES_PER_GPU
            memory = parse_bytes(m["memory"]) if m["memory"] else \
                gpus * SIM_MEMORY_BYTES_PER_GPU
        except ValueError as exc:
            raise SimulatedClusterError(f"bad FAIRQ_SIM_NODES pool {part!r}: {exc}") from exc
        domains: list[tuple[str, int]] = []
        for item in filter(None, m["levels"].split("@")):
            level, _, per = item.partition("=")
            if int(per) <= 0 or any(level == d for d, _ in domains):
                raise SimulatedClusterError(f"bad FAIRQ_SIM_NODES pool {part!r}: "
                                            f"@{item} (nodes per domain >= 1, once per level)")
            domains.append((level, int(per)))
        labels = tuple((k, v) for k, _, v in (item.partition("=") for item in
                                               filter(None, m["labels"].split("+"))))
        pools.append(SimPool(count, gpus, m["type"], cpu, memory, tuple(domains),
                             spot=bool(m["spot"]), labels=labels))
    return pools


class SimulatedCluster:
    # Capabilities (base.ClusterBackend): in this process, no cluster client (web
    # processes may read it when the worker published nothing); nothing to provision.
    in_process: ClassVar[bool] = True
    provisions: ClassVar[bool] = False

    def __init__(self, nodes: Iterable[_Node | tuple[str, str, int]], *,
                 default_seconds: float = 60.0, stop_seconds: float = 0.0,
                 units_per_gpu: Callable[[], Mapping[str, int]] | None = None,
                 notebooks: LocalNotebooks | None = None):
        """`nodes`: built by `from_spec`, or (name, GPU type, GPUs) without CPU, memory
        or topology. `stop_seconds`: how long a stopped workload's program takes to save
        and exit after its stop signal (at most its grace); 0 frees its GPUs at once.
        `units_per_gpu()`: per GPU type, the units one GPU counts (shared GPUs: a
        time-sliced or MPS type's slices per GPU; absent: 1), read whenever the nodes
        are: a node reports and takes its GPUs x that (docs/kubernetes.md, "Shared
        GPUs"), as a device plugin's replicas do. `notebooks`: real local servers for
        notebook sessions (None: a session runs no server, and reports no address)."""
        self.notebooks = notebooks
        self._lock = threading.Lock()
        self._nodes = {n.name: n for n in (x if isinstance(x, _Node) else _Node(*x)
                                           for x in nodes)}
        # What FAIRQ_SIM_NODES says, in GPUs, per node (capacity is in units).
        self._gpus = {n.name: n.capacity for n in self._nodes.values()}
        self._units_per_gpu = units_per_gpu
        self._units_known = False  # read once before a first submit, then by nodes()
        self._workloads: dict[str, _Workload] = {}
        # The logs of stopped workloads, newest last: readable after the stop, as a
        # Kubernetes Job's pods stay until its TTL, so the logs task can keep the tail
        # with the exit line (docs/deployment.md, "Log storage").
        self._stopped_logs: OrderedDict[str, list[list[str]]] = OrderedDict()
        self.default_seconds = min(max(0.0, default_seconds), float(MAX_RUNTIME_SECONDS))
        self.stop_seconds = min(max(0.0, stop_seconds), float(MAX_RUNTIME_SECONDS))
        # Nodes taken away by `reclaim_node`, until `restore_node` brings them back.
        self._reclaimed_nodes: dict[str, _Node] = {}

    def _units_read(self) -> None:
        """Each node's capacity in its type's units now (its GPUs x `units_per_gpu`)."""
        if self._units_per_gpu is None:
            return
        units = self._units_per_gpu()
        self._units_known = True
        for n in (*self._nodes.values(), *self._reclaimed_nodes.values()):
            n.capacity = self._gpus.get(n.name, n.capacity) * max(1, units.get(n.gpu_type, 1))

    @classmethod
    def from_spec(cls, spec: str, *, default_seconds: float = 60.0,
                  stop_seconds: float = 0.0,
                  units_per_gpu: Callable[[], Mapping[str, int]] | None = None,
                  notebooks: LocalNotebooks | None = None) -> SimulatedCluster:
        nodes = []
        # Node names are unique within the cluster: a second pool of a GPU type (its spot
        # nodes, say) numbers on from the first (sim-a100-000..003, then -004...).
        numbered: dict[str, int] = {}
        for pool in parse_node_spec(spec):
            first = numbered.get(pool.gpu_type, 0)
            numbered[pool.gpu_type] = first + pool.count
            for i in range(pool.count):
                # Domain <type>-<level>-<k>: nodes i of a pool with N per domain share k = i // N.
                topology = {level: f"{pool.gpu_type}-{level}-{(first + i) // per}"
                            for level, per in pool.domains}
                nodes.append(_Node(f"sim-{pool.gpu_type}-{first + i:03d}", pool.gpu_type,
                                   pool.gpus, cpu_millicores=pool.cpu_millicores,
                                   memory_bytes=pool.memory_bytes, topology=topology,
                                   spot=pool.spot, labels=dict(pool.labels)))
        return cls(nodes, default_seconds=default_seconds, stop_seconds=stop_seconds,
                   units_per_gpu=units_per_gpu, notebooks=notebooks)

    def nodes(self) -> list[NodeInfo]:
        with self._lock:
            self._units_read()
            return [NodeInfo(n.name, n.gpu_type, n.capacity, n.allocated,
                             cpu_millicores=n.cpu_millicores, cpu_allocated=n.cpu_allocated,
                             memory_bytes=n.memory_bytes, memory_allocated=n.memory_allocated,
                             topology=dict(n.topology), spot=n.spot,
                             labels=dict(n.labels))
                    for n in self._nodes.values()]

    def _place(self, spec: LaunchSpec) -> tuple[str, ...] | None:
        """The planned placement when it still fits, else best fit by free GPUs (rules
        A3, A6: GPUs, CPU and memory), within the pinned topology domain if any (rule
        A7); all or none. The planned placement is checked on its own nodes first (no
        walk over the cluster's: 5,000 nodes a submit at fleet size)."""
        planned = list(spec.placement)
        if len(planned) == spec.replicas and planned:
            own = [self._nodes.get(p) for p in planned]
            if all(n is not None and n.gpu_type == spec.gpu_type and (
                    not spec.topology_level
                    or n.topology.get(spec.topology_level) == spec.topology_domain)
                   for n in own) and all(
                    self._nodes[p].holds(spec, planned.count(p)) for p in set(planned)):
                return tuple(planned)
        nodes = [n for n in self._nodes.values() if n.gpu_type == spec.gpu_type and (
            not spec.topology_level
            or n.topology.get(spec.topology_level) == spec.topology_domain)]
        taken: list[_Node] = []
        try:
            for _ in range(spec.replicas):
                fits = [(n.capacity - n.allocated, n.name, n) for n in nodes if n.holds(spec)]
                if not fits:
                    return None
                best = min(fits, key=lambda f: (f[0], f[1]))[2]
                best.take(spec)
                taken.append(best)
            return tuple(n.name for n in taken)
        finally:
            for n in taken:  # only a trial: `submit` takes the room
                n.take(spec, -1)

    def submit(self, spec: LaunchSpec, *, now: datetime) -> None:
        with self._lock:
            if spec.name in self._workloads:
                return  # idempotent: the name is the identity
            if not self._units_known:
                self._units_read()  # else as the last `nodes()` (each cycle) read them
            placement = self._place(spec)
            if placement is None:
                raise SimulatedClusterError(
                    f"{spec.name}: {spec.replicas} × {spec.gpus_per_replica} {spec.gpu_type} "
                    "GPUs (with their CPU and memory) do not fit on the simulated nodes"
                )
            for name in placement:
                self._nodes[name].take(spec)
            seconds, exit_code, problem = self.default_seconds, 0, ""
            if spec.notebook_prefix:
                # A session's server runs until it is stopped, at most its time limit
                # (on Kubernetes the Job's activeDeadlineSeconds ends it).
                seconds = float(min(spec.max_runtime_seconds or MAX_RUNTIME_SECONDS,
                                    MAX_RUNTIME_SECONDS))
            failed_replica: int | None = None
            gpu_util: tuple[float, ...] = ()
            try:
                if "FAIRQ_SIM_GPU_UTIL" in spec.env:
                    gpu_util = sim_gpu_util(spec.env["FAIRQ_SIM_GPU_UTIL"])
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
                gpu_util=gpu_util,
                log=[[f"{now.isoformat()} started {spec.name}"
                      + (f" replica {i} of {spec.replicas}" if spec.replicas > 1 else "")
                      + f" on {node}"] for i, node in enumerate(placement)],
            )
            if spec.notebook_prefix and self.notebooks is not None and not problem:
                w = self._workloads[spec.name]
                w.notebook_port = self.notebooks.start(spec)
                w.log[0].append(f"{now.isoformat()} jupyter lab on 127.0.0.1:{w.notebook_port}"
                                f"{spec.notebook_prefix}")

    def reclaim_node(self, name: str, *, now: datetime) -> list[str]:
        """Rule K6 on the simulated cluster: spot node `name` is reclaimed at `now` — it
        leaves `nodes()`, and every workload running a replica on it ends there, FAILED
        with `spot_reclaimed_reason` (all its replicas stop: all or nothing), its GPUs
        given back. Returns those workloads' names; an unknown node raises
        SimulatedClusterError. `restore_node` brings the node back."""
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                raise SimulatedClusterError(f"no simulated node {name!r} to reclaim")
            hit = []
            for w in self._workloads.values():
                self._advance(w, now)
                if name not in w.nodes or w.finished_at is not None:
                    continue
                w.finished_at, w.exit_code = now, 1
                w.reclaimed = spot_reclaimed_reason(name, "deleted")
                for lines in w.log:
                    lines.append(f"{now.isoformat()} stopped: spot node {name} was reclaimed")
                for n in w.nodes:
                    self._nodes[n].take(w.spec, -1)
                w.released = True
                hit.append(w.spec.name)
            self._reclaimed_nodes[name] = _Node(
                node.name, node.gpu_type, node.capacity, cpu_millicores=node.cpu_millicores,
                memory_bytes=node.memory_bytes, topology=dict(node.topology))
            del self._nodes[name]
            return hit

    def restore_node(self, name: str) -> None:
        """The node `reclaim_node` took comes back, empty (spot capacity returning)."""
        with self._lock:
            node = self._reclaimed_nodes.pop(name, None)
            if node is None:
                raise SimulatedClusterError(f"simulated node {name!r} was not reclaimed")
            self._nodes[name] = node

    def _advance(self, w: _Workload, now: datetime) -> None:
        if w.finished_at is None and w.stop_at is not None and now >= w.stop_at:
            # Its graceful stop is over: saved and exited, or killed at its grace's end.
            grace = w.spec.termination_grace_seconds
            killed = grace is not None and grace < self.stop_seconds
            w.finished_at = w.stop_at
            for lines in w.log:
                lines.append(f"{w.stop_at.isoformat()} " + (
                    f"killed (SIGKILL): its grace of {grace} s ran out" if killed else
                    f"exited after {w.spec.stop_signal or 'SIGTERM'}"))
        if w.finished_at is None:
            try:
                end = w.started_at + timedelta(seconds=w.run_seconds)
            except OverflowError:  # only a workload built around the checks: end it now
                end, w.exit_code = w.started_at, 1
                w.problem = w.problem or "its run time is out of range"
            if now >= end:
                w.finished_at = end
                for i, lines in enumerate(w.log):
                    if w.failed_replica is not None and not w.problem:
                        lines.append(f"{end.isoformat()} " + (
                            f"exited with code {w.exit_code}" if i == w.failed_replica else
                            f"stopped: replica {w.failed_replica} failed"))
                    else:
                        lines.append(f"{end.isoformat()} " + (
                            w.problem or f"exited with code {w.exit_code}"))
        if w.finished_at is not None and not w.released:
            for name in w.nodes:
                self._nodes[name].take(w.spec, -1)
            w.released = True
        if w.finished_at is not None and w.notebook_port is not None:
            w.notebook_port = None
            if self.notebooks is not None:
                self.notebooks.stop(w.spec.name)

    def _forget(self, name: str) -> None:
        """Drop workload `name` from the list, its logs kept readable (a notebook
        session's server ends with it)."""
        w = self._workloads.pop(name)
        if w.notebook_port is not None and self.notebooks is not None:
            self.notebooks.stop(name)
        self._stopped_logs[name] = w.log
        while len(self._stopped_logs) > STOPPED_LOGS_KEPT:
            self._stopped_logs.popitem(last=False)

    def _reap(self, now: datetime) -> None:
        """Forget the stopped workloads whose graceful stop is over (GPUs freed)."""
        for name in [n for n, w in self._workloads.items() if w.stop_at is not None]:
            w = self._workloads[name]
            self._advance(w, now)
            if w.finished_at is not None:
                self._forget(name)

    def stop(self, name: str, *, now: datetime) -> None:
        """End the workload. One still running gets its stop signal (a line in each
        replica's log) and keeps its GPUs, listed as `stopping`, for `stop_seconds` or
        its grace, whichever is shorter; one that ended is forgotten at once. A second
        stop of a stopping workload is a no-op; unknown names are one too."""
        with self._lock:
            w = self._workloads.get(name)
            if w is None or w.stop_at is not None:
                return
            self._advance(w, now)
            if w.finished_at is None:
                grace = w.spec.termination_grace_seconds
                hold = self.stop_seconds if grace is None else min(self.stop_seconds,
                                                                   float(grace))
                for lines in w.log:
                    lines.append(f"{now.isoformat()} received {w.spec.stop_signal or 'SIGTERM'}"
                                 f" (stop signal)")
                w.stop_at = now + timedelta(seconds=hold)
                self._advance(w, now)
                if w.finished_at is None:
                    return  # stopping: listed, holding its GPUs, until `stop_at`
            self._forget(name)

    def statuses(self, *, now: datetime) -> list[WorkloadStatus]:
        """Every listed workload's status at `now` (time moves on first). A workload
        whose status says what it said last time gives the same object
        (`_status_of`; `statuses_reference` builds each anew, held to it by a test)."""
        with self._lock:
            self._reap(now)
            out = []
            for w in self._workloads.values():
                self._advance(w, now)
                key = (w.finished_at, w.exit_code, w.problem, w.reclaimed,
                       w.stop_at is not None, w.notebook_port, w.failed_replica)
                kept = w.kept
                if kept is not None and kept[0] == key and KEEP_STATUSES:
                    out.append(kept[1])
                    continue
                status = self._status_of(w)
                w.kept = (key, status)
                out.append(status)
            return out

    def statuses_reference(self, *, now: datetime) -> list[WorkloadStatus]:
        """`statuses` building every status anew (the plain path)."""
        with self._lock:
            self._reap(now)
            out = []
            for w in self._workloads.values():
                self._advance(w, now)
                out.append(self._status_of(w))
            return out

    @staticmethod
    def _status_of(w: _Workload) -> WorkloadStatus:
        if w.finished_at is None:
            phase = Phase.RUNNING
        else:
            phase = Phase.SUCCEEDED if w.exit_code == 0 and not w.problem \
                else Phase.FAILED
        reason = "" if phase != Phase.FAILED else w.reclaimed or (
            f"not run: {w.problem}" if w.problem else
            f"replica {w.failed_replica} failed: exit code {w.exit_code}"
            if w.failed_replica is not None else f"exit code {w.exit_code}")
        return WorkloadStatus(
            name=w.spec.name, job_id=w.spec.job_id, attempt=w.spec.attempt,
            phase=phase, started_at=w.started_at, finished_at=w.finished_at,
            exit_code=None if w.finished_at is None or w.problem or w.reclaimed
            else w.exit_code,
            reason=reason, nodes=w.nodes, stopping=w.stop_at is not None,
            address="127.0.0.1" if phase == Phase.RUNNING and w.notebook_port else "",
            port=w.notebook_port if phase == Phase.RUNNING else None,
        )

    def readings(self, *, now: datetime) -> list[PodReading]:
        """Per replica of each running workload with `FAIRQ_SIM_GPU_UTIL`: its SM activity
        for the minute of its run `now` is in, and frame buffer in use (2 GiB plus 0.4 GiB
        per percent, per GPU)."""
        out: list[PodReading] = []
        with self._lock:
            self._reap(now)
            for w in self._workloads.values():
                self._advance(w, now)
                if w.finished_at is not None or not w.gpu_util or now < w.started_at:
                    continue
                minute = int((now - w.started_at).total_seconds() // 60)
                sm = w.gpu_util[min(minute, len(w.gpu_util) - 1)]
                fb = w.spec.gpus_per_replica * int((2 + 0.4 * sm) * 2**30)
                out.extend(PodReading(job_id=w.spec.job_id, attempt=w.spec.attempt,
                                      pod=f"{w.spec.name}-{r}-sim", sm_percent=sm,
                                      fb_used_bytes=fb) for r in range(w.spec.replicas))
        return out

    def logs(self, name: str, *, tail: int = 100) -> str:
        with self._lock:
            w = self._workloads.get(name)
            logs = w.log if w is not None else self._stopped_logs.get(name)
            if not logs:
                return ""
            if len(logs) == 1:
                return "\n".join(logs[0][-tail:])
            return "\n".join(line for i, lines in enumerate(logs)
                             for line in (f"==> {replica_host(name, i)} <==", *lines[-tail:]))
