"""Server-rendered pages (docs/dashboard.md). Thin: each view resolves the tenant through
the selectors (404 across teams), calls one service, and renders. HTMX requests get the
fragment they swap; the same templates render the full page."""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from accounts.models import AuditEntry, Team
from accounts.selectors import (
    active_user_by_username,
    first_team_for_user,
    is_team_admin,
    membership_of_team,
    memberships_of_team,
    quota_audit_entries,
    team_by_slug,
    team_get_for_user,
    team_reload,
    team_switcher_teams,
    teams_for_user_by_slug,
    token_of_user,
    tokens_of_user,
)
from accounts.services import (
    KEY_SHOWN_ONCE,
    idempotency_claim,
    idempotency_complete,
    idempotency_release,
    membership_remove,
    membership_set,
    team_resources,
    team_resources_set,
    team_update,
    team_workload_policy,
    team_workload_policy_set,
    token_issue,
    token_revoke,
)
from fairq_cli.durations import format_duration
from queueing.errors import DomainError, NotFound
from queueing.errors import PermissionDenied as Refused
from queueing.models import Job
from queueing.policy.states import JobState
from queueing.selectors import dashboard as dash
from queueing.selectors.arrays import job_array, job_dependencies
from queueing.selectors.attempts import job_attempts
from queueing.selectors.capacity import capacity_by_gpu_type, overcommit_warnings
from queueing.selectors.checkpoints import job_checkpoints
from queueing.selectors.cluster import cluster_view
from queueing.selectors.clusters import cluster_name, cluster_summaries, clusters_configured
from queueing.selectors.fairshare import teams_in_standings_for
from queueing.selectors.jobs import (
    job_events_with_actor,
    label_filter_parse,
    team_job_list,
)
from queueing.selectors.metrics import scheduler_health
from queueing.selectors.queue_plan import Preview, job_explain, submit_preview, team_queue
from queueing.selectors.reference import gpu_type_by_slug
from queueing.selectors.reservations import (
    booked_timeline,
    next_windows,
    reservations_visible_to,
)
from queueing.selectors.utilization import idle_flags, idle_since, job_utilization
from queueing.selectors.webhooks import (
    webhook_deliveries,
    webhook_endpoint_get,
    webhook_endpoints_of_team,
)
from queueing.services.access import (
    check_job_access,
    check_staff,
    check_team_admin,
    check_team_member,
    may_cancel,
)
from queueing.services.job_input import job_input_of
from queueing.services.jobs import job_cancel, job_spec, job_submit
from queueing.services.logs import LogView, job_log_read
from queueing.services.quotas import quota_set
from queueing.services.webhooks import (
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_update,
)

from .forms import (
    JobSubmitForm,
    MemberForm,
    QuotaForm,
    RoleForm,
    TeamParentForm,
    TeamResourcesForm,
    TeamWeightForm,
    TeamWorkloadPolicyForm,
    TokenForm,
    WebhookEndpointForm,
    spec_initial,
)
from .options import team_options
from .sessions import my_sessions

TEAM_SESSION_KEY = "fairq_team"
NEW_TOKEN_SESSION_KEY = "fairq_new_token"
LAST_WEB_JOB_SESSION_KEY = "fairq_last_web_job"  # {team slug: id of the user's last web job}


def healthz_scheduler(request: HttpRequest) -> JsonResponse:
    """The scheduler's deep check (docs/deployment.md): 503 "stale" when the last
    successful cycle is older than FAIRQ_SCHEDULER_STALE_CYCLES intervals or none is
    recorded, 503 "behind" when cycles come further apart than
    FAIRQ_SCHEDULER_BEHIND_CYCLES intervals. Not the web's own liveness: a stuck worker
    must not take the web down with it."""
    health = scheduler_health()
    body = dict(health)
    del body["healthy"]
    return JsonResponse(body, status=200 if health["healthy"] else 503)


# --- the current team ------------------------------------------------------------------------

def current_team(request: HttpRequest) -> Team | None:
    """The team the user picked in the switcher (kept in the session), else their first."""
    if not request.user.is_authenticated:
        return None
    if hasattr(request, "_fairq_team"):
        cached: Team | None = request._fairq_team
        return cached
    slug = request.session.get(TEAM_SESSION_KEY)
    team = team_get_for_user(user=request.user, slug=slug) if slug else None
    if team is None:
        team = first_team_for_user(user=request.user)
    request._fairq_team = team  # type: ignore[attr-defined]
    return team


def _show_team(request: HttpRequest, team: Team) -> None:
    """A page about one team (its team page, one of its jobs) makes it the current team,
    as the switcher does: the header and the page name the same team, and the dashboard
    shows it next. Only a team of the user's own (staff may open any)."""
    if team_get_for_user(user=request.user, slug=team.slug) is None:
        return
    if request.session.get(TEAM_SESSION_KEY) != team.slug:
        request.session[TEAM_SESSION_KEY] = team.slug
    request._fairq_team = team  # type: ignore[attr-defined]


def nav(request: HttpRequest) -> dict[str, Any]:
    """Context processor: the team switcher."""
    if not request.user.is_authenticated:
        return {}
    teams = team_switcher_teams(user=request.user)
    team = current_team(request)
    return {"nav_teams": teams, "nav_team": team,
            "nav_team_options": team_options([t.slug for t in teams],
                                             team.slug if team is not None else "")}


@require_POST
@login_required
def team_switch(request: HttpRequest) -> HttpResponse:
    team = _team_or_404(request, request.POST.get("team", ""))
    request.session[TEAM_SESSION_KEY] = team.slug
    nxt = request.POST.get("next") or "/"
    return redirect(nxt if nxt.startswith("/") and not nxt.startswith("//") else "/")


def _user(request: HttpRequest) -> User:
    """The logged-in user (views behind login_required)."""
    assert isinstance(request.user, User)
    return request.user


def _team_or_404(request: HttpRequest, slug: str) -> Team:
    try:
        return check_team_member(actor=request.user, slug=slug)
    except NotFound as exc:
        raise Http404("no such team") from exc


def _job_or_404(request: HttpRequest, job_id: int) -> Job:
    try:
        return check_job_access(actor=request.user, job_id=job_id)
    except NotFound as exc:
        raise Http404(str(exc)) from exc


def _team_admin_or_403(request: HttpRequest, team: Team) -> None:
    try:
        check_team_admin(actor=request.user, team=team)
    except Refused as exc:
        raise PermissionDenied(exc.message) from exc


# --- dashboard -------------------------------------------------------------------------------

def _dashboard_context(request: HttpRequest) -> dict[str, Any]:
    now = timezone.now()
    team = current_team(request)
    ctx: dict[str, Any] = {"now": now, "team": team}
    standings = dash.standings(now=now, cached=True)
    # Other teams' standings, usage and GPUs held only as far as docs/api.md says.
    visible = teams_in_standings_for(actor=request.user)
    history = dash.usage_history(now=now, current=standings, only=visible)
    # The card shows the cluster's allocation and the GPUs each team holds: not the
    # queue's demand (a sum over every queued job) nor the guarantees.
    capacity, ctx["cluster_error"] = dash.capacity_held_cached()
    if visible is not None:
        standings = [s for s in standings if s.team in visible]
        history = {**history, "series": {t: v for t, v in history["series"].items()
                                         if t in visible}}
        capacity = [dataclasses.replace(c, by_team={t: n for t, n in c.by_team.items()
                                                    if t in visible}) for c in capacity]
    ctx["standings"] = standings
    ctx["history"] = history
    ctx["capacity"] = capacity
    # Booked GPUs of the next week (docs/reservations.md); other teams named only as far
    # as the standings are.
    ctx["timeline"], ctx["days"] = booked_timeline(now=now), 7
    if visible is not None:
        ctx["timeline"] = [dataclasses.replace(row, windows=[
            (w if w.team in visible else dataclasses.replace(w, team="another team", name=""),
             left, width) for w, left, width in row.windows]) for row in ctx["timeline"]]
    # Rules K1-K8: capacity per cluster, when clusters are configured (the implicit one
    # alone is the capacity card above).
    ctx["clusters"] = [c for c in cluster_summaries()[0] if not c.implicit] \
        if clusters_configured() else []
    ctx["snapshot_minutes"] = round(settings.FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS / 60)
    ctx["half_life_hours"] = settings.FAIRQ_DECAY_HALF_LIFE_HOURS
    if team is not None:
        ctx["queue"], ctx["queue_total"] = team_queue(team=team, now=now, limit=25)
        ctx["running"] = dash.team_running(team=team)
        flags = idle_flags(ctx["running"])
        for job in ctx["running"]:
            job.idle_since = flags.get(job.pk)  # the badge (rule U2)
        ctx["recent"] = dash.team_recent_done(team=team)
        ctx["preempted"] = dash.team_recent_preemptions(team=team, now=now)
        # Its standing at each level of the quota tree (docs/dashboard.md).
        ctx["tree_standing"] = dash.team_standing_cached(team=team.slug)
    # docs/dashboard.md, "Notebook sessions" (`owns_sessions`: most users own none).
    ctx["sessions"] = my_sessions(request) if dash.owns_sessions(
        user_id=request.user.pk) else []
    return ctx


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    if not request.user.is_authenticated:
        return render(request, "web/landing.html")
    ctx = _dashboard_context(request)
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "web/_live.html", ctx)
    return render(request, "web/dashboard.html", ctx)


# --- jobs --------------------------------------------------------------------------------------

@require_GET
@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    team = current_team(request)
    status = request.GET.get("status") or None
    if status not in {None, *(s.value for s in JobState)}:
        status = None
    try:
        before = int(request.GET["before"]) if request.GET.get("before") else None
    except ValueError:
        before = None
    array = request.GET.get("array", "")
    array = array if array.isdigit() else ""
    labels = [item for item in request.GET.getlist("label") if item.strip()]
    label_error = ""
    pairs: list[tuple[str, str]] | None
    try:
        pairs = label_filter_parse(labels)
    except ValueError as exc:
        label_error, pairs = str(exc), None
    # `array`: one array job's members (the job page links here).
    jobs = team_job_list(actor=request.user, team=team,
                         array_id=int(array) if array else None, labels=pairs)
    page, next_before = dash.job_page(jobs=jobs, before=before, status=status)
    ctx = {"team": team, "jobs": page, "next_before": next_before, "status": status,
           "statuses": [s.value for s in JobState], "before": before, "now": timezone.now(),
           "labels": labels, "label_error": label_error, "array": array,
           "with_clusters": clusters_configured(),
           "filter_query": urlencode([*([("status", status)] if status else []),
                                      *([("array", array)] if array else []),
                                      *(("label", item) for item in labels)])}
    return render(request, "web/job_list.html", ctx, status=400 if label_error else 200)


def _submit_form(request: HttpRequest, data: Any = None) -> JobSubmitForm:
    teams = list(teams_for_user_by_slug(user=request.user))
    team = current_team(request)
    initial: dict[str, Any] = {"team": team.slug if team else None}
    if team is not None:
        web_jobs = request.session.get(LAST_WEB_JOB_SESSION_KEY) or {}
        defaults = dash.team_submit_defaults(team=team, user=request.user,
                                             web_job_id=web_jobs.get(team.slug))
        if defaults.get("max_runtime_seconds"):
            defaults["max_runtime_seconds"] = format_duration(defaults["max_runtime_seconds"])
        initial.update({k: v for k, v in defaults.items() if v is not None})
    source = request.GET.get("from")
    if source and source.isdigit():
        try:
            job = check_job_access(actor=request.user, job_id=int(source))
        except NotFound:
            job = None
        if job is not None:
            initial.update(_job_initial(job))
    return JobSubmitForm(data, request=request, teams=teams, initial=initial)


def _job_initial(job: Job) -> dict[str, Any]:
    """The submit form filled in with `job`'s spec (its lists and maps as the form's text)
    and its cluster fields (rules K3, K4)."""
    return spec_initial({**job_spec(job), **_job_cluster_fields(job)})


def _job_cluster_fields(job: Job) -> dict[str, Any]:
    """The job's pin (by name), cluster selector and spot opt-in, as submitted."""
    return {"requested_cluster": cluster_name(job.requested_cluster_id),
            "cluster_selector": dict(job.cluster_selector or {}),
            "allow_spot": job.allow_spot}


def _preview(form: JobSubmitForm) -> Preview | None:
    inp = form.job_input
    if inp is None:
        return None
    return submit_preview(team=inp.team, gpu_type=inp.gpu_type,
                          gpus_per_replica=inp.gpus_per_replica, replicas=inp.replicas,
                          tier_rank=inp.tier.rank, now=timezone.now(),
                          cpu_millicores=inp.cpu_millicores, memory_bytes=inp.memory_bytes,
                          topology=inp.topology, gpu_types=inp.gpu_types,
                          flavor_fallback=inp.team.flavor_fallback or inp.tier.flavor_fallback,
                          gpu_slices=inp.gpu_slices)


def _form_errors(form: forms.Form, exc: DomainError) -> None:
    """A service's refusal on the form's fields (the rest as a form-wide error)."""
    if not exc.fields:
        form.add_error(None, exc.message)
    for field, msgs in exc.fields.items():
        for msg in msgs:
            form.add_error(field if field in form.fields else None, msg)


@login_required
def job_new(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = _submit_form(request, request.POST)
        status = 400
        if form.is_valid() and form.job_input is not None:
            key = request.POST.get("idempotency_key") or None
            try:
                job, _ = job_submit(actor=request.user, data=form.job_input,
                                    idempotency_key=key)
            except DomainError as exc:  # the service's rules (T1: the tier; the key), on the form
                _form_errors(form, exc)
                status = exc.status_code
            else:
                # The next form's defaults (dash.team_submit_defaults): this user's own
                # last web submission to this team.
                request.session[LAST_WEB_JOB_SESSION_KEY] = {
                    **(request.session.get(LAST_WEB_JOB_SESSION_KEY) or {}),
                    job.team.slug: job.pk}
                messages.success(request, f"Job #{job.pk} {job.name} queued.")
                return redirect("web:job-detail", job_id=job.pk)
    else:
        form = _submit_form(request)
        status = 200
    ctx = {"form": form, "idempotency_key": secrets.token_urlsafe(16), "preview": None,
           "advanced_open": bool(request.POST.get("advanced_open"))}
    return render(request, "web/job_new.html", ctx, status=status)


@require_POST
@login_required
def job_check(request: HttpRequest) -> HttpResponse:
    """HTMX: validate the form as typed and preview where the job would stand."""
    form = _submit_form(request, request.POST)
    valid = form.is_valid()
    if not valid:
        # While the user is still filling the form in, an empty field is not an error yet:
        # only what was typed is checked (the submit itself reports everything).
        for name in list(form.errors):
            if name in form.fields and not str(request.POST.get(name, "")).strip():
                del form.errors[name]
    ctx = {"form": form, "preview": _preview(form) if valid else None, "checked": True,
           "idempotency_key": request.POST.get("idempotency_key", ""),
           "advanced_open": bool(request.POST.get("advanced_open"))}
    return render(request, "web/_job_form.html", ctx)


@require_GET
@login_required
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_or_404(request, job_id)
    _show_team(request, job.team)
    now = timezone.now()
    events = job_events_with_actor(job)
    try:
        explain = job_explain(job=job, now=now, standings=dash.standings_by_team(now=now))
    except Exception as exc:  # the explanation is a convenience: never fail the page
        explain = {"priority": None, "queue": None, "error": str(exc)[:200]}
    log_view, log_error = _job_log(request, job)
    attempts = job_attempts(job, now=now)
    ctx = {"job": job, "events": events, "explain": explain, "now": now,
           # Graceful stop: the newest checkpoints (every attempt's) and what the
           # preemptions lost (docs/api.md, "Checkpoints and graceful stop").
           "checkpoints": list(job_checkpoints(job, limit=5)),
           "lost_gpu_hours": sum(a.get("lost_gpu_hours") or 0.0 for a in attempts),
           "preemptions": sum(1 for a in attempts if a.get("lost_note")),
           "log": log_view, "log_error": log_error,
           "logs": "\n".join(log_view.lines) if log_view else "",
           "runtime": job.runtime_seconds(now), "topology_domain": _topology_domain(job),
           "utilization": _utilization_view(job), "idle_since": idle_since(job),
           "attempts": attempts, "dependencies": job_dependencies(job),
           "array": job_array(job),
           "job_cluster": cluster_name(job.cluster_id),
           "job_pin": cluster_name(job.requested_cluster_id),
           # docs/api.md, "Who may cancel": the button only for who may.
           "can_cancel": may_cancel(actor=request.user, team=job.team,
                                    submitter_id=job.submitter_id),
           "permalink": request.build_absolute_uri(reverse("web:job-detail", args=[job.pk]))}
    if request.htmx:  # type: ignore[attr-defined]
        # 286: htmx swaps this last fragment and stops polling a job that is final.
        return render(request, "web/_job_live.html", ctx, status=286 if job.is_final else 200)
    return render(request, "web/job_detail.html", ctx)


def _utilization_view(job: Job) -> dict[str, Any]:
    """The job page's utilization card (rule U5): each attempt's summary, and the chart
    of the latest attempt's per-minute SM activity ({"t": unix seconds, "sm": percent})."""
    attempts = job_utilization(job)
    latest = attempts[-1] if attempts else None
    chart = {"attempt": latest["attempt"],
             "t": [p["at"].timestamp() for p in latest["series"]],
             "sm": [p["sm"] for p in latest["series"]],
             "threshold": job.tier.idle_threshold_percent} if latest else None
    return {"attempts": attempts, "chart": chart}


def _topology_domain(job: Job) -> str:
    """The domain of its topology level the job's placed nodes share (rule A7), as the
    last published cluster view labels them; "" when it has none, is not placed, or the
    view does not say (a convenience of the page: the cached view, never a cluster call)."""
    if not job.topology_level or not job.placement:
        return ""
    try:
        by_node = {n.name: n.topology for n in cluster_view().node_list}
    except Exception:  # the page shows the job without it
        return ""
    domains = {by_node.get(str(node), {}).get(job.topology_level) for node in job.placement}
    return str(domains.pop()) if len(domains) == 1 and None not in domains else ""


def _job_log(request: HttpRequest, job: Job) -> tuple[LogView | None, str]:
    """The log the page shows (`?attempt=N&replica=R`, the current attempt's replica 0 by
    default) or why it cannot."""
    try:
        attempt = int(request.GET["attempt"]) if request.GET.get("attempt") else None
        replica = int(request.GET.get("replica") or 0)
    except ValueError:
        return None, "The attempt and the replica are whole numbers."
    try:
        return job_log_read(job=job, attempt=attempt, replica=replica, tail=100), ""
    except DomainError as exc:
        return None, " ".join(m for msgs in exc.fields.values() for m in msgs) or exc.message
    except Exception as exc:  # the logs are a convenience: never fail the page
        return None, f"Logs unavailable: {str(exc)[:200]}"


@require_POST
@login_required
def job_cancel_view(request: HttpRequest, job_id: int) -> HttpResponse:
    job = _job_or_404(request, job_id)
    try:
        job_cancel(actor=request.user, job=job, reason=f"cancelled by {request.user} (web)")
        messages.success(request, f"Job #{job.pk} cancelled.")
    except Refused as exc:  # docs/api.md, "Who may cancel" (the page shows no button)
        raise PermissionDenied(exc.message) from exc
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect("web:job-detail", job_id=job.pk)


@require_POST
@login_required
def job_resubmit(request: HttpRequest, job_id: int) -> HttpResponse:
    """Queue a new job with the same spec (a fresh job, not a requeue of this one). The
    spec is checked again by the API's rules: a registry banned or a limit tightened
    since the original job applies to the copy too."""
    job = _job_or_404(request, job_id)
    try:
        spec = job_spec(job)
        data = job_input_of(actor=request.user, fields={**spec, **_job_cluster_fields(job)})
    except DomainError as exc:
        problems = "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.fields.items())
        messages.error(request, f"This job cannot be resubmitted as it is: {problems}")
        return redirect("web:job-detail", job_id=job.pk)
    try:
        new, _ = job_submit(actor=request.user, data=data,
                            idempotency_key=request.POST.get("idempotency_key") or None)
    except DomainError as exc:  # the service's own rules (T1: a tier no longer granted)
        messages.error(request, f"This job cannot be resubmitted as it is: {exc.message}")
        return redirect("web:job-detail", job_id=job.pk)
    messages.success(request, f"Resubmitted as job #{new.pk}.")
    return redirect("web:job-detail", job_id=new.pk)


# --- team page ---------------------------------------------------------------------------------

def _team_context(request: HttpRequest, team: Team, **extra: Any) -> dict[str, Any]:
    _show_team(request, team)
    now = timezone.now()
    standing = next((s for s in dash.standings(now=now) if s.team == team.slug), None)
    ctx = {
        "team": team, "members": list(memberships_of_team(team=team)),
        "can_manage": is_team_admin(user=request.user, team=team),
        "tokens": list(tokens_of_user(user=request.user)[:50]), "now": now,
        "quotas": dash.team_quotas(team=team), "standing": standing,
        "member_form": MemberForm(), "token_form": TokenForm(),
        "resources": team_resources(team),
        "resources_form": TeamResourcesForm(initial=team_resources(team)),
        "policy": team_workload_policy(team),
        "policy_form": TeamWorkloadPolicyForm(initial=team_workload_policy(team)),
        "token_idempotency_key": secrets.token_urlsafe(16),
        "role_choices": RoleForm.base_fields["role"].choices,  # type: ignore[attr-defined]
        # Its booked GPUs (docs/reservations.md), active ones.
        "bookings": reservations_visible_to(actor=request.user, team=team.slug, active=True,
                                            now=now),
    }
    for r in ctx["bookings"]:
        r.next = next_windows(r, now=now, count=1)
        r.devices = r.gpus // r.gpu_type.units_per_device
    if ctx["can_manage"]:  # docs/webhooks.md: team admins and staff see the log
        ctx["webhooks"] = list(webhook_endpoints_of_team(team=team))
        ctx["webhook_form"] = WebhookEndpointForm()
        ctx["webhook_deliveries"] = webhook_deliveries(team=team, limit=10)
    ctx.update(extra)
    return ctx


@require_GET
@login_required
@never_cache
def team_page(request: HttpRequest, slug: str) -> HttpResponse:
    team = _team_or_404(request, slug)
    # Sessions of an earlier version held a new token's secret here: drop it unshown.
    request.session.pop(NEW_TOKEN_SESSION_KEY, None)
    return render(request, "web/team.html", _team_context(request, team))


def _team_form_save(request: HttpRequest, slug: str, form_class: type[forms.Form],
                    save: Any, *, saved: str, context_key: str) -> HttpResponse:
    """A team admin's form on the team page (team admins and staff): `save(actor=, team=,
    **cleaned_data)` (a service, audited) or the form again with its errors (400)."""
    team = _team_or_404(request, slug)
    _team_admin_or_403(request, team)
    form = form_class(request.POST)
    if form.is_valid():
        try:
            save(actor=request.user, team=team, **form.cleaned_data)
        except DomainError as exc:
            _form_errors(form, exc)
        else:
            messages.success(request, saved)
            return redirect("web:team", slug=team.slug)
    return render(request, "web/team.html", _team_context(request, team, **{context_key: form}),
                  status=400)


@require_POST
@login_required
def team_resources_update(request: HttpRequest, slug: str) -> HttpResponse:
    """The team's resource defaults and maxima (team admins and staff; audited)."""
    return _team_form_save(request, slug, TeamResourcesForm, team_resources_set,
                           saved="Resource defaults and maxima saved.",
                           context_key="resources_form")


@require_POST
@login_required
def team_workload_policy_update(request: HttpRequest, slug: str) -> HttpResponse:
    """The team's allowed PVCs, secrets and pull secrets (team admins and staff; audited)."""
    return _team_form_save(request, slug, TeamWorkloadPolicyForm, team_workload_policy_set,
                           saved="Allowed PVCs, secrets and pull secrets saved.",
                           context_key="policy_form")


@require_POST
@login_required
def team_cancel_rule_update(request: HttpRequest, slug: str) -> HttpResponse:
    """Who may cancel the team's jobs (docs/api.md, "Who may cancel"): every member, or
    only the submitter, team admins and staff (team admins and staff; audited)."""
    team = _team_or_404(request, slug)
    _team_admin_or_403(request, team)
    on = request.POST.get("any_member_may_cancel") == "on"
    team_update(actor=request.user, team=team, any_member_may_cancel=on)
    messages.success(request, "Every member may now cancel the team's jobs." if on else
                     "Only a job's submitter, the team admins and staff may now cancel it.")
    return redirect("web:team", slug=team.slug)


@require_POST
@login_required
def team_member_add(request: HttpRequest, slug: str) -> HttpResponse:
    team = _team_or_404(request, slug)
    _team_admin_or_403(request, team)
    form = MemberForm(request.POST)
    if form.is_valid():
        user = active_user_by_username(username=form.cleaned_data["username"])
        if user is None:
            form.add_error("username", "No active user with this name.")
        else:
            _, created = membership_set(actor=request.user, team=team, user=user,
                                        role=form.cleaned_data["role"])
            messages.success(request, f"{user} {'added' if created else 'updated'}.")
            return redirect("web:team", slug=team.slug)
    return render(request, "web/team.html", _team_context(request, team, member_form=form),
                  status=400)


@require_POST
@login_required
def team_member_change(request: HttpRequest, slug: str, membership_id: int) -> HttpResponse:
    team = _team_or_404(request, slug)
    _team_admin_or_403(request, team)
    membership = membership_of_team(team=team, membership_id=membership_id)
    if membership is None:
        raise Http404("no such member")
    # The membership rules (the last team admin stays) live in the services: a refusal
    # is a DomainError, shown as a message, and nothing changes.
    if request.POST.get("action") == "remove":
        try:
            membership_remove(actor=request.user, membership=membership)
        except DomainError as exc:
            messages.error(request, exc.message)
            return redirect("web:team", slug=team.slug)
        if membership.user_id != request.user.pk:
            messages.success(request, f"{membership.user} removed.")
            return redirect("web:team", slug=team.slug)
        messages.success(request, f"You left team {team.slug}.")
        if team_get_for_user(user=request.user, slug=team.slug) is None:
            return redirect("web:home")  # the team page is no longer yours to see
        return redirect("web:team", slug=team.slug)
    form = RoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Pick a valid role.")
        return redirect("web:team", slug=team.slug)
    try:
        membership_set(actor=request.user, team=team, user=membership.user,
                       role=form.cleaned_data["role"])
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"{membership.user} is now {form.cleaned_data['role']}.")
    return redirect("web:team", slug=team.slug)


@require_POST
@login_required
@never_cache  # the answer holds the new token's secret: no cache may keep it
def token_create(request: HttpRequest, slug: str) -> HttpResponse:
    """Issue a token and show its secret in this answer, the only place it ever exists
    (only its hash is stored; not in the session, the cache or an idempotency record).
    The form's one-time `idempotency_key` makes a reload (the browser re-posting) show
    that the token exists instead of issuing a second one."""
    team = _team_or_404(request, slug)
    form = TokenForm(request.POST)
    if not form.is_valid():
        return render(request, "web/team.html", _team_context(request, team, token_form=form),
                      status=400)
    user = _user(request)
    days = form.cleaned_data["expires_in_days"]
    claim = None
    if form.cleaned_data["idempotency_key"]:
        claim = idempotency_claim(user=user, key=f"web-token:{form.cleaned_data['idempotency_key']}",
                                  fingerprint=hashlib.sha256(repr(sorted(
                                      form.cleaned_data.items())).encode()).hexdigest())
        if claim.replay is not None:
            return render(request, "web/team.html",
                          _team_context(request, team, token_note=KEY_SHOWN_ONCE))
    try:
        issued = token_issue(user=user, name=form.cleaned_data["name"],
                             expires_at=timezone.now() + timedelta(days=days) if days else None)
    except BaseException:
        if claim is not None:  # nothing was issued: a retry may issue it
            idempotency_release(record=claim.record)
        raise
    if claim is not None:
        idempotency_complete(record=claim.record, status_code=201,
                             body={"id": issued.token.pk})  # never the key
    return render(request, "web/team.html", _team_context(request, team, new_key=issued.key))


@require_POST
@login_required
def token_revoke_view(request: HttpRequest, slug: str, token_id: int) -> HttpResponse:
    team = _team_or_404(request, slug)
    user = _user(request)
    token = token_of_user(user=user, token_id=token_id)
    if token is None:
        raise Http404("no such token")
    token_revoke(token=token, actor=user)
    messages.success(request, f"Token {token.name} ({token.prefix}…) revoked.")
    return redirect("web:team", slug=team.slug)


# --- the team's webhook endpoints (team admins; docs/webhooks.md) -------------------------

def _webhook_of_team(request: HttpRequest, slug: str, endpoint_id: int) -> tuple[Team, Any]:
    team = _team_or_404(request, slug)
    _team_admin_or_403(request, team)
    try:
        return team, webhook_endpoint_get(team=team, endpoint_id=endpoint_id)
    except NotFound as exc:
        raise Http404(str(exc)) from exc


@require_POST
@login_required
@never_cache  # the answer holds the new endpoint's secret: no cache may keep it
def webhook_create_view(request: HttpRequest, slug: str) -> HttpResponse:
    """A new endpoint through the service (its URL rules, audit); its secret is shown in
    this answer only, as the API shows it once (never in the session or a message)."""
    team = _team_or_404(request, slug)
    _team_admin_or_403(request, team)
    form = WebhookEndpointForm(request.POST)
    if form.is_valid():
        try:
            created = webhook_endpoint_create(
                actor=request.user, team=team, url=form.cleaned_data["url"],
                description=form.cleaned_data["description"],
                event_types=form.cleaned_data["event_types"] or None)
        except DomainError as exc:
            _form_errors(form, exc)
        else:
            return render(request, "web/team.html", _team_context(
                request, team, new_webhook=created.endpoint, new_webhook_secret=created.secret))
    return render(request, "web/team.html", _team_context(request, team, webhook_form=form),
                  status=400)


@require_POST
@login_required
def webhook_change_view(request: HttpRequest, slug: str, endpoint_id: int) -> HttpResponse:
    """Disable, enable or delete an endpoint (the service's, audited)."""
    team, endpoint = _webhook_of_team(request, slug, endpoint_id)
    action = request.POST.get("action")
    try:
        if action == "delete":
            webhook_endpoint_delete(actor=request.user, endpoint=endpoint)
            messages.success(request, f"Webhook endpoint #{endpoint_id} deleted.")
        elif action in {"disable", "enable"}:
            webhook_endpoint_update(actor=request.user, endpoint=endpoint,
                                    enabled=action == "enable")
            messages.success(request, f"Webhook endpoint #{endpoint_id} {action}d.")
        else:
            messages.error(request, "Pick disable, enable or delete.")
    except DomainError as exc:
        messages.error(request, exc.message)
    return redirect(reverse("web:team", args=[team.slug]) + "#webhooks")


# --- quota board (platform admins) ---------------------------------------------------------

def _staff_or_404(request: HttpRequest) -> None:
    try:
        check_staff(actor=request.user)
    except Refused as exc:  # the board's existence is no business of other users
        raise Http404("no such page") from exc


def _quota_audit() -> list[AuditEntry]:
    """The board's recent changes: quotas, and team weights (the Team entries that
    changed `weight`)."""
    return quota_audit_entries()


CLUSTER_LIST_LIMIT = 100


@require_GET
@login_required
def cluster_page(request: HttpRequest) -> HttpResponse:
    """Staff: every team's queue, running jobs and usage on one page (the same reads as
    the dashboard, for all teams; bounded lists)."""
    _staff_or_404(request)
    now = timezone.now()
    standings = dash.standings(now=now)
    capacity, cluster_error = capacity_by_gpu_type()
    queue, queue_total = team_queue(team=None, now=now, limit=CLUSTER_LIST_LIMIT)
    running = dash.team_running(team=None, limit=CLUSTER_LIST_LIMIT)
    flags = idle_flags(running)
    for job in running:
        job.idle_since = flags.get(job.pk)  # type: ignore[attr-defined]  # the badge (rule U2)
    ctx = {"now": now, "overview": dash.cluster_overview(standings=standings), "queue": queue,
           "queue_total": queue_total, "running": running,
           "running_limit": CLUSTER_LIST_LIMIT, "capacity": capacity,
           "timeline": booked_timeline(now=now), "days": 7,
           # Its nodes grouped by cluster (rule K1), the implicit one's too.
           "clusters": cluster_summaries()[0], "with_nodes": True,
           "cluster_error": cluster_error,
           "history": dash.usage_history(now=now, current=standings),
           "half_life_hours": settings.FAIRQ_DECAY_HALF_LIFE_HOURS}
    if request.htmx:  # type: ignore[attr-defined]
        return render(request, "web/_cluster_live.html", ctx)
    return render(request, "web/cluster.html", ctx)


@require_GET
@login_required
def quota_board(request: HttpRequest) -> HttpResponse:
    _staff_or_404(request)
    board = dash.quota_board(now=timezone.now())
    return render(request, "web/quotas.html", {"board": board, "audit": _quota_audit()})


@require_POST
@login_required
def quota_cell(request: HttpRequest, team_slug: str, gpu_slug: str) -> HttpResponse:
    """Edit one cell in place: validate, `quota_set` (audited), answer with the cell, the
    capacity warnings and the audit list (out-of-band swaps)."""
    _staff_or_404(request)
    team = team_by_slug(slug=team_slug)
    gpu_type = gpu_type_by_slug(slug=gpu_slug)
    if team is None or gpu_type is None:
        raise Http404("no such quota")
    form = QuotaForm(request.POST)
    saved = False
    if form.is_valid():
        d = form.cleaned_data
        try:
            quota_set(actor=request.user, team=team, gpu_type=gpu_type, nominal=d["nominal"],
                      borrowing_limit=d["borrowing_limit"], lending_limit=d["lending_limit"])
            saved = True
        except ValidationError as exc:
            for field, errs in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errs)
    cell = dash.quota_cell(team=team, gpu_type=gpu_type)
    cap, _ = capacity_by_gpu_type()
    # The board's cluster row too (GPUs guaranteed per type): out-of-band swaps.
    ctx = {"cell": cell, "form": form, "saved": saved, "warnings": overcommit_warnings(cap),
           "audit": _quota_audit(), "oob": True, "capacity": cap,
           # The departments above it: their subtotals moved (out-of-band too).
           "cells_above": dash.quota_cells_above(team=team, gpu_type=gpu_type) if saved
           else []}
    if not request.htmx:  # type: ignore[attr-defined]
        return _quota_board_answer(request, form, saved=saved,
                                   message=f"Quota {team.slug}/{gpu_type.slug} saved.")
    # htmx swaps only 2xx answers: the errors come back in the cell itself.
    return render(request, "web/_quota_cell_response.html", ctx)


def _quota_board_answer(request: HttpRequest, form: Any, *, saved: bool,
                        message: str) -> HttpResponse:
    """A quota board edit posted without htmx: back to the board with `message` when
    saved, else the board again with the form's errors (400)."""
    if saved:
        messages.success(request, message)
        return redirect("web:quotas")
    board = dash.quota_board(now=timezone.now())
    return render(request, "web/quotas.html",
                  {"board": board, "audit": _quota_audit(), "errors": form.errors},
                  status=400)


def _team_update_or_errors(request: HttpRequest, team: Team, form: forms.Form,
                           **fields: Any) -> bool:
    """`team_update` from a quota board form: True when saved; else the team as stored
    again and the service's messages on the form's fields."""
    try:
        team_update(actor=request.user, team=team, **fields)
        return True
    except ValidationError as exc:
        team_reload(team=team)
        for field, errs in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, errs)
        return False


@require_POST
@login_required
def team_weight(request: HttpRequest, team_slug: str) -> HttpResponse:
    """A team's fair-share weight, edited in place on the quota board (staff; saved by
    `team_update`, audited like the quotas)."""
    _staff_or_404(request)
    team = team_by_slug(slug=team_slug)
    if team is None:
        raise Http404("no such team")
    form = TeamWeightForm(request.POST)
    saved = form.is_valid() and _team_update_or_errors(request, team, form,
                                                       weight=form.cleaned_data["weight"])
    if not request.htmx:  # type: ignore[attr-defined]
        return _quota_board_answer(request, form, saved=saved,
                                   message=f"Weight of {team.slug} saved.")
    return render(request, "web/_quota_weight_response.html",
                  {"team": team, "weight_form": form, "weight_saved": saved,
                   "audit": _quota_audit()})


@require_POST
@login_required
def team_parent(request: HttpRequest, team_slug: str) -> HttpResponse:
    """A team's parent, chosen on the quota board (staff; `team_update`, audited): a
    move redraws the whole board (its tree changed), a refusal (rule F4 or Q8) comes
    back in the team's parent menu."""
    _staff_or_404(request)
    team = team_by_slug(slug=team_slug)
    if team is None:
        raise Http404("no such team")
    form = TeamParentForm(request.POST)
    saved = False
    if form.is_valid():
        slug = form.cleaned_data["parent"]
        parent = team_by_slug(slug=slug) if slug else None
        if slug and parent is None:
            form.add_error("parent", f"No team {slug!r}.")
        else:
            saved = _team_update_or_errors(request, team, form, parent=parent)
    if not request.htmx:  # type: ignore[attr-defined]
        return _quota_board_answer(request, form, saved=saved,
                                   message=f"Parent of {team.slug} saved.")
    if saved:
        response = HttpResponse(status=204)
        response["HX-Refresh"] = "true"  # the board's order and subtotals changed
        return response
    board = dash.quota_board(now=timezone.now())
    row = next(r for r in board.tree if r.team.slug == team.slug)
    return render(request, "web/_quota_parent.html", {"row": row, "parent_form": form})
