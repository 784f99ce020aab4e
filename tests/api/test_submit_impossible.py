"""Rules A3, K1, K3, K4, K8 at submit (docs/scheduling.md, "Ordering and admission"): a
job whose replicas no one cluster that takes new work could hold, even with every node
empty, is refused with a 400 on `replicas` naming the largest possible - on every submit
path: the DRF view, the submit fast path, the submit lane, arrays, the web form (and a
job file through the CLI: tests/cli/test_cli_submit_impossible.py). A queued job that a
change makes impossible (a cluster disabled) waits as `gang_does_not_fit`, not as a
quota to raise (rule E6)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from accounts.services import token_issue
from queueing.api.lane import SubmitLane
from queueing.memo import forget_all
from queueing.models import Cluster, Job, JobArray, Quota
from queueing.selectors.queue_plan import queue_plan_forget
from queueing.services.scheduler import scheduler_cycle
from tests.api.test_submit_lane import _call
from tests.conftest import World, job_body
from tests.web.test_pages import form_body, login

pytestmark = pytest.mark.django_db

# 48 h100 GPUs in all: 32 in east, 16 in west (rule K1: a job runs in one of them).
FLEET = {"east": "4x8xh100", "west": "2x8xh100"}
LARGEST_EAST = "The largest possible is 4 replicas (32 GPUs)."


@pytest.fixture
def fleet(world: World) -> World:
    for name, nodes in FLEET.items():
        Cluster.objects.create(name=name, backend="simulated", sim_nodes=nodes)
    return world


def _drf(world: World, body: dict[str, Any]) -> Any:
    """The DRF view (an Idempotency-Key sends a submit there, not to the fast path)."""
    return world.client(world.member).post("/api/v1/jobs/", body, format="json",
                                           HTTP_IDEMPOTENCY_KEY="k-impossible")


def _fast(world: World, body: dict[str, Any]) -> Any:
    """The submit fast path (queueing/api/jobs.py): a plain token submit."""
    return world.client(world.member).post("/api/v1/jobs/", body, format="json")


def _lane(world: World, body: dict[str, Any]) -> Any:
    """The submit lane around the WSGI application (queueing/api/lane.py)."""
    from django.core.handlers.wsgi import WSGIHandler

    return _call(SubmitLane(WSGIHandler()), token_issue(user=world.member).key, body)


PATHS = {"drf": _drf, "fast": _fast, "lane": _lane}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_rule_k1_64_replicas_of_8_h100_on_a_48_gpu_fleet_is_a_400_naming_the_largest(
        fleet: World, path: str) -> None:
    r = PATHS[path](fleet, job_body(gpus=8, replicas=64))
    assert r.status_code == 400, r.json()
    body = r.json()["error"]
    assert body["code"] == "invalid", body
    message = body["fields"]["replicas"][0]
    assert message.startswith("At most 4 replicas of 8 h100 GPUs fit in one cluster even "
                              "when empty (rules A3, K1: the most in cluster east, 32 h100 "
                              "GPUs that take new work); this job asks 64 (512 GPUs).")
    assert message.endswith(LARGEST_EAST)
    assert not Job.objects.exists()


@pytest.mark.parametrize("path", sorted(PATHS))
def test_rule_k1_a_gang_the_fleet_holds_only_across_clusters_is_refused(
        fleet: World, path: str) -> None:
    # 40 GPUs <= 48 in all, but no one cluster holds 5 replicas of 8.
    r = PATHS[path](fleet, job_body(gpus=8, replicas=5))
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["replicas"][0].endswith(LARGEST_EAST)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_rule_k1_the_largest_possible_gang_is_accepted(fleet: World, path: str) -> None:
    r = PATHS[path](fleet, job_body(gpus=8, replicas=4))
    assert r.status_code == 201, r.json()


def test_rule_k3_a_pinned_job_counts_its_cluster_only(fleet: World) -> None:
    for path in PATHS.values():
        r = path(fleet, job_body(gpus=8, replicas=3, requested_cluster="west"))
        assert r.status_code == 400
        message = r.json()["error"]["fields"]["replicas"][0]
        assert "fit in one cluster of cluster west even when empty" in message
        assert message.endswith("The largest possible is 2 replicas (16 GPUs).")
    assert _fast(fleet, job_body(gpus=8, replicas=2, requested_cluster="west")).status_code \
        == 201


def test_rule_k8_a_disabled_clusters_nodes_do_not_count(fleet: World) -> None:
    Cluster.objects.filter(name="east").update(enabled=False)
    forget_all()
    r = _fast(fleet, job_body(gpus=8, replicas=3))
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["replicas"][0].endswith(
        "The largest possible is 2 replicas (16 GPUs).")


def test_without_clusters_the_one_implicit_cluster_is_counted(world: World) -> None:
    # The test settings' simulated cluster: 2 nodes of 8 h100.
    r = _fast(world, job_body(gpus=4, replicas=5))
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["replicas"] == [
        "At most 4 replicas of 4 h100 GPUs fit on the h100 nodes even when empty (rule A3: "
        "16 GPUs that take new work); this job asks 5 (20 GPUs). The largest possible is 4 "
        "replicas (16 GPUs)."]


def test_an_array_of_impossible_members_is_refused_whole(fleet: World) -> None:
    body = {**job_body(gpus=8, replicas=64), "count": 10}
    r = fleet.client(fleet.member).post("/api/v1/jobs/bulk/", body, format="json")
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["replicas"][0].endswith(LARGEST_EAST)
    assert not JobArray.objects.exists() and not Job.objects.exists()


def test_the_web_form_shows_the_refusal_on_the_replicas_field(fleet: World) -> None:
    r = login(fleet.member).post("/jobs/new/", form_body(gpus="8", replicas="64"))
    assert r.status_code == 400
    html = r.content.decode()
    errors = html[html.index('id="replicas-errors"'):]
    assert LARGEST_EAST in errors[:errors.index("</ul>")]
    assert not Job.objects.exists()


def test_rule_e6_a_queued_job_no_cluster_holds_any_more_waits_as_gang_does_not_fit(
        fleet: World) -> None:
    """Accepted while east took new work (3 × 8 fit there, beyond vision's ceiling of 16:
    `never_fits`, a quota to raise); east disabled, no cluster can hold it: raising the
    quota would not help, and the wait says so."""
    r = _fast(fleet, job_body(gpus=8, replicas=3))
    assert r.status_code == 201, r.json()
    job_id = r.json()["id"]
    scheduler_cycle(now=timezone.now())
    client = fleet.client(fleet.member)
    assert client.get(f"/api/v1/jobs/{job_id}/").json()["queue"]["reason"]["code"] == \
        "never_fits"
    Cluster.objects.filter(name="east").update(enabled=False)
    forget_all()
    scheduler_cycle(now=timezone.now())
    queue_plan_forget()  # as the commit would (the test's transaction never commits)
    reason = client.get(f"/api/v1/jobs/{job_id}/").json()["queue"]["reason"]
    assert reason["code"] == "gang_does_not_fit", reason
    # (and the memory every submitted job has: 8 GPUs x FAIRQ_DEFAULT_MEMORY_PER_GPU)
    assert "hold at most 2 replicas of 8 GPUs and 256Gi memory; this gang needs 3" \
        in reason["message"]
    assert Quota.objects.filter(team=fleet.vision, gpu_type=fleet.h100).exists()
    assert json.dumps(reason).find("quota") == -1
