"""The instant parser (queueing/instants.py) as a form field for django-filter and as a
serializer field: every instant the API takes goes through `parse_instant`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import django_filters
from django import forms
from rest_framework import serializers

from queueing.instants import InstantError, as_utc, parse_instant


class InstantFormField(forms.Field):
    def to_python(self, value: Any) -> datetime | None:
        if value in self.empty_values:
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
    """DRF's DateTimeField, parsing with `parse_instant`: an offset is required."""

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
