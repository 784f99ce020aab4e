"""The one job state machine (docs/scheduling.md, rule S1)."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "QUEUED"
    ADMITTED = "ADMITTED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"


FINAL_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
)

# Rule S1. ADMITTED -> QUEUED is the requeue of an admitted job whose cluster workload
# vanished before it ran (attempt + 1); ADMITTED -> FAILED is a job the cluster refused
# (bad image, rejected spec); QUEUED -> FAILED is a job fairq itself could not process
# (a poison row: docs/scheduling.md, "The cycle"). Everything else is rule S1's diagram.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.ADMITTED, JobState.CANCELLED, JobState.FAILED}),
    JobState.ADMITTED: frozenset(
        {JobState.RUNNING, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED,
         JobState.QUEUED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED}
    ),
    JobState.PREEMPTED: frozenset({JobState.QUEUED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}

# States in which the job holds (or is about to hold) cluster GPUs.
HOLDING_STATES: frozenset[JobState] = frozenset({JobState.ADMITTED, JobState.RUNNING})


class IllegalTransition(Exception):
    """Raised for a transition rule S1 does not allow; nothing has been changed."""

    def __init__(self, source: JobState, target: JobState) -> None:
        super().__init__(f"a job cannot go from {source} to {target}")
        self.source = source
        self.target = target


def check_transition(source: JobState, target: JobState) -> None:
    """Raise IllegalTransition unless rule S1 allows source -> target."""
    if target not in TRANSITIONS[source]:
        raise IllegalTransition(source, target)
