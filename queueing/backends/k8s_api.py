"""The Kubernetes client as the backend and the provisioner use it: a client built from
a kubeconfig, raw (JSON) list and delete calls, and the API server's errors read."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from .base import SubmitRefused
from .k8s_cache import Obj


class KubernetesBackendError(Exception):
    """The cluster cannot answer yet (caches not synced, API down): retry later."""


class NamespaceNotProvisioned(KubernetesBackendError, SubmitRefused):
    """FAIRQ_K8S_PROVISION=separate and the team's namespace has no RoleBinding for the
    scheduler (403 reading its quota) or does not exist (404): the provisioner has not
    run for the team, or what it made was removed since. A refusal (`SubmitRefused`):
    an admitted job it keeps out of its namespace fails after
    FAIRQ_K8S_SUBMIT_REFUSED_SECONDS, as for any refused create."""

    def __init__(self, message: str, *, status: int = 403) -> None:
        KubernetesBackendError.__init__(self, message)
        self.status = status


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


class RawPoster:
    """POSTs pre-serialised JSON bodies through an ApiClient's own connection pool and
    credentials, without the generated client's per-call work: its argument validation
    (pydantic), the body walked into models and back (`sanitize_for_serialization`), the
    kubeconfig's auth hook and proxy look-up on every call. That work was about 1 ms of
    CPU per Job created on this machine, as much as the rest of a create, and under
    load the cycle's creates queue behind it for the GIL (docs/performance.md, "A fleet
    of 5,000 nodes: the Kubernetes path"). The answer is the same as the generated
    method's with `_preload_content=False`: the urllib3 response on 2xx, else the
    client's `ApiException` (status, reason, body) as it raises it. Held to the
    generated method by tests/test_k8s_raw_post.py."""

    # How long the Authorization header is reused (the kubeconfig's hook refreshes an
    # expiring token; it is asked again after this long).
    AUTH_SECONDS = 1.0

    def __init__(self, api_client: Any) -> None:
        self.api = api_client
        self._lock = threading.Lock()
        self._headers: tuple[float, dict[str, str]] | None = None

    def headers(self) -> dict[str, str]:
        cached = self._headers
        if cached is not None and time.monotonic() - cached[0] < self.AUTH_SECONDS:
            return cached[1]
        config = self.api.configuration
        headers = {str(k): str(v) for k, v in (self.api.default_headers or {}).items()}
        headers.update({"Accept": "application/json", "Content-Type": "application/json"})
        for auth in config.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[str(auth["key"])] = str(auth["value"])
        with self._lock:
            self._headers = (time.monotonic(), headers)
        return headers

    def post(self, path: str, body: bytes, *, timeout: tuple[float, float] = (10, 30)) -> Any:
        """POST `body` (JSON bytes) to `path` (e.g. /apis/batch/v1/namespaces/x/jobs)."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        resp = self.api.rest_client.pool_manager.request(
            "POST", f"{self.api.configuration.host}{path}", body=body,
            headers=self.headers(), preload_content=False,
            timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]))
        if 200 <= resp.status <= 299:
            return resp
        try:
            text = resp.read().decode("utf-8", "replace")
        finally:
            resp.release_conn()
        exc = ApiException(status=resp.status, reason=resp.reason, body=text)
        exc.headers = resp.headers
        raise exc


def jobs_path(namespace: str) -> str:
    return f"/apis/batch/v1/namespaces/{quote(namespace, safe='')}/jobs"


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


# --- nodes: spot capacity and its reclamation (rules K4, K6) -----------------------------

# The labels that make a node spot capacity, as the clouds set them: GKE Spot VMs and
# preemptible VMs, Karpenter's capacity type, EKS managed node groups, AKS spot pools
# (docs/kubernetes.md, "Spot nodes"); and fairq's own for anything else.
SPOT_NODE_LABELS: tuple[str, ...] = (
    "cloud.google.com/gke-spot=true",
    "cloud.google.com/gke-preemptible=true",
    "karpenter.sh/capacity-type=spot",
    "eks.amazonaws.com/capacityType=SPOT",
    "kubernetes.azure.com/scalesetpriority=spot",
    "fairq.io/spot=true",
)
# A taint or label one of these keys (or key=value) names on a spot node says it is being
# reclaimed: GKE's graceful node shutdown taint, aws-node-termination-handler's spot
# interruption taint (`SpotInterruptionTaint`), Karpenter's disruption taint (v1:
# `karpenter.sh/disrupted`; v0.32-v0.37: `karpenter.sh/disruption=disrupting`), fairq's.
SPOT_TERMINATION_TAINTS: tuple[str, ...] = (
    "cloud.google.com/impending-node-termination",
    "aws-node-termination-handler/spot-itn",
    "karpenter.sh/disrupted",
    "karpenter.sh/disruption",
    "fairq.io/reclaim",
)

# Taints that mark spot capacity itself (not its reclamation): a spot node carrying only
# these (and the GPU taint) is usable, and the pods of an attempt placed on spot tolerate
# them (rule K4): AKS's taint on every node of a spot pool
# (`kubernetes.azure.com/scalesetpriority=spot:NoSchedule`).
SPOT_TOLERATIONS: tuple[str, ...] = (
    "kubernetes.azure.com/scalesetpriority=spot",
)

# A label key: an optional DNS subdomain prefix and "/", then a name of 1-63 characters.
_KEY_RE = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z", re.ASCII)
_VALUE_RE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z", re.ASCII)

NodeMatch = tuple[str, str | None]  # (key, value); None: any value


def parse_node_matches(items: Sequence[str], *, what: str) -> tuple[NodeMatch, ...]:
    """`["karpenter.sh/capacity-type=spot", "fairq.io/reclaim"]` → ((key, value), (key,
    None)): each item a label or taint key, with `=value` to ask for that value. Raises
    ValueError naming `what` (the setting) and the bad item."""
    out: list[NodeMatch] = []
    for raw in items:
        item = raw.strip()
        key, eq, value = item.partition("=")
        if not _KEY_RE.match(key) or len(key.partition("/")[0]) > 253 or (
                eq and not _VALUE_RE.match(value)):
            raise ValueError(f"{what}: {raw!r} is not a label or taint key with an optional "
                             "=value (e.g. karpenter.sh/capacity-type=spot)")
        out.append((key, value if eq else None))
    return tuple(out)


def _matches(pairs: Iterable[tuple[str, str]], wanted: Sequence[NodeMatch]) -> str | None:
    for key, value in pairs:
        for want_key, want_value in wanted:
            if key == want_key and (want_value is None or value == want_value):
                return key
    return None


def spot_tolerations_problem(tolerations: Sequence[NodeMatch],
                             termination: Sequence[NodeMatch]) -> str | None:
    """Why these spot tolerations cannot go with these termination marks (a key in both:
    the pods would tolerate the taint that says their node is being reclaimed), or None."""
    clash = sorted({k for k, _ in tolerations} & {k for k, _ in termination})
    if clash:
        return (f"FAIRQ_SPOT_TOLERATIONS: {', '.join(clash)} is also a termination taint "
                "(FAIRQ_SPOT_TERMINATION_TAINTS); a spot taint marks capacity, not its "
                "reclamation")
    return None


def taint_tolerated(taint: Mapping[str, Any], tolerated: Sequence[NodeMatch]) -> bool:
    """The taint's key (and value, where the match names one) is one of `tolerated`."""
    return _matches(((str(taint.get("key", "")), str(taint.get("value") or "")),),
                    tolerated) is not None


def node_is_spot(node: Mapping[str, Any], spot_labels: Sequence[NodeMatch]) -> bool:
    """Rule K4: the node carries one of the spot labels."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return _matches(((str(k), str(v)) for k, v in labels.items()), spot_labels) is not None


def node_termination_mark(node: Mapping[str, Any],
                          termination: Sequence[NodeMatch]) -> str | None:
    """Rule K6: how the node says it is being reclaimed — 'tainted <key>' or 'labelled
    <key>' for the first termination taint (any effect) or label it carries — else None."""
    taints = (node.get("spec") or {}).get("taints") or ()
    key = _matches(((str(t.get("key", "")), str(t.get("value") or "")) for t in taints),
                   termination)
    if key is not None:
        return f"tainted {key}"
    labels = (node.get("metadata") or {}).get("labels") or {}
    key = _matches(((str(k), str(v)) for k, v in labels.items()), termination)
    return f"labelled {key}" if key is not None else None
