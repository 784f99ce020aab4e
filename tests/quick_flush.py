"""The flush after each test that commits (`django_db(transaction=True)`, live servers),
on PostgreSQL, by DELETE.

Django's flush TRUNCATEs every model table (54) in one statement, then post_migrate
writes the content types and permissions back: 2-3 s a test on a loaded 2-core
machine, nearly all of it PostgreSQL making and syncing new files for each table and
index. Here every model table is emptied by DELETE in one transaction and one round
trip (the foreign keys are deferred, so order does not matter; an empty table costs
well under a millisecond). The content types and permissions stay when they are
exactly the rows the last full flush left, and are then what post_migrate would write.
Anything else (another vendor, a test that changed a permission or a content type, a
statement that fails) takes Django's own flush, and the next quick one compares
against what that flush left.

`FAIRQ_TEST_FLUSH=django` takes Django's flush every time (to compare the two)."""

from __future__ import annotations

import os
from typing import Any

from django.core.management import call_command
from django.db import connections, transaction

# Emptied by flush and written back by post_migrate (contenttypes, auth).
KEPT = ("django_content_type", "auth_permission")

# How many teardowns took each path (the tests check the quick one ran).
counts = {"quick": 0, "django": 0}

_tables: dict[str, list[str]] = {}  # per database alias: the model tables flush empties
_kept_rows: dict[str, Any] = {}  # per alias: KEPT's rows as the last full flush left them


def _kept(cursor: Any) -> tuple[tuple[Any, ...], ...]:
    cursor.execute("SELECT id, app_label, model FROM django_content_type ORDER BY id")
    types = tuple(cursor.fetchall())
    cursor.execute("SELECT id, name, content_type_id, codename FROM auth_permission ORDER BY id")
    return types, tuple(cursor.fetchall())


def django_flush(alias: str) -> None:
    """Django's flush of `alias` (TransactionTestCase's), then note what it left in KEPT."""
    counts["django"] += 1
    call_command("flush", verbosity=0, interactive=False, database=alias,
                 reset_sequences=False, allow_cascade=False, inhibit_post_migrate=False)
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            _kept_rows[alias] = _kept(cursor)


def quick_flush(alias: str) -> bool:
    """Leave `alias` as Django's flush would (every model table empty but KEPT, KEPT as
    post_migrate writes it) and say True; or do nothing and say False when that cannot
    be promised: not PostgreSQL, no full flush seen yet, KEPT changed since, a failure."""
    connection = connections[alias]
    if (connection.vendor != "postgresql" or alias not in _kept_rows
            or os.environ.get("FAIRQ_TEST_FLUSH") == "django"):
        return False
    if alias not in _tables:
        _tables[alias] = connection.introspection.django_table_names(
            only_existing=True, include_views=False)
    quote = connection.ops.quote_name
    # Every table, not only those holding rows at a look: a thread of the test still
    # writing after it could fill one between the look and the DELETE.
    delete = "".join(f"DELETE FROM {quote(t)};" for t in _tables[alias] if t not in KEPT)
    try:
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            if _kept(cursor) != _kept_rows[alias]:
                return False
            # One string (no parameters: one round trip); the deferred foreign keys
            # are checked by the last statement, not at the commit.
            cursor.execute(delete + "SET CONSTRAINTS ALL IMMEDIATE")
    except Exception:  # any failure: Django's flush, which says why
        return False
    counts["quick"] += 1
    return True


def fixture_teardown(self: Any) -> None:
    """TransactionTestCase._fixture_teardown with the quick flush first. Tests that
    flush a subset of the apps or roll back to serialized contents keep Django's."""
    if self.available_apps is not None or self.serialized_rollback:
        original_fixture_teardown(self)
        return
    for alias in self._databases_names(include_mirrors=False):
        if not quick_flush(alias):
            django_flush(alias)


def install() -> None:
    from django.test import TransactionTestCase

    global original_fixture_teardown
    original_fixture_teardown = TransactionTestCase._fixture_teardown
    TransactionTestCase._fixture_teardown = fixture_teardown  # type: ignore[method-assign]


original_fixture_teardown: Any = None
