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

from functools import cache
from typing import Any, TypeVar

from django.db import connection
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


def insert_params(obj: Model) -> list[Any]:
    """The values of an INSERT of the unsaved `obj` (`insert_columns` order), converted as
    `Model.save()` converts them: `pre_save` (auto_now, auto_now_add) then
    `get_db_prep_save`."""
    _, fields = insert_columns(type(obj))
    return [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
