"""Interactive notebook sessions (docs/sessions.md): a session is a Job of the
`interactive` tier whose pod runs a JupyterLab server, plus a `NotebookSession` row.

What the web proxy calls (it forwards HTTP and WebSocket traffic of
`/sessions/<job id>/lab/...` to the server):

- `can_open_session(user, job)` - may this user reach the server at all;
- `notebook_upstream(job)` - where the server is and the token it wants, None while
  it has no address.

The server's token is never stored and never shown: `notebook_token` derives it from
the job id and attempt with Django's secret key and its own salt, so the pod's env,
the proxy and the culling check compute the same value; a new attempt gets a new one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from dataclasses import field as dc_field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from accounts.selectors import teams_for_user
from queueing.backends.base import WorkloadStatus
from queueing.backends.notebook_local import jupyterlab_installed, lab_command
from queueing.composition import stop_workload_soon
from queueing.errors import DomainError, NotFound
from queueing.memo import on_forget
from queueing.models import (
    AttemptUtilization,
    GpuType,
    IdleAction,
    Job,
    JobEvent,
    NotebookSession,
    Tier,
)
from queueing.policy.sessions import (
    GpuReading,
    ServerReading,
    Verdict,
    activity_at,
    idle_since,
    session_verdict,
)
from queueing.policy.states import FINAL_STATES, JobState
from queueing.selectors.lookups import gpu_types_by_slug
from queueing.selectors.queue_plan import queue_plan_forget

from .access import check_job_access
from .jobs import INVALID_FIELDS, job_cancel, job_input_build, job_submit, job_transition
from .notices import mails_send
from .usage import usage_record_attempt

log = logging.getLogger(__name__)

TOKEN_SALT = "fairq.sessions.notebook-token"


@dataclass(frozen=True, slots=True)
class Upstream:
    """A session's JupyterLab server as the proxy reaches it: `base_url` its scheme, host
    and port ("http://10.0.3.7:8888"), `token` what it accepts (an `Authorization:
    token <token>` header), `prefix` the path it serves under ("/sessions/42/lab/": its
    `ServerApp.base_url`, the same path the proxy is mounted on)."""

    base_url: str
    token: str = ""
    prefix: str = "/"

    def __repr__(self) -> str:  # the token stays out of logs and error messages
        return f"Upstream(base_url={self.base_url!r}, prefix={self.prefix!r})"


def session_prefix(job_id: int) -> str:
    """The path a session's server serves under and the web proxies: '/sessions/42/lab/'."""
    return f"/sessions/{job_id}/lab/"


def notebook_token(*, job_id: int, attempt: int) -> str:
    """The token of one attempt's server: an HMAC of the job id and attempt (SECRET_KEY,
    its own salt). Hex, 40 characters."""
    return salted_hmac(TOKEN_SALT, f"{job_id}:{attempt}", algorithm="sha1").hexdigest()


def _session_of(job: Job) -> NotebookSession | None:
    try:
        return job.notebook
    except NotebookSession.DoesNotExist:
        return None


def notebook_upstream(job: Job) -> Upstream | None:
    """The server of `job`'s running attempt, or None: not a session, not RUNNING, or its
    pod has no address yet (the backend reports it; services/sessions.py
    `session_addresses_record`)."""
    session = _session_of(job)
    if (session is None or job.status != JobState.RUNNING.value or not session.host
            or session.host_attempt != job.attempt):
        return None
    host = session.host
    if ":" in host and not host.startswith("["):  # an IPv6 pod address
        host = f"[{host}]"
    return Upstream(base_url=f"http://{host}:{session.port}",
                    token=notebook_token(job_id=job.pk, attempt=job.attempt),
                    prefix=session.url_path or session_prefix(job.pk))


def can_open_session(user: Any, job: Job) -> bool:
    """May `user` open `job`'s notebook (reach its server through the proxy)? Its owner
    and staff only. Not a team admin: a notebook is a shell with the owner's files and
    secrets in it, and a team admin may stop a member's session (like any job of the
    team: `access.may_cancel`) without reading it. False for a job that is no session
    and for an anonymous or inactive user."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    session = _session_of(job)
    if session is None:
        return False
    if user.is_staff:
        return True
    owner_id = session.owner_id if session.owner_id is not None else job.submitter_id
    return owner_id is not None and owner_id == user.pk


# --- starting and stopping --------------------------------------------------------------

# The fields of a start (API, CLI, web form) besides the team: docs/sessions.md.
START_FIELDS = ("team", "name", "image", "gpu_type", "gpus", "gpu_fraction", "pvc", "volumes",
                "secrets", "idle_minutes", "max_runtime_seconds")
MAX_IDLE_MINUTES = 7 * 24 * 60


def session_tier(*, in_sync: bool = False) -> Tier:
    """The tier sessions run in (FAIRQ_SESSION_TIER), created at the first start when
    absent: not preemptible (a kernel's state does not survive a preemption), open to
    every team, ranked FAIRQ_SESSION_TIER_RANK (the next free rank above it when that is
    taken), rule U3 off (`flag`: rules N1-N4 stop idle sessions instead). Staff may
    change any of it in the admin afterwards. A tier saved queues a cluster sync (its
    PriorityClass); `in_sync`: the caller IS that sync (`priority_class_specs`), so the
    tier is created without the signal - a second sync would find nothing to do."""
    slug = settings.FAIRQ_SESSION_TIER
    tier = Tier.objects.filter(slug=slug).first()
    if tier is not None:
        return tier
    taken = set(Tier.objects.values_list("rank", flat=True))
    rank = int(settings.FAIRQ_SESSION_TIER_RANK)
    while rank in taken:
        rank += 1
    fields = {"name": "Interactive notebooks", "rank": rank,
              "priority_class_name": f"fairq-{slug}", "priority_value": rank * 1000,
              "preemptible": False, "open_to_all_teams": True,
              "idle_action": IdleAction.FLAG}
    if in_sync:
        Tier.objects.bulk_create([Tier(slug=slug, **fields)], ignore_conflicts=True)
        return Tier.objects.get(slug=slug)
    with transaction.atomic():
        tier, _ = Tier.objects.get_or_create(slug=slug, defaults=fields)
    return tier


def gpu_fraction_slices(value: Any, *, slices_per_gpu: int) -> int:
    """The slices `value` asks of one GPU of `slices_per_gpu` slices: a fraction such as
    0.25, "0.25" or "1/4" (what `k/S` shows), equal to k/S for a whole k with 1 <= k < S.
    ValueError with the readable reason otherwise."""
    text = str(value).strip()
    try:
        share = Fraction(text) if "/" in text else Fraction(Decimal(text))
    except (ValueError, ZeroDivisionError, InvalidOperation) as exc:
        raise ValueError(f"Give a fraction of one GPU such as 0.25 or 1/4, not {text[:20]!r}.") \
            from exc
    slices = share * slices_per_gpu
    allowed = ", ".join(f"{k}/{slices_per_gpu}" for k in range(1, slices_per_gpu))
    if slices.denominator != 1 or not 1 <= slices < slices_per_gpu:
        raise ValueError(f"This GPU type shares one GPU in {slices_per_gpu} slices: the "
                         f"fractions are {allowed} (a whole GPU: gpus).")
    return int(slices)


def _pick_gpu_type(slug: str | None) -> GpuType | None:
    """The asked type, else the platform's first type that shares GPUs in slices (a
    session preferably runs on a fraction), else the first type (by slug)."""
    types = sorted(gpu_types_by_slug().values(), key=lambda t: t.slug)
    if slug:
        return next((t for t in types if t.slug == slug), None)
    return next((t for t in types if t.packs_slices), types[0] if types else None)


def _share_of(job: Job) -> float:
    return float(job.gpu_share)


def _check_user_limits(*, actor: Any, share: float) -> None:
    """FAIRQ_SESSION_MAX_PER_USER live sessions and FAIRQ_SESSION_MAX_GPUS_PER_USER GPUs
    in them, per user; DomainError (400) naming the limit. The caller holds the user's
    row lock, so two starts of one user are counted one after the other."""
    live = list(Job.objects.filter(notebook__owner=actor).exclude(
        status__in=[s.value for s in FINAL_STATES]).select_related("gpu_type"))
    most = int(settings.FAIRQ_SESSION_MAX_PER_USER)
    if len(live) >= most:
        raise DomainError(
            f"You have {len(live)} session(s) running or queued; at most {most} per user "
            f"(FAIRQ_SESSION_MAX_PER_USER). Stop one first: fairq session stop <id>.",
            fields={"non_field_errors": [f"At most {most} sessions per user."]})
    held = sum(_share_of(j) for j in live)
    cap = float(settings.FAIRQ_SESSION_MAX_GPUS_PER_USER)
    if held + share > cap + 1e-9:
        message = (f"Your sessions would hold {held + share:g} GPU(s); at most {cap:g} per "
                   f"user (FAIRQ_SESSION_MAX_GPUS_PER_USER): ask a fraction, or stop a "
                   "session.")
        raise DomainError(message, fields={"gpus": [message]})


@transaction.atomic
def session_start(*, actor: Any, team: str | None = None, name: str | None = None,
                  image: str | None = None, gpu_type: str | None = None,
                  gpus: int | None = None, gpu_fraction: Any = None, pvc: str | None = None,
                  volumes: list[Any] | None = None, secrets: list[Any] | None = None,
                  idle_minutes: int | None = None, max_runtime_seconds: int | None = None,
                  now: datetime | None = None) -> Job:
    """Queue a notebook session for `actor` in `team`: a Job of the session tier running
    JupyterLab, and its NotebookSession row, in one transaction; an event says so.

    Every refusal is one DomainError (400) naming its fields: the job's own rules
    (`jobs.job_input_build`: team membership, image registries, PVCs and secrets of
    the team's allowlists, rule T1), `gpus` or `gpu_fraction` (not both; a fraction only
    on a type that shares GPUs in slices), the idle limit (1 minute to a week, above the
    warning's lead), the time limit (at most FAIRQ_SESSION_MAX_HOURS) and the per-user
    limits (`_check_user_limits`). `pvc`: a PVC of the team mounted at
    FAIRQ_NOTEBOOK_ROOT_DIR; the server's root is the first PVC's mount path (its files
    outlive the session), else FAIRQ_NOTEBOOK_ROOT_DIR in the pod."""
    now = now or timezone.now()
    problems: dict[str, list[str]] = {}
    type_row = _pick_gpu_type(gpu_type)
    if type_row is None:
        problems["gpu_type"] = [f"Unknown GPU type {gpu_type!r}." if gpu_type else
                                "No GPU type is configured."]
    slices = 0
    if gpus is not None and gpu_fraction not in (None, ""):
        problems["gpu_fraction"] = ["Give gpus (whole GPUs) or gpu_fraction, not both."]
    elif type_row is not None and gpu_fraction not in (None, ""):
        if not type_row.packs_slices:
            problems["gpu_fraction"] = [
                f"GPU type {type_row.slug} is {type_row.sharing}: it gives whole devices "
                "only; a fraction needs a time-sliced or MPS type."]
        else:
            try:
                slices = gpu_fraction_slices(gpu_fraction, slices_per_gpu=type_row.slices_per_gpu)
            except ValueError as exc:
                problems["gpu_fraction"] = [str(exc)]
    elif type_row is not None and gpus is None and type_row.packs_slices:
        slices = 1  # the smallest fraction by default
    if gpus is not None and gpus < 1:
        problems["gpus"] = ["At least 1."]
    idle = int(settings.FAIRQ_SESSION_IDLE_MINUTES) if idle_minutes is None else idle_minutes
    lead = min(int(settings.FAIRQ_SESSION_WARN_MINUTES), max(0, idle - 1))
    if not 1 <= idle <= MAX_IDLE_MINUTES:
        problems["idle_minutes"] = [f"Between 1 and {MAX_IDLE_MINUTES} minutes (a week)."]
    most = int(float(settings.FAIRQ_SESSION_MAX_HOURS) * 3600)
    runtime = (int(float(settings.FAIRQ_SESSION_DEFAULT_HOURS) * 3600)
               if max_runtime_seconds is None else max_runtime_seconds)
    if not 60 <= runtime <= most:
        problems["max_runtime_seconds"] = [
            f"Between 60 seconds and {most} ({float(settings.FAIRQ_SESSION_MAX_HOURS):g} h, "
            "FAIRQ_SESSION_MAX_HOURS)."]
    mounts = list(volumes or [])
    if pvc:
        mounts.insert(0, {"name": "work", "pvc": pvc,
                          "mount_path": settings.FAIRQ_NOTEBOOK_ROOT_DIR})
    if problems:
        raise DomainError(INVALID_FIELDS, fields=problems)
    assert type_row is not None
    tier = session_tier()
    team_slug = team
    if not team_slug:
        teams = list(teams_for_user(user=actor).values_list("slug", flat=True)[:2])
        team_slug = teams[0] if len(teams) == 1 else None
    # The job's own submit rules; the command is written once the id is known (its path).
    data = job_input_build(
        actor=actor, team=team_slug, name=name or "notebook",
        image=image or settings.FAIRQ_NOTEBOOK_IMAGE, gpu_type=type_row.slug,
        gpus=1 if slices else (gpus or 1), command=["jupyter", "lab"], tier=tier.slug,
        max_runtime_seconds=runtime, volumes=mounts, secrets=secrets)
    share = (slices / type_row.slices_per_gpu if slices
             else (gpus or 1) / type_row.slices_per_gpu)
    get_user_model().objects.select_for_update().filter(pk=actor.pk).first()
    _check_user_limits(actor=actor, share=share)
    job, _ = job_submit(actor=actor, data=data, now=now)
    root = next((str(v["mount_path"]) for v in job.volumes or () if v.get("pvc")),
                settings.FAIRQ_NOTEBOOK_ROOT_DIR)
    prefix = session_prefix(job.pk)
    command = lab_command(port=int(settings.FAIRQ_NOTEBOOK_PORT), prefix=prefix, root_dir=root)
    # The fraction: written before the commit, so no cycle sees the job without it.
    Job.objects.filter(pk=job.pk).update(command=command, args=[], gpu_slices=slices)
    job.command, job.args, job.gpu_slices = command, [], slices
    NotebookSession.objects.create(
        job=job, owner=actor, idle_limit_minutes=idle, warn_lead_minutes=lead,
        port=int(settings.FAIRQ_NOTEBOOK_PORT), url_path=prefix, root_dir=root,
        created_at=now)
    JobEvent.objects.create(
        job=job, at=now, kind=JobEvent.Kind.SESSION, actor=actor, actor_label=str(actor),
        attempt=job.attempt,
        reason=(f"notebook session: {_gpu_words(type_row, slices, gpus or 1)}, stopped "
                f"after {idle} idle minute(s) (warned {lead} before), time limit "
                f"{runtime // 60} minute(s)"),
        data={"rule": "N1", "idle_minutes": idle, "warn_minutes": lead, "root_dir": root,
              "gpu_slices": slices})
    return job


def _gpu_words(gpu_type: GpuType, slices: int, gpus: int) -> str:
    if slices:
        return (f"{slices}/{gpu_type.slices_per_gpu} of one {gpu_type.slug} GPU "
                f"({gpu_type.sharing}: no memory isolation)")
    return f"{gpus} {gpu_type.slug} GPU{'s' if gpus != 1 else ''}"


def session_stop(*, actor: Any, job: Job, now: datetime | None = None) -> Job:
    """Stop a session as a cancel (`jobs.job_cancel`: its owner, a team admin of its team
    or staff; 404 for someone who may not see it): its pod goes, its PVC stays."""
    return job_cancel(actor=actor, job=job, now=now,
                      reason=f"session stopped by {actor}; its PVC and files are kept")


def session_get_for_actor(*, actor: Any, job_id: int) -> Job:
    """The session job `job_id` if `actor` may see it (its team's members, staff);
    NotFound (404) otherwise, for a job that is no session too."""
    job = check_job_access(actor=actor, job_id=job_id)
    if not NotebookSession.objects.filter(job_id=job.pk).exists():
        raise NotFound(f"session {job_id} not found")
    return job


# --- where the servers are ----------------------------------------------------------------

_recorded: dict[str, tuple[str, int | None]] = {}


def _forget_recorded() -> None:
    _recorded.clear()


on_forget(_forget_recorded)


def session_addresses_record(statuses: Iterable[WorkloadStatus]) -> int:
    """Keep the address each session's running attempt reports (the backend reads the
    pod's IP; the simulated cluster its local server's port) on its NotebookSession:
    what `notebook_upstream` gives the proxy. Only statuses whose address changed since
    this process last recorded it are read: nothing at all in a cycle without news.
    Returns how many rows changed."""
    news = {s.job_id: s for s in statuses
            if s.address and _recorded.get(s.name) != (s.address, s.port)}
    if not news:
        return 0
    changed = 0
    rows = NotebookSession.objects.filter(job_id__in=list(news)).values_list(
        "job_id", "host", "port", "host_attempt", "job__attempt")
    for job_id, host, port, host_attempt, attempt in rows:
        status = news[job_id]
        if status.attempt != attempt:
            continue
        want_port = status.port if status.port is not None else port
        if (host, port, host_attempt) != (status.address, want_port, attempt):
            changed += NotebookSession.objects.filter(job_id=job_id).update(
                host=status.address, port=want_port, host_attempt=attempt)
        _recorded[status.name] = (status.address, status.port)
    for s in news.values():
        _recorded.setdefault(s.name, (s.address, s.port))  # not a session: never read again
    if len(_recorded) > 50_000:
        _recorded.clear()
    return changed


def session_launch_fields(job: Job) -> dict[str, str]:
    """The LaunchSpec fields of a session's attempt (its path and token), {} for any
    other job. Not by tier: rule B3 may have queued a session in its team's lowest
    tier. A job whose command is not `jupyter lab …` (every session's) costs no query."""
    if list(job.command or [])[:2] != ["jupyter", "lab"]:
        return {}
    path = NotebookSession.objects.filter(job_id=job.pk).values_list(
        "url_path", flat=True).first()
    if path is None:
        return {}
    return {"notebook_prefix": path,
            "notebook_token": notebook_token(job_id=job.pk, attempt=job.attempt)}


# --- idle culling: rules N1-N4 --------------------------------------------------------------

class ServerUnreadable(Exception):
    """The server's API did not answer, or not as JupyterLab does."""


def _when(text: Any) -> datetime | None:
    if not text:
        return None
    try:
        at = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def server_read(upstream: Upstream, *, timeout: float) -> ServerReading:
    """Rule N1's notebook side, from the server's API with its token: /api/status (its
    last_activity; not itself an activity) and /api/kernels?no_track_activity=1 (each
    kernel's last_activity and execution_state; the flag keeps this read from counting
    as activity). ServerUnreadable when either does not answer 200 with JSON."""
    headers = {"Authorization": f"token {upstream.token}"}
    base = upstream.base_url + upstream.prefix
    try:
        with httpx.Client(timeout=timeout, headers=headers, follow_redirects=False,
                          trust_env=False) as client:
            status = client.get(base + "api/status")
            kernels = client.get(base + "api/kernels", params={"no_track_activity": "1"})
        if status.status_code != 200 or kernels.status_code != 200:
            raise ServerUnreadable(f"HTTP {status.status_code}/{kernels.status_code}")
        status_body, kernel_list = status.json(), kernels.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ServerUnreadable(type(exc).__name__) from exc
    if not isinstance(status_body, dict) or not isinstance(kernel_list, list):
        raise ServerUnreadable("not a JupyterLab answer")
    kernel_times = tuple(t for t in (_when(k.get("last_activity")) for k in kernel_list
                                     if isinstance(k, dict)) if t is not None)
    return ServerReading(
        server_last_activity=_when(status_body.get("last_activity")),
        kernels_last_activity=kernel_times,
        kernel_busy=any(isinstance(k, dict) and k.get("execution_state") == "busy"
                        for k in kernel_list),
        kernels=len(kernel_list))


def gpu_reading(job: Job) -> GpuReading:
    """Rule N1's GPU side from the attempt's utilization summary (rules U1-U5, the tier's
    `idle_threshold_percent`): the last minute at or above it; the start of the run
    below it; nothing read at all, or the rule off for the tier (threshold 0): no veto."""
    if job.tier.idle_threshold_percent <= 0:
        return GpuReading(last_busy_at=None)
    summary = AttemptUtilization.objects.filter(job_id=job.pk, attempt=job.attempt).first()
    if summary is None:
        return GpuReading(last_busy_at=None)
    if summary.sm_last >= job.tier.idle_threshold_percent:
        return GpuReading(last_busy_at=summary.last_at)
    return GpuReading(last_busy_at=summary.below_since or summary.first_at)


Reader = Callable[[Upstream], ServerReading]


@dataclass
class CheckResult:
    checked: int = 0
    unreadable: int = 0
    warned: list[int] = dc_field(default_factory=list)
    culled: list[int] = dc_field(default_factory=list)
    busy_again: list[int] = dc_field(default_factory=list)


def sessions_check(*, now: datetime | None = None, read: Reader | None = None) -> CheckResult:
    """Rules N1-N4 for every running session (Celery beat, every minute:
    `sessions_check_task`). Per session: read its server (`server_read`, or `read`) and
    its GPUs (`gpu_reading`), then in one transaction with the job's row locked, apply
    `session_verdict`: N2 warn (an `idle` event, an e-mail), N3 stop (RUNNING ->
    CANCELLED, charged, its pod stopped after commit, its PVC kept), N4 busy again (an
    `idle` event). A server that does not answer gives no verdict (rule N1: no answer is
    not idle); the error is kept on the session for its page. Networking happens with
    no transaction open."""
    now = now or timezone.now()
    timeout = float(settings.FAIRQ_SESSION_CHECK_TIMEOUT_SECONDS)
    reader: Reader = read or (lambda up: server_read(up, timeout=timeout))
    result = CheckResult()
    jobs = list(Job.objects.filter(status=JobState.RUNNING.value, notebook__isnull=False)
                .select_related("notebook", "tier", "team", "submitter", "gpu_type"))
    for job in jobs:
        upstream = notebook_upstream(job)
        if upstream is None:
            continue  # no address yet: nothing to read (the time limit still holds)
        result.checked += 1
        try:
            server = reader(upstream)
        except ServerUnreadable as exc:
            result.unreadable += 1
            NotebookSession.objects.filter(job_id=job.pk).update(
                last_checked_at=now, check_error=f"the server did not answer: {exc}"[:300])
            continue
        gpu = gpu_reading(job)
        started = job.started_at or job.notebook.created_at
        since = idle_since(started_at=started, server=server, gpu=gpu, now=now)
        verdict = _apply(job, server=server, since=since, now=now)
        if verdict == Verdict.WARN:
            result.warned.append(job.pk)
        elif verdict == Verdict.CULL:
            result.culled.append(job.pk)
        elif verdict == Verdict.BUSY_AGAIN:
            result.busy_again.append(job.pk)
    if result.warned or result.culled:
        session_notices_send(warned=result.warned, culled=result.culled)
    return result


@transaction.atomic
def _apply(job: Job, *, server: ServerReading, since: datetime, now: datetime) -> Verdict | None:
    """One session's verdict, applied with its job's row locked (a stop or a cycle moving
    it meanwhile wins: None)."""
    locked = Job.objects.select_for_update().filter(pk=job.pk, attempt=job.attempt,
                                                    status=JobState.RUNNING.value).first()
    if locked is None:
        return None
    session = NotebookSession.objects.select_for_update().get(job_id=job.pk)
    verdict = session_verdict(idle_from=since, now=now,
                              idle_limit_minutes=session.idle_limit_minutes,
                              warn_lead_minutes=session.warn_lead_minutes,
                              warned_at=session.warned_at)
    activity = activity_at(server, now=now)
    session.last_checked_at, session.check_error = now, ""
    session.last_activity_at = activity
    session.idle_since = since if now - since >= timedelta(minutes=1) else None
    idle_minutes = int((now - since).total_seconds() // 60)
    threshold = job.tier.idle_threshold_percent
    data = {"idle_since": since.isoformat(), "idle_minutes": idle_minutes,
            "idle_limit_minutes": session.idle_limit_minutes,
            "gpu_threshold_percent": threshold}
    if verdict == Verdict.WARN:
        session.warned_at = now
        stop_at = since + timedelta(minutes=session.idle_limit_minutes)
        JobEvent.objects.create(
            job=locked, at=now, kind=JobEvent.Kind.IDLE, attempt=locked.attempt,
            actor_label="sessions",
            reason=(f"session idle {idle_minutes} min (no kernel activity, GPU under "
                    f"{threshold:g}%): stopped at {stop_at:%H:%M} UTC unless used (rule N2)"),
            data={**data, "rule": "N2", "stops_at": stop_at.isoformat()})
    elif verdict == Verdict.BUSY_AGAIN:
        session.warned_at = None
        JobEvent.objects.create(
            job=locked, at=now, kind=JobEvent.Kind.IDLE, attempt=locked.attempt,
            actor_label="sessions", reason="session in use again: not stopped (rule N4)",
            data={**data, "rule": "N4"})
    elif verdict == Verdict.CULL:
        reason = (f"culled: idle {idle_minutes} min (no kernel activity, GPU under "
                  f"{threshold:g}%), its limit {session.idle_limit_minutes} min (rule N3); "
                  "its PVC and files are kept")
        if not job_transition(locked, JobState.CANCELLED, now=now, actor_label="sessions",
                              reason=reason, finished_at=now, message="culled: idle",
                              data={**data, "rule": "N3"}):
            return None
        if locked.started_at is not None:
            usage_record_attempt(job=locked, start=locked.started_at, end=now)
        session.culled_at = now
        name = locked.backend_name
        transaction.on_commit(lambda: stop_workload_soon(name))
        transaction.on_commit(queue_plan_forget)
    session.save(update_fields=["last_checked_at", "check_error", "last_activity_at",
                                "idle_since", "warned_at", "culled_at"])
    return verdict


def _session_url(job_id: int) -> str:
    base = settings.FAIRQ_PUBLIC_URL.rstrip("/")
    return f"{base}/sessions/{job_id}/" if base else f"/sessions/{job_id}/"


def session_notices_send(*, warned: Iterable[int] = (), culled: Iterable[int] = ()) -> int:
    """E-mail each session's owner its N2 warning or its N3 stop, as the idle jobs' U2
    and U3 notices go (`notices.py`: FAIRQ_NOTICE_EMAILS, never for users without an
    address, a failing mail server logged, never raised). How many were sent."""
    what = {**dict.fromkeys(warned, "warned"), **dict.fromkeys(culled, "culled")}
    if not what or not settings.FAIRQ_NOTICE_EMAILS:
        return 0
    messages = []
    for s in NotebookSession.objects.select_related("owner", "job").filter(job_id__in=what):
        address = getattr(s.owner, "email", "") if s.owner else ""
        if not address:
            continue
        if what[s.job_id] == "warned":
            subject = f"fairq: your notebook session {s.job_id} is idle"
            body = (f"Your notebook session {s.job_id} ({s.job.name}) has had no kernel "
                    f"activity and idle GPUs for a while; it is stopped after "
                    f"{s.idle_limit_minutes} idle minutes (about {s.warn_lead_minutes} "
                    f"minute(s) from now) unless you use it (rule N2). Its files on its "
                    f"PVC are kept.\n\n{_session_url(s.job_id)}\n")
        else:
            subject = f"fairq: your notebook session {s.job_id} was stopped: idle"
            body = (f"Your notebook session {s.job_id} ({s.job.name}) stayed idle "
                    f"{s.idle_limit_minutes} minutes, so it was stopped (rule N3). Its "
                    f"files on its PVC are kept; start a new session to go on.\n\n"
                    f"{_session_url(s.job_id)}\n")
        messages.append((subject, body, None, [address]))
    return mails_send(messages, what="sessions: e-mailing %d notice(s) failed")


def servers_unavailable_reason() -> str:
    """Why no session of this platform can have a notebook server, "" when they can:
    the simulated cluster (the demo) runs a local `jupyter lab` only with
    FAIRQ_SIM_NOTEBOOKS on and JupyterLab installed (docs/sessions.md, "In the demo")."""
    if settings.FAIRQ_CLUSTER_BACKEND != "simulated":
        return ""
    if not settings.FAIRQ_SIM_NOTEBOOKS:
        return ("This demo runs no notebook servers (FAIRQ_SIM_NOTEBOOKS is off): a session "
                "queues, runs and is charged, but has no JupyterLab to open.")
    if not jupyterlab_installed():
        return ("This demo has no notebook server: JupyterLab is not installed here "
                "(pip install jupyterlab), so a session queues, runs and is charged, but "
                "has no JupyterLab to open.")
    return ""
