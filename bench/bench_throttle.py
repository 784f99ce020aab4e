"""The API rate limit's cost per request, before and after the one-round-trip
bucket, alternated in one process against the same Redis.

  * before: django-ratelimit's `get_usage` (cache.add = SET NX, then django-redis' incr =
    an EVAL carrying its script's text): what queueing/api/throttling.py did before
    this bucket;
  * after: `throttling.hit` (one EVALSHA of an INCR+EXPIRE script).

Redis is $REDIS_URL (else the local one at 127.0.0.1:6379/0); without a Redis it says so
and exits 0. Output: BENCH throttle_{before,after}_us (median of `--rounds` rounds of
`--calls` calls, per call), throttle_{before,after}_redis_calls (commands per request)
and throttle_speedup.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note  # noqa: E402  (bench/ is sys.path[0])
from bench_api import local_redis_url  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args()
    redis = local_redis_url()
    if not redis:
        note("skipping the throttle bench: it measures Redis round trips (no Redis found)")
        return 0
    os.environ["REDIS_URL"] = redis
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from django.test import RequestFactory
    from django_ratelimit.core import get_usage
    from redis import Redis

    from queueing.api import throttling

    request = RequestFactory().post("/api/v1/jobs/")
    ident = f"bench-{os.getpid()}"

    def before() -> None:
        get_usage(request, group="fairq-api-token", key=lambda _g, _r: ident,
                  rate="100000000/min", increment=True)

    def after() -> None:
        throttling.hit(f"fairq-api-token:{ident}", 60)

    sides = {"before": before, "after": after}
    commands = {}
    real = Redis.execute_command
    for name, fn in sides.items():
        fn()  # warm: the script loaded, the connection open
        calls = [0]

        def counting(self: Redis, *args: object, _c: list[int] = calls, **kw: object) -> object:
            _c[0] += 1
            return real(self, *args, **kw)

        Redis.execute_command = counting  # type: ignore[method-assign]
        for _ in range(10):
            fn()
        Redis.execute_command = real  # type: ignore[method-assign]
        commands[name] = calls[0] / 10
    times: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(a.rounds):
        for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
            fn = sides[name]
            t0 = time.perf_counter()
            for _ in range(a.calls):
                fn()
            times[name].append((time.perf_counter() - t0) / a.calls * 1e6)
    for name in sides:
        bench(f"throttle_{name}_us", statistics.median(times[name]), "us")
        bench(f"throttle_{name}_redis_calls", commands[name], "calls")
    bench("throttle_speedup", statistics.median(times["before"]) / statistics.median(times["after"]), "x")
    bench("host_load_average_1m", os.getloadavg()[0], "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
