"""What submitting answers: the job as stored with its events (no priority or queue
position, which plan the whole queue), and array jobs: one validated template, up to
10,000 queued copies in one request."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from rest_framework import serializers

from queueing.models import Job, JobEvent
from queueing.services.jobs import MAX_BULK_JOBS

from .serializers import JobCreateSerializer, JobEventSerializer, JobSerializer


class JobSubmittedSerializer(JobSerializer):
    """A job right after submission; GET /jobs/{id}/ adds priority and queue position."""

    events = JobEventSerializer(many=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "events"]
        read_only_fields = fields


@functools.cache
def _bound_serializers() -> tuple[JobSerializer, JobEventSerializer]:
    """One JobSerializer and one JobEventSerializer per process, their fields built once.

    A ModelSerializer builds and binds its ~25 fields from the model on every instance
    (about a third of a submit's CPU before); to_representation only reads the bound
    fields, which use no context, so one instance serves every request and thread."""
    job, event = JobSerializer(), JobEventSerializer()
    job.fields, event.fields  # noqa: B018  # build them now, not racing in two threads
    return job, event


def job_submitted_data(job: Job, events: Iterable[JobEvent]) -> dict[str, Any]:
    """What `JobSubmittedSerializer(job).data` gives for a job whose events are `events`
    (the submit path has just written them: no query to read them back)."""
    job_serializer, event_serializer = _bound_serializers()
    data: dict[str, Any] = job_serializer.to_representation(job)
    data["events"] = [event_serializer.to_representation(e) for e in events]
    return data


# Shapes only: the array's own rules (names, bytes stored) are `jobs_submit_bulk`'s.
class BulkJobCreateSerializer(JobCreateSerializer):
    """A job template and `count`: job i is named `<name>-<i>`, has `array_index` i and
    gets `FAIRQ_ARRAY_INDEX=i`, `FAIRQ_ARRAY_SIZE=count` (like Slurm's
    `--array=0-<count-1>%<max_running>`)."""

    count = serializers.IntegerField(min_value=1, max_value=MAX_BULK_JOBS,
                                     help_text=f"Jobs in the array (1..{MAX_BULK_JOBS}).")
    max_running = serializers.IntegerField(
        min_value=1, required=False, allow_null=True, default=None,
        help_text="At most this many members hold GPUs at once (rule A8, Slurm's %N); "
                  "null: no limit.")


class BulkJobCreatedSerializer(serializers.Serializer[Any]):
    array_id = serializers.IntegerField(help_text="GET/DELETE /api/v1/arrays/{array_id}/.")
    count = serializers.IntegerField()
    ids = serializers.ListField(child=serializers.IntegerField(),
                                help_text="Ids of the members queued as jobs now (the first "
                                          "up to 8), in index order; the rest get theirs as "
                                          "the scheduler needs them.")
