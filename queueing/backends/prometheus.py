"""GPU utilization from NVIDIA dcgm-exporter's metrics, read through the Prometheus HTTP
API (docs/scheduling.md, "Idle GPUs"; FAIRQ_PROMETHEUS_URL).

One instant query per call for every fairq pod, never one per job. dcgm-exporter labels
each GPU's series with the `namespace`, `pod` and `container` using it; fairq's pods are
in its team namespaces (FAIRQ_KUBE_NAMESPACE_PREFIX) and named after their Job
(`fq-<job>-<attempt>` for replica 0, `fq-<job>-<attempt>-<replica>` for the others) plus
Kubernetes' suffixes, so the pod name gives the job and the attempt (`parse_pod_name`).

SM activity is `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio, the profiling metric), or
`DCGM_FI_DEV_GPU_UTIL` (percent) for pods where the profiling metrics are off; memory is
`DCGM_FI_DEV_FB_USED` (MiB). Each is averaged over the last minute (`avg_over_time`), then
averaged (SM) or summed (memory) over the pod's GPUs.

A reporter, like the other backends: no Django, no settings; plain `http.client`.
"""

from __future__ import annotations

import http.client
import json
import re
from datetime import datetime
from typing import Any

from .base import PodReading

# fq-<job>-<attempt>, then an optional replica index (a replica Job's name) and an
# optional completion index (an Indexed Job's pods), then the pod's random suffix. The
# job and the attempt are all fairq needs: a job's replicas are one reading.
_POD_RE = re.compile(r"^fq-(\d{1,18})-(\d{1,9})(?:-\d{1,9}){0,2}-[a-z0-9]{5}\Z", re.ASCII)
_URL_RE = re.compile(r"^(?P<scheme>https?)://(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)"
                     r"(?::(?P<port>\d{1,5}))?(?P<path>/[^?#\s]*)?\Z", re.ASCII)
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
MIB = 2**20


class PrometheusError(Exception):
    """Prometheus could not be asked or did not answer a vector."""


def parse_pod_name(pod: str) -> tuple[int, int] | None:
    """'fq-12-3-x7k2p' (replica 0), 'fq-12-3-1-x7k2p' (replica 1), 'fq-12-3-0-x7k2p' (an
    Indexed Job's pod) → (12, 3); any other pod → None."""
    m = _POD_RE.match(pod)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_prometheus_url(url: str) -> tuple[str, str, int, str]:
    """'http://prometheus:9090/prom' → ('http', 'prometheus', 9090, '/prom'); ValueError
    for anything else (FAIRQ_PROMETHEUS_URL is checked with it at start-up)."""
    m = _URL_RE.match(url.strip())
    if m is None:
        raise ValueError(f"FAIRQ_PROMETHEUS_URL {url!r} is not http(s)://host[:port][/path]")
    port = int(m["port"]) if m["port"] else (443 if m["scheme"] == "https" else 80)
    if not 0 < port < 65536:
        raise ValueError(f"FAIRQ_PROMETHEUS_URL {url!r}: port out of range")
    return m["scheme"], m["host"].strip("[]"), port, (m["path"] or "").rstrip("/")


def _form(values: dict[str, str]) -> str:
    """application/x-www-form-urlencoded."""
    def enc(text: str) -> str:
        return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in text.encode())
    return "&".join(f"{enc(k)}={enc(v)}" for k, v in values.items())


def utilization_query(namespace_prefix: str) -> str:
    """The one PromQL query: per (namespace, pod) of fairq's namespaces, a `fairq` label
    "sm" (SM activity percent, mean over the pod's GPUs) or "fb" (MiB, summed)."""
    if not re.fullmatch(r"[a-z0-9-]*", namespace_prefix):
        raise ValueError(f"namespace prefix {namespace_prefix!r}")
    sel = f'{{namespace=~"{namespace_prefix}.+",pod=~"fq-.+"}}'

    def tag(expr: str, kind: str) -> str:
        return f'label_replace({expr}, "fairq", "{kind}", "", "")'

    by = "by (namespace, pod)"
    return " or ".join((
        tag(f"avg {by} (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{sel}[1m])) * 100", "sm"),
        tag(f"avg {by} (avg_over_time(DCGM_FI_DEV_GPU_UTIL{sel}[1m]))", "sm"),
        tag(f"sum {by} (avg_over_time(DCGM_FI_DEV_FB_USED{sel}[1m]))", "fb"),
    ))


def readings_from_vector(result: list[Any]) -> list[PodReading]:
    """The pods' readings from the query's `data.result`: a pod with an SM reading (its
    memory 0 when there is none); unknown pods and values that are not finite numbers in
    range are left out."""
    sm: dict[str, tuple[int, int, float]] = {}
    fb: dict[str, float] = {}
    for item in result:
        if not isinstance(item, dict):
            continue
        metric, value = item.get("metric") or {}, item.get("value")
        pod = metric.get("pod") if isinstance(metric, dict) else None
        if not isinstance(pod, str) or not isinstance(value, list) or len(value) != 2:
            continue
        ids = parse_pod_name(pod)
        try:
            number = float(value[1])
        except (TypeError, ValueError):
            continue
        if ids is None or number != number or number in (float("inf"), float("-inf")):
            continue  # another pod, or NaN / ±Inf (a GPU that reported nothing)
        if metric.get("fairq") == "sm" and pod not in sm:
            sm[pod] = (*ids, min(100.0, max(0.0, number)))
        elif metric.get("fairq") == "fb":
            fb[pod] = max(0.0, number)
    return [PodReading(job_id=job, attempt=attempt, pod=pod, sm_percent=percent,
                       fb_used_bytes=min(int(fb.get(pod, 0.0) * MIB), 2**62))
            for pod, (job, attempt, percent) in sorted(sm.items())]


class PrometheusUtilization:
    """A utilization source (base.UtilizationSource) over the Prometheus HTTP API."""

    def __init__(self, url: str, *, namespace_prefix: str, timeout_seconds: float = 5.0,
                 max_bytes: int = 64 * 2**20) -> None:
        self.scheme, self.host, self.port, self.path = parse_prometheus_url(url)
        self.query = utilization_query(namespace_prefix)
        self.timeout_seconds = timeout_seconds
        self.max_bytes = max_bytes

    def readings(self, *, now: datetime) -> list[PodReading]:
        """Ask Prometheus once; PrometheusError when it cannot. The readings are
        Prometheus's latest (its own clock): `now` only names the caller's minute."""
        body = _form({"query": self.query})
        conn_class = http.client.HTTPSConnection if self.scheme == "https" \
            else http.client.HTTPConnection
        conn = conn_class(self.host, self.port, timeout=self.timeout_seconds)
        try:
            conn.request("POST", f"{self.path}/api/v1/query", body=body, headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json"})
            response = conn.getresponse()
            raw = response.read(self.max_bytes + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise PrometheusError(f"Prometheus at {self.host}:{self.port} did not answer: "
                                  f"{type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        if len(raw) > self.max_bytes:
            raise PrometheusError("Prometheus's answer is over the size limit")
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise PrometheusError(f"Prometheus answered {response.status} with no JSON") from exc
        if response.status != 200 or not isinstance(doc, dict) or doc.get("status") != "success":
            error = doc.get("error") if isinstance(doc, dict) else None
            raise PrometheusError(f"Prometheus answered {response.status}: {error}")
        data = doc.get("data") or {}
        if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
            raise PrometheusError("Prometheus did not answer a vector")
        return readings_from_vector(data["result"])
