"""The instant parser (queueing/instants.py) as a form field for django-filter and as a
serializer field: every instant the API takes goes through `parse_instant`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import django_filters
from django import forms
from rest_framework import serializers
from rest_framework.fields import empty

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
