"""`celery` for bench_k8s_load.py, with pod logs served as a kubelet would serve them.

The envtest fake kubelet runs no containers and serves no logs (the API server cannot
reach a kubelet for them): each pod log read through the kubernetes client answers two
lines naming the pod, after FAIRQ_BENCH_LOG_READ_SECONDS (a kubelet round trip).
Everything else is the real worker or beat of the tree on PYTHONPATH. Run as
`python bench/k8s_load_worker.py -A config worker ...` (the arguments are celery's).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def _serve_pod_logs() -> None:
    from kubernetes.client import CoreV1Api

    delay = float(os.environ.get("FAIRQ_BENCH_LOG_READ_SECONDS", "0.02"))

    def read_namespaced_pod_log(self: Any, name: str, namespace: str, **kwargs: Any) -> str:
        time.sleep(delay)
        return f"hello from {name}\nstep 1 loss 0.5"

    CoreV1Api.read_namespaced_pod_log = read_namespaced_pod_log  # type: ignore[method-assign]


if __name__ == "__main__":
    _serve_pod_logs()
    from celery.__main__ import main

    sys.argv = ["celery", *sys.argv[1:]]
    sys.exit(main())
