#!/usr/bin/env python3
"""Submit a training job to fairq, wait for it, and print every replica's log.

What an ML pipeline step (Airflow, Argo, a CI job, a notebook) does with fairq's REST API,
with nothing but `requests` and a team API token:

    export FAIRQ_URL=http://127.0.0.1:8000 FAIRQ_TOKEN=...   # `make demo` prints both
    python examples/pipeline.py examples/torchrun-job.yaml --label trial=8

- The submit carries an Idempotency-Key: if the connection drops and the step retries the
  POST with the same key, fairq answers with the job it already made, never a second one.
- It waits with GET /jobs/{id}/ (every few seconds), printing a line when the job's state
  or the kind of its wait changes, with the reason fairq gives ("quota", "no node has 8
  free h100 GPUs", ...); a wait that only sees the queue around it move prints nothing new.
- A job preempted on the way (a higher tier needed its GPUs) shows as RUNNING, then
  QUEUED with the preemption's reason, then RUNNING again as the next attempt, which
  resumes from its newest checkpoint (examples/checkpointing/train.py).
- When the job ends, it waits (up to --log-wait) for fairq to keep each replica's final log
  tail, which stays readable after the pods are gone, and prints it for every attempt (a
  preempted attempt's log ends with what it did on its stop signal, the next one's starts
  with "attempt 2 resuming from step ..."), then the checkpoints the job reported, and
  exits 0 if the job SUCCEEDED, 1 otherwise, so the pipeline step fails with the job.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import requests
import yaml

FINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


class Fairq:
    def __init__(self, url: str, token: str) -> None:
        self.base = url.rstrip("/") + "/api/v1"
        self.http = requests.Session()
        self.http.headers.update({"Authorization": f"Token {token}",
                                  "Accept": "application/json"})

    def call(self, method: str, path: str, *, retries: int = 3, **kwargs: Any) -> Any:
        """One API call, retried on connection errors and 5xx answers (the Idempotency-Key
        in `kwargs["headers"]`, if any, makes a retried POST safe)."""
        for attempt in range(retries + 1):
            try:
                r = self.http.request(method, self.base + path, timeout=30, **kwargs)
            except requests.ConnectionError:
                if attempt == retries:
                    raise
            else:
                if r.status_code < 500 or attempt == retries:
                    break
            time.sleep(2**attempt)
        if r.status_code >= 400:
            # fairq's errors: {"error": {"message": ..., "fields": {"volumes[0].pvc": [...]}}}
            error = r.json().get("error", {})
            fields = "".join(f"\n  {name}: {' '.join(msgs)}"
                             for name, msgs in (error.get("fields") or {}).items())
            sys.exit(f"fairq refused {method} {path}: {error.get('message', r.text)}{fields}")
        return r.json()

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        key = str(uuid.uuid4())  # the same key on every retry of this one submit
        return self.call("POST", "/jobs/", json=spec, headers={"Idempotency-Key": key})

    def wait(self, job_id: int, *, interval: float) -> dict[str, Any]:
        seen = None
        while True:
            job = self.call("GET", f"/jobs/{job_id}/")
            reasons = (job.get("queue") or {}).get("reasons", [])
            # A change is a new status or a new kind of wait (the reasons' codes: quota,
            # capacity, next_cycle, ...), not the counts in their messages ("3 jobs ahead",
            # "9 in the whole queue"), which move with every poll of a busy queue.
            state = (job["status"], tuple(r["code"] for r in reasons), job.get("message") or "")
            if state != seen:
                why = "; ".join(r["message"] for r in reasons) or state[2]
                print(f"{time.strftime('%H:%M:%S')} job {job_id}: {state[0]}"
                      + (f" ({why})" if why else ""), flush=True)
                seen = state
            if job["status"] in FINAL:
                return job
            time.sleep(interval)

    def logs(self, job_id: int, replica: int, attempt: int | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"replica": replica, "tail": 200}
        if attempt is not None:
            params["attempt"] = attempt
        return self.call("GET", f"/jobs/{job_id}/logs/", params=params)

    def checkpoints(self, job_id: int) -> list[dict[str, Any]]:
        """The checkpoints the job's attempts reported (newest first)."""
        return list(self.call("GET", f"/jobs/{job_id}/checkpoints/"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("job_file", help="a YAML job file (the same shape `fairq submit -f` reads)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="add a label to the job (repeatable)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between polls")
    p.add_argument("--log-wait", type=float, default=120.0,
                   help="seconds to wait for the kept (final) logs after the job ends")
    a = p.parse_args()
    url, token = os.environ.get("FAIRQ_URL"), os.environ.get("FAIRQ_TOKEN")
    if not url or not token:
        sys.exit("set FAIRQ_URL and FAIRQ_TOKEN (an API token of the job's team)")
    spec = yaml.safe_load(Path(a.job_file).read_text())
    for item in a.label:
        key, sep, value = item.partition("=")
        if not sep:
            sys.exit(f"--label {item!r}: expected KEY=VALUE")
        spec.setdefault("labels", {})[key] = value

    fairq = Fairq(url, token)
    job = fairq.submit(spec)
    print(f"submitted job {job['id']} ({job['name']}) to team {job['team']}", flush=True)
    job = fairq.wait(job["id"], interval=a.interval)
    # Every attempt fairq kept logs of: a preempted one, then the one that resumed.
    attempts = [x["attempt"] for x in fairq.logs(job["id"], 0).get("attempts") or []]
    for attempt in attempts or [None]:
        for replica in range(job["replicas"]):
            # The worker keeps each replica's final tail shortly after the job ends
            # (`archived`); until then the answer is its last live copy.
            deadline = time.monotonic() + a.log_wait
            log = fairq.logs(job["id"], replica, attempt)
            while log["source"] != "archived" and time.monotonic() < deadline:
                time.sleep(a.interval)
                log = fairq.logs(job["id"], replica, attempt)
            print(f"--- replica {replica} of attempt {log['attempt']} ({log['source']}) ---")
            print("\n".join(log["lines"]) if log["lines"] else f"({log['note']})")
            if log["exit"]:
                print(f"--- {log['exit']} ---")
    for c in reversed(fairq.checkpoints(job["id"])):
        print(f"checkpoint of attempt {c['attempt']}: step {c['step']} at {c['created_at']}"
              + (f" ({c['path']})" if c["path"] else ""))
    return 0 if job["status"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
