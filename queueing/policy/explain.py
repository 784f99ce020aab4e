"""Why a queued job waits (docs/scheduling.md, rule P3), pure: the queue order of rule P2
and the admission plan go in, the explanation comes out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .snapshot import QueuedJob


@dataclass(frozen=True, slots=True)
class WaitReasonLine:
    """One reason: a stable code (quota, capacity, gang_does_not_fit, jobs_ahead,
    next_cycle, ...) and a sentence for people."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class QueueExplanation:
    position: int  # 1-based, in the order of rule P2
    ahead: int  # queued jobs before it, any GPU type
    ahead_same_gpu_type: int  # of those, the ones asking for its GPU type
    queued: int  # queued jobs in all
    reasons: tuple[WaitReasonLine, ...]


def explain_queued(
    job_id: int,
    ordered: Sequence[QueuedJob],
    *,
    wait_code: str | None,
    wait_message: str | None,
    admitted_next: bool,
) -> QueueExplanation | None:
    """Rule P3: the job's place in `ordered` (the queue in rule P2 order) and why it waits.

    `wait_code`/`wait_message` are what the admission plan said of the job (None when the
    plan had nothing to say); `admitted_next` when the plan would admit it. Returns None
    for a job not in the queue.
    """
    index = next((i for i, j in enumerate(ordered) if j.id == job_id), None)
    if index is None:
        return None
    job = ordered[index]
    same = sum(1 for j in ordered[:index] if j.gpu_type == job.gpu_type)
    reasons: list[WaitReasonLine] = []
    if admitted_next:
        reasons.append(WaitReasonLine("next_cycle", "it fits now: the next scheduling cycle "
                                                    "admits it"))
    elif wait_code is not None:
        reasons.append(WaitReasonLine(wait_code, wait_message or wait_code))
    if index > 0:
        reasons.append(WaitReasonLine(
            "jobs_ahead",
            f"{index} job{'s' if index != 1 else ''} ahead of it in the queue "
            f"({same} for {job.gpu_type})",
        ))
    return QueueExplanation(position=index + 1, ahead=index, ahead_same_gpu_type=same,
                            queued=len(ordered), reasons=tuple(reasons))
