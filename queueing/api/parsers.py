"""The API's one parser: JSON only. DRF's form parsers read a blank field as an omitted one
(so `name=` became the default name, against the schema's minLength), and no client of
the API posts forms; any other Content-Type is 415 `unsupported_media_type`.

DRF's JSON parser, refusing what would otherwise end in a 500:

* Deep nesting: Python's json raises RecursionError at about a thousand levels (a 500);
  here it is a 400 `parse_error`, as is any document nested deeper than MAX_DEPTH.
* NUL (`\\u0000`) anywhere in a string or a key: PostgreSQL text and jsonb cannot hold
  it, and a lookup with it raised a 500 (a team slug, a parent). Path, query string and
  form bodies are refused by queueing.middleware.RefuseBadInputMiddleware; JSON here.

And refusing what it would otherwise take without a word:

* A key twice in one object (`{"gpus": 1, "gpus": 8}`): Python's json keeps the last, other
  readers the first; the caller cannot have meant both. A 400 `invalid` naming the key
  where it is, as the API names fields (`gpus`, `env.SEED`, `volumes[1].name`):
  "Duplicate key in the JSON body.".
"""

from __future__ import annotations

import codecs
import json
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.utils.json import strict_constant

MAX_DEPTH = 32  # the deepest body the API takes is a job: object -> env -> value
DUPLICATE_KEY = "Duplicate key in the JSON body."


class _Duplicated(dict[str, Any]):
    """An object of the document that had a key more than once (`duplicates`)."""

    duplicates: list[str]


def _duplicate_errors(value: Any) -> dict[str, list[str]]:
    """Where `value` (parsed by `loads`) had a key twice: {"env.SEED": [DUPLICATE_KEY]},
    named as queueing/api/errors.py names fields."""
    found: dict[str, list[str]] = {}
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key in getattr(item, "duplicates", ()):
                found[f"{path}.{key}" if path else key] = [DUPLICATE_KEY]
            stack.extend((v, f"{path}.{k}" if path else k) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))
    return found


def loads(text: str, parse_constant: Any = None) -> Any:
    """`json.loads`, refusing a key twice in an object: ValidationError naming it. Also
    ValueError (not JSON) and RecursionError, as `json.loads`."""
    marked: list[_Duplicated] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) == len(items):
            return obj
        seen: set[str] = set()
        duplicated = _Duplicated(obj)
        duplicated.duplicates = []
        for key, _value in items:
            if key in seen:
                duplicated.duplicates.append(key)
            seen.add(key)
        marked.append(duplicated)
        return duplicated

    data = json.loads(text, parse_constant=parse_constant, object_pairs_hook=pairs)
    if marked:
        raise ValidationError(_duplicate_errors(data))
    return data


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


def parse_json(text: str) -> Any:
    """The API's reading of a JSON body, for DRF's parser and the submit lane alike:
    strict numbers (NaN and Infinity refused, as DRF's STRICT_JSON), a key twice refused
    (ValidationError naming it), no deeper than MAX_DEPTH, no NUL (ParseError)."""
    try:
        data = loads(text, strict_constant)
    except RecursionError:
        raise ParseError(f"JSON nested deeper than {MAX_DEPTH} levels.") from None
    except ValueError as exc:
        raise ParseError(f"JSON parse error - {exc}") from None
    check_json_value(data)
    return data


class SafeJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        # DRF's JSONParser.parse, through `parse_json`.
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            "".encode(encoding)  # a text codec, never bz2_codec and the like (as DRF)
        except (LookupError, UnicodeError):
            raise ParseError(
                f'Unsupported charset "{encoding}" in request Content-Type header.') from None
        try:
            text = codecs.getreader(encoding)(stream).read()
        except ValueError as exc:  # UnicodeDecodeError: DRF's message for it
            raise ParseError(f"JSON parse error - {exc}") from None
        return parse_json(text)
