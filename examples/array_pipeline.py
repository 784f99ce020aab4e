#!/usr/bin/env python3
"""A pipeline step with a preprocessing job and an array job that waits for it.

    export FAIRQ_URL=http://127.0.0.1:8000 FAIRQ_TOKEN=...   # `make demo` prints both
    python examples/array_pipeline.py --team vision --members 6 --at-once 2

1. Submits the preprocessing job (`POST /jobs/`, with an Idempotency-Key).
2. Submits an array of N training members that depends on it (`POST /jobs/bulk/` with
   `dependencies: [{"type": "after_ok", "job": ID}]` and `max_running`, Slurm's
   `--dependency=afterok:ID --array=0-(N-1)%M`): they wait with reason `dependency`
   ("waiting for job ID (after_ok)") until it succeeds. One request lists every member
   with its queue position and reason (`GET /jobs/?array=ID`).
3. Watches the preprocessing job with the long poll (`GET /jobs/{id}/?wait=30&since_event=N`):
   one request per change, no polling interval, every transition printed.
4. Follows the array (`GET /arrays/{id}/`) until members run, at most M at once.
5. Cancels the rest of the array (`DELETE /arrays/{id}/`), as a pipeline does when it is
   stopped, and prints what was cancelled.

Only `requests` is needed. On the simulated cluster (`make demo`) each job "runs" for
`FAIRQ_SIM_SECONDS`; on Kubernetes the image runs its command.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from typing import Any

import requests

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


class Fairq:
    def __init__(self, url: str, token: str) -> None:
        url = url.rstrip("/")
        self.base = url if url.endswith("/api/v1") else url + "/api/v1"
        self.http = requests.Session()
        self.http.headers.update({"Authorization": f"Token {token}",
                                  "Accept": "application/json"})

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """One call, retried with backoff while fairq cannot be reached or answers 5xx
        (a POST carries an Idempotency-Key, so a retry never makes a second job)."""
        delay = 1.0
        while True:
            try:
                r = self.http.request(method, self.base + path, timeout=90, **kwargs)
            except requests.ConnectionError:
                r = None
            if r is not None and r.status_code < 500:
                break
            print(f"fairq unreachable, retrying in {delay:.0f}s", file=sys.stderr)
            time.sleep(delay)
            delay = min(delay * 2, 30)
        if r.status_code >= 400 and r.status_code != 304:
            error = r.json().get("error", {})
            fields = "".join(f"\n  {name}: {' '.join(msgs)}"
                             for name, msgs in (error.get("fields") or {}).items())
            sys.exit(f"fairq refused {method} {path}: {error.get('message', r.text)}{fields}")
        return r

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self.call("POST", path, json=body,
                         headers={"Idempotency-Key": str(uuid.uuid4())}).json()

    def watch(self, job_id: int, seconds: int = 30) -> dict[str, Any]:
        """Follow a job to its end with the long poll, printing each transition: the
        answer comes as soon as an event newer than `since_event` exists (304 after
        `seconds` without one)."""
        job = self.call("GET", f"/jobs/{job_id}/").json()
        since = max((e["id"] for e in job["events"]), default=0)
        print(f"job {job_id}: {job['status']}")
        while job["status"] not in FINAL:
            r = self.call("GET", f"/jobs/{job_id}/",
                          params={"wait": seconds, "since_event": since})
            if r.status_code == 304:  # nothing new within `seconds`: ask again
                continue
            job = r.json()
            for e in job["events"]:
                if e["id"] > since and e["kind"] == "transition":
                    print(f"job {job_id}: {e['from_status'] or '-'} -> {e['to_status']}"
                          f"  ({e['reason']})")
            since = max((e["id"] for e in job["events"]), default=since)
        return job


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--team", required=True)
    ap.add_argument("--gpu-type", default="h100")
    ap.add_argument("--members", type=int, default=6)
    ap.add_argument("--at-once", type=int, default=2, help="the array's max_running")
    ap.add_argument("--prep-seconds", type=int, default=20,
                    help="how long the preprocessing job runs on the simulated cluster")
    ap.add_argument("--run-seconds", type=float, default=60,
                    help="how long to follow the array before cancelling the rest")
    ap.add_argument("--watch-seconds", type=int, default=30,
                    help="the long poll's wait (1..60)")
    a = ap.parse_args()
    fq = Fairq(os.environ.get("FAIRQ_URL", "http://127.0.0.1:8000"), os.environ["FAIRQ_TOKEN"])
    common = {"team": a.team, "gpu_type": a.gpu_type, "image": "ghcr.io/acme/train:1.4",
              "tier": "normal", "max_runtime_seconds": 3600}
    prep = fq.post("/jobs/", {**common, "name": "prep", "gpus": 1,
                              "command": ["python", "prep.py"],
                              "env": {"FAIRQ_SIM_SECONDS": str(a.prep_seconds)}})
    print(f"submitted preprocessing job {prep['id']}")
    array = fq.post("/jobs/bulk/", {
        **common, "name": "train", "gpus": 1, "command": ["python", "train.py"],
        "env": {"FAIRQ_SIM_SECONDS": "600"}, "count": a.members, "max_running": a.at_once,
        "dependencies": [{"type": "after_ok", "job": prep["id"]}]})
    array_id = array["array_id"]
    print(f"submitted array {array_id}: jobs {array['ids'][0]}..{array['ids'][-1]}, "
          f"after_ok on job {prep['id']}, at most {a.at_once} at once")
    for job in fq.call("GET", "/jobs/", params={"array": array_id}).json()["results"]:
        reason = (job.get("reason") or {}).get("message", "")
        print(f"  job {job['id']} {job['status']} position {job.get('position')}: {reason}")
    if fq.watch(prep["id"], a.watch_seconds)["status"] != "SUCCEEDED":
        print("preprocessing did not succeed: the array fails with dependency_never_met")
    deadline = time.monotonic() + a.run_seconds
    while time.monotonic() < deadline:
        summary = fq.call("GET", f"/arrays/{array_id}/").json()
        counts = {k: v for k, v in summary["counts"].items() if v}
        print(f"array {array_id}: {counts} (holding GPUs: {summary['active']})")
        if summary["done"]:
            return 0
        if summary["active"] >= a.at_once:
            break
        time.sleep(3)
    cancelled = fq.call("DELETE", f"/arrays/{array_id}/").json()
    after = {k: v for k, v in cancelled["array"]["counts"].items() if v}
    print(f"cancelled {len(cancelled['cancelled'])} member(s) of array {array_id}: {after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
