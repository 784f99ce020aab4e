"""The instant parser (queueing/instants.py) as a form field for django-filter and as a
serializer field: every instant the API takes goes through `parse_instant`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet, TextField
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty

from queueing import validation as v
from queueing.instants import InstantError, as_utc, parse_instant


class InstantFormField(forms.Field):
    def to_python(self, value: Any) -> datetime | None:
        # Absent is no filter; present but empty (`?updated_after=`) is not an instant
        # (the schema says date-time; schemathesis' negative data found it accepted).
        if value is None:
            return None
        if isinstance(value, datetime):
            return value
        try:
            return parse_instant(str(value))
        except InstantError as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None


class InstantFilter(django_filters.Filter):  # type: ignore[misc]  # django-filter ships no types
    """A filter on an instant (ISO 8601 with an offset), compared in UTC."""

    field_class = InstantFormField


class InstantField(serializers.DateTimeField):
    """DRF's DateTimeField, parsing with `parse_instant`: an offset is required. A field
    sent empty (`?from=`) is an invalid instant, not an absent one (DRF's form-input
    reading would drop it)."""

    def get_value(self, dictionary: Any) -> Any:
        if self.field_name not in dictionary:
            return empty
        return dictionary[self.field_name]

    def to_internal_value(self, value: Any) -> datetime:
        if isinstance(value, datetime):
            try:
                return as_utc(value)
            except InstantError as exc:
                raise serializers.ValidationError(str(exc)) from None
        if not isinstance(value, str):
            self.fail("invalid", format="ISO 8601 with an offset")
        try:
            return parse_instant(value)
        except InstantError as exc:
            raise serializers.ValidationError(str(exc)) from None


MAX_LABEL_FILTERS = 16


class LabelsFormField(forms.Field):
    """Every `label=key=value` of the query (repeatable), as (key, value) pairs."""

    widget = forms.SelectMultiple  # reads every value of a repeated parameter (getlist)

    def to_python(self, value: Any) -> list[tuple[str, str]]:
        items = [value] if isinstance(value, str) else list(value or [])
        if len(items) > MAX_LABEL_FILTERS:
            raise forms.ValidationError(f"At most {MAX_LABEL_FILTERS} label filters.")
        pairs = []
        for item in items:
            key, sep, label = str(item).partition("=")
            if not sep or not v.LABEL_NAME_RE.match(key) or len(key) > v.MAX_LABEL_KEY_LEN \
                    or len(label) > v.MAX_LABEL_VALUE_LEN or not v.LABEL_VALUE_RE.match(label):
                # The input as a parameter, never in the message: a '%' in it would be
                # read as a format (django-filter formats messages; schemathesis found it).
                raise forms.ValidationError(
                    "Write label=key=value (a job's own label), not %(value)s.",
                    code="invalid", params={"value": repr(str(item)[:80])})
            pairs.append((key, label))
        return pairs

    def validate(self, value: Any) -> None:  # an empty list is no filter
        return None


@extend_schema_field({
    "type": "array", "items": {"type": "string", "pattern": "^[^=]+=.*$"},
    "description": "key=value: only jobs with this label of their own (docs/api.md, "
                   "\"Volumes, secrets and metadata\"); repeat for several (all must match)."})
class LabelFilter(django_filters.Filter):  # type: ignore[misc]  # django-filter ships no types
    """Jobs carrying every given label (`?label=run=exp-42&label=team=cv`: AND), on the
    `labels` JSON column (a key lookup: SQLite and PostgreSQL alike)."""

    field_class = LabelsFormField

    def filter(self, qs: QuerySet[Any], value: list[tuple[str, str]]) -> QuerySet[Any]:
        for i, (key, label) in enumerate(value or []):
            alias = f"_label_{i}"
            # Cast: the text of the value, compared as text (a bare key transform would
            # compare as JSON, and SQLite's json_extract() refuses a plain string).
            text = Cast(KeyTextTransform(key, "labels"), output_field=TextField())
            qs = qs.alias(**{alias: text}).filter(**{alias: label})
        return qs
