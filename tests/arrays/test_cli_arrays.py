"""`fairq submit -a N%M`, `--dependency` (Slurm's syntax) and `fairq cancel --array ID`,
against the real API in-process."""

from __future__ import annotations

import pytest

from queueing.models import Job, JobArray
from queueing.policy.states import JobState
from queueing.services.jobs import ARRAY_SUBMIT_WINDOW
from tests.cli.conftest import Cli
from tests.conftest import World

pytestmark = pytest.mark.django_db

SUBMIT = ("submit", "-t", "vision", "-J", "sweep", "-i", "ghcr.io/acme/train:1.4", "-G", "h100", "-g", "1")


def test_submit_an_array_with_a_concurrency_limit(
    cli: Cli, world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    r = cli(*SUBMIT, "-a", "6%2")
    assert r.code == 0, r.err
    array = JobArray.objects.get()
    assert (array.count, array.max_running) == (6, 2)
    assert f"(array {array.pk}, at most 2 at once)" in r.out
    assert sorted(Job.objects.values_list("array_index", flat=True)) == list(range(6))
    for bad in ("0", "3%0", "x", "3%"):
        r = cli(*SUBMIT, "-a", bad)
        assert r.code == 2 and "argument -a/--array: " in capsys.readouterr().err  # argparse's


def test_dependency_in_slurm_syntax_on_jobs_and_arrays(cli: Cli, world: World) -> None:
    first = cli(*SUBMIT, "--json").json["id"]
    second = cli(*SUBMIT, "--json").json["id"]
    array = cli(*SUBMIT, "-a", "2", "--json").json["array_id"]
    r = cli(*SUBMIT, "--json", "--dependency", f"afterok:{first}:{second},afternotok:a{array}")
    assert r.code == 0, r.err
    assert r.json["dependencies"] == [
        {"type": "after_ok", "job": first},
        {"type": "after_ok", "job": second},
        {"type": "after_not_ok", "array": array},
    ]
    r = cli(*SUBMIT, "--dependency", "aftercorr:1")
    assert r.code == 2 and "afterok, afterany, afternotok" in r.err
    r = cli(*SUBMIT, "--dependency", "afterok:99999")
    assert r.code == 1 and "Unknown job 99999" in r.err


def test_cancel_an_array(cli: Cli, world: World) -> None:
    array = cli(*SUBMIT, "-a", "3", "--json").json["array_id"]
    r = cli("cancel", "--array", str(array))
    assert r.code == 0, r.err
    assert r.out == f"Cancelled 3 job(s) of array {array}\n"
    assert set(Job.objects.values_list("status", flat=True)) == {JobState.CANCELLED}
    assert cli("cancel").code == 2


def test_a_large_array_says_its_members_queued_later_and_cancels_them_all(
        cli: Cli, world: World) -> None:
    """The first ARRAY_SUBMIT_WINDOW members are jobs at submit, the rest later;
    a cancel counts all of them."""
    r = cli(*SUBMIT, "-a", "100%4")
    assert r.code == 0, r.err
    array = JobArray.objects.get()
    ids = sorted(Job.objects.values_list("pk", flat=True))
    later = 100 - ARRAY_SUBMIT_WINDOW
    assert len(ids) == ARRAY_SUBMIT_WINDOW
    assert r.out == (f"Submitted array job of 100: jobs {ids[0]}..{ids[-1]} and {later} more as "
                     f"they are scheduled (array {array.pk}, at most 4 at once)\n")
    r = cli("cancel", "--array", str(array.pk))
    assert r.code == 0, r.err
    assert r.out == f"Cancelled 100 job(s) of array {array.pk} ({later} not started as jobs yet)\n"
    assert Job.objects.count() == ARRAY_SUBMIT_WINDOW
