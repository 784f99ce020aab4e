#!/usr/bin/env python3
"""A training loop that survives preemption: it checkpoints to its PVC, on a schedule and
when fairq stops it, tells fairq about each checkpoint, and resumes from the newest one.

Plain Python; PyTorch is used when it is installed (a small model's state_dict), so it
runs anywhere, GPUs or not:

    python examples/checkpointing/train.py --checkpoints /ckpt/my-run --steps 2000 --every 100

What it relies on from fairq (docs/kubernetes.md, "Graceful stop"):

- `FAIRQ_STOP_SIGNAL` (the job's `stop_signal`, default SIGTERM): the signal it gets when
  the job is preempted or cancelled. It finishes the step, saves, reports and exits,
  within the job's `termination_grace_seconds`.
- `FAIRQ_CHECKPOINT_URL` and `FAIRQ_CHECKPOINT_TOKEN` (set when fairq offers reporting):
  each checkpoint is POSTed there with the token, so fairq knows how much work a
  preemption would lose (rule R4) and the job page shows where it stands. The token is
  a credential for this attempt's checkpoints only; it is never printed.
- `FAIRQ_ATTEMPT`: after a preemption fairq starts the next attempt with the same
  volumes; this script finds the newest checkpoint under `--checkpoints` and goes on.

With torchrun, every rank handles the signal and only rank 0 writes and reports.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

try:  # optional: the checkpoint is a real state_dict when PyTorch is there
    import torch
except ImportError:  # pragma: no cover - depends on the image
    torch = None

CKPT = re.compile(r"^step-(\d+)\.ckpt$")
stop_requested: list[str] = []


def newest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    found = [(int(m.group(1)), p) for p in directory.glob("step-*.ckpt")
             if (m := CKPT.match(p.name))]
    return max(found) if found else None


def save(directory: Path, step: int, state: dict[str, Any]) -> Path:
    """Write atomically (a temporary file, then a rename): a kill mid-write never leaves
    a truncated newest checkpoint behind."""
    path = directory / f"step-{step}.ckpt"
    tmp = path.with_suffix(".tmp")
    if torch is not None:
        torch.save(state, tmp)
    else:
        tmp.write_text(json.dumps(state))
    os.replace(tmp, path)
    return path


def load(path: Path) -> dict[str, Any]:
    if torch is not None:
        return dict(torch.load(path))
    return dict(json.loads(path.read_text()))


def report(step: int, progress: float, path: Path) -> None:
    """POST the checkpoint to fairq (a failure is printed, never fatal: training goes on)."""
    url, token = os.environ.get("FAIRQ_CHECKPOINT_URL"), os.environ.get("FAIRQ_CHECKPOINT_TOKEN")
    if not url or not token:
        return
    body = json.dumps({"step": step, "progress": round(progress, 6), "path": str(path)})
    req = urllib.request.Request(url, data=body.encode(), method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            print(f"reported checkpoint step {step} to fairq ({r.status})", flush=True)
    except Exception as exc:  # reporting is best effort: training goes on
        print(f"could not report checkpoint step {step}: {exc}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoints", required=True, help="checkpoint directory (on the PVC)")
    p.add_argument("--data", default="", help="dataset directory (unused by this example)")
    p.add_argument("--steps", type=int, default=1000, help="steps of the whole run")
    p.add_argument("--every", type=int, default=100, help="checkpoint every N steps")
    p.add_argument("--step-seconds", type=float, default=0.1, help="time one step takes")
    a = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    attempt = os.environ.get("FAIRQ_ATTEMPT", "1")
    stop_name = os.environ.get("FAIRQ_STOP_SIGNAL", "SIGTERM")
    for name in {stop_name, "SIGTERM"}:
        signal.signal(getattr(signal, name), lambda s, f: stop_requested.append(
            signal.Signals(s).name))
    directory = Path(a.checkpoints)
    directory.mkdir(parents=True, exist_ok=True)

    state: dict[str, Any] = {"step": 0, "loss": 1.0}
    model = torch.nn.Linear(16, 1) if torch is not None else None
    newest = newest_checkpoint(directory)
    if newest is not None:
        state = load(newest[1])
        if model is not None and "model" in state:
            model.load_state_dict(state["model"])
        print(f"attempt {attempt} resuming from step {state['step']} ({newest[1]})", flush=True)
    else:
        print(f"attempt {attempt} starting from step 0", flush=True)

    def checkpoint(step: int) -> None:
        if rank != 0:
            return
        if model is not None:
            state["model"] = model.state_dict()
        path = save(directory, step, {**state, "step": step})
        print(f"saved checkpoint step {step} to {path}", flush=True)
        report(step, step / a.steps, path)

    step = int(state["step"])
    while step < a.steps:
        time.sleep(a.step_seconds)  # one step of training
        step += 1
        state["loss"] = float(state["loss"]) * 0.999
        if stop_requested:
            print(f"received {stop_requested[0]} at step {step}; saving before exit",
                  flush=True)
            checkpoint(step)
            return 0
        if step % a.every == 0:
            checkpoint(step)
    if step % a.every:
        checkpoint(step)
    print(f"done: {step} steps, loss {state['loss']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
