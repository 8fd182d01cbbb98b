"""The backward of a tape of CUDA launches, on the device and on several streams.

Every adjoint buffer lives where its array lives and is zeroed there; seeds are placed
there; repeated-argument buffers are added there (:mod:`kadj.arrays`); scalar adjoints
of launches on device arrays are device arrays, read back only when
``tape.scalar_grads()`` asks.  So the backward of a tape of launches on device arrays
makes no device-to-host copy and does not wait for the device.

With one stream, the adjoints run in reverse order on the default stream (which the
streams numba creates synchronise with).  With ``k > 1`` streams, they follow
:func:`kadj.tape_graph.schedule`: each adjoint is launched on its stream after waiting
on the events of the launches it depends on; the streams first wait for the work
already queued (on the default stream and on the streams the forward launches were
recorded with), and at the end the default stream waits for all of them, so what comes
after the backward (``tape.grad``) sees the finished gradients.  Barriers (host code:
checkpointed loops, custom steps, CPU launches, launches on host arrays) run after a
host synchronisation of the streams, and later adjoints wait for the default stream.

The ``k`` streams are the same at every backward from one host thread on one device
(:func:`_streams`): creating streams costs a driver call each, and a gather-form
adjoint keeps its block sums' slots per stream (:mod:`kadj.cuda.slots`), so new
streams at every backward would each get a new slots array.  Reusing them is safe:
each backward first makes its streams wait for the work already queued, and ends with
the default stream waiting for them.
"""
from __future__ import annotations

import threading

from .buffer_pool import _device_id
from .tape_graph import schedule

__all__ = ["run"]

_lock = threading.Lock()
# (device, host thread) -> the streams made there so far
_pool = {}


def run(tape, launches, buffers, scalars, count, barrier):
    """Replay the adjoints of ``launches`` (in tape order) of ``tape`` on ``count``
    streams, accumulating into ``buffers`` and ``scalars``."""
    from numba import cuda
    if count == 1:
        stream = cuda.default_stream()
        for launch in reversed(launches):
            if barrier(launch):
                tape._replay(launch, buffers, scalars)
            else:
                tape._replay(launch, buffers, scalars, stream)
        return
    nodes = schedule(launches, count, barrier)
    by_index = {launch.index: launch for launch in launches}
    streams = _streams(cuda, count)
    default = cuda.default_stream()
    for queue in [default, *_recorded_streams(tape._launches)]:
        ready = _event(cuda)
        ready.record(stream=queue)
        for s in streams:
            ready.wait(stream=s)
    events = {}
    for node in nodes:
        launch = by_index[node.launch]
        if node.barrier:
            for s in streams:
                s.synchronize()
            tape._replay(launch, buffers, scalars)
            if node.record:
                events[node.launch] = done = _event(cuda)
                done.record(stream=default)
            continue
        s = streams[node.stream]
        for d in node.waits:
            events[d].wait(stream=s)
        tape._replay(launch, buffers, scalars, s)
        if node.record:
            events[node.launch] = done = _event(cuda)
            done.record(stream=s)
    for s in streams:
        done = _event(cuda)
        done.record(stream=s)
        done.wait(stream=default)


def _streams(cuda, count):
    """``count`` streams of this device for this host thread, the same ones at every
    call (made when first needed)."""
    key = (_device_id(), threading.get_ident())
    with _lock:
        made = _pool.setdefault(key, [])
        while len(made) < count:
            made.append(cuda.stream())
        return made[:count]


def _event(cuda):
    try:
        return cuda.event(timing=False)
    except TypeError:          # the simulator's events take no arguments
        return cuda.event()


def _recorded_streams(launches):
    """The distinct streams the forward launches were recorded with."""
    found = []
    for launch in launches:
        config = launch.config
        if config is not None and len(config) > 2 and config[2] is not None and \
                not isinstance(config[2], int) and all(config[2] is not s for s in found):
            found.append(config[2])
    return found
