"""The watch's rules that need no second process (tests/cli/test_cli_watch.py has the
live ones): bad values are 400s naming the field, the tenant choke point holds, a long
poll times out with 304 and answers a finished job at once, events carry their ids."""

from __future__ import annotations

import time

import pytest

from queueing.api import watch
from queueing.selectors.queue_plan import queue_plan_forget
from queueing.services.jobs import job_cancel
from tests.conftest import World
from tests.factories import JobFactory


@pytest.mark.parametrize(("query", "field"), [
    ("wait=0", "wait"), ("wait=61", "wait"), ("wait=abc", "wait"), ("wait=1.5", "wait"),
    ("wait=5&since_event=-1", "since_event"), ("since_event=3", "since_event"),
])
def test_bad_wait_values_are_400_naming_the_field(world: World, query: str, field: str) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    r = world.client(world.admin).get(f"/api/v1/jobs/{job.pk}/?{query}")
    assert r.status_code == 400, r.content
    assert list(r.json()["error"]["fields"]) == [field]


def test_waiting_on_another_teams_job_is_404_at_once(world: World) -> None:
    job = JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal)
    started = time.monotonic()
    r = world.client(world.admin).get(f"/api/v1/jobs/{job.pk}/?wait=30")
    assert r.status_code == 404
    assert time.monotonic() - started < 5


def test_long_poll_without_a_change_is_304_after_the_wait(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    client = world.client(world.admin)
    first = client.get(f"/api/v1/jobs/{job.pk}/")
    last = int(first["Fairq-Last-Event"])
    started = time.monotonic()
    r = client.get(f"/api/v1/jobs/{job.pk}/?wait=1&since_event={last}")
    took = time.monotonic() - started
    assert r.status_code == 304 and r.content == b""
    assert 1.0 <= took < 4.0
    assert r["Fairq-Last-Event"] == str(last)


def test_long_poll_answers_at_once_when_the_caller_is_behind(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    client = world.client(world.admin)
    before = int(client.get(f"/api/v1/jobs/{job.pk}/")["Fairq-Last-Event"])
    job_cancel(actor=world.admin, job=job)
    started = time.monotonic()
    r = client.get(f"/api/v1/jobs/{job.pk}/?wait=30&since_event={before}")
    assert r.status_code == 200 and r.json()["status"] == "CANCELLED"
    assert time.monotonic() - started < 5
    newest = r.json()["events"][-1]
    assert newest["id"] == int(r["Fairq-Last-Event"]) > before
    assert newest["to_status"] == "CANCELLED"


def test_a_finished_job_is_not_waited_on(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    job_cancel(actor=world.admin, job=job)
    client = world.client(world.admin)
    first = client.get(f"/api/v1/jobs/{job.pk}/")
    started = time.monotonic()
    r = client.get(f"/api/v1/jobs/{job.pk}/?wait=30", HTTP_IF_NONE_MATCH=first["ETag"])
    assert r.status_code == 304
    assert time.monotonic() - started < 5


def test_an_etag_alone_is_the_baseline_of_a_job_out_of_the_queue(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     status="RUNNING", placement=["n1"])
    client = world.client(world.admin)
    etag = client.get(f"/api/v1/jobs/{job.pk}/")["ETag"]
    assert client.get(f"/api/v1/jobs/{job.pk}/?wait=1",
                      HTTP_IF_NONE_MATCH=etag).status_code == 304
    assert client.get(f"/api/v1/jobs/{job.pk}/?wait=1",
                      HTTP_IF_NONE_MATCH='W/"something-older"').status_code == 200


def test_the_stream_and_starts_are_scoped_to_the_callers_teams(world: World) -> None:
    client = world.client(world.outsider)  # nlp only
    assert client.get("/api/v1/jobs/stream/?team=vision&duration=1").status_code == 404
    assert client.get("/api/v1/jobs/starts/?team=vision").status_code == 404
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    mine = JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal)
    r = client.get("/api/v1/jobs/starts/")
    assert [j["id"] for j in r.json()["jobs"]] == [mine.pk]


@pytest.mark.parametrize(("value", "with_priority"), [("1", True), ("true", True), ("0", False),
                                                     ("false", False)])
def test_starts_reads_priority_as_a_boolean(world: World, value: str, with_priority: bool) -> None:
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    r = world.client(world.admin).get(f"/api/v1/jobs/starts/?priority={value}")
    assert r.status_code == 200
    [job] = r.json()["jobs"]
    assert ("priority" in job) is with_priority


@pytest.mark.parametrize("value", ["2.2e-16", "maybe", ""])
def test_starts_refuses_a_priority_that_is_no_boolean_naming_it(world: World, value: str) -> None:
    r = world.client(world.admin).get(f"/api/v1/jobs/starts/?priority={value}")
    assert r.status_code == 400
    assert "priority" in r.json()["error"]["fields"]


@pytest.mark.parametrize("query", ["duration=0", "duration=301", "last_event_id=x"])
def test_bad_stream_values_are_400(world: World, query: str) -> None:
    r = world.client(world.admin).get(f"/api/v1/jobs/stream/?{query}")
    assert r.status_code == 400


def test_the_stream_is_event_stream_with_a_retry_hint(world: World,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch, "POLL_SECONDS", 0.05)
    r = world.client(world.admin).get("/api/v1/jobs/stream/?duration=1",
                                      HTTP_ACCEPT="text/event-stream")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/event-stream")
    text = b"".join(r.streaming_content).decode()
    assert text.startswith("retry: ")
    assert text.rstrip().endswith("reconnect with Last-Event-ID")


def test_starts_answers_any_number_of_queued_jobs_in_the_same_queries(
        world: World) -> None:
    """One request for the whole queue (`fairq queue`): no query per job."""
    client = world.client(world.admin)

    def count() -> int:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        queue_plan_forget()  # both counts plan the queue afresh
        with CaptureQueriesContext(connection) as q:
            r = client.get("/api/v1/jobs/starts/?team=vision")
        assert r.status_code == 200
        return len(q.captured_queries)

    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    few = count()
    for _ in range(12):
        JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    assert count() <= few
    # Jobs queued since the cached plan get a fresh one, not a null position.
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    jobs = client.get("/api/v1/jobs/starts/?team=vision").json()["jobs"]
    assert [j["position"] for j in jobs] == list(range(1, 15))
    assert all(j["reason"]["code"] for j in jobs)


def test_a_long_poll_that_saw_a_change_answers_the_whole_job_as_it_is_now(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait refreshes only what it watches (updated_at, status, attempt); the answer
    after it is every field as stored now, not the row the access check read."""
    from django.utils import timezone

    from queueing.models import Job

    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    client = world.client(world.admin)
    real_wait = watch.job_wait

    def wait_while_it_changes(**kwargs: object) -> object:
        def sleep(_seconds: float) -> None:
            Job.objects.filter(pk=job.pk).update(message="picked up by the operator",
                                                 updated_at=timezone.now())
        return real_wait(**kwargs, sleep=sleep)  # type: ignore[arg-type]

    monkeypatch.setattr(watch, "job_wait", wait_while_it_changes)
    r = client.get(f"/api/v1/jobs/{job.pk}/?wait=5")  # its row as read is the baseline
    assert r.status_code == 200, r.content
    assert r.json()["message"] == "picked up by the operator"


def test_a_jobs_detail_reads_the_job_once(world: World) -> None:
    """GET /jobs/{id}/ checks access with the job's row and answers from it (its events
    in one more query), not reading the job twice more."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    client = world.client(world.admin)
    client.get(f"/api/v1/jobs/{job.pk}/")  # warm the reference caches
    with CaptureQueriesContext(connection) as q:
        r = client.get(f"/api/v1/jobs/{job.pk}/")
    assert r.status_code == 200
    by_id = [x["sql"] for x in q.captured_queries
             if x["sql"].startswith('SELECT "queueing_job"."id"') and "WHERE" in x["sql"]
             and f'"queueing_job"."id" = {job.pk}' in x["sql"]]
    assert len(by_id) == 1, by_id
