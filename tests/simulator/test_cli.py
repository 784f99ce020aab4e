"""fairq-sim end to end: determinism, the JSON and PNG outputs, refusals, the Django
command, and a smoke run on a slice of the real trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command

from queueing.simulator.cli import main

DEMO = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "demo.yaml"


def test_same_seed_same_json(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for out in (a, b):
        assert main(["--scenario", str(DEMO), "--quiet", "--json", str(out)]) == 0
    assert a.read_bytes() == b.read_bytes()
    doc = json.loads(a.read_text())
    assert set(doc["policies"]) == {"fairq", "fifo", "greedy", "easy"}
    fairq = doc["policies"]["fairq"]
    assert {"overall", "tiers", "teams", "sizes", "fairness", "utilization"} <= set(fairq)
    assert set(fairq["tiers"]) == {"critical", "high", "normal", "low"}
    assert "delivered_vs_greedy_pct" in doc["goals"]


def test_bad_scenarios_are_refused_with_the_field(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(DEMO.read_text())
    doc["teams"][1]["weight"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert main(["--scenario", str(bad), "--quiet"]) == 2
    assert "teams[1].weight: must be > 0" in capsys.readouterr().err
    doc = yaml.safe_load(DEMO.read_text())
    doc["jobs"][0]["tier"] = "gold"
    bad.write_text(yaml.safe_dump(doc))
    assert main(["--scenario", str(bad), "--quiet"]) == 2
    assert "jobs[0].tier: no tier 'gold'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--scenario", str(DEMO), "--policies", "lifo"])
    assert main(["--scenario", str(DEMO), "--lost-per-wait", "lots", "--quiet"]) == 2
    assert "--lost-per-wait: a number >= 0 or 'none'" in capsys.readouterr().err


def test_the_command_line_overrides_rule_r9_and_a9_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert main(["--scenario", str(DEMO), "--policies", "fairq", "--quiet", "--json", str(out),
                 "--no-reservation", "--lost-per-wait", "none"]) == 0
    source = json.loads(out.read_text())["source"]
    assert source["reservation"] is False and source["lost_per_wait"] is None


def test_the_django_command_runs_the_same_main(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    call_command("simulate", "--scenario", str(DEMO), "--quiet", "--policies", "fairq,greedy",
                 "--json", str(out))
    assert set(json.loads(out.read_text())["policies"]) == {"fairq", "greedy"}


def test_smoke_on_a_slice_of_the_openb_trace(trace_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    assert main(["--trace", str(trace_dir), "--limit", "400", "--rho", "1.5", "--json", str(out),
                 "--report", str(png)]) == 0
    doc = json.loads(out.read_text())
    assert doc["source"]["jobs"] == 400 and doc["cluster"]["gpus"] == 429
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    captured = capsys.readouterr()
    assert "fairq" in captured.out and "greedy" in captured.out
    assert "\r" in captured.err  # the progress line
    for p in doc["policies"].values():
        assert p["unfinished_jobs"] == 0
        assert p["overall"]["jobs"] == 400
