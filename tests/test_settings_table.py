"""docs/deployment.md, "Settings": one row per FAIRQ_* setting, with the code's default.

The settings are what config/settings/*.py assign or read from the environment (found in
their source, so a setting a module adds without a row fails here); the defaults are
those of a start-up with no FAIRQ_* in the environment (a subprocess, so this run's own
environment does not count)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_DIR = ROOT / "config" / "settings"
DOC = ROOT / "docs" / "deployment.md"
NAME = re.compile(r"FAIRQ_[A-Z0-9_]*[A-Z0-9]")


def settings_in_code() -> set[str]:
    """Every FAIRQ_* a settings module assigns, or names in a string (env("FAIRQ_X"))."""
    names: set[str] = set()
    for path in SETTINGS_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets
                          if isinstance(t, ast.Name) and NAME.fullmatch(t.id)}
            elif isinstance(node, ast.Call) and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str) \
                        and NAME.fullmatch(first.value):
                    names.add(first.value)
    return names


def table_rows() -> dict[str, str]:
    """{setting: its Default cell} of the table under "## Settings"."""
    text = DOC.read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `FAIRQ_") and len(cells) >= 4:
            name = cells[0].strip("`")
            assert name not in rows, f"{name} has two rows"
            rows[name] = cells[1]
    return rows


def defaults() -> dict[str, object]:
    """The settings' values at a start-up with none of them in the environment."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FAIRQ_", "DJANGO_", "OIDC_"))
           and k not in {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "EMAIL_URL"}}
    code = (
        "import json, config.settings.base as b, config.settings.demo as d\n"
        "v = {k: getattr(b, k) for k in dir(b) if k.startswith('FAIRQ_')}\n"
        "v.update({k: getattr(d, k) for k in dir(d) if k.startswith('FAIRQ_') and k not in v})\n"
        "print(json.dumps(v, default=str))\n")
    out = subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": str(ROOT)},
                         cwd=ROOT, capture_output=True, text=True, check=True)
    values: dict[str, object] = json.loads(out.stdout)
    return values


def shown(value: object) -> str | None:
    """A value as the table writes it (None: not comparable, e.g. a dict)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list):
        return ",".join(shown(v) or "" for v in value) or '""'
    if isinstance(value, str):
        return value.removeprefix(str(ROOT) + "/") if value else '""'
    return None


def test_every_setting_has_a_row_and_every_row_a_setting() -> None:
    code, rows = settings_in_code(), table_rows()
    assert len(code) > 80  # the scan found the modules
    assert sorted(code - set(rows)) == [], "settings with no row in docs/deployment.md"
    assert sorted(set(rows) - code) == [], "rows in docs/deployment.md naming no setting"


def test_the_table_shows_the_code_defaults() -> None:
    values, rows = defaults(), table_rows()
    wrong = {}
    for name, cell in rows.items():
        literal = re.match(r"`([^`]*)`", cell)
        if literal is None:  # "derived": computed from other settings, not read
            assert cell == "derived", f"{name}: the default cell is `value` or derived"
            continue
        want = shown(values[name])
        got = literal.group(1)
        if want is None or got.endswith("…"):  # a dict; a long list cut short
            assert want is None or want.startswith(got.rstrip("…")), name
            continue
        if got != want:
            wrong[name] = (got, want)
    assert wrong == {}, "table default != code default: {name: (table, code)}"
