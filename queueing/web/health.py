"""Probes for the web pods (docs/deployment.md, "Health"). Unauthenticated, tiny, and
exempt from the HTTPS redirect (config/settings/prod.py): the kubelet calls the pod
directly over HTTP."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from queueing.health import readiness


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process serves requests. No database or Redis check: an outage of
    either must take the pods out of the Service (readiness), not restart all of them."""
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 when PostgreSQL and Redis answer, else 503 naming what failed."""
    report = readiness()
    body = {"status": "ok" if report["ready"] else "unavailable", "checks": report["checks"]}
    return JsonResponse(body, status=200 if report["ready"] else 503)
