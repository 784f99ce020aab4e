"""The garbage collector of a web process (docs/performance.md, "The dashboard's p95 and
staff's reports again").

At the fleet's size a web process keeps large reads between requests (the published
plan, the quota forest, the standings, the usage series, the reports' kept sums and live
days) beside Django's own modules, classes and functions: a few hundred thousand objects
that each full pass of the collector walks. With the default thresholds a staff reports
request (5,000 running attempts, tens of thousands of objects alive at once) promoted
enough of them to set off a full pass every three or four requests, 0.3 s each on the
loaded 2-core machine; a dashboard request one now and then, of 0.26-1.1 s.

`collector_setup`, once the application is loaded: what is alive then (code, settings,
URL patterns: for the life of the process) is collected and frozen (`gc.freeze`: left
out of later passes), and the youngest generation is collected after GEN0_THRESHOLD
allocations instead of 700, so that a request's objects mostly die (by reference count)
before a pass sees them, and few are promoted. Nothing is kept alive longer: an object
no longer referred to is freed at once as before; only cyclic garbage waits for a pass.
(TUNED False: the collector as Python sets it, for the bench's before side.)
"""

from __future__ import annotations

import gc

TUNED = True
GEN0_THRESHOLD = 50_000


def collector_setup() -> bool:
    """Freeze what is alive and raise the youngest generation's threshold (above);
    whether it did (not with `TUNED` off)."""
    if not TUNED:
        return False
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
    return True
