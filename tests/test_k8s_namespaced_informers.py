"""`k8s_cache.NamespacedInformers`: the worker's watches of pods, Jobs and events, one per
team namespace, read as one store (docs/kubernetes.md, "RBAC"). The API is a fake list
function here; tests/envtest/test_k8s_rbac.py runs them against a real API server."""

from __future__ import annotations

import json
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from queueing.backends.k8s_cache import NamespacedInformers, key_of


class _Resp:
    def __init__(self, body: Any = None) -> None:
        self.data = json.dumps(body).encode() if body is not None else b""

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        time.sleep(0.05)  # a watch that ends without events
        yield b""

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


def fake_api(statuses: dict[str, int]) -> Any:
    """A namespaced list: one pod per namespace, or the HTTP error `statuses` names."""

    def list_namespaced(namespace: str, **kw: Any) -> _Resp:
        if kw.get("watch"):
            return _Resp()
        if namespace in statuses:
            raise ApiException(status=statuses[namespace], reason="refused")
        return _Resp({"metadata": {"resourceVersion": "1"}, "items": [
            {"metadata": {"name": "p", "namespace": namespace, "resourceVersion": "1"}}]})

    return list_namespaced


def test_namespaces_are_read_as_one_store_and_one_that_refuses_counts_as_synced_and_empty(
) -> None:
    namespaces = ["fairq-a", "fairq-b"]
    group = NamespacedInformers("pods", fake_api({"fairq-b": 403}), lambda: namespaces,
                                resync_seconds=60, watch_seconds=1)
    try:
        group.start()
        assert group.wait_synced(5)
        assert group.ready()
        assert [key_of(o) for o in group.items()] == ["fairq-a/p"]
        assert group.get("fairq-a/p") is not None and group.get("fairq-b/p") is None
        # A team added later is watched from the next refresh (every cycle's wait).
        namespaces.append("fairq-c")
        assert group.wait_synced(5)
        assert sorted(key_of(o) for o in group.items()) == ["fairq-a/p", "fairq-c/p"]
        assert group.namespaces() == ["fairq-a", "fairq-b", "fairq-c"]
    finally:
        group.stop()


def test_a_namespace_that_fails_otherwise_keeps_the_store_unsynced_and_says_why() -> None:
    group = NamespacedInformers("pods", fake_api({"fairq-b": 500}),
                                lambda: ["fairq-a", "fairq-b"],
                                resync_seconds=60, watch_seconds=1)
    try:
        group.start()
        assert not group.wait_synced(1.5)
        assert not group.ready()
        assert "pods:fairq-b" in group.last_error and "500" in group.last_error
    finally:
        group.stop()


def test_the_version_changes_with_a_namespace_and_with_each_relist() -> None:
    """A reader's index built from `items()` holds while `version` does: a namespace
    added or a store changed (a relist here; a watch event bumps it the same way)
    gives another version."""
    namespaces = ["fairq-a"]
    group = NamespacedInformers("pods", fake_api({}), lambda: namespaces,
                                resync_seconds=60, watch_seconds=1)
    try:
        group.start()
        assert group.wait_synced(5)
        first = group.version
        assert first == group.version  # nothing changed: the same
        namespaces.append("fairq-b")
        assert group.wait_synced(5)
        second = group.version
        assert second != first
        group.add("fairq-a").relist()
        assert group.version != second
    finally:
        group.stop(timeout=2)
