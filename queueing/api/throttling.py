"""Rate limits of API v1: one bucket per user (all their tokens and their session share
it), one per client address (`accounts.client_ip.client_ip`) for anonymous requests.
Buckets live in the cache: Redis in production, so every web process shares them; local
memory elsewhere (per process).

Each bucket is a fixed-window counter (as django-ratelimit counts: the windows of
different buckets staggered), so a request costs the same whatever the rate.
DRF's own SimpleRateThrottle keeps a list of every request's time in the window and
rewrites it on each request: at the default 6,000/min a busy pipeline token moved ~50 KB
to and from Redis per request. The price of a fixed window is that a client may send up
to twice its rate across a window's edge.

One Redis round trip per request: the bucket is counted by a Lua script
(INCR, and EXPIRE when the INCR created it) run with EVALSHA, where django-ratelimit's
`cache.add` then django-redis' `incr` took two (SET NX, then an EVAL carrying the script's
text). For an authenticated request only the user's bucket applies and for an anonymous
one only the address's, so each request makes one call whichever throttle counts it.
Other caches (local memory in tests and the demo) count through `cache.add` +
`cache.incr` as before."""

from __future__ import annotations

import time
import zlib
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.cache import cache
from rest_framework.throttling import BaseThrottle

from accounts.client_ip import client_ip

if TYPE_CHECKING:  # rest_framework.views imports the throttle classes: no runtime import
    from rest_framework.request import Request


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# In the request's environ (META): (bucket, count, seconds left) of a hit already made for
# it by the submit fast path before it handed the request over.
COUNTED_ATTR = "fairq_rate_counted"
_EXPIRY_FUDGE = 5  # seconds a bucket outlives its window (clock skew between processes)

# KEYS[1]: the bucket; ARGV[1]: its lifetime in seconds; then GET of each further key
# (false: absent). Returns {the count after this hit, the values}. With further keys it is
# the submit fast path's one round trip (queueing/api/jobs.py): the user's bucket counted,
# the token generation (queueing/api/auth_cache.py) read with it.
_HIT_READ_LUA = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
local out = {n}
for i = 2, #KEYS do out[i] = redis.call('GET', KEYS[i]) or false end
return out
"""
_scripts: dict[tuple[int, str], Any] = {}


def split_rate(rate: str) -> tuple[int, int]:
    """'6000/min' -> (6000, 60): the form config/settings/api.py accepts (a count, then
    a period whose first letter is s, m, h or d)."""
    count, _, per = rate.partition("/")
    return int(count), _UNITS[per[0]]


def _window_end(ident: str, period: int, now: int) -> int:
    """The end of the fixed window `now` falls in; buckets' windows are staggered by a
    hash of their key, so they do not all reset at once (as in django-ratelimit)."""
    w = now - now % period + zlib.crc32(ident.encode()) % period
    return w + period if w < now else w


def hit(bucket: str, period: int) -> tuple[int, int]:
    """Count one request in `bucket`'s current window of `period` seconds; returns (the
    window's count including this request, seconds until the window ends). One Redis
    round trip when the cache is Redis."""
    count, left, _ = hit_and_read(bucket, period, [])
    return count, left


def hit_and_read(bucket: str, period: int, reads: list[str]) -> tuple[int, int, list[Any]]:
    """`hit`, and the cache's values of the keys `reads` (None when absent; a Redis value
    as the bytes stored, which for the integers counted here is their digits), in the
    same round trip when the cache is Redis."""
    now = int(time.time())
    end = _window_end(bucket, period, now)
    key = f"fq-rl:{bucket}:{end}"
    lifetime = end - now + _EXPIRY_FUDGE
    client = redis_client()
    if client is not None:
        script = _script(client, _HIT_READ_LUA)
        out = script(keys=[cache.make_key(key), *map(cache.make_key, reads)], args=[lifetime])
        values = [*out[1:], *[None] * (len(reads) + 1 - len(out))]
        return int(out[0]), end - now, values
    count = _hit_cache(key, lifetime)
    got = cache.get_many(reads)
    return count, end - now, [got.get(k) for k in reads]


def _script(client: Any, text: str) -> Any:
    script = _scripts.get((id(client), text))
    if script is None:
        script = _scripts[(id(client), text)] = client.register_script(text)
    return script


def _hit_cache(key: str, lifetime: int) -> int:
    if cache.add(key, 1, lifetime):
        return 1
    try:
        return int(cache.incr(key))
    except ValueError:  # expired between add and incr: this request opens the bucket
        cache.add(key, 1, lifetime)
        return 1


def redis_client() -> Any:
    """The raw redis-py client behind the default cache when it is django-redis, else
    None."""
    inner = getattr(cache, "client", None)
    get_client = getattr(inner, "get_client", None)
    return get_client(write=True) if get_client is not None else None


class _FixedWindowThrottle(BaseThrottle):
    group = ""

    def rate(self) -> str | None:
        raise NotImplementedError

    def ident(self, request: Request) -> str | None:
        """The bucket of this request; None: this throttle does not apply."""
        raise NotImplementedError

    def allow_request(self, request: Request, view: Any) -> bool:
        self._wait: float | None = None
        rate = self.rate()
        ident = self.ident(request) if rate else None
        if rate is None or ident is None:
            return True
        limit, period = split_rate(rate)
        counted = request.META.get(COUNTED_ATTR)
        if counted is not None and counted[0] == f"{self.group}:{ident}":
            # The submit fast path counted this request already and handed it over.
            count, time_left = counted[1], counted[2]
        else:
            count, time_left = hit(f"{self.group}:{ident}", period)
        if count <= limit:
            return True
        self._wait = max(1, time_left)
        return False

    def wait(self) -> float | None:
        return self._wait


class TokenRateThrottle(_FixedWindowThrottle):
    """`FAIRQ_API_RATE` (e.g. "6000/min") per user: issuing more tokens does not buy a
    higher rate."""

    group = "fairq-api-token"

    def rate(self) -> str | None:
        return str(settings.FAIRQ_API_RATE) if settings.FAIRQ_API_RATE else None

    def ident(self, request: Request) -> str | None:
        if request.user and request.user.is_authenticated:
            return f"user-{request.user.pk}"
        return None


class AnonymousRateThrottle(_FixedWindowThrottle):
    """`FAIRQ_API_ANON_RATE` per client address for requests without credentials."""

    group = "fairq-api-anon"

    def rate(self) -> str | None:
        return str(settings.FAIRQ_API_ANON_RATE) if settings.FAIRQ_API_ANON_RATE else None

    def ident(self, request: Request) -> str | None:
        if request.user and request.user.is_authenticated:
            return None
        return client_ip(request)
