"""The CLI against the real API in-process: a transport that routes requests through
Django's test client instead of a socket."""

from __future__ import annotations

import io
import json as jsonlib
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from rest_framework.test import APIClient

from accounts.services import token_issue
from fairq_cli.main import main
from tests.conftest import World

BASE = "http://testserver"


class _Response:
    def __init__(self, status_code: int, content: bytes,
                 headers: dict[str, str] | None = None) -> None:
        self.status_code = status_code
        self.content = content
        self.headers = headers or {}

    def json(self) -> Any:
        return jsonlib.loads(self.content)


class DjangoTransport:
    def __init__(self) -> None:
        self.client = APIClient()
        self.calls: list[tuple[str, str]] = []
        # Called before a long poll (`wait`): in-process nothing else runs meanwhile, so
        # this is where the test moves the world on (a scheduler cycle).
        self.on_wait: Any = None

    def request(self, method: str, url: str, *, json: Any = None, params: Any = None,
                headers: dict[str, str] | None = None, timeout: float | None = None) -> _Response:
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        if params:
            path += ("&" if "?" in path else "?") + urlencode(params)
        extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()}
        self.calls.append((method, path))
        if params and "wait" in dict(params) and self.on_wait is not None:
            self.on_wait()
        r = getattr(self.client, method.lower())(path, json, format="json", **extra)
        return _Response(r.status_code, r.content, dict(r.items()))


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return jsonlib.loads(self.out)


@dataclass
class Cli:
    token: str
    transport: DjangoTransport
    sleeps: list[float]
    on_sleep: Any = None

    def __call__(self, *argv: str) -> Result:
        out, err = io.StringIO(), io.StringIO()

        def sleep(seconds: float) -> None:
            self.sleeps.append(seconds)
            if self.on_sleep is not None:
                self.on_sleep()

        self.transport.on_wait = self.on_sleep
        code = main(["--url", BASE, "--token", self.token, *argv], transport=self.transport,
                    out=out, err=err, sleep=sleep)
        return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli(world: World, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """`fairq` as alice (team admin of vision), with no config file around, in UTC
    (times print in the local zone: docs/cli.md, "Times")."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.delenv("FAIRQ_UTC", raising=False)
    time.tzset()
    monkeypatch.delenv("FAIRQ_URL", raising=False)
    monkeypatch.delenv("FAIRQ_TOKEN", raising=False)
    return Cli(token=token_issue(user=world.admin).key, transport=DjangoTransport(), sleeps=[])


from .live import live  # noqa: E402, F401  # the live server fixture, for test_cli_watch.py
