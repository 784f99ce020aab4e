"""Write bodies name only fields the API takes: anything else is refused by name.

A job body with `privileged`, `hostNetwork` or `volumes` was validated and the extra keys
dropped without a word: the caller believed they had asked for something. Every write
serializer of API v1 mixes this in; the schema says the same thing
(`additionalProperties: false` on request bodies, queueing/api/schema.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

UNKNOWN_FIELD = "Unknown field."


# Mix into a Serializer (before it): keys of the input that are not writable fields answer
# 400 with `fields.<key> = ["Unknown field."]`, together with the other fields' errors;
# read-only fields count as unknown in a write body. (A comment, not a docstring: the
# schema would show it as every serializer's description.)
class StrictFieldsMixin:

    def to_internal_value(self, data: Any) -> Any:
        unknown: list[str] = []
        if isinstance(data, Mapping):
            fields: Mapping[str, Any] = self.fields  # type: ignore[attr-defined]
            writable = {name for name, field in fields.items() if not field.read_only}
            unknown = sorted(str(k) for k in data if k not in writable)
        try:
            value = super().to_internal_value(data)  # type: ignore[misc]
        except serializers.ValidationError as exc:
            if not unknown or not isinstance(exc.detail, dict):
                raise
            detail: dict[str, Any] = dict(exc.detail)
            detail.update({name: [UNKNOWN_FIELD] for name in unknown})
            raise serializers.ValidationError(detail) from None
        if unknown:
            raise serializers.ValidationError({name: [UNKNOWN_FIELD] for name in unknown})
        return value
