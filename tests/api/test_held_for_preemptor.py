"""Rule E2 end to end: a preemptor whose victims are still releasing their GPUs keeps
what is free of its planned placement (the `placement` of its `preempting` event, rule
R7), and the job that would have taken it is told `held_for_preemptor` in the list and
the detail, while `/capacity/` shows those GPUs free."""

from __future__ import annotations

from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import JobEvent
from queueing.selectors.snapshot import build_snapshot
from tests.conftest import World
from tests.factories import JobFactory


def test_rule_e2_the_nominated_preemptors_placement_reaches_the_plan(world: World) -> None:
    now = timezone.now()
    node = next(n.name for n in get_backend().nodes() if n.gpu_type == "h100")
    preemptor = JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.high,
                           gpus_per_replica=8)
    # Its victim's workload is still listed: it may still hold GPUs (rule R8).
    JobEvent.objects.create(job=preemptor, at=now, kind=JobEvent.Kind.PREEMPTING,
                            attempt=preemptor.attempt, actor_label="scheduler",
                            reason="preempted 1 job(s)",
                            data={"victims": [999], "workloads": ["fq-999-1"],
                                  "placement": [node]})
    snapshot = build_snapshot(backend=get_backend(), now=now, live_workloads={"fq-999-1"})
    assert snapshot.nominated == {preemptor.pk: 1}
    assert snapshot.nominated_placement == {preemptor.pk: (node,)}

    # The node is free in the cluster (the victim's pod is gone, the list lags): a
    # normal job that would fit there waits for job #preemptor, by name.
    other = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                       gpus_per_replica=8, replicas=2)
    client = world.client(world.member)
    listed = {j["id"]: j for j in client.get("/api/v1/jobs/?status=QUEUED").json()["results"]}
    reason = listed[other.pk]["reason"]
    assert reason["code"] == "held_for_preemptor", reason
    assert f"held for job #{preemptor.pk}" in reason["message"]
    assert client.get(f"/api/v1/jobs/{other.pk}/").json()["queue"]["reason"] == reason
    free = {n["name"]: n["free"] for r in client.get("/api/v1/capacity/").json()
            for n in r["by_node"]}
    assert free[node] == 8
