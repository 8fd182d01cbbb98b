"""The arrays a :class:`kadj.Tape` tracks, indexed for fast lookup.

:class:`ArrayIndex` answers the two questions every recorded launch asks of each of its
array arguments, in time that does not grow with the number of arrays the tape has
seen:

- *which tracked array is it?*  Arrays are tracked by their exact memory view
  (:func:`kadj.arrays.memory_key`).  Computing that key reads the array's interface
  (a few microseconds), so the key of each tracked array object is remembered by the
  object's identity, and reused while the object's shape, strides and dtype are still
  the ones the key was made from (an ndarray's data pointer cannot change; its shape,
  strides and dtype can be set in place, and then the key is computed again).  The
  index holds a reference to each tracked array, so an identity is never reused while
  it is remembered.  The keys and spans of arrays not yet tracked come from a
  :class:`kadj.arrays.KeyMemo` (computed once per array object for the lookup, the
  overlap test and the indexing; a checkpointed loop shares its memo with the private
  tapes that reverse its steps).
- *does a new array overlap a tracked one without being the same view?*  The tracked
  arrays' byte spans (:func:`kadj.arrays.span`) are kept, per memory space, as sorted
  disjoint *segments*, each the union of the spans that meet; a new array is compared
  only with the arrays of the segments its span meets (a bisection finds them), first
  by span, then with the exact bounded test (:func:`kadj.arrays.overlap`, which runs
  ``np.shares_memory`` only when ``np.may_share_memory`` says the arrays may meet).
  Interleaved views (``a[::2]`` and ``a[1::2]``) share a segment; 1-D views of the
  same shape and stride whose elements fall between each other's (the columns of a
  matrix, ``A[:, j]``) are told apart by their offsets, others get the exact test.

The index has its own small lock, held only while it is read or changed and never
while another lock is taken, so that a launch in another thread can ask whether it
touches an array of a tape that is recording (:func:`kadj.tape.check_unrecorded`).
"""
from __future__ import annotations

import bisect
import threading

import numpy as np

from . import arrays

__all__ = ["ArrayIndex", "overlaps"]


def overlaps(a, b):
    """Do ``a`` and ``b`` share memory?  An overlap the bounded test cannot rule out
    counts as one."""
    try:
        return arrays.overlap(a, b)
    except arrays.Undecided:
        return True


def _lattice(key):
    """(|stride|, itemsize, residue) of a 1-D strided view whose elements are more
    than one item apart (a column ``A[:, j]``, ``x[::2]``), from its memory key: its
    elements' addresses are its start modulo the stride (the residue); else None."""
    _, ptr, shape, strides, dtype = key
    if len(shape) != 1 or shape[0] < 2:
        return None
    stride, size = abs(strides[0]), np.dtype(dtype).itemsize
    return (stride, size, ptr % stride) if stride > size else None


class _Segment:
    """Tracked arrays whose byte spans meet, and the bytes ``[lo, hi)`` they cover.
    1-D strided views are kept by (stride, item size) and residue (:func:`_lattice`):
    two of the same stride and item size whose residues are an item or more apart,
    both ways around, never share a byte (each of their elements sits at its residue
    modulo the stride), so a view is compared only with those whose residue is near
    its own, and with the other arrays; the columns of one matrix do not meet."""

    __slots__ = ("lo", "hi", "count", "others", "families")

    def __init__(self, lo, hi):
        self.lo, self.hi, self.count = lo, hi, 0
        self.others = []        # members (lo, hi, array, key) of no lattice
        self.families = {}      # (stride, itemsize) -> {residue: [member]}

    def put(self, member):
        lat = _lattice(member[3])
        if lat is None:
            self.others.append(member)
        else:
            self.families.setdefault(lat[:2], {}).setdefault(lat[2], []).append(member)
        self.count += 1

    def absorb(self, other):
        self.lo, self.hi = min(self.lo, other.lo), max(self.hi, other.hi)
        self.others.extend(other.others)
        for fam, by_residue in other.families.items():
            mine = self.families.setdefault(fam, {})
            for r, members in by_residue.items():
                mine.setdefault(r, []).extend(members)
        self.count += other.count

    def near(self, lat):
        """The members that may share memory with an array of lattice ``lat`` (None:
        every member)."""
        yield from self.others
        for fam, by_residue in self.families.items():
            if lat is None or fam != lat[:2]:
                for members in by_residue.values():
                    yield from members
                continue
            stride, size, r = lat
            for d in range(1 - size, size):
                yield from by_residue.get((r + d) % stride, ())


class ArrayIndex:
    """Tracked arrays by identity (for their keys) and by byte span (for overlaps)."""

    def __init__(self, memo=None):
        self._memo = memo if memo is not None else arrays.KeyMemo()
        self._lock = threading.Lock()
        self._ids = {}       # id(array) -> (array, shape, strides, dtype, key, entry)
        self._keys = set()   # the keys of the indexed arrays
        self._spaces = {}    # memory space -> ([segment lo], [_Segment]), sorted by lo

    def __len__(self):
        return len(self._keys)

    def find(self, a):
        """(key, entry) of array ``a``: its memory key (:func:`kadj.arrays.memory_key`)
        and the entry it was indexed with, found by identity for an indexed NumPy
        array object; ``(key, None)`` otherwise."""
        hit = self._ids.get(id(a))
        if hit is not None and hit[0] is a and a.shape == hit[1] and \
                a.strides == hit[2] and a.dtype is hit[3]:
            return hit[4], hit[5]
        return self._memo.key(a), None

    def __contains__(self, key):
        return key in self._keys

    def add(self, key, a, entry):
        """Index the array ``a`` with key ``key`` and ``entry`` (what :meth:`find`
        returns with the key)."""
        space, lo, hi = self._memo.span(a)
        with self._lock:
            self._keys.add(key)
            if type(a) is np.ndarray:
                self._ids[id(a)] = (a, a.shape, a.strides, a.dtype, key, entry)
            if lo == hi:
                return                   # an empty array overlaps nothing
            starts, segments = self._spaces.setdefault(space, ([], []))
            first, last = self._meeting(starts, segments, lo, hi)
            met = segments[first:last]
            # the largest segment met takes in the others (an array that joins a
            # segment of n costs what it brings, not n)
            seg = max(met, key=lambda x: x.count) if met else _Segment(lo, hi)
            for other in met:
                if other is not seg:
                    seg.absorb(other)
            seg.lo, seg.hi = min(lo, seg.lo), max(hi, seg.hi)
            seg.put((lo, hi, a, key))
            starts[first:last] = [seg.lo]
            segments[first:last] = [seg]

    @staticmethod
    def _meeting(starts, segments, lo, hi):
        """The range of segments meeting the bytes ``[lo, hi)``."""
        first = bisect.bisect_right(starts, lo) - 1
        if first < 0 or segments[first].hi <= lo:
            first += 1
        last = first
        while last < len(segments) and segments[last].lo < hi:
            last += 1
        return first, last

    def overlapping(self, a, extra=(), span=None):
        """An indexed array (or one of ``extra``) that shares memory with ``a``, or
        None.  ``a`` itself must not be indexed under its own key.  ``span``: ``a``'s
        span when known (else from the memo)."""
        space, lo, hi = self._memo.span(a) if span is None else span
        if lo == hi:
            return None
        with self._lock:
            found = self._spaces.get(space)
            candidates = []
            if found is not None:
                starts, segments = found
                first, last = self._meeting(starts, segments, lo, hi)
                met = segments[first:last]
                if met:
                    lat = _lattice(self._memo.key(a))
                    for seg in met:
                        candidates.extend(b for blo, bhi, b, _ in seg.near(lat)
                                          if blo < hi and lo < bhi)
        for b in candidates:
            if overlaps(a, b):
                return b
        for b in extra:
            if overlaps(a, b):
                return b
        return None

    def touches(self, a):
        """Is ``a`` an indexed array, or does it overlap one?"""
        # not through the memo: the arrays of other threads' launches are not kept
        return arrays.memory_key(a) in self._keys or \
            self.overlapping(a, span=arrays.span(a)) is not None
