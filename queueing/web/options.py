"""A `<select>` of teams (staff: every team, 1,000 at the fleet's size): its options built
once per team list and process, the chosen one marked per request. Rendering 1,000
options through the template language cost a staff page more than its own rows."""

from __future__ import annotations

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

_OPTIONS: dict[tuple[str, ...], str] = {}
_OPTIONS_MAX = 16


def team_options(slugs: list[str], chosen: str) -> SafeString:
    """`<option>`s of `slugs`, in order, the one of `chosen` (if any) selected."""
    key = tuple(slugs)
    html = _OPTIONS.get(key)
    if html is None:
        html = "".join(f'<option value="{escape(s)}">{escape(s)}</option>' for s in slugs)
        while len(_OPTIONS) >= _OPTIONS_MAX:
            _OPTIONS.pop(next(iter(_OPTIONS)))
        _OPTIONS[key] = html
    if chosen:
        html = html.replace(f'<option value="{escape(chosen)}">',
                            f'<option value="{escape(chosen)}" selected>', 1)
    return mark_safe(html)  # every slug escaped above
