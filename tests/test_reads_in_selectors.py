"""Every read in selectors, every write in services: the front ends hold no query.

docs/architecture.md says the pages, the REST API and the other front ends read through
`queueing.selectors` / `accounts.selectors` and change state through the services. An
import contract cannot say it (a front end must import the models to name them), so this
test walks the syntax tree of every front-end module and fails on what builds or runs a
query there. What it forbids, in a front-end module:

1. a model manager: any `.objects`, `._default_manager`, `._base_manager`;
2. a call of a query or write method: `.all()`, `.filter()`, `.exclude()`, `.annotate()`,
   `.alias()`, `.aggregate()`, `.values_list()`, `.select_related()`,
   `.prefetch_related()`, `.order_by()`, `.only()`, `.defer()`, `.distinct()`, `.none()`,
   `.first()`, `.last()`, `.latest()`, `.earliest()`, `.exists()`, `.in_bulk()`,
   `.iterator()`, `.raw()`, `.select_for_update()`, `.refresh_from_db()`, `.save()`,
   `.create()`, `.get_or_create()`, `.update_or_create()`, `.bulk_create()`,
   `.bulk_update()`, `.delete()`;
3. `.get()` or `.update()` called with keyword arguments only (`qs.get(pk=...)`,
   `qs.update(last_used_at=...)`): a queryset's; a dict's `.get` and `.update` take a
   key or a mapping (`request.GET.get("x")`, `ctx.update({...})`) and pass;
4. importing `django.db` (`connection`, `transaction`, `models`...), or from
   `django.db.models` anything but `QuerySet` (a type in annotations): `Q`, `F`,
   `Max`, `prefetch_related_objects`... build queries.

Not checked: `queueing.admin` and `accounts.admin` (Django's admin is a front end over the
ORM itself: `get_queryset`, `save_model` are its contract) and the management commands
(operator tools that seed, import and export in bulk). `@register.filter` (a template
filter) is an attribute, not a call, and passes.

The exceptions are named below, each with its reason; an exception that no longer
matches anything fails too, so the list shrinks as the code does.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FRONT_ENDS = [
    "queueing/web",
    "queueing/api",
    "queueing/metrics.py",
    "queueing/middleware.py",
    "accounts/api.py",
    "accounts/authentication.py",
    "accounts/backends.py",
    "accounts/sso.py",
    "accounts/sso_backend.py",
]

MANAGERS = {"objects", "_default_manager", "_base_manager"}
QUERY_CALLS = {
    "all", "filter", "exclude", "annotate", "alias", "aggregate", "values_list",
    "select_related", "prefetch_related", "order_by", "only", "defer", "distinct", "none",
    "first", "last", "latest", "earliest", "exists", "in_bulk", "iterator", "raw",
    "select_for_update", "refresh_from_db", "save", "create", "get_or_create",
    "update_or_create", "bulk_create", "bulk_update", "delete",
}
KEYWORD_ONLY = {"get", "update"}
DB_MODULES = {"django.db", "django.db.models", "django.contrib.postgres"}
DB_NAMES_ALLOWED = {"QuerySet"}

# (module path, enclosing function's qualified name, what is found): the reason. None
# left: the token check's read and its `last_used_at` write are accounts' selector and
# service (accounts/authentication.py::authenticate_key, for DRF and the submit lane).
EXCEPTIONS: dict[tuple[str, str, str], str] = {}


def _modules() -> list[Path]:
    out: list[Path] = []
    for entry in FRONT_ENDS:
        p = ROOT / entry
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: list[tuple[str, str, int]] = []  # (qualname, what, line)

    def _add(self, what: str, node: ast.AST) -> None:
        self.found.append((".".join(self.scope) or "<module>", what, node.lineno))

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in MANAGERS:
            self._add(f".{node.attr}", node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and (f.attr in QUERY_CALLS or (
                f.attr in KEYWORD_ONLY and node.keywords and not node.args)):
            self._add(f".{f.attr}()", node)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in DB_MODULES or alias.name.startswith("django.db."):
                self._add(f"import {alias.name}", node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if mod in DB_MODULES or mod.startswith("django.db."):
            for alias in node.names:
                if alias.name not in DB_NAMES_ALLOWED:
                    self._add(f"from {mod} import {alias.name}", node)


def find(source: str) -> list[tuple[str, str, int]]:
    finder = _Finder()
    finder.visit(ast.parse(source))
    return finder.found


def _findings() -> list[tuple[str, str, str, int]]:
    out = []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        out += [(rel, scope, what, line) for scope, what, line in find(path.read_text())]
    return out


def test_front_ends_build_no_query() -> None:
    """Rule of docs/architecture.md: a front end reads through selectors and writes
    through services; the named exceptions only."""
    bad = [f"{rel}:{line} in {scope}: {what}" for rel, scope, what, line in _findings()
           if (rel, scope, what) not in EXCEPTIONS]
    assert not bad, "queries in front ends (move them to a selector or a service):\n" + \
        "\n".join(bad)


def test_every_exception_still_matches() -> None:
    found = {(rel, scope, what) for rel, scope, what, _ in _findings()}
    stale = [key for key in EXCEPTIONS if key not in found]
    assert not stale, f"exceptions that match nothing any more (remove them): {stale}"


def test_every_front_end_module_exists() -> None:
    missing = [entry for entry in FRONT_ENDS if not (ROOT / entry).exists()]
    assert not missing, missing
    assert len(_modules()) > 30


@pytest.mark.parametrize(("source", "what"), [
    ("Team.objects.all()", ".objects"),
    ("teams_for_user(user=u).order_by('slug')", ".order_by()"),
    ("job.events.all()", ".all()"),
    ("job.refresh_from_db()", ".refresh_from_db()"),
    ("token.save(update_fields=['x'])", ".save()"),
    ("Row.objects.select_for_update().get(pk=1)", ".select_for_update()"),
    ("jobs_visible_to(actor=u).get(pk=1)", ".get()"),
    ("tokens(u).update(last_used=now)", ".update()"),
    ("Job.objects.filter(pk=1).values('id')", ".filter()"),
    ("from django.db.models import Q", "from django.db.models import Q"),
    ("from django.db import transaction", "from django.db import transaction"),
    ("import django.db", "import django.db"),
])
def test_the_check_sees(source: str, what: str) -> None:
    assert what in [w for _, w, _ in find(source)]


@pytest.mark.parametrize("source", [
    "request.GET.get('x')",
    "self.context.get('roles', {})",
    "ctx.update({'a': 1})",
    "@register.filter\ndef f(x): return x",
    "from django.db.models import QuerySet",
    "exc.fields.values()",
])
def test_the_check_passes(source: str) -> None:
    assert find(source) == []
