"""Host memory a CPU adjoint keeps from one call to the next.

A CPU adjoint allocates on every call: its tapes, the work copies of the arrays the
kernel writes, the kernel's own scratch arrays and their adjoints.  glibc serves a
large allocation with fresh pages from the operating system (above its mmap threshold,
at most 32 MiB, or once freed memory at the top of its heap exceeds its trim threshold
and is given back), and the first write to each 4 KiB page then faults: on arrays of
tens of MiB the faults can cost more than the adjoint's arithmetic (a 38 MB tape: 25-27
ms fresh, 5.6 ms reused).  So an adjoint takes these arrays from memory its caller
keeps (:mod:`kadj.kept_memory` writes it so): one parameter ``_keep_<name>`` (a 1-D
``uint8`` array) per allocation it makes once per call, and ``_keep_need`` (int64, one
entry per allocation after entry 0).  An allocation is a view of its kept bytes when
they are enough; otherwise it is new memory as before, and the adjoint notes the bytes
it asked for in its entry and sets entry 0.  After a call that set it, the pool grows
each kept array to what was asked, so the next call of the same compiled adjoint finds
its arrays in memory that is already mapped (a call that needs nothing new costs one
look at entry 0).

One :class:`KeptMemory` per compiled adjoint, holding sets of kept arrays: a call takes
a set (or a new empty one when every set is in use: calls on several threads never
share memory) and gives it back afterwards.  Bounded: the sets of all adjoints keep at
most :func:`limit` bytes together (default 1 GiB; ``KADJ_KEPT_MEMORY_BYTES`` or
:func:`set_limit` change it, 0 turns keeping off); a set that would grow beyond it stays
as it is, and the calls that use it allocate as they would without it.  :func:`clear`
lets go of every kept array; :func:`stats` counts them.  The arrays are never seen by
the user and never outlive the call that uses them (an adjoint returns nothing of them).
"""
from __future__ import annotations

import os
import threading
import weakref

import numpy as np

__all__ = ["KeptMemory", "KeptSet", "clear", "for_function", "fresh", "fresh_for", "limit", "set_limit", "slots_of",
           "stats"]

DEFAULT_LIMIT = 1 << 30
PREFIX = "_keep_"
NEED = "_keep_need"
ENV = "KADJ_KEPT_MEMORY_BYTES"

_lock = threading.Lock()
_pools = weakref.WeakSet()
_limit_override = None


def _env_limit():
    text = os.environ.get(ENV)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{ENV} must be a number of bytes, not {text!r}") from None
    if value < 0:
        raise ValueError(f"{ENV} must not be negative")
    return value


def limit():
    """The bytes all compiled adjoints may keep together."""
    if _limit_override is not None:
        return _limit_override
    env = _env_limit()
    return DEFAULT_LIMIT if env is None else env


def set_limit(nbytes):
    """Keep at most ``nbytes`` (None: the default); what is kept beyond a lowered limit
    is let go now."""
    global _limit_override
    if nbytes is not None and (isinstance(nbytes, bool) or
                               not isinstance(nbytes, (int, np.integer)) or nbytes < 0):
        raise ValueError(f"the kept memory's limit must be a number of bytes >= 0, not "
                         f"{nbytes!r}")
    _limit_override = None if nbytes is None else int(nbytes)
    if _kept_bytes() > limit():
        clear()


def slots_of(pyfn):
    """The names of the allocations whose memory the adjoint ``pyfn`` takes from its
    caller: its ``_keep_<name>`` parameters just before its last, ``_keep_need`` (a
    user's name never is ``_keep_need``, and the adjoint's own parameters end in
    ``adj_...``), or ()."""
    code = pyfn.__code__
    names = code.co_varnames[:code.co_argcount]
    if not names or names[-1] != NEED:
        return ()
    k = len(names) - 1
    while k > 0 and names[k - 1].startswith(PREFIX):
        k -= 1
    return tuple(n[len(PREFIX):] for n in names[k:-1])


def for_function(pyfn):
    """A :class:`KeptMemory` for the adjoint ``pyfn``, or None when it keeps nothing."""
    slots = slots_of(pyfn)
    return KeptMemory(slots) if slots else None


def fresh(nslots):
    """Arguments for ``nslots`` kept allocations that hold nothing: every allocation of
    the call is new memory of exactly its size (bounds-checked runs use this, so a
    write past a tape's reservation still fails); none for no slots."""
    if not nslots:
        return []
    return [np.empty(0, np.uint8) for _ in range(nslots)] + [np.zeros(nslots + 1, np.int64)]


def fresh_for(pyfn):
    """:func:`fresh` arguments for the adjoint ``pyfn`` (none when it keeps nothing)."""
    return fresh(len(slots_of(pyfn)))


class KeptSet:
    """One call's kept memory: ``args`` (the kept arrays, then the need counts: the
    arguments appended to the call) and ``caps``, the kept arrays' sizes.  Need count
    ``j + 1`` is the most allocation ``j`` asked for beyond its kept bytes; count 0 is
    set when some allocation did."""

    __slots__ = ("args", "caps")

    def __init__(self, nslots):
        self.args = fresh(nslots)
        self.caps = np.zeros(nslots, np.int64)


class KeptMemory:
    """The memory one compiled adjoint keeps: :meth:`take` a :class:`KeptSet` whose
    ``args`` go after the call's own, :meth:`give` it back after the call."""

    __slots__ = ("slots", "_free", "__weakref__")

    def __init__(self, slots):
        self.slots = tuple(slots)
        self._free = []
        with _lock:
            _pools.add(self)

    def take(self):
        """A :class:`KeptSet` no other call is using (``list.pop`` and ``append`` are
        atomic: no lock on the path of every call)."""
        try:
            return self._free.pop()
        except IndexError:
            return KeptSet(len(self.slots))

    def fresh(self):
        """A set that holds nothing (see :func:`fresh`)."""
        return fresh(len(self.slots))

    def give(self, kept):
        """Take back a set after its call: each array grown to what the calls needed,
        while everything kept stays within :func:`limit`."""
        if kept.args[-1][0]:
            self._grow(kept)
        if len(self._free) < _MAX_SETS:     # (a set kept under limit 0 holds nothing)
            self._free.append(kept)

    def _grow(self, kept):
        need, caps = kept.args[-1], kept.caps
        need[0] = 0
        grow = [(j, int(need[j + 1])) for j in range(len(self.slots))
                if need[j + 1] > caps[j]]
        extra = sum(n - int(caps[j]) for j, n in grow)
        if _kept_bytes() + _bytes(kept) + extra <= limit():
            for j, n in grow:
                kept.args[j] = np.empty(n, np.uint8)
                caps[j] = n

    def nbytes(self):
        return sum(_bytes(s) for s in list(self._free))

    def _clear(self):
        self._free.clear()


_MAX_SETS = max(2, os.cpu_count() or 1)   # concurrent calls of one adjoint kept for


def _bytes(kept):
    return int(kept.caps.sum())


def _kept_bytes():
    with _lock:
        pools = list(_pools)
    return sum(p.nbytes() for p in pools)


def clear():
    """Let go of every kept array (calls running now keep theirs until they end)."""
    with _lock:
        pools = list(_pools)
    for p in pools:
        p._clear()


def stats():
    """``{"adjoints": adjoints keeping memory, "sets": sets holding some, "bytes": their
    size}``."""
    with _lock:
        pools = list(_pools)
    sets = [s for p in pools for s in list(p._free) if _bytes(s)]
    return {"adjoints": sum(1 for p in pools if any(_bytes(s) for s in list(p._free))),
            "sets": len(sets), "bytes": sum(_bytes(s) for s in sets)}
