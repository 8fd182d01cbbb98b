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

Kinds: NumPy arrays and the CUDA simulator's arrays (their wrapped host array) get a
fingerprint; CuPy and numba device arrays get None (not checked).
"""
from __future__ import annotations

import numpy as np

__all__ = ["fingerprint"]

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
    """A hashable fingerprint of ``a``'s contents (shape and dtype included), or None
    for arrays whose memory the host cannot read cheaply (device arrays)."""
    if type(a) is np.ndarray and a.nbytes <= SMALL:        # the common case, quickly
        return (a.shape, a.dtype.str, a.tobytes())
    if not isinstance(a, np.ndarray):
        inner = getattr(a, "_ary", None)          # a CUDA simulator array
        if not isinstance(inner, np.ndarray):
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
