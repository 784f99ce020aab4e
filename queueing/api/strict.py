"""Write bodies name only fields the API takes: anything else is refused by name; and a
number sent as a string is written with the digits 0-9.

A job body with `privileged`, `hostNetwork` or `volumes` was validated and the extra keys
dropped without a word: the caller believed they had asked for something. Every write
serializer of API v1 mixes this in; the schema says the same thing
(`additionalProperties: false` on request bodies, queueing/api/schema.py).

DRF's number fields take a string and hand it to Python's `int`, `float` or `Decimal`,
which read `"１０"` (full-width digits, or any script's) as 10 and `"1_000"` as 1000: no
client means that, and no other reader of the same JSON would agree. A string for a
number field (at any depth of lists and dicts of numbers) must be ASCII: an optional sign,
digits 0-9, an optional fraction and exponent, surrounding whitespace; otherwise a 400
on that field. A JSON number is never affected (JSON's own grammar is ASCII).

Python's `float(True)` is 1.0 and `int(False)` is 0, so DRF's number fields take a JSON
`true` or `false` as a number: `{"weight": true}` made a team of weight 1. A boolean for a
number field is a 400 on that field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from rest_framework import serializers

UNKNOWN_FIELD = "Unknown field."
NUMBER_TEXT = "Write numbers with the digits 0-9 only (no '_', no other scripts' digits)."
NOT_BOOLEAN = "A number is required, not true or false."
_NUMBER_FIELDS = (serializers.IntegerField, serializers.FloatField, serializers.DecimalField)
# [0-9], not \d: \d is any script's digit in Python's re.
_ASCII_NUMBER = re.compile(
    r"[ \t\n\r]*[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[ \t\n\r]*\Z")


def number_text_errors(field: Any, value: Any) -> Any:
    """The errors of `value` for `field` when a number is a boolean or is written as a
    string other than ASCII digits (DRF's error shapes: a list of messages, or by index or key for a
    ListField or DictField of numbers); None when there are none."""
    if isinstance(field, _NUMBER_FIELDS):
        if isinstance(value, bool):
            return [NOT_BOOLEAN]
        if isinstance(value, str) and not _ASCII_NUMBER.match(value):
            return [f"{field.error_messages['invalid']} {NUMBER_TEXT}"]
        return None
    if isinstance(field, serializers.ListField) and isinstance(value, list):
        by_index = {i: e for i, item in enumerate(value)
                    if (e := number_text_errors(field.child, item)) is not None}
        return by_index or None
    if isinstance(field, serializers.DictField) and isinstance(value, Mapping):
        by_key = {k: e for k, item in value.items()
                  if (e := number_text_errors(field.child, item)) is not None}
        return by_key or None
    return None


# Mix into a Serializer (before it): keys of the input that are not writable fields answer
# 400 with `fields.<key> = ["Unknown field."]`, and numbers written as strings with other
# than ASCII digits with `fields.<key> = ["A valid integer is required. Write ..."]`,
# together with the other fields' errors; read-only fields count as unknown in a write
# body. (A comment, not a docstring: the schema would show it as every serializer's
# description.)
class StrictFieldsMixin:

    def to_internal_value(self, data: Any) -> Any:
        refused: dict[str, Any] = {}
        if isinstance(data, Mapping):
            fields: Mapping[str, Any] = self.fields  # type: ignore[attr-defined]
            writable = {name: field for name, field in fields.items() if not field.read_only}
            for key in sorted(str(k) for k in data if k not in writable):
                refused[key] = [UNKNOWN_FIELD]
            for name, field in writable.items():
                if name in data and (errors := number_text_errors(field, data[name])):
                    refused[name] = errors
        try:
            value = super().to_internal_value(data)  # type: ignore[misc]
        except serializers.ValidationError as exc:
            if not refused or not isinstance(exc.detail, dict):
                raise
            detail: dict[str, Any] = dict(cast("Mapping[str, Any]", exc.detail))
            detail.update(refused)
            raise serializers.ValidationError(detail) from None
        if refused:
            raise serializers.ValidationError(refused)
        return value
