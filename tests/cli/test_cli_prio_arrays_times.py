"""`fairq prio` with no job, Slurm's array ranges and the one way times are written,
through the real API in-process."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from queueing.models import JobEvent
from queueing.policy.states import JobState
from tests.conftest import World
from tests.factories import JobFactory

from .conftest import Cli


def test_prio_with_no_id_lists_every_pending_job_the_user_can_see(cli: Cli,
                                                                  world: World) -> None:
    """Like `sprio` with no job: the queued jobs of the caller's teams, in queue order,
    each with its priority per factor; not another team's, not a running one."""
    mine = [JobFactory(team=world.vision, gpu_type=world.h100, tier=t, submitter=world.admin)
            for t in (world.normal, world.high)]
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal)  # not alice's team
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
               status=JobState.RUNNING)
    r = cli("prio")
    assert r.code == 0, r.err
    header, *rows = r.out.splitlines()
    assert header.split() == ["JOBID", "TEAM", "TIER", "POS", "PRIORITY", "FAIRSHARE", "AGE",
                              "SIZE"]
    assert [row.split()[:3] for row in rows] == [[str(mine[1].pk), "vision", "high"],
                                                 [str(mine[0].pk), "vision", "normal"]]
    # The same breakdown `fairq prio ID` gives (fair-share and size do not move with time).
    one = cli("prio", str(mine[0].pk)).out.splitlines()[1].split()
    listed = rows[1].split()
    assert listed[5] == one[5] and listed[7] == one[7]
    data = cli("--json", "prio").json
    assert [j["id"] for j in data] == [mine[1].pk, mine[0].pk]
    assert set(data[0]["priority"]["factors"]) == {"fair_share", "age", "size"}


def test_prio_with_no_id_and_nothing_pending_says_so(cli: Cli, world: World) -> None:
    r = cli("prio")
    assert (r.code, r.out, r.err) == (0, "", "fairq: no pending jobs\n")


# --- arrays: Slurm's index syntax ------------------------------------------------------

SUBMIT = ("submit", "-t", "vision", "-J", "sweep", "-i", "ghcr.io/acme/train:1.4", "-G",
          "h100", "-g", "1")
SPECS = ["0-99%4", "1,3,5", "0-15:4", "1-5,10,20-30:5%2", "3,1,3", "7", "7%3", "5-5",
         "0-9999", " 2-4 ", "0", "3%0", "x", "3%", "5-3", "0-9:0", "1,,2", "0-10000",
         "0-2000000", "-1", "1-", "%2"]


@pytest.mark.parametrize("text", SPECS)
def test_the_cli_and_the_api_read_array_indices_alike(text: str) -> None:
    """fairq_cli/arrays.py (the CLI imports nothing of the server's) and
    queueing/policy/arrays.py: the same indices and limit, or both refuse."""
    from fairq_cli import arrays as cli_arrays
    from queueing.policy import arrays as api_arrays
    from queueing.services.jobs import MAX_BULK_JOBS

    assert cli_arrays.MAX_ARRAY_TASKS == MAX_BULK_JOBS
    answers = []
    for module in (cli_arrays, api_arrays):
        try:
            spec = module.parse_array_spec(text, max_tasks=MAX_BULK_JOBS)
            answers.append((spec.indices, spec.max_running))
        except module.ArraySpecError as exc:
            answers.append(("refused", str(exc)))
    assert answers[0] == answers[1]


@pytest.mark.parametrize(("text", "indices", "most"), [
    ("0-15:4", [0, 4, 8, 12], None),
    ("1,3,5", [1, 3, 5], None),
    ("1-3,10,20-30:5%2", [1, 2, 3, 10, 20, 25, 30], 2),
    ("0-7%4", list(range(8)), 4),  # at most ARRAY_SUBMIT_WINDOW: all rows at submit
])
def test_submit_a_accepts_slurm_array_ranges(cli: Cli, world: World, text: str,
                                             indices: list[int], most: int | None) -> None:
    from queueing.models import Job, JobArray

    r = cli(*SUBMIT, "-a", text)
    assert r.code == 0, r.err
    array = JobArray.objects.get()
    assert (array.count, array.max_running) == (len(indices), most)
    members = list(Job.objects.order_by("array_index").values_list(
        "array_index", "name", "env"))
    assert [m[0] for m in members] == indices
    assert [m[1] for m in members] == [f"sweep-{i}" for i in indices]
    assert [m[2]["FAIRQ_ARRAY_INDEX"] for m in members] == [str(i) for i in indices]
    assert {m[2]["FAIRQ_ARRAY_SIZE"] for m in members} == {str(len(indices))}
    if indices != list(range(len(indices))):
        assert f"Submitted array job of {len(indices)} (indices {text.partition('%')[0]})" \
            in r.out


def test_the_api_takes_slurm_array_indices_and_writes_later_members_by_them(
        world: World) -> None:
    """More members than the submit writes at once: the cycle's top-up writes the rest
    with their own indices (the array keeps them as runs)."""
    from django.utils import timezone

    from queueing.models import Job, JobArray
    from queueing.services.arrays import arrays_top_up
    from tests.conftest import job_body

    api = world.client(world.admin)
    r = api.post("/api/v1/jobs/bulk/", {**job_body(), "array": "0-40:2,100"},
                 format="json")
    assert r.status_code == 201, r.content
    assert r.json()["count"] == 22
    arrays_top_up(now=timezone.now())
    array = JobArray.objects.get()
    assert (array.count, array.materialized, array.max_running) == (22, 22, None)
    assert list(Job.objects.order_by("array_index").values_list("array_index", flat=True)) \
        == [*range(0, 41, 2), 100]
    assert "indices 0-40:2,100" in array.events[0]["reason"]


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"array": "5-3"}, "array", "the range ends before it starts"),
    ({"array": "1,3", "count": 2}, "array", "not both"),
    ({"array": "1,3%2", "max_running": 3}, "max_running", "give one"),
    ({}, "count", "Give count"),
])
def test_the_api_refuses_a_bad_array_naming_the_field(world: World, body: dict[str, object],
                                                      field: str, words: str) -> None:
    from queueing.models import Job, JobArray
    from tests.conftest import job_body

    r = world.client(world.admin).post("/api/v1/jobs/bulk/", {**job_body(), **body},
                                       format="json")
    assert r.status_code == 400, r.content
    assert words in " ".join(r.json()["error"]["fields"][field])
    assert not JobArray.objects.exists() and not Job.objects.exists()


# --- times: one way, everywhere -----------------------------------------------------------

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:Z|[+-]\d\d:\d\d)"


@pytest.fixture
def kolkata() -> Iterator[None]:
    """The local zone is Asia/Kolkata (+05:30, no summer time) for the test."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Kolkata"
    time.tzset()
    yield
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


def _stamps(text: str) -> list[str]:
    """Everything in `text` that looks like a date and time, however written."""
    return re.findall(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d)?(?:\.\d+)?(?:Z|[+-]\d\d:\d\d| ?UTC)?",
                      text)


def test_times_print_as_iso_8601_in_the_users_zone_or_utc_with_a_flag(
        cli: Cli, world: World, kolkata: None, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`fairq status` (submitted, events), the watch's lines and `acct`: one format,
    ISO 8601 to the second with the zone's offset; `--utc`, FAIRQ_UTC=1 or `utc = true`
    in the config file: UTC with `Z`."""
    at = datetime(2026, 10, 1, 8, 0, 0, 123456, tzinfo=UTC)
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     created_at=at, submitter=world.admin)
    JobEvent.objects.create(job=job, at=at, kind="note", actor_label="scheduler",
                            reason="a note")
    local = cli("status", str(job.pk))
    assert local.code == 0, local.err
    assert "Submitted 2026-10-01T13:30:00+05:30" in local.out
    stamps = _stamps(local.out)
    assert len(stamps) >= 2 and set(stamps) == {"2026-10-01T13:30:00+05:30"}, stamps

    utc = cli("status", str(job.pk), "--utc").out
    assert set(_stamps(utc)) == {"2026-10-01T08:00:00Z"}, _stamps(utc)
    monkeypatch.setenv("FAIRQ_UTC", "1")
    assert set(_stamps(cli("status", str(job.pk)).out)) == {"2026-10-01T08:00:00Z"}
    monkeypatch.delenv("FAIRQ_UTC")
    (tmp_path / "fairq").mkdir()
    (tmp_path / "fairq" / "config.toml").write_text("utc = true\n")
    assert set(_stamps(cli("status", str(job.pk)).out)) == {"2026-10-01T08:00:00Z"}
    (tmp_path / "fairq" / "config.toml").unlink()

    # The watch's lines on stderr: the same format, in the same zone.
    r = cli(*SUBMIT, "--wait", "--timeout", "1")
    assert r.code == 6, r.err
    first = r.err.splitlines()[0]
    assert re.fullmatch(rf"\[{ISO}\] job \d+ QUEUED.*", first) and "+05:30] " in first, first


def test_acct_times_follow_the_zone_and_read_bare_times_in_it(
        cli: Cli, world: World, kolkata: None) -> None:
    """`acct -S 2026-10-01T13:30` (no offset) is 13:30 in the zone the times print in."""
    r = cli("acct", "-S", "2026-10-01T13:30")
    assert r.code == 0, r.err
    path = cli.transport.calls[-1][1]
    assert "from=2026-10-01T13%3A30%3A00%2B05%3A30" in path


def test_cancelling_an_array_of_slurm_indices_names_the_indices_never_queued(
        world: World) -> None:
    """The members not yet written when the array is cancelled are named by their
    indices (0-40:2: 16..40), not by their positions (8..20)."""
    from queueing.models import JobArray
    from tests.conftest import job_body

    api = world.client(world.admin)
    r = api.post("/api/v1/jobs/bulk/", {**job_body(), "array": "0-40:2"}, format="json")
    assert r.status_code == 201, r.content
    assert api.delete(f"/api/v1/arrays/{r.json()['array_id']}/").status_code == 200
    cancelled = JobArray.objects.get().events[-1]
    assert cancelled["reason"].endswith("13 tasks not yet queued as jobs cancelled "
                                        "(indices 16..40)"), cancelled
    assert cancelled["data"] == {"from_index": 16, "tasks": 13}
