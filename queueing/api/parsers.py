"""The API's JSON parser: DRF's, refusing what would otherwise end in a 500.

* Deep nesting: Python's json raises RecursionError at about a thousand levels (a 500);
  here it is a 400 `parse_error`, as is any document nested deeper than MAX_DEPTH.
* NUL (`\\u0000`) anywhere in a string or a key: PostgreSQL text and jsonb cannot hold
  it, and a lookup with it raised a 500 (a team slug, a parent). Path, query string and
  form bodies are refused by queueing.middleware.RefuseNulMiddleware; JSON bodies here.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser

MAX_DEPTH = 32  # the deepest body the API takes is a job: object -> env -> value


def check_json_value(value: Any) -> None:
    """ParseError when `value` (parsed JSON) nests deeper than MAX_DEPTH or holds a NUL.
    Iterative: a hostile document cannot exhaust the stack here either."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ParseError("JSON strings may not contain NUL (\\u0000) characters.")
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels.")
        if isinstance(item, dict):
            stack.extend((k, depth) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        else:
            stack.extend((v, depth + 1) for v in item)


class SafeJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels.") from None
        check_json_value(data)
        return data


def _check_form(data: Any) -> None:
    for key, values in data.lists():
        if "\x00" in key or any(isinstance(v, str) and "\x00" in v for v in values):
            raise ParseError("Form fields may not contain NUL characters.")


class SafeFormParser(FormParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        _check_form(data)
        return data


class SafeMultiPartParser(MultiPartParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        data_and_files = super().parse(stream, media_type, parser_context)
        _check_form(data_and_files.data)
        return data_and_files
