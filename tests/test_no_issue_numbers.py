"""No comment, docstring, doc, template or test cites this project's issues by number
("issue 20", "issues 11 and 12", "#12"), nor a work-log label ("h-27"): a reader of the
repository cannot open them. Each cites the rule or the doc section it means instead.
Another project's issues are fine written as `project#N` (kueue#6184, gunicorn#2817)."""
from __future__ import annotations

import re
from pathlib import Path

SELF = Path(__file__).resolve()
ROOT = SELF.parent.parent
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", "vendor", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", "staticfiles"}
SUFFIXES = {".py", ".md", ".html", ".txt", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh",
            ".js", ".css", ".json", ".env"}
NAMES = {"Makefile", "Dockerfile", "run"}
ISSUE = re.compile(r"\b(?:[Ii]ssues?|PR|[Pp]ull requests?)\s+#?\d+")
# "#12" alone, but not `project#12`, a job ("job #12"), an anchor or a colour.
BARE = re.compile(r"(?<![\w/&#-])(?<!job )#\d{1,5}\b(?![\w-])")
LABEL = re.compile(r"(?<![\w-])h-\d{1,2}\b")


def _files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS for part in rel.parts) or not path.is_file() or path == SELF:
            continue
        if path.suffix in SUFFIXES or path.name in NAMES:
            out.append(path)
    return out


def _hits(pattern: re.Pattern[str], suffixes: set[str] | None = None) -> list[str]:
    hits = []
    for path in _files():
        if suffixes is not None and path.suffix not in suffixes:
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    return hits


def test_the_scan_sees_code_docs_templates_and_tests() -> None:
    seen = {str(p.relative_to(ROOT)) for p in _files()}
    for expected in ("docs/scheduling.md", "queueing/policy/admission.py",
                     "tests/test_rule_index.py", "Makefile"):
        assert expected in seen
    assert any(s.endswith(".html") for s in seen)


def test_the_patterns_catch_what_they_mean() -> None:
    for text in ("(issue 20)", "Issue 15's goals", "issues 11 and 12", "PR #7"):
        assert ISSUE.search(text), text
    assert BARE.search("fixed in #12.") and LABEL.search("(h-27)")
    for text in ("kueue#6184", "gunicorn#2817", "held for job #12", "color: #333;", "h-100"):
        assert not ISSUE.search(text) and not LABEL.search(text), text
    assert not BARE.search("held for job #12") and not BARE.search("kueue#6184")


def test_no_issue_numbers() -> None:
    hits = _hits(ISSUE)
    assert not hits, "cite the rule or doc section instead:\n" + "\n".join(hits)


def test_no_bare_issue_references_in_code_and_docs() -> None:
    hits = _hits(BARE, {".py", ".md"})
    assert not hits, "cite the rule or doc section instead:\n" + "\n".join(hits)


def test_no_work_log_labels() -> None:
    hits = _hits(LABEL, {".py", ".md", ".html"})
    assert not hits, "say what the section measured, not who or which session:\n" + "\n".join(hits)
