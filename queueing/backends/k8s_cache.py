"""A small informer: list, then watch, one resource kind into an in-process dict.

Each `Informer` runs one daemon thread: list (remember the resourceVersion) → watch from
it (bookmarks on; the server ends a watch after `watch_seconds`, and we resume from the
last version seen) → relist every `resync_seconds`, after a 410 Gone, and after any
error (with a capped backoff). Objects are kept as the JSON dicts the API server sends:
no model deserialization, so the store stays cheap with thousands of pods.

Guarantees: `items()` is a consistent copy taken under a lock; `synced` is set once the
first list landed and stays set across relists; `on_change(kind, old, new)` is called
(in the informer thread, must be quick) for every add, modify and delete, including
the differences a relist finds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ChangeHook = Callable[[str, Obj | None, Obj | None], None]


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): relist."""


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Informer:
    def __init__(self, name: str, list_func: Callable[..., Any], *,
                 label_selector: str | None = None, field_selector: str | None = None,
                 resync_seconds: float = 300.0, watch_seconds: int = 60,
                 on_change: ChangeHook | None = None) -> None:
        self.name = name
        self._list = list_func
        self._selectors: dict[str, str] = {}
        if label_selector:
            self._selectors["label_selector"] = label_selector
        if field_selector:
            self._selectors["field_selector"] = field_selector
        self.resync_seconds = resync_seconds
        self.watch_seconds = watch_seconds
        self.on_change = on_change
        self._lock = threading.Lock()
        self._store: dict[str, Obj] = {}
        self._stop = threading.Event()
        self.synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self.errors = 0
        self.relists = 0
        self.last_error = ""

    # --- reading ---------------------------------------------------------------------

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._store.values())

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._store.get(key)

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> Informer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"fairq-informer-{self.name}",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def request_stop(self) -> None:
        """Ask the thread to end, without waiting: the socket of the running watch is shut
        down (closing the response instead would wait for the SSL lock the blocked read
        holds, i.e. for the watch to time out)."""
        self._stop.set()
        resp = self._resp
        conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    # --- the loop --------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version = self.relist()
                backoff = 0.5
                deadline = time.monotonic() + self.resync_seconds
                while not self._stop.is_set() and time.monotonic() < deadline:
                    version = self._watch(version)
            except _Gone:
                log.info("informer %s: resourceVersion expired, relisting", self.name)
            except Exception as exc:
                if self._stop.is_set():
                    return
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                log.warning("informer %s: %s; relisting in %.1fs", self.name,
                            self.last_error, backoff)
                self._stop.wait(backoff)
                backoff = min(30.0, backoff * 2)

    def relist(self) -> str:
        resp = self._list(_preload_content=False, _request_timeout=60, **self._selectors)
        try:
            body = json.loads(resp.data)
        finally:
            resp.release_conn()
        fresh = {key_of(o): o for o in body.get("items") or ()}
        with self._lock:
            old = self._store
            self._store = fresh
        self.relists += 1
        self.synced.set()
        if self.on_change is not None:
            for k, obj in fresh.items():
                prev = old.get(k)
                if prev is None or _version(prev) != _version(obj):
                    self._notify("MODIFIED" if prev else "ADDED", prev, obj)
            for k, prev in old.items():
                if k not in fresh:
                    self._notify("DELETED", prev, None)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        # Imported here: k8s_api (and through it the settings' check of the spot node
        # matches) imports this module, and the client's watch module costs ~0.3 s.
        from kubernetes.watch.watch import iter_resp_lines

        timeout = max(1, int(self.watch_seconds * random.uniform(0.8, 1.0)))
        resp = self._list(watch=True, resource_version=version, allow_watch_bookmarks=True,
                          timeout_seconds=timeout, _preload_content=False,
                          _request_timeout=(10, timeout + 15), **self._selectors)
        self._resp = resp
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                if kind == "BOOKMARK":
                    version = _version(obj) or version
                    continue
                key = key_of(obj)
                with self._lock:
                    prev = self._store.get(key)
                    if kind == "DELETED":
                        self._store.pop(key, None)
                    else:
                        self._store[key] = obj
                version = _version(obj) or version
                self._notify(str(kind), prev, None if kind == "DELETED" else obj)
        finally:
            self._resp = None
            try:
                resp.close()
                resp.release_conn()
            except Exception:
                pass
        return version

    def _notify(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(kind, old, new)
        except Exception:
            log.exception("informer %s: change hook failed", self.name)


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
