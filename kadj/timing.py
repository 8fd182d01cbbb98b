"""One timer for kadj's cost card, demo and benchmark scripts: the median of repeated
calls, each optionally preceded by an untimed ``before()`` (refilling inputs)."""
from __future__ import annotations

import statistics
import time


def median_time(fn, repeat=3, before=None, clock=time.perf_counter):
    """Median seconds of ``repeat`` calls of ``fn()`` measured with ``clock``;
    ``before()``, when given, runs untimed before each call."""
    times = []
    for _ in range(max(1, int(repeat))):
        if before is not None:
            before()
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return float(statistics.median(times))
