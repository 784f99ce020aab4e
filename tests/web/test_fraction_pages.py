"""Shared GPUs on the web pages: the submit form takes a fraction of a time-sliced GPU
(and says such GPUs have no memory isolation, in its help and in the GPU type list),
refuses one the type does not take on the field, and the job's page and the lists say
"1 × 0.5 GPU (2 of 4 slices, time-sliced) ts-a10"."""

from __future__ import annotations

from typing import Any

from django.test import Client

from queueing.models import Job
from queueing.policy.states import JobState
from tests.conftest import World
from tests.factories import JobFactory


def _client(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _form(**overrides: Any) -> dict[str, Any]:
    body = {"team": "vision", "name": "nb", "image": "ghcr.io/acme/train:1.4",
            "command": "python train.py", "gpu_type": "ts-a10", "gpus": "0.5",
            "replicas": "1", "tier": "normal"}
    body.update(overrides)
    return body


def test_the_form_says_no_memory_isolation(world: World, ts: Any) -> None:
    page = _client(world.member).get("/jobs/new/").content.decode()
    assert "ts-a10: time-sliced, 4 slices per GPU, no memory isolation" in page
    assert "NO memory isolation" in page


def test_the_form_submits_a_half_gpu(world: World, ts: Any) -> None:
    r = _client(world.member).post("/jobs/new/", _form())
    assert r.status_code == 302, r.content.decode()[:2000]
    job = Job.objects.get()
    assert (job.gpu_slices, job.gpus_per_replica) == (1 * 2, 1)


def test_the_form_refuses_a_fraction_off_the_steps_on_the_field(world: World, ts: Any) -> None:
    r = _client(world.member).post("/jobs/new/", _form(gpus="0.3"))
    assert r.status_code == 400  # the form again, the refusal on its field
    assert "0.3 is not a multiple of 1/4 GPU of ts-a10 (4 slices per GPU): use 0.25, 0.5, " \
           "0.75." in r.content.decode()
    assert not Job.objects.exists()


def test_the_job_page_and_list_say_the_slices(world: World, ts: Any) -> None:
    job = JobFactory(team=world.vision, submitter=world.member, tier=world.normal,
                     gpu_type=ts, gpus_per_replica=1, gpu_slices=2, status=JobState.RUNNING,
                     gpu_slots=[1])
    c = _client(world.member)
    page = c.get(f"/jobs/{job.pk}/").content.decode()
    assert "1 × 0.5 GPU (2 of 4 slices, time-sliced) ts-a10 (0.5 in all)" in page
    assert "time-sliced: no memory isolation" in page
    assert "planned on GPU 1 of its node" in page
    assert "0.5 GPU (2 of 4 slices, time-sliced) ts-a10" in c.get("/jobs/").content.decode()
