"""Rules R1, R4, R6-R8 end to end, through the REST API on the simulated cluster
(2 × 8 h100 in the test settings): a low tier fills the cluster, a high-tier job
arrives, the cheapest victim set is preempted, it runs, the victim requeues and
runs later, and the events say why."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import UsageRecord
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body

# R9 off: these tests submit at the wall clock and run cycles at chosen instants (no_r9).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_r9")]


def post(world: World, user: Any, **body: Any) -> int:
    r = world.client(user).post("/api/v1/jobs/", job_body(**body), format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def get(world: World, user: Any, job_id: int) -> dict[str, Any]:
    r = world.client(user).get(f"/api/v1/jobs/{job_id}/")
    assert r.status_code == 200, r.json()
    data: dict[str, Any] = r.json()
    return data


def h100_allocated() -> int:
    return sum(n.allocated for n in get_backend().nodes() if n.gpu_type == "h100")



def test_a_high_tier_job_preempts_the_cheapest_low_tier_set_and_the_victim_runs_later(
    world: World,
) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    # 1. The low tier fills both h100 nodes: one 8-GPU job (node 000, best fit by name)
    #    and four 2-GPU jobs (node 001), all long-running.
    big = post(world, world.member, name="big", tier="low", gpus=8,
               env={"FAIRQ_SIM_SECONDS": "300"})
    small = [post(world, world.member, name=f"small-{i}", tier="low", gpus=2,
                  env={"FAIRQ_SIM_SECONDS": "5000"}) for i in range(4)]
    r = scheduler_cycle(now=t0)
    assert sorted(r.admitted) == sorted([big, *small])
    scheduler_cycle(now=t0 + timedelta(seconds=10))
    assert all(get(world, world.member, j)["status"] == "RUNNING" for j in [big, *small])
    assert h100_allocated() == 16

    # 2. A high-tier 8-GPU job of another team arrives. The four 2-GPU jobs would lose as
    #    much work as the one 8-GPU job (8 GPUs × 20 s either way) and are of the same
    #    tier: on that tie, fewer victims (rule R4) - the one 8-GPU job.
    submitted = get(world, world.member, big)["created_at"]
    gang = post(world, world.outsider, team="nlp", name="gang", tier="high", gpus=8,
                env={"FAIRQ_SIM_SECONDS": "600"})
    t1 = t0 + timedelta(seconds=20)
    r = scheduler_cycle(now=t1)
    assert r.preempted == [big] and r.admitted == []
    victim = get(world, world.member, big)
    assert victim["status"] == "QUEUED" and victim["attempt"] == 2
    assert victim["placement"] == [] and victim["started_at"] is None
    # Requeued with its submit time (rule R6): the same created_at as before.
    assert victim["created_at"] == submitted
    # Its 20 s on 8 GPUs are charged to the attempt that used them (rule R6).
    usage = UsageRecord.objects.get(job_id=big, attempt=1)
    assert usage.gpu_seconds == 8 * 20
    assert all(get(world, world.member, j)["status"] == "RUNNING" for j in small)
    assert h100_allocated() == 8  # the simulated cluster frees the victim at once

    # 3. The events say who preempted whom and by which rule (rule R7).
    preempted = [e for e in victim["events"] if e["kind"] == "preempted"]
    assert len(preempted) == 1
    assert preempted[0]["data"]["rule"] == "R1-priority"
    assert preempted[0]["data"]["preemptor"] == gang
    assert f"#{gang}" in preempted[0]["reason"]
    transitions = [(e["from_status"], e["to_status"]) for e in victim["events"]
                   if e["kind"] == "transition"]
    assert transitions[-2:] == [("RUNNING", "PREEMPTED"), ("PREEMPTED", "QUEUED")]
    g = get(world, world.outsider, gang)
    (preempting,) = [e for e in g["events"] if e["kind"] == "preempting"]
    assert preempting["data"]["victims"] == [big]
    assert preempting["reason"].startswith("preempted 1 job(s)")
    assert g["status"] == "QUEUED"  # admitted by a later cycle (rule R8)

    # 4. The next cycle admits the gang on the freed node; the victim waits.
    r = scheduler_cycle(now=t1 + timedelta(seconds=1))
    assert r.admitted == [gang] and r.preempted == []
    assert set(get(world, world.outsider, gang)["placement"]) == {"sim-h100-000"}
    scheduler_cycle(now=t1 + timedelta(seconds=2))
    assert get(world, world.outsider, gang)["status"] == "RUNNING"
    assert get(world, world.member, big)["status"] == "QUEUED"

    # 5. When the gang is done, the victim runs again, as attempt 2.
    t2 = t1 + timedelta(seconds=1 + 600)
    r = scheduler_cycle(now=t2)
    assert gang in r.finished and big in r.admitted
    scheduler_cycle(now=t2 + timedelta(seconds=1))
    victim = get(world, world.member, big)
    assert victim["status"] == "RUNNING" and victim["attempt"] == 2
    scheduler_cycle(now=t2 + timedelta(seconds=400))
    assert get(world, world.member, big)["status"] == "SUCCEEDED"
    assert get(world, world.outsider, gang)["status"] == "SUCCEEDED"
