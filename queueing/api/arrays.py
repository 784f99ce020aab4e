"""Array jobs: `GET /api/v1/arrays/{id}/` (the array and its members counted by state)
and `DELETE /api/v1/arrays/{id}/` (cancel the members that have not ended)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueing.selectors.arrays import array_get_for_actor, array_reload, array_summary
from queueing.services.arrays import array_cancel


class ArraySummarySerializer(serializers.Serializer[Any]):
    """An array job and its members counted by state."""

    id = serializers.IntegerField()
    team = serializers.CharField()
    name = serializers.CharField()
    count = serializers.IntegerField(help_text="Members.")
    max_running = serializers.IntegerField(
        allow_null=True, help_text="At most this many hold GPUs at once (rule A8); null: no limit."
    )
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    counts = serializers.DictField(
        child=serializers.IntegerField(), help_text="Members per state, every state present."
    )
    active = serializers.IntegerField(help_text="Members holding GPUs (admitted or running).")
    ended = serializers.IntegerField(help_text="Members in a final state.")
    done = serializers.BooleanField(help_text="Every member has ended.")
    materialized = serializers.IntegerField(
        help_text="Members queued as jobs so far (indices 0..materialized-1); the rest count "
                  "as QUEUED (CANCELLED once cancelled) and get a job as the scheduler needs "
                  "them.")
    events = serializers.ListField(
        child=serializers.DictField(),
        help_text="The array's own events: {at, kind (submitted, cancelled), actor, reason, "
                  "data?}.")


class ArrayDetailView(APIView):
    """One array job of the caller's teams (404 for any other)."""

    @extend_schema(responses=ArraySummarySerializer)
    def get(self, request: Request, array_id: int) -> Response:
        """The array and its members counted by state: what `--wait` on an array polls."""
        array = array_get_for_actor(actor=request.user, array_id=array_id)
        return Response(ArraySummarySerializer(array_summary(array)).data)

    @extend_schema(
        responses=inline_serializer(
            "ArrayCancelled",
            {
                "cancelled": serializers.ListField(child=serializers.IntegerField()),
                "cancelled_not_written": serializers.IntegerField(
                    help_text="Members cancelled before they were queued as jobs (no id)."),
                "array": ArraySummarySerializer(),
            },
        )
    )
    def delete(self, request: Request, array_id: int) -> Response:
        """Cancel every member that has not ended, in one transaction, each with its event
        (the members not queued as jobs yet: one event on the array); members that ended
        are left alone. Answers the ids cancelled, how many had no job yet, and the array
        after. Who may: as for one job (its submitter, a team admin, staff; every member
        when the team's `any_member_may_cancel` is on); 403 otherwise."""
        array = array_get_for_actor(actor=request.user, array_id=array_id)
        cancelled, not_written = array_cancel(actor=request.user, array=array)
        array_reload(array=array)  # the rest cancelled: the service wrote its own copy
        return Response({"cancelled": cancelled, "cancelled_not_written": not_written,
                         "array": ArraySummarySerializer(array_summary(array)).data})
