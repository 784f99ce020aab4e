"""queueing/backends/prometheus.py without a Prometheus: pod names, the query, the answer's
parsing (the real Prometheus is in tests/test_prometheus_real.py)."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.backends.prometheus import (
    MIB,
    parse_pod_name,
    parse_prometheus_url,
    readings_from_vector,
    utilization_query,
)


@pytest.mark.parametrize(("pod", "ids"), [
    ("fq-12-3-x7k2p", (12, 3)),  # replica 0's Job
    ("fq-12-3-1-x7k2p", (12, 3)),  # replica 1's Job
    ("fq-12-3-0-x7k2p", (12, 3)),  # an Indexed Job's pod
    ("fq-12-3-1-0-x7k2p", (12, 3)),
    ("fq-12-3", None),  # no pod suffix
    ("fq-12-x7k2p", None),
    ("other-12-3-x7k2p", None),
    ("fq-12-3-x7k2p\n", None),
    ("fq-12-3-X7K2P", None),
])
def test_pod_names_give_the_job_and_attempt(pod: str, ids: tuple[int, int] | None) -> None:
    assert parse_pod_name(pod) == ids


def test_the_query_selects_fairqs_namespaces_and_tags_each_part() -> None:
    q = utilization_query("fairq-")
    assert q.count('namespace=~"fairq-.+",pod=~"fq-.+"') == 3
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in q and "DCGM_FI_DEV_GPU_UTIL" in q
    assert q.index("DCGM_FI_PROF_GR_ENGINE_ACTIVE") < q.index("DCGM_FI_DEV_GPU_UTIL")
    with pytest.raises(ValueError, match="prefix"):
        utilization_query('x".*')


@pytest.mark.parametrize(("url", "parts"), [
    ("http://prometheus:9090", ("http", "prometheus", 9090, "")),
    ("https://prom.example.org/prom/", ("https", "prom.example.org", 443, "/prom")),
    ("http://[::1]:9090", ("http", "::1", 9090, "")),
])
def test_prometheus_urls(url: str, parts: tuple[str, str, int, str]) -> None:
    assert parse_prometheus_url(url) == parts


@pytest.mark.parametrize("url", ["prometheus:9090", "ftp://x", "http://x:99999",
                                 "http://x/?q=1", "file:///etc/passwd"])
def test_bad_prometheus_urls(url: str) -> None:
    with pytest.raises(ValueError):
        parse_prometheus_url(url)


def sample(pod: str, kind: str, value: str) -> dict[str, Any]:
    return {"metric": {"namespace": "fairq-vision", "pod": pod, "fairq": kind},
            "value": [1700000000.0, value]}


def test_readings_from_the_answer() -> None:
    readings = readings_from_vector([
        sample("fq-1-1-abcde", "sm", "87.5"), sample("fq-1-1-abcde", "fb", "1024"),
        sample("fq-2-1-abcde", "sm", "150"),  # clamped to 100
        sample("fq-3-1-abcde", "sm", "NaN"),  # a GPU that reported nothing: left out
        sample("fq-4-1-abcde", "fb", "10"),  # memory alone: no reading
        sample("kube-proxy-abcde", "sm", "50"),  # not fairq's
        {"metric": "junk"}, "junk",
    ])
    assert [(r.job_id, r.attempt, r.sm_percent, r.fb_used_bytes) for r in readings] == [
        (1, 1, 87.5, 1024 * MIB), (2, 1, 100.0, 0)]
