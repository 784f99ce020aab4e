"""API v1: where each queued job stands, why it waits and when it may start (rules P2,
P3, P4 of docs/scheduling.md), in one request: `fairq queue` and `squeue --start`."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueing.selectors.cluster import cluster_view
from queueing.selectors.fairshare import jobs_priority_breakdowns
from queueing.selectors.jobs import jobs_with_team_and_tier, queued_job_ids_visible
from queueing.selectors.start_estimate import queue_start_estimates

from .scope import teams_asked


class JobStartsView(APIView):
    """The caller's queued jobs (of `team`, or of every team the caller may see), in
    queue order (rule P2), each with its position, its first wait reason (rule P3) and
    its estimated start (rule P4: from the running jobs' max runtimes; null when no
    estimate can be made). `error`: the cluster did not answer, and no job has a
    position, reason or estimate. `?priority=1` adds each job's team, tier and priority
    per factor (rule P1, as `GET /jobs/{id}/` gives it): `fairq prio` with no job, like
    `sprio`."""

    @extend_schema(
        operation_id="jobs_starts",
        parameters=[OpenApiParameter("team", str, description="A team's slug."),
                    OpenApiParameter("priority", bool, description=(
                        "1: each job also carries `team`, `tier` and `priority` (rule P1, "
                        "per factor, as in `GET /jobs/{id}/`)."))],
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
                "team": serializers.CharField(required=False, help_text="With ?priority=1."),
                "tier": serializers.CharField(required=False, help_text="With ?priority=1."),
                "priority": serializers.DictField(required=False, help_text=(
                    "With ?priority=1: `total` and `factors` {name: {factor, weight, "
                    "value}}, as `GET /jobs/{id}/`'s `priority`.")),
            }, many=True),
        }),
    )
    def get(self, request: Request) -> Response:
        now = timezone.now()
        teams = teams_asked(user=request.user, slug=request.query_params.get("team"))
        ids = queued_job_ids_visible(actor=request.user, teams=teams)
        starts, error = queue_start_estimates(now=now, job_ids=ids)
        extra: dict[int, dict[str, object]] = {}
        if _priority_asked(request):
            rows = jobs_with_team_and_tier(ids=ids)
            breakdowns = jobs_priority_breakdowns(
                jobs=rows, now=now, cluster_gpus=cluster_view(now=now).total_gpus())
            extra = {j.pk: {"team": j.team.slug, "tier": j.tier.slug,
                            "priority": breakdowns[j.pk].as_dict()} for j in rows}
        jobs = []
        for i in sorted(ids, key=lambda i: (i not in starts, starts[i].position if i in starts
                                            else 0, i)):
            s = starts.get(i)
            at = s.estimated_start if s is not None else None
            jobs.append({"id": i, "position": s.position if s else None,
                         "reason": s.reason if s else None,
                         "estimated_start": at.isoformat() if at is not None else None,
                         **extra.get(i, {})})
        return Response({"as_of": now.isoformat(), "error": error, "jobs": jobs})


__all__ = ["JobStartsView"]


def _priority_asked(request: Request) -> bool:
    """`?priority=` read as the schema's boolean (`1`, `true`, `0`, `false`, ...): anything
    else is a 400 naming it, never taken for "no"."""
    raw = request.query_params.get("priority")
    if raw is None:
        return False
    try:
        return bool(serializers.BooleanField().to_internal_value(raw))
    except serializers.ValidationError as exc:
        raise serializers.ValidationError({"priority": exc.detail}) from None
