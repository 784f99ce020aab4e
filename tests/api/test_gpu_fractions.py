"""Shared GPUs at submit (docs/api.md, "Fractions of a GPU"): `gpus` takes a fraction of
one GPU of a time-sliced or MPS type, a multiple of 1/slices_per_gpu, stored as
`gpu_slices`; every other fraction is a 400 naming `gpus` (or `gpu_types`) with what to
ask instead. The job's API output says the fraction, its slices and its GPU share."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.models import Job
from queueing.services.jobs import job_spec
from tests.conftest import World, job_body
from tests.factories import GpuTypeFactory, QuotaFactory


@pytest.fixture
def shared(world: World, settings: Any) -> Any:
    settings.FAIRQ_SIM_NODES = "2x8xh100,2x8xa100,1x7xmig-1g-10gb,2x2xts-a10,1x2xmps-l4"
    ts = GpuTypeFactory(slug="ts-a10", sharing="time-sliced", slices_per_gpu=4,
                        resource_name="nvidia.com/gpu.shared")
    mps = GpuTypeFactory(slug="mps-l4", sharing="mps", slices_per_gpu=3)
    for team in (world.vision, world.nlp):
        QuotaFactory(team=team, gpu_type=ts, nominal=4, borrowing_limit=None)
        QuotaFactory(team=team, gpu_type=mps, nominal=2, borrowing_limit=None)
    return ts


def _post(world: World, **overrides: Any) -> Any:
    body = job_body(**overrides)
    if body["gpu_type"] is None:
        del body["gpu_type"]
    return world.client(world.member).post("/api/v1/jobs/", body, format="json")


@pytest.mark.parametrize(("gpus", "slices"), [(0.25, 1), ("0.5", 2), ("1/4", 1),
                                              (0.75, 3), ("2/8", 1)])
def test_a_fraction_of_a_time_sliced_gpu_is_stored_as_its_slices(
        world: World, shared: Any, gpus: Any, slices: int) -> None:
    r = _post(world, gpu_type="ts-a10", gpus=gpus)
    assert r.status_code == 201, r.content
    job = Job.objects.get(pk=r.json()["id"])
    assert (job.gpus_per_replica, job.gpu_slices) == (1, slices)
    assert job.units_per_replica == slices
    assert job.gpu_share == slices / 4
    detail = world.client(world.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert detail["gpus"] == slices / 4
    assert detail["gpu_slices"] == slices
    assert detail["gpu_share"] == slices / 4
    assert detail["total_gpus"] == slices / 4
    assert detail["gpu_sharing"] == "time-sliced"
    assert detail["slices_per_gpu"] == 4


def test_whole_gpus_on_a_time_sliced_type_are_whole_gpus_of_four_slices(
        world: World, shared: Any) -> None:
    r = _post(world, gpu_type="ts-a10", gpus=2)
    assert r.status_code == 201, r.content
    job = Job.objects.get(pk=r.json()["id"])
    assert (job.gpus_per_replica, job.gpu_slices, job.units_per_replica) == (2, 0, 8)
    assert job.gpu_share == 2.0
    assert r.json()["gpus"] == 2 and r.json()["gpu_slices"] == 0


def test_a_fraction_off_the_types_steps_is_refused_with_the_steps(
        world: World, shared: Any) -> None:
    r = _post(world, gpu_type="ts-a10", gpus=0.3)
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["gpus"] == [
        "0.3 is not a multiple of 1/4 GPU of ts-a10 (4 slices per GPU): use 0.25, 0.5, 0.75."]


def test_a_third_on_a_three_slice_mps_type_is_one_slice(world: World, shared: Any) -> None:
    r = _post(world, gpu_type="mps-l4", gpus=1 / 3)
    assert r.status_code == 201, r.content
    job = Job.objects.get(pk=r.json()["id"])
    assert job.gpu_slices == 1
    assert job_spec(job)["gpus"] == "1/3"  # resubmit takes it back exactly


def test_a_fraction_on_an_exclusive_or_mig_type_is_refused(world: World, shared: Any) -> None:
    r = _post(world, gpu_type="h100", gpus=0.5)
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["gpus"] == [
        "0.5 GPU is a fraction: fractions need a time-sliced or MPS GPU type (h100 is "
        "exclusive); ask whole GPUs on h100."]
    r = _post(world, gpu_type="mig-1g-10gb", gpus="1/2")
    assert r.status_code == 400
    assert "fractions need a time-sliced or MPS GPU type" in r.json()["error"]["fields"]["gpus"][0]


def test_a_fraction_above_one_gpu_is_refused(world: World, shared: Any) -> None:
    r = _post(world, gpu_type="ts-a10", gpus=1.5)
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["gpus"] == [
        "1.5 GPU: a fraction is less than one GPU; ask whole GPUs (1, 2, ...) or a "
        "fraction below 1."]


def test_a_fraction_accepts_one_gpu_type(world: World, shared: Any) -> None:
    r = _post(world, gpu_type=None, gpu_types=["ts-a10", "mps-l4"], gpus=0.5)
    assert r.status_code == 400
    fields = r.json()["error"]["fields"]
    assert "a fraction accepts one GPU type" in fields["gpus"][0]
    r = _post(world, gpu_type=None, gpu_types=["h100", "ts-a10"], gpus=1)
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["gpu_types"] == [
        "ts-a10 is time-sliced or MPS: a job on such a type accepts only that type (its "
        "GPUs are counted in slices); give it alone as gpu_type."]


@pytest.mark.parametrize("gpus", [0, -0.5, "abc", "1/0", True, "0.5.5", float("inf")])
def test_gpus_that_are_no_amount_are_refused_by_shape(world: World, shared: Any,
                                                       gpus: Any) -> None:
    body = job_body(gpu_type="ts-a10", gpus=gpus)
    if gpus == float("inf"):
        r = world.client(world.member).post(
            "/api/v1/jobs/", data=str(body).replace("'", '"').replace("inf", "1e999")
            .replace("True", "true"), content_type="application/json")
    else:
        r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 400, r.content
    assert "gpus" in r.json()["error"]["fields"]


def test_the_submit_lane_and_drf_shape_a_fraction_alike(world: World, shared: Any,
                                                        settings: Any) -> None:
    settings.FAIRQ_FAST_SUBMIT = True
    fast = _post(world, gpu_type="ts-a10", gpus=0.25, name="fast")
    settings.FAIRQ_FAST_SUBMIT = False
    slow = _post(world, gpu_type="ts-a10", gpus=0.25, name="slow")
    assert fast.status_code == slow.status_code == 201
    a, b = Job.objects.get(pk=fast.json()["id"]), Job.objects.get(pk=slow.json()["id"])
    assert (a.gpu_slices, a.gpus_per_replica) == (b.gpu_slices, b.gpus_per_replica) == (1, 1)


def test_a_gang_no_time_sliced_pool_holds_is_refused_counting_gpus_not_slices(
        world: World, shared: Any) -> None:
    """Rule A3 at submit on a packed type: its 2 nodes of 2 GPUs (8 slices each) hold
    one replica of 2 whole GPUs each; the refusal counts GPUs, as the job asks them."""
    r = _post(world, gpu_type="ts-a10", gpus=2, replicas=3)
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["replicas"] == [
        "At most 2 replicas of 2 ts-a10 GPUs fit on the ts-a10 nodes even when empty (rule "
        "A3: 4 GPUs that take new work); this job asks 3 (6 GPUs). The largest possible is 2 "
        "replicas (4 GPUs)."]
