"""One queued job through the stages on one GPU type: quota fit (stage 3), flavor
assignment (stage 2: its pools), node fit (stage 4), admit (stage 6) or preemption
targets (stage 5), else its wait. The heads (stage 1) are `plan_admissions`' loop."""

from __future__ import annotations

from queueing.policy.snapshot import QueuedJob

from .admit import admit, final_wait
from .flavors import assign
from .nodes import fit, fit_known_unfit
from .preempt import nominated_wait, preempt
from .quota import borrowing_blocked, quota_fit
from .state import DONE, Pass, Step, Try


def try_of(p: Pass, job: QueuedJob, index: int, gpu_type: str) -> Try:
    """A try of `job` on `gpu_type`; rule A6's CPU and memory only where the nodes of
    the type report them."""
    if gpu_type in p.cap.constrained:
        return Try(job, index, gpu_type, job.cpu_millicores or 0, job.memory_bytes or 0)
    return Try(job, index, gpu_type, 0, 0)


def attempt(p: Pass, t: Try) -> Step:
    """Rules Q1, A1-A9, K1-K4, R1-R9: the try admitted, preempting, or waiting (its wait
    in `p.raw`). Returns what the replay of waits may give again to an equal job, or
    `DONE`."""
    step = quota_fit(p, t)
    if step is None:
        step = assign(p, t)
    if step is not None:
        return step
    t.lending = borrowing_blocked(p, t)
    if not t.lending and not t.over:
        known = fit_known_unfit(p, t) if not p.nominated else False
        if known is False:
            step = fit(p, t)
            if step is not None:
                return step
        elif known is not True:
            return known
    if t.placement is not None:
        admit(p, t)
        return DONE
    step = nominated_wait(p, t)
    if step is None:
        step = preempt(p, t)
    if step is not None:
        return step
    final_wait(p, t)
    return DONE
