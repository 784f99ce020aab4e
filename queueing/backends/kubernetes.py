"""The Kubernetes backend: one batch/v1 Job per job attempt (docs/kubernetes.md).

- submit  — `fq-<job id>-<attempt>` in the team's namespace (`<prefix><team>`, made by
            the provisioner, `k8s_provisioner.py`, driven by services/provisioning.py; or
            on first use when provision="scheduler"; else an unprovisioned one raises
            NamespaceNotProvisioned);
            creating a name that exists is adopted (409), an invalid spec (422) fails
            the job (`SubmitRejected`), anything else is retried by the next cycle.
- statuses, nodes — read an in-process cache fed by watches (fairq's Jobs and Pods,
            other pods' GPU requests, Nodes), so the scheduler cycle costs no API call.
            A node with a spot label is spot (`NodeInfo.spot`, rule K4), usable despite
            its spot taints (AKS's; the pods of a spot attempt tolerate them); a spot node
            deleted, or one a termination taint or label appears on, is reclaimed: the
            workloads with pods on it report FAILED `spot_reclaimed` (rule K6, the
            cycle requeues their jobs: services/spot.py) and it offers no GPUs.
- stop    — deletes the Job with `propagationPolicy=Foreground`: the Job stays listed
            (with a deletionTimestamp) until its pods are gone, and `nodes()` counts the
            GPUs of pods being deleted, so freed GPUs show as free only once they are.
            A Job that already finished is not deleted but forgotten, so its pods' logs
            stay readable until `ttlSecondsAfterFinished` removes it.
- logs    — the pods' logs through the API server (the worker archives them for the web);
            a stopped pod's last log is read when its container ends, before the kubelet
            deletes the pod, and answered for it once it is gone (its "last words": what
            the program wrote in its grace, docs/kubernetes.md "Graceful stop").

Only the worker uses this class; web processes read what it publishes (queueing/selectors/cluster.py,
services/logs.py). The watch threads start on first use and kick a scheduler cycle when
a fairq pod or Job changes phase (the `kick` handed in by queueing/composition.py, which
builds this class from settings). What it remembers between reads of the watch cache is
in `k8s_tracker.WorkloadTracker`; namespaces, quotas and PriorityClasses are the
provisioner's (`k8s_provisioner.KubernetesProvisioner`, `self.provisioner`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, cast

from queueing.validation import registry_problem

from .base import (
    WAITING,
    LaunchSpec,
    NodeInfo,
    Phase,
    SubmitRejected,
    SubmitRequeue,
    WorkloadStatus,
    logs_unanswered_note,
    spot_reclaimed_reason,
)
from .k8s_api import (
    SPOT_NODE_LABELS,
    SPOT_TERMINATION_TAINTS,
    SPOT_TOLERATIONS,
    KubernetesBackendError,
    NamespaceNotProvisioned,
    RawPoster,
    api_client_from_config,
    api_error,
    drain,
    jobs_path,
    node_is_spot,
    node_termination_mark,
    parse_node_matches,
    raw_list,
    spot_tolerations_problem,
)
from .k8s_cache import Informer, NamespacedInformers, Obj, key_of
from .k8s_manifest import (
    L_REPLICA,
    L_WORKLOAD,
    MANAGED_BY,
    SELECTOR,
    GpuTypeRef,
    ManifestError,
    ManifestOptions,
    adoption_verdict,
    capacity,
    is_replica_job,
    job_manifests,
    namespace_for,
    orphan_pods_status,
    owner_reference,
    parse_time,
    pod_is_terminal,
    pods_never_created,
    replica_job_name,
    sealed_by_fairq,
    service_manifest,
    sign_job,
    slim_job,
    slim_node,
    slim_pod,
    unbound_demand,
    workload_finished,
    workload_replicas,
    workload_status,
)
from .k8s_provisioner import KubernetesProvisioner
from .k8s_tracker import WorkloadTracker

__all__ = ["KubernetesBackend", "KubernetesBackendError", "NamespaceNotProvisioned",
           "api_client_from_config"]

log = logging.getLogger(__name__)

# Statuses of a refused create (as the cycle classifies them, services/scheduler.py:
# 400/422 fail the job, 403 is a refusal retried until FAIRQ_K8S_SUBMIT_REFUSED_SECONDS).
_REFUSED = frozenset({400, 403, 422})

# How far ahead a status just built is built again to tell whether time alone can
# change it (`KubernetesBackend._keep`): past every deadline a status reads.
_AHEAD = timedelta(days=36500)


class _PodGroups:
    """fairq's pods grouped by workload ("ns/workload" and the workload's name), kept by
    the pod watch's hook (`KubernetesBackend._touched`) instead of regrouped from every
    pod when the cache changed. A group is a dict pod key -> pod in key order (the
    order of a list, and of the plain index), replaced, never changed, once published.
    Guarded by the backend's `_changed_lock`."""

    def __init__(self) -> None:
        self.by_key: dict[str, dict[str, Obj]] = {}
        self.by_name: dict[str, dict[str, Obj]] = {}
        self.version = 0

    def changed(self, old: Obj | None, new: Obj | None) -> None:
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            meta = obj["metadata"]
            workload = (meta.get("labels") or {}).get(L_WORKLOAD)
            if not workload:
                continue
            pod = key_of(obj)
            for groups, key in ((self.by_key, f"{meta.get('namespace')}/{workload}"),
                                (self.by_name, workload)):
                group = dict(groups.get(key, ()))
                if add:
                    new_pod = pod not in group
                    group[pod] = obj
                    if new_pod and len(group) > 1:
                        group = dict(sorted(group.items()))
                else:
                    group.pop(pod, None)
                if group:
                    groups[key] = group
                else:
                    groups.pop(key, None)
        self.version += 1


class _Grouped(Mapping[str, list[Obj]]):
    """A read-only view of `_PodGroups` groups as lists of pods, made per look-up."""

    def __init__(self, groups: dict[str, dict[str, Obj]]) -> None:
        self._groups = groups

    def __getitem__(self, key: str) -> list[Obj]:
        return list(self._groups[key].values())

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, key: object) -> bool:
        return key in self._groups


class _KeptStatus:
    """A workload's status kept between cycles, with the inputs it was built from that
    no watch event of its own marks: its Job (the object: a relist or an event replaces
    it), its replicas' Jobs, the create errors read, and the cycle's `now` (a later one
    only). Its pods' changes drop it (`KubernetesBackend._touched`). Not `stable`: time
    alone changes the status (`KubernetesBackend._keep`), only its pods are kept."""

    __slots__ = ("erred", "errors", "job", "now", "pods", "replicas", "stable", "status")

    def __init__(self, job: Obj, replicas: dict[int, Obj], errors: tuple[tuple[str, str], ...],
                 now: datetime, pods: list[Obj], status: WorkloadStatus, *,
                 stable: bool) -> None:
        self.job, self.replicas, self.errors = job, replicas, errors
        self.erred = any(message for _, message in errors)
        self.now, self.pods, self.status, self.stable = now, pods, status, stable

    def holds(self, job: Obj, replicas: Mapping[int, Obj], create_errors: Mapping[str, str],
              now: datetime) -> bool:
        if job is not self.job or now < self.now or len(replicas) != len(self.replicas):
            return False
        if self.replicas and any(replicas.get(i) is not r for i, r in self.replicas.items()):
            return False
        return not (create_errors or self.erred) or all(
            create_errors.get(k, "") == v for k, v in self.errors)


class _Visits:
    """What `statuses()` made of each Job of the cache at its last visit, so a cycle
    visits again only the Jobs something may have changed (`KubernetesBackend.keep_visits`):
    per Job key ("ns/name") the Job, whether its pods are a Job's (not orphans), the
    status it gave before rule K6 and the tracker's pass (None: none) and its pods; the
    keys visited every cycle
    (`often`: a status time changes, a hidden Job's, one not kept); the Jobs' keys by
    name (what `hidden` names); the replica Jobs' verdicts and the replicas by workload
    (`_replica_jobs`); the create errors, the hidden names and the time of that cycle.

    And what lets a cycle's passes skip what did not move (`KubernetesBackend.keep_passes`):
    the statuses by key (`statuses`) and how many carry each name (`names`: the names
    listed), the statuses recorded since the tracker last learned their starts
    (`learned`), the workloads with replicas' Jobs but no Job of their own in the cache
    (`alone`: `_replicas_left`'s), and the pod groups with no Job's key at the last cycle
    (`orphans`: `_orphan_pods`')."""

    __slots__ = ("alone", "by_key", "by_name", "errors", "hidden", "job_keys", "learned",
                 "names", "now", "often", "orphans", "replicas", "statuses", "verdicts")

    def __init__(self, now: datetime, errors: dict[str, str], hidden: set[str]) -> None:
        self.by_key: dict[str, tuple[Obj, bool, WorkloadStatus | None, Sequence[Obj]]] = {}
        self.by_name: dict[str, set[str]] = defaultdict(set)
        self.often: set[str] = set()
        self.job_keys: set[str] = set()
        self.verdicts: dict[str, tuple[str, str, int]] = {}
        self.replicas: dict[str, dict[int, Obj]] = {}
        self.statuses: dict[str, WorkloadStatus] = {}
        self.names: dict[str, int] = {}
        self.learned: list[WorkloadStatus] = []
        self.alone: set[str] = set()
        self.orphans: set[str] = set()
        self.now, self.errors, self.hidden = now, errors, hidden

    def record(self, key: str, job: Obj, job_key: bool, status: WorkloadStatus | None,
               pods: Sequence[Obj], settled: bool) -> None:
        self.by_key[key] = (job, job_key, status, pods)
        self.by_name[job["metadata"]["name"]].add(key)
        self.alone.discard(key)
        if job_key:
            self.job_keys.add(key)
        if not settled:
            self.often.add(key)
        if status is not None:
            self.statuses[key] = status
            self.names[status.name] = self.names.get(status.name, 0) + 1
            self.learned.append(status)

    def forget(self, key: str) -> Obj | None:
        """Drop what `key`'s last visit made; its Job then."""
        old = self.by_key.pop(key, None)
        self.often.discard(key)
        self.job_keys.discard(key)
        if key in self.replicas:
            self.alone.add(key)
        status = self.statuses.pop(key, None)
        if status is not None:
            left = self.names[status.name] - 1
            if left:
                self.names[status.name] = left
            else:
                del self.names[status.name]
        if old is None:
            return None
        name = old[0]["metadata"]["name"]
        keys = self.by_name.get(name)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_name[name]
        return old[0]

    def set_verdict(self, key: str, job: Obj | None, verdict: tuple[str, str, int] | None
                    ) -> None:
        """Replica Job `key` now `job` with `verdict` (None: not a replica of ours)."""
        old = self.verdicts.pop(key, None)
        if old is not None:
            group = self.replicas.get(old[0], {})
            group.pop(old[2], None)
            if not group:
                self.replicas.pop(old[0], None)
                self.alone.discard(old[0])
        if verdict is not None and job is not None:
            self.verdicts[key] = verdict
            self.replicas.setdefault(verdict[0], {})[verdict[2]] = job
            if verdict[0] not in self.by_key:
                self.alone.add(verdict[0])


class _Listed(Container[str]):
    """The names `statuses()` lists so far: those of the kept visits' statuses (counted
    per name, `_Visits.names`) and those added after them."""

    __slots__ = ("counted", "more")

    def __init__(self, counted: Mapping[str, int]) -> None:
        self.counted = counted
        self.more: set[str] = set()

    def __contains__(self, name: object) -> bool:
        return name in self.counted or name in self.more


class _KeptNodes:
    """`nodes()` between cycles: each node's answer with the inputs it was built from
    (the node object, when its pods last changed, fairq's unbound demand on it), each
    workload's unbound demand ("ns/name" -> node -> GPUs) and their sum per node, and
    what they were all built under (the GPU types, the spot matches)."""

    __slots__ = ("demand", "entries", "total", "under")

    def __init__(self, under: tuple[Any, ...]) -> None:
        self.under = under
        self.entries: dict[str, tuple[Obj, int, int, NodeInfo | None]] = {}
        self.demand: dict[str, dict[str, int]] = {}
        self.total: dict[str, int] = {}

    def set_demand(self, key: str, demand: dict[str, int]) -> None:
        old = self.demand.pop(key, {})
        if demand:
            self.demand[key] = demand
        if old == demand:
            return
        for sign, each in ((-1, old), (1, demand)):
            for node, n in each.items():
                left = self.total.get(node, 0) + sign * n
                if left:
                    self.total[node] = left
                else:
                    self.total.pop(node, None)


class KubernetesBackend:
    """The protocol's methods (base.ClusterBackend) on a Kubernetes cluster, and what
    they need: the watches, the tracker, the provisioner (for submit's "is the
    namespace ready?")."""

    # Capabilities, read without building one (composition.backend_class()): a cluster
    # client elsewhere (web processes never call it), with namespaces and
    # PriorityClasses to provision (services/provisioning.py).
    in_process: ClassVar[bool] = False
    provisions: ClassVar[bool] = True
    # Jobs are POSTed pre-serialised (`RawPoster`); False: through the generated client
    # method, parsing every answer, as before (kept for bench/bench_k8s.py's comparison).
    raw_creates: bool = True
    # Each workload's status kept between cycles and rebuilt only when one of its inputs
    # moved (`_KeptStatus`; docs/performance.md, "The cycle's statuses kept between
    # cycles"); False: every status rebuilt from the watch cache each cycle, the
    # reference (tests/test_k8s_kept_statuses.py holds the two equal).
    keep_statuses: bool = True
    # With `keep_statuses`, `statuses()` visits again only the Jobs a watch event marked
    # since the last cycle, those of a namespace listed again, those whose create errors
    # or hidden state moved and those time changes (`_Visits`), not every Job of the
    # cache; False: every Job visited each cycle (docs/performance.md, "Statuses read
    # only for what changed"). Either answers what the plain rebuild answers.
    keep_visits: bool = True
    # With `keep_visits`, the rest of `statuses()` - the tracker's pass (starts learned,
    # `stopping`), the names listed, the replicas given to the tracker, the workloads
    # whose replica 0's Job is gone, the orphan pods - looks at what moved since the last
    # cycle (`_statuses_kept_passes`), not at every status; False: each passes over every
    # status as before (docs/performance.md, "Statuses: the passes over every status").
    keep_passes: bool = True
    # How many times `statuses()` passed over every status (tests and the bench read it).
    full_passes: int = 0
    # `nodes()` kept between cycles (`_KeptNodes`): a node's NodeInfo is built again only
    # when its object, the pods bound to it or fairq's unbound demand on it moved (the
    # watch hooks keep the pods by node and mark the workloads whose demand may have
    # moved); False: every node rebuilt from the watch cache each cycle, the reference
    # (tests/test_k8s_kept_nodes.py holds the two equal; docs/performance.md, "Nodes
    # kept between cycles, and Job creation again").
    keep_nodes: bool = True
    # How many NodeInfos the kept path built (tests and the bench read it).
    node_builds: int = 0
    # How many Jobs `statuses()` visited (tests and the bench read it).
    job_visits: int = 0

    def __init__(
        self,
        api_client: Any,
        *,
        namespace_prefix: str = "fairq-",
        backoff_limit: int = 0,
        ttl_after_finished_seconds: int | None = 3600,
        image_pull_timeout_seconds: float = 300.0,
        pod_create_timeout_seconds: float | None = 120.0,
        termination_grace_seconds: int = 30,
        registry_allowlist: Sequence[str] = (),
        gpu_types: Sequence[GpuTypeRef] | Callable[[], Sequence[GpuTypeRef]] = (),
        gpu_types_ttl_seconds: float = 30.0,
        team_quota: Callable[[str], Mapping[str, int]] | None = None,
        resync_seconds: float = 300.0,
        watch_seconds: int = 60,
        sync_timeout_seconds: float = 30.0,
        kick: Callable[[], None] | None = None,
        provision: str = "scheduler",
        scheduler_account: tuple[str, str] | None = None,
        provisioner_account: tuple[str, str] | None = None,
        owner_key: bytes = b"",
        submit_concurrency: int = 1,
        orphan_pod_grace_seconds: float = 30.0,
        spot_node_labels: Sequence[str] = SPOT_NODE_LABELS,
        spot_termination_taints: Sequence[str] = SPOT_TERMINATION_TAINTS,
        spot_tolerations: Sequence[str] = SPOT_TOLERATIONS,
        teams: Callable[[], Iterable[str]] | None = None,
        other_pod_namespaces: Sequence[str] = (),
        mps_pipe_directory: str = "",
        mps_log_directory: str = "",
    ) -> None:
        if provision not in ("scheduler", "separate"):
            raise ValueError(f"provision must be 'scheduler' or 'separate', not {provision!r}")
        self.api = api_client
        # "scheduler": this process creates team namespaces and quotas on first use (the
        # old, cluster-wide RBAC). "separate": the provisioner does (sync_cluster), and
        # submit only checks the namespace is provisioned (docs/kubernetes.md, "RBAC").
        self.provision = provision
        self.provisioner = KubernetesProvisioner(
            self._client, namespace_prefix=namespace_prefix,
            scheduler_account=scheduler_account, team_quota=team_quota,
            provisioner_account=provisioner_account)
        # Seals the Jobs fairq creates (k8s_manifest.sign_job); from SECRET_KEY in the
        # composition root. Empty (tests, benches) still seals, with a key anyone knows.
        self.owner_key = owner_key
        # How many creates the cycle may have in flight (scheduler.submit_admitted); the
        # client's connection pool must hold that many on top of the watches.
        self.submit_concurrency = max(1, submit_concurrency)
        self.namespace_prefix = namespace_prefix
        self.backoff_limit = backoff_limit
        self.ttl_after_finished_seconds = ttl_after_finished_seconds
        self.image_pull_timeout_seconds = image_pull_timeout_seconds
        self.pod_create_timeout_seconds = pod_create_timeout_seconds
        self.orphan_pod_grace_seconds = orphan_pod_grace_seconds
        # Rules K4, K6 (FAIRQ_SPOT_NODE_LABELS, FAIRQ_SPOT_TERMINATION_TAINTS,
        # FAIRQ_SPOT_TOLERATIONS).
        self.spot_labels = parse_node_matches(spot_node_labels, what="spot_node_labels")
        self.spot_termination = parse_node_matches(spot_termination_taints,
                                                   what="spot_termination_taints")
        self.spot_tolerations = parse_node_matches(spot_tolerations, what="spot_tolerations")
        self.mps_pipe_directory, self.mps_log_directory = mps_pipe_directory, mps_log_directory
        problem = spot_tolerations_problem(self.spot_tolerations, self.spot_termination)
        if problem:
            raise ValueError(problem)
        self.termination_grace_seconds = termination_grace_seconds
        # Where the worker reads pods, Jobs and events (docs/kubernetes.md, "RBAC"): with
        # `teams`, in the team namespaces only (one watch per namespace, allowed by the
        # RoleBinding there), plus `other_pod_namespaces` for other workloads' GPUs;
        # without (tests, tools with an admin's credentials), cluster-wide.
        self._teams = teams
        self.other_pod_namespaces = tuple(other_pod_namespaces)
        self._namespaces_cache: tuple[float, tuple[str, ...]] | None = None
        self.registry_allowlist = tuple(registry_allowlist)
        self._gpu_types_source = gpu_types
        self._gpu_types_ttl = gpu_types_ttl_seconds
        self._gpu_types_cache: tuple[float, Sequence[GpuTypeRef]] | None = None
        self.sync_timeout_seconds = sync_timeout_seconds
        # Throttled by the caller (composition.kick); called from the watch threads.
        self._kick = kick
        self._lock = threading.Lock()  # the fork check and start
        self.tracker = WorkloadTracker()
        self._version: tuple[int, int] | None = None
        # Rule K5: when the API server last answered the live probe (monotonic; None =
        # not yet, or its last probe failed).
        self._probe_ok_at: float | None = None
        self._last_housekeeping = 0.0
        self._started = False
        # Graceful stop: each stopped pod's last log, read when its container ended (pod
        # informer thread -> a small pool), answered by `logs()` once the pod is gone;
        # workload -> pod -> text, the newest LAST_WORDS_KEPT workloads.
        self._last_words: OrderedDict[str, dict[str, tuple[int, str]]] = OrderedDict()
        self._last_words_lock = threading.Lock()
        self._last_words_pool: ThreadPoolExecutor | None = None
        self._resync_seconds = resync_seconds
        self._watch_seconds = watch_seconds
        self._pid = os.getpid()
        self._wire()

    def _wire(self) -> None:
        """API objects and informers for this process (again after a fork: threads do not
        survive one, and the parent's connections must not be shared)."""
        from kubernetes import client

        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.poster = RawPoster(self.api)
        resync_seconds, watch_seconds = self._resync_seconds, self._watch_seconds
        timing: dict[str, Any] = {"resync_seconds": resync_seconds,
                                  "watch_seconds": watch_seconds}

        def watch(name: str, everywhere: Callable[..., Any], namespaced: Callable[..., Any],
                  namespaces: Callable[[], Iterable[str]], **kw: Any
                  ) -> Informer | NamespacedInformers:
            if self._teams is None:
                return Informer(name, everywhere, **timing, **kw)
            return NamespacedInformers(name, namespaced, namespaces, **timing, **kw)

        self.jobs = watch("jobs", self.batch.list_job_for_all_namespaces,
                          self.batch.list_namespaced_job, self.team_namespaces,
                          label_selector=SELECTOR, on_change=self._job_changed,
                          transform=slim_job)
        self.pods = watch("pods", self.core.list_pod_for_all_namespaces,
                          self.core.list_namespaced_pod, self.team_namespaces,
                          label_selector=SELECTOR, on_change=self._pod_changed,
                          transform=slim_pod)
        # Everyone else's GPUs: non-terminal pods bound to a node, not fairq's (in the
        # team namespaces and `other_pod_namespaces`, unless cluster-wide).
        self.other_pods = watch(
            "other-pods", self.core.list_pod_for_all_namespaces,
            self.core.list_namespaced_pod,
            lambda: (*self.team_namespaces(), *self.other_pod_namespaces),
            label_selector=f"{MANAGED_BY}!=fairq",
            field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
            on_change=self._other_pod_changed, transform=slim_pod)
        self.nodes_informer = Informer("nodes", self.core.list_node, **timing,
                                       on_change=self._node_changed, transform=slim_node)
        self._informers = (self.jobs, self.pods, self.other_pods, self.nodes_informer)
        self._pod_index_memo: tuple[Any, dict[str, list[Obj]], dict[str, list[Obj]]] | None = None
        # The kept statuses ("ns/workload" -> `_KeptStatus`), the workloads a watch
        # event touched since the cycle last read them (under `_changed_lock`: the watch
        # threads add, the cycle takes), and what the kept ones were built under (the
        # timeouts, each informer's relist count).
        self._kept: dict[str, _KeptStatus] = {}
        self._visits: _Visits | None = None
        self._groups = _PodGroups()
        self._replica_memo: dict[int, tuple[Obj, tuple[str, str, int] | None]] = {}
        self._groups_memo: tuple[int, Mapping[str, list[Obj]], Mapping[str, list[Obj]]] | \
            None = None
        self._changed: set[str] = set()
        self._changed_lock = threading.Lock()
        self._kept_under: tuple[Any, ...] = ()
        self._relists_seen: dict[tuple[str, str], int] = {}
        # What `nodes()` keeps (under `_changed_lock`, kept by the pod hooks): the
        # non-terminal pods bound to each node (node -> {(informer, pod key): pod}), when
        # each node's pods last changed (a count no change repeats), and the workloads
        # ("ns/name") whose unbound demand an event may have moved since the last kept
        # cycle.
        self._on_node: dict[str, dict[tuple[str, str], Obj]] = {}
        self._node_touched: dict[str, int] = {}
        self._touches = 0
        self._demand_marks: set[str] = set()
        self._nodes_kept: _KeptNodes | None = None
        # The Job controller's FailedCreate events (why a Job has no pods), watched so
        # the cycle never asks per Job. Not waited for: without it (not synced, or not
        # allowed to list events) a Job without pods only shows as waiting, never fails.
        self.events = watch(
            "events", self.core.list_event_for_all_namespaces,
            self.core.list_namespaced_event, self.team_namespaces,
            field_selector="involvedObject.kind=Job,reason=FailedCreate")

    # How long the team list behind `team_namespaces` is believed (a new team's namespace
    # is watched from its first submit on anyway: `_watch_namespace`).
    namespaces_ttl_seconds: float = 30.0

    def team_namespaces(self) -> tuple[str, ...]:
        """fairq's team namespaces (`<prefix><team>` for each team `teams()` names; a slug
        that makes no valid namespace is skipped); () without `teams`."""
        if self._teams is None:
            return ()
        cached = self._namespaces_cache
        if cached is not None and time.monotonic() - cached[0] < self.namespaces_ttl_seconds:
            return cached[1]
        out: list[str] = []
        for team in self._teams():
            try:
                out.append(namespace_for(team, self.namespace_prefix))
            except ManifestError:
                continue
        self._namespaces_cache = (time.monotonic(), tuple(out))
        return self._namespaces_cache[1]

    def _watched_namespaces(self) -> tuple[str, ...]:
        """The namespaces whose fairq Jobs the watches see (None: all of them)."""
        jobs = self.jobs
        return tuple(jobs.namespaces()) if isinstance(jobs, NamespacedInformers) else ()

    def _watch_namespace(self, namespace: str) -> None:
        """Make sure the watches cover `namespace` (about to get a Job), and list it again
        now if it was refused so far (provisioned since)."""
        for group in (self.jobs, self.pods, self.other_pods, self.events):
            if isinstance(group, NamespacedInformers):
                informer = group.add(namespace)
                if informer.refused:
                    informer.wake()

    def _after_fork(self) -> None:
        """In a forked child (gunicorn --preload, Celery prefork) start over: a new
        connection pool and new informers (the parent's threads did not come along)."""
        if self._pid == os.getpid():
            return
        from kubernetes import client

        with self._lock:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self.api = client.ApiClient(self.api.configuration)
                self._wire()
                self._started = False
                self._last_words_pool = None  # its threads stayed in the parent

    def _client(self) -> Any:
        """The ApiClient of this process (a new one after a fork)."""
        self._after_fork()
        return self.api

    def start(self) -> KubernetesBackend:
        self._after_fork()
        with self._lock:
            if self._started:
                return self
            self._started = True
        for informer in (*self._informers, self.events):
            informer.start()
        return self

    def wait_synced(self, timeout: float | None = None) -> None:
        """Start the watches and wait for their first list; raises when one does not
        arrive in time (the cycle fails and is retried: an empty cache must never be
        read as "no workloads", or every admitted job would look vanished)."""
        self.start()
        deadline = time.monotonic() + (self.sync_timeout_seconds if timeout is None else timeout)
        for informer in self._informers:
            if not informer.wait_synced(max(0.0, deadline - time.monotonic())):
                raise KubernetesBackendError(
                    f"the {informer.name} watch has not synced with the API server"
                    + (f": {informer.last_error}" if informer.last_error else ""))

    def close(self) -> None:
        if self._last_words_pool is not None:
            self._last_words_pool.shutdown(wait=False, cancel_futures=True)
        for informer in (*self._informers, self.events):
            informer.request_stop()
        for informer in (*self._informers, self.events):
            informer.stop(timeout=5.0)
        try:
            self.api.close()
        except Exception:
            log.debug("closing the API client failed", exc_info=True)

    # --- reachability (rule K5) ---------------------------------------------------------

    # At most one live request per this many seconds; each waits at most the timeout.
    probe_interval_seconds: float = 5.0
    probe_timeout_seconds: float = 5.0

    def check_reachable(self) -> None:
        """Rule K5: the watches answer from memory, so a cluster whose API server stopped
        answering would look the same as a quiet one for minutes (until a watch's read
        times out). One live request (`GET /version`) at most every
        `probe_interval_seconds` tells; when it fails this raises, on every call until a
        probe succeeds, and the cycle counts the cluster unreachable (with one implicit
        cluster, the cycle fails and is retried, as when its watches cannot sync)."""
        at = self._probe_ok_at
        if at is not None and time.monotonic() - at < self.probe_interval_seconds:
            return
        import urllib3

        config = self.api.configuration
        headers = {}
        bearer = config.auth_settings().get("BearerToken") or {}
        if bearer.get("value"):
            headers[str(bearer["key"])] = str(bearer["value"])
        timeout = self.probe_timeout_seconds
        try:
            # The pool's own request, without the client's retries (three by default: a
            # frozen server would take three timeouts to tell). Any answer, even a 403,
            # is an API server that answers.
            self.api.rest_client.pool_manager.request(
                "GET", f"{config.host}/version", headers=headers, retries=False,
                timeout=urllib3.Timeout(connect=timeout, read=timeout))
        except Exception as exc:
            self._probe_ok_at = None
            raise KubernetesBackendError(
                f"the API server does not answer: {type(exc).__name__}: "
                f"{str(exc)[:200]}") from exc
        self._probe_ok_at = time.monotonic()

    # --- server version -----------------------------------------------------------------

    def server_version(self) -> tuple[int, int]:
        if self._version is None:
            from kubernetes import client

            code = client.VersionApi(self.api).get_code()
            self._version = (int(re.sub(r"\D", "", code.major) or 0),
                             int(re.sub(r"\D", "", code.minor) or 0))
        return self._version

    def indexed_jobs_served(self) -> bool:
        """completionMode=Indexed: alpha in 1.21 (off), beta in 1.22 (on), GA in 1.24.
        Older servers drop the field silently, so it is only set where it means something."""
        return self.server_version() >= (1, 22)

    # --- submit -------------------------------------------------------------------------

    def _options(self, namespace: str) -> ManifestOptions:
        return ManifestOptions(
            namespace=namespace, backoff_limit=self.backoff_limit,
            ttl_seconds_after_finished=self.ttl_after_finished_seconds,
            indexed=self.indexed_jobs_served(),
            termination_grace_seconds=self.termination_grace_seconds,
            spot_tolerations=self.spot_tolerations,
            mps_pipe_directory=self.mps_pipe_directory,
            mps_log_directory=self.mps_log_directory,
        )

    def manifest(self, spec: LaunchSpec) -> dict[str, Any]:
        """The Job `submit` would create (replica 0's with replicas > 1; raises
        SubmitRejected when it cannot exist)."""
        return self.manifests(spec)[0]

    def manifests(self, spec: LaunchSpec) -> list[dict[str, Any]]:
        """Every Job `submit` would create, the workload's own first (one per replica
        when replicas > 1; raises SubmitRejected when one cannot exist)."""
        problem = registry_problem(spec.image, self.registry_allowlist)
        if problem:
            raise SubmitRejected(problem)
        try:
            namespace = namespace_for(spec.team, self.namespace_prefix)
            return job_manifests(spec, self._options(namespace))
        except ManifestError as exc:
            raise SubmitRejected(str(exc)) from exc

    def submit(self, spec: LaunchSpec, *, now: datetime) -> None:
        """Create the attempt's Job, or adopt the one that holds its name if fairq created
        it (its owner seal verifies: `k8s_manifest.adoption_verdict`); a Job fairq did not
        create raises SubmitRejected, one being deleted SubmitRequeue. Safe to call from
        several threads at once (the cycle does)."""
        from kubernetes.client.exceptions import ApiException

        self._after_fork()
        bodies = self.manifests(spec)
        body = sign_job(bodies[0], self.owner_key)
        namespace = body["metadata"]["namespace"]
        cached = self.jobs.get(f"{namespace}/{spec.name}") if self._started else None
        if cached is not None and self.tracker.abandoned(str(cached["metadata"].get("uid"))):
            cached = None  # deleted by fairq a moment ago (a replica refused): the cache lags
        if cached is not None:
            self._adopt(cached, body)  # already there: the name is the identity
            self._companions(spec, bodies, cached)
            return
        if self.provision == "scheduler":
            self.provisioner.ensure_namespace(spec.team, run_as_non_root=spec.run_as_non_root)
        elif not self.provisioner.namespace_ready(namespace):
            # A refusal like any other (SubmitRefused): bounded by the service, whether
            # the namespace was never ready or stopped being ready (its RoleBinding
            # removed, seen first by a process that never knew it ready).
            status = self.provisioner.refusal_status(namespace)
            raise NamespaceNotProvisioned(
                f"namespace {namespace} is not provisioned for fairq "
                + ("(no RoleBinding lets fairq-scheduler in; " if status == 403 else
                   "(it does not exist; ")
                + "the provisioner runs `manage.py sync_cluster`)", status=status)
        self._watch_namespace(namespace)
        try:
            created = self._create_job(namespace, body, answer=len(bodies) > 1)
        except ApiException as exc:
            status, message = api_error(exc)
            message = _redacted(message, spec)
            if status == 409:
                existing = self._read_job(namespace, spec.name)
                if existing is None:  # deleted since: the next cycle creates it
                    raise KubernetesBackendError(
                        f"{spec.name} existed a moment ago and is gone now; retrying") from exc
                self._adopt(existing, body)
                self._companions(spec, bodies, existing)
                return
            if status in (400, 422):
                raise SubmitRejected(f"Kubernetes refused the Job: {message}") from exc
            if status == 403:
                # An RBAC denial (the scheduler's RoleBinding removed) or a full quota on
                # Jobs: whether the namespace is still provisioned is asked again before
                # the team's next admission (`unprovisioned_teams`), so its queued jobs
                # wait outside the plan instead of being admitted into a refusal.
                self.provisioner.namespace_gone(namespace, refused=False)
            if status == 404:
                self.provisioner.namespace_gone(namespace, refused=self.provision == "separate")
                if self.provision == "separate":
                    raise NamespaceNotProvisioned(
                        f"namespace {namespace} does not exist (the provisioner runs "
                        "`manage.py sync_cluster`)", status=404) from exc
            raise KubernetesBackendError(
                f"creating {spec.name} failed ({status}): {message}") from exc
        except (TypeError, ValueError) as exc:  # not JSON: our body is malformed
            raise SubmitRejected(f"invalid Job: {_redacted(str(exc), spec)}") from exc
        self.tracker.placed(spec.name, namespace)
        self._companions(spec, bodies, created)

    def _companions(self, spec: LaunchSpec, bodies: Sequence[Mapping[str, Any]],
                    owner: Mapping[str, Any]) -> None:
        """With replicas > 1, what the workload's Job (`owner`, as the API server has it)
        needs beside it: the headless Service, then the Jobs of replicas 1..n-1, each
        owned by `owner` (garbage collected with it). Made after it, so a crash in
        between leaves a Job the retry adopts and completes here; one that exists is
        kept when fairq made it (a Service owned by `owner`, a sealed Job), else the
        attempt fails as for the workload's Job. A transient error raises
        KubernetesBackendError: the next cycle's submit adopts and comes back here."""
        from kubernetes.client.exceptions import ApiException

        if len(bodies) < 2:
            return
        namespace = owner["metadata"]["namespace"]
        ref = owner_reference(owner)
        service = service_manifest(spec, namespace, owner=owner)
        try:
            drain(self.core.create_namespaced_service(
                namespace, cast(Any, service), _preload_content=False, _request_timeout=30))
        except ApiException as exc:
            status, message = api_error(exc)
            if status != 409:
                self._abandon_if_refused(spec.name, owner, len(bodies), status)
                self._companion_failed(spec.name, "Service", status, message, exc)
            existing = self._read_service(namespace, spec.name)
            if existing is None:  # deleted since: the next cycle's submit makes it
                raise KubernetesBackendError(
                    f"the Service {spec.name} existed a moment ago and is gone now; "
                    "retrying") from exc
            owners = {r.get("uid") for r in existing.get("metadata", {})
                      .get("ownerReferences") or ()}
            # Owned by the workload's Job (its uid is no secret: anyone who lists Jobs
            # reads it), so what it routes to is checked too: this workload's pods only.
            shape = existing.get("spec") or {}
            if ref["uid"] not in owners or shape.get("clusterIP") != "None" or \
                    shape.get("selector") != service["spec"]["selector"]:
                raise SubmitRejected(
                    f"a Service named {namespace}/{spec.name} already exists and fairq did "
                    "not create it (not owned by the workload's Job, or not its headless "
                    "Service); not adopted") from exc
        for raw in bodies[1:]:
            body = sign_job({**raw, "metadata": {**raw["metadata"], "ownerReferences": [ref]}},
                            self.owner_key)
            name = body["metadata"]["name"]
            try:
                self._create_job(namespace, body)
            except ApiException as exc:
                status, message = api_error(exc)
                message = _redacted(message, spec)
                if status != 409:
                    self._abandon_if_refused(spec.name, owner, len(bodies), status)
                    self._companion_failed(name, "Job", status, message, exc)
                existing = self._read_job(namespace, name)
                if existing is None:  # deleted since: the next cycle's submit makes it
                    raise KubernetesBackendError(
                        f"{name} existed a moment ago and is gone now; retrying") from exc
                self._adopt(existing, body, workload=spec.name)

    def _abandon_if_refused(self, name: str, owner: Mapping[str, Any], replicas: int,
                            status: int) -> None:
        """All or nothing at submit: when the API server refuses one of a multi-replica
        workload's other objects (400/422: invalid; 403: a quota on Jobs or Services, an
        RBAC denial), delete what this attempt has in the cluster (the Service, replica
        Jobs, the workload's Job: in the background, so the names are free at once) before
        the error goes to the cycle, which handles it as for replica 0's Job: the job
        fails (400/422) or stays ADMITTED, "waiting for the cluster: Kubernetes refused the
        Job (403): ...", retried each cycle until FAIRQ_K8S_SUBMIT_REFUSED_SECONDS. Other
        errors (5xx, timeouts) keep what exists: the retry adopts it and completes it."""
        if status not in _REFUSED:
            return
        namespace = owner["metadata"]["namespace"]
        uid = str(owner["metadata"].get("uid"))
        log.warning("%s: a replica's object was refused (%s); deleting the %d-replica "
                    "workload's objects (all or nothing)", name, status, replicas)
        self.tracker.abandon(uid, at=time.monotonic())
        self.tracker.stop_asked(name)  # its deletion is fairq's: no tombstone
        try:
            self._delete_service(name, namespace)
            self._delete_companions(name, namespace, replicas, propagation="Background")
            # The policy in the body: with a body the API server ignores query parameters
            # (and a Job's default is to orphan its pods, keeping it listed meanwhile).
            drain(self.batch.delete_namespaced_job(
                name, namespace, _preload_content=False,
                body=cast(Any, {"propagationPolicy": "Background",
                                "preconditions": {"uid": uid}})))
        except Exception as exc:
            # Left for the cycle: the workload reports a replica missing and fails.
            if getattr(exc, "status", None) not in (404, 409):
                log.warning("%s: deleting the refused workload failed: %s", name, exc)

    @staticmethod
    def _companion_failed(name: str, kind: str, status: int, message: str,
                          exc: Exception) -> None:
        if status in (400, 422):
            raise SubmitRejected(f"Kubernetes refused the {kind} {name}: {message}") from exc
        raise KubernetesBackendError(
            f"creating the {kind} {name} failed ({status}): {message}") from exc

    def _read_service(self, namespace: str, name: str) -> Obj | None:
        from kubernetes.client.exceptions import ApiException

        try:
            resp: Any = self.core.read_namespaced_service(
                name, namespace, _preload_content=False, _request_timeout=30)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        try:
            return cast(Obj, json.loads(resp.data))
        finally:
            resp.release_conn()

    def _adopt(self, existing: Mapping[str, Any], body: Mapping[str, Any], *,
               workload: str | None = None) -> None:
        """Take over a Job holding the name of `body`, or raise why not (finding 11.4).
        `workload`: the workload whose replica Job this is (not tracked on its own)."""
        name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
        verdict, why = adoption_verdict(existing, body, key=self.owner_key)
        if verdict == "refuse":
            log.warning("%s: %s", name, why)
            raise SubmitRejected(why)
        if verdict == "requeue":
            log.info("%s: %s; requeued as a new attempt", name, why)
            raise SubmitRequeue(why)
        log.info("%s already exists: adopted%s", name, f" ({why})" if why else "")
        if workload is None:
            self.tracker.placed(name, namespace)

    def _read_job(self, namespace: str, name: str) -> Obj | None:
        """The Job as the API server has it now (JSON), None when there is none. A list
        by name, not a get: fairq's RBAC grants jobs list and watch, not get."""
        items = raw_list(self.batch.list_namespaced_job, namespace=namespace,
                          field_selector=f"metadata.name={name}")
        return items[0] if items else None

    def _create_job(self, namespace: str, body: Mapping[str, Any], *,
                    answer: bool = True) -> Obj:
        """POST the Job (serialised here, sent through `RawPoster`: the generated
        client's own work per call was as much CPU as the rest of a create): the Job as
        created, as JSON (its uid owns a multi-replica workload's other objects), or
        only its name and namespace when `answer` is false (a single replica's: nothing
        reads the answer, and parsing it is most of a create's remaining CPU). A
        refusal raises the client's ApiException."""
        if not self.raw_creates:  # as before: the generated method (bench/bench_k8s.py)
            resp: Any = self.batch.create_namespaced_job(
                namespace, cast(Any, body), _preload_content=False, _request_timeout=30)
            try:
                return cast(Obj, json.loads(resp.data))
            finally:
                resp.release_conn()
        resp = self.poster.post(jobs_path(namespace),
                                json.dumps(body, separators=(",", ":")).encode())
        try:
            if not answer:
                resp.read()
                return {"metadata": {"name": body["metadata"]["name"],
                                     "namespace": namespace}}
            return cast(Obj, json.loads(resp.read()))
        finally:
            resp.release_conn()

    def unprovisioned_teams(self, teams: Iterable[str]) -> set[str]:
        """The teams whose jobs cannot be submitted because their namespace is not
        provisioned (FAIRQ_K8S_PROVISION=separate only: otherwise submit provisions).
        An API server that does not answer counts as "provisioned": the submit then
        fails and is retried, as any other transient error."""
        if self.provision == "scheduler":
            return set()
        return self.provisioner.unprovisioned_teams(teams)

    # --- stop ---------------------------------------------------------------------------

    def _namespace_of(self, name: str) -> str | None:
        ns = self.tracker.namespace_of(name)
        if ns is not None:
            return ns
        for job in self.jobs.items():
            if job["metadata"]["name"] == name and self._fairqs(job):
                return str(job["metadata"]["namespace"])
        return None

    def stop(self, name: str, *, now: datetime) -> None:
        """Delete the Job (Foreground: its pods first). A finished Job is only forgotten
        (its pods' logs stay readable until its TTL); unknown names are a no-op. A
        multi-replica workload's headless Service is deleted first, in every case: gone
        when this returns."""

        self.start()
        self.tracker.stop_requested(name)
        self._delete_orphan_pods(name)
        namespace = self._namespace_of(name) or self._find_namespace(name)
        if namespace is None:
            return
        job = self.jobs.get(f"{namespace}/{name}")
        replicas = None if job is None else workload_replicas(job)
        if replicas is None or replicas > 1:
            # First, whatever becomes of the Jobs (finished and kept for their logs,
            # already being deleted): left to the garbage collector, the Service would be
            # deleted as a dependent of a Job in foreground deletion, and wait, listed,
            # for its own dependent (the EndpointSlice).
            self._delete_service(name, namespace)
        if job is not None:
            if job["metadata"].get("deletionTimestamp"):
                return  # already going
            # Finished by its condition, or all its pods ended before the Job controller
            # wrote it: nothing holds GPUs, and deleting would lose the logs.
            finished = workload_finished(
                job, self._pods_by_workload().get(f"{namespace}/{name}", []))
            if finished is not None and not self._expired(finished, now):
                self.tracker.hide(name, finished)
                return
        self.tracker.stop_asked(name)
        try:
            drain(self.batch.delete_namespaced_job(name, namespace,
                                                    propagation_policy="Foreground",
                                                    _preload_content=False))
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                # Not asked after all: statuses() must not report it as stopping, or
                # the cycle would never ask again.
                self.tracker.stop_failed(name)
                raise
        if replicas is None or replicas > 1:
            self._delete_companions(name, namespace, replicas or 1)

    def _delete_service(self, name: str, namespace: str) -> None:
        """Delete the headless Service of workload `name`, in the background (it is gone
        when this returns; the garbage collector removes its EndpointSlice after), when it
        is fairq's: labelled, and owned by a Job of the workload's name (a Service someone
        else made under that name is not fairq's to delete). None is fine."""
        from kubernetes.client.exceptions import ApiException

        service = self._read_service(namespace, name)
        if service is None or not _owned_by_workload(service, name):
            return
        try:
            drain(self.core.delete_namespaced_service(
                name, namespace, _preload_content=False,
                body=cast(Any, {"propagationPolicy": "Background",
                                "preconditions": {"uid": service["metadata"].get("uid")}})))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _delete_companions(self, name: str, namespace: str, replicas: int, *,
                           propagation: str = "Foreground") -> None:
        """Delete the other replicas' Jobs (Foreground: their pods first) of workload
        `name`, explicitly: the garbage collector would (they are owned by its Job), but
        only where kube-controller-manager runs it, and later. The replicas' Jobs are
        those the watch cache knows plus the ones the workload's `replicas` name; gone
        already (404) is fine. (Its Service is `_delete_service`'s, called first.)"""
        from kubernetes.client.exceptions import ApiException

        names = {replica_job_name(name, i) for i in range(1, replicas)}
        names.update(j["metadata"]["name"] for j in self.jobs.items()
                     if j["metadata"].get("namespace") == namespace and is_replica_job(j)
                     and (j["metadata"].get("labels") or {}).get(L_WORKLOAD) == name
                     and self._fairqs(j))
        for job_name in sorted(names):
            try:
                drain(self.batch.delete_namespaced_job(job_name, namespace,
                                                        propagation_policy=propagation,
                                                        _preload_content=False))
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def _delete_orphan_pods(self, name: str) -> None:
        """Delete the pods of workload `name` that no Job owns any more (a Job deleted
        with orphan propagation): nothing else would ever stop them."""
        from kubernetes.client.exceptions import ApiException

        for pod in self._pod_index()[1].get(name, ()):
            meta = pod["metadata"]
            if not self._ours(meta) or meta.get("deletionTimestamp") or _owned_by_job(pod) \
                    or self.jobs.get(f"{meta['namespace']}/{name}") is not None:
                continue
            try:
                drain(self.core.delete_namespaced_pod(
                    meta["name"], meta["namespace"], _preload_content=False,
                    body=cast(Any, {"preconditions": {"uid": meta.get("uid")}})))
                log.info("deleted pod %s/%s: its Job is gone", meta["namespace"], meta["name"])
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise

    def _find_namespace(self, name: str) -> str | None:
        """A Job created moments ago, or before this process started, may not be in the
        cache yet: ask the API server."""
        items = self._list_everywhere(self.batch, "job",
                                      label_selector=f"{L_WORKLOAD}={name}")
        mine = [i for i in items if self._fairqs(i)]
        return str(mine[0]["metadata"]["namespace"]) if mine else None

    def _list_everywhere(self, api: Any, kind: str, **kwargs: Any) -> list[Obj]:
        """A list of `kind` ("job", "pod") across the namespaces the watches cover: one
        namespaced list each (a namespace that refuses, 403, has nothing of fairq's), or
        one cluster-wide list when the watches are cluster-wide."""
        from kubernetes.client.exceptions import ApiException

        if self._teams is None:
            return raw_list(getattr(api, f"list_{kind}_for_all_namespaces"), **kwargs)
        out: list[Obj] = []
        for namespace in self._watched_namespaces():
            try:
                out.extend(raw_list(getattr(api, f"list_namespaced_{kind}"),
                                    namespace=namespace, **kwargs))
            except ApiException as exc:
                if exc.status not in (403, 404):
                    raise
        return out

    def _ours(self, meta: Mapping[str, Any]) -> bool:
        """In one of this fairq's team namespaces (the prefix tells fairq instances apart)."""
        return str(meta.get("namespace", "")).startswith(self.namespace_prefix)

    def _fairqs(self, job: Mapping[str, Any]) -> bool:
        """A Job this fairq created: in its namespaces, with an owner seal that verifies.
        A Job someone else made under a fairq name and labels (finding 11.4) is not a
        workload: never reported, charged, adopted or stopped."""
        return self._ours(job.get("metadata") or {}) and sealed_by_fairq(job, self.owner_key)

    def _expired(self, finished: datetime, now: datetime) -> bool:
        if self.ttl_after_finished_seconds is None:
            return True
        return now - finished > timedelta(seconds=self.ttl_after_finished_seconds + 120)

    # --- statuses -----------------------------------------------------------------------

    def _pods_by_workload(self) -> Mapping[str, list[Obj]]:
        """fairq's pods by "namespace/workload" (read only: shared until the pod cache
        changes)."""
        return self._pod_index()[0]

    def _pod_index(self) -> tuple[Mapping[str, list[Obj]], Mapping[str, list[Obj]]]:
        """fairq's pods by "namespace/workload" and by workload name. With
        `keep_statuses`, as the pod hook keeps them (`_PodGroups`: a cycle regrouped
        150,000 pods); else built once per version of the pod cache: a cycle's statuses,
        its stops and the log reads of a thousand workloads each looked up their pods by
        a scan of every pod (a profile at load 25 found it in every stop). Read only."""
        if self.keep_statuses:
            with self._changed_lock:
                return self._grouped()
        version = self.pods.version
        memo = self._pod_index_memo
        if memo is not None and memo[0] == version:
            return memo[1], memo[2]
        by_key: dict[str, list[Obj]] = defaultdict(list)
        by_name: dict[str, list[Obj]] = defaultdict(list)
        for pod in self.pods.items():
            workload = (pod["metadata"].get("labels") or {}).get(L_WORKLOAD)
            if workload:
                by_key[f"{pod['metadata'].get('namespace')}/{workload}"].append(pod)
                by_name[workload].append(pod)
        # Each group in key order, whatever order the store holds them in (a relist's
        # order, then the watch's): what reads the first of a kind reads the same one.
        for group in (*by_key.values(), *by_name.values()):
            if len(group) > 1:
                group.sort(key=key_of)
        self._pod_index_memo = (version, dict(by_key), dict(by_name))
        return self._pod_index_memo[1], self._pod_index_memo[2]

    def _grouped(self) -> tuple[Mapping[str, list[Obj]], Mapping[str, list[Obj]]]:
        """The hook's groups now (under `_changed_lock`), copied once per change."""
        memo = self._groups_memo
        if memo is None or memo[0] != self._groups.version:
            memo = self._groups_memo = (self._groups.version,
                                        _Grouped(dict(self._groups.by_key)),
                                        _Grouped(dict(self._groups.by_name)))
        return memo[1], memo[2]

    def statuses(self, *, now: datetime) -> list[WorkloadStatus]:
        self.wait_synced()
        self.check_reachable()
        kept, pods, marks = self._kept_statuses()
        housekeeping: list[tuple[str, str]] = []
        hidden = self.tracker.hidden()
        create_errors = self._create_errors()
        # Rule K6, read once (the common case, nothing reclaimed, costs two dict copies).
        reclaimed_nodes = self.tracker.reclaimed_nodes()
        reclaimed = self.tracker.reclaimed_workloads()
        reclaiming = bool(reclaimed_nodes or reclaimed)
        visits = self._visits if kept is not None and self.keep_visits else None
        if visits is not None and (marks is None or now < visits.now):
            visits = None  # what every Job gave is not known to hold: visit them all
        if visits is None:
            self.full_passes += 1
            fresh: dict[str, _KeptStatus] = {}
            replica_jobs = self._replica_jobs()
            job_keys: set[str] = set()
            out: list[WorkloadStatus] = []
            record = _Visits(now, create_errors, set(hidden)) \
                if kept is not None and self.keep_visits else None
            for job in self.jobs.items():
                meta = job["metadata"]
                key = f"{meta.get('namespace')}/{meta['name']}"
                entry = kept.get(key) if kept is not None else None
                job_key, status, job_pods, entry, settled = self._visit(
                    job, key, entry, kept is not None, pods, hidden, create_errors,
                    replica_jobs, housekeeping, now=now)
                if entry is not None:
                    fresh[key] = entry
                if job_key:
                    job_keys.add(key)
                if record is not None:
                    record.record(key, job, job_key, status, job_pods, settled)
                if status is not None:
                    if reclaiming:
                        status = self._spot_reclaimed(status, job_pods, reclaimed_nodes)
                    out.append(status)
            if record is not None:
                record.verdicts = {f"{j['metadata']['namespace']}/{j['metadata']['name']}": v
                                   for j, v in self._replica_memo.values() if v is not None}
                record.replicas = {k: dict(v) for k, v in replica_jobs.items()}
                record.alone = {k for k in replica_jobs if k not in record.by_key}
                record.orphans = {k for k in pods if k not in job_keys}
                record.learned = []  # `seen_all` below learns every start
            self._visits = record
        else:
            fresh = kept if kept is not None else {}
            dirty: set[str] = set()
            replica_jobs = self._visit_marked(
                visits, fresh, marks or set(), pods, hidden, create_errors, housekeeping,
                now=now, dirty=dirty)
            job_keys = visits.job_keys
            if self.keep_passes:
                if kept is not None:
                    self._kept = fresh
                return self._statuses_kept_passes(
                    visits, dirty, pods, reclaimed_nodes if reclaiming else None,
                    housekeeping, now=now)
            self.full_passes += 1
            if reclaiming:
                out = [self._spot_reclaimed(s, p, reclaimed_nodes)
                       for _, _, s, p in visits.by_key.values() if s is not None]
            else:
                out = [s for _, _, s, _ in visits.by_key.values() if s is not None]
            visits.learned = []
            visits.orphans = {k for k in pods if k not in job_keys}
        out = self.tracker.seen_all(out)  # stopping when asked; the watch lags
        if kept is not None:
            self._kept = fresh
        listed = {s.name for s in out}
        out.extend(self._replicas_left(replica_jobs, pods, listed, now=now))
        listed = {s.name for s in out}
        tombs = self.tracker.tombstones(at=time.monotonic(), listed=listed)
        out.extend(tombs)
        listed.update(t.name for t in tombs)
        out.extend(self._orphan_pods(pods, job_keys, listed, now=now))
        self._housekeep(housekeeping)
        return out

    def _statuses_kept_passes(self, visits: _Visits, dirty: set[str],
                              pods: Mapping[str, list[Obj]],
                              reclaimed_nodes: Mapping[str, tuple[str, datetime]] | None,
                              housekeeping: list[tuple[str, str]], *, now: datetime
                              ) -> list[WorkloadStatus]:
        """The end of `statuses()` after `_visit_marked` (`keep_passes`), each step over
        what may have moved instead of every status: the tracker learns the starts of
        the statuses recorded since it last did and marks `stopping` the statuses of the
        names it is stopping (`WorkloadTracker.seen_all`'s two halves); the names listed
        are counted as visits record them (`_Listed`); the workloads whose replica 0's
        Job is gone are looked for among those with replicas' Jobs and no Job of their
        own (`_Visits.alone`), the orphan pods among the groups without a Job at the last
        cycle and those whose keys moved (`_Visits.orphans`, `dirty`); rule K6, while a
        spot node is reclaimed (`reclaimed_nodes`), is asked of the workloads with a pod
        on one (`_on_node`) or reclaimed before."""
        tracker = self.tracker
        tracker.started(visits.learned)
        visits.learned = []
        statuses = final = visits.statuses
        if reclaimed_nodes is not None:
            # Rule K6 changes only the statuses of the workloads with a pod (not
            # finished) bound to a reclaimed node now - the pods the hooks keep by node -
            # or reclaimed before; the others it leaves as they are.
            with self._changed_lock:
                hit = {f"{meta.get('namespace')}/{(meta.get('labels') or {}).get(L_WORKLOAD)}"
                       for node in reclaimed_nodes
                       for (tag, _), pod in self._on_node.get(node, {}).items()
                       if tag == "fairq" and (meta := pod["metadata"])}
            for name in tracker.reclaimed_workloads():
                hit |= visits.by_name.get(name, set())
            final = dict(statuses)
            for key in hit:
                status = statuses.get(key)
                if status is not None:
                    final[key] = self._spot_reclaimed(status, visits.by_key[key][3],
                                                      reclaimed_nodes)
        stopped: dict[str, WorkloadStatus] = {}
        for name in tracker.stopping():  # stopping when asked; the watch lags
            for key in visits.by_name.get(name, ()):
                status = final.get(key)
                if status is not None and not status.stopping:
                    stopped[key] = replace(status, stopping=True)
        if stopped:
            final = {**final, **stopped}
        out = list(final.values())
        listed = _Listed(visits.names)
        alone = {k: visits.replicas[k] for k in visits.alone}
        left = self._replicas_left(alone, pods, listed, now=now)
        listed.more.update(s.name for s in left)
        out.extend(left)
        tombs = tracker.tombstones(at=time.monotonic(), listed=listed)
        listed.more.update(t.name for t in tombs)
        out.extend(tombs)
        job_keys = visits.job_keys
        visits.orphans = {k for k in visits.orphans | dirty
                          if k in pods and k not in job_keys}
        out.extend(self._orphan_pods(pods, job_keys, listed, now=now, keys=visits.orphans))
        self._housekeep(housekeeping)
        return out

    def _housekeep(self, housekeeping: list[tuple[str, str]]) -> None:
        if housekeeping and time.monotonic() - self._last_housekeeping > 60:
            self._last_housekeeping = time.monotonic()
            for name, namespace in housekeeping:
                # Finished, forgotten by fairq and past its TTL: the TTL controller is
                # off (1.20 without the TTLAfterFinished gate), so clean up ourselves.
                self._delete_quietly(name, namespace)

    def _visit_marked(self, visits: _Visits, kept: dict[str, _KeptStatus], marks: set[str],
                      pods: Mapping[str, list[Obj]], hidden: Mapping[str, datetime],
                      create_errors: dict[str, str],
                      housekeeping: list[tuple[str, str]], *, now: datetime,
                      dirty: set[str] | None = None) -> dict[str, dict[int, Obj]]:
        """`statuses()` visiting only the Jobs whose answer may have moved since the last
        visit (`visits`, updated): those marked (a watch event on the Job or its
        workload, a namespace listed again), those whose create error moved (and their
        workload's), those hidden now or then, and those time changes (`often`). The
        others give what they gave. Returns the replica Jobs by workload; the keys
        visited are added to `dirty`."""
        dirty = set() if dirty is None else dirty
        dirty |= marks
        dirty |= visits.often
        names = set(hidden)
        for name in names ^ visits.hidden:
            dirty |= visits.by_name.get(name, set())
        if create_errors != visits.errors:
            for key in create_errors.keys() | visits.errors.keys():
                if create_errors.get(key) == visits.errors.get(key):
                    continue
                dirty.add(key)
                for job in (self.jobs.get(key), (visits.by_key.get(key) or (None,))[0]):
                    workload = ((job or {}).get("metadata", {}).get("labels") or {}) \
                        .get(L_WORKLOAD)
                    if workload:
                        dirty.add(f"{key.split('/', 1)[0]}/{workload}")
        jobs = {key: self.jobs.get(key) for key in dirty}
        # The replica Jobs first: a workload's visit reads its replicas'.
        memo = self._replica_memo
        given: list[tuple[str, int]] = []
        for key, job in jobs.items():
            old = visits.by_key.get(key)
            if old is not None and old[0] is job:
                continue
            if old is not None:
                memo.pop(id(old[0]), None)
            verdict = None
            if job is not None:
                verdict = self._replica_verdict(job)
                memo[id(job)] = (job, verdict)
                if verdict is not None:
                    given.append((verdict[1], verdict[2]))
            visits.set_verdict(key, job, verdict)
        if self.keep_passes:
            # The tracker forgets a workload's replicas when its Job is deleted (a watch
            # event, which marks the workload's key): given again from those left, as
            # the new ones; the others it still holds.
            for key in dirty:
                group = visits.replicas.get(key)
                if group:
                    workload = key.split("/", 1)[1]
                    given.extend((workload, index) for index in group)
            self.tracker.replicas_seen(given)
        else:
            # Every cycle, as `_replica_jobs`.
            self.tracker.replicas_seen([(v[1], v[2]) for v in visits.verdicts.values()])
        replica_jobs = visits.replicas
        for key, job in jobs.items():
            visits.forget(key)
            entry = kept.pop(key, None)
            if job is None:
                continue
            job_key, status, job_pods, entry, settled = self._visit(
                job, key, entry, True, pods, hidden, create_errors, replica_jobs,
                housekeeping, now=now)
            if entry is not None:
                kept[key] = entry
            visits.record(key, job, job_key, status, job_pods, settled)
        visits.now, visits.errors, visits.hidden = now, create_errors, names
        return replica_jobs

    def _visit(self, job: Obj, key: str, entry: _KeptStatus | None, keeping: bool,
               pods: Mapping[str, list[Obj]], hidden: Mapping[str, datetime],
               create_errors: Mapping[str, str], replica_jobs: Mapping[str, Mapping[int, Obj]],
               housekeeping: list[tuple[str, str]], *, now: datetime
               ) -> tuple[bool, WorkloadStatus | None, Sequence[Obj], _KeptStatus | None, bool]:
        """One Job of the cache in `statuses()`, `entry` what was kept of its workload's
        status (`keeping`: statuses are kept): whether its pods are a Job's (not
        orphans), its workload's status before rule K6 and the tracker's pass (None:
        none to report), its pods, the entry to keep, and whether nothing but a watch event of its own
        can change those (`settled`; else it is visited every cycle)."""
        self.job_visits += 1
        meta = job["metadata"]
        name = meta["name"]
        if entry is not None and entry.job is job:
            pass  # ours, sealed and a workload's Job: seen when kept
        elif keeping and (known := self._replica_memo.get(id(job))) and \
                known[0] is job and known[1] is not None:
            return True, None, (), None, True  # a replica's Job of ours (`_replica_jobs`)
        else:
            entry = None
            if not self._ours(meta):
                return False, None, (), None, True  # another fairq's (a staging instance)
            # Its pods are a Job's, not orphans, whoever made it.
            if not sealed_by_fairq(job, self.owner_key):
                return True, None, (), None, True  # not fairq's (finding 11.4): not reported
            if is_replica_job(job):
                return True, None, (), None, True  # reported with the workload's Job
        replicas = replica_jobs.get(key, {}) if L_REPLICA in (meta.get("labels") or {}) \
            else {}
        kept_entry: _KeptStatus | None = None
        if entry is not None and entry.holds(job, replicas, create_errors, now):
            job_pods = entry.pods
            kept_entry = entry
        else:
            entry = None
            job_pods = pods.get(key, [])
            if replicas or workload_replicas(job) > 1:
                job_pods = _current_pods(job_pods, [job, *replicas.values()])
        if name in hidden:
            if any(not pod_is_terminal(p) for p in job_pods) and \
                    workload_finished(job, job_pods) is None:
                # Forgotten when its pods had ended, but the Job controller started
                # another: report it again, so the cycle stops it.
                self.tracker.unhide(name)
            else:
                if self._expired(hidden[name], now) and not meta.get("deletionTimestamp"):
                    housekeeping.append((name, meta["namespace"]))
                return True, None, job_pods, kept_entry, False
        if entry is not None and entry.stable:
            status = entry.status
        else:
            built = self._workload_status(job, job_pods, replicas, create_errors, now=now)
            if built is None:
                return True, None, job_pods, kept_entry, False
            status = built
            if keeping and entry is None:
                kept_entry = self._keep(key, job, job_pods, replicas, create_errors, status,
                                        now=now)
        return True, status, job_pods, kept_entry, kept_entry is not None and kept_entry.stable

    def _workload_status(self, job: Obj, job_pods: Sequence[Obj],
                         replicas: Mapping[int, Obj], create_errors: Mapping[str, str], *,
                         now: datetime) -> WorkloadStatus | None:
        """The status of the workload of `job` (its workload Job) from the watch cache,
        before what the tracker adds (rule K6, `stopping`)."""
        meta = job["metadata"]
        status = workload_status(job, job_pods, now=now,
                                 image_pull_timeout_seconds=self.image_pull_timeout_seconds,
                                 pod_create_timeout_seconds=self.pod_create_timeout_seconds,
                                 create_error=create_errors.get(
                                     f"{meta['namespace']}/{meta['name']}", "")
                                 if not job_pods else "")
        if status is not None and L_REPLICA in (meta.get("labels") or {}) and \
                workload_replicas(job) > 1:
            status = self._all_replicas(status, job, job_pods, replicas, create_errors,
                                        now=now)
        return status

    def _keep(self, key: str, job: Obj, job_pods: list[Obj], replicas: Mapping[int, Obj],
              create_errors: Mapping[str, str], status: WorkloadStatus, *,
              now: datetime) -> _KeptStatus | None:
        """`status`, just built, kept for the next cycles while its inputs hold: `stable`
        if nothing else can change it, the same when built as at a time far ahead (an age
        past a deadline - an image pull, a pod never created - or an end stamped `now`
        would differ); else its inputs only (it is built again each cycle, its pods not
        looked up again). None, rebuilt every cycle: a replica's Job missing (the
        tracker's memory of it is read then)."""
        if L_REPLICA in (job["metadata"].get("labels") or {}) and \
                len(replicas) < workload_replicas(job) - 1:
            return None
        stable = self._workload_status(job, job_pods, replicas, create_errors,
                                       now=now + _AHEAD) == status
        namespace = job["metadata"]["namespace"]
        read = (key, *(f"{namespace}/{r['metadata']['name']}" for r in replicas.values()))
        return _KeptStatus(job, dict(replicas), tuple((k, create_errors.get(k, "")) for k in read),
                           now, job_pods, status, stable=stable)

    def _kept_statuses(self) -> tuple[dict[str, _KeptStatus] | None,
                                      Mapping[str, list[Obj]], set[str] | None]:
        """The statuses kept from the last cycle that still hold as far as the watches
        said (None: `keep_statuses` is off), fairq's pods by workload as of the same
        events, and the Jobs' keys to visit again (`_Visits`; None: every Job): those
        of workloads a watch event touched since are dropped and marked, all of a
        namespace whose Jobs or pods were listed again (a resync, a 410), all when a
        timeout, the owner key or the namespace prefix they were built with changed."""
        with self._changed_lock:
            changed, self._changed = self._changed, set()
            grouped = self._grouped()[0]
        if not self.keep_statuses:
            self._kept, self._visits = {}, None
            return None, self._pods_by_workload(), None
        kept = self._kept
        marks: set[str] | None = changed
        under = (self.image_pull_timeout_seconds, self.pod_create_timeout_seconds,
                 self.owner_key, self.namespace_prefix)
        if under != self._kept_under:
            kept, self._kept_under, self._replica_memo = {}, under, {}
            marks = None
        relists = {(informer.name, namespace): count
                   for informer in (self.jobs, self.pods)
                   for namespace, count in informer.relist_counts().items()}
        for (kind, namespace), count in relists.items():
            if self._relists_seen.get((kind, namespace)) == count:
                continue
            if not namespace:
                kept, marks = {}, None
                continue
            prefix = f"{namespace}/"
            kept = {k: e for k, e in kept.items() if not k.startswith(prefix)}
            if marks is not None:
                marks.update(k for k in (self._visits.by_key if self._visits else ())
                             if k.startswith(prefix))
                marks.update(key_of(job) for job in self.jobs.items()
                             if job["metadata"].get("namespace") == namespace)
        self._relists_seen = relists
        for key in changed:
            kept.pop(key, None)
        return kept, grouped, marks

    def _spot_reclaimed(self, status: WorkloadStatus, pods: Sequence[Obj],
                        reclaimed_nodes: Mapping[str, tuple[str, datetime]]
                        ) -> WorkloadStatus:
        """Rule K6: a workload with a pod (not finished) on a reclaimed spot node, now or
        when the node watch saw it go, is FAILED with `spot_reclaimed_reason` and the
        reclamation as its end: its pods are gone or going, and the Job controller's
        replacements must not run the attempt on as if nothing happened. A workload that
        succeeded is left as it is."""
        if status.phase == Phase.SUCCEEDED:
            return status
        for pod in pods:
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            if node in reclaimed_nodes and not pod_is_terminal(pod):
                how, at = reclaimed_nodes[node]
                self.tracker.workload_reclaimed(status.name, node, how, at=at)
        hit = self.tracker.reclaimed(status.name)
        if hit is None:
            return status
        node, how, at = hit
        return replace(status, phase=Phase.FAILED, reason=spot_reclaimed_reason(node, how),
                       finished_at=at, exit_code=None, nodes=status.nodes or (node,))

    def _replicas_left(self, replica_jobs: Mapping[str, Mapping[int, Obj]],
                       pods: Mapping[str, list[Obj]], listed: Container[str], *,
                       now: datetime) -> list[WorkloadStatus]:
        """Multi-replica workloads whose replica 0's Job is gone while other replicas'
        Jobs are not (a stop deletes them all, and each stays listed, with a
        deletionTimestamp, until its pods are gone; replica 0's may go first): still
        listed, so rule R8 keeps their preemptor waiting while a replica's pod holds GPUs
        (`nominated_preemptors` counts listed workloads). FAILED (the attempt cannot go on
        without replica 0), `stopping` while those Jobs are being deleted (the cycle then
        does not stop them again; else it does). Left out once nothing of them runs."""
        out: list[WorkloadStatus] = []
        for key, replicas in replica_jobs.items():
            name = key.split("/", 1)[1]
            if name in listed or not replicas or self.jobs.get(key) is not None:
                continue
            group = _current_pods(pods.get(key, []), list(replicas.values()))
            deleting = any(j["metadata"].get("deletionTimestamp") for j in replicas.values())
            if not deleting and all(pod_is_terminal(p) for p in group):
                continue
            any_job = replicas[min(replicas)]
            status = workload_status(any_job, group, now=now)
            if status is None:
                continue
            out.append(WorkloadStatus(
                name=name, job_id=status.job_id, attempt=status.attempt, phase=Phase.FAILED,
                started_at=status.started_at, finished_at=status.finished_at or now,
                nodes=status.nodes, restarts=status.restarts, stopping=deleting,
                reason="replica 0's Kubernetes Job is gone; the other replicas are "
                       + ("being deleted" if deleting else "stopped with it")))
        return out

    def _replica_jobs(self) -> dict[str, dict[int, Obj]]:
        """The replica Jobs (i > 0) of this fairq's multi-replica workloads, by workload
        ("ns/name") and index, from the watch cache; each noted as seen by the tracker."""
        out: dict[str, dict[int, Obj]] = defaultdict(dict)
        seen: list[tuple[str, int]] = []
        # With `keep_statuses`, each Job's verdict is kept while the Job object is the
        # same (id -> (Job, verdict); the Job held, so its id is not reused).
        memo = self._replica_memo if self.keep_statuses else None
        fresh: dict[int, tuple[Obj, tuple[str, str, int] | None]] = {}
        for job in self.jobs.items():
            known = memo.get(id(job)) if memo is not None else None
            verdict = known[1] if known is not None and known[0] is job else \
                self._replica_verdict(job)
            if memo is not None:
                fresh[id(job)] = (job, verdict)
            if verdict is not None:
                key, workload, index = verdict
                out[key][index] = job
                seen.append((workload, index))
        self.tracker.replicas_seen(seen)
        self._replica_memo = fresh
        return out

    def _replica_verdict(self, job: Obj) -> tuple[str, str, int] | None:
        """("ns/workload", workload, index) when `job` is a replica Job (i > 0) of this
        fairq's, else None."""
        meta = job["metadata"]
        if not is_replica_job(job) or not self._fairqs(job):
            return None
        labels = meta.get("labels") or {}
        index = str(labels.get(L_REPLICA, ""))
        if not index.isdigit():
            return None
        workload = str(labels[L_WORKLOAD])
        return f"{meta['namespace']}/{workload}", workload, int(index)

    def _all_replicas(self, status: WorkloadStatus, job: Obj, pods: Sequence[Obj],
                      replicas: Mapping[int, Obj], create_errors: Mapping[str, str], *,
                      now: datetime) -> WorkloadStatus:
        """All or nothing at run time, for what `workload_status` (replica 0's Job and the
        pods) cannot see: a replica whose Job is missing or whose pod cannot be created.

        - replica i's Job missing: seen before → FAILED ("deleted outside fairq"); never
          seen → PENDING, waiting (the submit's retry makes it), then FAILED once
          replica 0's Job is `pod_create_timeout_seconds` old;
        - replica i's Job without a pod and with a FailedCreate message (a quota refuses
          it): PENDING, waiting with the message, then FAILED as for replica 0
          (`pods_never_created`, `pod_create_timeout_seconds`).
        A workload that finished or is being deleted is left as it is."""
        if status.phase in (Phase.SUCCEEDED, Phase.FAILED) or \
                job["metadata"].get("deletionTimestamp"):
            return status
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        timeout = self.pod_create_timeout_seconds
        seconds = f"{timeout:.0f} s" if timeout is not None else "time"

        def failed(reason: str) -> WorkloadStatus:
            return replace(status, phase=Phase.FAILED, reason=reason[:500], finished_at=now,
                           exit_code=None)

        def waiting(reason: str) -> WorkloadStatus:
            return replace(status, phase=Phase.PENDING, reason=f"{WAITING}{reason}"[:500],
                           finished_at=None)

        for index in range(1, workload_replicas(job)):
            if index in replicas:
                continue
            if self.tracker.replica_was_seen(name, index):
                return failed(f"replica {index}'s Kubernetes Job was deleted outside fairq")
            if pods_never_created(job, [], now=now, timeout_seconds=timeout):
                return failed(f"replica {index}'s Kubernetes Job was not created in {seconds}")
            return waiting(f"replica {index}'s Job is not created yet")
        placed = {_replica_index(p) for p in pods}
        for index in range(workload_replicas(job)):
            replica_job = job if index == 0 else replicas[index]
            if index in placed:
                continue
            error = create_errors.get(f"{namespace}/{replica_job['metadata']['name']}")
            if not error:
                continue
            if pods_never_created(replica_job, [], now=now, timeout_seconds=timeout):
                return failed(f"replica {index}: no pod could be created in {seconds}: "
                              f"{error}")
            return waiting(f"replica {index}'s pod cannot be created yet: {error}")
        return status

    def _create_errors(self) -> dict[str, str]:
        """The Job controller's last FailedCreate message per fairq Job ("ns/name"), from
        the events watch: no API call, however many Jobs wait for pods."""
        latest: dict[str, tuple[str, str]] = {}
        for event in self.events.items():
            involved = event.get("involvedObject") or {}
            if not str(involved.get("namespace", "")).startswith(self.namespace_prefix):
                continue
            key = f"{involved.get('namespace')}/{involved.get('name')}"
            at = str(event.get("lastTimestamp") or event.get("eventTime") or "")
            if key not in latest or at >= latest[key][0]:
                latest[key] = (at, str(event.get("message") or "")[:300])
        return {k: m for k, (_, m) in latest.items()}

    def _orphan_pods(self, pods: Mapping[str, list[Obj]], job_keys: set[str],
                     listed: Container[str], *, now: datetime,
                     keys: Iterable[str] | None = None) -> list[WorkloadStatus]:
        """fairq pods whose Job is gone (deleted with orphan propagation, or while fairq
        was down), once older than the grace (a pod can reach the cache before its Job):
        pods that ran are reported (`orphan_pods_status`; the cycle charges them and
        calls `stop`, which deletes them); pods that never ran are deleted here. `keys`:
        the groups to look at (None: every one)."""
        out: list[WorkloadStatus] = []
        grace = timedelta(seconds=self.orphan_pod_grace_seconds)
        for key in pods if keys is None else sorted(keys):
            if key in job_keys:
                continue
            namespace, name = key.split("/", 1)
            if not namespace.startswith(self.namespace_prefix):
                continue
            group = pods[key]
            # Only pods no Job owns: orphan propagation removes the owner reference; a pod
            # that still has one belongs to a Job the cache may merely lag behind on (or
            # one being garbage collected).
            live = [p for p in group
                    if not p["metadata"].get("deletionTimestamp") and not _owned_by_job(p)]
            created = [parse_time(p["metadata"].get("creationTimestamp")) for p in live]
            if not live or any(c is None or now - c < grace for c in created):
                continue
            status = orphan_pods_status(name, live, now=now)
            if status is None:
                self._delete_orphan_pods(name)
            elif name not in listed:
                out.append(status)
        return out

    def _delete_quietly(self, name: str, namespace: str) -> None:
        try:
            self.tracker.stop_asked(name)
            job = self.jobs.get(f"{namespace}/{name}")
            if job is not None and workload_replicas(job) > 1:
                self._delete_service(name, namespace)
            self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
            if job is not None and workload_replicas(job) > 1:
                self._delete_companions(name, namespace, workload_replicas(job))
        except Exception as exc:
            self.tracker.stop_failed(name)
            log.info("deleting finished Job %s/%s failed: %s", namespace, name, exc)

    # --- nodes --------------------------------------------------------------------------

    def gpu_types(self) -> Sequence[GpuTypeRef]:
        source = self._gpu_types_source
        if not callable(source):
            return source
        cached = self._gpu_types_cache
        if cached is None or time.monotonic() - cached[0] > self._gpu_types_ttl:
            cached = (time.monotonic(), tuple(source()))
            self._gpu_types_cache = cached
        return cached[1]

    def nodes(self) -> list[NodeInfo]:
        self.wait_synced()
        if not self.keep_nodes:
            self._nodes_kept = None
            return self._nodes_rebuilt()
        return self._nodes_kept_path()

    def _nodes_rebuilt(self) -> list[NodeInfo]:
        """Every node's NodeInfo from the watch cache (the reference of `_nodes_kept_path`)."""
        fairq_pods = self.pods.items()
        unbound: dict[str, int] = defaultdict(int)
        by = self._pods_by_workload()
        for job in self.jobs.items():
            if is_replica_job(job):
                continue  # its workload's Job counts every replica
            key = f"{job['metadata']['namespace']}/{job['metadata']['name']}"
            for node, n in unbound_demand(job, by.get(key, [])).items():
                unbound[node] += n
        nodes = self.nodes_informer.items()
        # Rule K6: a spot node being reclaimed offers nothing (a termination taint keeps
        # it out of `capacity` already; a label does not).
        going = {key_of(n) for n in nodes if self._reclaiming(n)}
        spot = {key_of(n) for n in nodes if node_is_spot(n, self.spot_labels)}
        return [replace(n, spot=True) if n.name in spot else n
                for n in capacity([n for n in nodes if key_of(n) not in going],
                                  fairq_pods + self.other_pods.items(), self.gpu_types(),
                                  unbound=unbound, spot_labels=self.spot_labels,
                                  spot_tolerations=self.spot_tolerations)]

    def _nodes_kept_path(self) -> list[NodeInfo]:
        """`nodes()` from what the last cycle built: the unbound demand of the workloads
        a watch event marked is read again (all of it on the first cycle, or when the
        GPU types or spot matches changed), and a node is built again only when its
        object (a relist keeps an unchanged one), its pods' dict (replaced by the pod
        hooks on every change) or the demand on it moved. The same answer as
        `_nodes_rebuilt` as of the events the hooks have seen."""
        gpu_types = tuple(self.gpu_types())
        under = (gpu_types, self.spot_labels, self.spot_tolerations, self.spot_termination)
        state = self._nodes_kept
        first = state is None or state.under != under
        with self._changed_lock:
            marks, self._demand_marks = self._demand_marks, set()
            touched = dict(self._node_touched)
            if first:
                grouped = self._grouped()[0]
            else:
                groups = self._groups.by_key
                marked = {k: list(groups[k].values()) if k in groups else [] for k in marks}
        if first:
            state = _KeptNodes(under)
            for job in self.jobs.items():
                key = key_of(job)
                if not is_replica_job(job):
                    state.set_demand(key, unbound_demand(job, grouped.get(key, [])))
        else:
            assert state is not None
            for key, pods in marked.items():
                held = self.jobs.get(key)
                state.set_demand(key, {} if held is None or is_replica_job(held)
                                 else unbound_demand(held, pods))
        kept, total = state.entries, state.total
        fresh: dict[str, tuple[Obj, int, int, NodeInfo | None]] = {}
        stale: list[tuple[str, Obj, int]] = []
        for node in self.nodes_informer.items():
            name = key_of(node)
            demand = total.get(name, 0)
            entry = kept.get(name)
            if entry is None or entry[0] is not node or entry[1] != touched.get(name, 0) or \
                    entry[2] != demand:
                stale.append((name, node, demand))
            else:
                fresh[name] = entry
        if stale:
            with self._changed_lock:
                bound = [(self._node_touched.get(name, 0),
                          list((self._on_node.get(name) or {}).values()))
                         for name, _, _ in stale]
            for (name, node, demand), (touch, pods) in zip(stale, bound, strict=True):
                fresh[name] = (node, touch, demand,
                               self._node_info(node, pods, demand, gpu_types))
        state.entries = fresh
        self._nodes_kept = state
        return [entry[3] for _, entry in sorted(fresh.items()) if entry[3] is not None]

    def _node_info(self, node: Obj, pods: list[Obj], demand: int,
                   gpu_types: Sequence[GpuTypeRef]) -> NodeInfo | None:
        """One node's NodeInfo as `_nodes_rebuilt` makes it (None: not offered), from the
        pods bound to it and fairq's unbound demand on it."""
        self.node_builds += 1
        if self._reclaiming(node):
            return None  # rule K6
        infos = capacity([node], pods, gpu_types,
                         unbound={key_of(node): demand} if demand else None,
                         spot_labels=self.spot_labels, spot_tolerations=self.spot_tolerations)
        if not infos:
            return None
        return replace(infos[0], spot=True) if node_is_spot(node, self.spot_labels) \
            else infos[0]

    def _reclaiming(self, node: Obj) -> bool:
        """A spot node with a termination taint or label (rule K6)."""
        return node_is_spot(node, self.spot_labels) and \
            node_termination_mark(node, self.spot_termination) is not None

    # --- logs ---------------------------------------------------------------------------

    def logs(self, name: str, *, tail: int = 100) -> str:
        """The last `tail` lines of each pod of the workload (a header per pod when there
        are several); a readable line instead of an error when a pod has no logs."""
        from kubernetes.client.exceptions import ApiException

        self._after_fork()
        # The pod watch's cache when it runs (the worker's: no list call per workload,
        # which is most of a read's time on a loaded API server); the API server when
        # it does not, or does not hold the workload's pods (yet): the workload's own
        # namespace when known, else every namespace this identity may read.
        pods = list(self._pod_index()[1].get(name, ())) \
            if self._started and self.pods.ready() else []
        if not pods:
            namespace = self._namespace_of(name)
            try:
                if namespace is not None:
                    pods = raw_list(self.core.list_namespaced_pod, namespace=namespace,
                                    label_selector=f"{L_WORKLOAD}={name}")
                else:
                    pods = self._list_everywhere(self.core, "pod",
                                                 label_selector=f"{L_WORKLOAD}={name}")
            except ApiException as exc:
                status, message = api_error(exc)
                return logs_unanswered_note(f"the pods of {name}", f"({status}) {message}")
        with self._last_words_lock:
            remembered = dict(self._last_words.get(name, {}))
        listed = {p["metadata"]["name"] for p in pods}
        # Pods gone since their container ended: what they wrote last (graceful stop).
        gone = sorted((replica, pod_name, text) for pod_name, (replica, text)
                      in remembered.items() if pod_name not in listed)
        if not pods and not gone:
            return ""
        # Replica order (the `fairq.io/replica` label; pod names do not sort that way:
        # fq-1-1-2x9k4 is replica 0's, fq-1-1-1-b7d2q replica 1's), then name.
        pods.sort(key=lambda p: (_replica_index(p), p["metadata"]["name"]))
        entries: list[tuple[int, str, Obj | None, str]] = sorted(
            [(_replica_index(p), p["metadata"]["name"], p, "") for p in pods]
            + [(replica, pod_name, None, text) for replica, pod_name, text in gone],
            key=lambda e: (e[0], e[1]))
        chunks: list[str] = []
        for _replica, pod_name, pod, last in entries:
            if pod is None:
                if len(entries) > 1:
                    chunks.append(f"==> {pod_name} <==")
                chunks.extend(last.splitlines()[-tail:])
                continue
            namespace = pod["metadata"]["namespace"]
            try:
                text = self.core.read_namespaced_pod_log(
                    pod_name, namespace, container="main", tail_lines=tail,
                    _request_timeout=(5, 30))
            except ApiException as exc:
                status, message = api_error(exc)
                if status == 404:
                    text = f"[fairq] pod {pod_name} is gone; its logs with it"
                elif status == 0 or status == 429 or status >= 500:
                    # Not answered (the API server or the kubelet did not): read again.
                    text = logs_unanswered_note(f"pod {pod_name}", f"({status}) {message}")
                else:  # refused for good (400: its container never started)
                    text = f"[fairq] no logs from pod {pod_name} ({status}): {message}"
            except Exception as exc:  # a timeout, a connection reset
                text = logs_unanswered_note(f"pod {pod_name}", str(exc))
            lines = str(text or "").splitlines()
            if remembered.get(pod_name) and (not lines or lines[0].startswith("[fairq]")):
                lines = remembered[pod_name][1].splitlines()  # gone between list and read
            if len(entries) > 1:
                chunks.append(f"==> {pod_name} <==")
            chunks.extend(lines[-tail:])
        return "\n".join(chunks)

    # How many workloads' last words are kept, and how much of each pod's log.
    LAST_WORDS_KEPT = 256
    LAST_WORDS_LINES = 2000

    def _last_words_due(self, old: Obj | None, new: Obj | None) -> bool:
        """A fairq pod being deleted whose containers have all just ended: its log is
        still readable (the kubelet deletes the pod once its volumes are torn down)."""
        if new is None or not (new.get("metadata") or {}).get("deletionTimestamp") or \
                not self._ours(new["metadata"]) or \
                L_WORKLOAD not in (new["metadata"].get("labels") or {}):
            return False
        return _containers_ended(new) and not _containers_ended(old)

    def _remember_last_words(self, pod: Obj) -> None:
        """Read pod `pod`'s log now (a pool thread) and keep it for `logs()`."""
        meta = pod["metadata"]
        workload = str(meta["labels"][L_WORKLOAD])
        try:
            text = self.core.read_namespaced_pod_log(
                meta["name"], meta["namespace"], container="main",
                tail_lines=self.LAST_WORDS_LINES, _request_timeout=(5, 30))
        except Exception as exc:  # gone already, or not answered: nothing to keep
            log.info("last log of pod %s/%s not read: %s", meta["namespace"], meta["name"],
                     getattr(exc, "status", type(exc).__name__))
            return
        with self._last_words_lock:
            pods = self._last_words.setdefault(workload, {})
            pods[str(meta["name"])] = (_replica_index(pod), str(text or ""))
            self._last_words.move_to_end(workload)
            while len(self._last_words) > self.LAST_WORDS_KEPT:
                self._last_words.popitem(last=False)

    # --- watch hooks (informer threads: quick, no DB) ------------------------------------

    def _job_changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        self._touched(old, new, job=True)
        if not self._fairqs(new or old or {}):
            return
        if is_replica_job(new or old or {}):
            # A replica's Job: nothing to track (its workload's Job is); a change of it
            # is worth a cycle (a replica failing fails the workload).
            if kind in ("ADDED", "DELETED") or _conditions(old) != _conditions(new):
                self._poke()
            return
        if new is not None:
            self.tracker.placed(new["metadata"]["name"], new["metadata"]["namespace"])
        if kind == "DELETED" and old is not None:
            self._job_deleted(old)
        old_c = _conditions(old)
        if kind in ("ADDED", "DELETED") or old_c != _conditions(new):
            self._poke()

    def _job_deleted(self, job: Obj) -> None:
        """A Job fairq did not stop is gone (kubectl, a removed namespace, the TTL
        controller before fairq saw the end): keep reporting its last status for a while,
        so its job is not left RUNNING for ever. A finished Job reports how it finished;
        one that ran but did not finish reports FAILED; one that never ran reports nothing
        (the cycle requeues an admitted job whose workload vanished)."""
        meta = job["metadata"]
        name = meta["name"]
        acknowledged, started = self.tracker.deleted(name)
        if acknowledged:
            return
        pods = self._pods_by_workload().get(f"{meta['namespace']}/{name}", [])
        now = datetime.now(UTC)
        status = workload_status(job, pods, now=now,
                                 image_pull_timeout_seconds=self.image_pull_timeout_seconds)
        if status is None:
            return
        if status.phase not in (Phase.SUCCEEDED, Phase.FAILED):
            if started is None and status.started_at is None:
                return
            status = WorkloadStatus(
                name=name, job_id=status.job_id, attempt=status.attempt, phase=Phase.FAILED,
                started_at=started or status.started_at, finished_at=now,
                nodes=status.nodes, reason="its Kubernetes Job was deleted outside fairq")
        self.tracker.bury(status, at=time.monotonic())

    def _pod_changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        self._touched(old, new, pod=True)
        if kind == "MODIFIED" and new is not None and self._last_words_due(old, new):
            if self._last_words_pool is None:
                self._last_words_pool = ThreadPoolExecutor(
                    max_workers=2, thread_name_prefix="fairq-last-words")
            with contextlib.suppress(RuntimeError):  # closing: nothing more to keep
                self._last_words_pool.submit(self._remember_last_words, new)
        if kind in ("ADDED", "DELETED") or _phase(old) != _phase(new):
            self._poke()

    def _touched(self, old: Obj | None, new: Obj | None, *, job: bool = False,
                 pod: bool = False) -> None:
        """A watch event changed `old` into `new` (a Job, `job`, or a fairq pod, `pod`:
        regrouped, and kept by node for `nodes()`, too): the kept status and the unbound
        demand of its workload ("ns/<fairq.io/workload>", before and after; a Job's own
        name too) are read again by the next cycle. Marked before the
        kick, so the cycle it starts sees the mark; with the regrouping, under one lock,
        so a cycle's pods and marks are of the same events."""
        keys = set()
        for obj in (old, new):
            if obj is None:
                continue
            meta = obj.get("metadata") or {}
            namespace = meta.get("namespace")
            workload = (meta.get("labels") or {}).get(L_WORKLOAD)
            if workload:
                keys.add(f"{namespace}/{workload}")
            if job or not workload:
                keys.add(f"{namespace}/{meta.get('name')}")
        with self._changed_lock:
            self._changed.update(keys)
            self._demand_marks.update(keys)
            if pod:
                self._groups.changed(old, new)
                self._bound("fairq", old, new)

    def _other_pod_changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Another workload's pod (its GPUs, CPU and memory count on its node)."""
        with self._changed_lock:
            self._bound("other", old, new)

    def _bound(self, tag: str, old: Obj | None, new: Obj | None) -> None:
        """Keep `_on_node` (under `_changed_lock`): `old` off its node, `new` on its own
        if bound and not terminal (what `capacity` counts); `tag` names the informer.
        Each node whose pods changed is stamped with a new count (`_node_touched`)."""
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            node = (obj.get("spec") or {}).get("nodeName")
            if not node or (add and pod_is_terminal(obj)):
                continue
            key = (tag, key_of(obj))
            group = self._on_node.get(node)
            if add:
                if group is None:
                    group = self._on_node[node] = {}
                group[key] = obj
            elif group is not None and key in group:
                del group[key]
                if not group:
                    del self._on_node[node]
            else:
                continue
            self._touches += 1
            self._node_touched[node] = self._touches

    def _node_changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        # Capacity is read from the cache each cycle; a node that appears, leaves or
        # changes schedulability is worth a cycle now.
        self._spot_changed(kind, old, new)
        if kind != "MODIFIED" or _node_key(old) != _node_key(new):
            self._poke()

    def _spot_changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """Rule K6, as the node watch sees it: a spot node deleted, or carrying a
        termination taint or label, is reclaimed, and so is every fairq workload with a
        pod (not finished) bound to it then; a node back without the mark is not."""
        node = new if new is not None else old
        if node is None or not (node_is_spot(node, self.spot_labels) or (
                old is not None and node_is_spot(old, self.spot_labels))):
            return
        name = str((node.get("metadata") or {}).get("name"))
        how = "deleted" if kind == "DELETED" else \
            node_termination_mark(node, self.spot_termination)
        if how is None:
            self.tracker.node_back(name)
            return
        at = datetime.now(UTC)
        self.tracker.node_reclaimed(name, how, at=at)
        hit = sorted({str(labels[L_WORKLOAD]) for pod in self.pods.items()
                      if (pod.get("spec") or {}).get("nodeName") == name
                      and not pod_is_terminal(pod) and self._ours(pod["metadata"])
                      and L_WORKLOAD in (labels := pod["metadata"].get("labels") or {})})
        for workload in hit:
            self.tracker.workload_reclaimed(workload, name, how, at=at)
        if hit:
            log.warning("spot node %s %s: workloads %s reclaimed (rule K6)", name, how,
                        ", ".join(hit))

    def _poke(self) -> None:
        if self._kick is not None and all(i.ready() for i in self._informers):
            try:
                self._kick()
            except Exception:  # a watch thread must go on watching
                log.exception("scheduler kick failed")


def _redacted(text: str, spec: LaunchSpec) -> str:
    """`text` (an API server's answer, which may quote the body) without the spec's
    checkpoint token: a credential never reaches a job's events or fairq's logs."""
    token = spec.checkpoint_token
    return text.replace(token, "[checkpoint token]") if token else text


def _containers_ended(pod: Obj | None) -> bool:
    """Every container of `pod` reports a terminated state (False for none reported)."""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or ()
    return bool(statuses) and all("terminated" in (cs.get("state") or {}) for cs in statuses)


def _owned_by_workload(obj: Obj, name: str) -> bool:
    """Labelled fairq's and owned by the Job named `name` (the workload's)."""
    meta = obj.get("metadata") or {}
    return (meta.get("labels") or {}).get(MANAGED_BY) == "fairq" and any(
        ref.get("kind") == "Job" and ref.get("name") == name
        for ref in meta.get("ownerReferences") or ())


def _replica_index(pod: Obj) -> int:
    value = str((pod["metadata"].get("labels") or {}).get(L_REPLICA, "0"))
    return int(value) if value.isdigit() else 0


def _current_pods(pods: Sequence[Obj], jobs: Sequence[Obj]) -> list[Obj]:
    """`pods` without those a Job of another uid controls (an earlier Job of the same
    name, deleted in the background: its pods are still going)."""
    uids = {j["metadata"].get("uid") for j in jobs}
    return [p for p in pods
            if all(ref.get("uid") in uids for ref in p["metadata"].get("ownerReferences") or ()
                   if ref.get("kind") == "Job" and ref.get("controller"))]


def _owned_by_job(pod: Obj) -> bool:
    return any(ref.get("kind") == "Job" and ref.get("controller")
               for ref in pod["metadata"].get("ownerReferences") or ())


def _conditions(job: Obj | None) -> list[tuple[str, str]]:
    if job is None:
        return []
    return [(c.get("type", ""), c.get("status", ""))
            for c in (job.get("status") or {}).get("conditions") or ()]


def _phase(pod: Obj | None) -> tuple[str, bool]:
    if pod is None:
        return ("", False)
    return ((pod.get("status") or {}).get("phase") or "",
            bool(pod["metadata"].get("deletionTimestamp")))


def _node_key(node: Obj | None) -> Any:
    if node is None:
        return None
    spec = node.get("spec") or {}
    ready = [c.get("status") for c in (node.get("status") or {}).get("conditions") or ()
             if c.get("type") == "Ready"]
    return (spec.get("unschedulable"), json.dumps(spec.get("taints"), sort_keys=True), ready,
            json.dumps((node.get("status") or {}).get("allocatable"), sort_keys=True),
            json.dumps(node["metadata"].get("labels"), sort_keys=True))
