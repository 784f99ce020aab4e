"""Every place the code takes another path on SQLite than on PostgreSQL is a row of
docs/architecture.md, "Two databases" (with why both stay): a new branch, or one removed,
fails here until the table says so."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A comparison of the connection's vendor, or the settings' test of the SQLite engine.
BRANCH = re.compile(r"\.vendor\s*[!=]=|ENGINE\"\]\s*==\s*\"django\.db\.backends\.sqlite3\"")
ROW = re.compile(r"^\| `(?P<path>[^`:]+)(?:::[^`]*)?`(?: \((?P<n>\d+)\))? \|")


def branches_in_code() -> Counter[str]:
    found: Counter[str] = Counter()
    for top in ("queueing", "accounts", "config"):
        for path in (ROOT / top).rglob("*.py"):
            n = len(BRANCH.findall(path.read_text()))
            if n:
                found[str(path.relative_to(ROOT))] += n
    return found


def branches_in_doc() -> Counter[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("\n## Two databases\n", 1)[1].split("\n## ", 1)[0]
    listed: Counter[str] = Counter()
    for line in section.splitlines():
        m = ROW.match(line)
        if m is None:
            continue
        path = m["path"]
        if not path.startswith(("accounts/", "config/", "queueing/")):
            path = f"queueing/{path}"
        listed[path] += int(m["n"] or 1)
    return listed


def test_every_database_branch_is_in_the_table_with_its_reason() -> None:
    code, doc = branches_in_code(), branches_in_doc()
    assert sum(code.values()) >= 10  # the scan found them
    assert dict(code) == dict(doc), "docs/architecture.md, 'Two databases' != the code"
