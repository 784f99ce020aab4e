"""Arrays stored compactly (docs/scheduling.md, "Arrays"): submit writes the
array and a window of members as rows, each cycle writes more before its snapshot, and
everything that counts an array's members (its summary, rules D1-D2, its cancel, rule A8,
the dashboard's queued counts) counts the members not written yet too."""

from __future__ import annotations

import os
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queueing.models import Job, JobArray, JobEvent
from queueing.policy.states import FINAL_STATES, HOLDING_STATES, JobState
from queueing.selectors.arrays import array_summary, job_dependencies
from queueing.selectors.capacity import capacity_by_gpu_type
from queueing.selectors.dashboard import cluster_overview
from queueing.selectors.metrics import queue_depth
from queueing.services import arrays as array_services
from queueing.services.arrays import ARRAY_WINDOW, array_window, arrays_top_up
from queueing.services.jobs import ARRAY_SUBMIT_WINDOW
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db


def bulk(world: World, **body: Any) -> dict[str, Any]:
    r = world.client(world.member).post(
        "/api/v1/jobs/bulk/", {**job_body(name="sweep", gpus=1, gpu_type="a100"), **body},
        format="json")
    assert r.status_code == 201, r.json()
    out: dict[str, Any] = r.json()
    return out


def summary(world: World, array_id: int) -> dict[str, Any]:
    r = world.client(world.member).get(f"/api/v1/arrays/{array_id}/")
    assert r.status_code == 200
    out: dict[str, Any] = r.json()
    return out


def rows(array_id: int) -> int:
    return Job.objects.filter(array_id=array_id).count()


def test_an_array_of_10000_is_accepted_with_only_its_window_as_rows(world: World) -> None:
    bulk(world, count=100)  # the first request of a process reads what it keeps
    with CaptureQueriesContext(connection) as small:
        bulk(world, count=100)
    with CaptureQueriesContext(connection) as large:
        out = bulk(world, count=10_000, max_running=500)
    # The same statements for 100 and 10,000 members: the size is a number on one row.
    assert len(large.captured_queries) == len(small.captured_queries)
    assert out["count"] == 10_000 and len(out["ids"]) == ARRAY_SUBMIT_WINDOW
    assert rows(out["array_id"]) == ARRAY_SUBMIT_WINDOW
    members = list(Job.objects.filter(array_id=out["array_id"]).order_by("array_index"))
    assert [m.pk for m in members] == out["ids"]
    assert [(m.array_index, m.name, m.env["FAIRQ_ARRAY_INDEX"], m.env["FAIRQ_ARRAY_SIZE"])
            for m in members] == [(i, f"sweep-{i}", str(i), "10000")
                                  for i in range(ARRAY_SUBMIT_WINDOW)]
    # Each member written has its submit event; the array has one for all of them.
    assert JobEvent.objects.filter(job__array_id=out["array_id"]).count() == ARRAY_SUBMIT_WINDOW
    s = summary(world, out["array_id"])
    assert s["counts"]["QUEUED"] == 10_000 and s["materialized"] == ARRAY_SUBMIT_WINDOW
    assert s["done"] is False and s["max_running"] == 500
    assert [(e["kind"], e["actor"]) for e in s["events"]] == [("submitted", "dave")]
    assert s["events"][0]["reason"].startswith(
        f"submitted 10000 tasks ({ARRAY_SUBMIT_WINDOW} queued as jobs now")
    # A small array is whole at submit, as before.
    small_out = bulk(world, count=ARRAY_SUBMIT_WINDOW)
    assert len(small_out["ids"]) == ARRAY_SUBMIT_WINDOW
    assert summary(world, small_out["array_id"])["materialized"] == ARRAY_SUBMIT_WINDOW


def test_every_task_runs_exactly_once_across_cycles_indices_0_to_n_minus_1(
        world: World, settings: Any) -> None:
    """1,000 one-GPU tasks of 1 s on 16 nodes of 8 A100s (10,000 on 50 nodes with
    FAIRQ_TEST_ARRAY_TASKS=10000, the size docs/performance.md measures: 8 minutes on a 2-core machine): each
    cycle tops the array's queued rows up before its snapshot, so the cluster is kept
    full (the window never holds the array back) while the queued rows never exceed one
    window."""
    n = int(os.environ.get("FAIRQ_TEST_ARRAY_TASKS", "1000"))  # 10000: 8 minutes here
    nodes = 16 if n <= 2000 else 50
    settings.FAIRQ_SIM_NODES = f"{nodes}x8xa100"
    # Every cycle records all its ends: on a loaded machine step 1 could spend its share
    # of the default budget and leave ends to the next cycle, their GPUs still held.
    settings.FAIRQ_CYCLE_BUDGET_SECONDS = 45
    gpus = nodes * 8
    t0 = timezone.now() + timedelta(seconds=1)
    out = bulk(world, count=n, env={"FAIRQ_SIM_SECONDS": "1"})
    array_id = out["array_id"]
    peak_rows_queued = 0
    for step in range(200):
        result = scheduler_cycle(now=t0 + timedelta(seconds=2 * step))
        queued = Job.objects.filter(array_id=array_id, status=JobState.QUEUED).count()
        holding = Job.objects.filter(array_id=array_id, status__in=list(HOLDING_STATES)).count()
        peak_rows_queued = max(peak_rows_queued, queued)
        s = array_summary(JobArray.objects.get(pk=array_id))
        if step >= 1 and s["counts"]["QUEUED"] >= gpus:
            # From the second cycle on (the first has no published cluster view yet), the
            # window fills the cluster: every GPU is held while enough members are left.
            assert holding == gpus, (step, holding, queued, result.timings)
        if s["done"]:
            break
    else:
        pytest.fail(f"not done after 200 cycles: {s['counts']}")
    assert step <= n // gpus + 3  # one wave of 400 per cycle, plus the ramp and the tail
    assert peak_rows_queued <= max(ARRAY_WINDOW, gpus)
    members = list(Job.objects.filter(array_id=array_id).values_list("array_index", "status",
                                                                     "attempt"))
    assert sorted(i for i, _, _ in members) == list(range(n))  # each index exactly once
    assert {(st, a) for _, st, a in members} == {(JobState.SUCCEEDED.value, 1)}
    # Every member ran once: one RUNNING transition each.
    ran = Counter(JobEvent.objects.filter(job__array_id=array_id, kind=JobEvent.Kind.TRANSITION,
                                          to_status=JobState.RUNNING).values_list("job_id", flat=True))
    assert len(ran) == n and set(ran.values()) == {1}
    assert s["counts"]["SUCCEEDED"] == n and s["materialized"] == n


def test_cancel_midway_leaves_no_row_for_the_rest(world: World, settings: Any) -> None:
    settings.FAIRQ_SIM_NODES = "4x8xa100"
    t0 = timezone.now() + timedelta(seconds=1)
    out = bulk(world, count=1000, env={"FAIRQ_SIM_SECONDS": "1"})
    array_id = out["array_id"]
    for step in range(3):
        scheduler_cycle(now=t0 + timedelta(seconds=2 * step))
    written = rows(array_id)
    assert ARRAY_SUBMIT_WINDOW < written < 1000
    assert JobArray.objects.get(pk=array_id).materialized == written
    r = world.client(world.member).delete(f"/api/v1/arrays/{array_id}/")
    assert r.status_code == 200
    body = r.json()
    not_ended = set(Job.objects.filter(array_id=array_id, status=JobState.CANCELLED)
                    .values_list("pk", flat=True))
    assert sorted(not_ended) == body["cancelled"]  # ids only of rows: the rest has none
    succeeded = Job.objects.filter(array_id=array_id, status=JobState.SUCCEEDED).count()
    assert body["array"]["counts"]["CANCELLED"] == 1000 - succeeded
    assert body["array"]["counts"]["QUEUED"] == 0 and body["array"]["done"] is True
    assert body["cancelled_not_written"] == 1000 - written
    cancelled = body["array"]["events"][-1]
    assert cancelled["kind"] == "cancelled" and cancelled["actor"] == "dave"
    assert f"{1000 - written} tasks not yet queued as jobs cancelled" in cancelled["reason"]
    assert cancelled["data"] == {"from_index": written, "tasks": 1000 - written}
    # Later cycles write nothing more for it.
    for step in range(3, 6):
        scheduler_cycle(now=t0 + timedelta(seconds=2 * step))
    assert rows(array_id) == written
    assert arrays_top_up(now=t0 + timedelta(seconds=20)) == {}
    assert summary(world, array_id)["counts"]["CANCELLED"] == 1000 - succeeded


def test_rule_D1_after_ok_on_the_array_waits_for_the_members_not_written(
        world: World, settings: Any) -> None:
    """Every member written has succeeded, but 8 are not rows yet: the dependent job
    waits (D1: every member), the cycle writes and runs them, then it is admitted."""
    t0 = timezone.now() + timedelta(seconds=1)
    out = bulk(world, count=ARRAY_SUBMIT_WINDOW + 8, env={"FAIRQ_SIM_SECONDS": "1"})
    array_id = out["array_id"]
    r = world.client(world.member).post(
        "/api/v1/jobs/", {**job_body(name="reduce", gpus=1, gpu_type="a100"),
                          "dependencies": [{"type": "after_ok", "array": array_id}]},
        format="json")
    assert r.status_code == 201, r.json()
    after = Job.objects.get(pk=r.json()["id"])
    Job.objects.filter(array_id=array_id).update(status=JobState.SUCCEEDED, finished_at=t0)
    assert [d["verdict"] for d in job_dependencies(after)] == ["waiting"]
    # "after_any" too: the members not written have not ended.
    s = summary(world, array_id)
    assert (s["counts"]["SUCCEEDED"], s["counts"]["QUEUED"], s["done"]) == (
        ARRAY_SUBMIT_WINDOW, 8, False)
    # The first cycle writes the 8 (before its snapshot) and admits them, not the job.
    result = scheduler_cycle(now=t0)
    assert after.pk not in result.admitted and rows(array_id) == ARRAY_SUBMIT_WINDOW + 8
    for step in range(1, 10):
        result = scheduler_cycle(now=t0 + timedelta(seconds=2 * step))
        if after.pk in result.admitted:  # once every member, written late or not, succeeded
            assert summary(world, array_id)["counts"]["SUCCEEDED"] == ARRAY_SUBMIT_WINDOW + 8
            break
    else:
        pytest.fail("the job after the array was never admitted")


def test_rule_D2_a_cancelled_rest_is_never_ok_and_ends_after_any(world: World) -> None:
    out = bulk(world, count=ARRAY_SUBMIT_WINDOW + 8)
    array_id = out["array_id"]
    deps = {kind: world.client(world.member).post(
        "/api/v1/jobs/", {**job_body(name=f"dep-{kind}".replace("_", "-"), gpus=1),
                          "dependencies": [{"type": kind, "array": array_id}]},
        format="json").json()["id"] for kind in ("after_ok", "after_any")}
    Job.objects.filter(array_id=array_id).update(status=JobState.SUCCEEDED)
    array = JobArray.objects.get(pk=array_id)
    array_services.array_cancel(actor=world.member, array=array)
    verdicts = {kind: job_dependencies(Job.objects.get(pk=pk))[0]["verdict"]
                for kind, pk in deps.items()}
    assert verdicts == {"after_ok": "never", "after_any": "met"}


def test_rule_A8_the_limit_holds_and_bounds_the_window(world: World, settings: Any) -> None:
    settings.FAIRQ_SIM_NODES = "8x8xa100"
    t0 = timezone.now() + timedelta(seconds=1)
    out = bulk(world, count=300, max_running=5, env={"FAIRQ_SIM_SECONDS": "3"})
    array_id = out["array_id"]
    peak, topped_up = 0, False
    for step in range(40):
        scheduler_cycle(now=t0 + timedelta(seconds=2 * step))
        holding = Job.objects.filter(array_id=array_id, status__in=list(HOLDING_STATES)).count()
        queued = Job.objects.filter(array_id=array_id, status=JobState.QUEUED).count()
        assert holding <= 5
        peak = max(peak, holding)
        # Rows queued: the submit's window used up, then the window is the limit's 5.
        assert queued <= ARRAY_SUBMIT_WINDOW
        topped_up = topped_up or rows(array_id) > ARRAY_SUBMIT_WINDOW
        if topped_up:
            assert queued <= 5
    assert peak == 5 and topped_up
    # 5 at a time, 3 s each, a cycle every 2 s: about 100 members ended in 40 cycles,
    # and the rest has no row yet.
    ended = Job.objects.filter(array_id=array_id,
                               status__in=[s.value for s in FINAL_STATES]).count()
    assert ended >= 80 and rows(array_id) <= ended + 5 + 5


def test_the_window_fills_the_gpus_of_its_type_within_the_limit() -> None:
    assert array_window(gpus_of_type=0, task_gpus=1, max_running=None) == ARRAY_WINDOW
    assert array_window(gpus_of_type=400, task_gpus=1, max_running=None) == 400
    assert array_window(gpus_of_type=400, task_gpus=8, max_running=None) == ARRAY_WINDOW
    assert array_window(gpus_of_type=4000, task_gpus=8, max_running=None) == 500
    assert array_window(gpus_of_type=400, task_gpus=1, max_running=7) == 7


def test_the_dashboard_quota_board_and_metrics_count_the_members_not_written(world: World) -> None:
    out = bulk(world, count=1000, gpus=2)
    overview = {o.team.slug: o for o in cluster_overview(standings=[])}
    assert overview["vision"].queued_jobs == 1000
    assert overview["vision"].queued_gpus == {"a100": 2000}
    assert ("vision", "normal", 1000) in queue_depth()
    # The quota board's column of the GPU type: the queued demand of every member.
    rows_by_type = {r.gpu_type: r for r in capacity_by_gpu_type(nodes=[])[0]}
    assert rows_by_type["a100"].queued_demand == 2000
    array_services.array_cancel(actor=world.member, array=JobArray.objects.get(pk=out["array_id"]))
    overview = {o.team.slug: o for o in cluster_overview(standings=[])}
    assert overview["vision"].queued_jobs == 0


def test_members_written_by_the_cycle_are_posted_queued_to_webhooks(
        world: World, django_capture_on_commit_callbacks: Any) -> None:
    """Every state change is an event someone can read: a member written late gets its
    `job.queued` delivery when the cycle writes it, once."""
    from tests.webhooks.receiver import receiver

    admin = world.client(world.admin)
    with receiver() as rx:
        rx.secret = admin.post("/api/v1/teams/vision/webhooks/", {"url": rx.url},
                               format="json").json()["secret"]
        with django_capture_on_commit_callbacks(execute=True):
            out = bulk(world, count=ARRAY_SUBMIT_WINDOW + 8)
        with django_capture_on_commit_callbacks(execute=True):
            written = arrays_top_up(now=timezone.now())
    assert [len(ids) for ids in written.values()] == [8]
    got = sorted(g.verified["data"]["job_id"] for g in rx.received
                 if g.verified["type"] == "job.queued")
    assert got == sorted(out["ids"] + written[out["array_id"]])
    assert rows(out["array_id"]) == ARRAY_SUBMIT_WINDOW + 8
