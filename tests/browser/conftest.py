"""Browser tests: Playwright (sync API) driving Debian's Chromium against pytest-django's
live server. No browser download: `/usr/bin/chromium` is installed by `make browsers`.
Without it the tests skip, unless FAIRQ_REQUIRE_BROWSER=1 (CI), where they fail.

The live server and the test share the process: the test runs scheduler cycles itself
(`cycle()`), on the same simulated cluster the server's pages read."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.handlers.wsgi import WSGIHandler

CHROMIUM = os.environ.get("FAIRQ_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parent.parent.parent / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic", "--disable-dev-shm-usage"]

# One request or one scheduler cycle at a time: on SQLite the live server's threads and
# the test share a single in-memory connection, whose transaction state is not
# thread-safe. (On PostgreSQL each thread has its own connection; the lock only costs a
# little concurrency.)
DB_LOCK = threading.RLock()


def _missing_reason() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (run `make browsers`)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


def browser_or_skip(missing: str | None = None) -> None:
    """Skip the test when Chromium or playwright is missing - or `missing` names what
    else it needs and does not have - and fail it instead under FAIRQ_REQUIRE_BROWSER=1
    (CI), so a skip never hides a gap."""
    reason = _missing_reason() or missing
    if reason is None:
        return
    if os.environ.get("FAIRQ_REQUIRE_BROWSER") == "1":
        pytest.fail(f"FAIRQ_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _missing_reason()
    if reason is None:
        return
    if os.environ.get("FAIRQ_REQUIRE_BROWSER") == "1":
        return  # the `chromium` fixture fails each test with the reason
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"browser tests skipped: {reason}"))


@pytest.fixture
def _serialize_live_server() -> Iterator[None]:
    """The browser tests' live server answers one request at a time (DB_LOCK), for the
    length of each test only: session-wide, it also serialized every later test's own
    server (tests/cli's long poll then held the cancel it waits for)."""
    original = WSGIHandler.__call__

    def locked(self: WSGIHandler, environ: Any, start_response: Any) -> Any:
        with DB_LOCK:
            return original(self, environ, start_response)

    WSGIHandler.__call__ = locked  # type: ignore[method-assign]
    yield
    WSGIHandler.__call__ = original  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One headless Chromium per test module; closed (and its event loop gone) before the
    tests of other modules run."""
    browser_or_skip()
    # Playwright's sync API runs an event loop in this thread; Django's ORM calls from the
    # test (factories, cycles) are still synchronous.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(chromium: Any, live_server: Any, _serialize_live_server: None) -> Iterator[Any]:
    context = chromium.new_context(viewport={"width": 1280, "height": 900}, base_url=live_server.url)
    context.set_default_timeout(15_000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.js_errors = errors
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@pytest.fixture
def cycle() -> Callable[..., Any]:
    """Run one scheduler cycle (at `now`, default the real time) between two requests."""
    from queueing.services.scheduler import scheduler_cycle

    def run(now: datetime | None = None) -> Any:
        with DB_LOCK:
            return scheduler_cycle(now=now)

    return run


@pytest.fixture
def shoot() -> Callable[[Any, str], Path]:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(pg: Any, name: str, full_page: bool = True) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        pg.screenshot(path=str(path), full_page=full_page)
        return path

    return take


def login(pg: Any, username: str, password: str = "pw") -> None:
    pg.goto("/accounts/login/")
    pg.get_by_label("Username").fill(username)
    pg.get_by_label("Password").fill(password)
    pg.get_by_role("button", name="Log in").click()
    pg.wait_for_url("**/")
