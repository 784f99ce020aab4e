"""/capacity/ and the cluster page's capacity table with jobs of several GPU types
(docs/api.md, "Several GPU types"): an admitted or running job counts under the type it
was admitted on; a queued one accepting several types has no type yet, so it counts
apart, under each type it accepts, as "any of" (`queued_any_of`), and `queued_demand`
is the queued jobs of that one type only."""

from __future__ import annotations

from django.db import transaction
from django.test import Client
from django.utils import timezone

from queueing.backends.base import NodeInfo
from queueing.composition import get_backend
from queueing.models import Job
from queueing.policy.admission import Admission, Plan
from queueing.policy.states import JobState
from queueing.selectors.capacity import capacity_by_gpu_type
from queueing.services.scheduler import apply_plan

from .conftest import World
from .factories import JobFactory

NODES = [NodeInfo("h1", "h100", 8, 0), NodeInfo("a1", "a100", 8, 0)]


def _submit(world: World, name: str, gpu_types: list[str], gpus: int) -> Job:
    r = world.client(world.member).post("/api/v1/jobs/", {
        "name": name, "team": "vision", "image": "ghcr.io/acme/train:1.4",
        "gpu_types": gpu_types, "gpus": gpus}, format="json")
    assert r.status_code == 201, r.json()
    return Job.objects.get(pk=r.json()["id"])


def _admit(job: Job, gpu_type: str) -> None:
    node = next(n.name for n in get_backend().nodes() if n.gpu_type == gpu_type)
    with transaction.atomic():
        apply_plan(plan=Plan(admissions=(Admission(job_id=job.pk, team="vision",
                                                   gpu_type=gpu_type, placement=(node,)),),
                             waits={}), now=timezone.now())


def test_a_queued_job_of_several_types_counts_under_each_as_any_of(world: World) -> None:
    _submit(world, "any", ["h100", "a100"], 4)
    _submit(world, "only-a", ["a100"], 2)
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal, gpus_per_replica=1,
               status=JobState.QUEUED)
    rows = {r.gpu_type: r for r in capacity_by_gpu_type(nodes=NODES)[0]}
    assert (rows["h100"].queued_demand, rows["h100"].queued_any_of) == (1, 4)
    assert (rows["a100"].queued_demand, rows["a100"].queued_any_of) == (2, 4)
    assert (rows["mig-1g-10gb"].queued_demand, rows["mig-1g-10gb"].queued_any_of) == (0, 0)


def test_a_job_of_several_types_admitted_on_its_second_counts_there_only(
        world: World) -> None:
    job = _submit(world, "any", ["h100", "a100"], 4)
    _admit(job, "a100")
    job.refresh_from_db()
    assert job.status == JobState.ADMITTED and job.gpu_type.slug == "a100"
    rows = {r.gpu_type: r for r in capacity_by_gpu_type(nodes=NODES)[0]}
    assert (rows["a100"].held_by_jobs, rows["a100"].by_team) == (4, {"vision": 4})
    assert rows["h100"].held_by_jobs == 0 and rows["h100"].by_team == {}
    assert all(r.queued_demand == 0 and r.queued_any_of == 0 for r in rows.values())
    Job.objects.filter(pk=job.pk).update(status=JobState.RUNNING)
    rows = {r.gpu_type: r for r in capacity_by_gpu_type(nodes=NODES)[0]}
    assert (rows["a100"].held_by_jobs, rows["h100"].held_by_jobs) == (4, 0)


def test_a_requeued_job_of_several_types_is_any_of_again(world: World) -> None:
    """Preempted back to the queue, its `gpu_type` still names the type it last ran on;
    queued, it may run on any of its types again."""
    job = _submit(world, "any", ["h100", "a100"], 4)
    Job.objects.filter(pk=job.pk).update(gpu_type=world.a100)
    rows = {r.gpu_type: r for r in capacity_by_gpu_type(nodes=NODES)[0]}
    assert (rows["a100"].queued_demand, rows["a100"].queued_any_of) == (0, 4)
    assert (rows["h100"].queued_demand, rows["h100"].queued_any_of) == (0, 4)


def test_unwritten_array_members_of_several_types_count_as_any_of(world: World) -> None:
    r = world.client(world.member).post("/api/v1/jobs/bulk/", {
        "name": "sweep", "team": "vision", "image": "ghcr.io/acme/train:1.4",
        "gpu_types": ["h100", "a100"], "gpus": 1, "count": 5000},
        format="json")
    assert r.status_code == 201, r.json()
    written = Job.objects.filter(status=JobState.QUEUED).count()
    assert 0 < written < 5000
    rows = {r.gpu_type: r for r in capacity_by_gpu_type(nodes=NODES)[0]}
    assert rows["h100"].queued_any_of == rows["a100"].queued_any_of == 5000
    assert rows["h100"].queued_demand == rows["a100"].queued_demand == 0


def test_the_api_and_the_cluster_page_say_any_of(world: World) -> None:
    job = _submit(world, "any", ["h100", "a100"], 4)
    _submit(world, "again", ["a100", "h100"], 2)
    _submit(world, "only-h", ["h100"], 3)
    _admit(job, "a100")
    body = {r["gpu_type"]: r for r in world.client(world.member).get("/api/v1/capacity/").json()}
    assert (body["h100"]["queued_demand"], body["h100"]["queued_any_of"]) == (3, 2)
    assert (body["a100"]["queued_demand"], body["a100"]["queued_any_of"]) == (0, 2)
    assert (body["a100"]["held_by_jobs"], body["h100"]["held_by_jobs"]) == (4, 0)
    c = Client()
    c.force_login(world.staff)
    html = c.get("/cluster/").content.decode()
    assert "Queued, this type" in html and "Queued, any of several types" in html
    assert html.count('2 <span class="muted small">any of</span>') == 2
