"""A fake kubelet for envtest: "runs" pods bound to fake nodes, in a thread.

There is no container runtime. A pod bound (by kube-scheduler) to a node
labelled ``FAKE_NODE_LABEL`` is driven through the phases a kubelet would
report, timed by its containers' environment:

- ``FAIRQ_SIM_SECONDS``: how long the container "runs" (float; unset means it
  runs until the pod is deleted);
- ``FAIRQ_SIM_EXIT_CODE``: its exit code when that time is up (default 0);
- ``FAIRQ_SIM_FAIL_REPLICA``: in a multi-replica job (``NODE_RANK`` set by fairq), the
  replica of that index exits at ``FAIRQ_SIM_SECONDS`` with ``FAIRQ_SIM_EXIT_CODE`` (1
  when unset or 0) and the others run until deleted, as replicas waiting on a dead peer
  in a collective would.

Pending -> Running (startTime, containerStatuses running/startedAt, Ready
conditions, a pod IP) -> Succeeded, or Failed when a container exits
non-zero. ``restartPolicy`` is honoured the way a kubelet does: with
``OnFailure`` a failed container restarts in place (restartCount + 1,
lastState terminated) and with ``Always`` every exit restarts it.

A pod with ``deletionTimestamp`` set is deleted with grace period 0: that is
the kubelet's half of graceful deletion, and it is how a preemption by
kube-scheduler (which deletes its victims) or a Job deletion completes.

It also keeps every fake node's Ready condition heartbeat fresh.

Events arrive through a pod watch; a periodic full resync (list) covers
anything a watch dropped and drives the timers. Only the values of
``env[].value`` are read: ``valueFrom`` is ignored.

**Exec mode** (opt-in: ``FAIRQ_SIM_EXEC=1`` in a container's env, or its image named
in ``FakeKubelet.exec_images``): the container's command and args run for real, as a
local subprocess, with the container's env values (plus ``PATH`` with this Python's
directory first, ``PYTHONUNBUFFERED=1`` unless set). Its PVC mounts map to local
directories (``FakeKubelet.exec_claims``: claim name -> directory): a mount path at the
start of an argument, of an ``x=<path>`` argument or of an env value is rewritten to
the claim's directory; its pod reports ``FakeKubelet.exec_pod_ip`` as its podIP when that
is set (127.0.0.1: where its programs listen). Its stdout and stderr go to one file per pod
(``pod_log(namespace, name)``: what a test serves as the pod's log). The container runs
until the process exits (its exit code, 128 + the signal's number when killed by one);
on deletion the process gets the container's ``FAIRQ_STOP_SIGNAL`` (SIGTERM when
unset; what fairq's preStop hook sends), then SIGKILL once the pod's
``deletionGracePeriodSeconds`` have passed; the pod's terminated status is written,
then, ``teardown_seconds`` (1 s) later, the pod is deleted, as a kubelet does once it
has torn the pod's volumes down.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.envtest.cluster import FAKE_NODE_LABEL

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

# The client's models type every field as Optional (they mirror the wire
# format), while a pod bound to a node always has metadata, spec and the
# fields read here; annotating them as Any keeps the code free of asserts.
V1Pod = Any
V1Container = Any

__all__ = ["SIM_EXIT_CODE_ENV", "SIM_SECONDS_ENV", "FakeKubelet"]

SIM_SECONDS_ENV = "FAIRQ_SIM_SECONDS"
SIM_EXIT_CODE_ENV = "FAIRQ_SIM_EXIT_CODE"
SIM_FAIL_REPLICA_ENV = "FAIRQ_SIM_FAIL_REPLICA"
SIM_EXEC_ENV = "FAIRQ_SIM_EXEC"
STOP_SIGNAL_ENV = "FAIRQ_STOP_SIGNAL"

log = logging.getLogger("fairq.envtest.fake_kubelet")


def _now() -> dt.datetime:
    # Kept precise internally so a 2 s run lasts 2 s; the API only stores
    # whole seconds (see _iso), so reported times are truncated.
    return dt.datetime.now(dt.UTC)


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _env_value(container: V1Container, name: str) -> str | None:
    for env in container.env or ():
        if env.name == name:
            return env.value
    return None


def _fail_replica(container: V1Container) -> bool | None:
    """None without ``FAIRQ_SIM_FAIL_REPLICA``; else whether this container's replica
    (``NODE_RANK``) is the one that fails."""
    which = _env_value(container, SIM_FAIL_REPLICA_ENV)
    if which is None:
        return None
    return which.strip() == (_env_value(container, "NODE_RANK") or "0").strip()


def _sim_seconds(container: V1Container) -> float | None:
    if _fail_replica(container) is False:
        return None  # a peer fails: this replica waits on it until deleted
    raw = _env_value(container, SIM_SECONDS_ENV)
    if raw is None or raw == "":
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        log.warning("ignoring non-numeric %s=%r in container %s", SIM_SECONDS_ENV, raw, container.name)
        return None


def _sim_exit_code(container: V1Container) -> int:
    raw = _env_value(container, SIM_EXIT_CODE_ENV)
    try:
        code = int(raw) if raw else 0
        return (code or 1) if _fail_replica(container) else code
    except ValueError:
        log.warning("ignoring non-integer %s=%r in container %s", SIM_EXIT_CODE_ENV, raw, container.name)
        return 0


def _kill(run: _PodRun) -> None:
    for proc in run.procs:
        if proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


@dataclass
class _ContainerRun:
    """One container's simulated run, as the fake kubelet tracks it."""

    name: str
    image: str
    started_at: dt.datetime
    seconds: float | None
    exit_code: int
    restart_count: int = 0
    finished_at: dt.datetime | None = None
    last_exit_code: int | None = None
    last_started_at: dt.datetime | None = None
    last_finished_at: dt.datetime | None = None
    # Exec mode: the container's program, running as a local process.
    proc: subprocess.Popen[bytes] | None = None
    stop_signal: str = "SIGTERM"

    def due(self, now: dt.datetime) -> bool:
        if self.proc is not None:
            return self.finished_at is None and self.proc.poll() is not None
        return (
            self.finished_at is None
            and self.seconds is not None
            and now >= self.started_at + dt.timedelta(seconds=self.seconds)
        )


@dataclass
class _PodRun:
    uid: str
    namespace: str
    name: str
    node: str
    restart_policy: str
    started_at: dt.datetime
    pod_ip: str
    containers: list[_ContainerRun]
    init_containers: list[str]
    done: bool = False
    # Exec mode, once the pod is being deleted: when its processes are killed, and
    # when the pod is deleted once they have ended.
    kill_at: dt.datetime | None = None
    delete_at: dt.datetime | None = None

    @property
    def procs(self) -> list[subprocess.Popen[bytes]]:
        return [c.proc for c in self.containers if c.proc is not None]


class FakeKubelet:
    """Drives pods on fake nodes; ``start()`` spawns threads, ``stop()`` joins them.

    ``api_client_factory`` returns a fresh ``kubernetes.client.ApiClient``;
    each thread gets its own (urllib3 pools are shared, configs are not
    meant to be mutated concurrently).
    """

    def __init__(
        self,
        api_client_factory: Callable[[], ApiClient],
        *,
        resync_seconds: float = 5.0,
        tick_seconds: float = 0.25,
        heartbeat_seconds: float = 10.0,
        watch_timeout_seconds: int = 5,
    ) -> None:
        self._factory = api_client_factory
        self.resync_seconds = resync_seconds
        self.tick_seconds = tick_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self._stop = threading.Event()
        # (event type, pod) from the watch thread; only the work thread touches
        # _runs, so no lock is needed.
        self._queue: queue.Queue[tuple[str, V1Pod]] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._runs: dict[str, _PodRun] = {}
        self._nodes: set[str] = set()
        self._ip_counter = 0
        self.errors: list[str] = []
        # Exec mode (module docstring): images whose containers run for real, the local
        # directory of each PVC claim, and where the pods' output goes.
        self.exec_images: set[str] = set()
        self.exec_claims: dict[str, str] = {}
        self.exec_cwd: str = os.getcwd()
        # The podIP an exec-mode pod reports: its programs listen on this machine, so a
        # server in the pod (a notebook session's) is reached at 127.0.0.1. None: a fake
        # address, like any other pod's.
        self.exec_pod_ip: str | None = None
        self.teardown_seconds = 1.0
        self._log_dir = tempfile.mkdtemp(prefix="fake-kubelet-logs-")
        self._logs: dict[tuple[str, str], str] = {}  # (namespace, pod) -> its output file

    # ------------------------------------------------------------------ API

    def start(self) -> FakeKubelet:
        if self._threads:
            raise RuntimeError("FakeKubelet already started")
        self._stop.clear()
        for target, name in ((self._watch_loop, "watch"), (self._work_loop, "work")):
            t = threading.Thread(target=target, name=f"fake-kubelet-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """Stop and join the threads (a watch may take its timeout to notice)."""
        self.request_stop()
        self.join(timeout)
        for run in list(self._runs.values()):
            _kill(run)

    def pod_log(self, namespace: str, name: str) -> str | None:
        """What pod `name`'s exec-mode containers wrote (stdout and stderr), also after the
        pod is gone; None for a pod that ran no program here."""
        path = self._logs.get((namespace, name))
        if path is None:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def request_stop(self) -> None:
        """Ask the threads to end without waiting; see ``join``."""
        self._stop.set()

    def join(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    # ------------------------------------------------------------- threads

    def _watch_loop(self) -> None:
        from kubernetes import client, watch
        from kubernetes.client.exceptions import ApiException

        api = self._factory()
        v1 = client.CoreV1Api(api)
        resource_version: str | None = None
        try:
            while not self._stop.is_set():
                try:
                    if resource_version is None:
                        pods: Any = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName!=")
                        for pod in pods.items:
                            self._queue.put(("ADDED", pod))
                        resource_version = pods.metadata.resource_version
                    w = watch.Watch()
                    # A short server-side timeout lets the loop notice stop()
                    # without having to break a blocked socket read.
                    for event in w.stream(
                        v1.list_pod_for_all_namespaces,
                        field_selector="spec.nodeName!=",
                        resource_version=resource_version,
                        timeout_seconds=self.watch_timeout_seconds,
                        _request_timeout=self.watch_timeout_seconds + 10,
                    ):
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            # 410 Gone (or anything odd): relist from scratch.
                            resource_version = None
                            break
                        resource_version = obj.metadata.resource_version
                        if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                            self._queue.put((event["type"], obj))
                        if self._stop.is_set():
                            w.stop()
                            break
                except ApiException as exc:
                    if exc.status == 410:
                        resource_version = None
                        continue
                    self._note_error(f"watch: {exc.status} {exc.reason}")
                    self._stop.wait(1.0)
                except Exception as exc:
                    if self._stop.is_set():
                        break
                    self._note_error(f"watch: {exc!r}")
                    resource_version = None
                    self._stop.wait(1.0)
        finally:
            api.close()

    def _work_loop(self) -> None:
        from kubernetes import client

        api = self._factory()
        v1 = client.CoreV1Api(api)
        next_resync = 0.0
        next_heartbeat = 0.0
        try:
            while not self._stop.is_set():
                now_m = time.monotonic()
                try:
                    if now_m >= next_heartbeat:
                        self._heartbeat(v1)
                        next_heartbeat = now_m + self.heartbeat_seconds
                    if now_m >= next_resync:
                        self._refresh_nodes(v1)
                        for pod in v1.list_pod_for_all_namespaces(field_selector="spec.nodeName!=").items:
                            self._reconcile(v1, pod)
                        self._gc_runs(v1)
                        next_resync = now_m + self.resync_seconds
                    self._advance_timers(v1)
                except Exception as exc:
                    self._note_error(f"work: {exc!r}")
                # Drain watch events until the next timer tick.
                tick_end = time.monotonic() + self.tick_seconds
                while not self._stop.is_set():
                    remaining = tick_end - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        kind, pod = self._queue.get(timeout=remaining)
                    except queue.Empty:
                        break
                    try:
                        if kind == "DELETED":
                            self._forget(pod.metadata.uid)
                        else:
                            self._reconcile(v1, pod)
                    except Exception as exc:
                        self._note_error(f"reconcile {pod.metadata.namespace}/{pod.metadata.name}: {exc!r}")
        finally:
            api.close()

    # ------------------------------------------------------------ helpers

    def _note_error(self, msg: str) -> None:
        if self._stop.is_set():
            return  # the apiserver going away during shutdown is expected
        log.warning("fake kubelet: %s", msg)
        self.errors.append(msg)
        del self.errors[:-100]

    def _refresh_nodes(self, v1: Any) -> None:
        nodes = v1.list_node(label_selector=f"{FAKE_NODE_LABEL}=true").items
        self._nodes = {n.metadata.name for n in nodes}

    def _heartbeat(self, v1: Any) -> None:
        self._refresh_nodes(v1)
        now = _iso(_now())
        for node in sorted(self._nodes):
            body = {
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "fake kubelet is posting ready status",
                            "lastHeartbeatTime": now,
                        }
                    ]
                }
            }
            try:
                v1.patch_node_status(node, body)
            except Exception as exc:
                self._note_error(f"heartbeat {node}: {exc!r}")

    def _forget(self, uid: str) -> None:
        run = self._runs.pop(uid, None)
        if run is not None:
            _kill(run)  # a pod deleted at once (grace 0): its processes go with it

    def _gc_runs(self, v1: Any) -> None:
        # Pods deleted while the watch was down leave their runs behind.
        live = {
            p.metadata.uid for p in v1.list_pod_for_all_namespaces(field_selector="spec.nodeName!=").items
        }
        for uid in list(self._runs):
            if uid not in live:
                self._forget(uid)

    def _next_ip(self) -> str:
        self._ip_counter += 1
        n = self._ip_counter
        return f"10.244.{(n // 250) % 250}.{n % 250 + 2}"

    def _reconcile(self, v1: Any, pod: V1Pod) -> None:
        from kubernetes.client.exceptions import ApiException

        node = pod.spec.node_name
        if not node:
            return
        if node not in self._nodes:
            # A node added since the last resync: look again before ignoring.
            self._refresh_nodes(v1)
            if node not in self._nodes:
                return
        uid = pod.metadata.uid
        run = self._runs.get(uid)
        if pod.metadata.deletion_timestamp is not None and run is not None and run.procs \
                and not run.done:
            self._stop_programs(run, pod)  # exec mode: deleted once they have exited
            return
        if pod.metadata.deletion_timestamp is not None:
            from kubernetes import client

            try:
                v1.delete_namespaced_pod(
                    pod.metadata.name,
                    pod.metadata.namespace,
                    grace_period_seconds=0,
                    # The uid precondition guards a same-named successor pod
                    # (StatefulSet-style) from being deleted by mistake.
                    body=client.V1DeleteOptions(
                        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
                    ),
                )
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
            self._forget(uid)
            return
        phase = pod.status.phase if pod.status else None
        if phase in ("Succeeded", "Failed"):
            self._forget(uid)
            return
        if uid not in self._runs:
            run = self._adopt(pod)
            self._write_status(v1, run)
            # Recorded only once the API has it, so a failed write is retried
            # by the next event or resync instead of being forgotten.
            self._runs[uid] = run
            if phase != "Running":
                self._event(v1, pod, "Started", f"Started (fake) on {node}")

    def _adopt(self, pod: V1Pod) -> _PodRun:
        """Build the run for a pod: fresh if Pending, resumed if already Running."""
        now = _now()
        status = pod.status
        running = status is not None and status.phase == "Running"
        started = (status.start_time if running and status.start_time else now).astimezone(dt.UTC)
        known = {cs.name: cs for cs in (status.container_statuses or ())} if running else {}
        containers = []
        for c in pod.spec.containers:
            cs = known.get(c.name)
            c_started = started
            restarts = 0
            if cs is not None:
                restarts = cs.restart_count or 0
                if cs.state and cs.state.running and cs.state.running.started_at:
                    c_started = cs.state.running.started_at.astimezone(dt.UTC)
            containers.append(
                _ContainerRun(
                    name=c.name,
                    image=c.image or "",
                    started_at=c_started,
                    seconds=_sim_seconds(c),
                    exit_code=_sim_exit_code(c),
                    restart_count=restarts,
                    proc=self._exec(pod, c) if self._execs(c) else None,
                    stop_signal=_env_value(c, STOP_SIGNAL_ENV) or "SIGTERM",
                )
            )
        return _PodRun(
            uid=pod.metadata.uid,
            namespace=pod.metadata.namespace,
            name=pod.metadata.name,
            node=pod.spec.node_name,
            restart_policy=pod.spec.restart_policy or "Always",
            started_at=started,
            pod_ip=(status.pod_ip if running and status.pod_ip
                    else self.exec_pod_ip if self.exec_pod_ip and any(c.proc for c in containers)
                    else self._next_ip()),
            containers=containers,
            init_containers=[c.name for c in pod.spec.init_containers or ()],
        )

    def _advance_timers(self, v1: Any) -> None:
        now = _now()
        for run in list(self._runs.values()):
            if run.done or not any(c.due(now) for c in run.containers):
                continue
            for c in run.containers:
                if not c.due(now):
                    continue
                finished = c.started_at + dt.timedelta(seconds=c.seconds or 0)
                if c.proc is not None:  # exec mode: it ended now, with its own code
                    code = c.proc.returncode
                    finished, c.exit_code = now, 128 - code if code < 0 else code
                restart = c.proc is None and (run.restart_policy == "Always" or (
                    run.restart_policy == "OnFailure" and c.exit_code != 0
                ))
                if restart:
                    c.last_exit_code = c.exit_code
                    c.last_started_at = c.started_at
                    c.last_finished_at = finished
                    c.restart_count += 1
                    c.started_at = now
                else:
                    c.finished_at = finished
            if all(c.finished_at is not None for c in run.containers):
                run.done = True
            try:
                self._write_status(v1, run)
            except Exception as exc:
                self._note_error(f"status {run.namespace}/{run.name}: {exc!r}")
                self._runs.pop(run.uid, None)
                continue
            if run.done and run.kill_at is not None:
                # Being deleted: the pod goes once its programs have, after the time a
                # kubelet takes to tear its volumes down (its log is readable until then).
                run.delete_at = now + dt.timedelta(seconds=self.teardown_seconds)
        for run in list(self._runs.values()):
            if run.kill_at is not None and not run.done and now >= run.kill_at:
                for proc in run.procs:  # the grace is over
                    if proc.poll() is None:
                        proc.kill()
            if run.delete_at is not None and now >= run.delete_at:
                self._delete_pod(v1, run)

    # ------------------------------------------------------------ exec mode

    def _execs(self, container: V1Container) -> bool:
        return (_env_value(container, SIM_EXEC_ENV) or "").strip() == "1" or \
            (container.image or "") in self.exec_images

    def _mounts(self, pod: V1Pod, container: V1Container) -> list[tuple[str, str]]:
        """(mount path, local directory) of the container's PVC mounts, longest first."""
        claims = {v.name: v.persistent_volume_claim.claim_name
                  for v in pod.spec.volumes or () if v.persistent_volume_claim}
        out = []
        for m in container.volume_mounts or ():
            claim = claims.get(m.name)
            if claim is not None and claim in self.exec_claims:
                out.append((m.mount_path.rstrip("/"), self.exec_claims[claim]))
        return sorted(out, key=lambda pair: -len(pair[0]))

    def _exec(self, pod: V1Pod, container: V1Container) -> subprocess.Popen[bytes]:
        mounts = self._mounts(pod, container)

        def local(value: str) -> str:
            key, eq, rest = value.partition("=") if value.startswith("-") else ("", "", value)
            for path, directory in mounts:
                if rest == path or rest.startswith(path + "/"):
                    return f"{key}{eq}{directory}{rest[len(path):]}"
            return value

        argv = [local(a) for a in [*(container.command or ()), *(container.args or ())]]
        if not argv:
            raise RuntimeError(f"{pod.metadata.name}: exec mode needs a command")
        env = {"PATH": os.pathsep.join([os.path.dirname(sys.executable),
                                        os.environ.get("PATH", "")]),
               "PYTHONUNBUFFERED": "1", "HOME": os.environ.get("HOME", "/tmp")}
        env.update({e.name: local(e.value) for e in container.env or ()
                    if e.value is not None})
        path = os.path.join(self._log_dir, f"{pod.metadata.namespace}_{pod.metadata.name}.log")
        self._logs[(pod.metadata.namespace, pod.metadata.name)] = path
        with open(path, "ab") as out:
            return subprocess.Popen(argv, env=env, cwd=self.exec_cwd, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _stop_programs(self, run: _PodRun, pod: V1Pod) -> None:
        """A pod being deleted: its programs get their stop signal once, and are killed
        when the deletion's grace is over (`_advance_timers`)."""
        if run.kill_at is not None:
            return
        grace = pod.metadata.deletion_grace_period_seconds
        run.kill_at = _now() + dt.timedelta(seconds=30 if grace is None else grace)
        for c in run.containers:
            if c.proc is not None and c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.send_signal(getattr(signal, c.stop_signal, signal.SIGTERM))

    def _delete_pod(self, v1: Any, run: _PodRun) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            v1.delete_namespaced_pod(
                run.name, run.namespace, grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=run.uid)))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
        self._runs.pop(run.uid, None)

    def _write_status(self, v1: Any, run: _PodRun) -> None:
        now = _iso(_now())
        statuses = []
        for c in run.containers:
            status: dict[str, Any] = {
                "name": c.name,
                "image": c.image,
                "imageID": f"fake://{c.image}",
                "containerID": f"fake://{run.uid}/{c.name}/{c.restart_count}",
                "restartCount": c.restart_count,
            }
            if c.finished_at is None:
                status.update(ready=True, started=True, state={"running": {"startedAt": _iso(c.started_at)}})
            else:
                status.update(
                    ready=False,
                    started=False,
                    state={
                        "terminated": {
                            "exitCode": c.exit_code,
                            "reason": "Completed" if c.exit_code == 0 else "Error",
                            "startedAt": _iso(c.started_at),
                            "finishedAt": _iso(c.finished_at),
                            "containerID": status["containerID"],
                        }
                    },
                )
            if c.last_exit_code is not None:
                status["lastState"] = {
                    "terminated": {
                        "exitCode": c.last_exit_code,
                        "reason": "Completed" if c.last_exit_code == 0 else "Error",
                        "startedAt": _iso(c.last_started_at or c.started_at),
                        "finishedAt": _iso(c.last_finished_at or c.started_at),
                    }
                }
            statuses.append(status)
        if run.done:
            failed = any(c.exit_code != 0 for c in run.containers)
            phase = "Failed" if failed else "Succeeded"
            ready = {"status": "False", "reason": "PodCompleted"}
        else:
            phase = "Running"
            ready = {"status": "True"}
        conditions = [
            {"type": "Initialized", "status": "True", "lastTransitionTime": _iso(run.started_at)},
            {"type": "Ready", "lastTransitionTime": now, **ready},
            {"type": "ContainersReady", "lastTransitionTime": now, **ready},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _iso(run.started_at)},
        ]
        if run.done:
            conditions[0]["reason"] = "PodCompleted"
        init_statuses = [
            {
                "name": name,
                "image": "",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": _iso(run.started_at),
                        "finishedAt": _iso(run.started_at),
                    }
                },
            }
            for name in run.init_containers
        ]
        body: dict[str, Any] = {
            "status": {
                "phase": phase,
                "conditions": conditions,
                "hostIP": "127.0.0.1",
                "podIP": run.pod_ip,
                "podIPs": [{"ip": run.pod_ip}],
                "startTime": _iso(run.started_at),
                "containerStatuses": statuses,
            }
        }
        if init_statuses:
            body["status"]["initContainerStatuses"] = init_statuses
        # Merge patch replaces lists wholesale, which is what we want for
        # containerStatuses/conditions: on a fake node we own all of them.
        v1.patch_namespaced_pod_status(
            run.name, run.namespace, body, _content_type="application/merge-patch+json"
        )

    def _event(self, v1: Any, pod: V1Pod, reason: str, message: str) -> None:
        from kubernetes import client

        now = _now()
        try:
            v1.create_namespaced_event(
                pod.metadata.namespace,
                client.CoreV1Event(
                    metadata=client.V1ObjectMeta(generate_name=f"{pod.metadata.name}."),
                    involved_object=client.V1ObjectReference(
                        kind="Pod",
                        namespace=pod.metadata.namespace,
                        name=pod.metadata.name,
                        uid=pod.metadata.uid,
                        api_version="v1",
                    ),
                    reason=reason,
                    message=message,
                    type="Normal",
                    source=client.V1EventSource(component="kubelet", host=pod.spec.node_name),
                    first_timestamp=now,
                    last_timestamp=now,
                    count=1,
                ),
            )
        except Exception as exc:
            self._note_error(f"event {reason}: {exc!r}")
