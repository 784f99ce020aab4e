"""Rule S1: the job state machine, without Django."""

from __future__ import annotations

import itertools

import pytest

from queueing.policy.states import TRANSITIONS, IllegalTransition, JobState, check_transition

LEGAL = {
    (JobState.QUEUED, JobState.ADMITTED), (JobState.QUEUED, JobState.CANCELLED),
    (JobState.QUEUED, JobState.FAILED),
    (JobState.ADMITTED, JobState.RUNNING), (JobState.ADMITTED, JobState.FAILED),
    (JobState.ADMITTED, JobState.CANCELLED), (JobState.ADMITTED, JobState.PREEMPTED),
    (JobState.ADMITTED, JobState.QUEUED),
    (JobState.RUNNING, JobState.SUCCEEDED), (JobState.RUNNING, JobState.FAILED),
    (JobState.RUNNING, JobState.CANCELLED), (JobState.RUNNING, JobState.PREEMPTED),
    (JobState.PREEMPTED, JobState.QUEUED), (JobState.PREEMPTED, JobState.CANCELLED),
}
ALL_PAIRS = list(itertools.product(JobState, JobState))


def test_the_table_is_exactly_the_documented_diagram() -> None:
    table = {(s, t) for s, targets in TRANSITIONS.items() for t in targets}
    assert table == LEGAL


@pytest.mark.parametrize(("source", "target"), sorted(LEGAL))
def test_it_allows_each_documented_transition(source: JobState, target: JobState) -> None:
    check_transition(source, target)


@pytest.mark.parametrize(("source", "target"), [p for p in ALL_PAIRS if p not in LEGAL])
def test_it_rejects_every_other_transition(source: JobState, target: JobState) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(source, target)


def test_policy_imports_without_django_configured() -> None:
    """queueing.policy stays pure: importing it in a fresh interpreter loads no Django."""
    import subprocess
    import sys

    code = (
        "import sys, importlib, pkgutil, queueing.policy as p\n"
        "for m in pkgutil.iter_modules(p.__path__):\n"
        "    importlib.import_module(f'queueing.policy.{m.name}')\n"
        "banned = {'django', 'celery', 'kubernetes', 'rest_framework'}\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in banned]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PATH": "/usr/bin:/bin"},
                   cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
