"""The API's one parser: JSON only. DRF's form parsers read a blank field as an omitted one
(so `name=` became the default name, against the schema's minLength), and no client of
the API posts forms; any other Content-Type is 415 `unsupported_media_type`.

DRF's JSON parser, refusing what would otherwise end in a 500:

* Deep nesting: Python's json raises RecursionError at about a thousand levels (a 500);
  here it is a 400 `parse_error`, as is any document nested deeper than MAX_DEPTH.
* NUL (`\\u0000`) anywhere in a string or a key: PostgreSQL text and jsonb cannot hold
  it, and a lookup with it raised a 500 (a team slug, a parent). Path, query string and
  form bodies are refused by queueing.middleware.RefuseBadInputMiddleware; JSON here.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

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

