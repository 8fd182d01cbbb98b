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


def interleaved_times(calls, repeat, stat=statistics.median, clock=time.perf_counter):
    """``stat`` of the times of each ``call()`` in ``calls`` (name -> (call, refill))
    over ``repeat`` rounds, measured with ``clock``.  The calls take turns within each
    round, so that load from other processes affects them alike; ``refill()`` (or None)
    runs untimed before each call; the cyclic garbage collector is paused meanwhile."""
    import gc
    times = {name: [] for name in calls}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for name, (call, refill) in calls.items():
                if refill is not None:
                    refill()
                t0 = clock()
                call()
                times[name].append(clock() - t0)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: stat(ts) for name, ts in times.items()}
