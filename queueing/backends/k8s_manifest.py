"""LaunchSpec → Kubernetes objects, and Kubernetes objects → what fairq needs. Pure.

Nothing here talks to a cluster, reads settings or the database: the Kubernetes backend
passes options in, and tests call these functions with plain dicts (the JSON form the
API server speaks), so every field that reaches a pod spec is decided in this file.

Safety (docs/kubernetes.md, "What reaches the pod spec"): of the user's input only the
image, command, args and env reach the pod, each copied field by field into a container
fairq builds, the per-replica quantities (cpu, memory, ephemeral storage, /dev/shm), as
integers fairq parsed and bounded at submit and writes itself, and references by name
to PVCs, Secrets and a pull secret of the team's own namespace (volumes, secret env
vars and files), a working directory and the job's own labels and annotations under
`user.fairq.io/`; everything else (the selector, tolerations, priority, security
context, no service-account token) is fairq's. A LaunchSpec has no field through which a
user could smuggle `privileged`, `hostPath`, `hostNetwork`, another namespace or a
service account. The image, env names and the storage and metadata fields are checked
again here (the API checks them first, `validation.workload_check`): a reserved env
name, a host path, a mount over /var/run/secrets or an image that is not an ASCII
reference never reaches a pod.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from queueing.validation import (
    ALLOWED_FAIRQ_ENV,
    ARRAY_JOB_ENV,
    ENV_NAME_RE,
    IMAGE_RE,
    MAX_IMAGE_LEN,
    MAX_RESOURCE_BYTES,
    SECRET_VOLUME_PREFIX,
    USER_LABEL_PREFIX,
    env_name_reserved,
    format_bytes,
    format_cpu,
    parse_bytes,
    parse_cpu,
    workload_check,
)

from .base import (
    RENDEZVOUS_PORT,
    STOP_SIGNALS,
    WAITING,
    LaunchSpec,
    NodeInfo,
    Phase,
    WorkloadStatus,
    parse_workload_name,
    replica_host,
    workload_env,
)
from .k8s_api import NodeMatch, node_is_spot, taint_tolerated

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "fairq"
SELECTOR = f"{MANAGED_BY}={MANAGED_BY_VALUE}"
L_WORKLOAD = "fairq.io/workload"
L_JOB_ID = "fairq.io/job-id"
L_ATTEMPT = "fairq.io/attempt"
L_TEAM = "fairq.io/team"
L_TIER = "fairq.io/tier"
L_GPU_TYPE = "fairq.io/gpu-type"
L_REPLICA = "fairq.io/replica"  # multi-replica workloads: the replica's index
A_PLACEMENT = "fairq.io/placement"
A_GPUS_PER_REPLICA = "fairq.io/gpus-per-replica"
A_REPLICAS = "fairq.io/replicas"
A_SPEC_DIGEST = "fairq.io/spec-digest"
A_OWNER = "fairq.io/owner"
# Shared GPUs: a fraction's planned GPU index on its node (per replica; the replica's
# own for a rendezvous Job), and its slices of how many (docs/kubernetes.md, "Shared
# GPUs"). fairq's accounting and placement, not a device assignment: which physical GPU
# the device plugin's replicas come from is the plugin's choice.
A_GPU_SLOTS = "fairq.io/gpu-slots"
A_GPU_SLICES = "fairq.io/gpu-slices"
CONTAINER = "main"
GPU_TAINT_KEY = "nvidia.com/gpu"
QUOTA_NAME = "fairq-gpus"

# \Z, not $ (which also matches before a trailing newline); ASCII only.
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z", re.ASCII)
# What a pod may carry in its env besides the user's own names: the simulator's knobs
# (documented) and the array index fairq sets itself.
_FAIRQ_ENV_IN_PODS = ALLOWED_FAIRQ_ENV | ARRAY_JOB_ENV
# Pod Security Admission (docs/kubernetes.md): the level fairq's namespaces enforce, and
# the policy version it is pinned to (a newer policy cannot start refusing fairq's pods
# on a cluster upgrade; fairq's pods meet `restricted` as of this version).
PSA = "pod-security.kubernetes.io"
PSA_VERSION = "v1.30"
# Waiting reasons that mean the image will not start by itself: past the pull timeout
# the attempt fails with this reason instead of sitting PENDING for ever.
IMAGE_ERRORS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                          "ErrImageNeverPull", "CreateContainerConfigError",
                          "CreateContainerError"})


class ManifestError(ValueError):
    """The spec cannot become a valid Job (the job fails: it would fail every time)."""


@dataclass(frozen=True, slots=True)
class ManifestOptions:
    namespace: str
    backoff_limit: int = 0
    ttl_seconds_after_finished: int | None = 3600
    indexed: bool = False  # completionMode=Indexed: only where the server serves it
    termination_grace_seconds: int = 30
    # Rule K4 (FAIRQ_SPOT_TOLERATIONS, parsed): the taints that mark spot capacity, which
    # the pods of an attempt placed on spot (`LaunchSpec.spot`) tolerate.
    spot_tolerations: tuple[NodeMatch, ...] = ()
    # Shared GPUs, an MPS type's pods (FAIRQ_K8S_MPS_PIPE_DIRECTORY,
    # FAIRQ_K8S_MPS_LOG_DIRECTORY): "" = not set, the NVIDIA device plugin's Allocate
    # sets the pipe directory and mounts it (its own MPS control daemon); a path = an
    # MPS daemon run outside the plugin: the env and a hostPath mount of that path.
    mps_pipe_directory: str = ""
    mps_log_directory: str = ""


def tolerations(spec: LaunchSpec, opts: ManifestOptions) -> list[dict[str, str]]:
    """The pod's tolerations: the GPU taint (any value, any effect) so it can land on GPU
    nodes; and, only for an attempt the plan placed on spot (rule K4), each spot taint
    (`key`: any value; `key=value`: that value; any effect), so on-demand work never
    lands on spot nodes by toleration. Nothing else."""
    out = [{"key": GPU_TAINT_KEY, "operator": "Exists"}]
    if spec.spot:
        out += [{"key": key, "operator": "Exists"} if value is None
                else {"key": key, "operator": "Equal", "value": value}
                for key, value in opts.spot_tolerations]
    return out


def namespace_for(team: str, prefix: str) -> str:
    name = f"{prefix}{team}"
    if len(name) > 63 or not _DNS_LABEL_RE.match(name):
        raise ManifestError(f"namespace {name!r} is not a valid DNS-1123 label")
    return name


def labels_for(spec: LaunchSpec) -> dict[str, str]:
    return {
        MANAGED_BY: MANAGED_BY_VALUE,
        L_WORKLOAD: spec.name,
        L_JOB_ID: str(spec.job_id),
        L_ATTEMPT: str(spec.attempt),
        L_TEAM: spec.team,
        L_TIER: spec.tier,
        L_GPU_TYPE: spec.gpu_type,
    }


def _str_list(values: Iterable[Any], what: str) -> list[str]:
    out = []
    for v in values:
        if not isinstance(v, str):
            raise ManifestError(f"{what} must be strings")
        out.append(v)
    return out


def _env(env: Mapping[str, str], fairqs: Mapping[str, str],
         secret_refs: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The user's env, checked (no reserved name), with fairq's own (`fairqs`: names the
    user may not set) added, and the spec's secret env vars (`valueFrom.secretKeyRef`,
    checked by `_workload`); sorted by name."""
    for name in env:
        if not isinstance(name, str) or not ENV_NAME_RE.match(name) or len(name) > 253:
            raise ManifestError(f"invalid environment variable name {name!r}")
        if env_name_reserved(name, allowed=_FAIRQ_ENV_IN_PODS):
            raise ManifestError(f"environment variable name {name!r} is reserved")
        if not isinstance(env[name], str):
            raise ManifestError(f"environment variable {name} must be a string")
    merged: dict[str, dict[str, Any]] = {
        name: {"name": name, "value": value} for name, value in {**env, **fairqs}.items()}
    # `valueFrom` only for the spec's secret references (a Secret the team allows, by
    # name, in its own namespace): never from the literal env.
    for ref in secret_refs:
        if "env" in ref:
            merged[ref["env"]] = {"name": ref["env"], "valueFrom": {"secretKeyRef": {
                "name": ref["secret"], "key": ref["key"]}}}
    return [merged[name] for name in sorted(merged)]


def replica_job_name(workload: str, replica: int) -> str:
    """The Job of replica `replica` of a multi-replica workload: replica 0's is the
    workload's own Job (`fq-12-3`, the one `statuses()` reports), replica i > 0's is
    `fq-12-3-<i>`, owned by it."""
    return workload if replica == 0 else replica_host(workload, replica)


def master_addr(workload: str) -> str:
    """Replica 0's stable DNS name as the other replicas resolve it (the pod's DNS search
    path adds `<namespace>.svc.<cluster domain>`): `<host>.<headless Service>`."""
    return f"{replica_host(workload, 0)}.{workload}"


def is_replica_job(job: Mapping[str, Any]) -> bool:
    """A Job of replica i > 0 of a multi-replica workload: part of the workload whose
    Job is named by its `fairq.io/workload` label, never a workload of its own."""
    meta = job.get("metadata") or {}
    workload = (meta.get("labels") or {}).get(L_WORKLOAD)
    return bool(workload) and workload != meta.get("name")


def workload_replicas(job: Mapping[str, Any]) -> int:
    """How many replicas the workload of this Job has (its `fairq.io/replicas`
    annotation; else its completions)."""
    ann = (job.get("metadata") or {}).get("annotations") or {}
    try:
        return max(1, int(ann.get(A_REPLICAS) or 0))
    except ValueError:
        pass
    return max(1, int((job.get("spec") or {}).get("completions") or 1))


def job_manifests(spec: LaunchSpec, opts: ManifestOptions) -> list[dict[str, Any]]:
    """Every Job of one attempt, replica 0's (the workload's own Job) first: one Job for
    a single replica, one per replica otherwise (`job_manifest`)."""
    rendezvous = spec.replicas > 1
    return [job_manifest(spec, opts, replica=i)
            for i in range(spec.replicas if rendezvous else 1)]


def job_manifest(spec: LaunchSpec, opts: ManifestOptions, *, replica: int = 0
                 ) -> dict[str, Any]:
    """The batch/v1 Job for one attempt (or, with replicas > 1, for one replica of it).
    Deterministic: the same spec gives the same body.

    Guarantees: the pod runs one container `main` with the spec's image, command, args
    and env (literal values, plus `valueFrom.secretKeyRef` only for the spec's secret
    references) and limits = requests = `gpus_per_replica` of the GPU type's resource
    and the spec's cpu, memory and ephemeral storage (`container_resources`); its volumes
    are only: with a shm size, a memory-backed emptyDir at /dev/shm of at most the memory
    limit (`_shm`); the spec's
    PVCs, size-limited emptyDirs and read-only Secret volumes (`_volumes`), every name of
    the team's namespace (no namespace is ever written), none mounted over or under
    /var/run/secrets, /run/secrets, /dev, /proc, /sys or the kubelet's /etc files
    (`_workload` re-checks `validation.workload_check`); imagePullSecrets only the
    spec's one; workingDir as given; terminationGracePeriodSeconds the spec's (else
    `opts`'); no privilege, escalation, capability, host namespace, host path or
    service-account token, the runtime's seccomp profile, runAsNonRoot as the team says
    (`security_context`); no reserved env name (API rules, checked again here), and
    fairq's own env (`base.workload_env`: job id, attempt, rendezvous); labels and
    annotations carry job id, attempt, team, tier and GPU type, and the job's own under
    `user.fairq.io/` (which can never replace fairq's or Kubernetes' keys).

    One replica: `parallelism = completions = 1`. Replicas > 1 (docs/kubernetes.md,
    "Replicas that rendezvous"): one Job per replica, each `parallelism = completions =
    1`, `backoffLimit: 0` (a replaced replica would join a broken rendezvous), its pod
    with `hostname` = `replica_host(workload, i)` and `subdomain` = the workload's
    headless Service (`service_manifest`), `NODE_RANK` = i; replica 0's Job is named
    after the workload, replica i's `replica_job_name(workload, i)`; the labels carry
    `fairq.io/replica`. Explicit hostnames rather than an Indexed Job: the same Jobs work
    on every server from 1.20 on (Indexed Jobs are 1.22+).
    """
    if spec.gpus_per_replica < 1 or spec.replicas < 1 or spec.units < 1:
        raise ManifestError("a job needs at least one replica and one GPU per replica")
    rendezvous = spec.replicas > 1
    if not 0 <= replica < spec.replicas:
        raise ManifestError(f"replica {replica} of a job of {spec.replicas} replicas")
    if not spec.image or not isinstance(spec.image, str):
        raise ManifestError("a job needs an image")
    if len(spec.image) > MAX_IMAGE_LEN or not IMAGE_RE.match(spec.image):
        raise ManifestError(f"image {spec.image!r} is not a valid image reference")
    labels = labels_for(spec)
    if rendezvous:
        labels[L_REPLICA] = str(replica)
    annotations = {
        L_JOB_ID: str(spec.job_id),
        L_ATTEMPT: str(spec.attempt),
        L_TEAM: spec.team,
        L_TIER: spec.tier,
        # In the units of the GPU type's resource (what a node's allocatable counts:
        # slices of a time-sliced or MPS type), as `unbound_demand` reads it.
        A_GPUS_PER_REPLICA: str(spec.units),
        A_REPLICAS: str(spec.replicas),
        A_PLACEMENT: ",".join(spec.placement),
    }
    annotations.update(gpu_share_annotations(spec, replica=replica))
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image,
        "resources": container_resources(spec),
        "securityContext": security_context(run_as_non_root=spec.run_as_non_root),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    command = _str_list(spec.command, "command")
    args = _str_list(spec.args, "args")
    if command:
        container["command"] = command
    if args:
        container["args"] = args
    workload = _workload(spec)
    container["env"] = _env(spec.env, {**workload_env(spec, replica=replica,
                                                      master_addr=master_addr(spec.name)),
                                       **mps_env(spec, opts)},
                            workload["secrets"])
    if workload["working_dir"]:
        container["workingDir"] = workload["working_dir"]
    grace = opts.termination_grace_seconds if spec.termination_grace_seconds is None \
        else _grace(spec.termination_grace_seconds)
    hook = stop_hook(spec.stop_signal, grace=grace)
    if hook is not None:
        container["lifecycle"] = {"preStop": hook}
    volumes = _shm(spec, container) + _volumes(workload, container) + _mps(spec, opts,
                                                                             container)
    user_labels = {f"{USER_LABEL_PREFIX}{k}": val for k, val in workload["labels"].items()}
    user_annotations = {f"{USER_LABEL_PREFIX}{k}": val
                        for k, val in workload["annotations"].items()}
    labels = {**user_labels, **labels}  # fairq's own win (they cannot clash: the prefix)
    annotations = {**user_annotations, **annotations}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "priorityClassName": spec.priority_class_name,
        "tolerations": tolerations(spec, opts),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace,
    }
    if volumes:
        pod_spec["volumes"] = volumes
    if workload["image_pull_secret"]:
        pod_spec["imagePullSecrets"] = [{"name": workload["image_pull_secret"]}]
    if rendezvous:
        # A stable DNS name per replica: <hostname>.<subdomain> resolves through the
        # workload's headless Service (service_manifest).
        pod_spec["hostname"] = replica_host(spec.name, replica)
        pod_spec["subdomain"] = spec.name
    if spec.node_labels:
        pod_spec["nodeSelector"] = {str(k): str(v) for k, v in sorted(spec.node_labels.items())}
    placement = list(spec.placement)
    if rendezvous and len(placement) == spec.replicas:
        placement = [placement[replica]]  # each replica's Job prefers its own node
    planned = sorted(set(placement))
    node_affinity: dict[str, Any] = {}
    if planned:
        # A hint, not a rule: the scheduler prefers the nodes fairq planned (best fit),
        # but may use another node of the type if a planned one is gone. One term per
        # node: a `metadata.name` field selector takes exactly one value.
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 100, "preference": {"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}}
            for node in planned
        ]
    if spec.topology_label and spec.topology_domain:
        # Rule A7, a rule this time: every replica in the domain fairq chose, so the
        # kube-scheduler cannot scatter a gang that asked for one rack (or NVLink clique).
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": spec.topology_label, "operator": "In",
                 "values": [spec.topology_domain]}]}]}
    if node_affinity:
        pod_spec["affinity"] = {"nodeAffinity": node_affinity}
    gang = 1 if rendezvous else spec.replicas
    job_spec: dict[str, Any] = {
        "parallelism": gang,
        "completions": gang,
        "backoffLimit": 0 if rendezvous else opts.backoff_limit,
        "template": {
            "metadata": {"labels": dict(labels), "annotations": dict(annotations)},
            "spec": pod_spec,
        },
    }
    if opts.indexed and not rendezvous:
        job_spec["completionMode"] = "Indexed"
    if spec.max_runtime_seconds:
        job_spec["activeDeadlineSeconds"] = int(spec.max_runtime_seconds)
    if opts.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = opts.ttl_seconds_after_finished
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": replica_job_name(spec.name, replica),
                     "namespace": opts.namespace, "labels": labels,
                     "annotations": annotations},
        "spec": job_spec,
    }


SHM_VOLUME = "dshm"


def _positive(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**62:
        raise ManifestError(f"{what} must be a positive integer, not {value!r}")
    return value


def gpu_share_annotations(spec: LaunchSpec, *, replica: int = 0) -> dict[str, str]:
    """Shared GPUs: a fraction's `fairq.io/gpu-slices` ("2/4": its slices of the type's
    slices per GPU) and `fairq.io/gpu-slots` (the planned GPU index on its node: the
    replica's own for a rendezvous Job, every replica's comma-separated otherwise);
    nothing for whole GPUs."""
    if not spec.gpu_slices:
        return {}
    slots = [str(s) for s in spec.gpu_slots]
    if spec.replicas > 1 and len(slots) == spec.replicas:
        slots = [slots[replica]]
    out = {A_GPU_SLICES: f"{spec.gpu_slices}/{spec.slices_per_gpu}"}
    if slots:
        out[A_GPU_SLOTS] = ",".join(slots)
    return out


def mps_env(spec: LaunchSpec, opts: ManifestOptions) -> dict[str, str]:
    """An MPS type's pod env (NVIDIA's MPS documentation, "Environment Variables"):
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = the share of the GPU's SMs it asked (100 x
    slices / slices per GPU; 100 for whole GPUs), and CUDA_MPS_PIPE_DIRECTORY /
    CUDA_MPS_LOG_DIRECTORY when set in `opts` (else the device plugin sets the pipe
    directory). Nothing for other types. fairq's values win over a job's own."""
    if spec.sharing != "mps":
        return {}
    percent = 100 * spec.units // max(1, spec.slices_per_gpu) if spec.gpu_slices else 100
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, min(100, percent)))}
    if opts.mps_pipe_directory:
        env["CUDA_MPS_PIPE_DIRECTORY"] = opts.mps_pipe_directory
    if opts.mps_log_directory:
        env["CUDA_MPS_LOG_DIRECTORY"] = opts.mps_log_directory
    return env


MPS_PIPE_VOLUME = "mps-pipe"
MPS_LOG_VOLUME = "mps-log"


def _mps(spec: LaunchSpec, opts: ManifestOptions, container: dict[str, Any]
         ) -> list[dict[str, Any]]:
    """An MPS type's hostPath volumes, only when FAIRQ_K8S_MPS_PIPE_DIRECTORY (and
    FAIRQ_K8S_MPS_LOG_DIRECTORY) are set: the MPS daemon's directory on the node at the
    same path in the container, as the MPS documentation has clients and daemon share
    it. (The `restricted` and `baseline` Pod Security levels refuse hostPath volumes:
    docs/kubernetes.md, "Shared GPUs".)"""
    if spec.sharing != "mps":
        return []
    out = []
    for name, path in ((MPS_PIPE_VOLUME, opts.mps_pipe_directory),
                       (MPS_LOG_VOLUME, opts.mps_log_directory)):
        if not path:
            continue
        if not path.startswith("/") or ".." in path.split("/"):
            raise ManifestError(f"MPS directory {path!r} is not an absolute path")
        container.setdefault("volumeMounts", []).append({"name": name, "mountPath": path})
        out.append({"name": name, "hostPath": {"path": path, "type": "Directory"}})
    return out


def container_resources(spec: LaunchSpec) -> dict[str, dict[str, str]]:
    """The container's `resources`: limits = requests for the GPUs and for each of cpu,
    memory and ephemeral-storage the spec sets, so a pod with cpu and memory set is of
    the Guaranteed QoS class (never evicted before BestEffort and Burstable pods). The
    GPU type's resource in its units (shared GPUs): a fraction's slices, g whole GPUs
    of a time-sliced or MPS type g x its slices per GPU (the device plugin's replicas),
    a MIG type's instances of its profile resource."""
    amounts = {spec.resource_name: str(spec.units)}
    for key, value, fmt in (
            ("cpu", spec.cpu_millicores, format_cpu),
            ("memory", spec.memory_bytes, format_bytes),
            ("ephemeral-storage", spec.ephemeral_storage_bytes, format_bytes)):
        amount = _positive(value, key)
        if amount is not None:
            amounts[key] = fmt(amount)
    return {"limits": dict(amounts), "requests": dict(amounts)}


def _shm(spec: LaunchSpec, container: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's volumes for a spec with a /dev/shm size: one memory-backed emptyDir of
    that size (its pages count against the container's memory limit), mounted at
    /dev/shm, its sizeLimit never above the spec's memory limit (submit refuses a larger
    one; a row older than that rule is cut to it). emptyDir is allowed by the
    `restricted` Pod Security level."""
    size = _positive(spec.shm_size_bytes, "shm size")
    if size is None:
        return []
    memory = _positive(spec.memory_bytes, "memory")
    if memory is not None:
        size = min(size, memory)
    container["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    return [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory",
                                              "sizeLimit": format_bytes(size)}}]


def _grace(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 24 * 3600:
        raise ManifestError(f"termination grace must be 0..86400 seconds, not {value!r}")
    return value


# The graceful stop's preStop hook (docs/kubernetes.md, "Graceful stop"): which processes
# get the job's stop signal. PID 1 is the program unless it is a shell, an init or a
# launcher (`sh -c "python train.py"`, tini, torchrun): then its children are, by the
# same rule, so `sh -c torchrun ...` signals torchrun's workers and never torchrun or a
# DataLoader worker (a grandchild of a worker; SIGUSR1's default action would kill it).
# Read from /proc with the shell's builtins only; `kill` is the shell's builtin too.
WRAPPERS = ("sh", "bash", "dash", "ash", "zsh", "ksh", "busybox", "tini", "dumb-init",
            "catatonit", "torchrun")
# torchrun is a Python console script: its process is named after the interpreter, so a
# python* process is a launcher when its command line (NULs dropped) names one of these.
LAUNCHERS = ("bin/torchrun", "torch.distributed.run", "torch.distributed.launch")
_STOP_SCRIPT = """\
S={signal}; G={grace}; T=
wrapper() {{ read -r c 2>/dev/null < /proc/$1/comm || return 1
  case $c in {wrappers}) return 0;; python*) read -r a 2>/dev/null < /proc/$1/cmdline
    case $a in {launchers}) return 0;; esac;; esac; return 1; }}
walk() {{ if ! wrapper $1; then T="$T $1"; return; fi; k=
  for d in /proc/[0-9]*; do read -r l 2>/dev/null < $d/stat || continue
    set -- $1 ${{l##*") "}}; [ "$3" = "$1" ] && [ "$2" != Z ] && k="$k ${{d#/proc/}}"; done
  for c in $k; do walk $c; done; }}
alive() {{ for p in $T; do read -r l 2>/dev/null < /proc/$p/stat || continue
  set -- ${{l##*") "}}; [ "$1" != Z ] && return 0; done; return 1; }}
walk 1; [ -n "$T" ] || T=1
echo "fairq: preStop: SIG$S to$T" 2>/dev/null >> /proc/1/fd/1
kill -s $S $T; n=0
while alive && [ $n -lt $G ]; do sleep 1; n=$((n + 1)); done
"""


def stop_hook(signal: str, *, grace: int) -> dict[str, Any] | None:
    """The container's preStop hook for a job stopped with `signal` (one of
    `base.STOP_SIGNALS`): None for SIGTERM (what the kubelet sends anyway); else an exec
    of /bin/sh that sends the signal to the program (`_STOP_SCRIPT`: PID 1, or below the
    shells and launchers above it) and waits until it has exited, at most `grace`
    seconds. The kubelet runs the hook, then sends SIGTERM, all within the pod's
    terminationGracePeriodSeconds (Kubernetes 1.20 has no `lifecycle.stopSignal`, 1.33+
    alpha). The signal's name is checked against the list before it reaches the script."""
    if signal not in STOP_SIGNALS:
        raise ManifestError(f"stop signal must be one of {', '.join(STOP_SIGNALS)}, "
                            f"not {str(signal)[:20]!r}")
    if signal == "SIGTERM":
        return None
    script = _STOP_SCRIPT.format(signal=signal.removeprefix("SIG"), grace=int(grace),
                                 wrappers="|".join(WRAPPERS),
                                 launchers="|".join(f"*{x}*" for x in LAUNCHERS))
    return {"exec": {"command": ["/bin/sh", "-c", script]}}


def _workload(spec: LaunchSpec) -> dict[str, Any]:
    """The spec's storage, secret and metadata fields, checked again by the rules the API
    applied (`validation.workload_check`, every rule but the team's allowlists, which
    only the database knows): no unknown key (a hostPath in any spelling), only names of
    the team's namespace, no mount over or under /var/run/secrets, /dev, /proc, ...,
    plain label keys. ManifestError names the first refusal."""
    values, problems = workload_check(
        volumes=[dict(v) for v in spec.volumes], secrets=[dict(s) for s in spec.secrets],
        image_pull_secret=spec.image_pull_secret, working_dir=spec.working_dir,
        labels=dict(spec.labels), annotations=dict(spec.annotations), env=spec.env,
        policy=None, max_scratch_bytes=MAX_RESOURCE_BYTES)
    if problems:
        field, why = sorted(problems.items())[0]
        raise ManifestError(f"{field}: {why[0]}")
    return values


def _volumes(workload: Mapping[str, Any], container: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's volumes of the spec's PVCs, scratch emptyDirs and Secret files, in the
    spec's order, and their mounts (added to the container's). A Secret's volume is
    `fq-secret-<i>` (i: its index in `secrets`), always read-only. No other volume
    source is ever written: no hostPath, nfs, csi, ..."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = container.setdefault("volumeMounts", [])
    for volume in workload["volumes"]:
        name, path = volume["name"], volume["mount_path"]
        if "pvc" in volume:
            read_only = bool(volume.get("read_only"))
            source: dict[str, Any] = {"persistentVolumeClaim": {
                "claimName": volume["pvc"], "readOnly": read_only}}
            mount = {"name": name, "mountPath": path, "readOnly": read_only}
        else:
            size = format_bytes(parse_bytes(volume["empty_dir"]["size_limit"]))
            source = {"emptyDir": {"sizeLimit": size}}
            mount = {"name": name, "mountPath": path}
        volumes.append({"name": name, **source})
        mounts.append(mount)
    for i, ref in enumerate(workload["secrets"]):
        if "env" in ref:
            continue
        name = f"{SECRET_VOLUME_PREFIX}{i}"
        volumes.append({"name": name, "secret": {"secretName": ref["secret"]}})
        mounts.append({"name": name, "mountPath": ref["mount_path"], "readOnly": True})
    if not mounts:
        del container["volumeMounts"]
    return volumes


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """An ownerReference to `job` (as the API server returned it, with its uid): what it
    owns is garbage collected with it."""
    meta = job["metadata"]
    return {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
            "uid": meta["uid"]}


def service_manifest(spec: LaunchSpec, namespace: str, *,
                     owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The headless Service of a multi-replica workload, named after it: it gives each
    replica's pod (`hostname` + `subdomain` = this Service) the DNS name
    `<hostname>.<workload>`, also before the pod is ready (`publishNotReadyAddresses`:
    replicas resolve each other while they start), and selects only this workload's
    pods. Owned by the workload's Job (`owner`, replica 0's, as the API server returned
    it): garbage collected with it; fairq deletes it explicitly too."""
    labels = labels_for(spec)
    meta: dict[str, Any] = {"name": spec.name, "namespace": namespace, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": meta,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {MANAGED_BY: MANAGED_BY_VALUE, L_WORKLOAD: spec.name},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT,
                       "targetPort": RENDEZVOUS_PORT, "protocol": "TCP"}],
        },
    }


def security_context(*, run_as_non_root: bool) -> dict[str, Any]:
    """The container's securityContext: no privilege, no escalation, no capability, the
    runtime's default seccomp profile; `runAsNonRoot` when the team runs non-root (the
    image's user must then not be root, or the kubelet refuses to start the container:
    CreateContainerConfigError). Together these meet the `restricted` Pod Security
    Standard; without runAsNonRoot, `baseline`."""
    sc: dict[str, Any] = {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if run_as_non_root:
        sc["runAsNonRoot"] = True
    return sc


def pod_security_level(*, run_as_non_root: bool) -> str:
    return "restricted" if run_as_non_root else "baseline"


def namespace_manifest(name: str, team: str, *, run_as_non_root: bool = True) -> dict[str, Any]:
    """A team's namespace, labelled fairq's and with the Pod Security Admission level its
    pods meet (`restricted` when the team runs non-root, else `baseline`), enforced.
    Servers before 1.23 (PSA beta) ignore the labels."""
    level = pod_security_level(run_as_non_root=run_as_non_root)
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {
                MANAGED_BY: MANAGED_BY_VALUE, L_TEAM: team,
                f"{PSA}/enforce": level, f"{PSA}/enforce-version": PSA_VERSION}}}


def resource_quota_manifest(namespace: str, hard: Mapping[str, int]) -> dict[str, Any]:
    """The team's GPU limits as a ResourceQuota (`requests.<resource>`: extended resources
    are quota'd by their requests only)."""
    return {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": QUOTA_NAME, "namespace": namespace,
                     "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
        "spec": {"hard": {f"requests.{r}": str(n) for r, n in sorted(hard.items())}},
    }


def priority_class_manifest(*, name: str, value: int, preemption_policy: str,
                            tier: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {MANAGED_BY: MANAGED_BY_VALUE, L_TIER: tier}},
        "value": value,
        "globalDefault": False,
        "preemptionPolicy": preemption_policy,
        "description": f"fairq tier {tier}",
    }


# --- ownership: which Job fairq created ---------------------------------------------------

def spec_digest(body: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON (sorted keys, no spaces) of a Job body without its
    ownership annotations: the same body gives the same digest in any process."""
    meta = dict(body.get("metadata") or {})
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items()
                           if k not in (A_SPEC_DIGEST, A_OWNER)}
    canonical = json.dumps({**body, "metadata": meta}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def owner_seal(namespace: str, name: str, digest: str, key: bytes) -> str:
    """HMAC-SHA256 with fairq's key over the Job's namespace, name and spec digest: only
    a process holding the key can write a seal that verifies."""
    return hmac.new(key, f"{namespace}/{name}/{digest}".encode(), hashlib.sha256).hexdigest()


def sign_job(body: Mapping[str, Any], key: bytes) -> dict[str, Any]:
    """A copy of `body` carrying `fairq.io/spec-digest` and `fairq.io/owner`."""
    meta = dict(body["metadata"])
    digest = spec_digest(body)
    meta["annotations"] = {**(meta.get("annotations") or {}), A_SPEC_DIGEST: digest,
                           A_OWNER: owner_seal(meta["namespace"], meta["name"], digest, key)}
    return {**body, "metadata": meta}


def sealed_by_fairq(job: Mapping[str, Any], key: bytes) -> bool:
    """The Job carries an owner seal that verifies with fairq's key: fairq created it."""
    meta = job.get("metadata") or {}
    ann = meta.get("annotations") or {}
    digest = str(ann.get(A_SPEC_DIGEST) or "")
    return bool(digest) and _seal_verifies(str(meta.get("namespace")), str(meta.get("name")),
                                           digest, str(ann.get(A_OWNER) or ""), key)


@functools.lru_cache(maxsize=1 << 18)
def _seal_verifies(namespace: str, name: str, digest: str, seal: str, key: bytes) -> bool:
    """`seal` is the owner seal of (namespace, name, digest) under `key`. Kept per exact
    inputs: each cycle asks it of every Job in the cache (an HMAC each: a fifth of
    `statuses()` at 150,000 Jobs), and a Job's seal never changes."""
    return hmac.compare_digest(seal, owner_seal(namespace, name, digest, key))


def adoption_verdict(existing: Mapping[str, Any], wanted: Mapping[str, Any], *,
                     key: bytes) -> tuple[str, str]:
    """What to do with a Job that already holds the name of the Job `wanted` (signed):

    - ("requeue", why): it is being deleted; it will not run, and its name is not free
      yet, so the job goes back to the queue as a new attempt (a new name);
    - ("refuse", why): fairq did not create it (no owner seal that verifies with fairq's
      key): never adopted, whatever its labels say;
    - ("adopt", note): fairq created it; `note` is non-empty when it was built from an
      earlier version of this attempt's spec (a tier or GPU type edited, or fairq
      upgraded, between the create and the retry): still adopted, it is fairq's.
    """
    meta = existing.get("metadata") or {}
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    if meta.get("deletionTimestamp"):
        return "requeue", f"its Kubernetes Job {where} is being deleted"
    if not sealed_by_fairq(existing, key):
        return "refuse", (f"a Job named {where} already exists and fairq did not create it "
                          f"(no valid {A_OWNER} annotation); not adopted")
    digest = (meta.get("annotations") or {}).get(A_SPEC_DIGEST)
    wanted_digest = ((wanted.get("metadata") or {}).get("annotations") or {}).get(A_SPEC_DIGEST)
    if digest != wanted_digest:
        return "adopt", f"{where} was created by fairq from an earlier spec of this attempt"
    return "adopt", ""


# --- reading objects back ---------------------------------------------------------------

def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:
        return None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("status") or {}


def pod_is_terminal(pod: Mapping[str, Any]) -> bool:
    return _status(pod).get("phase") in ("Succeeded", "Failed")


def pod_started_at(pod: Mapping[str, Any]) -> datetime | None:
    """When the pod's container started (the kubelet's word), else its startTime."""
    starts = []
    for cs in _status(pod).get("containerStatuses") or ():
        state = cs.get("state") or {}
        for key in ("running", "terminated"):
            t = parse_time((state.get(key) or {}).get("startedAt"))
            if t is not None:
                starts.append(t)
    if starts:
        return min(starts)
    if _status(pod).get("phase") in ("Running", "Succeeded", "Failed"):
        return parse_time(_status(pod).get("startTime"))
    return None


def pod_finished_at(pod: Mapping[str, Any]) -> datetime | None:
    ends = [parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            for cs in _status(pod).get("containerStatuses") or ()]
    found = [e for e in ends if e is not None]
    return max(found) if found else None


def _terminated(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [(cs.get("state") or {}).get("terminated") or {}
            for cs in _status(pod).get("containerStatuses") or ()
            if (cs.get("state") or {}).get("terminated")]


def _job_condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in _status(job).get("conditions") or ():
        if c.get("type") == kind and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def job_finished(job: Mapping[str, Any]) -> datetime | None:
    """When the Job completed or failed, None while it has not."""
    for kind in ("Complete", "Failed"):
        c = _job_condition(job, kind)
        if c is not None:
            return (parse_time(_status(job).get("completionTime"))
                    or parse_time(c.get("lastTransitionTime"))
                    or parse_time(c.get("lastProbeTime"))
                    or parse_time(_meta(job).get("creationTimestamp"))
                    or datetime(1970, 1, 1, tzinfo=UTC))
    return None


def _image_error(pods: Sequence[Mapping[str, Any]], *, now: datetime, timeout_seconds: float,
                 first_seen: Mapping[str, datetime]) -> str | None:
    for pod in pods:
        for cs in _status(pod).get("containerStatuses") or ():
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason not in IMAGE_ERRORS:
                continue
            since = first_seen.get(_meta(pod).get("uid", "")) or \
                parse_time(_meta(pod).get("creationTimestamp")) or now
            if (now - since).total_seconds() >= timeout_seconds:
                msg = waiting.get("message") or ""
                return f"{reason}: {msg}".strip().rstrip(":")[:400] + \
                    f" (for {timeout_seconds:.0f} s)"
    return None


def replica_nodes(pods: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The node of each replica that has a bound pod, in replica order (the pod's
    `fairq.io/replica` label; none: replica 0), one entry per replica: two replicas on one
    node name it twice, so what a running job holds is counted per replica (rules A3, R4).
    Where a replica had several pods (a retried single-replica Job), its newest counts."""
    newest: dict[int, tuple[str, str]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        meta = _meta(pod)
        try:
            replica = int((meta.get("labels") or {}).get(L_REPLICA, 0))
        except (TypeError, ValueError):
            continue
        created = str(meta.get("creationTimestamp") or "")
        if replica not in newest or created >= newest[replica][0]:
            newest[replica] = (created, str(node))
    return tuple(newest[r][1] for r in sorted(newest))


def replica0_address(pods: Sequence[Mapping[str, Any]]) -> str:
    """The IP of replica 0's newest running pod (`status.podIP`), "" when it has none:
    where a notebook session's server is reached (docs/sessions.md)."""
    best = ("", "")
    for pod in pods:
        meta = _meta(pod)
        if str((meta.get("labels") or {}).get(L_REPLICA, "0")) != "0":
            continue
        status = _status(pod)
        ip = str(status.get("podIP") or "")
        if not ip or status.get("phase") != "Running" or meta.get("deletionTimestamp"):
            continue
        created = str(meta.get("creationTimestamp") or "")
        if created >= best[0]:
            best = (created, ip)
    return best[1]


def workload_status(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *,
                    now: datetime, image_pull_timeout_seconds: float = 300.0,
                    image_error_since: Mapping[str, datetime] | None = None,
                    pod_create_timeout_seconds: float | None = None,
                    create_error: str = "",
                    ) -> WorkloadStatus | None:
    """What fairq should believe about one fairq Job and its pods; None when the Job has
    no fairq identity (not ours).

    - SUCCEEDED / FAILED from the Job's conditions, or earlier from its pods (every
      completion succeeded; more pods failed than `backoffLimit`); FAILED also when a pod
      cannot pull its image for `image_pull_timeout_seconds` (reason from its state),
      and when the Job has had no pod at all for `pod_create_timeout_seconds` and the
      Job controller said why (`create_error`, its FailedCreate message: a
      ResourceQuota or LimitRange refuses). Without that message a Job without pods is
      only slow: PENDING with a reason starting with `WAITING`.
    - RUNNING once any pod has started; PENDING before.
    - stopping when the Job is being deleted; restarts = failed pods (replaced by the
      Job controller) plus container restarts.
    - started_at = earliest container start; finished_at = latest container finish (the
      Job's completion time when no pod says); so usage is the pods' real run time.
    """
    meta = _meta(job)
    labels = meta.get("labels") or {}
    name = meta.get("name", "")
    try:
        job_id = int(labels[L_JOB_ID])
        attempt = int(labels[L_ATTEMPT])
    except (KeyError, ValueError):
        parsed = parse_workload_name(name)
        if parsed is None:
            return None
        job_id, attempt = parsed
    starts = [t for t in (pod_started_at(p) for p in pods) if t is not None]
    started_at = min(starts) if starts else None
    ends = [t for t in (pod_finished_at(p) for p in pods) if t is not None]
    nodes = replica_nodes(pods)
    complete = _job_condition(job, "Complete")
    failed = _job_condition(job, "Failed")
    # The pods decide before the Job controller writes its condition (up to seconds
    # later under load): all completions succeeded, or more failures than backoffLimit.
    job_spec = job.get("spec") or {}
    phases = [_status(p).get("phase") for p in pods]
    rendezvous = L_REPLICA in labels
    if rendezvous:
        # All or nothing (docs/kubernetes.md, "Replicas that rendezvous"): replica 0's
        # Job speaks for replica 0 only. The workload succeeded once every replica's pod
        # did; it failed when any pod failed, or replica 0's Job did (its deadline).
        complete = None
        if "Failed" in phases and failed is None:
            failed = {"type": "Failed", "status": "True", "reason": "ReplicaFailed"}
        elif failed is None and phases.count("Succeeded") >= workload_replicas(job):
            complete = {"type": "Complete", "status": "True"}
    elif complete is None and failed is None:
        if phases.count("Succeeded") >= int(job_spec.get("completions") or 1):
            complete = {"type": "Complete", "status": "True"}
        elif phases.count("Failed") > int(job_spec.get("backoffLimit", 6)):
            failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    phase = Phase.PENDING
    reason = ""
    exit_code: int | None = None
    finished_at: datetime | None = None
    if complete is not None:
        phase, exit_code = Phase.SUCCEEDED, 0
        finished_at = max(ends) if ends else job_finished(job)
    elif failed is not None:
        phase = Phase.FAILED
        finished_at = max(ends) if ends else (job_finished(job) or now)
        reason, exit_code = failure_reason(failed, pods)
        replica = failed_replica(pods) if rendezvous else None
        if replica is not None:
            reason, exit_code = failure_reason(failed, replica[1])
            reason = f"replica {replica[0]} failed: {reason}"
    else:
        image_error = _image_error(pods, now=now, timeout_seconds=image_pull_timeout_seconds,
                                   first_seen=image_error_since or {})
        if image_error is not None:
            phase, reason, finished_at = Phase.FAILED, image_error, now
        elif pods_never_created(job, pods, now=now, timeout_seconds=pod_create_timeout_seconds):
            if create_error:
                # A real refusal: the Job controller said why it cannot create the pods.
                reason = (f"no pod could be created in {pod_create_timeout_seconds:.0f} s: "
                          f"{create_error}")
                phase, finished_at = Phase.FAILED, now
            else:
                # Slow is not failed: the controller may be behind.
                reason = (f"{WAITING}no pod created in {pod_create_timeout_seconds:.0f} s "
                          "(the Job controller is slow or stopped)")
        elif not pods and create_error and not meta.get("deletionTimestamp"):
            reason = f"{WAITING}the Job controller cannot create pods yet: {create_error}"
        elif started_at is not None:
            phase = Phase.RUNNING
    if phase in (Phase.SUCCEEDED, Phase.FAILED) and started_at is not None and \
            finished_at is not None and finished_at < started_at:
        finished_at = started_at
    restarts = max(int(_status(job).get("failed") or 0), phases.count("Failed")) + sum(
        int(cs.get("restartCount") or 0)
        for p in pods for cs in _status(p).get("containerStatuses") or ())
    return WorkloadStatus(name=name, job_id=job_id, attempt=attempt, phase=phase,
                          started_at=started_at, finished_at=finished_at,
                          exit_code=exit_code, reason=reason[:500], nodes=nodes,
                          stopping=bool(meta.get("deletionTimestamp")), restarts=restarts,
                          address=replica0_address(pods) if phase == Phase.RUNNING else "")


def failed_replica(pods: Sequence[Mapping[str, Any]]
                   ) -> tuple[str, list[Mapping[str, Any]]] | None:
    """The replica (its `fairq.io/replica` index) whose pod failed first, and its failed
    pods; None when no pod failed."""
    failed = [p for p in pods if _status(p).get("phase") == "Failed"]
    if not failed:
        return None
    failed.sort(key=lambda p: (str(pod_finished_at(p) or ""),
                               str((_meta(p).get("labels") or {}).get(L_REPLICA, ""))))
    index = str((_meta(failed[0]).get("labels") or {}).get(L_REPLICA, "?"))
    return index, [p for p in failed
                   if str((_meta(p).get("labels") or {}).get(L_REPLICA, "?")) == index]


def workload_finished(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]
                      ) -> datetime | None:
    """When the workload of `job` (its workload Job, replica 0's) ended, None while any
    of it runs: the Job's condition, or all its pods ended. For replicas > 1, only once
    every replica's pod ended (replica 0's Job ending says nothing of the others)."""
    if L_REPLICA in (_meta(job).get("labels") or {}):
        if len(pods) < workload_replicas(job):
            return None
        return pods_finished(pods)
    return job_finished(job) or pods_finished(pods)


def pods_finished(pods: Sequence[Mapping[str, Any]]) -> datetime | None:
    """When the last of `pods` ended, if there is at least one and all have ended (the
    Job controller may not have written its condition yet); None otherwise."""
    if not pods or not all(pod_is_terminal(p) for p in pods):
        return None
    ends = [t for t in (pod_finished_at(p) for p in pods) if t is not None]
    return max(ends) if ends else datetime(1970, 1, 1, tzinfo=UTC)


def orphan_pods_status(name: str, pods: Sequence[Mapping[str, Any]], *,
                       now: datetime) -> WorkloadStatus | None:
    """The status of fairq pods whose Job is gone (deleted with orphan propagation, or
    while fairq was down): the attempt is over. All ended → how they ended; some still
    running → FAILED now ("deleted outside fairq"), so the job stops holding GPUs and the
    pods' run time is charged; the caller deletes the pods. None when no pod ever started
    (nothing ran, nothing to charge) or the pods carry no fairq identity."""
    labels = _meta(pods[0]).get("labels") or {} if pods else {}
    ann = _meta(pods[0]).get("annotations") or {} if pods else {}
    synthetic = {"metadata": {"name": name, "labels": labels},
                 "spec": {"completions": int(ann.get(A_REPLICAS) or 1), "backoffLimit": 0}}
    status = workload_status(synthetic, pods, now=now)
    if status is None or status.started_at is None:
        return None
    if status.phase in (Phase.SUCCEEDED, Phase.FAILED) and pods_finished(pods) is not None:
        return status
    return WorkloadStatus(
        name=name, job_id=status.job_id, attempt=status.attempt, phase=Phase.FAILED,
        started_at=status.started_at, finished_at=now, nodes=status.nodes,
        reason="its Kubernetes Job was deleted outside fairq; its pods are being removed",
        restarts=status.restarts)


def pods_never_created(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *,
                       now: datetime, timeout_seconds: float | None) -> bool:
    """The Job has existed `timeout_seconds` without a single pod (and is not finished or
    being deleted)."""
    if timeout_seconds is None or pods or job_finished(job) is not None:
        return False
    meta = _meta(job)
    created = parse_time(meta.get("creationTimestamp"))
    return (not meta.get("deletionTimestamp") and created is not None
            and (now - created).total_seconds() >= timeout_seconds)


def failure_reason(condition: Mapping[str, Any],
                   pods: Sequence[Mapping[str, Any]]) -> tuple[str, int | None]:
    """A readable reason for a failed Job and the exit code of the container that failed."""
    why = condition.get("reason") or "Failed"
    if why == "DeadlineExceeded":
        return "DeadlineExceeded: ran longer than its max runtime", None
    terms = [t for p in pods for t in _terminated(p) if t.get("exitCode", 0) != 0]
    terms.sort(key=lambda t: t.get("finishedAt") or "")
    if terms:
        t = terms[0]
        code = int(t.get("exitCode", 1))
        if t.get("reason") == "OOMKilled":
            return f"OOMKilled: a container ran out of memory (exit code {code})", code
        detail = f" ({t['reason']})" if t.get("reason") else ""
        msg = f": {t['message'].strip()[:300]}" if t.get("message") else ""
        return f"exit code {code}{detail}{msg}", code
    msg = condition.get("message") or ""
    return f"{why}: {msg}".strip().rstrip(":"), None


# --- what the watch cache keeps (k8s_cache.Informer's transform) -------------------------

# The metadata the readers above and the backend use: identity, labels and annotations
# (fairq's identity, the seal, placement), owners (whose pods), times and deletion. Not
# kept: managedFields (most of an object's bytes on a 1.18+ API server), generateName,
# selfLink.
_META_KEPT = ("name", "namespace", "uid", "resourceVersion", "generation", "labels",
              "annotations", "ownerReferences", "finalizers", "creationTimestamp",
              "deletionTimestamp", "deletionGracePeriodSeconds")
# A pod's status without its conditions, host and QoS class (nothing reads them).
_POD_STATUS_KEPT = ("phase", "reason", "message", "startTime", "podIP",
                    "containerStatuses")
_NODE_STATUS_KEPT = ("conditions", "allocatable", "capacity")
# Of a container's status: its state (running, terminated: exit code, reason, times) and
# restarts; not its image, image digest, readiness or last state.
_CONTAINER_STATUS_KEPT = ("name", "state", "restartCount")


def _compact(obj: Any) -> Any:
    """`obj` with every key and every short string shared (`sys.intern`): the label keys
    and values, phases, images and quantities of 150,000 pods are a few hundred strings
    (a fifth of a slim pod's memory)."""
    if isinstance(obj, dict):
        return {sys.intern(k): _compact(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_compact(v) for v in obj]
    if isinstance(obj, str) and len(obj) <= 64:
        return sys.intern(obj)
    return obj


def _slim_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: meta[k] for k in _META_KEPT if k in meta}


def _slim_containers(containers: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: c[k] for k in ("name", "resources") if k in c} for c in containers]


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What fairq reads of a pod (its status, workload and capacity readers above, the
    backend's logs, orphan and spot handling): metadata but managedFields, the node, the
    containers' names and resources, the status but its conditions. A running pod's
    command, env, stop hook, volumes, affinity and tolerations are about four fifths of
    its bytes, and 150,000 of them are the worker's memory (docs/performance.md, "A
    fleet of 5,000 nodes: the Kubernetes path"). Held to the full object by
    tests/test_k8s_slim_cache.py."""
    out: dict[str, Any] = {"metadata": _slim_meta(pod.get("metadata") or {})}
    spec = pod.get("spec")
    if spec is not None:
        slim: dict[str, Any] = {}
        if "nodeName" in spec:
            slim["nodeName"] = spec["nodeName"]
        for key in ("containers", "initContainers"):
            if key in spec:
                slim[key] = _slim_containers(spec[key] or ())
        out["spec"] = slim
    status = pod.get("status")
    if status is not None:
        slim = {k: status[k] for k in _POD_STATUS_KEPT if k in status}
        if "containerStatuses" in slim:
            slim["containerStatuses"] = [
                {k: cs[k] for k in _CONTAINER_STATUS_KEPT if k in cs}
                for cs in slim["containerStatuses"] or ()]
        out["status"] = slim
    return _compact(out)  # type: ignore[no-any-return]


def slim_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """What fairq reads of a Job: metadata but managedFields, the spec but its pod
    template and selector (completions, backoffLimit, parallelism, deadline), the whole
    status (conditions, counts, times). Held to the full object by
    tests/test_k8s_slim_cache.py."""
    out: dict[str, Any] = {"metadata": _slim_meta(job.get("metadata") or {})}
    spec = job.get("spec")
    if spec is not None:
        out["spec"] = {k: v for k, v in spec.items() if k not in ("template", "selector")}
    if "status" in job:
        out["status"] = job["status"]
    return _compact(out)  # type: ignore[no-any-return]


def slim_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """What fairq reads of a node: metadata but managedFields (its labels: GPU type,
    topology, spot), the spec (taints, unschedulable), its conditions, allocatable and
    capacity; not its image list, volumes or system info."""
    out: dict[str, Any] = {"metadata": _slim_meta(node.get("metadata") or {})}
    if "spec" in node:
        out["spec"] = node["spec"]
    status = node.get("status")
    if status is not None:
        out["status"] = {k: status[k] for k in _NODE_STATUS_KEPT if k in status}
    return _compact(out)  # type: ignore[no-any-return]


# --- capacity ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class GpuTypeRef:
    """The part of a fairq GpuType the backend needs to recognise nodes."""

    slug: str
    resource_name: str
    node_labels: Mapping[str, str]
    # Rule A7: (level name, node label) narrow to wide; a node's domain of a level is
    # its value of the label.
    topology_levels: tuple[tuple[str, str], ...] = ()
    # Shared GPUs: what one GPU of the type counts in `resource_name` (slices per GPU of
    # a time-sliced or MPS type; 1 for an exclusive GPU or a MIG instance). The
    # Kubernetes backend reads the allocatable as it is (already slices); the simulated
    # one multiplies its GPUs by it.
    units_per_device: int = 1


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def node_usable(node: Mapping[str, Any], tolerated: Sequence[NodeMatch] = ()) -> bool:
    """Schedulable, Ready, and not tainted away: no NoSchedule/NoExecute taint other than
    the GPU taint fairq's pods tolerate and those of `tolerated` (a spot node's spot
    taints, which the pods placed on it tolerate: rule K4)."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    ready = [c for c in _status(node).get("conditions") or () if c.get("type") == "Ready"]
    if not ready or ready[0].get("status") != "True":
        return False
    for taint in spec.get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and \
                taint.get("key") != GPU_TAINT_KEY and not taint_tolerated(taint, tolerated):
            return False
    return True


def node_gpu_type(node: Mapping[str, Any], gpu_types: Sequence[GpuTypeRef]
                  ) -> tuple[GpuTypeRef, int] | None:
    """The most specific GPU type whose labels the node carries and whose resource it
    offers (ties by slug), with the node's allocatable count of that resource."""
    labels = _meta(node).get("labels") or {}
    allocatable = _status(node).get("allocatable") or {}
    matches = []
    for g in gpu_types:
        count = _quantity(allocatable.get(g.resource_name, 0))
        if count > 0 and all(labels.get(k) == v for k, v in g.node_labels.items()):
            matches.append((-len(g.node_labels), g.slug, g, count))
    if not matches:
        return None
    _, _, g, count = min(matches, key=lambda m: (m[0], m[1]))
    return g, count


def pod_gpu_requests(pod: Mapping[str, Any], resource: str) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or ():
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource))
        if value is not None:
            total += _quantity(value)
    return total


def _cpu_or_none(value: Any) -> int | None:
    return _parsed_cpu(str(value))


def _bytes_or_none(value: Any) -> int | None:
    return _parsed_bytes(str(value))


# A quantity's value, kept per text: `nodes()` reads every pod's requests each cycle
# (two thirds of it at 10,000 pods was parsing "8" and "64Gi" with fractions again), and
# a fleet's pods ask a few hundred distinct quantities.
@functools.lru_cache(maxsize=4096)
def _parsed_cpu(text: str) -> int | None:
    try:
        return parse_cpu(text)
    except ValueError:
        return None


@functools.lru_cache(maxsize=4096)
def _parsed_bytes(text: str) -> int | None:
    try:
        return parse_bytes(text)
    except ValueError:
        return None


def pod_cpu_memory_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """What the scheduler counts of a pod on its node (rule A6): per resource, the sum
    over its containers of the request (else the limit), or the largest init container's
    when that is more. Millicores and bytes; a quantity that does not parse counts 0."""
    spec = pod.get("spec") or {}

    def requests(c: Mapping[str, Any]) -> tuple[int, int]:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        cpu, memory = req.get("cpu", lim.get("cpu")), req.get("memory", lim.get("memory"))
        return ((_cpu_or_none(cpu) or 0) if cpu is not None else 0,
                (_bytes_or_none(memory) or 0) if memory is not None else 0)

    main = [requests(c) for c in spec.get("containers") or ()]
    init = [requests(c) for c in spec.get("initContainers") or ()]
    cpu = max(sum(c for c, _ in main), max((c for c, _ in init), default=0))
    memory = max(sum(m for _, m in main), max((m for _, m in init), default=0))
    return cpu, memory


def capacity(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
             gpu_types: Sequence[GpuTypeRef], *,
             unbound: Mapping[str, int] | None = None,
             spot_labels: Sequence[NodeMatch] = (),
             spot_tolerations: Sequence[NodeMatch] = ()) -> list[NodeInfo]:
    """NodeInfo per usable node of a known GPU type (a spot node, by `spot_labels`, is
    usable despite its `spot_tolerations` taints: rule K4). `allocated` = GPUs requested by
    non-terminal pods bound to the node, including pods being deleted (GPUs are free only
    once the pods are gone), plus `unbound` GPUs fairq has submitted for the node but the
    scheduler has not bound yet. Likewise CPU and memory (rule A6): the node's
    allocatable (None when it does not say) and what those pods request. `topology`: the
    node's value of each topology level's label of its GPU type (rule A7); `labels`: the
    node's labels (its `NodePool`, rule C4)."""
    typed: dict[str, tuple[GpuTypeRef, int]] = {}
    node_labels: dict[str, dict[str, str]] = {}
    allocatable: dict[str, tuple[int | None, int | None]] = {}
    topology: dict[str, dict[str, str]] = {}
    for node in nodes:
        if not node_usable(node, spot_tolerations
                           if spot_tolerations and node_is_spot(node, spot_labels) else ()):
            continue
        found = node_gpu_type(node, gpu_types)
        if found is not None:
            name = _meta(node)["name"]
            typed[name] = found
            alloc = _status(node).get("allocatable") or {}
            allocatable[name] = (
                _cpu_or_none(alloc["cpu"]) if "cpu" in alloc else None,
                _bytes_or_none(alloc["memory"]) if "memory" in alloc else None)
            labels = _meta(node).get("labels") or {}
            topology[name] = {level: str(labels[label])
                              for level, label in found[0].topology_levels if label in labels}
            node_labels[name] = {str(k): str(v) for k, v in labels.items()}
    allocated = dict.fromkeys(typed, 0)
    cpu_used = dict.fromkeys(typed, 0)
    memory_used = dict.fromkeys(typed, 0)
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name not in typed or pod_is_terminal(pod):
            continue
        allocated[node_name] += pod_gpu_requests(pod, typed[node_name][0].resource_name)
        cpu, memory = pod_cpu_memory_requests(pod)
        cpu_used[node_name] += cpu
        memory_used[node_name] += memory
    for node_name, n in (unbound or {}).items():
        if node_name in allocated:
            allocated[node_name] += n
    return [NodeInfo(name, g.slug, count, allocated[name],
                     cpu_millicores=allocatable[name][0], cpu_allocated=cpu_used[name],
                     memory_bytes=allocatable[name][1], memory_allocated=memory_used[name],
                     topology=topology[name], labels=node_labels[name])
            for name, (g, count) in sorted(typed.items())]


def unbound_demand(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """GPUs of a running Job's replicas not yet bound to a node, on the nodes fairq
    planned for them: without this a cycle that runs between "Job created" and "pod
    bound" would see the planned GPUs free and admit a second job onto them."""
    if job_finished(job) is not None or _meta(job).get("deletionTimestamp"):
        return {}
    ann = _meta(job).get("annotations") or {}
    try:
        per = int(ann.get(A_GPUS_PER_REPLICA, "0"))
        replicas = int(ann.get(A_REPLICAS, "0"))
    except ValueError:
        return {}
    planned = [n for n in (ann.get(A_PLACEMENT) or "").split(",") if n]
    placed = [str((p.get("spec") or {}).get("nodeName")) for p in pods
              if (p.get("spec") or {}).get("nodeName") and
              (_status(p).get("phase") != "Failed")]
    missing = replicas - len(placed)
    if per <= 0 or missing <= 0 or not planned:
        return {}
    remaining = list(planned)
    for node in placed:
        if node in remaining:
            remaining.remove(node)
    out: dict[str, int] = {}
    for node in remaining[:missing]:
        out[node] = out.get(node, 0) + per
    return out


TEAM_ROLE = "fairq-team-workloads"  # platform/k8s/base/rbac.yaml
TEAM_ROLE_BINDING = "fairq-scheduler"
# The provisioner's rights inside one team namespace (its labels, quota, the binding
# above), bound there at bootstrap by the cluster admin (docs/kubernetes.md, "RBAC").
PROVISIONER_ROLE = "fairq-team-provisioning"
PROVISIONER_ROLE_BINDING = "fairq-provisioner"


def role_binding_manifest(namespace: str, *, service_account: str,
                          service_account_namespace: str, name: str = "",
                          role: str = "") -> dict[str, Any]:
    """The RoleBinding the provisioner puts in a team namespace: the scheduler's service
    account gets the ClusterRole `fairq-team-workloads` (its Jobs, their logs and events)
    in this namespace only. With `name` and `role`: another binding of the same shape
    (the provisioner's own, `PROVISIONER_ROLE_BINDING`, made at bootstrap)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name or TEAM_ROLE_BINDING, "namespace": namespace,
                     "labels": {MANAGED_BY: MANAGED_BY_VALUE}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role or TEAM_ROLE},
        "subjects": [{"kind": "ServiceAccount", "name": service_account,
                      "namespace": service_account_namespace}],
    }
