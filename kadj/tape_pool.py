"""Host memory kept for the tapes of CPU adjoints from one call to the next.

A CPU adjoint allocates its tapes on every call.  glibc serves an allocation above its
mmap threshold (32 MiB at most) with fresh pages from the operating system, and the
first write to each 4 KiB page then faults: on a tape of tens of MiB the faults can cost
more than the adjoint's arithmetic (a 38 MB tape: 25-27 ms fresh, 5.6 ms reused).  So
an adjoint that records tapes takes them from memory its caller keeps
(:mod:`kadj.kept_tapes` writes it so): parameters ``_keep_<kind>`` (one 1-D array per
tape kind) and ``_keep_need`` (int64, one entry per kind, in which the adjoint notes how
many entries of each kind it used).  A tape is a slice of the kept array when that is
large enough, else new memory as before; after the call the pool grows each kept
array to what the call needed, so the next call of the same compiled adjoint finds its
tapes in memory that is already mapped.

One :class:`TapePool` per compiled adjoint, holding sets of kept arrays: a call takes a
set (or a new empty one when every set is in use: calls on several threads never share
tape memory) and gives it back afterwards.  Bounded: the pools of all adjoints keep at
most :func:`limit` bytes together (default 1 GiB; ``KADJ_TAPE_POOL_BYTES`` or
:func:`set_limit` change it, 0 turns keeping off); a set that would grow beyond it stays
as it is, and the calls that use it allocate new tapes as they would without a pool.
:func:`clear` lets go of every kept array; :func:`stats` counts them.  The arrays are
plain NumPy memory, never seen by the user; a kept tape's old entries are never read
(every entry is written by a push before it is popped).
"""
from __future__ import annotations

import os
import threading
import weakref

import numpy as np

__all__ = ["TapePool", "clear", "fresh", "limit", "set_limit", "stats", "for_function"]

DEFAULT_LIMIT = 1 << 30
PREFIX = "_keep_"
NEED = "_keep_need"
DTYPES = {"f64": np.float64, "f32": np.float32, "i64": np.int64}

_lock = threading.Lock()
_pools = weakref.WeakSet()
_limit_override = None


def _env_limit():
    text = os.environ.get("KADJ_TAPE_POOL_BYTES")
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"KADJ_TAPE_POOL_BYTES must be a number of bytes, not "
                         f"{text!r}") from None
    if value < 0:
        raise ValueError("KADJ_TAPE_POOL_BYTES must not be negative")
    return value


def limit():
    """The bytes of tape memory all pools may keep together."""
    if _limit_override is not None:
        return _limit_override
    env = _env_limit()
    return DEFAULT_LIMIT if env is None else env


def set_limit(nbytes):
    """Keep at most ``nbytes`` of tape memory (None: the default); what is kept beyond a
    lowered limit is let go now."""
    global _limit_override
    if nbytes is not None and (not isinstance(nbytes, (int, np.integer)) or nbytes < 0):
        raise ValueError(f"the tape pool's limit must be a number of bytes >= 0, not "
                         f"{nbytes!r}")
    _limit_override = None if nbytes is None else int(nbytes)
    if _kept_bytes() > limit():
        clear()


def kinds_of(pyfn):
    """The tape kinds whose memory the adjoint ``pyfn`` takes from its caller (its
    ``_keep_<kind>`` parameters, in order), or ()."""
    code = pyfn.__code__
    names = code.co_varnames[:code.co_argcount]
    if NEED not in names:
        return ()
    return tuple(n[len(PREFIX):] for n in names if n.startswith(PREFIX) and n != NEED)


def for_function(pyfn):
    """A :class:`TapePool` for the adjoint ``pyfn``, or None when it keeps no tape."""
    kinds = kinds_of(pyfn)
    return TapePool(kinds) if kinds else None


def fresh(kinds):
    """Empty kept arrays for ``kinds``: every tape of the call is new memory of exactly
    the size it asks for (what an adjoint allocated before pools; bounds-checked runs
    use this, so an overrun past a reservation still fails); none for no kinds."""
    if not kinds:
        return []
    return [np.empty(0, DTYPES[k]) for k in kinds] + [np.zeros(len(kinds), np.int64)]


class TapePool:
    """The kept tape memory of one compiled adjoint: :meth:`take` the arguments to
    append to a call, :meth:`give` them back after it."""

    __slots__ = ("kinds", "_free", "__weakref__")

    def __init__(self, kinds):
        self.kinds = tuple(kinds)
        self._free = []
        with _lock:
            _pools.add(self)

    def take(self):
        """A set of kept arrays no other call is using (a list: the arrays, then the
        need counts, zeroed)."""
        with _lock:
            if self._free:
                return self._free.pop()
        return fresh(self.kinds)

    def give(self, kept):
        """Take back a set after its call: each array grown to what the call needed,
        while all pools stay within :func:`limit`."""
        need = kept[-1]
        grow = [(j, int(need[j])) for j in range(len(self.kinds))
                if need[j] > kept[j].shape[0]]
        if grow:
            extra = sum((n - kept[j].shape[0]) * kept[j].itemsize for j, n in grow)
            if _kept_bytes() + _bytes(kept) + extra <= limit():
                for j, n in grow:
                    kept[j] = np.empty(n, DTYPES[self.kinds[j]])
        need[:] = 0
        with _lock:
            if len(self._free) < _MAX_SETS and limit() > 0:
                self._free.append(kept)

    def nbytes(self):
        with _lock:
            return sum(_bytes(s) for s in self._free)

    def _clear(self):
        with _lock:
            self._free.clear()


_MAX_SETS = max(2, os.cpu_count() or 1)   # concurrent calls of one adjoint kept for


def _bytes(kept):
    return sum(a.nbytes for a in kept[:-1])


def _kept_bytes():
    with _lock:
        pools = list(_pools)
    return sum(p.nbytes() for p in pools)


def clear():
    """Let go of every kept tape array (adjoints still running keep theirs)."""
    with _lock:
        pools = list(_pools)
    for p in pools:
        p._clear()


def stats():
    """``{"pools": adjoints with kept memory, "sets": kept sets, "bytes": their size}``."""
    with _lock:
        pools = list(_pools)
    sets = [s for p in pools for s in list(p._free)]
    return {"pools": sum(1 for p in pools if p._free), "sets": len(sets),
            "bytes": sum(_bytes(s) for s in sets)}
