"""Rule P3 from the plan the scheduler cycle publishes (queueing/selectors/queue_plan.py):
the same answers as a request's own plan of the queue (`plan_entries`, `_plan_compute`),
column by column over random queues and end to end through a cycle; no web read plans
the queue while a published plan is there; and without one a long queue says
"planning" rather than being planned in a request."""

from __future__ import annotations

import pickle
import random
from dataclasses import fields, replace
from typing import Any
from unittest import mock

import pytest
from django.utils import timezone
from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy import admission
from queueing.policy.admission import plan_admissions
from queueing.policy.explain import PlanEntry
from queueing.policy.snapshot import Snapshot
from queueing.selectors import queue_plan as qp
from queueing.services import scheduler
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body
from .policy import test_fleet_fast_paths, test_plan_fast_paths
from .policy.test_plan_properties import TEAMS, snapshots


def _several_types(s: Snapshot, rnd: random.Random) -> Snapshot:
    """Some queued jobs accepting two GPU types (rule G5), when the nodes have two."""
    types = sorted({n.gpu_type for n in s.nodes})
    if len(types) < 2:
        return s
    queued = []
    for q in s.queued:
        if rnd.random() < 0.3:
            pair = tuple(rnd.sample(types, 2))
            q = replace(q, gpu_type=pair[0], gpu_types=pair)
        queued.append(q)
    return replace(s, queued=tuple(queued))


@given(snapshots(), st.integers(0, 2**32))
@settings(max_examples=150, deadline=None)
def test_rule_p3_the_published_plan_answers_as_the_plan_entries(s: Snapshot, seed: int) -> None:
    rnd = random.Random(seed)
    s = _several_types(s, rnd)
    plan = plan_admissions(s)
    admitted = sorted(a.job_id for a in plan.admissions)
    leave_out = set(rnd.sample(admitted, rnd.randint(0, len(admitted))))
    types = sorted({n.gpu_type for n in s.nodes})
    unprovisioned = [(10_000 + i, rnd.choice(TEAMS), rnd.choice(types))
                     for i in range(rnd.randint(0, 3))]
    published = qp.published_plan_of(s, plan, leave_out=leave_out, unprovisioned=unprovisioned)
    expected = qp.plan_entries(s, plan, leave_out=leave_out)
    for n, (job_id, team, gpu_type) in enumerate(unprovisioned, start=len(expected) + 1):
        expected[job_id] = PlanEntry(n, 0, team, gpu_type, "namespace_not_provisioned",
                                     qp._unprovisioned_message(team))
    kept = pickle.loads(pickle.dumps(published))  # as the shared cache keeps it
    for got in (published, kept):
        assert got.queued == len(expected)
        assert {i: got.entry(i) for i in expected} == expected
        assert all(got.entry(i) is None for i in leave_out)
        assert got.entry(-1) is None and got.entry(10**9) is None
        assert got.positions() == {i: e.position for i, e in expected.items()}
        reference = qp.QueuePlan(expected, len(expected))
        for i in expected:
            assert got.standing(i) == reference.standing(i)
            assert got.brief(i) == reference.brief(i)
        for team in (None, *TEAMS, "nobody"):
            assert got.team_order(team) == reference.team_order_reference(team)
            assert got.team_order(team, 2) == reference.team_order_reference(team)[:2]


def _columns(p: qp.PublishedPlan) -> dict[str, Any]:
    return {f.name: getattr(p, f.name) for f in fields(p) if f.name not in ("generation",
                                                                            "made_at")}


@given(st.one_of(test_fleet_fast_paths.big_classes(), test_fleet_fast_paths.fleets(),
                 test_plan_fast_paths.long_queues(), snapshots()),
       st.integers(0, 2**32), st.booleans())
@settings(max_examples=200, deadline=None)
def test_rule_p3_the_plan_read_per_class_is_the_plan_read_per_job(
        s: Snapshot, seed: int, lazy: bool) -> None:
    """The published plan built per class over arrays (`_IN_CLASSES`: each class's
    team, type and accepted types read once, each distinct wait put in words once, rule
    E1 by running counts) and read per class (`_PER_CLASS_READ`: the waits put in words
    once per distinct raw entry and wording, the bulk and the order not expanded)
    against a `Wait` read per job, column by column, with the plan expanded only where
    read (`admission._EXPANDED_ON_READ`) on and off; some jobs of several GPU types
    (rule G5), some with other runtimes (rule A9's words), jobs admitted left out, jobs
    unprovisioned, and a snapshot that lost some planned jobs and gained one the plan
    never saw (there the columns are built per job)."""
    rnd = random.Random(seed)
    s = _several_types(s, rnd) if rnd.random() < 0.3 else s
    s = replace(s, queued=tuple(replace(q, max_runtime_seconds=rnd.choice((None, 600, 60)))
                                if rnd.random() < 0.2 else q for q in s.queued))
    types = sorted({n.gpu_type for n in s.nodes}) or ["h100"]
    unprovisioned = [(90_000 + i, rnd.choice(TEAMS), rnd.choice(types))
                     for i in range(rnd.randint(0, 2))]
    drift = rnd.random() < 0.3
    with mock.patch.object(admission, "_EXPANDED_ON_READ", lazy):
        plans = [plan_admissions(s) for _ in range(3)]
    admitted = sorted(a.job_id for a in plans[0].admissions)
    leave_out = set(rnd.sample(admitted, rnd.randint(0, len(admitted))))
    read = s
    if drift and s.queued:
        kept = [q for q in s.queued if rnd.random() < 0.9]
        read = replace(s, queued=(*kept, replace(s.queued[0], id=80_000)))
    got = []
    real, built = qp._published_in_classes, []

    def in_classes_(*args: Any) -> Any:
        built.append(real(*args))
        return built[-1]

    for (in_classes, per_class), plan in zip(((True, True), (False, True), (False, False)),
                                             plans, strict=True):
        bulk = len(plan.waits.bulk)
        with mock.patch.object(qp, "_PER_CLASS_READ", per_class), \
                mock.patch.object(qp, "_IN_CLASSES", in_classes), \
                mock.patch.object(qp, "_published_in_classes", in_classes_):
            got.append(_columns(qp.published_plan_of(read, plan, leave_out=leave_out,
                                                      unprovisioned=unprovisioned)))
        if per_class and not drift:  # nothing expanded by the read per class
            assert len(plan.waits.bulk) == bulk
    if not (drift and s.queued) and plans[0].waits.classes:  # the arrays were built
        assert len(built) == 1 and built[0] is not None
    assert got[0] == got[2]
    assert got[1] == got[2]


def test_rule_a9_reserved_waits_of_one_class_keep_each_jobs_runtime() -> None:
    """Rule A9's words read a job's `max_runtime_seconds`, which a class of equal jobs
    does not fix: jobs of one class with other runtimes, each waiting on the reservation,
    keep their own words in the columns built per class."""
    from .policy.test_reservation import GANG, HALF, HOLDERS, est, q, snap

    s = snap(nodes=HALF, running=HOLDERS, queued=(
        GANG, est(q(9000, gpus=4), None),
        *(est(q(i, gpus=2), (None, 7200, 5400)[i % 3]) for i in range(10, 40))))
    plans = [plan_admissions(s) for _ in range(2)]
    assert len(set(plans[0].waits.classes[2:])) == 1  # the 2-GPU jobs: one class
    got = []
    for in_classes, plan in zip((True, False), plans, strict=True):
        with mock.patch.object(qp, "_IN_CLASSES", in_classes):
            got.append(qp.published_plan_of(s, plan))
    assert _columns(got[0]) == _columns(got[1])
    assert len({m for m in got[0].messages if "max_runtime_seconds" in m}) == 3


def _submit(world: World, rnd: random.Random, n: int) -> list[int]:
    ids = []
    for i in range(n):
        team, user = rnd.choice(((world.vision, world.member), (world.nlp, world.outsider)))
        body = job_body(team=team.slug, name=f"r{i}", gpu_type=rnd.choice(("h100", "a100")),
                        gpus=rnd.choice((1, 2, 4, 8)), replicas=rnd.choice((1, 1, 2)),
                        tier=rnd.choice(("low", "normal", "high")))
        r = world.client(user).post("/api/v1/jobs/", body, format="json")
        assert r.status_code == 201, r.json()
        ids.append(int(r.json()["id"]))
    return ids


@pytest.mark.parametrize("seed", range(4))
def test_rule_p3_the_cycles_plan_answers_as_a_request_planning_before_it_applied(
        world: World, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request planning the queue the cycle planned (the same rows and cluster, just
    before step 4) answers each job that stays queued as the published plan does: the
    same reasons (rule E5), and the position and jobs ahead of its type less the jobs
    the cycle admitted ahead of it (rules P3, E1)."""
    rnd = random.Random(seed)
    _submit(world, rnd, 8)
    scheduler_cycle(now=timezone.now())  # some admitted; the cluster view published
    ids = _submit(world, rnd, 14)
    seen: dict[str, Any] = {}
    real_apply = scheduler.apply_plan

    def apply(**kw: Any) -> Any:
        seen["request"] = qp._plan_compute(now=kw["now"])[0]
        return real_apply(**kw)

    monkeypatch.setattr(scheduler, "apply_plan", apply)
    result = scheduler_cycle(now=timezone.now())
    request: qp.QueuePlan = seen["request"]
    admitted = set(result.admitted)
    published = qp.queue_plan(now=timezone.now())
    assert isinstance(published, qp.PublishedPlan)
    assert set(published.positions()) == set(request.entries) - admitted
    assert set(ids) - admitted <= set(published.positions())

    def admitted_ahead(e: PlanEntry, same_type: bool) -> int:
        return sum(1 for a in admitted if (a_e := request.entries[a]).position < e.position
                   and (not same_type or a_e.gpu_type == e.gpu_type))

    with mock.patch.object(qp, "plan_admissions", side_effect=AssertionError("planned")):
        for job_id, e in request.entries.items():
            if job_id in admitted:
                continue
            got = published.entry(job_id)
            assert got is not None
            assert got.position == e.position - admitted_ahead(e, same_type=False)
            assert got.ahead_same_gpu_type == e.ahead_same_gpu_type - admitted_ahead(
                e, same_type=True)
            assert (got.team, got.gpu_type, got.wait_code, got.wait_message, got.wait_until) \
                == (e.team, e.gpu_type, e.wait_code, e.wait_message, e.wait_until)
            team = world.vision if e.team == "vision" else world.nlp
            user = world.member if team == world.vision else world.outsider
            body = world.client(user).get(f"/api/v1/jobs/{job_id}/").json()
            assert body["queue"] == published.standing(job_id)


def test_no_published_plan_and_a_long_queue_say_planning(world: World, settings: Any) -> None:
    """Rule P3 with no plan published: a request plans a queue of at most
    FAIRQ_QUEUE_PLAN_WEB_MAX jobs itself, and says "planning" for a longer one; a job
    queued after the cycle's plan on a long queue says so too."""
    rnd = random.Random(7)
    ids = _submit(world, rnd, 6)
    settings.FAIRQ_QUEUE_PLAN_WEB_MAX = 100
    assert qp.queue_standing(job_id=ids[0], now=timezone.now())["position"] is not None
    qp.queue_plan_forget()
    settings.FAIRQ_QUEUE_PLAN_WEB_MAX = 5
    with mock.patch.object(qp, "plan_admissions", side_effect=AssertionError("planned")):
        standing = qp.queue_standing(job_id=ids[0], now=timezone.now())
        assert standing["position"] is None
        assert standing["reason"]["code"] == "planning"
        assert "not published" in standing["reason"]["message"]
        briefs = qp.queue_briefs(job_ids=ids, now=timezone.now())
        assert {b["reason"]["code"] for b in briefs.values()} == {"planning"}
    scheduler_cycle(now=timezone.now())
    queued = [i for i in ids if qp.queue_plan(now=timezone.now()).position(i) is not None]
    later = _submit(world, rnd, 6)
    with mock.patch.object(qp, "plan_admissions", side_effect=AssertionError("planned")):
        for i in queued:
            assert qp.queue_standing(job_id=i, now=timezone.now())["position"] is not None
        standing = qp.queue_standing(job_id=later[0], now=timezone.now())
        assert standing["reason"]["code"] == "planning"
        assert "after the scheduler's last plan" in standing["reason"]["message"]
    settings.FAIRQ_QUEUE_PLAN_WEB_MAX = 2000  # a short queue: the request plans it (as before)
    assert qp.queue_standing(job_id=later[0], now=timezone.now())["position"] is not None


def test_the_old_path_reads_no_published_plan(world: World,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`PUBLISHED` off (the path before, for the benches' A/B): the cycle publishes
    nothing and a read plans the queue itself."""
    monkeypatch.setattr(qp, "PUBLISHED", False)
    ids = _submit(world, random.Random(3), 6)
    scheduler_cycle(now=timezone.now())
    assert isinstance(qp.queue_plan(now=timezone.now()), qp.QueuePlan)
    assert qp.queue_standing(job_id=ids[-1], now=timezone.now()) is not None


def test_a_plan_that_cannot_be_published_never_stops_the_cycle(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The published plan is a read model: a publish that fails is logged, the cycle's
    admissions are still submitted, and a short queue's pages plan it themselves."""
    from queueing.models import Job

    monkeypatch.setattr(scheduler, "queue_plan_publish",
                        mock.Mock(side_effect=RuntimeError("the cache is down")))
    _submit(world, random.Random(5), 4)
    result = scheduler_cycle(now=timezone.now())
    assert result.admitted
    assert not Job.objects.filter(pk__in=result.admitted,
                                  submitted_to_backend_at__isnull=True).exists()
    assert isinstance(qp.queue_plan(now=timezone.now()), qp.QueuePlan)
