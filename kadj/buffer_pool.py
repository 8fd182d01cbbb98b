"""A pool of device buffers for the adjoint buffers of numba device arrays.

A tape's backward needs a zeroed buffer for every array it differentiates; allocating
each one from the device (``cudaMalloc``/``cudaFree``) on every backward costs more than
the small adjoint kernels themselves.  :func:`zeros` hands out zeroed numba device
arrays carved from blocks kept by size, ``(device id, nbytes)``: a block comes back to
the pool when the last array (or view) over it is garbage collected -- for a tape's
gradient buffers, on ``tape.zero()``, ``tape.reset()`` or when the tape is collected,
never while a user can still see them (``tape.grad`` returns copies) -- and is handed
out again by a later backward of any tape.

Bounded: the pool keeps at most :func:`limit` bytes of free blocks per device (blocks
in use are not counted); a block released beyond it goes back to numba's allocator.
The default is 25% of the device's free memory when the pool is first used there
(256 MiB in the CUDA simulator); ``KADJ_BUFFER_POOL_BYTES`` or :func:`set_limit`
change it, and 0 turns the pool off.  :func:`clear` frees the kept blocks;
:func:`stats` counts hits (a kept block reused), misses (a new allocation) and bytes.

Streams.  A buffer is zeroed on the stream that uses it (asynchronously), as a fresh
one would be.  A block released while work on it may still be queued becomes
reusable only after an event recorded on the legacy default stream (which orders it
after all work already issued to blocking streams: numba's own streams and the
backward's) and waited on by the stream that zeroes it; no host synchronisation.

CuPy arrays use CuPy's own memory pool (``cupy.zeros``) and NumPy arrays plain
``np.zeros``: neither goes through this module.  Blocks are allocated through
``numba.cuda.current_context().memalloc``, so an external memory manager configured
for numba (an EMM plugin) still provides the memory.
"""
from __future__ import annotations

import atexit
import collections
import functools
import math
import os
import threading

import numpy as np

__all__ = ["clear", "empty", "limit", "set_limit", "stats", "zeros"]

SIMULATOR_DEFAULT_LIMIT = 256 << 20
DEFAULT_FRACTION = 0.25

_lock = threading.Lock()
_free = {}            # (device, nbytes) -> [(block, event or None)], newest last
_kept = collections.Counter()      # device -> bytes of free blocks kept
_limits = {}          # device -> byte limit
_limit_override = None
_released = collections.deque()    # (key, block) released, not yet sorted into _free
_leases = {}          # id(lease) -> lease, the handed-out pointers kept alive
_counts = collections.Counter()


@functools.lru_cache(maxsize=1)
def _simulated():
    from numba import config
    return bool(config.ENABLE_CUDASIM)


def _env_limit():
    text = os.environ.get("KADJ_BUFFER_POOL_BYTES")
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"KADJ_BUFFER_POOL_BYTES must be a number of bytes, not "
                         f"{text!r}") from None
    if value < 0:
        raise ValueError("KADJ_BUFFER_POOL_BYTES must not be negative")
    return value


def set_limit(nbytes):
    """Keep at most ``nbytes`` of free blocks per device (None: the default); blocks
    kept beyond a lowered limit are freed now."""
    global _limit_override
    if nbytes is not None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"the buffer pool limit must be a non-negative number of "
                             f"bytes (or None), not {nbytes!r}")
    with _lock:
        _limit_override = nbytes
        _limits.clear()
        for device in list(_kept):
            _trim(device, _limit_of(device))


def limit(device=None):
    """The byte limit of free blocks kept for ``device`` (the current one without
    it)."""
    with _lock:
        return _limit_of(_device_id() if device is None else device)


def _limit_of(device):
    if _limit_override is not None:
        return _limit_override
    found = _limits.get(device)
    if found is None:
        found = _env_limit()
        if found is None:
            if _simulated():
                found = SIMULATOR_DEFAULT_LIMIT
            else:
                from numba import cuda
                free, _ = cuda.current_context().get_memory_info()
                found = int(free * DEFAULT_FRACTION)
        _limits[device] = found
    return found


def stats():
    """A dict: ``hits`` and ``misses`` of :func:`zeros`, ``kept_bytes`` (free blocks
    held now, all devices), ``kept_blocks`` and ``in_use`` (blocks handed out and not
    yet released)."""
    with _lock:
        _sort_released()
        return {"hits": _counts["hits"], "misses": _counts["misses"],
                "kept_bytes": sum(_kept.values()),
                "kept_blocks": sum(len(v) for v in _free.values()),
                "in_use": _counts["leased"] - _counts["returned"]}


def clear():
    """Free every kept block (blocks in use come back, and are kept, as usual)."""
    with _lock:
        _sort_released()
        _free.clear()
        _kept.clear()


atexit.register(clear)      # free kept blocks while numba's contexts are still alive


def _device_id():
    if _simulated():
        return 0
    from numba import cuda
    return cuda.current_context().device.id


def zeros(shape, dtype, stream=None):
    """A C-contiguous numba device array (a simulator array in the CUDA simulator) of
    zeros, from the pool.  ``stream``: zero it asynchronously on that stream, for work
    on it; without it the zeroing is finished before this returns."""
    return _take(shape, dtype, stream, True)


def empty(shape, dtype, stream=None):
    """Like :func:`zeros`, not zeroed (for a buffer about to be overwritten): its
    contents are undefined.  ``stream``: the stream that will write it."""
    return _take(shape, dtype, stream, False)


def _take(shape, dtype, stream, zero):
    shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        from numba import cuda
        return cuda.device_array(shape, dtype)
    device = _device_id()
    key = (device, nbytes)
    with _lock:
        _sort_released()
        kept = _free.get(key)
        if kept:
            block, ready = kept.pop()
            _kept[device] -= nbytes
            _counts["hits"] += 1
        else:
            block, ready = None, None
            _counts["misses"] += 1
    if _simulated():
        return _simulator_take(key, block, shape, dtype, zero)
    return _device_take(key, block, ready, shape, dtype, stream, zero)


def _simulator_take(key, block, shape, dtype, zero):
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    if block is None:
        block = np.empty(key[1], np.uint8)
    if zero:
        block.fill(0)
    out = FakeCUDAArray(block.view(dtype).reshape(shape))
    _lease_out(out, key, block)
    return out


def _device_take(key, block, ready, shape, dtype, stream, zero):
    from numba import cuda
    from numba.cuda.cudadrv import devicearray, driver
    ctx = cuda.current_context()
    if block is None:
        block = ctx.memalloc(key[1])
    lease = driver.AutoFreePointer(ctx, block.device_pointer, key[1],
                                   finalizer=lambda: None)
    strides, step = [], dtype.itemsize
    for n in reversed(shape):
        strides.insert(0, step)
        step *= max(n, 1)
    if ready is not None:
        ready.wait(stream=stream if stream is not None else cuda.default_stream())
    out = devicearray.DeviceNDArray(shape, tuple(strides), dtype, gpu_data=lease.own())
    _lease_out(lease, key, block)
    if not zero:
        return out
    if stream is None:
        driver.device_memset(out, 0, key[1])
        cuda.default_stream().synchronize()
    else:
        driver.device_memset(out, 0, key[1], stream=stream)
    return out


def _lease_out(owner, key, block):
    """Hand ``block`` out through ``owner``: when ``owner`` dies (on a device: when the
    last view over it dies), the block is released."""
    import weakref
    with _lock:
        _counts["leased"] += 1
        if not _simulated():
            _leases[id(owner)] = owner
    if not _simulated():
        # numba calls an AutoFreePointer's finalizer when its reference count (the
        # arrays and views over it) drops to zero: release the block then
        owner._finalizer.detach()
        owner._finalizer = weakref.finalize(owner, _release, key, block, id(owner))
        # at exit numba's own finalizers free it (and so call this one) in their turn
        owner._finalizer.atexit = False
    else:
        weakref.finalize(owner, _release, key, block, id(owner)).atexit = False


def _release(key, block, lease_id):
    # runs from a finalizer, perhaps inside a locked section of this module: only an
    # atomic append here, sorted into the pool by the next call that takes the lock
    _released.append((key, block, lease_id))


def _sort_released():
    """Move released blocks into the pool (the lock held)."""
    if not _released:
        return
    event = None
    while _released:
        key, block, lease_id = _released.popleft()
        _leases.pop(lease_id, None)
        _counts["returned"] += 1
        device, nbytes = key
        if _kept[device] + nbytes > _limit_of(device):
            continue                       # beyond the limit: back to numba's allocator
        if event is None and not _simulated():
            event = _release_event()
        _free.setdefault(key, []).append((block, event))
        _kept[device] += nbytes


def _release_event():
    """An event after every piece of work already issued to blocking streams."""
    from numba import cuda
    try:
        event = cuda.event(timing=False)
    except TypeError:
        event = cuda.event()
    event.record(stream=cuda.legacy_default_stream())
    return event


def _trim(device, cap):
    """Free kept blocks of ``device`` until at most ``cap`` bytes remain (the lock
    held)."""
    for key in [k for k in _free if k[0] == device]:
        kept = _free[key]
        while kept and _kept[device] > cap:
            kept.pop(0)
            _kept[device] -= key[1]
        if not kept:
            del _free[key]
