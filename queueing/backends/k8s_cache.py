"""A small informer: list, then watch, one resource kind into an in-process dict.

Each `Informer` runs one daemon thread: list (remember the resourceVersion) → watch from
it (bookmarks on; the server ends a watch after `watch_seconds`, and we resume from the
last version seen) → relist every `resync_seconds`, after a 410 Gone, and after any
error (with a capped backoff). Objects are kept as the JSON dicts the API server sends:
no model deserialization, so the store stays cheap with thousands of pods; a `transform`
keeps only what the readers use of each (k8s_manifest.slim_pod, slim_job, slim_node:
what 150,000 pods cost is mostly what nobody reads), as client-go's SetTransform does.
A list is read in pages of `page_size` items (limit/continue), so a relist of a fleet
never holds the whole answer's text at once.

Guarantees: `items()` is a consistent copy taken under a lock; `synced` is set once the
first list landed and stays set across relists; `on_change(kind, old, new)` is called
(in the informer thread, must be quick) for every add, modify and delete, including
the differences a relist finds.

`NamespacedInformers` reads one kind in a set of namespaces (fairq's team namespaces,
which grows at run time) as one: one `Informer` per namespace, so the identity that
watches needs list/watch in those namespaces only, never cluster-wide (docs/kubernetes.md,
"RBAC"). A namespace whose list is refused (403: no RoleBinding there yet) counts as
synced and empty: fairq cannot have made anything in it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
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
                 on_change: ChangeHook | None = None,
                 transform: Callable[[Obj], Obj] | None = None,
                 page_size: int = 500) -> None:
        self.name = name
        self._list = list_func
        # Applied to every object before it is stored or handed to `on_change`.
        self.transform = transform
        self.page_size = page_size
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
        self._wake = threading.Event()  # cuts a backoff short (`wake`)
        self.synced = threading.Event()
        # The last list was refused (403) or its namespace is missing (404): nothing of
        # fairq's can be there; cleared by the next list that succeeds.
        self.refused = False
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self.errors = 0
        self.relists = 0
        self.last_error = ""
        # Bumped (under the lock) with every change of the store: a reader may keep an
        # index built from `items()` for as long as the version it was built at holds.
        self.version = 0

    # --- reading ---------------------------------------------------------------------

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._store.values())

    def get(self, key: str) -> Obj | None:
        with self._lock:
            return self._store.get(key)

    def relist_counts(self) -> dict[str, int]:
        """How many lists replaced the store so far ("": the one store): a reader that
        keeps what it derived from objects starts over where this moved."""
        return {"": self.relists}

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
        self._wake.set()
        resp = self._resp
        conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def wait_synced(self, timeout: float) -> bool:
        return self.synced.wait(timeout)

    def ready(self) -> bool:
        return self.synced.is_set()

    def wake(self) -> None:
        """List again now if waiting out a backoff (a namespace just provisioned)."""
        self._wake.set()

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
                self.refused = getattr(exc, "status", None) in (403, 404)
                # A namespace not provisioned yet refuses every list until it is: not news.
                log.log(logging.INFO if self.refused else logging.WARNING,
                        "informer %s: %s; relisting in %.1fs", self.name,
                        self.last_error, backoff)
                self._wake.wait(backoff)
                self._wake.clear()
                backoff = min(30.0, backoff * 2)

    def relist(self) -> str:
        fresh, version = self._list_all()
        # An object the server sends again at the same resourceVersion is the one held
        # (the same content): kept, so what readers derived from it (the pods a workload
        # is indexed with) does not hold a second copy. Read without the lock: only this
        # thread writes the store.
        old = self._store
        for k, obj in fresh.items():
            prev = old.get(k)
            if prev is not None and _version(obj) and _version(prev) == _version(obj):
                fresh[k] = prev
        with self._lock:
            old = self._store
            self._store = fresh
            self.version += 1
            self.relists += 1
        self.refused = False
        self.synced.set()
        if self.on_change is not None:
            for k, obj in fresh.items():
                prev = old.get(k)
                if prev is None or _version(prev) != _version(obj):
                    self._notify("MODIFIED" if prev else "ADDED", prev, obj)
            for k, prev in old.items():
                if k not in fresh:
                    self._notify("DELETED", prev, None)
        return version

    def _list_all(self) -> tuple[dict[str, Obj], str]:
        """Every object (transformed) by key, and the list's resourceVersion: pages of
        `page_size` (0: one answer), one consistent snapshot; a continue token that
        expired (410) starts the list over, once."""
        fresh: dict[str, Obj] = {}
        token, restarted = "", False
        transform = self.transform
        while True:
            kwargs: dict[str, Any] = dict(self._selectors)
            if self.page_size:
                kwargs["limit"] = self.page_size
            if token:
                kwargs["_continue"] = token
            try:
                resp = self._list(_preload_content=False, _request_timeout=60, **kwargs)
            except Exception as exc:
                if token and not restarted and getattr(exc, "status", None) == 410:
                    fresh, token, restarted = {}, "", True
                    continue
                raise
            try:
                body = json.loads(resp.data)
            finally:
                resp.release_conn()
            for obj in body.get("items") or ():
                if transform is not None:
                    obj = transform(obj)
                fresh[key_of(obj)] = obj
            meta = body.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                return fresh, str(meta.get("resourceVersion") or "")

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
                if self.transform is not None:
                    obj = self.transform(obj)
                key = key_of(obj)
                with self._lock:
                    prev = self._store.get(key)
                    if kind == "DELETED":
                        self._store.pop(key, None)
                    else:
                        self._store[key] = obj
                    self.version += 1
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


class NamespacedInformers:
    """One kind in the namespaces `namespaces()` names, read as one store: an `Informer`
    per namespace (`list_namespaced(namespace, **kw)`), started when the namespace first
    appears (`refresh`, `add`); namespaces are never dropped while the process lives (a
    namespace whose team went away keeps reporting what runs there until it is gone).
    Keys are "namespace/name", as for a cluster-wide `Informer`."""

    def __init__(self, name: str, list_namespaced: Callable[..., Any],
                 namespaces: Callable[[], Iterable[str]], *,
                 label_selector: str | None = None, field_selector: str | None = None,
                 resync_seconds: float = 300.0, watch_seconds: int = 60,
                 on_change: ChangeHook | None = None,
                 transform: Callable[[Obj], Obj] | None = None) -> None:
        self.name = name
        self._list_namespaced = list_namespaced
        self._namespaces = namespaces
        self._options: dict[str, Any] = {
            "label_selector": label_selector, "field_selector": field_selector,
            "resync_seconds": resync_seconds, "watch_seconds": watch_seconds,
            "on_change": on_change, "transform": transform}
        self._lock = threading.Lock()
        self._informers: dict[str, Informer] = {}
        self._started = False

    # --- the namespaces ------------------------------------------------------------------

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted(self._informers)

    def refresh(self) -> None:
        """Watch every namespace `namespaces()` names now (a source that fails is asked
        again next time; the namespaces watched so far stay)."""
        try:
            wanted = list(self._namespaces())
        except Exception as exc:
            log.warning("informer %s: listing its namespaces failed: %s", self.name, exc)
            return
        for namespace in wanted:
            self.add(namespace)

    def add(self, namespace: str) -> Informer:
        """The namespace's informer (made, and started once this is, if new)."""
        with self._lock:
            informer = self._informers.get(namespace)
            if informer is None:
                informer = Informer(f"{self.name}:{namespace}",
                                    partial(self._list_namespaced, namespace), **self._options)
                self._informers[namespace] = informer
                if self._started:
                    informer.start()
        return informer

    def _all(self) -> list[Informer]:
        with self._lock:
            return list(self._informers.values())

    # --- reading -------------------------------------------------------------------------

    def items(self) -> list[Obj]:
        return [obj for informer in self._all() for obj in informer.items()]

    def get(self, key: str) -> Obj | None:
        with self._lock:
            informer = self._informers.get(key.split("/", 1)[0])
        return informer.get(key) if informer is not None else None

    def relist_counts(self) -> dict[str, int]:
        """Per namespace, how many lists replaced its store (see `Informer.relist_counts`)."""
        with self._lock:
            return {ns: i.relists for ns, i in self._informers.items()}

    @property
    def version(self) -> tuple[tuple[str, int], ...]:
        """Changes with any namespace's store (and with a namespace added): see
        `Informer.version`."""
        with self._lock:
            return tuple((ns, i.version) for ns, i in self._informers.items())

    @property
    def last_error(self) -> str:
        return "; ".join(f"{i.name}: {i.last_error}" for i in self._all()
                         if not i.ready() and not i.refused and i.last_error)[:500]

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> NamespacedInformers:
        with self._lock:
            self._started = True
            for informer in self._informers.values():
                informer.start()
        self.refresh()
        return self

    def ready(self) -> bool:
        """Every namespace listed once, or refused (nothing of fairq's there)."""
        return all(i.ready() or i.refused for i in self._all())

    def wait_synced(self, timeout: float) -> bool:
        self.refresh()
        deadline = time.monotonic() + timeout
        for informer in self._all():
            while not (informer.ready() or informer.refused):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                informer.synced.wait(min(0.05, left))
        return True

    def request_stop(self) -> None:
        for informer in self._all():
            informer.request_stop()

    def stop(self, timeout: float = 5.0) -> None:
        for informer in self._all():
            informer.stop(timeout)


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")
