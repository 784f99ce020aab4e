"""A real HTTP receiver for the webhook tests: http.server in a thread on 127.0.0.1 (a
random port) that verifies each POST with `standardwebhooks.Webhook(secret).verify` and
answers the status codes it is told, in turn. `behaviour="hang"` reads the POST and never
answers; `behaviour="drip"` answers a 200 one byte every `drip_seconds`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    verified: Any  # the parsed payload, or None when the signature did not verify
    error: str = ""
    answered: int = 0


@dataclass
class Receiver:
    secret: str = ""
    answers: list[int] = field(default_factory=list)  # status codes, in turn; then 200
    received: list[Received] = field(default_factory=list)
    url: str = ""
    behaviour: str = "answer"  # "answer", "hang" or "drip"
    drip_seconds: float = 1.0
    stop: threading.Event = field(default_factory=threading.Event)
    # When each POST arrived and when its handler gave up or finished (time.monotonic()).
    started: list[float] = field(default_factory=list)
    ended: list[float] = field(default_factory=list)

    server: Any = None

    def tls(self, context: Any) -> None:
        """Serve HTTPS from now on, with `context` (an ssl.SSLContext for the server)."""
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)

    def answer(self) -> int:
        return self.answers.pop(0) if self.answers else 200


@contextmanager
def receiver(secret: str = "", answers: list[int] | None = None, behaviour: str = "answer",
             drip_seconds: float = 1.0) -> Iterator[Receiver]:
    state = Receiver(secret=secret, answers=list(answers or []), behaviour=behaviour,
                     drip_seconds=drip_seconds)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            state.started.append(time.monotonic())
            try:
                self._post()
            finally:
                state.ended.append(time.monotonic())

        def _post(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            if state.behaviour == "hang":
                state.received.append(Received(path=self.path, headers=headers,
                                               body=body, verified=None))
                state.stop.wait(120)
                return
            if state.behaviour == "drip":
                state.received.append(Received(path=self.path, headers=headers,
                                               body=body, verified=None))
                out = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                for byte in out:
                    if state.stop.wait(state.drip_seconds):
                        return
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:
                        return  # the sender hung up
                return
            got = Received(path=self.path, headers=headers, body=body, verified=None)
            try:
                got.verified = Webhook(state.secret).verify(body, headers)
            except (WebhookVerificationError, ValueError) as exc:
                got.error = str(exc) or type(exc).__name__
            code = state.answer() if got.verified is not None else 401
            got.answered = code
            state.received.append(got)
            out = json.dumps({"ok": code < 300}).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.server = server
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(5)
