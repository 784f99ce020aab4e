"""Floors for bench/bench_api.py: what the same gunicorn, client and machine do with less
than fairq's submit, so its rate can be read against them.

* `wsgi_app`: a bare WSGI callable that reads the body and answers 201 (gunicorn and the
  client alone).
* `urlpatterns` (settings `bench.settings_api` with FAIRQ_BENCH_URLCONF=bench.floor_app):
  a plain Django view behind fairq's middleware, no DRF, that does the submit's three
  statements through the same functions (the token and its user, the team membership, the
  job and its event) and answers the new id: no validation, no hash check, no throttle, no
  idempotency, a two-field answer. It is not a usable endpoint; it only measures Django's
  share.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    body = b'{"id": 1, "status": "QUEUED"}'
    start_response("201 Created", [("Content-Type", "application/json"),
                                   ("Content-Length", str(len(body)))])
    return [body]


@csrf_exempt
def django_submit(request: HttpRequest) -> JsonResponse:
    from accounts.selectors import api_token_with_user
    from queueing.selectors.lookups import gpu_types_by_slug, team_for_submitter, tiers_by_slug
    from queueing.services.jobs import JobInput, job_submit_with_event

    key = request.headers["Authorization"].split()[1]
    token = api_token_with_user(prefix=key.split("_", 2)[1])
    assert token is not None
    d = json.loads(request.body)
    team = team_for_submitter(user=token.user, slug=d["team"])
    assert team is not None
    job, _, _ = job_submit_with_event(actor=token.user, data=JobInput(
        team=team, name=d["name"], image=d["image"], command=d["command"], args=d["args"],
        env=d["env"], gpu_type=gpu_types_by_slug()[d["gpu_type"]],
        gpus_per_replica=d["gpus"], replicas=d["replicas"], tier=tiers_by_slug()[d["tier"]],
        max_runtime_seconds=d["max_runtime_seconds"]))
    return JsonResponse({"id": job.pk, "status": job.status}, status=201)


urlpatterns = [path("api/v1/jobs/", django_submit)]
