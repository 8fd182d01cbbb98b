"""Host memory a CPU adjoint keeps from one call to the next.

A CPU adjoint allocates on every call: its tapes, the work copies of the arrays the
kernel writes, the kernel's own scratch arrays and their adjoints.  glibc serves a
large allocation with fresh pages from the operating system (above its mmap threshold,
at most 32 MiB, or once freed memory at the top of its heap exceeds its trim threshold
and is given back), and the first write to each 4 KiB page then faults: on arrays of
tens of MiB the faults can cost more than the adjoint's arithmetic (a 38 MB tape: 25-27
ms fresh, 5.6 ms reused).  So an adjoint takes these arrays from memory its caller
keeps (:mod:`kadj.kept_memory` writes it so): two parameters, ``_keep_bytes`` (a
1-D ``uint8`` array holding every kept allocation of the call, each in a region of its
own) and ``_keep_need`` (int64: :func:`layout`); the adjoint's docstring names the
allocations in order ("Kept between calls: ...").  An allocation is a view of its
region when the region is large enough; otherwise it is new memory as before, and the
adjoint notes the bytes it asked for and sets entry 0.  After a call that set it, the
pool lays the regions out anew, each as large as asked, in one new buffer, so the next
call of the same compiled adjoint finds its arrays in memory that is already mapped (a
call that needs nothing new costs one look at entry 0).  One buffer rather than an
array per allocation: numba unboxes every array argument of a call, in code compiled
into each adjoint's wrapper and at every call.

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

__all__ = ["KeptMemory", "KeptSet", "clear", "layout", "for_function", "fresh", "fresh_for", "limit", "set_limit", "slots_of",
           "stats"]

DEFAULT_LIMIT = 1 << 30
BYTES = "_keep_bytes"
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


#: the line of an adjoint's docstring that names its kept allocations, in slot order
SLOTS_LINE = "Kept between calls: "
#: every kept region starts at a multiple of this many bytes of the buffer
ALIGN = 64


def _aligned(nbytes):
    """``nbytes`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-nbytes // ALIGN) * ALIGN


def layout(nslots):
    """Where slot ``s`` (1 to ``nslots``) keeps its numbers in ``_keep_need``: entry
    ``s`` the bytes an allocation asked for beyond its region, entry ``nslots + s`` the
    region's offset in ``_keep_bytes``, entry ``2 * nslots + s`` its size; entry 0 is
    set when some allocation asked for more than its region.  Returns (need, offset,
    size) index functions of the slot."""
    return (lambda s: s), (lambda s: nslots + s), (lambda s: 2 * nslots + s)


def slots_of(pyfn):
    """The names of the allocations whose memory the adjoint ``pyfn`` takes from its
    caller (its docstring's "Kept between calls: " line, when its last parameters are
    ``_keep_bytes, _keep_need``), or ()."""
    code = pyfn.__code__
    names = code.co_varnames[:code.co_argcount]
    if len(names) < 2 or names[-2:] != (BYTES, NEED):
        return ()
    for line in (pyfn.__doc__ or "").splitlines():
        line = line.strip()
        if line.startswith(SLOTS_LINE):
            return tuple(n.strip() for n in line[len(SLOTS_LINE):].rstrip(".").split(","))
    return ()


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
    return [np.empty(0, np.uint8), np.zeros(3 * nslots + 1, np.int64)]


def fresh_for(pyfn):
    """:func:`fresh` arguments for the adjoint ``pyfn`` (none when it keeps nothing)."""
    return fresh(len(slots_of(pyfn)))


class KeptSet:
    """One call's kept memory: ``args`` (the buffer, then its layout and the need
    counts, :func:`layout`: the arguments appended to the call)."""

    __slots__ = ("args",)

    def __init__(self, nslots):
        self.args = fresh(nslots)


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
        """Take back a set after its call: its regions grown to what the calls needed,
        while everything kept stays within :func:`limit`."""
        if kept.args[-1][0]:
            self._grow(kept)
        if len(self._free) < _MAX_SETS:     # (a set kept under limit 0 holds nothing)
            self._free.append(kept)

    def _grow(self, kept):
        n = len(self.slots)
        meta = kept.args[-1]
        meta[0] = 0
        need, offset, size = layout(n)
        now = [int(meta[size(s)]) for s in range(1, n + 1)]
        sizes = [max(b, int(meta[need(s)])) for s, b in zip(range(1, n + 1), now)]
        if sizes == now:
            return
        total = sum(_aligned(b) for b in sizes)
        buf = kept.args[0]
        if total > buf.shape[0]:
            if _kept_bytes() + total > limit():    # (this set is in no pool now)
                return
            buf = np.empty(total, np.uint8)
        at = 0
        for s, b in enumerate(sizes, start=1):
            meta[offset(s)], meta[size(s)] = at, b
            at += _aligned(b)
        kept.args[0] = buf

    def nbytes(self):
        return sum(_bytes(s) for s in list(self._free))

    def _clear(self):
        self._free.clear()


_MAX_SETS = max(2, os.cpu_count() or 1)   # concurrent calls of one adjoint kept for


def _bytes(kept):
    return int(kept.args[0].shape[0]) if kept.args else 0


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
