"""Webhooks (docs/webhooks.md): a signed POST on each job state change, following the
Standard Webhooks specification (the `standardwebhooks` package signs).

1. A state change writes its JobEvent (`jobs.job_transition`, the submits) and calls
   `webhooks_event_written`: nothing is read or written then; the event's id joins one
   list per transaction, sent to the worker after commit (one Celery message per
   committed transaction, `webhooks_dispatch_soon`). A rollback sends nothing.
2. The worker's `webhook_deliveries_create` writes one WebhookDelivery per event and
   target (each enabled endpoint of the team that takes the event's type, and the job's
   `notify_url`), with its message id and payload, due at once.
3. `webhook_attempt` claims one due delivery (compare-and-swap on `next_attempt_at`, so
   a retry message and the sweep never send it twice at once), POSTs it and logs the try
   (WebhookAttempt); a failure is due again after the next of
   FAIRQ_WEBHOOK_RETRY_SECONDS, or fails for good when they are used up.
4. `webhooks_send_due` (beat, every FAIRQ_WEBHOOK_SWEEP_SECONDS) queues what is due:
   retries whose message was lost, deliveries of a worker that died.

Failure to deliver never reaches the state change: step 1 cannot fail it (it only appends
an id) and the rest runs after its commit, in the worker.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import logging
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import certifi
import urllib3
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from accounts.models import Team
from accounts.services import audit_record, model_changes
from config.celery import app
from queueing import validation as v
from queueing.errors import DomainError
from queueing.models import (
    WEBHOOK_EVENT_TYPES,
    Job,
    JobEvent,
    TeamNotifySecret,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from queueing.sanitize import clean_text
from queueing.sealing import SealError, reseal, seal, unseal

from .access import check_team_admin

log = logging.getLogger(__name__)

EVENT_TYPES = WEBHOOK_EVENT_TYPES
TEST_EVENT_TYPE = "webhook.test"
DISPATCH_TASK = "queueing.tasks.webhooks_dispatch_task"
SECRET_SHOWN_ONCE = (
    "The secret was shown once, in the answer that created or rotated it; if it is lost, rotate it."
)
_EXCERPT = 500
USER_AGENT = "fairq-webhooks/1"


def event_type(to_status: str) -> str:
    """The Standard Webhooks `type` of a move to `to_status`: "job.running"."""
    return f"job.{to_status.lower()}"


def secret_new() -> str:
    """A signing secret as Standard Webhooks writes them: "whsec_" + base64 of 32 random
    bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _masked(changes: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Audit changes without the secret's value (that it changed is kept)."""
    if "secret" in changes:
        changes["secret"] = ["***" if changes["secret"][0] else None, "***"]
    return changes


# --- endpoints: team admins and staff ------------------------------------------------


@dataclass(frozen=True)
class EndpointWithSecret:
    endpoint: WebhookEndpoint
    secret: str  # shown once


def _event_types_checked(event_types: Any) -> list[str]:
    if event_types is None:
        return []
    unknown = [t for t in event_types if t not in EVENT_TYPES]
    if unknown:
        raise DomainError(
            "The request has invalid fields.",
            fields={
                "event_types": [
                    f"Unknown event types {', '.join(map(str, unknown))}; known: "
                    f"{', '.join(EVENT_TYPES)} (none: every one)."
                ]
            },
        )
    return sorted(set(event_types), key=EVENT_TYPES.index)


def _url_checked(url: Any) -> str:
    problem = v.webhook_url_problem(url)
    if problem:
        raise DomainError("The request has invalid fields.", fields={"url": [problem]})
    return str(url)


@transaction.atomic
def webhook_endpoint_create(
    *,
    actor: Any,
    team: Team,
    url: str,
    description: str = "",
    enabled: bool = True,
    event_types: list[str] | None = None,
    now: datetime | None = None,
) -> EndpointWithSecret:
    """A new endpoint of `team` with a new secret (returned once), audited. `actor` must
    be a team admin of `team` or staff (PermissionDenied otherwise); DomainError (400)
    on `url` or `event_types`."""
    if actor is not None:
        check_team_admin(actor=actor, team=team)
    now = now or timezone.now()
    secret = secret_new()
    endpoint = WebhookEndpoint(
        team=team,
        url=_url_checked(url),
        description=clean_text(description, max_length=200),
        enabled=enabled,
        event_types=_event_types_checked(event_types),
        secret=seal(secret),
        secret_rotated_at=now,
        created_at=now,
        updated_at=now,
    )
    endpoint.save()
    audit_record(
        actor=actor, action="create", instance=endpoint, changes=_masked(model_changes(None, endpoint))
    )
    return EndpointWithSecret(endpoint=endpoint, secret=secret)


_ENDPOINT_FIELDS = frozenset({"url", "description", "enabled", "event_types"})


@transaction.atomic
def webhook_endpoint_update(
    *, actor: Any, endpoint: WebhookEndpoint, now: datetime | None = None, **fields: Any
) -> WebhookEndpoint:
    """Change `url`, `description`, `enabled` or `event_types`, audited field by field.
    Deliveries already written keep their URL. Checks as `webhook_endpoint_create`."""
    if actor is not None:
        check_team_admin(actor=actor, team=endpoint.team)
    before = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    row = WebhookEndpoint.objects.get(pk=endpoint.pk)
    for name, value in fields.items():
        if name not in _ENDPOINT_FIELDS:
            raise ValueError(f"webhook field {name!r} cannot be changed")
        if name == "url":
            value = _url_checked(value)
        elif name == "event_types":
            value = _event_types_checked(value)
        elif name == "description":
            value = clean_text(value, max_length=200)
        setattr(row, name, value)
    row.updated_at = now or timezone.now()
    row.save()
    audit_record(actor=actor, action="update", instance=row, changes=_masked(model_changes(before, row)))
    return row


@transaction.atomic
def webhook_endpoint_delete(*, actor: Any, endpoint: WebhookEndpoint) -> None:
    """Delete the endpoint and its delivery log, audited."""
    if actor is not None:
        check_team_admin(actor=actor, team=endpoint.team)
    audit_record(
        actor=actor,
        action="delete",
        instance=endpoint,
        changes={"url": [endpoint.url, None], "team": [endpoint.team.slug, None]},
    )
    endpoint.delete()


@transaction.atomic
def webhook_secret_rotate(
    *, actor: Any, endpoint: WebhookEndpoint, now: datetime | None = None
) -> EndpointWithSecret:
    """A new secret for the endpoint (returned once), audited; tries from now on are
    signed with it, the old one is forgotten."""
    if actor is not None:
        check_team_admin(actor=actor, team=endpoint.team)
    now = now or timezone.now()
    row = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
    secret = secret_new()
    row.secret = seal(secret)
    row.secret_rotated_at = row.updated_at = now
    row.save(update_fields=["secret", "secret_rotated_at", "updated_at"])
    audit_record(
        actor=actor,
        action="update",
        instance=row,
        changes={"secret": ["***", "***"], "secret_rotated_at": [None, now.isoformat()]},
    )
    return EndpointWithSecret(endpoint=row, secret=secret)


@transaction.atomic
def team_notify_secret_rotate(*, actor: Any, team: Team, now: datetime | None = None) -> str:
    """Create or replace the secret that signs the POSTs to `team`'s jobs' notify_url;
    returns it (shown once), audited."""
    if actor is not None:
        check_team_admin(actor=actor, team=team)
    now = now or timezone.now()
    row = TeamNotifySecret.objects.select_for_update().filter(team=team).first()
    created = row is None
    if row is None:
        row = TeamNotifySecret(team=team)
    secret = secret_new()
    row.secret, row.rotated_at = seal(secret), now
    row.save()
    audit_record(
        actor=actor,
        action="create" if created else "update",
        instance=row,
        changes={"secret": [None if created else "***", "***"], "rotated_at": [None, now.isoformat()]},
    )
    return secret


def notify_url_problem(*, team: Team, url: str) -> str | None:
    """Why a job of `team` may not name `url` as its notify_url, or None: the URL's shape,
    the team's allowlist (`allowed_notify_url_prefixes`), a notify secret to sign with."""
    problem = v.webhook_url_problem(url)
    if problem:
        return problem
    if not v.notify_url_allowed(url, team.allowed_notify_url_prefixes):
        return (
            f"Team {team.slug} does not allow this notify_url: a team admin lists its "
            "prefix in allowed_notify_url_prefixes (PATCH /api/v1/teams/"
            f"{team.slug}/workload-policy/)."
        )
    if not TeamNotifySecret.objects.filter(team=team).exists():
        return (
            f"Team {team.slug} has no notify secret to sign with: a team admin creates "
            f"one (POST /api/v1/teams/{team.slug}/webhooks/notify-secret/)."
        )
    return None


# --- step 1: a state change ----------------------------------------------------------


class _Dispatch:
    """The event ids of one transaction, sent to the worker once it commits."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.sent = False

    def __call__(self) -> None:
        self.sent = True
        webhooks_dispatch_soon(self.ids)


def webhooks_event_written(event_id: int) -> None:
    """Step 1: `event_id` (a JobEvent with a to_status) is delivered once the current
    transaction commits. No query; safe in any transaction (a rollback drops it)."""
    webhooks_events_written([event_id])


def webhooks_events_written(event_ids: Iterable[int]) -> None:
    """`webhooks_event_written` for several events."""
    conn = transaction.get_connection()
    batch: _Dispatch | None = None
    if conn.in_atomic_block:
        # One message per transaction, found in O(1) (a cycle or a bulk cancel writes
        # thousands of events): the batch registered on this very list of commit hooks.
        # Django replaces the list whenever it drops hooks (a commit, a rollback, a
        # savepoint rolled back), so a batch whose hook may be gone is never reused; at
        # worst a rolled-back savepoint costs one more message.
        hooks, pending = getattr(conn, "_fairq_webhook_batch", (None, None))
        if hooks is conn.run_on_commit and pending is not None and not pending.sent:
            batch = pending
    if batch is None:
        batch = _Dispatch()
        batch.ids.extend(event_ids)
        transaction.on_commit(batch, robust=True)
        if conn.in_atomic_block:
            conn._fairq_webhook_batch = (conn.run_on_commit, batch)
    else:
        batch.ids.extend(event_ids)


def webhooks_dispatch_soon(event_ids: list[int]) -> None:
    """Send the events to the worker (by task name: services do not import the tasks
    above them). Never raises: a broker that is down costs these deliveries, logged, and
    never the state change that already committed."""
    if not event_ids:
        return
    try:
        app.signature(DISPATCH_TASK, args=(list(event_ids),)).apply_async()
    except Exception:
        log.exception("webhooks: could not queue %d event(s) for delivery", len(event_ids))


# --- step 2: deliveries --------------------------------------------------------------


def job_url(job_id: int) -> str | None:
    """The job's page as an absolute URL, from FAIRQ_PUBLIC_URL; None when that is unset (a
    receiver must never resolve a relative URL against its own host; `check --deploy`
    warns, fairq.W011)."""
    base = settings.FAIRQ_PUBLIC_URL.rstrip("/")
    return f"{base}/jobs/{job_id}/" if base else None


def event_payload(event: JobEvent, job: Job) -> dict[str, Any]:
    """The body of a job event's POST (docs/webhooks.md)."""
    return {
        "type": event_type(event.to_status),
        "timestamp": event.at.isoformat(),
        "data": {
            "job_id": job.pk,
            "name": job.name,
            "team": job.team.slug,
            "status": event.to_status,
            "from_status": event.from_status or None,
            "attempt": event.attempt,
            "reason": event.reason,
            "url": job_url(job.pk),
        },
    }


def _message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def webhook_deliveries_create(*, event_ids: Iterable[int], now: datetime) -> list[int]:
    """Step 2: one delivery per event and target, due now; returns their ids. An event
    already delivered to a target (a message sent twice) is not written again; events
    that are gone (rolled back) or have no to_status are skipped."""
    events = list(
        JobEvent.objects.filter(pk__in=list(event_ids))
        .exclude(to_status="")
        .select_related("job", "job__team")
        .order_by("id")
    )
    team_ids = {e.job.team_id for e in events}
    endpoints: dict[int, list[WebhookEndpoint]] = {}
    for endpoint in WebhookEndpoint.objects.filter(team_id__in=team_ids, enabled=True):
        endpoints.setdefault(endpoint.team_id, []).append(endpoint)
    created: list[int] = []
    for event in events:
        job = event.job
        kind = event_type(event.to_status)
        payload = event_payload(event, job)
        targets: list[tuple[WebhookEndpoint | None, str]] = [
            (e, e.url) for e in endpoints.get(job.team_id, []) if e.takes(kind)
        ]
        if job.notify_url:
            targets.append((None, job.notify_url))
        for target, url in targets:
            delivery = WebhookDelivery(
                team_id=job.team_id,
                endpoint=target,
                job=job,
                event=event,
                url=url,
                message_id=_message_id(),
                event_type=kind,
                payload=payload,
                next_attempt_at=now,
                created_at=now,
            )
            try:
                with transaction.atomic():
                    delivery.save()
            except IntegrityError:
                continue  # already written by an earlier message of the same event
            created.append(delivery.pk)
    return created


@transaction.atomic
def webhook_endpoint_test(
    *, actor: Any, endpoint: WebhookEndpoint, now: datetime | None = None
) -> WebhookDelivery:
    """A `webhook.test` delivery to the endpoint, sent after commit (enabled or not),
    logged like the others."""
    if actor is not None:
        check_team_admin(actor=actor, team=endpoint.team)
    now = now or timezone.now()
    delivery = WebhookDelivery.objects.create(
        team_id=endpoint.team_id,
        endpoint=endpoint,
        url=endpoint.url,
        message_id=_message_id(),
        event_type=TEST_EVENT_TYPE,
        payload={
            "type": TEST_EVENT_TYPE,
            "timestamp": now.isoformat(),
            "data": {
                "team": endpoint.team.slug,
                "endpoint_id": endpoint.pk,
                "by": str(actor) if actor is not None else "fairq",
            },
        },
        next_attempt_at=now,
        created_at=now,
    )
    pk = delivery.pk
    transaction.on_commit(lambda: webhook_send_soon(pk), robust=True)
    return delivery


DELIVER_TASK = "queueing.tasks.webhook_deliver_task"


def webhook_send_soon(delivery_id: int) -> None:
    """Ask a worker to try `delivery_id` (never raises; the sweep sends it otherwise)."""
    try:
        app.signature(DELIVER_TASK, args=(delivery_id,)).apply_async()
    except Exception:
        log.exception("webhooks: could not queue delivery %s", delivery_id)


# --- step 3: one try -----------------------------------------------------------------


class RefusedAddress(Exception):
    """The URL's host resolves to an address webhooks are not sent to."""


class DeadlineExceeded(TimeoutError):
    """A try ran past its total deadline (FAIRQ_WEBHOOK_TIMEOUT_SECONDS)."""


# Cloud metadata and host services, never a receiver even when private addresses are
# allowed: AWS, GCP, Azure (IMDS), OpenStack (169.254.169.254), AWS over IPv6, Azure's
# wireserver (a public-looking address every Azure VM reaches), Alibaba, Oracle.
_METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "168.63.129.16", "100.100.100.200", "192.0.0.192"))
# Special-purpose blocks that Python's `is_global` may count as global, refused unless
# private addresses are allowed: IETF protocol assignments (192.0.0.0/24, e.g. 192.0.0.9),
# 6to4 (2002::/16: it tunnels to any IPv4 address, private ones included) and Teredo.
_NOT_GLOBAL = tuple(ipaddress.ip_network(n) for n in (
    "192.0.0.0/24", "2002::/16", "2001::/32", "64:ff9b:1::/48"))
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 one carries and may reach: IPv4-mapped, 6to4, Teredo
    (server and client), NAT64 (64:ff9b::/96) and the deprecated IPv4-compatible form."""
    out: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        out.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        out.append(ip.sixtofour)
    if ip.teredo is not None:
        out.extend(ip.teredo)
    packed = int(ip)
    if ip in _NAT64 or (packed >> 32 == 0 and packed > 1):
        out.append(ipaddress.IPv4Address(packed & 0xFFFFFFFF))
    return out


def address_problem(address: str, *, allow_private: bool) -> str | None:
    """Why a POST must not go to `address`, or None. Always refused: link-local (cloud
    metadata services live there), the metadata addresses above, unspecified, multicast,
    and IPv6 forms carrying such an IPv4 address. Unless `allow_private`: anything not
    globally routable (private, loopback, reserved, shared, documentation, 192.0.0.0/24,
    6to4, Teredo) and IPv6 forms whose embedded IPv4 address is not global."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        candidates.extend(_embedded_ipv4(ip))
    for one in candidates:
        if one in _METADATA or one.is_link_local or one.is_unspecified or one.is_multicast:
            return (f"{one} is link-local, a metadata service, unspecified or multicast: "
                    "never a webhook receiver")
    if allow_private:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and (
            ip.ipv4_mapped is not None or ip in _NAT64 or (int(ip) >> 32 == 0 and int(ip) > 1)):
        candidates = candidates[1:]  # only a wrapper: the IPv4 address it carries decides
    for one in candidates:
        if (not one.is_global or one.is_private or one.is_loopback or one.is_reserved
                or any(one in net for net in _NOT_GLOBAL if net.version == one.version)):
            if isinstance(ip, ipaddress.IPv6Address) and one.version == 4:
                return (f"{ip} carries {one}, not a globally routable address "
                        "(FAIRQ_WEBHOOK_ALLOW_PRIVATE is off)")
            return f"{one} is a private address, not globally routable (FAIRQ_WEBHOOK_ALLOW_PRIVATE is off)"
    return None


def _resolve(host: str, port: int, deadline: float) -> list[str]:
    """The addresses `host` resolves to, within the deadline (a resolver that hangs is
    left behind in its daemon thread)."""
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP))
        except OSError as exc:
            result.append(exc)

    thread = threading.Thread(target=run, name="webhook-resolve", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if not result:
        raise DeadlineExceeded(f"resolving {host} took longer than the try's deadline")
    if isinstance(result[0], OSError):
        raise ConnectionError(f"cannot resolve {host}: {result[0]}")
    return [str(info[4][0]) for info in result[0]]


def checked_address(url: str, *, deadline: float) -> str:
    """Resolve the URL's host **once** and check every address it resolves to
    (`address_problem`); the address the POST then connects to, as resolved (no second
    lookup for a rebinding DNS server to answer differently). RefusedAddress when the
    URL or one of its addresses may not be sent to."""
    problem = v.webhook_url_problem(url)
    if problem:
        raise RefusedAddress(problem)
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = _resolve(host, port, deadline)
    if not addresses:
        raise ConnectionError(f"{host} resolves to no address")
    for address in addresses:
        problem = address_problem(address, allow_private=settings.FAIRQ_WEBHOOK_ALLOW_PRIVATE)
        if problem:
            raise RefusedAddress(problem)
    return addresses[0]


@dataclass(frozen=True)
class Answer:
    status_code: int
    excerpt: str


def http_post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
    """POST `body` to `url` within a **total** deadline of `timeout` seconds (resolving,
    connecting, TLS, sending and reading the answer's status, headers and first bytes, all
    together: a receiver that drips a byte at a time is cut off at the deadline), to the
    address `checked_address` resolved and checked. The connection is urllib3's, opened to
    that address while the Host header, TLS SNI and the certificate check keep the URL's
    name. Redirects are not followed."""
    deadline = time.monotonic() + timeout
    address = checked_address(url, deadline=deadline)
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    remaining = max(0.001, deadline - time.monotonic())
    conn: urllib3.connection.HTTPConnection
    if parts.scheme == "https":
        conn = urllib3.connection.HTTPSConnection(
            address, port, timeout=remaining, server_hostname=parts.hostname,
            assert_hostname=parts.hostname, cert_reqs="CERT_REQUIRED", ca_certs=certifi.where())
    else:
        conn = urllib3.connection.HTTPConnection(address, port, timeout=remaining)
    expired = threading.Event()

    def cut_off() -> None:
        # Unblocks whatever socket call the try is in (connect, TLS, send, a read).
        expired.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(remaining, cut_off)
    timer.daemon = True
    timer.start()
    try:
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        conn.request("POST", path, body=body, headers={**headers, "host": parts.netloc},
                     preload_content=False)
        response = conn.getresponse()
        raw = response.read(_EXCERPT) or b""
        if expired.is_set():
            raise DeadlineExceeded(f"no complete answer within {timeout:g} s")
        return Answer(response.status, raw.decode("utf-8", "replace"))
    except Exception as exc:
        if expired.is_set() or time.monotonic() >= deadline:
            raise DeadlineExceeded(f"no complete answer within {timeout:g} s") from exc
        raise
    finally:
        timer.cancel()
        conn.close()


def _secret_of(delivery: WebhookDelivery) -> str | None:
    """The signing secret of the delivery's target, in clear (stored encrypted)."""
    if delivery.endpoint_id is not None:
        stored = delivery.endpoint.secret if delivery.endpoint is not None else None
    else:
        stored = (TeamNotifySecret.objects.filter(team_id=delivery.team_id)
                  .values_list("secret", flat=True).first())
    return None if stored is None else unseal(stored)


def webhook_secrets_reencrypt() -> int:
    """Re-encrypt every stored signing secret (endpoints' and notify secrets) with the
    first key of FAIRQ_WEBHOOK_SECRET_KEYS, sealing any still in clear; returns how many
    rows were rewritten. Each row in its own short transaction, locked while rewritten;
    SealError (nothing more rewritten) when a row opens with none of the keys."""
    done = 0
    for model in (WebhookEndpoint, TeamNotifySecret):
        for pk in model.objects.order_by("pk").values_list("pk", flat=True):
            with transaction.atomic():
                row = model.objects.select_for_update().filter(pk=pk).first()
                if row is None:
                    continue
                row.secret = reseal(row.secret)
                row.save(update_fields=["secret"])
                done += 1
    return done


def signed_request(*, delivery: WebhookDelivery, secret: str, now: datetime) -> tuple[bytes, dict[str, str]]:
    """The body and the Standard Webhooks headers of one try (signed at `now`)."""
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True)
    signature = Webhook(secret).sign(msg_id=delivery.message_id, timestamp=now, data=body)
    return body.encode(), {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": delivery.message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }


def webhook_attempt(
    *,
    delivery_id: int,
    now: datetime,
    post: Callable[[str, bytes, dict[str, str], float], Answer] = http_post,
) -> WebhookAttempt | None:
    """Step 3: one try of a due delivery, logged. None (nothing done) when it is not due
    or another worker claimed it. A 2xx answer succeeds; anything else (another status, a
    redirect, a timeout, no connection) is due again after the next retry delay, or fails
    for good once they are used up; a URL that may not be sent to fails at once."""
    timeout = settings.FAIRQ_WEBHOOK_TIMEOUT_SECONDS
    lease = now + timedelta(seconds=timeout * 2 + 60)
    won = WebhookDelivery.objects.filter(
        pk=delivery_id,
        status=WebhookDelivery.Status.PENDING,
        next_attempt_at__lte=now,
    ).update(next_attempt_at=lease)
    if won != 1:
        return None
    delivery = WebhookDelivery.objects.select_related("endpoint").get(pk=delivery_id)
    number = delivery.attempts + 1
    status_code: int | None = None
    excerpt = error = ""
    final_error = False
    started = time.monotonic()
    try:
        secret = _secret_of(delivery)
    except SealError as exc:
        secret, error = None, f"cannot sign: {exc}"
    if error:
        pass  # a key dropped too early: tried again on the retry schedule, once it is back
    elif secret is None:
        error, final_error = "no secret to sign with (the endpoint or notify secret is gone)", True
    elif (
        delivery.endpoint is not None
        and not delivery.endpoint.enabled
        and delivery.event_type != TEST_EVENT_TYPE
    ):
        error, final_error = "the endpoint is disabled", True
    else:
        try:
            body, headers = signed_request(delivery=delivery, secret=secret, now=now)
            answer = post(delivery.url, body, headers, timeout)
            status_code, excerpt = answer.status_code, answer.excerpt
            if not 200 <= status_code < 300:
                error = "redirects are not followed" if 300 <= status_code < 400 else f"HTTP {status_code}"
        except RefusedAddress as exc:
            error, final_error = f"refused: {exc}", True
        except Exception as exc:  # a timeout, no connection, a bad answer: try again
            error = f"{type(exc).__name__}: {exc}"
    duration_ms = int((time.monotonic() - started) * 1000)
    delays = settings.FAIRQ_WEBHOOK_RETRY_SECONDS
    next_retry: datetime | None = None
    if error and not final_error and number <= len(delays):
        next_retry = now + timedelta(seconds=delays[number - 1])
    with transaction.atomic():
        attempt = WebhookAttempt.objects.create(
            delivery=delivery,
            number=number,
            at=now,
            status_code=status_code,
            response_excerpt=clean_text(excerpt, max_length=_EXCERPT),
            error=clean_text(error, max_length=500),
            duration_ms=duration_ms,
            next_retry_at=next_retry,
        )
        done = {
            "status": WebhookDelivery.Status.SUCCEEDED
            if not error
            else WebhookDelivery.Status.PENDING
            if next_retry
            else WebhookDelivery.Status.FAILED,
            "attempts": number,
            "next_attempt_at": next_retry,
            "finished_at": None if next_retry else now,
        }
        WebhookDelivery.objects.filter(pk=delivery_id).update(**done)
    if error:
        log.info(
            "webhook %s try %d to %s: %s%s",
            delivery.message_id,
            number,
            delivery.url,
            error,
            f"; next at {next_retry:%H:%M:%S}" if next_retry else "; giving up",
        )
    return attempt


# --- step 4: what is due --------------------------------------------------------------


def webhooks_due(*, now: datetime, limit: int = 200) -> list[int]:
    """Ids of pending deliveries due at `now`, oldest first."""
    return list(
        WebhookDelivery.objects.filter(status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at", "id")
        .values_list("pk", flat=True)[:limit]
    )


def webhooks_send_due(*, now: datetime, send: Callable[[int], None] | None = None) -> list[int]:
    """Step 4 (beat: `webhooks-due`): queue a try of every delivery due at `now`, each
    its own task with its own clock (a slow receiver holds up no other delivery, and
    each try is signed when it is sent); returns their ids."""
    due = webhooks_due(now=now)
    for delivery_id in due:
        (send or webhook_send_soon)(delivery_id)
    return due


def webhook_deliveries_purge(*, now: datetime, days: float, batch: int = 10_000) -> int:
    """Delete the finished deliveries (and their tries) created more than `days` ago, in
    batches (no long locks); pending ones stay. Returns how many. Beat runs it hourly
    (`webhook-deliveries-purge`, FAIRQ_WEBHOOK_LOG_RETENTION_DAYS; 0 keeps them)."""
    if days <= 0:
        return 0
    cutoff = now - timedelta(days=days)
    deleted = 0
    while True:
        ids = list(
            WebhookDelivery.objects.filter(created_at__lt=cutoff)
            .exclude(status=WebhookDelivery.Status.PENDING)
            .values_list("pk", flat=True)[:batch]
        )
        if not ids:
            return deleted
        WebhookAttempt.objects.filter(delivery_id__in=ids).delete()
        deleted += WebhookDelivery.objects.filter(pk__in=ids).delete()[0]
