"""Rule P4: a queued job's estimated start, from running jobs' ends and the jobs ahead of
it (table-driven, no Django)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from queueing.policy.start_estimate import Holding, Waiting, estimate_starts

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def at(minutes: float | None) -> datetime | None:
    return None if minutes is None else NOW + timedelta(minutes=minutes)


def run(gpus: int, ends_in: float | None, gpu_type: str = "h100") -> Holding:
    return Holding(gpu_type=gpu_type, gpus=gpus, ends_at=at(ends_in))


def wait(job_id: int, gpus: int, runtime_minutes: int | None = 60,
         gpu_type: str = "h100") -> Waiting:
    return Waiting(id=job_id, gpu_type=gpu_type, gpus=gpus,
                   max_runtime_seconds=None if runtime_minutes is None else runtime_minutes * 60)


CASES = [
    # (name, free, running, queued, expected minutes from NOW per job id; None: no estimate)
    ("P4_fits_in_the_free_gpus_now", {"h100": 8}, [], [wait(1, 4)], {1: 0}),
    ("P4_waits_for_the_first_end_that_frees_enough", {"h100": 2},
     [run(4, 90), run(2, 30)], [wait(1, 4)], {1: 30}),
    ("P4_needs_several_ends", {"h100": 0},
     [run(2, 10), run(2, 20), run(4, 50)], [wait(1, 6)], {1: 50}),
    # Job 2 would fit in the 2 GPUs free now, but it does not pass job 1 (no backfill).
    ("P4_a_job_never_starts_before_the_one_ahead", {"h100": 2},
     [run(6, 30)], [wait(1, 4), wait(2, 1)], {1: 30, 2: 30}),
    ("P4_the_job_ahead_holds_what_it_took_until_its_own_end", {"h100": 2},
     [run(6, 30)], [wait(1, 8), wait(2, 1)], {1: 30, 2: 90}),
    ("P4_jobs_ahead_release_at_their_start_plus_max_runtime", {"h100": 4},
     [], [wait(1, 4, runtime_minutes=45), wait(2, 4)], {1: 0, 2: 45}),
    ("P4_a_holder_without_max_runtime_blocks_its_type", {"h100": 0},
     [run(4, None)], [wait(1, 2), wait(2, 1)], {1: None, 2: None}),
    ("P4_more_than_the_type_has_is_never", {"h100": 2},
     [run(2, 10)], [wait(1, 16), wait(2, 1)], {1: None, 2: None}),
    ("P4_gpu_types_are_independent", {"h100": 0, "a100": 2},
     [run(4, 60)], [wait(1, 4), wait(2, 2, gpu_type="a100")], {1: 60, 2: 0}),
    ("P4_an_overdue_end_counts_as_now", {"h100": 0},
     [run(4, -5)], [wait(1, 4)], {1: 0}),
    ("P4_an_unknown_type_has_no_gpus", {}, [], [wait(1, 1, gpu_type="tpu")], {1: None}),
]


@pytest.mark.parametrize(("free", "running", "queued", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_P4(free: dict[str, int], running: list[Holding], queued: list[Waiting],
                 expected: dict[int, float | None]) -> None:
    got = estimate_starts(now=NOW, free=free, running=running, queued=queued)
    assert got == {job_id: at(m) for job_id, m in expected.items()}


def test_rule_P4_is_the_same_whatever_order_the_running_jobs_come_in() -> None:
    running = [run(1, 40), run(3, 10), run(2, 25), run(2, 25)]
    queued = [wait(1, 3), wait(2, 4), wait(3, 2)]
    first = estimate_starts(now=NOW, free={"h100": 0}, running=running, queued=queued)
    assert first == estimate_starts(now=NOW, free={"h100": 0}, running=running[::-1],
                                    queued=queued)
    # Job 3 needs 2: the 1 freed at 40 is not enough; job 1's 3 come back at 10 + 60.
    assert first == {1: at(10), 2: at(25), 3: at(70)}
