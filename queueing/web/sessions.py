"""The notebook session pages (docs/dashboard.md, "Notebook sessions"): the "Start a
notebook" form, a session's page, its Stop button; the dashboard's "My sessions" card
reads `my_sessions`. Thin: forms validate shapes, services decide."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounts.models import Team
from queueing.errors import DomainError, NotFound
from queueing.errors import PermissionDenied as Refused
from queueing.models import GpuType, Job
from queueing.selectors.lookups import gpu_types_by_slug
from queueing.selectors.sessions import session_live, session_row, session_rows, sessions_visible_to
from queueing.services.sessions import (
    can_open_session,
    servers_unavailable_reason,
    session_get_for_actor,
    session_start,
    session_stop,
)

MAX_ON_DASHBOARD = 10


def gpu_choices(types: list[GpuType]) -> list[tuple[str, str]]:
    """The form's GPU options: each fraction of a type shared in slices first (a session
    preferably runs on one), saying it has no memory isolation; then whole GPUs."""
    fractions, whole = [], []
    for t in sorted(types, key=lambda t: t.slug):
        if t.packs_slices:
            s = t.slices_per_gpu
            for k in range(1, s):
                fractions.append((f"{t.slug}:f{k}/{s}",
                                  f"{k}/{s} of one {t.slug} GPU ({t.sharing}, no memory "
                                  "isolation)"))
        unit = "MIG instance" if t.sharing == "mig" else "GPU"
        whole.append((f"{t.slug}:g1", f"1 whole {t.slug} {unit}"))
    return fractions + whole


class SessionStartForm(forms.Form):
    team = forms.ChoiceField()
    gpu = forms.ChoiceField(label="GPU", help_text=(
        "A fraction shares one GPU with other sessions and jobs: time-sliced and MPS "
        "give no memory isolation (another user's process may use the GPU's memory)."))
    pvc = forms.ChoiceField(label="PVC (the notebook's files)", required=False, help_text=(
        "Mounted as the notebook's root: its files stay after the session. None: files "
        "live in the pod and go with it."))
    hours = forms.FloatField(label="Time limit (hours)", min_value=0.1, initial=4,
                             help_text="The session stops at its time limit.")
    idle_minutes = forms.IntegerField(label="Stop after idle (minutes)", min_value=1,
                                      initial=60, help_text=(
                                          "No kernel activity and idle GPUs this long: "
                                          "stopped (you are warned first)."))
    image = forms.CharField(required=False, max_length=512, help_text=(
        "Leave empty for the platform's notebook image."))

    def __init__(self, *args: Any, teams: list[Team], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        pvcs = sorted({p for t in teams for p in (t.allowed_pvcs or [])})
        for name, choices in (("team", [(t.slug, t.slug) for t in teams]),
                              ("gpu", gpu_choices(list(gpu_types_by_slug().values()))),
                              ("pvc", [("", "none")] + [(p, p) for p in pvcs])):
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            field.choices = choices
        self.fields["image"].widget.attrs["placeholder"] = settings.FAIRQ_NOTEBOOK_IMAGE
        self.fields["hours"].initial = min(4.0, float(settings.FAIRQ_SESSION_DEFAULT_HOURS))
        self.fields["idle_minutes"].initial = settings.FAIRQ_SESSION_IDLE_MINUTES


def _teams(request: HttpRequest) -> list[Team]:
    from accounts.selectors import teams_for_user_by_slug

    return list(teams_for_user_by_slug(user=request.user))


def my_sessions(request: HttpRequest) -> list[dict[str, Any]]:
    """The dashboard's "My sessions": the user's live ones and the last ended, newest
    first."""
    jobs = list(sessions_visible_to(actor=request.user, mine=True)[:MAX_ON_DASHBOARD])
    return session_rows(jobs, now=timezone.now())


@login_required
def session_new(request: HttpRequest) -> HttpResponse:
    teams = _teams(request)
    form = SessionStartForm(request.POST or None, teams=teams)
    if request.method == "POST" and form.is_valid():
        slug, _, gpu = form.cleaned_data["gpu"].partition(":")
        fields: dict[str, Any] = {"gpu_type": slug}
        if gpu.startswith("f"):
            fields["gpu_fraction"] = gpu[1:]
        else:
            fields["gpus"] = int(gpu[1:] or 1)
        try:
            job = session_start(
                actor=request.user, team=form.cleaned_data["team"], pvc=form.cleaned_data["pvc"]
                or None, image=form.cleaned_data["image"] or None,
                idle_minutes=form.cleaned_data["idle_minutes"],
                max_runtime_seconds=round(form.cleaned_data["hours"] * 3600), **fields)
        except DomainError as exc:
            names = {"gpu_type": "gpu", "gpu_fraction": "gpu", "gpus": "gpu",
                     "max_runtime_seconds": "hours", "volumes": "pvc"}
            for field, problems in (exc.fields or {}).items():
                target = names.get(field.split("[")[0].split(".")[0], field)
                for p in problems:
                    form.add_error(target if target in form.fields else None, p)
            if not exc.fields:
                form.add_error(None, exc.message)
        else:
            messages.success(request, f"Notebook session #{job.pk} started: it opens once it "
                                      "runs.")
            return redirect("web:session", job_id=job.pk)
    return render(request, "web/session_new.html", {"form": form,
                                                    "no_servers": servers_unavailable_reason()})


def _session_or_404(request: HttpRequest, job_id: int) -> Job:
    try:
        return session_get_for_actor(actor=request.user, job_id=job_id)
    except NotFound as exc:
        raise Http404(str(exc)) from exc


@login_required
def session_page(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _session_or_404(request, job_id)
    row = session_row(job, now=timezone.now())
    ctx = {"job": job, "s": row, "live": session_live(job),
           "may_open": can_open_session(request.user, job),
           "no_servers": servers_unavailable_reason(), "now": timezone.now()}
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "web/_session_live.html", ctx)
    return render(request, "web/session.html", ctx)


@require_POST
@login_required
def session_stop_view(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _session_or_404(request, job_id)
    try:
        session_stop(actor=request.user, job=job)
        messages.success(request, f"Session #{job.pk} stopped; its PVC and files are kept.")
    except Refused as exc:
        raise PermissionDenied(exc.message) from exc
    except DomainError as exc:
        messages.error(request, exc.message)
    # From the dashboard's table back to the dashboard; else the session's page.
    if request.POST.get("back") == "dashboard":
        return redirect("web:home")
    return redirect("web:session", job_id=job.pk)
