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

from dataclasses import dataclass
from typing import Any

from django.utils.crypto import salted_hmac

from queueing.models import Job, NotebookSession
from queueing.policy.states import JobState

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
    if session is None or job.status != JobState.RUNNING.value or not session.host:
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
