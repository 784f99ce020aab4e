"""Booked GPUs in the replay (docs/simulator.md, "Quotas in a tree and bookings";
queueing/simulator/bookings.py): bookings in scenarios and on the command line, their
occurrences in every snapshot and a cycle at each start, the per-occurrence report on
a hand-made run, and the policy's rules W1-W4 on a one-node scenario and on a week of
the openb trace."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from queueing.policy.snapshot import Snapshot
from queueing.simulator.bookings import (
    LOOKAHEAD_SECONDS,
    BookingError,
    booking_spec,
    expand,
    occurrence_report,
    parse_booking,
    parse_start,
)
from queueing.simulator.cli import main
from queueing.simulator.engine import EPOCH, run_fairq
from queueing.simulator.metrics import summarize
from queueing.simulator.model import (
    Attempt,
    BookingSpec,
    JobRecord,
    RunResult,
    SimJob,
)
from queueing.simulator.scenario import ScenarioError, parse_scenario

H = 3600.0


def _doc(**over: Any) -> dict[str, Any]:
    """One node of 8 GPUs. Team b (nominal 8) submits eight 1-GPU 2 h jobs at 0
    (estimates 2 h); team a (nominal 0: only its booking guarantees it anything) books 4
    GPUs from 1 h to 2 h (not lent) and submits four 1-GPU 30 min jobs at 1 h."""
    doc: dict[str, Any] = {
        "cluster": {"node_pools": [{"name": "n", "gpu_type": "gpu", "nodes": 1,
                                    "gpus_per_node": 8}]},
        "teams": [{"name": "a"}, {"name": "b"}],
        "quotas": [{"team": "a", "gpu_type": "gpu", "nominal": 0},
                   {"team": "b", "gpu_type": "gpu", "nominal": 8}],
        "tiers": [{"name": "batch", "rank": 10}],
        "horizon_seconds": 4 * H,
        "bookings": [{"team": "a", "gpu_type": "gpu", "gpus": 4, "start_seconds": H,
                      "duration_seconds": H, "lend": False}],
        "jobs": [{"team": "b", "tier": "batch", "gpu_type": "gpu", "count": 8,
                  "runtime_seconds": 2 * H},
                 {"team": "a", "tier": "batch", "gpu_type": "gpu", "count": 4,
                  "submit_seconds": H, "runtime_seconds": 1800}],
    }
    doc.update(over)
    return doc


def test_a_scenarios_bookings_are_read_and_checked() -> None:
    w = parse_scenario(_doc())
    assert w.scenario.bookings == (BookingSpec("a", "gpu", 4, H, H, "", "UTC", False),)
    for booking, message in (
            ({"team": "c"}, r"bookings\[0\]\.team: no team 'c'"),
            ({"gpu_type": "h100"}, r"bookings\[0\]\.gpu_type: no node pool of 'h100'"),
            ({"gpus": 9}, r"bookings\[0\]\.gpus: the cluster has 8 gpu"),
            ({"recurrence": "FREQ=FORTNIGHTLY"}, r"bookings\[0\]\.recurrence: not an RRULE"),
            ({"timezone": "Mars/Olympus"}, r"bookings\[0\]\.timezone: no time zone"),
            ({"duration_seconds": 0}, r"bookings\[0\]\.duration_seconds: must be > 0")):
        doc = _doc()
        doc["bookings"] = [{**doc["bookings"][0], **booking}]
        with pytest.raises(ScenarioError, match=message):
            parse_scenario(doc)


def test_the_command_lines_booking() -> None:
    # The run's instant 0 (2023-01-01) is a Sunday: Tuesday 14:00 is 2 days 14 h later.
    assert EPOCH.weekday() == 6
    assert parse_start("Tue14:00") == 2 * 86400 + 14 * H
    assert parse_start("sun09:30") == 9.5 * H
    assert parse_start("+110h") == 110 * H and parse_start("+0") == 0
    got = parse_booking("team-3:openb:8@Tue14:00/2h/FREQ=WEEKLY;BYDAY=TU,TH",
                        ["team-3"], {"openb": 32})
    assert got == BookingSpec("team-3", "openb", 8, 2 * 86400 + 14 * H, 2 * H,
                              "FREQ=WEEKLY;BYDAY=TU,TH", "UTC", True)
    assert parse_booking("team-3:openb:8@+1h/30m/weekly/nolend", ["team-3"],
                         {"openb": 32}) == BookingSpec("team-3", "openb", 8, H, 1800,
                                                       "FREQ=WEEKLY", "UTC", False)
    for text, message in (("team-9:openb:8@+1h/2h", "no team 'team-9'"),
                          ("team-3:a100:8@+1h/2h", "no GPU type 'a100'"),
                          ("team-3:openb:33@+1h/2h", "GPUs must be 1-32"),
                          ("team-3:openb:8", "is not TEAM:TYPE:GPUS@START"),
                          ("team-3:openb:8@Tue25:00/2h", "start: 'Tue25:00'"),
                          ("team-3:openb:8@+1h/2h/FREQ=SOMETIMES", "recurrence: not an RRULE")):
        with pytest.raises(BookingError, match=message):
            parse_booking(text, ["team-3"], {"openb": 32})


def test_a_recurring_booking_expands_into_its_occurrences_in_the_window() -> None:
    tue = 2 * 86400 + 14 * H
    spec = booking_spec("t", "gpu", 8, tue, 2 * H, "FREQ=WEEKLY;BYDAY=TU,TH")
    got = expand([spec], 7 * 86400)
    assert [(b.id, b.start, b.end) for b in got] == [
        (1, EPOCH + timedelta(seconds=tue), EPOCH + timedelta(seconds=tue + 2 * H)),
        (2, EPOCH + timedelta(seconds=tue + 2 * 86400),
         EPOCH + timedelta(seconds=tue + 2 * 86400 + 2 * H))]
    # Wall-clock time in a zone: 14:00 in Paris is 13:00 UTC in winter.
    paris = booking_spec("t", "gpu", 8, tue - H, 2 * H, "FREQ=DAILY", "Europe/Paris")
    assert all(b.start.astimezone().hour == 13 for b in expand([paris], 3 * 86400))


def test_every_snapshot_carries_the_occurrences_ahead_and_a_cycle_runs_at_each_start() -> None:
    """A booking at 1 h with nothing queued then (a's jobs come at 1.5 h): a cycle still
    runs at the start (rule W2 acts then); snapshots carry it from 0 (within the
    lookahead) until it ends."""
    doc = _doc()
    doc["jobs"][1]["submit_seconds"] = 1.5 * H
    doc["jobs"][0]["count"] = 1
    seen: list[Snapshot] = []
    run_fairq(parse_scenario(doc), on_snapshot=seen.append)
    at = {(s.now - EPOCH).total_seconds(): s for s in seen}
    assert H in at  # the start: nothing queued, a cycle anyway
    assert at[0.0].bookings and at[0.0].bookings[0].team == "a"
    assert all(len(s.bookings) == 1 for t, s in at.items() if t < 2 * H)
    assert all(not s.bookings for t, s in at.items() if t >= 2 * H)
    assert LOOKAHEAD_SECONDS >= 24 * H  # longer than any trace estimate


def _rec(job_id: int, team: str, gpus: int, submit: float, *attempts: Attempt,
         tier: str = "batch") -> JobRecord:
    job = SimJob(job_id, team, tier, "gpu", gpus, 1, submit, 1000.0, 1000.0)
    return JobRecord(job, attempts, attempts[-1].end)


def test_the_occurrence_report_on_a_hand_made_run() -> None:
    """8 GPUs; a booking of 4 for a over [100, 200), lent. b's two 4-GPU jobs run from 0:
    one preempted at 100 holds its GPUs to 130 (grace), the other runs on. a's 2-GPU
    job waits from 100 to 130 and runs to 200; c's 2-GPU job runs from 150 (lent).
    [100, 130): b holds 8, 4 on booked GPUs (unclear); [130, 150): a uses 2, 2 empty;
    [150, 200): a uses 2, c borrows 2."""
    w = parse_scenario(_doc(teams=[{"name": "a"}, {"name": "b"}, {"name": "c"}],
                            quotas=None, bookings=None, jobs=None))
    recs = (
        _rec(1, "b", 4, 0, Attempt(0, 100, True, released=130)),
        _rec(2, "b", 4, 0, Attempt(0, 300, False)),
        _rec(3, "a", 2, 100, Attempt(130, 200, False)),
        _rec(4, "c", 2, 150, Attempt(150, 200, False)),
    )
    result = RunResult("fairq", recs, 0, 300, 0.0)
    booked = expand([booking_spec("a", "gpu", 4, 100, 100)], 1000)
    (row,) = occurrence_report(result, w, booked)
    gs = 1 / H  # one GPU-second in GPU-hours
    assert row["delay_seconds"] == 30 and row["cleared"]
    assert row["unclear_gpu_hours"] == pytest.approx(4 * 30 * gs)
    assert row["crossed_jobs"] == 2
    assert row["crossed_gpu_hours"] == pytest.approx((8 * 30 + 4 * 70) * gs)
    assert row["used_gpu_hours"] == pytest.approx(2 * 70 * gs)
    assert row["lent_gpu_hours"] == pytest.approx(2 * 50 * gs)
    assert row["empty_gpu_hours"] == pytest.approx(2 * 20 * gs)
    parts = ("used_gpu_hours", "lent_gpu_hours", "empty_gpu_hours", "unclear_gpu_hours")
    assert sum(float(str(row[k])) for k in parts) == pytest.approx(row["booked_gpu_hours"])
    assert row["team_owed_wait_max_seconds"] == 30
    # Not lent: c's job may not be there; beside a's 2 and b's 4 it is on booked GPUs.
    (row,) = occurrence_report(result, w, expand([booking_spec("a", "gpu", 4, 100, 100,
                                                               lend=False)], 1000))
    assert row["lent_gpu_hours"] == 0
    assert row["unclear_gpu_hours"] == pytest.approx((4 * 30 + 2 * 50) * gs)


def test_rule_w1_w2_the_booked_gpus_are_the_teams_within_a_cycle_and_grace() -> None:
    """On the policy: b's 2 h jobs would cross the booking's start, so only four of them
    start before it (rule W1; the others wait), nothing of b's is on the booked GPUs at
    the start (W2 has nothing to empty: delay 0) and a's four jobs start at once (W3),
    though a's nominal is 0 and b (within its nominal 8) could not be reclaimed from."""
    w = parse_scenario(_doc())
    result = run_fairq(w)
    b_starts = sorted(r.attempts[0].start for r in result.records if r.job.team == "b")
    assert b_starts[:4] == [0.0] * 4 and min(b_starts[4:]) > 0
    s: dict[str, Any] = summarize(result, w)
    (row,) = s["bookings"]["occurrences"]
    st = w.scenario.settings
    bound = st.cycle_seconds + st.preemption.termination_grace_seconds
    assert row["delay_seconds"] == 0 and row["unclear_gpu_hours"] == 0
    assert row["crossed_jobs"] == 4
    assert row["team_owed_wait_max_seconds"] <= bound
    assert row["used_gpu_hours"] == pytest.approx(4 * 0.5, abs=4 * bound / H)
    assert row["lent_gpu_hours"] == 0  # not lent


@pytest.mark.parametrize("lend", [True, False])
def test_rule_w4_unused_booked_gpus_are_lent_and_taken_back(lend: bool) -> None:
    """a books 4 of the 8 GPUs from 1 h to 2 h and asks for them only at 1.5 h; b's eight
    3 h jobs come at 1 h. Lent: b runs all eight, four on the booked GPUs, until a's jobs
    take them back within one cycle plus grace (about 2 GPU-hours lent). Not lent: b runs
    four, the booked GPUs stay empty until a comes."""
    doc = _doc()
    doc["bookings"][0]["lend"] = lend
    doc["jobs"][0].update(submit_seconds=H, runtime_seconds=3 * H)
    doc["jobs"][1]["submit_seconds"] = 1.5 * H
    w = parse_scenario(doc)
    result = run_fairq(w)
    s: dict[str, Any] = summarize(result, w)
    (row,) = s["bookings"]["occurrences"]
    st = w.scenario.settings
    bound = st.cycle_seconds + st.preemption.termination_grace_seconds
    assert row["team_owed_wait_max_seconds"] <= bound
    assert row["unclear_gpu_hours"] == 0
    b_at_start = sum(1 for r in result.records if r.job.team == "b"
                     and r.attempts and r.attempts[0].start == H)
    if lend:
        assert b_at_start == 8
        assert row["lent_gpu_hours"] == pytest.approx(4 * 0.5, abs=4 * bound / H)
        assert row["empty_gpu_hours"] == pytest.approx(0, abs=4 * bound / H)
    else:
        assert b_at_start == 4
        assert row["lent_gpu_hours"] == 0
        assert row["empty_gpu_hours"] == pytest.approx(4 * 0.5, abs=1e-9)
    assert row["used_gpu_hours"] == pytest.approx(4 * 0.5, abs=4 * bound / H)


def test_the_booking_report_in_the_json_and_the_text(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_doc()))
    out = tmp_path / "o.json"
    assert main(["--scenario", str(path), "--policies", "fairq", "--json", str(out),
                 "--quiet"]) == 0
    doc = json.loads(out.read_text())
    b = doc["policies"]["fairq"]["bookings"]
    assert len(b["occurrences"]) == 1 and b["booked_gpu_hours"] == 4.0
    assert main(["--scenario", str(path), "--policies", "fairq",
                 "--booking", "a:gpu:2@+3h/30m", "--json", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert [o["start_hours"] for o in doc["policies"]["fairq"]["bookings"]["occurrences"]] \
        == [1.0, 3.0]
    assert main(["--scenario", str(path), "--booking", "z:gpu:2@+3h/30m", "--quiet"]) == 2
    assert "--booking: no team 'z'" in capsys.readouterr().err
    assert main(["--scenario", str(path), "--policies", "fairq"]) == 0
    text = capsys.readouterr().out
    head = "bookings (fairq): per occurrence, GPU-hours of the booked GPUs"
    assert head in text
    row = text.split(head)[1].splitlines()[2].split()
    assert row[:4] == ["1", "a", "4", "1.0"]
    png = tmp_path / "r.png"
    assert main(["--scenario", str(path), "--policies", "fairq", "--report", str(png),
                 "--quiet"]) == 0
    assert (tmp_path / "r-tree.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


WEEK = ["--gpus", "32", "--rho", "0.95", "--policies", "fairq", "--departments", "2",
        "--booking", "team-1:openb:8@Tue14:00/2h/FREQ=WEEKLY;BYDAY=TU,TH,SA"]


def test_rule_w2_a_weekly_booking_on_a_week_of_the_openb_trace(trace_dir: Path,
                                                                 tmp_path: Path) -> None:
    """The week run of docs/simulator.md: 32 GPUs at ρ 0.95 (a 167 h horizon), two
    departments, team-1 booking 8 GPUs Tuesday, Thursday and Saturday 14:00-16:00. At
    each start the booked GPUs hold only team-1's jobs or are free within one cycle
    plus grace, nothing is on them unlent after, and the GPU-hours add up."""
    out = tmp_path / "week.json"
    assert main(["--trace", str(trace_dir), *WEEK, "--json", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    b = doc["policies"]["fairq"]["bookings"]
    assert [round(o["start_hours"]) for o in b["occurrences"]] == [62, 110, 158]
    bound = 3 + 30
    for o in b["occurrences"]:
        assert o["delay_seconds"] <= bound, o
        assert o["unclear_gpu_hours"] <= 8 * bound / H + 1e-6, o
        parts = (o["used_gpu_hours"] + o["lent_gpu_hours"] + o["empty_gpu_hours"]
                 + o["unclear_gpu_hours"])
        assert parts == pytest.approx(o["booked_gpu_hours"], abs=1e-5)
    assert b["booked_gpu_hours"] == pytest.approx(3 * 8 * 2)
    # Lent: other teams' preemptible jobs ran on what team-1 left unused (rule W4), and
    # team-1 used most of it (8.1 and 39.9 GPU-hours on 2026-12-07).
    assert b["lent_gpu_hours"] > 0 and b["used_gpu_hours"] > b["booked_gpu_hours"] / 2
