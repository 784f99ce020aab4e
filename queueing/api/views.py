"""API v1 views: validate, call one service or selector, serialize."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

import django_filters
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.http import http_date
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueing.errors import DomainError, NotFound
from queueing.instants import InstantError, parse_instant
from queueing.models import JOB_STATUS_CHOICES, Job
from queueing.policy.arrays import ArraySpecError, parse_array_spec
from queueing.policy.states import JobState
from queueing.selectors.attempts import jobs_attempts
from queueing.selectors.events import last_event_id
from queueing.selectors.fairshare import (
    fairshare_standings_at,
    half_life_hours,
    standing_as_dict,
    standings_sorted,
    teams_in_standings_for,
)
from queueing.selectors.jobs import (
    job_events,
    job_events_prefetch,
    job_reload,
    job_visible_get,
    job_with_events,
    jobs_visible_to,
    no_jobs,
)
from queueing.selectors.queue_plan import job_explain, queue_briefs
from queueing.selectors.user_usage import user_usage
from queueing.selectors.utilization import utilization_version
from queueing.services.access import check_job_access
from queueing.services.dependencies import job_dependencies_set
from queueing.services.job_input import job_input_of
from queueing.services.jobs import (
    MAX_BULK_JOBS,
    job_cancel,
    job_spec_field_problems,
    job_submit_with_event,
    jobs_submit_array,
)
from queueing.services.logs import job_log_read
from queueing.validation import ascii_int

from . import watch
from .bulk import (
    BulkJobCreatedSerializer,
    BulkJobCreateSerializer,
    JobSubmittedSerializer,
    job_submitted_data,
)
from .fields import AsciiIntegerFilter, InstantFilter, LabelFilter
from .idempotency import IdempotentPostMixin, idempotency_key
from .location import location
from .serializers import (
    JobCreateSerializer,
    JobDependenciesSerializer,
    JobDetailSerializer,
    JobEventSerializer,
    JobListSerializer,
    JobSerializer,
    StandingSerializer,
    UserUsageSerializer,
    shaped,
    shaped_partly,
)


class JobFilter(django_filters.FilterSet):  # type: ignore[misc]  # django-filter ships no types
    status = django_filters.MultipleChoiceFilter(choices=JOB_STATUS_CHOICES)
    team = django_filters.CharFilter(field_name="team__slug")
    tier = django_filters.CharFilter(field_name="tier__slug")
    gpu_type = django_filters.CharFilter(field_name="gpu_type__slug")
    name = django_filters.CharFilter(lookup_expr="icontains")
    submitter = django_filters.CharFilter(field_name="submitter__username")
    updated_after = InstantFilter(
        field_name="updated_at", lookup_expr="gt",
        help_text="Only jobs changed after this instant (for polling clients).")
    label = LabelFilter()  # its description is the class's schema annotation
    array = AsciiIntegerFilter(field_name="array_id",
                               help_text="Only the members of this array job.")
    cluster = django_filters.CharFilter(field_name="cluster__name", help_text=(
        "Only jobs whose current attempt runs in this cluster (rule K1)."))

    class Meta:
        model = Job
        fields = ["status", "team", "tier", "gpu_type", "name", "submitter", "updated_after",
                  "label", "array", "cluster"]


IDEMPOTENCY_HEADER = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
    description="Posting the same key twice for a team returns the first job, creating nothing.",
)


class JobViewSet(IdempotentPostMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                 viewsets.GenericViewSet[Job]):
    filterset_class = JobFilter

    def idempotency_recorded(self, request: Request) -> bool:
        return self.action != "create"  # the job keeps its key (see `create`)

    def get_queryset(self) -> QuerySet[Job]:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user
            return no_jobs()
        return jobs_visible_to(actor=self.request.user)

    def get_serializer_class(self) -> type[Any]:
        if self.action == "retrieve":
            return JobDetailSerializer
        if self.action == "create":
            return JobCreateSerializer
        if self.action == "list":
            return JobListSerializer
        return JobSerializer

    def list(self, request: Request) -> Response:
        """Jobs of the caller's teams (every job for staff), newest first, filtered by the
        query parameters. A queued job carries its `position`, `jobs_ahead` (of its GPU
        type) and `reason` (docs/scheduling.md, rule E5), all from one cached plan of the
        queue: watching N jobs is one request, whatever N."""
        qs = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(qs)
        jobs = list(page) if page is not None else list(qs)
        queued = [j.pk for j in jobs if j.state == JobState.QUEUED]
        now = timezone.now()
        briefs = queue_briefs(job_ids=queued, now=now)
        # Attempts: two queries for the page's attempts, whatever its size.
        context = {"briefs": briefs, "attempts": jobs_attempts(jobs, now=now)}
        data = JobListSerializer(jobs, many=True, context=context).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    def get_object(self) -> Job:
        job = check_job_access(actor=self.request.user, job_id=_int_or_404(self.kwargs["pk"]))
        if self.action == "retrieve":
            job = job_with_events(job_id=job.pk, related=True)
        return job

    @extend_schema(responses=JobDetailSerializer, parameters=[OpenApiParameter(
        "If-None-Match", str, OpenApiParameter.HEADER,
        description="The ETag of an earlier answer: 304 while the job has not changed."),
        *watch.WAIT_PARAMETERS])
    def retrieve(self, request: Request, pk: str) -> Response:
        """The job with its events. Once a job has left the queue, the weak ETag changes
        whenever the job does (its `updated_at`) or its utilization gets a new minute
        (docs/scheduling.md, rule U5), so pollers get 304 cheaply. A queued job
        has no ETag: its position and why it waits change with other jobs, not with its
        own row, and a 304 would hide that. `?wait=S` holds the answer until the job
        changes (a long poll, queueing/api/watch.py); `Fairq-Last-Event` is the id of its
        newest event."""
        job = check_job_access(actor=request.user, job_id=_int_or_404(pk))
        wait, since_event = watch.wait_params(request)
        etags = [t.strip() for t in request.headers.get("If-None-Match", "").split(",")
                 if t.strip()]
        if wait is not None:
            job, changed = watch.job_wait(job=job, seconds=wait, since_event=since_event,
                                          etags=etags, etag_of=_etag)
            if not changed:
                tag = _etag(job)
                headers = {"Fairq-Last-Event": str(last_event_id(job.pk))}
                if tag is not None:
                    headers["ETag"] = tag
                return Response(status=status.HTTP_304_NOT_MODIFIED, headers=headers)
            job_reload(job=job)  # the wait refreshed only what it watches: all of it now
        last = {"Fairq-Last-Event": str(last_event_id(job.pk))}
        etag = _etag(job)
        if etag is None:
            return Response(_detail_data(_with_events(job)), headers=last)
        headers = {"ETag": etag, "Last-Modified": http_date(job.updated_at.timestamp()), **last}
        if wait is None and etag in etags:
            return Response(status=status.HTTP_304_NOT_MODIFIED, headers=headers)
        return Response(_detail_data(_with_events(job)), headers=headers)

    @extend_schema(request=JobCreateSerializer,
                   responses={201: JobSubmittedSerializer, 200: JobSubmittedSerializer},
                   parameters=[IDEMPOTENCY_HEADER])
    def create(self, request: Request) -> Response:
        """Submit a job: 201 with the job, its submit event and `Location`; with an
        `Idempotency-Key` already used for the team, 200 with that first job (nothing
        created)."""
        fields = _job_fields(request, JobCreateSerializer)
        data = job_input_of(actor=request.user, fields=fields)
        # Idempotency-Key: one layer, the key kept on the job by the service (unique per
        # team for as long as the job; the web form's too); the mixin stands aside
        # (`idempotency_recorded`). A refused submit stores nothing: the retry is checked
        # afresh.
        key = idempotency_key(request)
        job, event, created = job_submit_with_event(
            actor=request.user, data=data, idempotency_key=key)
        # The job and its events, without priority and queue position: those plan the
        # whole queue, and a pipeline submitting thousands of jobs reads neither
        # (GET /jobs/{id}/ has them).
        if created and event is not None:  # its only event is the one just written
            return Response(job_submitted_data(job, [event]), status=status.HTTP_201_CREATED,
                            headers=location("job-detail", pk=job.pk))
        # An earlier job with this key: its current state, events read back.
        job = job_visible_get(actor=request.user, job_id=job.pk)
        return Response(JobSubmittedSerializer(job).data, status=status.HTTP_200_OK,
                        headers={"Idempotent-Replayed": "true"})

    @extend_schema(request=None, responses=JobDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Cancel a job that is not final yet: it becomes CANCELLED (its workload is
        stopped after the commit); 409 when it is already final. Its submitter, a team
        admin of its team and staff may; every member when the team's
        `any_member_may_cancel` is on; 403 otherwise."""
        job = job_cancel(actor=request.user, job=self.get_object())
        job = job_with_events(job_id=job.pk)
        return Response(_detail_data(job))

    @extend_schema(request=BulkJobCreateSerializer, responses={201: BulkJobCreatedSerializer})
    @action(detail=False, methods=["post"])
    def bulk(self, request: Request) -> Response:
        """Submit an array job: `count` copies of one job (up to 10,000) in one request."""
        fields = _job_fields(request, BulkJobCreateSerializer)
        count, max_running, indices = _array_size(fields)
        data = job_input_of(actor=request.user, fields=fields)
        array, ids = jobs_submit_array(actor=request.user, count=count, data=data,
                                       max_running=max_running, indices=indices)
        # Location: the array's own resource (GET /arrays/{id}/). `ids`: the members
        # written as rows now; the rest get theirs as the cycle needs them.
        return Response({"array_id": array.pk, "count": array.count, "ids": ids},
                        status=status.HTTP_201_CREATED,
                        headers=location("array-detail", array_id=array.pk))

    @extend_schema(request=JobDependenciesSerializer, responses=JobDetailSerializer)
    def partial_update(self, request: Request, pk: str) -> Response:
        """Change a queued job's dependencies (rule D3, like `scontrol update
        dependency=`): the same checks as at submit, and none that makes a cycle."""
        body = shaped(JobDependenciesSerializer, request.data)
        job = job_dependencies_set(actor=request.user, job=self.get_object(),
                                   dependencies=body["dependencies"])
        job = job_with_events(job_id=job.pk)
        return Response(_detail_data(job))

    @extend_schema(responses=JobEventSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def events(self, request: Request, pk: str) -> Response:
        """Everything that happened to the job, oldest first."""
        job = check_job_access(actor=request.user, job_id=_int_or_404(pk))
        return Response(JobEventSerializer(job_events(job), many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("tail", int, description="Last lines (1..10000, default 100)."),
            OpenApiParameter("attempt", int, description="Which attempt (1..; default: the "
                             "current one)."),
            OpenApiParameter("replica", int, description="Which replica (0..; default 0)."),
        ],
        responses=inline_serializer("JobLogs", {
            "job": serializers.IntegerField(), "attempt": serializers.IntegerField(),
            "replica": serializers.IntegerField(), "replicas": serializers.IntegerField(),
            "workload": serializers.CharField(), "status": serializers.CharField(),
            "source": serializers.ChoiceField(choices=["live", "archived", "none"]),
            "lines": serializers.ListField(child=serializers.CharField()),
            "empty": serializers.BooleanField(), "note": serializers.CharField(),
            "exit": serializers.CharField(),
            "attempts": serializers.ListField(child=serializers.DictField()),
        }),
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def logs(self, request: Request, pk: str) -> Response:
        """One replica's log of one attempt: live while the attempt runs (the worker's
        copy), kept after it ended, with how it ended (`exit`); `attempts` lists the
        attempts and replicas fairq has logs of."""
        job = check_job_access(actor=request.user, job_id=_int_or_404(pk))
        params = JobLogsParamsSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        tail = min(10_000, max(1, params.validated_data["tail"]))
        view = job_log_read(job=job, attempt=params.validated_data.get("attempt"),
                            replica=params.validated_data["replica"], tail=tail)
        return Response({"job": job.pk, "attempt": view.attempt, "replica": view.replica,
                         "replicas": job.replicas,
                         "workload": view.workload,
                         "status": job.status, "source": view.source, "lines": view.lines,
                         "empty": view.empty, "note": view.note, "exit": view.exit,
                         "attempts": view.attempts})


class JobLogsParamsSerializer(serializers.Serializer[Any]):
    """The logs endpoint's query: `tail` is clamped to 1..10000 (as it always was);
    `attempt` and `replica` must name ones the job has (checked by `job_log_read`)."""

    tail = serializers.IntegerField(required=False, default=100)
    attempt = serializers.IntegerField(required=False, min_value=1)
    replica = serializers.IntegerField(required=False, default=0, min_value=0)


def _job_fields(request: Request, serializer_class: type[JobCreateSerializer]) -> dict[str, Any]:
    """The posted job's fields, shaped. A 400 names every field refused, by its shape or
    by a submit rule of its own (`job_spec_field_problems`), at once; the rules across
    fields (`job_input_build`'s second step) come once every field passes."""
    try:
        return shaped(serializer_class, request.data)
    except ValidationError as exc:
        if not isinstance(exc.detail, dict):
            raise
        detail: dict[str, Any] = dict(cast("dict[str, Any]", exc.detail))
        passed = shaped_partly(serializer_class, request.data, refused=detail)
        rules = job_spec_field_problems(
            actor=request.user, **{name: passed.get(name) for name in _RULED_FIELDS})
        names: list[str] = list(serializer_class().fields.keys())  # declared order, as DRF's
        merged: dict[str, Any] = {name: detail.get(name) or rules[name] for name in names
                                  if name in detail or name in rules}
        merged.update({name: value for name, value in detail.items() if name not in merged})
        # A nested field's rule ("resources.cpu") when its shape passed.
        merged.update({name: value for name, value in rules.items()
                       if name not in merged and name.split(".")[0] not in detail})
        raise ValidationError(merged) from None


def _array_size(fields: dict[str, Any]) -> tuple[int, int | None, tuple[int, ...] | None]:
    """`count`, `max_running` and the indices (None: 0..count-1) of a bulk submit, from
    `count` or Slurm's `array` (queueing/policy/arrays.py; `fairq submit -a` reads it the
    same). A 400 naming the field when neither, both or a bad one is given."""
    count, max_running = fields.pop("count", None), fields.pop("max_running", None)
    text = fields.pop("array", None)
    if text is None:
        if count is None:
            raise ValidationError({"count": [
                "Give count (N tasks) or array (indices as Slurm writes them: 0-99%4, "
                "1,3,5, 0-15:4)."]})
        return count, max_running, None
    if count is not None:
        raise ValidationError({"array": ["Give count or array, not both."]})
    try:
        spec = parse_array_spec(text, max_tasks=MAX_BULK_JOBS)
    except ArraySpecError as exc:
        raise ValidationError({"array": [str(exc)]}) from None
    if max_running is not None and spec.max_running is not None \
            and max_running != spec.max_running:
        raise ValidationError({"max_running": [
            f"{max_running} here, %{spec.max_running} in array: give one."]})
    return (spec.count, max_running or spec.max_running,
            None if spec.dense else spec.indices)


_RULED_FIELDS = ("team", "name", "image", "env", "gpu_type", "tier", "resources", "shm_size",
                 "volumes", "secrets", "image_pull_secret", "working_dir", "labels",
                 "annotations")


def _detail_data(job: Job) -> Any:
    """The job with its events, priority and place in the queue (rules P1-P3)."""
    explain = job_explain(job=job, now=timezone.now())
    return JobDetailSerializer(job, context={"explain": {job.pk: explain}}).data


def _with_events(job: Job) -> Job:
    """`job` as the access check loaded it (its team, GPU type, tier and submitter with
    it), its events read in one more query: the detail's answer without loading the job
    twice more (`get_object` checks access again, then reads it again)."""
    return job_events_prefetch(job)


def _etag(job: Job) -> str | None:
    """The job's weak ETag (see `retrieve`); None while it is queued."""
    if job.state == JobState.QUEUED:
        return None
    # The utilization (rule U5) is sampled each minute without touching the job row.
    return (f'W/"job-{job.pk}-{job.updated_at.timestamp():.6f}'
            f'-u{utilization_version(job)}"')


def _int_or_404(value: str) -> int:
    number = ascii_int(value)
    if number is None:
        raise NotFound(f"job {value} not found")
    return number


class FairShareView(APIView):
    """Fair-share standings (rules F1-F4), like Slurm's sshare, of the caller's teams
    (every team for staff, or with FAIRQ_FAIRSHARE_PUBLIC); `?at=` an ISO 8601 instant
    gives them as of then (the numbers of `manage.py fairshare`)."""

    @extend_schema(
        responses=inline_serializer("FairShareStandings", {
            "as_of": serializers.DateTimeField(),
            "half_life_hours": serializers.FloatField(),
            "teams": StandingSerializer(many=True),
        }),
        parameters=[OpenApiParameter("at", str, description="ISO 8601 instant with offset"),
                    OpenApiParameter("users", bool, description=(
                        "Also each team's users with their usage (`users` per team, "
                        "like sshare -a); now only."))],
    )
    def get(self, request: Request) -> Response:
        now = timezone.now()
        with_users = _flag_or_400(request.query_params, "users")
        at = _instant_or_400(request.query_params.get("at")) or now
        if at < now - timedelta(seconds=1) and not request.user.is_staff:

            # A past instant rescans the whole usage history (seconds at 10M records).
            raise DomainError("Only staff may ask for standings at a past instant; the "
                              "standings snapshots keep their history.",
                              fields={"at": ["Must not be in the past."]})
        standings = standings_sorted(fairshare_standings_at(at=at, now=now))
        visible = teams_in_standings_for(actor=request.user)
        if visible is not None:
            standings = [s for s in standings if s.team in visible]
        teams = StandingSerializer([standing_as_dict(s) for s in standings], many=True).data
        if with_users:
            if at < now - timedelta(seconds=1):
                raise DomainError("Per-user usage is for now only.",
                                  fields={"users": ["Not with a past 'at'."]})
            per_team = user_usage(teams=[s.team for s in standings], at=at)
            for item in teams:
                item["users"] = UserUsageSerializer(per_team.get(item["team"], []),
                                                    many=True).data
        return Response({
            "as_of": at.isoformat(),
            "half_life_hours": half_life_hours(),
            "teams": teams,
        })


def _flag_or_400(params: Any, name: str) -> bool:

    raw = params.get(name)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in {"1", "true", "yes"}:
        return True
    if value in {"0", "false", "no"}:
        return False
    raise DomainError(f"{name} must be true or false.", fields={name: ["Must be 1/0 or true/false."]})


def _instant_or_400(value: str | None) -> datetime | None:

    if value is None:  # absent: now; present but empty is not an instant
        return None
    try:
        return parse_instant(value)
    except InstantError as exc:
        raise DomainError("at must be an ISO 8601 instant with an offset.",
                          fields={"at": [str(exc)]}) from None
