"""Rows read and written in plain SQL on the hottest paths (authenticating an API token,
the submit of one job), with the column lists and value conversions taken from the
models, so they follow every migration.

Why: building and compiling an ORM query costs ~1 ms of CPU per query; the same SELECT
through a cursor costs ~0.15 ms (bench/bench_api.py; docs/api.md "Performance"). The ORM
stays the way everywhere else; these helpers only skip its query compiler. Every value
still goes through the field's own conversion (`get_db_prep_save`, `from_db`), so a JSON
field, a datetime or a default behaves exactly as it does through `Model.save()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models import Field, Model

M = TypeVar("M", bound=Model)


@cache
def _fields(model: type[Model]) -> tuple[Field[Any, Any], ...]:
    return tuple(model._meta.concrete_fields)


@cache
def _attnames(model: type[Model]) -> tuple[str, ...]:
    return tuple(f.attname for f in _fields(model))


def _column(field: Field[Any, Any]) -> str:
    assert field.column is not None  # a concrete field always has one
    return field.column


def table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


@cache
def select_list(model: type[Model], alias: str) -> str:
    """`alias."col", ...` for every concrete field of `model`, in field order: what
    `from_row` reads back."""
    quote = connection.ops.quote_name
    return ", ".join(f"{alias}.{quote(_column(f))}" for f in _fields(model))


@cache
def _converters(model: type[Model]) -> tuple[tuple[int, tuple[Any, ...], Any], ...]:
    """(position, converters, column expression) for each field whose database value needs
    converting, as the ORM's compiler finds them (the backend's, then the field's own:
    SQLite's datetimes, JSON decoding, ...)."""
    out = []
    for i, f in enumerate(_fields(model)):
        col = f.get_col(model._meta.db_table)
        found = (*connection.ops.get_db_converters(col), *col.get_db_converters(connection))
        if found:
            out.append((i, found, col))
    return tuple(out)


def from_row(model: type[M], row: Any, start: int = 0) -> tuple[M, int]:
    """An instance of `model` from `row[start:]` (a `select_list` of it), as the ORM
    builds one (each value through the same converters, then `Model.from_db`: not
    adding, database "default"); and the index of the next column."""
    names = _attnames(model)
    end = start + len(names)
    values = list(row[start:end])
    for i, converters, col in _converters(model):
        for convert in converters:
            values[i] = convert(values[i], col, connection)
    return model.from_db("default", names, values), end


@cache
def insert_columns(model: type[Model]) -> tuple[str, tuple[Field[Any, Any], ...]]:
    """The quoted column list of an INSERT of `model` without its primary key, and the
    fields in that order."""
    fields = tuple(f for f in _fields(model) if not f.primary_key)
    quote = connection.ops.quote_name
    return ", ".join(quote(_column(f)) for f in fields), fields


# Field classes whose conversion for the database (`pre_save`, then `get_db_prep_save`)
# returns None, and a value of this exact Python type, unchanged: CharField's `to_python`
# keeps a str, BooleanField's `bool()` a bool. (Integers are not: on PostgreSQL Django
# wraps them in psycopg's Int2/Int4/Int8.) Exact classes only: a subclass may convert
# differently. tests/test_hot_path.py holds the result to the fields' own conversion.
_UNCHANGED: dict[type[Field[Any, Any]], type] = {
    models.CharField: str, models.TextField: str, models.SlugField: str,
    models.BooleanField: bool,
    # None only (NoneType: no other value matches): integers and foreign keys keep None.
    models.IntegerField: type(None), models.PositiveIntegerField: type(None),
    models.PositiveSmallIntegerField: type(None), models.BigIntegerField: type(None),
    models.SmallIntegerField: type(None), models.ForeignKey: type(None),
}


@cache
def _insert_plan(model: type[Model]) -> tuple[tuple[Field[Any, Any], str, type | None], ...]:
    """Per insert field: the field, its attname, and the type its value keeps unchanged
    (None: always convert). Only where `pre_save` is Field's own (no auto_now)."""
    _, fields = insert_columns(model)
    return tuple(
        (f, f.attname, _UNCHANGED.get(type(f)) if type(f).pre_save is Field.pre_save else None)
        for f in fields)


def insert_params(obj: Model) -> list[Any]:
    """The values of an INSERT of the unsaved `obj` (`insert_columns` order), converted as
    `Model.save()` converts them: `pre_save` (auto_now, auto_now_add) then
    `get_db_prep_save`; a value the field would leave unchanged (`_UNCHANGED`) is taken as
    it is (a submit has ~50 values, most of them plain strings)."""
    db = connections[DEFAULT_DB_ALIAS]  # the connection itself: each `connection.x` of the
    # proxy costs a thread-local lookup
    out = []
    for f, attname, unchanged in _insert_plan(type(obj)):
        if unchanged is not None:
            value = getattr(obj, attname)
            if value is None or type(value) is unchanged:
                out.append(value)
                continue
        out.append(f.get_db_prep_save(f.pre_save(obj, True), db))
    return out



_NEVER = 2**31 - 1


@cache
def _prepared_cursor_class() -> type[Any]:
    from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparedCursor(ServerBindingCursor):
        """Parameters sent apart from the statement, which PostgreSQL parses and plans
        once per connection (a prepared statement) and then only executes."""

        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None,
                    binary: bool | None = None) -> Any:
            return super().execute(  # type: ignore[misc]
                query, params, prepare=True, binary=binary)

        def _send_query_prepared(self, name: bytes, pgq: Any, *, binary: bool | None = None
                                 ) -> None:
            # Kept as psycopg keeps an unprepared one, so that Django's SQL log and
            # CaptureQueriesContext show the statement ($1, $2, ... for its parameters).
            self._query = pgq
            super()._send_query_prepared(name, pgq, binary=binary)  # type: ignore[misc]

    return PreparedCursor


@contextmanager
def statement_cursor() -> Iterator[Any]:
    """A cursor for one of the hot statements, which runs the same SQL text again and again.

    On PostgreSQL with FAIRQ_DB_PREPARE (the default) the statement is prepared once per
    connection: the parameters travel apart from the SQL (no quoting of every value into
    the text) and the server skips parsing and planning on every later run. Django leaves
    prepared statements off for the sake of transaction-mode connection poolers
    (PgBouncer before 1.21 loses them between transactions): set FAIRQ_DB_PREPARE=0 behind
    one of those. Elsewhere, Django's own cursor. Either way the cursor is Django's
    wrapper: errors are Django's, and the SQL is logged and captured as any other."""
    if connection.vendor != "postgresql" or not settings.FAIRQ_DB_PREPARE:
        with connection.cursor() as cur:
            yield cur
        return
    # As Django's own `cursor()` gets one: the health check, the connection, its errors.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        db = connection.connection
        if db.prepare_threshold is None:
            # Django's None turns every preparing off; this count is never reached by the
            # other statements (Django's cursors bind on the client and never prepare), so
            # only these, asked for explicitly, are prepared.
            db.prepare_threshold = _NEVER
        raw = _prepared_cursor_class()(db)
    with connection._prepare_cursor(raw) as cur:  # type: ignore[attr-defined]
        yield cur
