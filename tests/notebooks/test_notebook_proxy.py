"""The notebook proxy (queueing/web/notebook_proxy.py, docs/sessions.md "Opening
one") in front of a real JupyterLab server, through fairq's real ASGI server
(uvicorn): who may open a session, the paths it takes, XSRF, the WebSocket of a kernel,
and that the server's token never reaches the client."""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import uuid
from typing import Any

import httpx
import pytest
from django.test import Client

from tests.notebooks.conftest import Lab, StandInUpstream

pytestmark = pytest.mark.django_db(transaction=True)


def cookie_of(user: Any) -> str:
    """A logged-in browser's Django session cookie (the web login's)."""
    c = Client()
    c.force_login(user)
    return c.cookies["sessionid"].value


def browser(lab: Lab, user: Any) -> httpx.Client:
    return httpx.Client(base_url=lab.url, cookies={"sessionid": cookie_of(user)}, timeout=30)


def everything_served(reply: httpx.Response) -> str:
    return "\n".join([reply.text, *[f"{k}: {v}" for k, v in reply.headers.multi_items()]])


def test_the_owner_opens_jupyterlab_and_the_token_never_reaches_the_browser(
        lab: Lab, world: Any) -> None:
    with browser(lab, world.member) as b:
        page = b.get(f"{lab.prefix}lab")
        assert page.status_code == 200, page.text[:500]
        assert "jupyter-config-data" in page.text  # JupyterLab's own page
        got = re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page.text, re.S)
        assert got is not None, page.text[:800]
        config = json.loads(got.group(1))
        assert config["baseUrl"] == lab.prefix
        assert config["token"] == ""  # the server put its token there; the proxy cut it
        assert lab.token not in everything_served(page)
        assert "_xsrf" in page.cookies  # the server's XSRF cookie, under the prefix
        assert "Path=" + lab.prefix in page.headers.get("set-cookie", "")
        # fairq's CSP is not laid over JupyterLab's: the server's own header stands.
        assert page.headers["content-security-policy"].startswith("frame-ancestors 'self'")
        # Its scripts and REST API through the same prefix, none showing the token.
        status = b.get(f"{lab.prefix}api/status")
        assert status.status_code == 200 and "started" in status.json()
        me = b.get(f"{lab.prefix}api/me")
        settings = b.get(f"{lab.prefix}lab/api/settings")
        script = b.get(re.findall(r'src="([^"]+\.js[^"]*)"', page.text)[0])
        assert me.status_code == settings.status_code == script.status_code == 200
        assert "javascript" in script.headers["content-type"] and len(script.content) > 1000
        for reply in (status, me, settings, script):
            assert lab.token not in everything_served(reply)
        assert all(lab.token not in v for v in b.cookies.values())


def test_an_anonymous_visitor_is_sent_to_the_login_page(lab: Lab) -> None:
    reply = httpx.get(f"{lab.url}{lab.prefix}lab?reset", timeout=30)
    assert reply.status_code == 302
    assert reply.headers["location"] == \
        f"/accounts/login/?next=/sessions/{lab.job.pk}/lab/lab%3Freset"


def test_another_users_session_is_403_and_so_is_a_job_that_does_not_exist(
        lab: Lab, world: Any) -> None:
    for user in (world.outsider, world.admin):  # another team's; the owner's team admin
        with browser(lab, user) as b:
            reply = b.get(f"{lab.prefix}lab")
            assert reply.status_code == 403
            assert "Not your session" in reply.text and lab.token not in reply.text
            assert b.get(f"{lab.prefix}api/contents").status_code == 403
    with browser(lab, world.member) as b:
        assert b.get("/sessions/999999/lab/").status_code == 403


def test_a_session_that_is_not_running_shows_a_readable_page(lab: Lab, world: Any) -> None:
    from queueing.models import Job

    del lab.sessions.upstreams[lab.job.pk]
    Job.objects.filter(pk=lab.job.pk).update(status="QUEUED")
    with browser(lab, world.member) as b:
        reply = b.get(f"{lab.prefix}lab")
        assert reply.status_code == 503 and reply.headers["retry-after"] == "5"
        assert "Session not running" in reply.text and "is queued" in reply.text
        assert '<meta http-equiv="refresh" content="5">' in reply.text  # it reloads itself
        assert f"Session #{lab.job.pk}" in reply.text
        Job.objects.filter(pk=lab.job.pk).update(status="CANCELLED")
        ended = b.get(f"{lab.prefix}lab")
        assert ended.status_code == 503 and "retry-after" not in ended.headers
        assert "is cancelled" in ended.text and "http-equiv" not in ended.text
        # An address, but no server answering there (yet): starting, reloads itself.
        Job.objects.filter(pk=lab.job.pk).update(status="RUNNING")
        lab.sessions.upstreams[lab.job.pk] = StandInUpstream(
            f"http://127.0.0.1:{_closed_port()}", lab.token, lab.prefix)
        starting = b.get(f"{lab.prefix}lab")
        assert starting.status_code == 502 and "Session starting" in starting.text
        assert starting.headers["retry-after"] == "5"


def _closed_port() -> int:
    from tests.notebooks.servers import free_port

    return free_port()  # bound and released: nothing listens there


def test_a_path_escaping_the_prefix_is_refused(lab: Lab, world: Any) -> None:
    cookie = f"sessionid={cookie_of(world.member)}"
    host = lab.url.removeprefix("http://")
    escapes = [f"{lab.prefix}../../1/lab/api/status", f"{lab.prefix}..%2F..%2Fapi/status",
               f"{lab.prefix}%2e%2e/%2e%2e/api/status", f"{lab.prefix}api/..\\..\\status",
               f"{lab.prefix}./api/status", f"{lab.prefix}%252e%252e/%252e%252e/api/status"]
    for path in escapes:  # sent as written (http.client does not resolve dot segments)
        conn = http.client.HTTPConnection(host, timeout=30)
        conn.request("GET", path, headers={"Cookie": cookie})
        reply = conn.getresponse()
        body = reply.read().decode()
        conn.close()
        assert reply.status == 400, (path, reply.status, body[:200])
        assert "leaves the session's prefix" in body
    with browser(lab, world.member) as b:
        assert b.get(f"/sessions/{lab.job.pk}/lab").headers["location"] == lab.prefix


def test_a_change_needs_the_xsrf_cookie_and_header_an_api_token_does_not(
        lab: Lab, world: Any) -> None:
    from accounts.services import token_issue

    with browser(lab, world.member) as b:
        b.get(f"{lab.prefix}lab")
        xsrf = b.cookies["_xsrf"]
        body = {"type": "file", "format": "text", "content": "hello"}
        refused = b.put(f"{lab.prefix}api/contents/a.txt", json=body)
        assert refused.status_code == 403 and "_xsrf" in refused.text
        wrong = b.put(f"{lab.prefix}api/contents/a.txt", json=body,
                      headers={"X-XSRFToken": "2|00000000|" + "ab" * 16 + "|1"})
        assert wrong.status_code == 403
        made = b.put(f"{lab.prefix}api/contents/a.txt", json=body,
                     headers={"X-XSRFToken": xsrf})
        assert made.status_code == 201, made.text
    assert (lab.root / "a.txt").read_text() == "hello"
    key = token_issue(user=world.member).key
    api = httpx.put(f"{lab.url}{lab.prefix}api/contents/b.txt", json=body, timeout=30,
                    headers={"Authorization": f"Token {key}"})
    assert api.status_code == 201 and (lab.root / "b.txt").exists()
    bad = httpx.get(f"{lab.url}{lab.prefix}api/status", timeout=30,
                    headers={"Authorization": "Token fq_nope_nope"})
    assert bad.status_code == 401
    other = token_issue(user=world.outsider).key
    assert httpx.get(f"{lab.url}{lab.prefix}api/status", timeout=30,
                     headers={"Authorization": f"Bearer {other}"}).status_code == 403


async def _run_code(url: str, headers: dict[str, str], code: str) -> str:
    """Execute `code` on a kernel over its WebSocket (Jupyter's JSON protocol); what it
    printed."""
    from websockets.asyncio.client import connect

    out = []
    async with connect(url, additional_headers=headers, open_timeout=30) as ws:
        msg_id = uuid.uuid4().hex
        await ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": "", "session": uuid.uuid4().hex,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)


def test_a_kernel_runs_code_through_the_websocket_proxy_for_its_owner_only(
        lab: Lab, world: Any) -> None:
    from websockets.exceptions import InvalidStatus

    with browser(lab, world.member) as b:
        b.get(f"{lab.prefix}lab")
        kernel = b.post(f"{lab.prefix}api/kernels", json={"name": "python3"},
                        headers={"X-XSRFToken": b.cookies["_xsrf"]})
        assert kernel.status_code == 201, kernel.text
        kid = kernel.json()["id"]
        owner_cookie = "; ".join(f"{k}={v}" for k, v in b.cookies.items())
    ws = lab.url.replace("http://", "ws://") + f"{lab.prefix}api/kernels/{kid}/channels"
    host = lab.url.removeprefix("http://")
    printed = asyncio.run(_run_code(ws, {"Cookie": owner_cookie, "Origin": lab.url}, "print(6*7)"))
    assert printed == "42\n"

    def refused(headers: dict[str, str]) -> int:
        with pytest.raises(InvalidStatus) as caught:
            asyncio.run(_run_code(ws, headers, "print(1)"))
        return int(caught.value.response.status_code)

    # Another user's cookie; no cookie; a page of another site (cross-site WebSocket
    # hijacking: the server waives its own Origin check for token-authenticated ones).
    assert refused({"Cookie": f"sessionid={cookie_of(world.outsider)}"}) == 403
    assert refused({}) == 403
    assert refused({"Cookie": owner_cookie, "Origin": "https://evil.example"}) == 403
    assert host  # same-origin is what the browser sends: accepted above


def test_the_cookies_of_one_browser_never_go_up_with_anothers_requests(
        lab: Lab, world: Any) -> None:
    """The proxy's upstream client is shared (its connections kept alive) but keeps no
    cookie: each browser's requests carry its own cookies only."""
    with browser(lab, world.member) as first:
        first.get(f"{lab.prefix}lab")
        assert "_xsrf" in first.cookies
    with browser(lab, world.member) as second:  # a new browser: no cookie of the server
        page = second.get(f"{lab.prefix}lab")
        # The server saw no _xsrf cookie in this request, so it set one.
        assert "_xsrf=" in page.headers.get("set-cookie", ""), page.headers
        assert second.cookies["_xsrf"] != first.cookies["_xsrf"]
