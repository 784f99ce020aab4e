"""`manage.py import_usage` / `export_usage` (rule F1): all or nothing, errors with line
numbers, duplicates refused, and an import-export round trip (hypothesis)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from datetime import timezone as timezone_
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queueing.models import FairShareAccumulator, UsageRecord
from queueing.policy.fairshare import decayed_interval_usage
from queueing.selectors.fairshare import fairshare_standings
from queueing.selectors.usage import usage_export_csv
from queueing.services.fairshare import fairshare_recompute
from queueing.services.usage import UsageImportError, usage_import_csv

from .conftest import World

HEADER = "team,gpu_type,gpus,start,end\n"


def test_it_imports_good_rows_into_records_and_accumulators(world: World, tmp_path: Path) -> None:
    f = tmp_path / "usage.csv"
    f.write_text(HEADER + "vision,h100,8,2026-01-01T00:00:00+00:00,2026-01-01T10:00:00+00:00\n"
                 "nlp,a100,2,2026-01-02T00:00:00Z,2026-01-02T05:00:00+02:00\n")
    out = io.StringIO()
    call_command("import_usage", str(f), stdout=out)
    assert "imported 2" in out.getvalue()
    rec = UsageRecord.objects.get(team=world.vision)
    assert (rec.gpus, rec.billing_weight, rec.source) == (8, 2.0, "import")
    assert rec.gpu_seconds == 8 * 36000
    now = timezone.now()
    want = decayed_interval_usage(rate=16, start=rec.start, end=rec.end, as_of=now,
                                  half_life_hours=168)
    assert fairshare_standings(now=now)["vision"].usage == pytest.approx(want, rel=1e-9)
    assert FairShareAccumulator.objects.count() == 2


def test_it_reports_every_bad_row_with_its_line_and_imports_nothing(
    world: World, tmp_path: Path
) -> None:
    future = (timezone.now() + timedelta(days=2)).isoformat()
    f = tmp_path / "bad.csv"
    f.write_text(
        HEADER
        + "vision,h100,8,2026-01-01T00:00:00+00:00,2026-01-01T10:00:00+00:00\n"  # 2 good
        + "nobody,h100,1,2026-01-01T00:00:00+00:00,2026-01-01T01:00:00+00:00\n"  # 3
        + "vision,tpu,1,2026-01-01T00:00:00+00:00,2026-01-01T01:00:00+00:00\n"  # 4
        + "vision,h100,0,2026-01-01T00:00:00+00:00,2026-01-01T01:00:00+00:00\n"  # 5
        + "vision,h100,two,2026-01-01T00:00:00+00:00,2026-01-01T01:00:00+00:00\n"  # 6
        + "vision,h100,1,2026-01-01T00:00:00,2026-01-01T01:00:00+00:00\n"  # 7 naive
        + "vision,h100,1,yesterday,2026-01-01T01:00:00+00:00\n"  # 8
        + "vision,h100,1,2026-01-01T02:00:00+00:00,2026-01-01T01:00:00+00:00\n"  # 9
        + f"vision,h100,1,2026-01-01T02:00:00+00:00,{future}\n"  # 10
        + "vision,h100,1\n"  # 11
    )
    with pytest.raises(CommandError) as exc:
        call_command("import_usage", str(f))
    msg = str(exc.value)
    assert "nothing imported: 9 error(s)" in msg
    for line, text in [(3, "unknown team 'nobody'"), (4, "unknown gpu_type 'tpu'"),
                       (5, "gpus must be a number above 0 (2, 0.25), not '0'"), (6, "'two'"),
                       (7, "has no UTC offset"), (8, "is not an ISO 8601 instant"),
                       (9, "end is before start"), (10, "is in the future"),
                       (11, "expected 5 columns, got 3")]:
        assert f"line {line}: " in msg and text in msg, (line, text)
    assert "line 2:" not in msg
    assert UsageRecord.objects.count() == 0 and FairShareAccumulator.objects.count() == 0


@pytest.mark.parametrize(("text", "expected"), [
    ("", "the file is empty"),
    ("team,gpus,start,end\n", "the header must name the columns"),
    (HEADER, "no rows"),
])
def test_it_refuses_files_without_a_header_or_rows(world: World, text: str,
                                                   expected: str) -> None:
    with pytest.raises(UsageImportError) as exc:
        usage_import_csv(stream=io.StringIO(text), now=timezone.now())
    assert expected in str(exc.value)


def test_it_refuses_a_missing_or_binary_file(world: World, tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="cannot read"):
        call_command("import_usage", str(tmp_path / "missing.csv"))
    bad = tmp_path / "bin.csv"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(CommandError, match="not UTF-8"):
        call_command("import_usage", str(bad))


def test_importing_the_same_file_twice_is_refused(world: World) -> None:
    text = HEADER + "vision,h100,8,2026-01-01T00:00:00+00:00,2026-01-01T10:00:00+00:00\n"
    usage_import_csv(stream=io.StringIO(text), now=timezone.now())
    with pytest.raises(UsageImportError, match="line 2: already imported"):
        usage_import_csv(stream=io.StringIO(text), now=timezone.now())
    assert UsageRecord.objects.count() == 1


T0 = datetime(2025, 6, 1, tzinfo=UTC)
rows = st.lists(
    st.tuples(
        st.sampled_from(["vision", "nlp", "speech"]),
        st.sampled_from(["h100", "a100", "mig-1g-10gb"]),
        st.integers(1, 64),
        st.integers(0, 200 * 24 * 3600),  # start offset, s
        st.integers(0, 7 * 24 * 3600),  # duration, s
        st.sampled_from([0, 2, -5, 5.5]),  # UTC offset written in the file, hours
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=rows)
def test_import_then_export_round_trips_and_matches_the_recompute(
    world: World, items: list[tuple[str, str, int, int, int, float]]
) -> None:
    UsageRecord.objects.all().delete()
    FairShareAccumulator.objects.all().delete()
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["team", "gpu_type", "gpus", "start", "end"])
    want = []
    for team, gt, gpus, off, dur, tz_h in items:
        tz = timezone_(timedelta(hours=tz_h))
        s = T0 + timedelta(seconds=off)
        e = s + timedelta(seconds=dur)
        w.writerow([team, gt, gpus, s.astimezone(tz).isoformat(), e.astimezone(tz).isoformat()])
        want.append((team, gt, gpus, s, e))
    # Identical rows in one file are separate jobs' usage: allowed (only re-imports fail).
    usage_import_csv(stream=io.StringIO(out.getvalue()), now=timezone.now())
    back = io.StringIO()
    assert usage_export_csv(out=back) == len(items)
    got = [
        (r["team"], r["gpu_type"], int(r["gpus"]), datetime.fromisoformat(r["start"]),
         datetime.fromisoformat(r["end"]))
        for r in csv.DictReader(io.StringIO(back.getvalue()))
    ]
    assert sorted(got) == sorted(want)
    # Re-importing the export into an empty database gives the same file again.
    UsageRecord.objects.all().delete()
    FairShareAccumulator.objects.all().delete()
    usage_import_csv(stream=io.StringIO(back.getvalue()), now=timezone.now())
    again = io.StringIO()
    usage_export_csv(out=again)
    assert sorted(again.getvalue().splitlines()) == sorted(back.getvalue().splitlines())
    # The accumulators built row by row equal the full recompute (rule F1).
    result = fairshare_recompute(now=timezone.now(), write=False)
    assert result.max_rel_diff < 1e-9 or result.max_abs_diff < 1e-9
