"""API tokens (and the teams their users submit to) remembered by each web process,
revocation still immediate.

`TokenAuthentication` reads the token and its user from the database on every request.
The submit fast path (queueing/api/jobs.py) keeps what it read per process, keyed by the
key's hash, tagged with the *token generation*: a counter in the cache (Redis in
production, shared by every process) that goes up once any token or user changes and the
change has committed (`auth_generation_bump`, connected in queueing/signals.py). The
generation is read on every request in the same round trip as the rate limit; an entry
whose tag differs is read again from the database before it is believed. So a revoked or
expired token, a deactivated user or one whose staff flag changed is refused from the
first request after the change committed, as before.

The tag is a generation read *before* the database read that loaded the entry: a change
that commits after that read bumps the generation past the tag, and the next request
reads the entry again.

The same holds for `team_remembered`: the team row a user may submit to (with its
defaults, maxima, allowlists and budget flag), forgotten when a team, a membership or a
team budget changes. Membership is also the job INSERT's own condition, so even a
remembered row never lets a former member queue a job.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import transaction

from accounts.models import ApiToken, Team
from accounts.selectors import api_token_with_user
from queueing.memo import on_forget
from queueing.selectors.lookups import team_for_submitter

GENERATION_KEY = "fq-auth-gen"
MAX_ENTRIES = 10_000  # a process forgets them all past this (tokens in use are few)
_UNSEEN = object()  # the tag of an entry loaded before this process read any generation


@dataclass
class _Entry:
    token: ApiToken
    tag: object


_entries: dict[str, _Entry] = {}
_teams: dict[tuple[int, bool, str], tuple[Team | None, object]] = {}
_last_seen: list[object] = [_UNSEEN]


def auth_generation_bump(**_kwargs: Any) -> None:
    """Once the current transaction commits (at once outside one), every process reads
    its tokens and users again. A signal receiver (post_save / post_delete of ApiToken
    and the user model): a user's own login (`last_login` alone) does not bump."""
    fields = _kwargs.get("update_fields")
    if fields is not None and set(fields) <= {"last_login"}:
        return
    transaction.on_commit(_bump)


def _bump() -> None:
    from .throttling import _redis_client

    client = _redis_client()
    if client is not None:
        client.incr(cache.make_key(GENERATION_KEY))
        return
    if not cache.add(GENERATION_KEY, 1, None):
        try:
            cache.incr(GENERATION_KEY)
        except ValueError:
            cache.add(GENERATION_KEY, 1, None)


def token_remembered(key: str) -> tuple[ApiToken, bool] | None:
    """The token of `key` with its user, from this process's memory or else the database
    (then remembered, tagged with the generation last seen); None when there is no such
    token or the key does not match (the caller lets `TokenAuthentication` answer). The
    flag: True when it came from memory (`token_current` checks it against the
    generation)."""
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != "fq":
        return None
    digest = ApiToken.hash_key(key)
    entry = _entries.get(digest)
    if entry is not None:
        return entry.token, True
    token = _load(parts[1], digest, _last_seen[0])
    return (token, False) if token is not None else None


def token_current(key: str, token: ApiToken, remembered: bool, generation: object
                  ) -> ApiToken | None:
    """`token` as it is now, given the `generation` just read from the cache: an entry
    remembered under another generation is read again (None if it is gone)."""
    _last_seen[0] = generation
    if not remembered:
        return token
    digest = ApiToken.hash_key(key)
    entry = _entries.get(digest)
    if entry is not None and entry.tag == generation:
        return entry.token
    return _load(key.split("_", 2)[1], digest, generation)


def _load(prefix: str, digest: str, tag: object) -> ApiToken | None:
    token = api_token_with_user(prefix=prefix)
    # Compare in constant time so the hash cannot be probed byte by byte.
    if token is None or not hmac.compare_digest(token.key_hash, digest):
        _entries.pop(digest, None)
        return None
    if len(_entries) >= MAX_ENTRIES:
        _entries.clear()
    _entries[digest] = _Entry(token=token, tag=tag)
    return token


def token_usable(token: ApiToken, now: datetime) -> bool:
    """What `TokenAuthentication.authenticate_key` demands: not revoked, not expired,
    its user active. Touches `last_used_at` at most once a minute, as it does."""
    if not token.is_active(now) or not token.user.is_active:
        return False
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return True


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
