"""The notebook proxy: `/sessions/<job id>/lab/...` on fairq's own host to the session's
JupyterLab server (docs/sessions.md, "Opening one").

The user is fairq's: the Django session cookie of the web login, or an API token
(`Authorization: Token|Bearer <key>`, for programs). Only whoever `can_open_session`
says may reach a server; anyone else gets 403, the same answer for a job that does not
exist, so ids are not disclosed. The server's own token goes upstream as
`Authorization: token <token>` on every request and never to the browser: it is cut out
of every response's headers and body (JupyterLab puts it in its page config).

What a token-authenticated request skips upstream, the proxy checks itself: jupyter_server
waives its XSRF check and its WebSocket Origin check for a request that carries the
token (jupyter_server/base/handlers.py, `check_xsrf_cookie`, `skip_check_origin`), so a
state-changing request authenticated by the fairq cookie must carry JupyterLab's
`X-XSRFToken` header matching its `_xsrf` cookie (the server sets that cookie under
the session's base URL, `ServerApp.base_url` = the proxy's prefix), and a WebSocket
must come from fairq's own origin. A request with an API token needs neither: a browser
never adds that header by itself.

HTTP goes through Django (this module's `notebook_http`, an async view streaming both
ways with httpx); WebSockets (kernels, terminals) are an ASGI app of their own
(`notebook_websocket`, with the `websockets` client), routed by config/asgi.py.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import hmac
import http.cookiejar
import logging
import re
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import unquote

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions

from accounts.authentication import authenticate_key, token_key
from queueing.policy.states import JobState
from queueing.selectors.notebook_access import session_job_get
from queueing.services import sessions as notebook_sessions

log = logging.getLogger(__name__)

PATH = re.compile(r"^/sessions/(?P<job_id>[0-9]{1,18})/lab(?P<rest>/.*)?$", re.DOTALL)
# RFC 9110 7.6.1 and the ones proxies have always dropped; plus whatever `Connection` names.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
# Request headers the proxy sets itself (or must not pass: fairq's credentials).
REQUEST_OWN = frozenset({"host", "authorization", "cookie", "content-length", "accept-encoding",
                         "forwarded", "x-forwarded-for", "x-forwarded-host",
                         "x-forwarded-proto", "x-real-ip"})
# Response headers the proxy sets itself: the body is re-framed (the token cut out of it).
RESPONSE_OWN = frozenset({"content-length", "content-encoding", "set-cookie"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CHUNK = 64 * 1024
# A session in one of these states will have a server soon: its page reloads itself.
STARTING = frozenset({JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING, JobState.PREEMPTED})
STARTING_REFRESH = 5  # s
CONNECT_TIMEOUT = 5.0  # s: a server that does not take a connection by then answers 502
# s: a kernel's WebSocket handshake waits upstream until the kernel answers (jupyter_server
# "nudges" it first), many seconds for a kernel still starting.
WEBSOCKET_OPEN_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Access:
    """What the proxy may do for a request: `outcome` is "open" (with `upstream`),
    "forbidden" (no such session for this user), "not-running" (the user's session,
    but no server to reach: not started, ended, or its pod without an address yet)."""

    outcome: str
    job: Any = None
    upstream: Any = None


def _sessions() -> Any:
    """The sessions service: `can_open_session`, `notebook_upstream` (one seam, which the
    proxy's tests replace with a stand-in session)."""
    return notebook_sessions


def session_access(*, user: Any, job_id: int) -> Access:
    """Whether `user` may open job `job_id`'s notebook now, and where its server is."""
    job = session_job_get(job_id=job_id)
    sessions = _sessions()
    if job is None or not sessions.can_open_session(user, job):
        return Access("forbidden")
    upstream = sessions.notebook_upstream(job)
    if upstream is None:
        return Access("not-running", job=job)
    return Access("open", job=job, upstream=upstream)


def clean_rest(rest: str) -> str | None:
    """The path below a session's prefix if it stays below it: None for one with a `.` or
    `..` segment (also percent-encoded, once or more), a backslash or a NUL, which a
    server or a proxy in front of it could resolve to a path outside the prefix."""
    text, seen = rest, set()
    while text not in seen:  # each decoding of it, until decoding changes nothing
        seen.add(text)
        if "\\" in text or "\x00" in text:
            return None
        if any(seg in (".", "..") for seg in text.split("/")):
            return None
        text = unquote(text)
    return rest


def _cookie_header(header: str, drop: Iterable[str]) -> str:
    """The `Cookie` header without fairq's own cookies (its session and CSRF cookies
    never reach a notebook server: code running there could act as the user)."""
    dropped = set(drop)
    kept = [part.strip() for part in header.split(";")
            if part.strip() and part.strip().split("=", 1)[0] not in dropped]
    return "; ".join(kept)


def fairq_cookie_names() -> tuple[str, ...]:
    return (settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME)


def upstream_headers(items: Iterable[tuple[str, str]], *, token: str,
                     cookie: str) -> list[tuple[str, str]]:
    """The request headers to send upstream: the client's, less hop-by-hop ones, fairq's
    credentials and what the proxy sets, plus the server's token and the kept cookies."""
    items = list(items)
    named = {n.strip().lower() for k, v in items if k.lower() == "connection"
             for n in v.split(",")}
    out = [(k, v) for k, v in items
           if k.lower() not in HOP_BY_HOP and k.lower() not in REQUEST_OWN
           and k.lower() not in named]
    out.append(("Authorization", f"token {token}"))
    out.append(("Accept-Encoding", "identity"))  # the body is scanned for the token
    kept = _cookie_header(cookie, fairq_cookie_names())
    if kept:
        out.append(("Cookie", kept))
    return out


def _xsrf_value(raw: str) -> bytes | None:
    """The token in a Tornado XSRF value: version 2 ("2|mask|masked|time", the mask XORed
    out) or version 1 (plain hex). None when malformed."""
    raw = raw.strip().strip('"')
    if raw.startswith("2|"):
        parts = raw.split("|")
        if len(parts) != 4:
            return None
        try:
            mask, masked = binascii.a2b_hex(parts[1]), binascii.a2b_hex(parts[2])
        except (binascii.Error, ValueError):
            return None
        if len(mask) != 4 or not masked:
            return None
        return bytes(b ^ mask[i % 4] for i, b in enumerate(masked))
    try:
        return binascii.a2b_hex(raw) if raw else None
    except (binascii.Error, ValueError):
        return None


def xsrf_ok(*, cookie: str | None, header: str | None) -> bool:
    """Does the `X-XSRFToken` header (or `_xsrf` argument) carry the token of the `_xsrf`
    cookie? Tornado's double-submit check, done by the proxy because the server skips
    it for token-authenticated requests."""
    if not cookie or not header:
        return False
    a, b = _xsrf_value(cookie), _xsrf_value(header)
    return a is not None and b is not None and hmac.compare_digest(a, b)


class TokenScrubber:
    """Cuts `token` out of a byte stream, also across chunk boundaries: it holds back the
    last len(token) - 1 bytes of a chunk until the next one (or the end) shows whether
    they start the token."""

    def __init__(self, token: str) -> None:
        self.token = token.encode()
        self.tail = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self.token:
            return chunk
        data = (self.tail + chunk).replace(self.token, b"")
        keep = len(self.token) - 1
        self.tail, out = (data[-keep:], data[:-keep]) if len(data) > keep else (data, b"")
        return out

    def end(self) -> bytes:
        out, self.tail = self.tail, b""
        return out


def scrub_text(value: str, token: str) -> str:
    return value.replace(token, "") if token else value


async def _page(request: HttpRequest, status: int, *, title: str, message: str,
                job: Any = None, refresh: int = 0) -> HttpResponse:
    """fairq's readable page in place of the notebook; `refresh` s: it reloads itself
    (a session still starting), also said as Retry-After."""
    # Rendered in a thread: the base template's context processors read the database.
    response = await sync_to_async(render)(
        request, "web/session_unavailable.html",
        {"title": title, "message": message, "job": job, "refresh": refresh}, status=status)
    if refresh:
        response["Retry-After"] = str(refresh)
    # A session starting or ended is no server error: not in Django's error log (the
    # unreachable server is logged above, as a warning).
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def _starting(job: Any) -> bool:
    return getattr(job, "status", "") in STARTING


def _not_running_message(job: Any) -> str:
    status = getattr(job, "status", "")
    if status == JobState.RUNNING:
        return "This notebook session is starting: its server has no address yet."
    if status in STARTING:
        return (f"This notebook session is {status.lower()}: its JupyterLab server is not "
                "up yet.")
    return (f"This notebook session is not running (it is {status.lower() or 'gone'}). "
            "Its files stay on its volume; start a new session to open them.")


def _token_user(header: str) -> Any:
    """The active user of a fairq API token in `header`; AuthenticationFailed otherwise;
    None when the header is no `Token`/`Bearer` one."""
    key = token_key(header.encode("latin-1"))
    if key is None:
        return None
    return authenticate_key(key).user


@dataclass(frozen=True, slots=True)
class Who:
    user: Any
    by_token: bool  # an API token (no cookie: no XSRF check)
    refused: str = ""  # a bad API token: why


async def _who(request: HttpRequest) -> Who:
    header = request.headers.get("Authorization", "")
    if header:
        try:
            user = await sync_to_async(_token_user)(header)
        except exceptions.AuthenticationFailed as exc:
            return Who(AnonymousUser(), by_token=True, refused=str(exc.detail))
        if user is not None:
            return Who(user, by_token=True)
    return Who(await request.auser(), by_token=False)


@csrf_exempt
async def notebook_http(request: HttpRequest, job_id: str, rest: str | None = None
                        ) -> HttpResponseBase:
    """Proxy one HTTP request to the session's server, streaming both ways."""
    who = await _who(request)
    if who.refused:
        return HttpResponse(f"{who.refused}\n", status=401, content_type="text/plain")
    if not who.user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    access = await sync_to_async(session_access)(user=who.user, job_id=int(job_id))
    if access.outcome == "forbidden":
        return await _page(request, 403, title="Not your session",
                     message="This notebook session is not yours to open (or does not "
                             "exist). A session opens for its owner only.")
    if access.outcome == "not-running":
        return await _page(request, 503, title="Session not running",
                           message=_not_running_message(access.job), job=access.job,
                           refresh=STARTING_REFRESH if _starting(access.job) else 0)
    if rest is None:  # `/sessions/42/lab`: the server serves under the prefix with its slash
        return HttpResponse(status=302, headers={"Location": f"/sessions/{job_id}/lab/"})
    if clean_rest(rest) is None:
        return HttpResponse("The path leaves the session's prefix.\n", status=400,
                            content_type="text/plain")
    if (not who.by_token and request.method not in SAFE_METHODS
            and not xsrf_ok(cookie=request.COOKIES.get("_xsrf"),
                            header=request.headers.get("X-XSRFToken")
                            or request.GET.get("_xsrf"))):
        return HttpResponse("'_xsrf' argument missing or not matching the _xsrf cookie.\n",
                            status=403, content_type="text/plain")
    reply = await _forward(request, access.upstream, rest)
    if reply is None:  # the pod has an address, its server does not answer yet
        return await _page(request, 502, title="Session starting",
                           message="The notebook server of this session does not answer "
                                   "yet: it is starting (or has stopped).",
                           job=access.job, refresh=STARTING_REFRESH)
    return reply


def _raw_path(request: HttpRequest) -> str:
    """The request's path as the client sent it (its percent-encoding kept: a notebook's
    file name may hold an encoded slash), with its query string."""
    scope = getattr(request, "scope", None)
    raw = scope.get("raw_path") if scope else None
    path = raw.decode("latin-1") if raw else request.get_full_path().split("?", 1)[0]
    query = request.META.get("QUERY_STRING", "")
    return f"{path}?{query}" if query else path


async def _body(request: HttpRequest) -> AsyncIterator[bytes]:
    while chunk := await sync_to_async(request.read, thread_sensitive=False)(CHUNK):
        yield chunk


async def _forward(request: HttpRequest, upstream: Any, rest: str) -> HttpResponseBase | None:
    """The server's answer, streamed; None when it cannot be reached."""
    target = _raw_path(request)
    if not target.startswith(upstream.prefix):
        return HttpResponse("The path leaves the session's prefix.\n", status=400,
                            content_type="text/plain")
    headers = upstream_headers(request.headers.items(), token=upstream.token,
                               cookie=request.headers.get("Cookie", ""))
    has_body = request.method not in ("GET", "HEAD") and (
        request.headers.get("Content-Length", "0") not in ("", "0")
        or "chunked" in request.headers.get("Transfer-Encoding", ""))
    client = _client()
    try:
        sent = client.build_request(request.method or "GET", upstream.base_url + target,
                                    headers=headers, content=_body(request) if has_body else None)
        reply = await client.send(sent, stream=True)
    except httpx.HTTPError as exc:
        log.warning("notebook proxy: %s unreachable: %s", upstream.base_url,
                    type(exc).__name__)
        return None
    return _streamed(reply, upstream)


class _KeepNoCookies(http.cookiejar.DefaultCookiePolicy):
    """The shared client's cookie jar keeps nothing: a server's Set-Cookie is the
    browser's, and a jar shared by every user's requests would hand one user's cookies
    to the next (the Cookie header of each request is the client's own, filtered)."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
    weakref.WeakKeyDictionary()


def _client() -> httpx.AsyncClient:
    """The running event loop's client, its connections to the servers kept alive. One
    per loop: uvicorn has one; Django under WSGI runs each async view in a loop of its
    own. Plain HTTP with no proxy from the environment: no TLS context to build (that
    alone took 4-200 ms a request, measured, with a client per request)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = httpx.AsyncClient(
            timeout=httpx.Timeout(CONNECT_TIMEOUT, read=None, write=60.0),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
            verify=False, trust_env=False, follow_redirects=False,
            cookies=http.cookiejar.CookieJar(policy=_KeepNoCookies()))
    return client


def _streamed(reply: httpx.Response, upstream: Any) -> StreamingHttpResponse:
    token = upstream.token
    scrubber = TokenScrubber(token)

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in reply.aiter_raw():
                if out := scrubber.feed(chunk):
                    yield out
            if out := scrubber.end():
                yield out
        finally:
            await reply.aclose()

    response = StreamingHttpResponse(body(), status=reply.status_code)
    del response["Content-Type"]  # Django's default; the server's, if any, is copied below
    named = {n.strip().lower() for n in reply.headers.get_list("connection")
             for n in n.split(",")}
    for name, value in reply.headers.multi_items():
        low = name.lower()
        if low in HOP_BY_HOP or low in RESPONSE_OWN or low in named:
            continue
        value = scrub_text(value, token)
        if low == "location" and value.startswith(upstream.base_url):
            value = value[len(upstream.base_url):] or "/"
        response[name] = value
    for value in reply.headers.get_list("set-cookie"):
        _copy_cookie(response, scrub_text(value, token))
    # JupyterLab's page runs its own inline scripts; its server's CSP header stands, not fairq's.
    response._csp_exempt = True  # type: ignore[attr-defined]
    return response


def _copy_cookie(response: HttpResponseBase, header: str) -> None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return
    for name, morsel in jar.items():
        if name in fairq_cookie_names():
            continue  # a server may not set fairq's own cookies
        response.cookies[name] = morsel


# ---------------------------------------------------------------- WebSockets (ASGI)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return ""


def _cookie_user(cookie_header: str) -> Any:
    """The user of a Django session cookie (Django's own check: the session engine, the
    user's session auth hash); AnonymousUser without one."""
    from importlib import import_module

    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(cookie_header)
    except CookieError:
        return AnonymousUser()
    morsel = jar.get(settings.SESSION_COOKIE_NAME)
    if morsel is None:
        return AnonymousUser()
    request = HttpRequest()
    engine = import_module(settings.SESSION_ENGINE)
    request.session = engine.SessionStore(morsel.value)
    return get_user(request)


def _websocket_user(scope: Scope) -> tuple[Any, str]:
    """(user, refusal) of a WebSocket handshake: an API token's user, else the cookie's."""
    header = _header(scope, b"authorization")
    if header:
        try:
            user = _token_user(header)
        except exceptions.AuthenticationFailed as exc:
            return AnonymousUser(), str(exc.detail)
        if user is not None:
            return user, ""
    return _cookie_user(_header(scope, b"cookie")), ""


def origin_ok(scope: Scope) -> bool:
    """A WebSocket from fairq's own pages: no Origin (not a browser), or one whose host is
    the request's Host or a trusted origin's (CSRF_TRUSTED_ORIGINS)."""
    origin = _header(scope, b"origin")
    if not origin:
        return True
    host = _header(scope, b"host")
    bare = origin.split("://", 1)[-1]
    trusted = {o.split("://", 1)[-1] for o in getattr(settings, "CSRF_TRUSTED_ORIGINS", ())}
    return bool(host) and (bare == host or bare in trusted)


async def _refuse(send: Send) -> None:
    # Before `websocket.accept`: the ASGI server answers the handshake with 403.
    await send({"type": "websocket.close", "code": 1008})


async def notebook_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    """An ASGI app for `/sessions/<job id>/lab/...` WebSockets: the same user, access and
    path checks as `notebook_http`, then frames both ways until either side closes."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

    got = PATH.match(scope.get("path", ""))
    first = await receive()
    if first.get("type") != "websocket.connect" or got is None:
        await _refuse(send)
        return
    user, refused = await sync_to_async(_websocket_user)(scope)
    if refused or not user.is_authenticated or not origin_ok(scope):
        await _refuse(send)
        return
    access = await sync_to_async(session_access)(user=user, job_id=int(got["job_id"]))
    rest = got["rest"] or ""
    raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    if access.outcome != "open" or clean_rest(rest) is None \
            or not raw.startswith(access.upstream.prefix):
        await _refuse(send)
        return
    upstream = access.upstream
    query = scope.get("query_string", b"").decode("latin-1")
    url = "ws" + upstream.base_url[len("http"):] + raw + (f"?{query}" if query else "")
    headers = [("Authorization", f"token {upstream.token}")]
    cookie = _cookie_header(_header(scope, b"cookie"), fairq_cookie_names())
    if cookie:
        headers.append(("Cookie", cookie))
    try:
        server = await connect(url, additional_headers=headers,
                               subprotocols=scope.get("subprotocols") or None,
                               max_size=None, open_timeout=WEBSOCKET_OPEN_TIMEOUT,
                               ping_interval=None, user_agent_header=None)
    except (OSError, InvalidHandshake, InvalidStatus, TimeoutError) as exc:
        log.warning("notebook proxy: websocket to %s refused: %s", upstream.base_url,
                    type(exc).__name__)
        await _refuse(send)
        return
    await send({"type": "websocket.accept", "subprotocol": server.subprotocol})

    async def client_to_server() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await server.close()
                return
            if message.get("bytes") is not None:
                await server.send(message["bytes"])
            elif message.get("text") is not None:
                await server.send(message["text"])

    async def server_to_client() -> None:
        try:
            async for frame in server:
                if isinstance(frame, bytes):
                    await send({"type": "websocket.send", "bytes": frame})
                else:
                    await send({"type": "websocket.send", "text": frame})
        except ConnectionClosed:
            pass
        with contextlib.suppress(OSError, RuntimeError):  # the client may be gone already
            await send({"type": "websocket.close", "code": server.close_code or 1000})

    tasks = [asyncio.ensure_future(client_to_server()), asyncio.ensure_future(server_to_client())]
    try:
        _done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
    finally:
        await server.close()
