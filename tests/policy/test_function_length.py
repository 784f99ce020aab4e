"""No function in `queueing/policy` is over 100 lines (a method, a nested function and a
function's own body all count): the admission pass is stages of short functions, each
with one job (docs/scheduling.md, "The admission pass in stages")."""

from __future__ import annotations

import ast
from pathlib import Path

POLICY = Path(__file__).resolve().parents[2] / "queueing" / "policy"
LIMIT = 100


def _lengths(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of every function in `path`."""
    out: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    out.append((name, (child.end_lineno or child.lineno) - first + 1))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text()), "")
    return out


def test_no_function_in_the_policy_is_over_100_lines() -> None:
    files = sorted(POLICY.rglob("*.py"))
    assert len(files) > 15 and any(f.parent.name == "stages" for f in files)
    long = [f"{f.relative_to(POLICY)}::{name} ({n} lines)"
            for f in files for name, n in _lengths(f) if n > LIMIT]
    assert not long, "over 100 lines: " + ", ".join(long)


def test_the_walk_sees_a_long_function_and_a_nested_one(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    path = tmp_path / "m.py"
    path.write_text(f"def outer():\n    def inner():\n{body.replace('    ', '        ')}\n"
                    f"    return inner\n\n\nclass C:\n    def short(self):\n        return 1\n")
    lengths = dict(_lengths(path))
    assert lengths["outer.inner"] == LIMIT + 1
    assert lengths["outer"] == LIMIT + 3
    assert lengths["C.short"] == 2
