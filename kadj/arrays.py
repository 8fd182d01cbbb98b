"""Every kind of array kadj accepts, handled in one place.

Kinds (:func:`kind`):

``"host"``       NumPy arrays (and subclasses).
``"simulator"``  the CUDA simulator's device arrays (``NUMBA_ENABLE_CUDASIM=1``), which
                 wrap a NumPy array in ``_ary``: their memory is host memory.
``"cupy"``       CuPy arrays.
``"device"``     numba device arrays, and anything else exporting
                 ``__cuda_array_interface__`` (read through that interface; copies
                 and buffers made for them are numba device arrays).

Memory.  Arrays live in one of two memory spaces: host memory (NumPy and simulator
arrays) and device memory (CuPy and other device arrays, located by their pointer,
shape and strides).  Arrays in different spaces never overlap.  :func:`memory` gives an
array's memory as an ndarray over it (for device memory a phantom, built over the device
pointer and read by nothing but the overlap tests), so one exact test serves every
kind: ``np.may_share_memory`` (bounds only) first, then ``np.shares_memory`` with a
bounded effort (:data:`MAX_OVERLAP_WORK`); crafted views with large co-prime strides
make the exact test take many seconds, and when the bounded test gives up,
:class:`Undecided` is raised for the caller to refuse (or assume an overlap).

Data.  :func:`copy`, :func:`like`, :func:`zeros_like` and :func:`add_into` keep data
where the array lives (the same kind, the same device); :func:`to_host` brings it to a
NumPy array.  Numba device arrays are zeroed and added on the device (:func:`add_into`
runs a small CUDA kernel of :mod:`kadj.device_ops`), on a given stream when the caller
passes one.  :func:`zeros` and :func:`filled` take numba device (and simulator) arrays
from :mod:`kadj.buffer_pool`, CuPy arrays from CuPy's memory pool, NumPy arrays from
NumPy.  ``numba.cuda`` and ``cupy`` are imported
only for arrays of their kinds.
"""
from __future__ import annotations

import math
import types as pytypes

import numpy as np

__all__ = [
    "MAX_OVERLAP_WORK", "Undecided", "add_into", "arrays_in", "copy", "copy_into", "describe",
    "KeyMemo", "filled",
    "is_array", "kind", "like", "may_overlap", "memory", "memory_key", "overlap",
    "self_overlapping", "shares", "span", "to_host", "writeable", "zeros", "zeros_like",
]

# effort of the exact overlap test per pair of arrays (numpy's max_work): a few
# milliseconds at worst; ordinary views (slices, transposes, interleavings) need far less
MAX_OVERLAP_WORK = 10_000
# arrays whose layout is not nested (each axis's stride beyond the previous axis's
# extent) have their element offsets listed to look for repeats, up to this many
MAX_LISTED_ELEMENTS = 1 << 20


class Undecided(Exception):
    """The bounded overlap test could not decide."""


# ---- kinds ---------------------------------------------------------------------------
# Python and NumPy scalar types, certainly not arrays (kind() answers them at once)
_SCALARS = frozenset([int, float, complex, bool, np.float64, np.float32, np.int64,
                      np.int32, np.complex128, np.complex64, np.bool_])


def kind(a):
    """``"host"``, ``"simulator"``, ``"cupy"`` or ``"device"``; None for a non-array."""
    if isinstance(a, np.ndarray):
        return "host"
    if type(a) in _SCALARS:
        return None
    if isinstance(getattr(a, "_ary", None), np.ndarray):
        return "simulator"
    if hasattr(a, "__cuda_array_interface__"):
        return "cupy" if type(a).__module__.split(".")[0] == "cupy" else "device"
    return None


def is_array(a):
    return kind(a) is not None


def arrays_in(a):
    """The arrays an argument is or holds (in tuples and lists)."""
    if isinstance(a, (tuple, list)):
        for x in a:
            yield from arrays_in(x)
    elif is_array(a):
        yield a


def _space(k):
    return "host" if k in ("host", "simulator") else "device"


def _layout(a, k):
    """(pointer, shape, strides, dtype) of an array of kind ``k``."""
    if k == "simulator":
        a = a._ary
    if k in ("host", "simulator"):
        return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype
    cai = a.__cuda_array_interface__
    shape, dtype = tuple(int(n) for n in cai["shape"]), np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is None:
        # None means C-contiguous, but numba also reports None for broadcast views
        # (a 0 stride): believe the array's own strides when it has them
        own = getattr(a, "strides", None)
        if isinstance(own, tuple) and len(own) == len(shape):
            strides = own
        else:
            strides, step = [], dtype.itemsize
            for n in reversed(shape):
                strides.insert(0, step)
                step *= max(n, 1)
    return int(cai["data"][0] or 0), shape, tuple(int(s) for s in strides), dtype


def describe(a):
    """A short description for messages: kind, shape and dtype (type and value for a
    number)."""
    k = kind(a)
    if k is not None:
        _, shape, _, dtype = _layout(a, k)
        what = "array" if k == "host" else type(a).__name__
        return f"{what} of shape {tuple(shape)} and dtype {dtype}"
    return f"{type(a).__name__} {a!r}" if isinstance(a, (int, float)) else \
        type(a).__name__


def writeable(a):
    k = kind(a)
    if k == "host":
        return bool(a.flags.writeable)
    if k == "simulator":
        return bool(a._ary.flags.writeable)
    return not a.__cuda_array_interface__["data"][1]


# ---- memory --------------------------------------------------------------------------
def memory_key(a):
    """An array's exact memory view, (space, pointer, shape, strides, dtype): equal
    keys mean the same elements."""
    if type(a) is np.ndarray:
        return ("host", a.__array_interface__["data"][0], a.shape, a.strides,
                a.dtype.str)
    k = kind(a)
    ptr, shape, strides, dtype = _layout(a, k)
    return (_space(k), ptr, tuple(shape), tuple(strides), dtype.str)


class KeyMemo:
    """The memory keys and spans of NumPy arrays, remembered by the array object's
    identity, for code that asks for them many times per launch (the tape, the
    checkpointed loop).  Reading an array's interface costs a few microseconds; a
    remembered key costs a dictionary lookup and a comparison of the shape, strides
    and dtype, which can be set in place (then the key is computed again; an ndarray's
    data pointer cannot change while the memo holds a reference to it).  The memo
    holds a reference to each array it remembers, so an identity is never reused
    while remembered, and forgets everything when it holds ``limit`` arrays.  Arrays
    of other kinds are computed every time (:func:`memory_key`, :func:`span`)."""

    __slots__ = ("_ids", "limit")

    def __init__(self, limit=256):
        self._ids = {}       # id(array) -> (array, shape, strides, dtype, key, span)
        self.limit = limit

    def _entry(self, a):
        hit = self._ids.get(id(a))
        if hit is not None and hit[0] is a and a.shape == hit[1] and \
                a.strides == hit[2] and a.dtype is hit[3]:
            return hit
        if type(a) is not np.ndarray:
            return None
        shape, strides, dtype = a.shape, a.strides, a.dtype
        ptr = a.__array_interface__["data"][0]
        hit = (a, shape, strides, dtype, ("host", ptr, shape, strides, dtype.str),
               _span("host", ptr, shape, strides, dtype))
        ids = self._ids
        if len(ids) >= self.limit:
            ids.clear()
        ids[id(a)] = hit
        return hit

    def key(self, a):
        """:func:`memory_key` of ``a``."""
        hit = self._entry(a)
        return hit[4] if hit is not None else memory_key(a)

    def span(self, a):
        """:func:`span` of ``a``."""
        hit = self._entry(a)
        return hit[5] if hit is not None else span(a)

    def clear(self):
        self._ids.clear()


def span(a):
    """(space, lo, hi): the bytes ``[lo, hi)`` that hold ``a``'s elements lie within;
    ``lo == hi`` for an empty array."""
    k = kind(a)
    ptr, shape, strides, dtype = _layout(a, k)
    return _span(_space(k), ptr, shape, strides, dtype)


def _span(space, ptr, shape, strides, dtype):
    lo = hi = ptr
    for n, st in zip(shape, strides):
        if n == 0:
            return space, ptr, ptr
        lo += min(0, (n - 1) * st)
        hi += max(0, (n - 1) * st)
    return space, lo, hi + dtype.itemsize


def memory(a):
    """(space, ndarray over ``a``'s memory), or None for a non-array.  For device
    memory the ndarray is a phantom: built over the device pointer, read by nothing but
    the overlap tests."""
    k = kind(a)
    if k == "host":
        return "host", a
    if k == "simulator":
        return "host", a._ary
    if k is None:
        return None
    ptr, shape, strides, dtype = _layout(a, k)
    if math.prod(shape) == 0:
        return "device", np.empty(0)
    face = {"shape": shape, "typestr": dtype.str, "strides": strides,
            "data": (ptr, False), "version": 3}
    return "device", np.asarray(pytypes.SimpleNamespace(__array_interface__=face))


def shares(ma, mb, max_work=MAX_OVERLAP_WORK):
    """Do the memories ``ma`` and ``mb`` (from :func:`memory`) share an element?
    Raises :class:`Undecided` when the bounded exact test gives up."""
    if ma[0] != mb[0] or not np.may_share_memory(ma[1], mb[1]):
        return False
    try:
        return bool(np.shares_memory(ma[1], mb[1], max_work=max_work))
    except np.exceptions.TooHardError:
        raise Undecided from None


def overlap(a, b, max_work=MAX_OVERLAP_WORK):
    """Do arrays ``a`` and ``b`` share an element's memory?  Exact; raises
    :class:`Undecided` when the bounded test gives up.  False for a non-array."""
    ma, mb = memory(a), memory(b)
    return ma is not None and mb is not None and shares(ma, mb, max_work)


def may_overlap(a, b):
    """Do the byte intervals of ``a`` and ``b`` meet (same space)?  Bounds only: False
    means disjoint, True may be a near miss (interleaved views)."""
    sa, sb = span(a), span(b)
    return sa[0] == sb[0] and sa[1] < sb[2] and sb[1] < sa[2]


def self_overlapping(a):
    """Do two elements of ``a`` share memory (a broadcast view, or ``as_strided`` with a
    0 or too small stride)?  Conservative (True) for huge unusual layouts."""
    mem = memory(a)
    return mem is not None and _self_overlapping(mem[1])


def _self_overlapping(x):
    if x.size <= 1 or x.flags.c_contiguous or x.flags.f_contiguous:
        return False
    axes = sorted((abs(s), n) for s, n in zip(x.strides, x.shape) if n > 1)
    if axes[0][0] == 0:
        return True
    reach = x.itemsize
    for stride, n in axes:
        if stride < reach:
            break
        reach = stride * n
    else:
        return False  # nested layout: distinct indices, disjoint elements
    if x.size > MAX_LISTED_ELEMENTS:
        return True
    offsets = np.zeros(1, dtype=np.int64)
    for stride, n in axes:
        offsets = (offsets[:, None] + stride * np.arange(n, dtype=np.int64)).ravel()
    offsets.sort()
    return bool(np.any(np.diff(offsets) < x.itemsize))


# ---- data, kept where it lives -------------------------------------------------------
def _numba(a):
    """A numba view of a simulator or device array (the array itself when it is one)."""
    if hasattr(a, "copy_to_host"):
        return a
    from numba import cuda
    return cuda.as_cuda_array(a)


def copy_into(dst, src):
    """Copy ``src``'s contents into ``dst`` (same kind, shape and layout) where they
    live: on the device for device arrays, without a trip through the host."""
    k = kind(dst)
    if k == "host":
        np.copyto(dst, to_host(src))
    elif k == "cupy":
        import cupy
        with dst.device:    # a NumPy source is uploaded, a device one read in place
            dst[...] = src if kind(src) == "cupy" else cupy.asarray(src)
    elif k == "simulator" or hasattr(dst, "copy_to_device"):
        dst.copy_to_device(src)
    else:
        from numba import cuda
        cuda.as_cuda_array(dst).copy_to_device(cuda.as_cuda_array(src))


def copy(a):
    """A copy of ``a``'s contents of the same kind, on the same device."""
    k = kind(a)
    if k == "host":
        return a.copy(order="K")
    if k == "cupy":
        with a.device:
            return a.copy()
    from numba import cuda
    a = _numba(a)
    out = cuda.device_array_like(a)
    out.copy_to_device(a)
    return out


def to_host(a):
    """``a``'s contents as a NumPy array: ``a`` itself when it is one, else a copy."""
    k = kind(a)
    if k == "host":
        return a
    if k == "cupy":
        return a.get()
    return _numba(a).copy_to_host()


def like(a, host):
    """The NumPy array ``host`` where ``a`` lives: ``host`` itself for a NumPy ``a``,
    else a copy on ``a``'s device (C-contiguous)."""
    k = kind(a)
    if k == "host":
        return host
    if k == "cupy":
        import cupy
        with a.device:
            return cupy.asarray(host)
    from numba import cuda
    return cuda.to_device(np.ascontiguousarray(host))


def zeros_like(a, stream=None):
    """A C-contiguous array of zeros of ``a``'s shape and dtype, where ``a`` lives,
    zeroed there (no transfer from the host on a GPU).  ``stream`` (a numba stream):
    zero a numba device array asynchronously on it, for work on that stream; without
    it the zeroing is finished before this returns."""
    k = kind(a)
    _, shape, _, dtype = _layout(a, k)
    return zeros(shape, dtype, a, stream)


def zeros(shape, dtype, where, stream=None):
    """A C-contiguous array of zeros of ``shape`` and ``dtype`` where array ``where``
    lives (see :func:`zeros_like` for ``stream``)."""
    k = kind(where)
    shape, dtype = tuple(shape), np.dtype(dtype)
    if k == "host":
        return np.zeros(shape, dtype)
    if k == "cupy":
        import cupy
        with where.device:
            return cupy.zeros(shape, dtype)
    # numba device and simulator arrays: from kadj's pool of device buffers
    from . import buffer_pool
    return buffer_pool.zeros(shape, dtype, stream)


def filled(where, src):
    """A C-contiguous array of ``where``'s kind, shape and dtype holding ``src``'s
    contents (a NumPy array, or an array of ``where``'s kind, shape and dtype): for a
    numba device array a buffer of :mod:`kadj.buffer_pool`, for a CuPy array one of
    CuPy's pool, for a NumPy array a new array."""
    k = kind(where)
    _, shape, _, dtype = _layout(where, k)
    if k == "host":
        return np.array(src, dtype=dtype, copy=True)
    if k == "cupy":
        import cupy
        with where.device:
            return cupy.array(src, dtype=dtype, copy=True)
    if kind(src) == "host":
        src = np.ascontiguousarray(src, dtype=dtype)
    else:
        src = _numba(src)
        if not src.is_c_contiguous():
            return copy(src)
    from . import buffer_pool
    out = buffer_pool.empty(shape, dtype)
    out.copy_to_device(src)
    return out


def add_into(dst, src, stream=None):
    """``dst += src`` where ``dst`` lives; ``src`` is of ``dst``'s kind and shape, both
    C-contiguous (from :func:`zeros_like`, :func:`like` or :func:`copy`).  Numba device
    and simulator arrays are added by a small CUDA kernel on ``stream`` (the default
    stream without it): no transfer to the host and no synchronisation."""
    k = kind(dst)
    if k == "host":
        np.add(dst, src, out=dst)
    elif k == "cupy":
        with dst.device:
            dst += src
    else:
        dst, src = _numba(dst), _numba(src)
        n = math.prod(dst.shape)
        if n == 0:
            return
        if tuple(src.shape) != tuple(dst.shape):
            raise ValueError(f"add_into: shapes {tuple(dst.shape)} and "
                             f"{tuple(src.shape)} differ")
        from .device_ops import add_flat
        add_flat(dst.reshape(n), src.reshape(n), n, stream)
