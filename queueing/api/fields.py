"""The instant parser (queueing/instants.py) as a form field for django-filter and as a
serializer field: every instant the API takes goes through `parse_instant`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty

from queueing.instants import InstantError, as_utc, parse_instant
from queueing.selectors.jobs import jobs_with_labels, label_filter_parse
from queueing.validation import ascii_int, parse_gpus


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


class LabelsFormField(forms.Field):
    """Every `label=key=value` of the query (repeatable), as (key, value) pairs
    (`label_filter_parse`)."""

    widget = forms.SelectMultiple  # reads every value of a repeated parameter (getlist)

    def to_python(self, value: Any) -> list[tuple[str, str]]:
        items = [value] if isinstance(value, str) else list(value or [])
        try:
            return label_filter_parse([str(item) for item in items])
        except ValueError as exc:
            # The message as a parameter, never the format: a '%' in the input would be
            # read as a format (django-filter formats messages; schemathesis found it).
            raise forms.ValidationError("%(problem)s", code="invalid",
                                        params={"problem": str(exc)}) from None

    def validate(self, value: Any) -> None:  # an empty list is no filter
        return None


@extend_schema_field({
    "type": "array", "items": {"type": "string", "pattern": "^[^=]+=.*$"},
    "description": "key=value: only jobs with this label of their own (docs/api.md, "
                   "\"Volumes, secrets and metadata\"); repeat for several (all must match)."})
class LabelFilter(django_filters.Filter):  # type: ignore[misc]  # django-filter ships no types
    """Jobs carrying every given label (`?label=run=exp-42&label=team=cv`: AND):
    `jobs_with_labels`."""

    field_class = LabelsFormField

    def filter(self, qs: QuerySet[Any], value: list[tuple[str, str]]) -> QuerySet[Any]:
        return jobs_with_labels(qs, value or [])


class AsciiIntegerFormField(forms.IntegerField):
    """A whole number written in ASCII digits (`?array=１０` is refused, not read as 10)."""

    def to_python(self, value: Any) -> int | None:
        if value in self.empty_values:
            return None
        number = ascii_int(str(value).strip())
        if number is None:
            raise forms.ValidationError("Enter a whole number in ASCII digits.", code="invalid")
        return number


class AsciiIntegerFilter(django_filters.NumberFilter):  # type: ignore[misc]
    """A filter on a whole number (`AsciiIntegerFormField`)."""

    field_class = AsciiIntegerFormField


@extend_schema_field({"anyOf": [
    {"type": "number", "minimum": 0, "exclusiveMinimum": True},
    {"type": "string", "pattern": "^[0-9]{1,6}(/[1-9][0-9]{0,2}|[.][0-9]{1,9})?$"}],
    "description": "GPUs per replica: whole GPUs (2), or a fraction of one GPU of a "
                   "time-sliced or MPS type (0.25, \"1/4\"), a multiple of 1/slices_per_gpu."})
class GpusField(serializers.Field):  # type: ignore[type-arg]
    """A job's `gpus` per replica: a whole number (2, "4") or a fraction of one GPU of a
    time-sliced or MPS type (0.25, "0.5", "1/4"): an int or a Fraction
    (`validation.parse_gpus`); the GPU type then decides (`validation.gpus_on_type`)."""

    def to_internal_value(self, data: Any) -> Any:
        try:
            return parse_gpus(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field({"type": "number"})
class GpuAmountField(serializers.Field):  # type: ignore[type-arg]
    """GPUs as a number: a whole number as an int (8), a share of shared GPUs as a
    decimal (2.25: nine quarter GPUs)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("read_only", True)
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        rounded = round(float(value), 6)
        return int(rounded) if rounded == int(rounded) else rounded
