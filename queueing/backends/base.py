"""The interface every cluster backend implements, and the records it exchanges."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Protocol

# The signals a job may ask to be stopped with (Job.stop_signal); SIGTERM first, what
# the kubelet sends anyway. Re-exported for the backends.
from queueing.validation import STOP_SIGNALS as STOP_SIGNALS


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A schedulable node as the cluster reports it. `allocated` counts GPUs held by
    workloads the cluster still runs (including ones being torn down); likewise
    `cpu_allocated` millicores and `memory_allocated` bytes out of what the node can
    allocate, `cpu_millicores` and `memory_bytes` (None: the cluster does not say, and
    rule A6 does not constrain the node). `topology`: the node's domain per topology level
    of its GPU type (rule A7, level name -> domain)."""

    name: str
    gpu_type: str
    capacity: int
    allocated: int
    cpu_millicores: int | None = None
    cpu_allocated: int = 0
    memory_bytes: int | None = None
    memory_allocated: int = 0
    topology: Mapping[str, str] = field(default_factory=dict)
    # Rules K4, K6: interruptible (spot) capacity, as the node's labels or its pool say.
    spot: bool = False
    # Rule K1: the cluster it belongs to, set by the services when they merge the
    # clusters' nodes (the published cluster view); a backend leaves it "".
    cluster: str = ""
    # The node's own labels, as the cluster reports them ({}: none or not said): what
    # says which `NodePool` it is in (docs/clusters.md, "Node pools"). Not published.
    labels: Mapping[str, str] = field(default_factory=dict)
    # Rule C4: the name of its `NodePool` ("" = none), set by the services from `labels`
    # as `cluster` is; a spot attempt is charged at the price of the pools it ran in.
    pool: str = ""

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.allocated)

    @property
    def cpu_free(self) -> int | None:
        return None if self.cpu_millicores is None else max(
            0, self.cpu_millicores - self.cpu_allocated)

    @property
    def memory_free(self) -> int | None:
        return None if self.memory_bytes is None else max(
            0, self.memory_bytes - self.memory_allocated)


# A workload's cluster name, fq-<job id>-<attempt>: deterministic, so a submit retried
# after a crash finds the first one (rule R7 in docs/scheduling.md). Built and read only
# here. \Z, not $ (which also matches before a trailing newline); ASCII only.
_WORKLOAD_NAME_RE = re.compile(r"^fq-(\d+)-(\d+)\Z", re.ASCII)


def workload_name(job_id: int, attempt: int) -> str:
    """The cluster name of a job's attempt: `workload_name(12, 3)` is 'fq-12-3'."""
    return f"fq-{job_id}-{attempt}"


def parse_workload_name(name: str) -> tuple[int, int] | None:
    """'fq-12-3' → (12, 3); anything else (another tool's Job) → None."""
    m = _WORKLOAD_NAME_RE.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What fairq asks a backend to run: built by fairq, never taken whole from a user."""

    name: str  # workload_name(job_id, attempt)
    job_id: int
    attempt: int
    team: str
    tier: str
    priority_class_name: str
    gpu_type: str
    resource_name: str
    node_labels: Mapping[str, str]
    gpus_per_replica: int
    replicas: int
    image: str
    command: Sequence[str]
    args: Sequence[str]
    env: Mapping[str, str]
    max_runtime_seconds: int | None
    placement: Sequence[str] = ()  # planned node per replica (a hint for the cluster)
    # Rule K4: the plan placed this attempt on spot nodes (`Job.on_spot`); its pods then
    # tolerate the taints that mark spot capacity (Kubernetes: FAIRQ_SPOT_TOLERATIONS).
    spot: bool = False
    # The team's setting (Team.run_as_non_root): the container gets runAsNonRoot and the
    # namespace the `restricted` Pod Security level. True unless said otherwise.
    run_as_non_root: bool = True
    # Per replica, requests = limits (Job's normalised columns; None: not set) and the
    # size of the memory-backed /dev/shm (None: the runtime's default).
    cpu_millicores: int | None = None
    memory_bytes: int | None = None
    ephemeral_storage_bytes: int | None = None
    shm_size_bytes: int | None = None
    # Rule A7, a required topology: every replica on a node whose `topology_label` is
    # `topology_domain` (the domain fairq chose), i.e. level `topology_level` of the
    # GPU type. Empty: no such pin.
    topology_level: str = ""
    topology_label: str = ""
    topology_domain: str = ""
    # Storage, secrets and pod metadata, as Job keeps them (normalised at submit by
    # `validation.workload_check`; the manifest checks them again): volumes ({name, pvc,
    # mount_path, read_only} or {name, empty_dir: {size_limit}, mount_path}), secret
    # references ({secret, key, env} or {secret, mount_path}), all of the team's
    # namespace; the pull secret and working directory ("": none); the job's own labels
    # and annotations (plain keys: the manifest prefixes them); the pods' grace period
    # (None: the backend's default).
    volumes: Sequence[Mapping[str, Any]] = ()
    secrets: Sequence[Mapping[str, Any]] = ()
    image_pull_secret: str = ""
    working_dir: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    termination_grace_seconds: int | None = None
    # Graceful stop: the signal the job's program gets first when it is preempted or
    # cancelled (then, after the grace, it is killed), and where and with what token
    # the running attempt reports its checkpoints (empty: not offered).
    stop_signal: str = "SIGTERM"
    checkpoint_url: str = ""
    # A credential (it lets the pod report checkpoints for this attempt only): kept out
    # of the spec's repr, so a log line or an error naming the spec never carries it.
    checkpoint_token: str = field(default="", repr=False)
    # Shared GPUs (docs/kubernetes.md, "Shared GPUs"): per replica, how much of
    # `resource_name` it takes in the type's units (a time-sliced or MPS type's slices:
    # k for a fraction, g x slices_per_gpu for g whole GPUs; devices elsewhere); 0 =
    # `gpus_per_replica`. `gpu_slots`: a fraction's planned GPU index per replica (its
    # node's GPU the plan packed its slices on); `sharing` and `slices_per_gpu` are the
    # GPU type's.
    units_per_replica: int = 0
    gpu_slots: Sequence[int] = ()
    sharing: str = "exclusive"
    slices_per_gpu: int = 1
    gpu_slices: int = 0

    @property
    def units(self) -> int:
        """Per replica, the units of `resource_name` it takes (`units_per_replica`)."""
        return self.units_per_replica or self.gpus_per_replica
    # A notebook session (docs/sessions.md): the path its JupyterLab server serves under
    # ("" = not a session) and the token it accepts, as JUPYTER_TOKEN (a credential:
    # out of the repr, like the checkpoint token).
    notebook_prefix: str = ""
    notebook_token: str = field(default="", repr=False)


# The port replica 0 of a multi-replica job listens on for the rendezvous (`MASTER_PORT`,
# torch.distributed's customary default): fixed, so a job file never has to say it.
RENDEZVOUS_PORT = 29500


def replica_host(workload: str, replica: int) -> str:
    """The stable host name of replica `replica` of a workload: `replica_host('fq-12-3',
    0)` is 'fq-12-3-0' (the name an Indexed Job would give it too)."""
    return f"{workload}-{replica}"


def workload_env(spec: LaunchSpec, *, replica: int, master_addr: str) -> dict[str, str]:
    """The env fairq sets on replica `replica` of `spec` (the names are reserved: a user
    cannot set them): `FAIRQ_JOB_ID` and `FAIRQ_ATTEMPT` always (a job resumes from its
    checkpoint after a preemption); `FAIRQ_STOP_SIGNAL` always (the signal the program
    gets first when the attempt is preempted or cancelled: docs/kubernetes.md, "Graceful
    stop"); `FAIRQ_CHECKPOINT_URL` and `FAIRQ_CHECKPOINT_TOKEN` when the spec offers a
    checkpoint endpoint (both, or neither: the token lets the pod report checkpoints for
    its own attempt only); for replicas > 1 the rendezvous `torchrun` and
    torch.distributed read — `MASTER_ADDR` (replica 0's stable host, `master_addr`),
    `MASTER_PORT`, `WORLD_SIZE` (replicas), `NODE_RANK` (this replica's index) and
    `NPROC_PER_NODE` (GPUs per replica)."""
    env = {"FAIRQ_JOB_ID": str(spec.job_id), "FAIRQ_ATTEMPT": str(spec.attempt),
           "FAIRQ_STOP_SIGNAL": spec.stop_signal or "SIGTERM"}
    if spec.checkpoint_url and spec.checkpoint_token:
        env.update(FAIRQ_CHECKPOINT_URL=spec.checkpoint_url,
                   FAIRQ_CHECKPOINT_TOKEN=spec.checkpoint_token)
    if spec.notebook_prefix and spec.notebook_token:
        # jupyter_server reads its token from JUPYTER_TOKEN (IdentityProvider.token's
        # default): never on the command line, which `ps` and the job's spec show.
        env["JUPYTER_TOKEN"] = spec.notebook_token
    if spec.replicas > 1:
        env.update(MASTER_ADDR=master_addr, MASTER_PORT=str(RENDEZVOUS_PORT),
                   WORLD_SIZE=str(spec.replicas), NODE_RANK=str(replica),
                   NPROC_PER_NODE=str(spec.gpus_per_replica))
    return env


# The reason of an attempt that waits on the cluster (not failed), as shown on the job.
# A `logs` answer's line standing for a pod whose log the cluster did not answer for (a
# timeout, a server error; not "gone", not "never started"): the log may still be
# there, so fairq reads it again before it deletes the pod (services/logs.py).
_UNANSWERED = " yet (the cluster did not answer): "
_UNANSWERED_LINE = re.compile(r"^\[fairq\] no logs from .+? yet \(the cluster did not answer\): ")


def logs_unanswered_note(what: str, detail: str) -> str:
    """The line for `what` ("pod <name>", "the pods of <workload>") the cluster did not
    answer for, `detail` saying how."""
    return f"[fairq] no logs from {what}{_UNANSWERED}{detail}"


def logs_unanswered(text: str) -> bool:
    """`text` (one pod's part of a `logs` answer) is `logs_unanswered_note`'s line."""
    return bool(_UNANSWERED_LINE.match(text.lstrip()))

WAITING = "waiting for the cluster: "


class SubmitRejected(Exception):
    """The cluster refused a workload for good (an invalid spec): the job fails."""


class SubmitRefused(Exception):
    """The cluster refuses to create the workload until someone changes something: an
    RBAC denial, a quota on Jobs, a team namespace that is not (or no longer) provisioned.
    The backend reports it whatever it knows of the namespace; the service bounds it
    (services/scheduler.py `submit_failed`: FAIRQ_K8S_SUBMIT_REFUSED_SECONDS). `status`:
    the HTTP status behind it (403, 404), 0 when no request was made."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class SubmitRequeue(Exception):
    """The workload's name is held by one on its way out (being deleted): this attempt
    cannot start under its name, so the job goes back to the queue as a new attempt."""


class Phase(StrEnum):
    PENDING = "PENDING"  # accepted, not running yet
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass(frozen=True, slots=True)
class WorkloadStatus:
    """What the cluster says about one submitted workload (one job attempt)."""

    name: str
    job_id: int
    attempt: int
    phase: Phase
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    reason: str = ""
    # The node of each replica with a bound pod, in replica order: two replicas on one
    # node name it twice (what a job holds is counted per replica, rules A3 and R4).
    nodes: tuple[str, ...] = field(default=())
    # The cluster is already removing it (fairq or someone else asked): not stopped again.
    stopping: bool = False
    # Containers restarted or pods replaced (failed) so far in this attempt.
    restarts: int = 0
    # Where replica 0 can be reached (a notebook session's server, docs/sessions.md):
    # its pod's IP ("" = none yet), and the port when the backend chose it (None: the
    # one the spec asked for).
    address: str = ""
    port: int | None = None


# Rule K6 (docs/scheduling.md, "Clusters and spot capacity"): the reason a backend gives
# a workload whose spot node was reclaimed under it (deleted, or marked for termination):
# phase FAILED, `finished_at` the reclamation, this reason. services/spot.py requeues its
# job (not a failure) before the cycle would fail it. Built and read only here.
SPOT_RECLAIMED = "spot_reclaimed"
_SPOT_REASON_RE = re.compile(r"^spot_reclaimed: node (\S+) ", re.ASCII)


def spot_reclaimed_reason(node: str, how: str) -> str:
    """`spot_reclaimed_reason('gpu-7', 'deleted')` is 'spot_reclaimed: node gpu-7 deleted'."""
    return f"{SPOT_RECLAIMED}: node {node} {how}"


def spot_reclaimed_node(status: WorkloadStatus) -> str | None:
    """The node whose reclamation ended `status`'s workload (rule K6), None when it is not
    such a status (a FAILED phase with `spot_reclaimed_reason`)."""
    if status.phase != Phase.FAILED:
        return None
    m = _SPOT_REASON_RE.match(status.reason or "")
    return m.group(1) if m else None


@dataclass(frozen=True, slots=True)
class PodReading:
    """One fairq pod's GPUs as a utilization source reads them (docs/scheduling.md, "Idle
    GPUs"): `sm_percent`, SM activity averaged over the pod's GPUs (0-100);
    `fb_used_bytes`, frame buffer used, summed over them."""

    job_id: int
    attempt: int
    pod: str
    sm_percent: float
    fb_used_bytes: int


class UtilizationSource(Protocol):
    """Where the GPUs' readings come from: Prometheus with dcgm-exporter's metrics
    (backends/prometheus.py) or the simulated cluster. One call per cycle for every fairq
    pod; it raises when it cannot answer at all (the service logs it and goes on)."""

    def readings(self, *, now: datetime) -> list[PodReading]:
        """The current reading of every fairq pod with GPUs the source knows about."""
        ...


class ClusterBackend(Protocol):
    """A cluster fairq submits to. Every call is idempotent by workload name.

    Its capabilities are class attributes, read without building one
    (`composition.backend_class()`): `in_process` — it lives in this process and is no
    cluster client (web processes may read it directly); `provisions` — it has
    namespaces, quotas and PriorityClasses to keep in step with tiers and quotas
    (services/provisioning.py)."""

    in_process: ClassVar[bool]
    provisions: ClassVar[bool]

    def nodes(self) -> list[NodeInfo]:
        """Schedulable GPU nodes with their capacity and allocation."""
        ...

    def submit(self, spec: LaunchSpec, *, now: datetime) -> None:
        """Start the workload; submitting a name that exists is a no-op."""
        ...

    def stop(self, name: str, *, now: datetime) -> None:
        """End the workload (cancel or preempt); unknown names are a no-op."""
        ...

    def statuses(self, *, now: datetime) -> list[WorkloadStatus]:
        """The status of every fairq workload the cluster knows about."""
        ...

    def logs(self, name: str, *, tail: int = 100) -> str:
        """The last `tail` lines of the workload's logs. A pod (or the whole workload)
        whose log the cluster did not answer for (a timeout, a server error: the log may
        well be there) is `logs_unanswered_note`'s line instead of its log."""
        ...
