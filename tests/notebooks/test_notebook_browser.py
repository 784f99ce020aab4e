"""A user opens a notebook session through fairq in headless Chromium: logs in to
fairq, opens `/sessions/<id>/lab/`, JupyterLab's launcher renders, a notebook's kernel
runs `print(6*7)` through the WebSocket proxy, the notebook is saved to the session's
directory. Real JupyterLab, real ASGI server (tests/notebooks/servers.py); the session
is the stand-in of conftest.py (the envtest proof runs the whole session:
tests/envtest/test_k8s_notebook_session.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, browser_or_skip
from tests.notebooks.conftest import Lab

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def chromium_page(lab: Lab) -> Iterator[Any]:
    browser_or_skip()
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # the ORM from playwright's thread
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=CHROMIUM_ARGS)
            context = browser.new_context(viewport={"width": 1280, "height": 860},
                                          base_url=lab.url)
            context.set_default_timeout(30_000)
            yield context.new_page()
            context.close()
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def log_in(pg: Any, username: str) -> None:
    pg.goto("/accounts/login/")
    pg.get_by_label("Username").fill(username)
    pg.get_by_label("Password").fill("pw")
    pg.get_by_role("button", name="Log in").click()
    pg.wait_for_url("**/")


def run_in_notebook(pg: Any, code: str) -> Any:
    """Open a Python notebook from the launcher, run `code` in its first cell; the
    cell's output area, once it shows something."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    pg.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
    cell = pg.locator(".jp-Notebook .jp-Cell").first
    cell.locator(".cm-content").click()
    pg.keyboard.type(code)
    output = cell.locator(".jp-OutputArea-output")
    # A run asked while the kernel's connection is still being set up is dropped by
    # JupyterLab (the prompt stays "[ ]"): ask again, in place, until it ran.
    for _ in range(6):
        pg.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]',
                             timeout=60_000)
        cell.locator(".cm-content").click()
        pg.keyboard.press("Control+Enter")
        try:
            output.first.wait_for(timeout=10_000)
            return output
        except PlaywrightTimeout:
            continue
    return output


def test_a_user_opens_the_session_in_chromium_and_a_kernel_prints_42(
        lab: Lab, world: Any, chromium_page: Any) -> None:
    pg = chromium_page
    sent: list[str] = []  # every request the page made: none to the server directly
    pg.on("request", lambda r: sent.append(r.url))
    pg.on("websocket", lambda ws: sent.append(ws.url))
    cookies_seen: list[str] = []
    pg.on("response", lambda r: cookies_seen.append(r.headers.get("set-cookie", "")))

    pg.goto(f"{lab.prefix}lab")  # not logged in: fairq's login page, then back here
    assert "/accounts/login/" in pg.url
    pg.get_by_label("Username").fill(world.member.username)
    pg.get_by_label("Password").fill("pw")
    pg.get_by_role("button", name="Log in").click()
    pg.wait_for_selector(".jp-Launcher", timeout=60_000)
    assert pg.url.startswith(f"{lab.url}{lab.prefix}lab")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SCREENSHOTS / "notebook-session-launcher.png"))

    output = run_in_notebook(pg, "print(6*7)")
    try:
        output.filter(has_text="42").wait_for(timeout=60_000)
    finally:
        pg.screenshot(path=str(SCREENSHOTS / "notebook-session-42.png"))
    assert output.inner_text().strip() == "42"
    pg.keyboard.press("Control+s")  # JupyterLab 4 asks a name on a notebook's first save
    pg.get_by_role("dialog").get_by_role("textbox").fill("proof.ipynb")
    pg.get_by_role("button", name="Rename and Save").click()
    saved = lab.root / "proof.ipynb"
    deadline = time.monotonic() + 30
    while "print(6*7)" not in (saved.read_text() if saved.exists() else "") \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    pg.screenshot(path=str(SCREENSHOTS / "notebook-session-42.png"))
    cells = json.loads(saved.read_text())["cells"]
    assert "".join(cells[0]["source"]) == "print(6*7)"
    assert cells[0]["outputs"][0]["text"] == ["42\n"]

    # Everything went through fairq's origin; the server's token is nowhere the page is.
    ours = (lab.url, lab.url.replace("http://", "ws://"), "data:")
    assert sent and all(u.startswith(ours) for u in sent), \
        [u for u in sent if not u.startswith(ours)][:5]
    assert any(u.startswith(f"{lab.url.replace('http', 'ws')}{lab.prefix}api/kernels/")
               for u in sent), "the kernel's WebSocket did not go through fairq"
    html = pg.content()
    config = pg.evaluate("() => document.getElementById('jupyter-config-data').textContent")
    stored = pg.evaluate("() => JSON.stringify({...localStorage}) + document.cookie")
    browser_cookies = json.dumps(pg.context.cookies())
    for where in (html, config, stored, browser_cookies, *cookies_seen):
        assert lab.token not in where


def test_another_user_gets_403_in_the_browser(lab: Lab, world: Any, chromium_page: Any) -> None:
    pg = chromium_page
    log_in(pg, world.outsider.username)
    reply = pg.goto(f"{lab.prefix}lab")
    assert reply.status == 403
    assert pg.get_by_role("heading", name="Not your session").is_visible()
    pg.screenshot(path=str(SCREENSHOTS / "notebook-session-403.png"))
