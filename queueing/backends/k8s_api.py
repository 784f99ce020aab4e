"""The Kubernetes client as the backend and the provisioner use it: a client built from
a kubeconfig, raw (JSON) list and delete calls, and the API server's errors read."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from .k8s_cache import Obj


class KubernetesBackendError(Exception):
    """The cluster cannot answer yet (caches not synced, API down): retry later."""


class NamespaceNotProvisioned(KubernetesBackendError):
    """FAIRQ_K8S_PROVISION=separate and the team's namespace has no RoleBinding for the
    scheduler yet: `manage.py sync_cluster` (the provisioner) has not run for the team."""


def api_error(exc: Exception) -> tuple[int, str]:
    """The HTTP status (0 without an answer) and the API server's message of `exc`."""
    status = int(getattr(exc, "status", 0) or 0)
    body = getattr(exc, "body", None) or ""
    message = str(getattr(exc, "reason", "") or exc)
    try:
        parsed = json.loads(body) if body else {}
        message = parsed.get("message") or message
    except (ValueError, AttributeError):
        pass
    return status, str(message)


def drain(resp: Any) -> None:
    """Read and release a raw response, so its connection goes back to the pool."""
    try:
        resp.read()
    finally:
        resp.release_conn()


def raw_list(func: Callable[..., Any], **kwargs: Any) -> list[Obj]:
    """The items of a list call as the API server's JSON (no model deserialization)."""
    resp = func(_preload_content=False, _request_timeout=60, **kwargs)
    try:
        return list(json.loads(resp.data).get("items") or [])
    finally:
        resp.release_conn()


def api_client_from_config(*, kubeconfig: str = "", context: str = "",
                           pool_size: int = 16) -> Any:
    """A new ApiClient (never the global default configuration): from `kubeconfig` when
    given, else the in-cluster service account when running in a pod, else
    ~/.kube/config. Its connection pool keeps `pool_size` (at least 16) connections per
    host: the client is shared by the watch threads and the cycle's concurrent creates
    (urllib3's pool is thread-safe; past its size, connections are opened and dropped)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context or None,
                                client_configuration=cfg, persist_config=False)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=cfg)
    else:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            context=context or None, client_configuration=cfg,
                                persist_config=False)
    # Four long-lived watches plus the cycle's calls share the pool.
    cfg.connection_pool_maxsize = max(getattr(cfg, "connection_pool_maxsize", 0) or 0, 16,
                                      pool_size)
    return client.ApiClient(cfg)
