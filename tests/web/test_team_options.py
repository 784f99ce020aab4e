"""The team `<select>`'s options built once per team list (`queueing.web.options`): the
same options as written one by one, the chosen one alone selected, whatever was chosen
before from the same list."""

from __future__ import annotations

from django.utils.html import escape

from queueing.web.options import team_options


def _plain(slugs: list[str], chosen: str) -> str:
    return "".join(f'<option value="{escape(s)}"{" selected" if s == chosen else ""}>'
                   f"{escape(s)}</option>" for s in slugs)


def test_the_kept_options_are_the_options_written_one_by_one() -> None:
    slugs = ["nlp", "vision", "a-b", "vision-2", "x&y"]
    for chosen in ["vision", "", "x&y", "vision-2", "nlp", "missing", "vision"]:
        html = team_options(slugs, chosen)
        assert html == _plain(slugs, chosen), chosen
        assert html.count(" selected") == (chosen in slugs)


def test_a_choice_is_not_kept_for_the_next_request() -> None:
    slugs = ["alpha", "beta"]
    assert 'value="beta" selected' in team_options(slugs, "beta")
    assert " selected" not in team_options(slugs, "")
    assert 'value="alpha" selected' in team_options(list(slugs), "alpha")
