"""The rule index at the top of docs/scheduling.md holds: every rule the code, the tests
and the docs cite is in it once, every rule stated in the document is in it, and every
module, function and test file a row names exists. No database: files only."""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCHEDULING = ROOT / "docs" / "scheduling.md"
RULE = r"[A-Z][0-9]+(?:\.[0-9]+)?"
# "rule F3", "rules K1-K4, K7 and R9.1": the first id and every one chained after it.
CITE = re.compile(rf"\b[Rr]ules? ({RULE}(?:(?:, |,| and | or |-|–){RULE})*)")
TEST_NAME = re.compile(r"def (test_rule_([a-zA-Z][0-9]+)((?:_[0-9]+)?))")
ROW = re.compile(r"^\| \[([^\]]+)\]\(#[a-z0-9-]+\) \| (.+?) \| (.+?) \| (.+?) \|$")
STATED = re.compile(rf"^(?:\*\*|\| \*\*)({RULE}) *(?:—|\*\*)", re.M)
SOURCES = ("queueing", "accounts", "config", "fairq_cli", "bench", "tests", "docs")


def _index() -> dict[str, tuple[str, str, str]]:
    rows: dict[str, tuple[str, str, str]] = {}
    text = SCHEDULING.read_text()
    section = text.split("## Rule index", 1)[1].split("\n## ", 1)[0]
    for line in section.splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"rule {m.group(1)} has two rows in the index"
            rows[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    return rows


INDEX = _index()


def _refs(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _files() -> list[Path]:
    out: list[Path] = []
    for top in SOURCES:
        for path in (ROOT / top).rglob("*"):
            if path.suffix in {".py", ".md", ".html"} and ".venv" not in path.parts:
                out.append(path)
    return out


@cache
def _cited() -> dict[str, set[str]]:
    """Rule id -> the files that cite it as `rule F3` or name a test after it."""
    found: dict[str, set[str]] = {}
    for path in _files():
        text = path.read_text(errors="replace")
        rel = str(path.relative_to(ROOT))
        for m in CITE.finditer(text):
            for rule in _ids(m.group(1)):
                found.setdefault(rule, set()).add(rel)
        for m in TEST_NAME.finditer(text):
            rule = m.group(2).upper()
            amended = rule + m.group(3).replace("_", ".")
            found.setdefault(amended if amended in INDEX else rule, set()).add(rel)
    return found


def _ids(chain: str) -> list[str]:
    """The ids of a citation, ranges expanded: "K1-K4, K7" -> K1, K2, K3, K4, K7."""
    ids: list[str] = []
    for part in re.split(r", |,| and | or ", chain):
        ends = re.split(r"-|–", part)
        first, last = ends[0], ends[-1]
        if len(ends) == 2 and first[0] == last[0] and "." not in first + last:
            ids += [f"{first[0]}{n}" for n in range(int(first[1:]), int(last[1:]) + 1)]
        else:
            ids += ends
    return ids


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _defines(path: Path, dotted: str) -> bool:
    """Whether `path` defines `dotted` (a function or class, `Class.method`, or a
    function nested in another: `plan_admissions.k2_order`)."""
    scope: list[ast.stmt] = list(_tree(path).body)
    for name in dotted.split("."):
        match = next((node for node in scope
                      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                      and node.name == name), None)
        if match is None:
            return False
        scope = [n for n in ast.walk(match) if n is not match
                 and isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    return True


def test_the_index_has_every_rule_the_document_states_and_no_other() -> None:
    stated = STATED.findall(SCHEDULING.read_text())
    assert len(stated) > 60
    assert set(stated) == set(INDEX), (set(stated) ^ set(INDEX))


def test_the_index_says_how_many_rules_and_families_it_has() -> None:
    rules = [r for r in INDEX if "." not in r]
    families = {re.match(r"[A-Z]", r).group(0) for r in rules}  # type: ignore[union-attr]
    head = SCHEDULING.read_text().split("## Rule index", 1)[1]
    m = re.search(r"(\d+) numbered rules in (\d+) letter families", head)
    assert m, "the index says how many rules it holds"
    assert (int(m.group(1)), int(m.group(2))) == (len(rules), len(families))


def test_every_rule_cited_in_code_tests_and_docs_is_in_the_index() -> None:
    unknown = {rule: sorted(files)[:3] for rule, files in _cited().items() if rule not in INDEX}
    assert not unknown, f"rules cited but not in docs/scheduling.md's index: {unknown}"


@pytest.mark.parametrize("rule", sorted(INDEX))
def test_every_row_names_code_and_tests_that_exist(rule: str) -> None:
    line, code, tests = INDEX[rule]
    assert line.strip(), rule
    assert _refs(code) and _refs(tests), f"rule {rule}: a row names its code and tests"
    for ref in _refs(code):
        module, _, name = ref.partition("::")
        path = ROOT / module
        assert path.is_file(), f"rule {rule}: no module {module}"
        assert name and _defines(path, name), f"rule {rule}: {module} defines no {name}"
    for ref in _refs(tests):
        file, _, name = ref.partition("::")
        path = ROOT / file
        assert file.startswith("tests/") and path.is_file(), f"rule {rule}: no test file {file}"
        if name:
            assert _defines(path, name), f"rule {rule}: {file} has no {name}"


@pytest.mark.parametrize("rule", sorted(INDEX))
def test_every_row_cites_a_file_that_names_the_rule(rule: str) -> None:
    """A row's code or tests mention the rule (`rule F3`, `test_rule_f3_*`, "(F3)"), so a
    row that points at the wrong place is caught, not only a missing one."""
    _, code, tests = INDEX[rule]
    files = {ref.partition("::")[0] for ref in _refs(code) + _refs(tests)}
    pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(rule)}(?![0-9])|test_rule_"
                         rf"{re.escape(rule.lower().replace('.', '_'))}(?![0-9])", re.I)
    cited = _cited().get(rule, set())
    assert files & cited or any(pattern.search((ROOT / f).read_text()) for f in files), (
        f"rule {rule}: none of {sorted(files)} mentions it")
