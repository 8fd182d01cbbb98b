"""The slots arrays of the gather form (:mod:`kadj.cuda.block_sum`): the gather kernel
adds each block's sum of a scalar adjoint into one of its row's slots, and the consume
kernel, launched right after it on the same stream, sums the row into the scalar's
buffer and sets it to zero again.  So one array per device, stream and host thread,
zeroed once when it is made, serves every gather-form launch there: launches on one
stream from one host thread run in the order they were issued, each consume after its
own gather; launches on other streams or from other threads get other arrays.

A launch that fails after its gather kernel was issued (before the consume kernel)
would leave sums in the slots: :func:`launch` drops the array then, and the next launch
gets a fresh one.  Streams are told apart by their handles; at most :data:`KEEP` arrays
are kept (the least recently used goes), each with its stream object, so a stream's
handle is not reused while its array is kept.
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from ..buffer_pool import _device_id, _simulated
from .block_sum import SLOTS, STRIDE

KEEP = 64

_lock = threading.Lock()
# (device, stream handle, thread, rows) -> (device array, stream)
_arrays = collections.OrderedDict()


def _stream(config):
    """(the launch's stream or 0, its handle): streams are told apart by their
    handles (numba makes a new object for the default stream at every call)."""
    stream = config[2] if len(config) > 2 else 0
    if stream is None or isinstance(stream, int):
        return 0, int(stream or 0)
    if _simulated():     # the simulator runs each launch at once, and has no handles
        return stream, 0
    return stream, int(stream)


def _key(config, rows, handle=None):
    if handle is None:
        handle = _stream(config)[1]
    return (_device_id(), handle, threading.get_ident(), rows)


def _take(key, stream, rows):
    with _lock:
        kept = _arrays.get(key)
        if kept is not None:
            _arrays.move_to_end(key)
            return kept[0]
    from numba import cuda
    a = cuda.to_device(np.zeros(rows * SLOTS * STRIDE, np.float64))
    with _lock:
        # (the stream object is kept too: its handle is not reused while it lives)
        _arrays[key] = (a, stream)
        while len(_arrays) > KEEP:
            _arrays.popitem(last=False)
    return a


def launch(kernels, config, args, rows):
    """Launch the gather form's two ``kernels`` with ``config`` on ``args`` and, when
    ``rows``, the slots array of this device, stream and thread as the last argument."""
    if not rows:
        kernels[0][config](*args)
        kernels[1][config](*args)
        return
    stream, handle = _stream(config)
    key = _key(config, rows, handle)
    slots = _take(key, stream, rows)
    done = False
    try:
        kernels[0][config](*args, slots)
        kernels[1][config](*args, slots)
        done = True
    finally:
        if not done:
            with _lock:
                _arrays.pop(key, None)


def clear():
    """Forget every kept slots array."""
    with _lock:
        _arrays.clear()
