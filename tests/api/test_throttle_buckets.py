"""The rate-limit buckets of API v1 (queueing/api/throttling.py): a fixed window
counted in one Redis round trip when the cache is Redis, through cache.add/incr otherwise."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.conf import settings

from queueing.api import throttling


def test_a_bucket_counts_each_hit_and_says_when_its_window_ends() -> None:
    bucket = f"test-{uuid.uuid4().hex}"
    counts = [throttling.hit(bucket, 3600) for _ in range(3)]
    assert [c for c, _ in counts] == [1, 2, 3]
    assert all(0 <= left <= 3600 for _, left in counts)
    assert throttling.hit(f"other-{uuid.uuid4().hex}", 3600)[0] == 1  # buckets are apart


def test_the_window_is_fixed_and_staggered_per_bucket() -> None:
    now = 1_000_000_000
    end = throttling._window_end("user-1", 60, now)
    assert now <= end < now + 60
    assert throttling._window_end("user-1", 60, end - 1) == end  # same window until its end
    assert throttling._window_end("user-1", 60, end + 1) == end + 60
    ends = {throttling._window_end(f"user-{i}", 60, now) for i in range(20)}
    assert len(ends) > 1  # not every bucket resets at the same second


@pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis (set REDIS_URL)")
def test_with_redis_a_hit_is_one_round_trip_and_the_bucket_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from redis import Redis

    client = throttling.redis_client()
    assert client is not None
    bucket = f"test-{uuid.uuid4().hex}"
    throttling.hit(bucket, 60)  # the first loads the script into Redis (NOSCRIPT once)
    calls: list[tuple[Any, ...]] = []
    real = Redis.execute_command

    def counting(self: Redis, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Redis, "execute_command", counting)
    count, left = throttling.hit(bucket, 60)
    assert count == 2
    assert [c[0] for c in calls] == ["EVALSHA"]
    key = calls[0][3]  # EVALSHA sha numkeys key lifetime
    assert 0 < client.ttl(key) <= left + throttling._EXPIRY_FUDGE
