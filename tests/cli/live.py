"""A real HTTP server for the CLI tests that need one: the watch's long poll and stream
hold a request while the test moves the world on, and a restart must drop connections.

The server is Django's threaded WSGI server in this process (so the tests' settings,
cache and simulated cluster are the server's), on a fixed port that survives `stop()` and
`start()`. `stop()` also cuts the connections in flight, as a restart does. Tests using it
run in real transactions (`django_db(transaction=True)`): the server's threads have their
own database connections."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.core.wsgi import get_wsgi_application

ROOT = Path(__file__).resolve().parents[2]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the base's name
        return None


class _Server(ThreadedWSGIServer):
    """Remembers the open client connections so `cut` can drop them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.open.discard(request)
        super().shutdown_request(request)

    def cut(self) -> None:
        with self.lock:
            for s in list(self.open):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.open.clear()


@dataclass
class LiveServer:
    port: int
    server: _Server | None = None
    thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        server = _Server(("127.0.0.1", self.port), _QuietHandler, allow_reuse_address=True)
        server.set_app(get_wsgi_application())
        self.server = server
        self.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Stop listening and drop every connection in flight (a restart)."""
        if self.server is None:
            return
        self.server.shutdown()
        self.server.cut()
        self.server.server_close()
        self.server = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def live() -> Iterator[LiveServer]:
    server = LiveServer(port=_free_port())
    server.start()
    yield server
    server.stop()


@dataclass
class CliProcess:
    """`fairq ARGS` in its own process (`python -m fairq_cli.main`), its stderr read
    line by line as it comes."""

    proc: subprocess.Popen[str]
    err_lines: list[str] = field(default_factory=list)
    out_lines: list[str] = field(default_factory=list)

    def wait_for(self, predicate: Callable[[], bool], *, timeout: float = 30.0,
                 step: Callable[[], None] | None = None, every: float = 0.1) -> None:
        """Until `predicate()`, calling `step()` (a scheduler cycle) meanwhile."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; stderr so far: {''.join(self.err_lines)}")
            if step is not None:
                step()
            time.sleep(every)

    def finish(self, *, timeout: float = 60.0, step: Callable[[], None] | None = None) -> int:
        self.wait_for(lambda: self.proc.poll() is not None, timeout=timeout, step=step,
                      every=0.2)
        self._readers_done()
        return int(self.proc.returncode)

    @property
    def err(self) -> str:
        return "".join(self.err_lines)

    @property
    def out(self) -> str:
        return "".join(self.out_lines)

    def _readers_done(self) -> None:
        for t in self._threads:
            t.join(5)

    _threads: list[threading.Thread] = field(default_factory=list)


def run_cli(*argv: str, url: str, token: str, home: Path, **env: str) -> CliProcess:
    environ = {**os.environ, "FAIRQ_URL": url, "FAIRQ_TOKEN": token,
               "XDG_CONFIG_HOME": str(home), "PYTHONUNBUFFERED": "1", **env}
    proc = subprocess.Popen([sys.executable, "-m", "fairq_cli.main", *argv], cwd=ROOT,
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    cli = CliProcess(proc)

    def pump(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    assert proc.stdout is not None and proc.stderr is not None
    cli._threads = [threading.Thread(target=pump, args=(proc.stdout, cli.out_lines), daemon=True),
                    threading.Thread(target=pump, args=(proc.stderr, cli.err_lines), daemon=True)]
    for t in cli._threads:
        t.start()
    return cli
