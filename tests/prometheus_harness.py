"""A real Prometheus for the tests (docs/scheduling.md, "Idle GPUs"): Debian's
/usr/bin/prometheus (`make prometheus`) started in a temporary directory, scraping every
second a tiny exporter of our own that serves dcgm-exporter's metric and label names for
the pods a test says.

Missing binary: the test skips with the reason, or fails when FAIRQ_REQUIRE_PROMETHEUS=1
(CI, .ci/run)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None)
    if found is None:
        if os.environ.get("FAIRQ_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("prometheus is missing and FAIRQ_REQUIRE_PROMETHEUS=1 "
                        "(run `make prometheus`)")
        pytest.skip("prometheus is missing (Debian's prometheus: `make prometheus`); "
                    "set FAIRQ_REQUIRE_PROMETHEUS=1 to make this a failure")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Gpu:
    """One GPU of a pod as dcgm-exporter reports it. `profiling`: the DCGM profiling
    metrics are on (DCGM_FI_PROF_GR_ENGINE_ACTIVE); else only DCGM_FI_DEV_GPU_UTIL."""

    sm_percent: float
    fb_mib: float
    profiling: bool = True


@dataclass
class DcgmExporter:
    """Serves /metrics like dcgm-exporter for `pods` ((namespace, pod) -> GPUs); a test
    changes `pods` at will (under `lock`)."""

    pods: dict[tuple[str, str], list[Gpu]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    def text(self) -> str:
        lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
                 "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
                 "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.",
                 "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge",
                 "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
                 "# TYPE DCGM_FI_DEV_FB_USED gauge"]
        with self.lock:
            items = sorted(self.pods.items())
        n = 0
        for (namespace, pod), gpus in items:
            for gpu in gpus:
                labels = (f'gpu="{n}",UUID="GPU-{n:08d}",device="nvidia{n}",'
                          f'modelName="NVIDIA H100 80GB HBM3",Hostname="node-{n // 8}",'
                          f'container="main",namespace="{namespace}",pod="{pod}"')
                lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {round(gpu.sm_percent)}")
                if gpu.profiling:
                    lines.append(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} "
                                 f"{gpu.sm_percent / 100:.6f}")
                lines.append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {gpu.fb_mib:g}")
                n += 1
        return "\n".join(lines) + "\n"


@contextmanager
def dcgm_exporter() -> Iterator[DcgmExporter]:
    exporter = DcgmExporter()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = exporter.text().encode()
            self.send_response(200 if self.path.startswith("/metrics") else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    exporter.port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield exporter
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class PrometheusServer:
    url: str
    process: subprocess.Popen[bytes]

    def query(self, promql: str) -> list[dict[str, object]]:
        import http.client

        host, port = self.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        from urllib.parse import urlencode  # tests only: the backend itself does not

        conn.request("GET", "/api/v1/query?" + urlencode({"query": promql}))
        doc = json.loads(conn.getresponse().read())
        conn.close()
        assert doc["status"] == "success", doc
        return list(doc["data"]["result"])


@contextmanager
def prometheus_server(tmp: Path, *, targets: list[str]) -> Iterator[PrometheusServer]:
    """/usr/bin/prometheus on a free port, scraping `targets` every second; stopped (and
    its process waited for) on exit."""
    binary = prometheus_binary()
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "dcgm", "static_configs": [{"targets": targets}]}],
    }))
    log = (tmp / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT)
    server = PrometheusServer(f"http://127.0.0.1:{port}", process)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError("prometheus exited: " + (tmp / "prometheus.log").read_text())
            try:
                server.query("up")
                break
            except (OSError, ValueError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def wait_until(predicate: object, *, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


# The fixtures of the tests that read through a real Prometheus: an exporter of our own
# and a Prometheus scraping it (import both names into the test module).

@pytest.fixture
def exporter() -> Iterator[DcgmExporter]:
    with dcgm_exporter() as e:
        yield e


@pytest.fixture
def prometheus(tmp_path: Path, exporter: DcgmExporter) -> Iterator[PrometheusServer]:
    with prometheus_server(tmp_path, targets=[f"127.0.0.1:{exporter.port}"]) as server:
        yield server
