"""Private names of other libraries that fairq still uses, each pinned to the version of
its library it was checked against.

A name with a leading underscore is no library's promise: it may change in any release
without a word. Where a public way exists fairq takes it (`request.body`, not DRF's
`request._request.body` or Django's `request._body`; `serializer.fields`, not DRF's
`_readable_fields`; fairq's own helpers lost their underscore when another module used
them). What remains is listed in PINNED with why, and:

* the installed version of each library must be the one pinned: an upgrade fails here
  until someone has read the new release's code for these names and moved the pin;
* each name must still exist on its object;
* each must still be used where PINNED says (a stale entry fails: the list shrinks);
* a scan of fairq's source finds no other attribute with a leading underscore that fairq
  does not define itself, and no `from <library> import _name`. (An override of a
  library's private method, or an attribute of the same name as one fairq defines,
  escapes the scan: such uses are listed here by hand.)

Documented names with an underscore are not private: Django's `Model._meta` API and
`_default_manager`, the named tuple's `_make`.
"""

from __future__ import annotations

import ast
import importlib
import re
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["queueing", "accounts", "config", "fairq_cli"]
OURS = tuple(f"{name}." for name in SOURCES) + tuple(SOURCES)
DOCUMENTED = {"_meta", "_default_manager", "_base_manager", "_make"}

# (distribution, version, "module:object", private name, fairq file that uses it): why.
PINNED: dict[tuple[str, str, str, str, str], str] = {
    ("django", "5.2.20", "django.core.handlers.base:BaseHandler", "_get_response",
     "queueing/api/lane.py"):
        "the lane's handler runs the fast submit where Django resolves the URL",
    ("django", "5.2.20", "django.core.handlers.base:BaseHandler", "_middleware_chain",
     "queueing/api/lane.py"):
        "the lane builds its own chain (settings.MIDDLEWARE without its skips)",
    ("django", "5.2.20", "django.core.handlers.base:BaseHandler", "_view_middleware",
     "queueing/api/lane.py"):
        "emptied by the lane's load_middleware, as BaseHandler.load_middleware sets it",
    ("django", "5.2.20", "django.core.handlers.base:BaseHandler",
     "_template_response_middleware", "queueing/api/lane.py"):
        "as _view_middleware",
    ("django", "5.2.20", "django.core.handlers.base:BaseHandler", "_exception_middleware",
     "queueing/api/lane.py"):
        "as _view_middleware",
    ("django", "5.2.20", "django.db.backends.base.base:BaseDatabaseWrapper",
     "_prepare_cursor", "queueing/rawsql.py"):
        "wraps the prepared-statement cursor as Django wraps its own (logging, errors)",
    ("psycopg", "3.3.9", "psycopg:Cursor", "_send_query_prepared", "queueing/rawsql.py"):
        "overridden to keep the statement in `_query` for Django's SQL log",
    ("psycopg", "3.3.9", "psycopg:Cursor", "_query", "queueing/rawsql.py"):
        "what Django's last_executed_query reads",
    ("drf-spectacular", "0.30.0", "drf_spectacular.openapi:AutoSchema",
     "_map_basic_serializer", "queueing/api/schema.py"):
        "the request schema of a strict serializer, closed (additionalProperties: false); "
        "drf-spectacular's own extension guide calls it",
}


def _object(path: str) -> object:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(("dist", "pinned", "where", "name", "used_in"), list(PINNED))
def test_each_private_name_is_pinned_to_its_librarys_version(
        dist: str, pinned: str, where: str, name: str, used_in: str) -> None:
    assert version(dist) == pinned, (
        f"{dist} is {version(dist)}, not {pinned}: check that {where}.{name} (used by "
        f"{used_in}) still does what fairq relies on, then move the pin")
    assert hasattr(_object(where), name), f"{where} has no {name} any more"
    text = (ROOT / used_in).read_text()
    assert re.search(rf"\b{re.escape(name)}\b", text), f"{used_in} no longer uses {name}"


def _trees() -> dict[Path, ast.Module]:
    out = {}
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            if "migrations" not in path.parts:
                out[path] = ast.parse(path.read_text())
    return out


def _defined(trees: dict[Path, ast.Module]) -> set[str]:
    """Every name fairq's own source binds: functions, classes, variables, attributes it
    assigns, arguments, import aliases."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in DOCUMENTED


def _private_uses(tree: ast.Module, rel: str, ours: set[str],
                  allowed: set[tuple[str, str]]) -> list[str]:
    """`rel`'s uses of names with a leading underscore that fairq does not bind itself
    (`ours`) and PINNED does not list for `rel` (`allowed`): attributes, names imported
    from another library, and another library's private modules."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if _private(node.attr) and node.attr not in ours and (node.attr, rel) not in allowed:
                found.append(f"{rel}:{node.lineno} .{node.attr}")
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            modules = [node.module or ""]
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            modules, names = [a.name for a in node.names], []
        else:
            continue
        for module in modules:
            if module.startswith(OURS):
                continue
            if any(_private(part) for part in module.split(".")):
                found.append(f"{rel}:{node.lineno} module {module}")
            found += [f"{rel}:{node.lineno} from {module} import {name}"
                      for name in names if _private(name)]
    return found


def test_no_other_private_name_of_a_library_is_used() -> None:
    trees = _trees()
    ours = _defined(trees) - {name for _, _, _, name, _ in PINNED}
    allowed = {(name, used_in) for _, _, _, name, used_in in PINNED}
    found = [hit for path, tree in trees.items()
             for hit in _private_uses(tree, path.relative_to(ROOT).as_posix(), ours, allowed)]
    assert not found, ("private names of other libraries: use a public way, or pin each "
                       "in PINNED with why:\n" + "\n".join(found))


@pytest.mark.parametrize(("source", "flagged"), [
    ("request._request.body", True),
    ("serializer._readable_fields", True),
    ("throttle._wait", True),
    ("from psycopg._cursor_base import BaseCursor", True),
    ("import psycopg._cursor_base", True),
    ("from rest_framework.throttling import _private", True),
    ("from queueing.api.serializers import _shaper", False),  # fairq's own
    ("Job._meta.fields", False),
    ("self.__class__", False),
])
def test_the_scan_sees(source: str, flagged: bool) -> None:
    assert bool(_private_uses(ast.parse(source), "x.py", set(), set())) is flagged
