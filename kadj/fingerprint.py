"""Cheap fingerprints of array contents, to detect changes made outside a Tape.

:func:`fingerprint` hashes an array's bytes with four interleaved multiply-xor chains
over 64-bit words (``h = (h ^ w) * P`` with ``P`` odd, a bijection of ``h`` for each
word), combined by the same bijective step.  A change confined to one 64-bit word (any
single element of a NumPy array of 1, 2, 4 or 8-byte elements, or one half of a complex
element) changes the fingerprint with certainty; the chains are position dependent, so
permutations (a reversed or rolled array, two swapped elements) are caught too, except
with probability about 2**-64.  Cost: about 50 us per MB on one core, roughly half of
copying the array; arrays that are not contiguous are copied first.

Arrays of at most :data:`SMALL` bytes are fingerprinted by a copy of their bytes
(exact, and cheaper than a call into compiled code).

Kinds: NumPy arrays and the CUDA simulator's arrays (their wrapped host array) are
hashed on the host as above.  Numba device arrays and CuPy arrays (any object with
``__cuda_array_interface__``, read through ``numba.cuda.as_cuda_array``) are hashed on
their device by :func:`device_fingerprint`; other objects get None (not checked).
:func:`device_print` computes the same hash on the device and leaves it there (a
:class:`kadj.Tape` compares such prints on the device, :mod:`kadj.tape_checks`).
"""
from __future__ import annotations

import numpy as np

__all__ = ["device_fingerprint", "device_print", "fingerprint"]

SMALL = 4096       # arrays up to this many bytes are fingerprinted by their bytes
_hash = None


def _compile():
    global _hash
    import numba

    def chains(w):
        p = np.uint64(0x9E3779B97F4A7C15)
        a = np.uint64(0x243F6A8885A308D3)
        b = np.uint64(0x13198A2E03707344)
        c = np.uint64(0xA4093822299F31D0)
        d = np.uint64(0x082EFA98EC4E6C89)
        n = w.shape[0]
        m = n - n % 4
        for i in range(0, m, 4):
            a = (a ^ np.uint64(w[i])) * p
            b = (b ^ np.uint64(w[i + 1])) * p
            c = (c ^ np.uint64(w[i + 2])) * p
            d = (d ^ np.uint64(w[i + 3])) * p
        for i in range(m, n):
            a = (a ^ np.uint64(w[i])) * p
        return (((((a * p) ^ b) * p) ^ c) * p) ^ d

    try:
        _hash = numba.njit(nogil=True, cache=True)(chains)
    except Exception:  # no writable cache location
        _hash = numba.njit(nogil=True)(chains)
    return _hash


def fingerprint(a):
    """A hashable fingerprint of ``a``'s contents (shape and dtype included): equal
    for equal contents; None for an object that is no array kadj knows."""
    if type(a) is np.ndarray and a.nbytes <= SMALL:        # the common case, quickly
        return (a.shape, a.dtype.str, a.tobytes())
    if not isinstance(a, np.ndarray):
        inner = getattr(a, "_ary", None)          # a CUDA simulator array
        if not isinstance(inner, np.ndarray):
            if hasattr(a, "__cuda_array_interface__"):
                return device_fingerprint(a)
            return None
        a = inner
    if a.nbytes <= SMALL:
        return (a.shape, a.dtype.str, a.tobytes())
    h = _hash or _compile()
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    whole = flat.size - flat.size % 8
    words = flat[:whole].view(np.uint64)
    tail = int(h(flat[whole:])) if whole < flat.size else 0
    return (a.shape, a.dtype.str, int(h(words)), tail)


def device_fingerprint(a):
    """The fingerprint of a device array's contents, computed on its device:
    ``(shape, dtype, h1, h2)`` with two 64-bit hashes of its bytes in C order.

    The bytes are read as 64-bit words ``w_i`` (the last, incomplete word packed
    from the tail bytes), and ``h1 = sum_i mix1(w_i ^ key1(i))`` with wrapping uint64
    addition, ``key1(i) = i * K1 + D1`` (K1 odd, so distinct words get distinct keys)
    and ``mix1`` a bijection of uint64 (the splitmix64 finalizer); ``h2`` likewise
    with other constants and the murmur3 finalizer.  A change confined to one word
    (one element of 1, 2, 4 or 8 bytes, anywhere, tail included) changes exactly one
    term, and since ``mix1`` is a bijection that term changes, so the sum changes
    with certainty.  Each term depends on its word's position through the key, so a
    permutation (two swapped elements, a reversed array) changes each sum except with
    probability about 2**-64 (both sums, about 2**-128 for a random-looking mixer).

    Cost: one hash kernel over the array (plus a contiguous device copy first when
    the array is strided or its start is not 8-byte aligned) on the default stream,
    and one synchronous 16-byte copy to the host (:func:`device_print` makes none).
    Work on user streams created blocking (numba's and CuPy's defaults) is ordered
    before it by the legacy default stream."""
    from numba import cuda
    from . import device_ops
    shape, dtype, raw = _words(a, cuda.default_stream())
    if raw is None:
        return shape, dtype, 0, 0
    return (shape, dtype) + device_ops.hash_words(raw)


def device_print(a, stream=None):
    """The fingerprint of device array ``a``'s contents kept on its device: a pooled
    device array of two uint64, the lanes of :func:`device_fingerprint`'s hash,
    computed by a kernel enqueued on ``stream`` (the default stream without it);
    nothing is copied to the host and nothing waits (strided arrays of more than 4
    dimensions excepted: they are copied through the host)."""
    from numba import cuda
    from . import buffer_pool, device_ops
    if stream is None:
        stream = cuda.default_stream()
    out = buffer_pool.zeros((2,), np.uint64, stream)
    _, _, raw = _words(a, stream)
    if raw is not None:
        device_ops.hash_into(raw, out, stream)
    return out


def _words(a, stream):
    """(shape, dtype str, the bytes of ``a`` in C order as a 1-D uint8 device array
    whose start is 8-byte aligned, or None when empty)."""
    from numba import cuda
    from . import device_ops
    d = a if hasattr(a, "copy_to_host") else cuda.as_cuda_array(a)
    shape, dtype = tuple(d.shape), d.dtype.str
    if d.size == 0:
        return shape, dtype, None
    inner = getattr(d, "_ary", None)              # a CUDA simulator array
    ptr = inner.ctypes.data if isinstance(inner, np.ndarray) \
        else d.__cuda_array_interface__["data"][0]
    if not d.is_c_contiguous() or ptr % 8:
        d = device_ops.contiguous(d, stream)
    return shape, dtype, d.reshape(d.size).view(np.uint8)
