"""API v1: where each queued job stands, why it waits and when it may start (rules P2,
P3, P4 of docs/scheduling.md), in one request: `fairq queue` and `squeue --start`."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueing.policy.states import JobState
from queueing.selectors.jobs import jobs_visible_to
from queueing.selectors.start_estimate import queue_start_estimates

from .scope import teams_asked


class JobStartsView(APIView):
    """The caller's queued jobs (of `team`, or of every team the caller may see), in
    queue order (rule P2), each with its position, its first wait reason (rule P3) and
    its estimated start (rule P4: from the running jobs' max runtimes; null when no
    estimate can be made). `error`: the cluster did not answer, and no job has a
    position, reason or estimate."""

    @extend_schema(
        operation_id="jobs_starts",
        parameters=[OpenApiParameter("team", str, description="A team's slug.")],
        responses=inline_serializer("JobStarts", {
            "as_of": serializers.DateTimeField(),
            "error": serializers.CharField(),
            "jobs": inline_serializer("JobStart", {
                "id": serializers.IntegerField(),
                "position": serializers.IntegerField(allow_null=True),
                "reason": inline_serializer("JobStartReason", {
                    "code": serializers.CharField(), "message": serializers.CharField()},
                    allow_null=True),
                "estimated_start": serializers.DateTimeField(allow_null=True),
            }, many=True),
        }),
    )
    def get(self, request: Request) -> Response:
        now = timezone.now()
        teams = teams_asked(user=request.user, slug=request.query_params.get("team"))
        ids = list(jobs_visible_to(actor=request.user).filter(
            status=JobState.QUEUED, team__in=teams).values_list("id", flat=True))
        starts, error = queue_start_estimates(now=now, job_ids=ids)
        jobs = []
        for i in sorted(ids, key=lambda i: (i not in starts, starts[i].position if i in starts
                                            else 0, i)):
            s = starts.get(i)
            at = s.estimated_start if s is not None else None
            jobs.append({"id": i, "position": s.position if s else None,
                         "reason": s.reason if s else None,
                         "estimated_start": at.isoformat() if at is not None else None})
        return Response({"as_of": now.isoformat(), "error": error, "jobs": jobs})


__all__ = ["JobStartsView"]
