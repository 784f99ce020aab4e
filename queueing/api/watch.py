"""Watching jobs without polling: a long poll of one job (`GET /jobs/{id}/?wait=S`) and a
server-sent event stream of a team's job events (`GET /jobs/stream/`).

Both look at the database every `POLL_SECONDS` (an indexed read of the job row, or of the
events after the last one sent), not at Redis pub/sub: no writer has to publish, and an
event of any process (scheduler, web, Celery) is seen. What it costs: a watching request
holds its worker (a gunicorn *sync* worker: the whole process) for up to `WAIT_MAX_SECONDS`
(long poll) or `STREAM_MAX_SECONDS` (stream), and makes 2-3 small queries per
`POLL_SECONDS`. Serve watchers from gthread workers (docs/api.md, "Watching jobs").
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueing.errors import DomainError
from queueing.models import Job, JobEvent
from queueing.policy.states import JobState
from queueing.selectors.events import (
    job_has_event_after,
    job_watched_fields_reload,
    last_event_id,
    newest_event_id,
    team_events_after,
)
from queueing.validation import ascii_int

from .scope import teams_asked

WAIT_MAX_SECONDS = 60
POLL_SECONDS = 0.5
STREAM_MAX_SECONDS = 300
HEARTBEAT_SECONDS = 15.0
# A stream re-reads this many event ids below the last one sent: an event whose
# transaction commits after a later id's was sent is still seen (ids are allocated
# before commit).
STREAM_LOOKBACK_IDS = 200
STREAM_BATCH = 500
FINAL = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}

WAIT_PARAMETERS = [
    OpenApiParameter("wait", int, description=(
        f"Long poll: hold the answer up to this many seconds (1..{WAIT_MAX_SECONDS}) until "
        "the job changes against `If-None-Match` or `since_event` (without either: against "
        "the job as it was when the request came); 304 with no body when nothing changed. "
        "A finished job answers at once.")),
    OpenApiParameter("since_event", int, description=(
        "With `wait`: the id of the last event the caller has seen (the `Fairq-Last-Event` "
        "header, or the largest `events[].id`); any newer event is a change.")),
]


def _int_param(params: Any, name: str, *, low: int, high: int | None) -> int | None:
    raw = params.get(name)
    if raw is None:
        return None
    value = ascii_int(raw)
    if value is None or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise DomainError(f"{name} must be a whole number {bound}.",
                          fields={name: [f"Must be a whole number {bound}."]})
    return value


def wait_params(request: Request) -> tuple[int | None, int | None]:
    """(`wait` seconds, `since_event`) of a job read; 400 naming the field when either is
    not a whole number in range, or `since_event` comes without `wait`."""
    wait = _int_param(request.query_params, "wait", low=1, high=WAIT_MAX_SECONDS)
    since = _int_param(request.query_params, "since_event", low=0, high=None)
    if since is not None and wait is None:
        raise DomainError("since_event goes with wait.",
                          fields={"since_event": ["Only with wait."]})
    return wait, since


def job_wait(*, job: Job, seconds: int, since_event: int | None, etags: list[str],
             etag_of: Callable[[Job], str | None],
             sleep: Callable[[float], None] = time.sleep) -> tuple[Job, bool]:
    """Hold until `job` changed against the caller's view, at most `seconds`: (the job as
    it is now, whether it changed). The caller's view: a newer event than `since_event`;
    an ETag (`etag_of`) not among `etags`; with neither, the job's row and events as they
    are on entry. A finished job is not waited on: it changes no more."""
    baseline_events = since_event if since_event is not None else (
        None if etags else last_event_id(job.pk))
    baseline_updated = job.updated_at if since_event is None and not etags else None
    deadline = time.monotonic() + seconds
    while True:
        changed = (baseline_updated is not None and job.updated_at != baseline_updated) or (
            baseline_events is not None and job_has_event_after(
                job_id=job.pk, event_id=baseline_events))
        if not changed and etags:
            tag = etag_of(job)
            changed = tag is None or tag not in etags
        if changed or job.state in FINAL or time.monotonic() >= deadline:
            return job, changed
        sleep(min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        job_watched_fields_reload(job=job)


class EventStreamRenderer(BaseRenderer):
    """Lets `Accept: text/event-stream` through content negotiation; an error before the
    stream starts is written as its JSON body."""

    media_type = "text/event-stream"
    format = "event-stream"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Any = None) -> bytes:
        return json.dumps(data).encode()


def _event_text(e: JobEvent) -> str:
    data = {"id": e.pk, "job": e.job_id, "team": e.job.team.slug, "name": e.job.name,
            "status": e.job.status, "kind": e.kind, "from_status": e.from_status,
            "to_status": e.to_status, "reason": e.reason, "attempt": e.attempt,
            "at": e.at.isoformat(), "exit_code": e.job.exit_code}
    return f"id: {e.pk}\nevent: {e.kind}\ndata: {json.dumps(data)}\n\n"


def event_stream(*, team_ids: list[int], after: int, seconds: float,
                 sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """The SSE text of the teams' job events after id `after`, oldest first, for
    `seconds`; a heartbeat comment every `HEARTBEAT_SECONDS` without events."""
    yield f"retry: {int(POLL_SECONDS * 4000)}\n\n"
    started = time.monotonic()
    beat = started
    sent: set[int] = set()
    last = after
    while True:
        rows = team_events_after(team_ids=team_ids, after=max(after, last - STREAM_LOOKBACK_IDS),
                                 skip=sent, limit=STREAM_BATCH)
        for e in rows:
            sent.add(e.pk)
            last = max(last, e.pk)
            yield _event_text(e)
        sent = {i for i in sent if i > last - STREAM_LOOKBACK_IDS}
        now = time.monotonic()
        if rows:
            beat = now
        if now - started >= seconds:
            yield f": the stream ends after {seconds:.0f}s; reconnect with Last-Event-ID\n\n"
            return
        if len(rows) < STREAM_BATCH:
            if now - beat >= HEARTBEAT_SECONDS:
                beat = now
                yield ": heartbeat\n\n"
            sleep(min(POLL_SECONDS, max(0.0, seconds - (now - started))))


class JobStreamView(APIView):
    """Server-sent events of the jobs of a team (`team`) or of every team the caller may
    see: one event per job event (a state change is `event: transition`), its `id` the
    event's id; `Last-Event-ID` (or `last_event_id`) resumes after it, without it the
    stream starts with the next event. A `: heartbeat` comment every 15 s; the stream ends
    after `duration` seconds (at most 300): reconnect with `Last-Event-ID`."""

    renderer_classes = [JSONRenderer, EventStreamRenderer]

    def finalize_response(self, request: Request, response: Any, *args: Any,
                          **kwargs: Any) -> Any:
        """An error (400, 401, 404, 429) is JSON whatever the client accepted: it is
        the API's error body, not an event."""
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = "application/json"
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(
        operation_id="jobs_stream",
        parameters=[
            OpenApiParameter("team", str, description="A team's slug (default: the caller's "
                             "teams; every team for staff)."),
            OpenApiParameter("duration", int, description=f"Seconds before the stream ends "
                             f"(1..{STREAM_MAX_SECONDS}, default {STREAM_MAX_SECONDS})."),
            OpenApiParameter("last_event_id", int, description="Resume after this event id "
                             "(as the Last-Event-ID header)."),
            OpenApiParameter("Last-Event-ID", int, OpenApiParameter.HEADER,
                             description="Resume after this event id."),
        ],
        responses={(200, "text/event-stream"): OpenApiResponse(
            description="`id: N`, `event: KIND`, `data: {id, job, team, name, status, kind, "
                        "from_status, to_status, reason, attempt, at, exit_code}`.")},
    )
    def get(self, request: Request) -> StreamingHttpResponse:
        teams = teams_asked(user=request.user, slug=request.query_params.get("team"))
        team_ids = [t.pk for t in teams]
        seconds = _int_param(request.query_params, "duration", low=1,
                             high=STREAM_MAX_SECONDS) or STREAM_MAX_SECONDS
        header = request.headers.get("Last-Event-ID")
        params = {"last_event_id": header} if header is not None else request.query_params
        after = _int_param(params, "last_event_id", low=0, high=None)
        if after is None:
            after = newest_event_id()
        response = StreamingHttpResponse(
            event_stream(team_ids=team_ids, after=after, seconds=seconds),
            content_type="text/event-stream; charset=utf-8")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
        return response
