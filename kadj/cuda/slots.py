"""The slots arrays of the gather form (:mod:`kadj.cuda.block_sum`): the gather kernel
adds each block's sum of a scalar adjoint into one of its row's slots, and the consume
kernel, launched right after it on the same stream, sums the row into the scalar's
buffer and sets it to zero again.  So one array per device, stream and host thread,
zeroed once when it is made, serves every gather-form launch there: launches on one
stream from one host thread run in the order they were issued, each consume after its
own gather; launches on other streams or from other threads get other arrays.

A launch that fails after its gather kernel was issued (before the consume kernel)
would leave sums in the slots: :func:`launch` drops the array then, and the next launch
gets a fresh one.  At most :data:`KEEP` arrays are kept (the least recently used goes);
each holds its stream, so a stream's handle is not reused while its array is kept.
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from .block_sum import SLOTS, STRIDE

KEEP = 64

_lock = threading.Lock()
_arrays = collections.OrderedDict()   # (device, stream, thread, rows) -> device array


def _key(config, rows):
    from ..buffer_pool import _device_id
    stream = config[2] if len(config) > 2 else 0
    return (_device_id(), 0 if stream is None else stream, threading.get_ident(), rows)


def _take(key, rows):
    with _lock:
        a = _arrays.get(key)
        if a is not None:
            _arrays.move_to_end(key)
            return a
    from numba import cuda
    a = cuda.to_device(np.zeros((rows, SLOTS * STRIDE), np.float64))
    with _lock:
        _arrays[key] = a
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
    key = _key(config, rows)
    slots = _take(key, rows)
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
