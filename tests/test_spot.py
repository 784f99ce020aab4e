"""Rule K6, spot reclamation, on the simulated cluster (docs/scheduling.md, "Clusters and
spot capacity"): a reclaimed node's jobs are requeued at once as attempt + 1, their GPU
time up to the reclamation charged, not failed, their old workloads stopped; and the
pieces the Kubernetes backend reports it with (spot labels, termination marks, the
tracker's sticky reclamations), without a cluster.

Time is driven explicitly: every cycle gets `now`, and so does the simulated cluster.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from queueing.backends import k8s_api
from queueing.backends.base import (
    Phase,
    WorkloadStatus,
    spot_reclaimed_node,
    spot_reclaimed_reason,
)
from queueing.backends.k8s_api import node_is_spot, node_termination_mark, parse_node_matches
from queueing.backends.k8s_tracker import WorkloadTracker
from queueing.backends.simulated import SimulatedCluster, SimulatedClusterError
from queueing.composition import get_backend
from queueing.models import Job, JobEvent, UsageRecord
from queueing.services.scheduler import CycleResult, scheduler_cycle
from queueing.services.spot import spot_reclaimed_requeue

from .conftest import World
from .test_cycle import submit

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def _sim() -> SimulatedCluster:
    backend = get_backend()
    assert isinstance(backend, SimulatedCluster)
    return backend


def _run(world: World, *, at: datetime, **overrides: Any) -> Job:
    """A job submitted at `at`, admitted and running by `at` + 1 s."""
    job_id = submit(world, at=at - timedelta(seconds=1), tier="low",
                    env={"FAIRQ_SIM_SECONDS": "600"}, **overrides)
    scheduler_cycle(now=at)
    scheduler_cycle(now=at + timedelta(seconds=1))
    job = Job.objects.get(pk=job_id)
    assert job.status == "RUNNING", job.message
    return job


# --- the rule on the simulated cluster ------------------------------------------------------

@pytest.mark.django_db
def test_k6_a_reclaimed_node_requeues_its_job_charged_and_not_failed(world: World) -> None:
    t0 = timezone.now() - timedelta(minutes=30)
    job = _run(world, at=t0)
    node = job.placement[0]
    assert _sim().reclaim_node(node, now=t0 + timedelta(seconds=30)) == [f"fq-{job.pk}-1"]

    r = scheduler_cycle(now=t0 + timedelta(seconds=31))

    job.refresh_from_db()
    # Requeued as attempt 2 at once, the way preemption requeues; never FAILED.
    assert job.pk in r.requeued and job.pk not in r.finished
    transitions = list(job.events.filter(kind="transition").values_list(
        "from_status", "to_status", "attempt"))
    at = transitions.index(("RUNNING", "PREEMPTED", 1))
    # (The requeue's event carries the attempt it starts.)
    assert transitions[at + 1] == ("PREEMPTED", "QUEUED", 2)
    assert "FAILED" not in {t for _, t, _ in transitions}
    # (The next cycle's plan may admit it again at once: the h100 node left has room.)
    assert job.attempt == 2 and job.status in ("QUEUED", "ADMITTED")
    assert job.exit_code is None and job.finished_at is None
    # Its GPU time up to the reclamation (30 s of 2 GPUs), charged to attempt 1.
    usage = UsageRecord.objects.get(job=job)
    assert (usage.attempt, usage.gpu_seconds) == (1, 2 * 30)
    assert usage.end == t0 + timedelta(seconds=30)
    event = JobEvent.objects.get(job=job, kind=JobEvent.Kind.SPOT_RECLAIMED)
    assert event.attempt == 1
    assert event.data["node"] == node and event.data["gpu_seconds"] == 60
    assert event.data["rule"] == "K6"
    # The API's attempts say how attempt 1 ended, and what it was charged.
    body = world.client(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    first = body["attempts"][0]
    assert (first["attempt"], first["ended_how"]) == (1, "spot_reclaimed")
    assert first["gpu_hours"] == pytest.approx(60 / 3600) and first["preempted_by"] is None
    # The old workload is stopped: the cluster no longer lists attempt 1.
    names = {s.name for s in _sim().statuses(now=t0 + timedelta(seconds=31))}
    assert f"fq-{job.pk}-1" not in names


@pytest.mark.django_db
def test_k6_the_requeued_job_runs_again_elsewhere_and_once(world: World) -> None:
    t0 = timezone.now() - timedelta(minutes=30)
    job = _run(world, at=t0)
    node = job.placement[0]
    _sim().reclaim_node(node, now=t0 + timedelta(seconds=30))
    for s in range(31, 36):
        scheduler_cycle(now=t0 + timedelta(seconds=s))
    job.refresh_from_db()
    assert job.status == "RUNNING" and job.attempt == 2
    assert node not in job.placement  # the reclaimed node is gone from the cluster
    live = [s for s in _sim().statuses(now=t0 + timedelta(seconds=36))
            if s.job_id == job.pk and s.phase == Phase.RUNNING]
    assert [s.attempt for s in live] == [2]  # nothing runs twice
    # Runs to the end and is charged once more, for attempt 2 only.
    scheduler_cycle(now=t0 + timedelta(seconds=33 + 600))
    job.refresh_from_db()
    assert job.status == "SUCCEEDED"
    assert sorted(UsageRecord.objects.filter(job=job).values_list("attempt", flat=True)) \
        == [1, 2]


@pytest.mark.django_db
def test_k6_only_the_reclaimed_nodes_jobs_move(world: World) -> None:
    t0 = timezone.now() - timedelta(minutes=30)
    first = _run(world, at=t0, gpus=8)
    second = _run(world, at=t0 + timedelta(seconds=2), gpus=8)
    assert first.placement != second.placement
    _sim().reclaim_node(first.placement[0], now=t0 + timedelta(seconds=20))
    scheduler_cycle(now=t0 + timedelta(seconds=21))
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.attempt == 2 and first.status == "QUEUED"  # no h100 node with 8 free
    assert second.attempt == 1 and second.status == "RUNNING"
    assert not JobEvent.objects.filter(job=second, kind=JobEvent.Kind.SPOT_RECLAIMED).exists()


@pytest.mark.django_db
def test_k6_an_admitted_job_is_requeued_and_charged_what_its_pods_ran(world: World) -> None:
    t0 = timezone.now() - timedelta(minutes=30)
    job_id = submit(world, at=t0 - timedelta(seconds=1), tier="low",
                    env={"FAIRQ_SIM_SECONDS": "600"})
    scheduler_cycle(now=t0)  # admitted and submitted: the simulated pods start at t0
    job = Job.objects.get(pk=job_id)
    assert job.status == "ADMITTED"
    _sim().reclaim_node(job.placement[0], now=t0 + timedelta(seconds=4))
    scheduler_cycle(now=t0 + timedelta(seconds=5))
    job.refresh_from_db()
    assert job.attempt == 2 and job.status in ("QUEUED", "ADMITTED")
    moves = list(job.events.filter(kind="transition").values_list("from_status",
                                                                  "to_status"))
    at = moves.index(("ADMITTED", "PREEMPTED"))
    assert moves[at + 1] == ("PREEMPTED", "QUEUED") and ("ADMITTED", "FAILED") not in moves
    assert UsageRecord.objects.get(job=job, attempt=1).gpu_seconds == 2 * 4


@pytest.mark.django_db
def test_k6_leaves_a_workload_its_job_no_longer_holds_to_reconcile(world: World) -> None:
    t0 = timezone.now() - timedelta(minutes=30)
    job = _run(world, at=t0)
    stale = WorkloadStatus(name=f"fq-{job.pk}-7", job_id=job.pk, attempt=7,
                           phase=Phase.FAILED, started_at=t0,
                           finished_at=t0 + timedelta(seconds=9),
                           reason=spot_reclaimed_reason("sim-h100-000", "deleted"))
    other = WorkloadStatus(name=f"fq-{job.pk}-1", job_id=job.pk, attempt=1,
                           phase=Phase.RUNNING, started_at=t0)
    result = CycleResult()
    left = spot_reclaimed_requeue(backend=_sim(), statuses=[stale, other],
                                  now=t0 + timedelta(seconds=10), result=result)
    assert left == [stale, other] and result.requeued == []
    job.refresh_from_db()
    assert job.status == "RUNNING" and job.attempt == 1


@pytest.mark.django_db
def test_k6_webhooks_see_the_requeue(world: World,
                                     django_capture_on_commit_callbacks: Any) -> None:
    from .webhooks.receiver import receiver

    t0 = timezone.now() - timedelta(minutes=30)
    admin = world.client(world.admin)
    with receiver(answers=[200] * 20) as rx:
        r = admin.post("/api/v1/teams/vision/webhooks/", {"url": rx.url}, format="json")
        assert r.status_code == 201, r.content
        rx.secret = r.json()["secret"]
        # (The whole run: a cycle's events go out in one message per transaction.)
        with django_capture_on_commit_callbacks(execute=True):
            job = _run(world, at=t0)
            _sim().reclaim_node(job.placement[0], now=t0 + timedelta(seconds=30))
            scheduler_cycle(now=t0 + timedelta(seconds=31))
        sent = [g.verified for g in rx.received if g.verified is not None]
    moves = [(m["type"], m["data"]["attempt"]) for m in sent
             if m["data"].get("job_id") == job.pk]
    assert ("job.preempted", 1) in moves and ("job.queued", 2) in moves
    assert "job.failed" not in {t for t, _ in moves}


def test_k6_the_simulated_node_comes_back_empty_when_told() -> None:
    sim = SimulatedCluster.from_spec("2x8xh100")
    with pytest.raises(SimulatedClusterError, match="no simulated node"):
        sim.reclaim_node("sim-h100-009", now=T0)
    assert sim.reclaim_node("sim-h100-000", now=T0) == []
    assert [n.name for n in sim.nodes()] == ["sim-h100-001"]
    with pytest.raises(SimulatedClusterError, match="was not reclaimed"):
        sim.restore_node("sim-h100-001")
    sim.restore_node("sim-h100-000")
    assert sorted((n.name, n.free) for n in sim.nodes()) == [("sim-h100-000", 8),
                                                              ("sim-h100-001", 8)]


# --- what a backend reports it with -------------------------------------------------------

def test_k6_the_reason_names_the_node_and_only_a_failed_status_carries_it() -> None:
    reason = spot_reclaimed_reason("gpu-spot-0", "tainted fairq.io/reclaim")
    assert reason == "spot_reclaimed: node gpu-spot-0 tainted fairq.io/reclaim"
    failed = WorkloadStatus(name="fq-1-1", job_id=1, attempt=1, phase=Phase.FAILED,
                            reason=reason)
    assert spot_reclaimed_node(failed) == "gpu-spot-0"
    assert spot_reclaimed_node(WorkloadStatus(name="fq-1-1", job_id=1, attempt=1,
                                              phase=Phase.RUNNING, reason=reason)) is None
    assert spot_reclaimed_node(WorkloadStatus(
        name="fq-1-1", job_id=1, attempt=1, phase=Phase.FAILED,
        reason="exit code 1: spot_reclaimed: node x deleted")) is None


def _node(labels: dict[str, str] | None = None,
          taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "n", "labels": labels or {}}, "spec": {"taints": taints or []}}


SPOT = parse_node_matches(k8s_api.SPOT_NODE_LABELS, what="labels")
TERMINATION = parse_node_matches(k8s_api.SPOT_TERMINATION_TAINTS, what="taints")


@pytest.mark.parametrize(("labels", "spot"), [
    ({"cloud.google.com/gke-spot": "true"}, True),
    ({"cloud.google.com/gke-preemptible": "true"}, True),
    ({"karpenter.sh/capacity-type": "spot"}, True),
    ({"karpenter.sh/capacity-type": "on-demand"}, False),
    ({"eks.amazonaws.com/capacityType": "SPOT"}, True),
    ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, False),
    ({"kubernetes.azure.com/scalesetpriority": "spot"}, True),
    ({"fairq.io/spot": "true"}, True),
    ({"fairq.io/spot": "false"}, False),
    ({}, False),
])
def test_k4_a_node_is_spot_by_the_clouds_labels(labels: dict[str, str], spot: bool) -> None:
    assert node_is_spot(_node(labels), SPOT) is spot


@pytest.mark.parametrize(("node", "mark"), [
    (_node(taints=[{"key": "cloud.google.com/impending-node-termination",
                    "effect": "NoSchedule"}]),
     "tainted cloud.google.com/impending-node-termination"),
    (_node(taints=[{"key": "aws-node-termination-handler/spot-itn", "value": "i-0abc",
                    "effect": "NoSchedule"}]),
     "tainted aws-node-termination-handler/spot-itn"),
    (_node(taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]),
     "tainted karpenter.sh/disrupted"),
    (_node(taints=[{"key": "karpenter.sh/disruption", "value": "disrupting",
                    "effect": "NoSchedule"}]), "tainted karpenter.sh/disruption"),
    (_node(labels={"fairq.io/reclaim": "now"}), "labelled fairq.io/reclaim"),
    (_node(taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
     None),
    (_node(), None),
])
def test_k6_a_termination_taint_or_label_marks_a_node(node: dict[str, Any],
                                                       mark: str | None) -> None:
    assert node_termination_mark(node, TERMINATION) == mark


def test_k6_a_match_with_a_value_wants_that_value() -> None:
    wanted = parse_node_matches(["example.com/going=yes"], what="x")
    assert node_termination_mark(_node(labels={"example.com/going": "yes"}), wanted)
    assert node_termination_mark(_node(labels={"example.com/going": "no"}), wanted) is None


@pytest.mark.parametrize("bad", ["", "=spot", "a b", "-x", "x=a b", "x=" + "v" * 64,
                                 "Bad_Prefix.com/x"])
def test_the_spot_settings_refuse_what_is_no_label_key(bad: str) -> None:
    with pytest.raises(ValueError, match=r"FAIRQ_SPOT_NODE_LABELS: .* is not a label"):
        parse_node_matches([bad], what="FAIRQ_SPOT_NODE_LABELS")


def test_the_spot_settings_default_to_the_backends_defaults(monkeypatch: Any) -> None:
    import os

    if "FAIRQ_SPOT_NODE_LABELS" in os.environ or "FAIRQ_SPOT_TERMINATION_TAINTS" in os.environ:
        pytest.skip("the environment sets the spot settings")
    assert tuple(settings.FAIRQ_SPOT_NODE_LABELS) == k8s_api.SPOT_NODE_LABELS
    assert tuple(settings.FAIRQ_SPOT_TERMINATION_TAINTS) == k8s_api.SPOT_TERMINATION_TAINTS


def test_k6_the_tracker_keeps_a_reclamation_until_the_job_is_gone() -> None:
    tracker = WorkloadTracker()
    tracker.node_reclaimed("gpu-spot-0", "tainted fairq.io/reclaim", at=T0)
    tracker.node_reclaimed("gpu-spot-0", "deleted", at=T0 + timedelta(seconds=5))
    assert tracker.reclaimed_nodes() == {"gpu-spot-0": ("tainted fairq.io/reclaim", T0)}
    tracker.workload_reclaimed("fq-1-1", "gpu-spot-0", "deleted", at=T0)
    tracker.workload_reclaimed("fq-1-1", "gpu-spot-1", "deleted", at=T0)  # the first stays
    tracker.node_back("gpu-spot-0")
    assert tracker.reclaimed_nodes() == {}
    assert tracker.reclaimed("fq-1-1") == ("gpu-spot-0", "deleted", T0)  # sticky
    tracker.deleted("fq-1-1")
    assert tracker.reclaimed("fq-1-1") is None


@pytest.mark.django_db
def test_k6_a_gang_with_one_replica_on_the_reclaimed_node_is_requeued_whole(
        world: World) -> None:
    t0 = timezone.now() - timedelta(minutes=30)
    job = _run(world, at=t0, gpus=8, replicas=2)  # one replica per h100 node
    assert sorted(job.placement) == ["sim-h100-000", "sim-h100-001"]
    _sim().reclaim_node("sim-h100-001", now=t0 + timedelta(seconds=10))
    # The other replica's node has its GPUs back at once (all or nothing).
    assert {n.name: n.free for n in _sim().nodes() if n.gpu_type == "h100"} == {
        "sim-h100-000": 8}
    scheduler_cycle(now=t0 + timedelta(seconds=11))
    job.refresh_from_db()
    assert job.attempt == 2 and job.status == "QUEUED"  # 16 GPUs no longer fit
    usage = UsageRecord.objects.get(job=job, attempt=1)
    assert usage.gpus == 16 and usage.gpu_seconds == 16 * 10
    assert not [s for s in _sim().statuses(now=t0 + timedelta(seconds=11))
                if s.job_id == job.pk]
    # The node comes back: the job runs again, both replicas.
    _sim().restore_node("sim-h100-001")
    scheduler_cycle(now=t0 + timedelta(seconds=12))
    scheduler_cycle(now=t0 + timedelta(seconds=13))
    job.refresh_from_db()
    assert job.status == "RUNNING" and job.attempt == 2
    assert sorted(job.placement) == ["sim-h100-000", "sim-h100-001"]
