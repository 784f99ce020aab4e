"""Several simulated clusters for the cycle's tests (docs/clusters.md, rules K1-K8):
`Cluster` rows with their nodes, a backend that can be made unreachable, queued jobs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from django.utils import timezone

from queueing.backends.base import ClusterBackend, LaunchSpec, NodeInfo, WorkloadStatus
from queueing.composition import get_backend
from queueing.models import Cluster, Job, NodePool
from queueing.policy.states import JobState
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World
from tests.factories import JobFactory


class Unreachable(ConnectionError):
    """What an API server that does not answer raises."""


class Flaky:
    """A cluster's backend that can stop answering (`down`), or refuse only creates
    (`refuse_submit`): everything else is the real simulated cluster underneath, whose
    workloads run on while fairq cannot see them."""

    in_process = True
    provisions = False

    def __init__(self, inner: ClusterBackend) -> None:
        self.inner = inner
        self.down = False
        self.refuse_submit = False

    def _check(self) -> None:
        if self.down:
            raise Unreachable("connection refused")

    def nodes(self) -> list[NodeInfo]:
        self._check()
        return self.inner.nodes()

    def statuses(self, *, now: datetime) -> list[WorkloadStatus]:
        self._check()
        return self.inner.statuses(now=now)

    def submit(self, spec: LaunchSpec, *, now: datetime) -> None:
        self._check()
        if self.refuse_submit:
            raise Unreachable("connection reset while creating")
        self.inner.submit(spec, now=now)

    def stop(self, name: str, *, now: datetime) -> None:
        self._check()
        self.inner.stop(name, now=now)

    def logs(self, name: str, *, tail: int = 100) -> str:
        self._check()
        return self.inner.logs(name, tail=tail)


MakeCluster = Callable[..., Cluster]


@pytest.fixture
def make_cluster(db: None) -> MakeCluster:
    """`make_cluster("onprem", "2x8xh100", cost_rank=0, labels={...})`: a simulated
    cluster row."""

    def make(name: str, sim_nodes: str, *, cost_rank: int = 0,
             labels: dict[str, str] | None = None, enabled: bool = True) -> Cluster:
        return Cluster.objects.create(name=name, backend="simulated", sim_nodes=sim_nodes,
                                      cost_rank=cost_rank, labels=labels or {},
                                      enabled=enabled)

    return make


def spot_pool(cluster: Cluster, gpu_type: Any, name: str = "spot") -> NodePool:
    """All of `cluster`'s nodes of `gpu_type` are spot capacity (a pool naming no labels)."""
    return NodePool.objects.create(cluster=cluster, name=name, gpu_type=gpu_type, spot=True)


def backend_of(cluster: Cluster) -> ClusterBackend:
    """The backend the cycle builds for `cluster` (the same instance while its row's
    connection fields do not change)."""
    return get_backend(cluster)


def queued(world: World, *, gpu_type: Any, gpus: int = 8, replicas: int = 1,
           tier: Any = None, team: Any = None, seconds: int = 3600,
           at: datetime | None = None, **fields: Any) -> Job:
    """A queued job of `team` (vision) that runs `seconds` on the simulated cluster."""
    extra: dict[str, Any] = {"created_at": at} if at is not None else {}
    env = {"FAIRQ_SIM_SECONDS": str(seconds), **fields.pop("env", {})}
    return JobFactory(team=team or world.vision, gpu_type=gpu_type, gpus_per_replica=gpus,
                      replicas=replicas, tier=tier or world.normal, env=env,
                      max_runtime_seconds=7200, **extra, **fields)


@dataclass
class StuckAdmission:
    onprem: Cluster
    cloud: Cluster
    flaky: Flaky
    job: Job
    at: datetime


def admitted_never_created(world: World, make_cluster: MakeCluster) -> StuckAdmission:
    """On-premises with h100s only and a cloud of a100s whose API server refuses every
    create: an a100 job admitted to the cloud `at`, its workload never created (what rules
    K5 and K8 hand back to the queue)."""
    onprem = make_cluster("onprem", "1x8xh100", cost_rank=0)
    cloud = make_cluster("cloud", "1x8xa100", cost_rank=10)
    flaky = Flaky(backend_of(cloud))
    flaky.refuse_submit = True
    at = timezone.now()
    job = queued(world, gpu_type=world.a100)
    scheduler_cycle(now=at, backends={"cloud": flaky})
    job = Job.objects.get(pk=job.pk)
    assert (job.status, job.cluster, job.submitted_to_backend_at) == (
        JobState.ADMITTED, cloud, None)
    return StuckAdmission(onprem, cloud, flaky, job, at)


def live(backend: ClusterBackend, now: datetime) -> set[str]:
    """The workloads a cluster still runs (not finished)."""
    inner = backend.inner if isinstance(backend, Flaky) else backend
    return {s.name for s in inner.statuses(now=now) if s.finished_at is None}
