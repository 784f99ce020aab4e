"""The single-job submit answers without reading its events back and with serializers
built once per process: the answer must be what the ModelSerializers give from the
database, and the submit path must stay within its queries."""

from __future__ import annotations

import json

from django.db import connection
from django.test.utils import CaptureQueriesContext

from queueing.api.bulk import JobSubmittedSerializer
from queueing.models import Job
from tests.conftest import World, job_body


def test_a_submit_answers_what_the_serializer_gives_from_the_database(world: World) -> None:
    c = world.client(world.member)
    for body in (job_body(), job_body(env={"A": "1"}, max_runtime_seconds=60, replicas=2)):
        r = c.post("/api/v1/jobs/", body, format="json")
        assert r.status_code == 201, r.content
        stored = Job.objects.select_related("team", "gpu_type", "tier", "submitter") \
            .prefetch_related("events").get(pk=r.json()["id"])
        expected = json.loads(json.dumps(JobSubmittedSerializer(stored).data, default=str))
        assert r.json() == expected
        assert len(r.json()["events"]) == 1


def test_a_submit_does_not_read_its_events_back(world: World) -> None:
    c = world.client(world.member)
    c.post("/api/v1/jobs/", job_body(), format="json")  # warm the reference caches
    with CaptureQueriesContext(connection) as q:
        r = c.post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201
    sqls = [x["sql"] for x in q.captured_queries]
    assert not any(s.startswith("SELECT") and "queueing_jobevent" in s for s in sqls), sqls


def test_a_replayed_submit_still_answers_the_stored_job_with_its_events(world: World) -> None:
    c = world.client(world.member)
    first = c.post("/api/v1/jobs/", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="fp")
    again = c.post("/api/v1/jobs/", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="fp")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()


def test_one_shaping_serializer_per_class_keeps_no_request_state(world: World) -> None:
    import pytest
    from rest_framework.exceptions import ValidationError

    from queueing.api.bulk import BulkJobCreateSerializer
    from queueing.api.serializers import JobCreateSerializer, shaped, shaper

    assert shaper(JobCreateSerializer) is shaper(JobCreateSerializer)  # built once
    assert shaper(BulkJobCreateSerializer) is not shaper(JobCreateSerializer)
    with pytest.raises(ValidationError) as bad:
        shaped(JobCreateSerializer, job_body(gpus=0, replicas="x"))
    assert set(bad.value.detail) == {"gpus", "replicas"}
    good = shaped(JobCreateSerializer, job_body())
    assert good["team"] == "vision" and good["replicas"] == 1  # its own data, defaults
    assert "count" not in good


def test_job_input_build_answers_each_actor_with_their_own_errors(world: World) -> None:
    import pytest

    from queueing.api.serializers import JobCreateSerializer, shaped
    from queueing.errors import DomainError
    from queueing.services.jobs import job_input_build

    with pytest.raises(DomainError) as member:
        job_input_build(actor=world.member,
                        **shaped(JobCreateSerializer, job_body(name="Bad_Name", gpus=99)))
    assert set(member.value.fields) == {"name"}  # field rules first; gpus after them all
    with pytest.raises(DomainError) as outsider:
        job_input_build(actor=world.outsider, **shaped(JobCreateSerializer, job_body()))
    assert set(outsider.value.fields) == {"team"}  # its own user, not the first one's
    good = job_input_build(actor=world.member, **shaped(JobCreateSerializer, job_body()))
    assert good.team == world.vision and good.tier == world.normal


def test_the_answers_field_plan_gives_what_the_serializer_gives(world: World) -> None:
    """queueing/api/bulk.py `_represent`: the same dict as the ModelSerializers'
    `to_representation`, for jobs whose fields take every branch (no submitter, a
    dependency, volumes, labels, a pinned cluster, an admitted attempt, a message)."""
    from datetime import timedelta

    from django.utils import timezone

    from queueing.api.bulk import _bound_serializers, job_submitted_data
    from queueing.models import Cluster, JobState
    from tests.factories import JobFactory

    c = world.client(world.member)
    first = c.post("/api/v1/jobs/", job_body(), format="json").json()
    east = Cluster.objects.create(name="east")
    bodies = [
        job_body(labels={"a": "b"}, annotations={"x": "y"}, volumes=[],
                 dependencies=[{"type": "after_ok", "job": first["id"]}]),
        job_body(allow_spot=True, env={}, args=[]),
    ]
    ids = [first["id"]]
    for body in bodies:
        r = c.post("/api/v1/jobs/", body, format="json")
        assert r.status_code == 201, r.content
        ids.append(r.json()["id"])
    now = timezone.now()
    orphan = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                        submitter=None, status=JobState.RUNNING, message="oom at step 3",
                        admitted_at=now - timedelta(hours=1), started_at=now - timedelta(minutes=50),
                        exit_code=None, cluster=east, requested_cluster=east)
    ids.append(orphan.pk)
    job_serializer, event_serializer = _bound_serializers()
    for job in Job.objects.select_related("team", "gpu_type", "tier", "submitter") \
            .prefetch_related("events").filter(pk__in=ids):
        events = list(job.events.all())
        expected = {**job_serializer.to_representation(job),
                    "events": [event_serializer.to_representation(e) for e in events]}
        assert job_submitted_data(job, events) == expected
    assert len(ids) == 4
