"""Server-rendered pages (the full dashboard has its own issue) and the health check."""

from __future__ import annotations

from django.db import connection
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from queueing.backends import get_backend
from queueing.models import Job
from queueing.policy.states import JobState
from queueing.selectors import jobs_visible_to
from queueing.services.usage import fairshare_standings


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def home(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    context: dict[str, object] = {"now": now}
    if request.user.is_authenticated:
        jobs = jobs_visible_to(actor=request.user)
        context["counts"] = jobs.aggregate(
            **{s.lower(): Count("id", filter=Q(status=s)) for s in JobState}
        )
        context["recent"] = list(jobs.order_by("-id")[:25])
        context["standings"] = sorted(fairshare_standings(now=now).values(),
                                      key=lambda s: -s.factor)
        nodes = get_backend().nodes()
        by_type: dict[str, list[int]] = {}
        for n in nodes:
            t = by_type.setdefault(n.gpu_type, [0, 0])
            t[0] += n.capacity
            t[1] += n.allocated
        context["capacity"] = sorted(by_type.items())
        context["queued_total"] = Job.objects.filter(status=JobState.QUEUED).count()
    return render(request, "home.html", context)
