"""API v1 views: validate, call one service or selector, serialize."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueing.models import JOB_STATUS_CHOICES, Job
from queueing.selectors import job_get_for_actor, jobs_visible_to
from queueing.services.jobs import job_cancel, job_submit
from queueing.services.usage import fairshare_standings

from .serializers import (
    JobCreateSerializer,
    JobDetailSerializer,
    JobSerializer,
    StandingSerializer,
)


class JobFilter(django_filters.FilterSet):  # type: ignore[misc]  # django-filter ships no types
    status = django_filters.MultipleChoiceFilter(choices=JOB_STATUS_CHOICES)
    team = django_filters.CharFilter(field_name="team__slug")
    tier = django_filters.CharFilter(field_name="tier__slug")
    gpu_type = django_filters.CharFilter(field_name="gpu_type__slug")
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Job
        fields = ["status", "team", "tier", "gpu_type", "name"]


IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
    description="Posting the same key twice for a team returns the first job, creating nothing.",
)


class JobViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet[Job]):
    filterset_class = JobFilter

    def get_queryset(self) -> QuerySet[Job]:
        return jobs_visible_to(actor=self.request.user)

    def get_serializer_class(self) -> type[Any]:
        if self.action == "retrieve":
            return JobDetailSerializer
        if self.action == "create":
            return JobCreateSerializer
        return JobSerializer

    def get_object(self) -> Job:
        job = job_get_for_actor(actor=self.request.user, job_id=_int_or_404(self.kwargs["pk"]))
        if self.action == "retrieve":
            job = Job.objects.select_related("team", "gpu_type", "tier", "submitter") \
                .prefetch_related("events").get(pk=job.pk)
        return job

    @extend_schema(request=JobCreateSerializer, responses={201: JobDetailSerializer,
                                                            200: JobDetailSerializer},
                   parameters=[IDEMPOTENCY_HEADER])
    def create(self, request: Request) -> Response:
        serializer = JobCreateSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        key = request.headers.get("Idempotency-Key") or None
        if key is not None and len(key) > 200:
            from queueing.errors import DomainError

            raise DomainError("Idempotency-Key is longer than 200 characters.",
                              fields={"Idempotency-Key": ["At most 200 characters."]})
        job, created = job_submit(actor=request.user, data=serializer.to_input(),
                                  idempotency_key=key)
        job = Job.objects.prefetch_related("events").select_related(
            "team", "gpu_type", "tier", "submitter").get(pk=job.pk)
        return Response(JobDetailSerializer(job).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=None, responses=JobDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        job = job_cancel(actor=request.user, job=self.get_object())
        job = Job.objects.prefetch_related("events").get(pk=job.pk)
        return Response(JobDetailSerializer(job).data)


def _int_or_404(value: str) -> int:
    from queueing.errors import NotFound

    try:
        return int(value)
    except (TypeError, ValueError):
        raise NotFound(f"job {value} not found") from None


class FairShareView(APIView):
    """Fair-share standings of every team (rules F1-F3), like Slurm's sshare."""

    @extend_schema(responses=StandingSerializer(many=True))
    def get(self, request: Request) -> Response:
        now = timezone.now()
        standings = sorted(fairshare_standings(now=now).values(), key=lambda s: s.team)
        return Response({"as_of": now.isoformat(),
                         "teams": StandingSerializer(standings, many=True).data})
