"""`Waits.words` (the published plan's read, docs/performance.md "The published plan
read per class") shares a wait's words between jobs equal in their raw entry and in the
fields the words name: a field the words name must part them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from queueing.policy.snapshot import QueuedJob
from queueing.policy.stages.waits import CODE, WaitReason, Waits

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def _job(job_id: int, runtime: int | None) -> QueuedJob:
    return QueuedJob(id=job_id, team="vision", gpu_type="h100", gpus_per_replica=1,
                     replicas=1, tier_rank=1, submitted_at=NOW - timedelta(minutes=job_id),
                     max_runtime_seconds=runtime)


def test_rule_a9_equal_reserved_waits_of_other_runtimes_are_worded_each() -> None:
    """Two jobs alike but for their runtime estimate, both reserved for an earlier job
    (rule A9): each wait names its own runtime, read per job or per class alike."""
    jobs = [_job(1, 3600), _job(2, 7200), _job(3, None), _job(4, 3600)]
    waits = Waits(jobs, NOW)
    waits.reservations["h100"] = (99, NOW + timedelta(hours=1))
    code = CODE[WaitReason.RESERVED]
    for index, job in enumerate(jobs):
        waits._raw[job.id] = (code, index, 0, 0)
    ids = [j.id for j in jobs]
    read = list(waits.words(range(len(jobs)), ids))
    expected = [(waits[i].reason, waits[i].message, waits[i].until) for i in ids]
    assert read == expected
    messages = [w[1] if w is not None else "" for w in read]
    assert "(3600)" in messages[0] and "(7200)" in messages[1]
    assert "no max_runtime_seconds" in messages[2]
    assert read[3] == read[0]
