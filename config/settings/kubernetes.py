"""The Kubernetes backend (docs/kubernetes.md): namespaces, what reaches a pod spec, the
timeouts of a Job's life, provisioning and RBAC, spot nodes."""

from __future__ import annotations

import re

import environ

from queueing.validation import parse_bytes as _parse_bytes

from .environment import env

FAIRQ_KUBECONFIG = env("FAIRQ_KUBECONFIG", default="")
FAIRQ_KUBE_CONTEXT = env("FAIRQ_KUBE_CONTEXT", default="")
# Team namespaces are <prefix><team slug>; fairq creates and labels them.
FAIRQ_KUBE_NAMESPACE_PREFIX = env("FAIRQ_KUBE_NAMESPACE_PREFIX", default="fairq-")
if FAIRQ_KUBE_NAMESPACE_PREFIX and not (
    len(FAIRQ_KUBE_NAMESPACE_PREFIX) <= 22 and FAIRQ_KUBE_NAMESPACE_PREFIX[0].isalnum()
    and FAIRQ_KUBE_NAMESPACE_PREFIX.endswith("-")
    and all(c in "abcdefghijklmnopqrstuvwxyz0123456789-" for c in FAIRQ_KUBE_NAMESPACE_PREFIX)
):
    raise environ.ImproperlyConfigured(
        "FAIRQ_KUBE_NAMESPACE_PREFIX must be a short DNS label prefix such as 'fairq-'")
# Image registries jobs may pull from ("ghcr.io/acme", "registry.example.com"); empty = any.
FAIRQ_REGISTRY_ALLOWLIST = env.list("FAIRQ_REGISTRY_ALLOWLIST", default=[])
if any(not _r or "://" in _r or " " in _r for _r in FAIRQ_REGISTRY_ALLOWLIST):
    raise environ.ImproperlyConfigured(
        "FAIRQ_REGISTRY_ALLOWLIST entries are registries or registry/path prefixes, no scheme")
# The most node-local scratch one `empty_dir` volume of a job may ask for (bytes; its
# size_limit). Default 1Ti.
FAIRQ_MAX_SCRATCH_BYTES = env.int("FAIRQ_MAX_SCRATCH_BYTES", default=2**40)
if not 1 <= FAIRQ_MAX_SCRATCH_BYTES <= 2**60:
    raise environ.ImproperlyConfigured("FAIRQ_MAX_SCRATCH_BYTES must be within 1..2**60 bytes")
# Finished Jobs (and their pods' logs) are kept this long.
FAIRQ_K8S_TTL_AFTER_FINISHED_SECONDS = env.int("FAIRQ_K8S_TTL_AFTER_FINISHED_SECONDS",
                                               default=3600)
# A pod that cannot pull its image for this long fails its job.
FAIRQ_K8S_IMAGE_PULL_TIMEOUT_SECONDS = env.int("FAIRQ_K8S_IMAGE_PULL_TIMEOUT_SECONDS",
                                               default=300)
FAIRQ_K8S_TERMINATION_GRACE_SECONDS = env.int("FAIRQ_K8S_TERMINATION_GRACE_SECONDS", default=30)
# Rule R10: the longest termination grace period a job of a preemptible tier may have when
# the tier sets no cap of its own (Tier.max_termination_grace_seconds, which may raise or
# lower it): a preempted victim holds its GPUs for its grace period (docs/kubernetes.md).
FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS = env.int(
    "FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS", default=300)
if not 0 <= FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS <= 24 * 3600:
    raise environ.ImproperlyConfigured(
        "FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS must be within 0..86400")
# Every pod has a memory limit (= its request): a job that sets no memory, of a team with
# no default, gets this much per GPU of a replica, at most what the largest node of its
# GPU type can allocate (docs/kubernetes.md, "Memory, /dev/shm and CPU"). No CPU default:
# a CPU limit throttles (CFS quota) and CPU, unlike memory, is shared without killing.
FAIRQ_DEFAULT_MEMORY_PER_GPU = env("FAIRQ_DEFAULT_MEMORY_PER_GPU", default="32Gi")
try:
    _parse_bytes(FAIRQ_DEFAULT_MEMORY_PER_GPU)
except ValueError as _exc:
    raise environ.ImproperlyConfigured(
        f"FAIRQ_DEFAULT_MEMORY_PER_GPU must be a quantity of bytes such as 32Gi: {_exc}"
    ) from None
# A Job that has had no pod this long while the Job controller reports why it cannot
# create them (a FailedCreate event: a ResourceQuota or LimitRange refuses) fails its job;
# without such an event the job only shows as waiting for the cluster (a slow controller).
FAIRQ_K8S_POD_CREATE_TIMEOUT_SECONDS = env.int("FAIRQ_K8S_POD_CREATE_TIMEOUT_SECONDS",
                                               default=120)
# Who creates team namespaces, their ResourceQuota and the scheduler's RoleBinding in each,
# and the PriorityClasses: "separate" = only `manage.py sync_cluster` run as the
# fairq-provisioner service account (platform/k8s/base/rbac.yaml; the worker has no
# cluster-wide writes, a team's jobs wait until it is provisioned); "scheduler" = the
# worker itself on a team's first job (it then needs the provisioner's ClusterRole too).
FAIRQ_K8S_PROVISION = env("FAIRQ_K8S_PROVISION", default="separate")
if FAIRQ_K8S_PROVISION not in {"separate", "scheduler"}:
    raise environ.ImproperlyConfigured("FAIRQ_K8S_PROVISION must be 'separate' or 'scheduler'")
# The service account the provisioner binds in each team namespace ("namespace/name";
# empty = bind nothing, e.g. a scheduler running outside the cluster as a user).
FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT = env("FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT",
                                          default="fairq-system/fairq-scheduler")
if FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT and FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT.count("/") != 1:
    raise environ.ImproperlyConfigured(
        "FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT must be 'namespace/name' or empty")
# The provisioner's service account ("namespace/name"), bound in each team namespace at
# bootstrap (`manage.py sync_cluster --bootstrap`): the only place it may label the
# namespace, set its quota and bind the scheduler (docs/kubernetes.md, "RBAC").
FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT = env("FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT",
                                            default="fairq-system/fairq-provisioner")
if FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT and \
        FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT.count("/") != 1:
    raise environ.ImproperlyConfigured(
        "FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT must be 'namespace/name' or empty")
# Namespaces outside fairq's whose pods run on the GPU nodes too (comma-separated): their
# bound pods' GPUs, CPU and memory count against the nodes' capacity. The worker reads
# pods only in fairq's team namespaces and these, each allowed by a RoleBinding of the
# ClusterRole fairq-read-pods there (docs/kubernetes.md, "RBAC"); empty = none.
FAIRQ_K8S_OTHER_POD_NAMESPACES = env.list("FAIRQ_K8S_OTHER_POD_NAMESPACES", default=[])
if any(not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", _n)
       for _n in FAIRQ_K8S_OTHER_POD_NAMESPACES):
    raise environ.ImproperlyConfigured(
        "FAIRQ_K8S_OTHER_POD_NAMESPACES entries are namespace names (DNS-1123 labels)")
# An admitted job whose Job the API server keeps refusing (403: a namespace quota on
# Jobs, an RBAC denial) fails after this long, giving its GPUs back.
FAIRQ_K8S_SUBMIT_REFUSED_SECONDS = env.int("FAIRQ_K8S_SUBMIT_REFUSED_SECONDS", default=600)
# Full relist of the watched objects, on top of the watches.
FAIRQ_K8S_RESYNC_SECONDS = env.int("FAIRQ_K8S_RESYNC_SECONDS", default=300)
for _name in ("FAIRQ_K8S_TTL_AFTER_FINISHED_SECONDS",
              "FAIRQ_K8S_IMAGE_PULL_TIMEOUT_SECONDS", "FAIRQ_K8S_TERMINATION_GRACE_SECONDS",
              "FAIRQ_K8S_POD_CREATE_TIMEOUT_SECONDS", "FAIRQ_K8S_SUBMIT_REFUSED_SECONDS"):
    if globals()[_name] < 0:
        raise environ.ImproperlyConfigured(f"{_name} must be >= 0")
if FAIRQ_K8S_RESYNC_SECONDS < 10:
    raise environ.ImproperlyConfigured("FAIRQ_K8S_RESYNC_SECONDS must be >= 10")
# How many Job creates the cycle keeps in flight at once (most of a create is waiting on
# the API server); 1 = one after the other.
FAIRQ_K8S_SUBMIT_CONCURRENCY = env.int("FAIRQ_K8S_SUBMIT_CONCURRENCY", default=8)
if not 1 <= FAIRQ_K8S_SUBMIT_CONCURRENCY <= 64:
    raise environ.ImproperlyConfigured("FAIRQ_K8S_SUBMIT_CONCURRENCY must be 1-64")

# Spot capacity on Kubernetes (docs/kubernetes.md, "Spot nodes"; rules K4, K6): a node
# carrying one of these labels (key=value, or a key for any value) is spot; a spot node on
# which one of these taints or labels (key or key=value) appears is being reclaimed, and
# its jobs are requeued at once (as when it is deleted). Defaults: the clouds' own (GKE,
# Karpenter, EKS, AKS; GKE's, aws-node-termination-handler's and Karpenter's termination
# taints) and fairq's `fairq.io/spot=true`, `fairq.io/reclaim`.
FAIRQ_SPOT_NODE_LABELS = env.list("FAIRQ_SPOT_NODE_LABELS", default=[
    "cloud.google.com/gke-spot=true", "cloud.google.com/gke-preemptible=true",
    "karpenter.sh/capacity-type=spot", "eks.amazonaws.com/capacityType=SPOT",
    "kubernetes.azure.com/scalesetpriority=spot", "fairq.io/spot=true"])
FAIRQ_SPOT_TERMINATION_TAINTS = env.list("FAIRQ_SPOT_TERMINATION_TAINTS", default=[
    "cloud.google.com/impending-node-termination", "aws-node-termination-handler/spot-itn",
    "karpenter.sh/disrupted", "karpenter.sh/disruption", "fairq.io/reclaim"])
# Taints that mark spot capacity (not its reclamation; same grammar, any effect): a spot
# node carrying only these is still used, and the pods of an attempt placed on spot
# tolerate them (rule K4); on-demand attempts do not. Default: AKS's spot pool taint. A
# key that is also a termination taint is refused.
FAIRQ_SPOT_TOLERATIONS = env.list("FAIRQ_SPOT_TOLERATIONS", default=[
    "kubernetes.azure.com/scalesetpriority=spot"])


def _check_spot_matches() -> None:
    """Parse the three spot settings at start-up (a typo would silently match nothing)."""
    from queueing.backends.k8s_api import parse_node_matches, spot_tolerations_problem

    parsed = {}
    for name in ("FAIRQ_SPOT_NODE_LABELS", "FAIRQ_SPOT_TERMINATION_TAINTS",
                 "FAIRQ_SPOT_TOLERATIONS"):
        try:
            parsed[name] = parse_node_matches(globals()[name], what=name)
        except ValueError as exc:
            raise environ.ImproperlyConfigured(str(exc)) from exc
    problem = spot_tolerations_problem(parsed["FAIRQ_SPOT_TOLERATIONS"],
                                       parsed["FAIRQ_SPOT_TERMINATION_TAINTS"])
    if problem:
        raise environ.ImproperlyConfigured(problem)


_check_spot_matches()

# Shared GPUs, an MPS GPU type's pods (docs/kubernetes.md, "Shared GPUs"): "" (default)
# = the NVIDIA device plugin's own MPS control daemon, whose Allocate sets
# CUDA_MPS_PIPE_DIRECTORY and mounts it; a path = an MPS daemon run on the nodes outside
# the plugin: the pods get CUDA_MPS_PIPE_DIRECTORY (CUDA_MPS_LOG_DIRECTORY) and a hostPath
# mount of it (their namespace must then allow hostPath: the `privileged` Pod Security
# level). Absolute paths.
FAIRQ_K8S_MPS_PIPE_DIRECTORY = env("FAIRQ_K8S_MPS_PIPE_DIRECTORY", default="")
FAIRQ_K8S_MPS_LOG_DIRECTORY = env("FAIRQ_K8S_MPS_LOG_DIRECTORY", default="")
for _name in ("FAIRQ_K8S_MPS_PIPE_DIRECTORY", "FAIRQ_K8S_MPS_LOG_DIRECTORY"):
    _path = globals()[_name]
    if _path and (not re.fullmatch(r"/[A-Za-z0-9._/-]*", _path) or ".." in _path.split("/")):
        raise environ.ImproperlyConfigured(f"{_name} must be an absolute path")
