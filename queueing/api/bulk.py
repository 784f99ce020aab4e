"""What submitting answers: the job as stored with its events (no priority or queue
position, which plan the whole queue), and array jobs: one validated template, up to
10,000 queued copies in one request."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from rest_framework import serializers
from rest_framework.fields import SkipField

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


# Field classes whose to_representation returns a value of this exact type unchanged:
# CharField's str(), IntegerField's int(), BooleanField's True/False for a bool. Exact
# classes only (a subclass may represent differently); tests/api/test_submit_lane.py holds
# the plan's output to the serializer's own.
_UNCHANGED: dict[type[serializers.Field[Any, Any, Any, Any]], type] = {
    serializers.CharField: str, serializers.IntegerField: int, serializers.BooleanField: bool,
}

_Plan = tuple[tuple[str, "serializers.Field[Any, Any, Any, Any]", tuple[str, ...],
                    "type | None"], ...]


@functools.cache
def _plans() -> tuple[_Plan, _Plan]:
    """Per readable field of the two bound serializers: its name, the field, its source
    attributes, and the type it keeps unchanged. A related field (DRF's primary-key-only
    shortcut) has no source attributes here: it always goes through the field."""

    def plan(serializer: serializers.Serializer[Any]) -> _Plan:
        return tuple(
            (str(f.field_name), f,
             () if isinstance(f, serializers.RelatedField) else tuple(f.source_attrs),
             _UNCHANGED.get(type(f)))
            for f in serializer.fields.values() if not f.write_only)

    job, event = _bound_serializers()
    return plan(job), plan(event)


def _represent(plan: _Plan, instance: Any) -> dict[str, Any]:
    """`Serializer.to_representation(instance)` for a serializer of `plan`, by the same
    steps for the same result: each field's value read along its source attributes (a
    missing one, a callable or a related field: the field's own `get_attribute`, with its
    default and SkipField), None kept as None, a value the field would leave unchanged
    taken as it is, any other through the field's `to_representation`.

    Why: a submit answers with ~50 fields, and DRF's generic loop (a generator, a
    try/except and two method calls per field) was ~12% of a submit's CPU."""
    out: dict[str, Any] = {}
    for name, field, attrs, unchanged in plan:
        value: Any = instance
        try:
            if not attrs:
                raise AttributeError(name)
            for attr in attrs:
                value = getattr(value, attr)
            if callable(value):
                raise AttributeError(name)
        except (AttributeError, ObjectDoesNotExist):
            try:
                value = field.get_attribute(instance)
            except SkipField:
                continue
        if value is None:
            out[name] = None
        elif unchanged is not None and type(value) is unchanged:
            out[name] = value
        else:
            out[name] = field.to_representation(value)
    return out


def job_submitted_data(job: Job, events: Iterable[JobEvent]) -> dict[str, Any]:
    """What `JobSubmittedSerializer(job).data` gives for a job whose events are `events`
    (the submit path has just written them: no query to read them back)."""
    job_plan, event_plan = _plans()
    data = _represent(job_plan, job)
    data["events"] = [_represent(event_plan, e) for e in events]
    return data


# Shapes only: the array's own rules (names, bytes stored) are `jobs_submit_bulk`'s.
class BulkJobCreateSerializer(JobCreateSerializer):
    """A job template and `count` (or Slurm's `array` indices): job i is named
    `<name>-<i>`, has `array_index` i and gets `FAIRQ_ARRAY_INDEX=i`,
    `FAIRQ_ARRAY_SIZE=count` (like Slurm's `--array=0-<count-1>%<max_running>`)."""

    count = serializers.IntegerField(min_value=1, max_value=MAX_BULK_JOBS, required=False,
                                     help_text=f"Jobs in the array (1..{MAX_BULK_JOBS}), "
                                               "indices 0..count-1; or give `array`.")
    array = serializers.CharField(
        max_length=1000, required=False,
        help_text="Instead of `count`: the indices as Slurm's --array writes them "
                  "(`0-99%4`, `1,3,5`, `0-15:4`, combinations; `%M` sets max_running); a "
                  "bare `N` or `N%M` is N tasks 0..N-1, as `count` (`fairq submit -a`). "
                  "Member names end in their index, FAIRQ_ARRAY_INDEX is it.")
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
