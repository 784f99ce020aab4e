"""API tokens (and the teams their users submit to) remembered by each web process,
revocation still immediate. A cache only: whether a token authenticates is decided by
`accounts.authentication.authenticate_key`, the same check as DRF's TokenAuthentication;
this module is the `lookup` it is given on the submit lane's fast path.

`TokenAuthentication` reads the token and its user from the database on every request.
The submit fast path (queueing/api/jobs.py) keeps what it read per process, keyed by the
key's hash, tagged with the *token generation*: a counter in the cache (Redis in
production, shared by every process) that goes up once any token or user changes and the
change has committed (`generation_bump`, queued after the commit by queueing/signals.py).
The generation is read on every request in the same round trip as the rate limit; an
entry whose tag differs is read again from the database before it is believed. So a
revoked or expired token, a deactivated user or one whose staff flag changed is refused
from the first request after the change committed, as before.

The tag is a generation read *before* the database read that loaded the entry: a change
that commits after that read bumps the generation past the tag, and the next request
reads the entry again.

The same holds for `team_remembered`: the team row a user may submit to (with its
defaults, maxima, allowlists and budget flag), forgotten when a team, a membership or a
team budget changes. Membership is also the job INSERT's own condition, so even a
remembered row never lets a former member queue a job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.cache import cache

from accounts.authentication import TokenLookup, key_parts
from accounts.models import ApiToken, Team
from accounts.selectors import api_token_for_key
from queueing.memo import on_forget
from queueing.selectors.lookups import team_for_submitter

from .throttling import redis_client

GENERATION_KEY = "fq-auth-gen"
MAX_ENTRIES = 10_000  # a process forgets them all past this (tokens in use are few)
_UNSEEN = object()  # the tag of an entry loaded before this process read any generation


@dataclass
class _Entry:
    token: ApiToken
    tag: object


_entries: dict[str, _Entry] = {}  # by the key's digest (`key_parts`)
_teams: dict[tuple[int, bool, str], tuple[Team | None, object]] = {}
_last_seen: list[object] = [_UNSEEN]


def generation_bump() -> None:
    """Every process reads its tokens, users and teams again from its next request. Run
    once the change has committed (queueing/signals.py queues it with on_commit)."""
    client = redis_client()
    if client is not None:
        client.incr(cache.make_key(GENERATION_KEY))
        return
    if not cache.add(GENERATION_KEY, 1, None):
        try:
            cache.incr(GENERATION_KEY)
        except ValueError:
            cache.add(GENERATION_KEY, 1, None)


def token_seen(key: str) -> tuple[ApiToken, bool] | None:
    """The token of `key` as this process last saw it (under any generation), or else as
    read from the database now (then remembered, tagged with the generation last seen);
    None when no token has that key. Its user names the rate-limit bucket of the one
    round trip that reads the generation; it is not checked here: `token_lookup` hands it
    to `authenticate_key`. The flag: True when it came from memory."""
    parts = key_parts(key)
    if parts is None:
        return None
    prefix, digest = parts
    entry = _entries.get(digest)
    if entry is not None:
        return entry.token, True
    token = _load(prefix, digest, _last_seen[0])
    return (token, False) if token is not None else None


def token_lookup(generation: object, seen: tuple[ApiToken, bool]) -> TokenLookup:
    """`authenticate_key`'s lookup, given the `generation` just read from the cache and
    what `token_seen` found: the token read from the database for this request as it
    is; one remembered under another generation read again."""
    _last_seen[0] = generation
    token, remembered = seen

    def lookup(prefix: str, digest: str) -> ApiToken | None:
        if not remembered:
            return token
        entry = _entries.get(digest)
        if entry is not None and entry.tag == generation:
            return entry.token
        return _load(prefix, digest, generation)

    return lookup


def _load(prefix: str, digest: str, tag: object) -> ApiToken | None:
    token = api_token_for_key(prefix=prefix, digest=digest)
    if token is None:
        _entries.pop(digest, None)
        return None
    if len(_entries) >= MAX_ENTRIES:
        _entries.clear()
    _entries[digest] = _Entry(token=token, tag=tag)
    return token


def team_remembered(user: Any, slug: str, generation: object) -> Team | None:
    """`team_for_submitter(user=user, slug=slug)`, remembered under `generation` (read
    from the cache before this call); None is remembered too."""
    key = (user.pk, bool(user.is_staff), slug)
    found = _teams.get(key)
    if found is not None and found[1] == generation:
        return found[0]
    team = team_for_submitter(user=user, slug=slug)
    if len(_teams) >= MAX_ENTRIES:
        _teams.clear()
    _teams[key] = (team, generation)
    return team


def forget_tokens() -> None:
    """Drop every remembered token and team (tests: `queueing.memo.forget_all`)."""
    _entries.clear()
    _teams.clear()
    _last_seen[0] = _UNSEEN


on_forget(forget_tokens)
