"""Repeated adjoint calls, checked cheaply: the facts of ``k.adjoint(*args)`` that
depend only on the arguments' types, kept per signature.

The full checks (:func:`kadj.validate.check_adjoint_call` and the binding before it)
run on the first call of every signature.  When they pass, a :class:`CallFacts` is
kept under the call's :func:`signature`: for NumPy arrays their dtype, number of
dimensions and flags (contiguity, writeability, alignment, data ownership), for
numbers their Python type.  What that signature decides (the compiled adjoint, the
argument count, dtypes, writeable buffers, contiguous arrays whose elements cannot
share memory) is not tested again; what the values decide is:

- shapes: each adjoint buffer against its argument (a scalar's buffer has shape (1,));
- a non-contiguous adjoint buffer or written argument whose elements share memory;
- overlap: no adjoint buffer may share memory with an argument or another buffer, no
  written argument with another argument.  Each array is traced to the NumPy array
  owning its memory (itself, or its ``base`` when that owns its data): arrays with
  different owners lie in different allocations and cannot overlap, and when every
  array owns its memory, distinct arrays suffice.  Only pairs whose owners coincide or
  cannot be traced (``as_strided`` views, foreign buffers) have their bounds compared
  (``np.may_share_memory``); the exact test is the full checks'.

:meth:`CallFacts.accepts` only accepts: a call it does not accept (a changed shape, a
self-overlapping layout, arrays whose bounds meet) goes through the full checks, which
refuse it with their error or accept it, so every error is the full checks'.
"""
from __future__ import annotations

import numpy as np

from . import arrays

# numbers whose numba type and adjoint dtype follow from their Python type (ints only
# within int64: larger ones type differently and take the full path)
_NUMBERS = frozenset([float, bool, complex, np.float32, np.float64, np.int8, np.int16,
                      np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                      np.bool_, np.complex64, np.complex128])
_INT64 = (-(1 << 63), 1 << 63)
_CONTIGUOUS = 0x3       # NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_F_CONTIGUOUS
_OWNDATA = 0x4          # NPY_ARRAY_OWNDATA
MAX_SIGNATURES = 64     # per kernel; the cache starts afresh beyond that


def signature(args):
    """A key fixing every type-level fact of ``args``, or None when an argument is
    neither a NumPy array (exactly ``np.ndarray``) nor a plain number."""
    key = []
    for a in args:
        t = type(a)
        if t is np.ndarray:
            key.append((a.dtype, a.ndim, a.flags.num))
        elif t in _NUMBERS:
            key.append(t)
        elif t is int and _INT64[0] <= a < _INT64[1]:
            key.append(t)
        else:
            return None
    return tuple(key)


def buffer_shapes(plan, args, is_array):
    """(same_shape, scalar_slots) of a call's positional ``args`` (forward arguments,
    then the adjoint buffers in slot order): the (buffer, argument) positions whose
    shapes must agree, and the positions of scalars' buffers, of shape (1,)."""
    n = len(plan.arg_names)
    same_shape, scalar_slots = [], []
    for slot, i in enumerate(plan.adjoint_args):
        if is_array(args[i]):
            same_shape.append((n + slot, i))
        else:
            scalar_slots.append(n + slot)
    return tuple(same_shape), tuple(scalar_slots)


def shapes_hold(args, same_shape, scalar_slots):
    """Does every adjoint buffer in ``args`` have its argument's shape (a scalar's:
    (1,))?  ``same_shape``, ``scalar_slots``: :func:`buffer_shapes`."""
    for p, i in same_shape:
        if args[p].shape != args[i].shape:
            return False
    for p in scalar_slots:
        if args[p].shape != (1,):
            return False
    return True


class CallFacts:
    """What a checked adjoint call with one :func:`signature` leaves to test: built
    from the compiled adjoint ``comp`` and the call's positional ``args`` (forward
    arguments, then the adjoint buffers in slot order) once the full checks passed."""

    __slots__ = ("comp", "same_shape", "scalar_slots", "self_checks", "guarded",
                 "others", "owners")

    def __init__(self, comp, args, key):
        plan = comp.plan
        n = len(plan.arg_names)
        self.comp = comp
        self.same_shape, self.scalar_slots = buffer_shapes(
            plan, args, lambda a: type(a) is np.ndarray)
        # arrays that must not share memory with any other array (buffers, written
        # arguments), and the read-only arrays that only they must avoid
        self.guarded = tuple(p for p in range(n) if p in plan.written and
                             type(args[p]) is np.ndarray) + tuple(range(n, len(args)))
        self.others = tuple(p for p in range(n) if p not in self.guarded and
                            type(args[p]) is np.ndarray)
        self.self_checks = tuple(p for p in self.guarded if not key[p][2] & _CONTIGUOUS)
        # every array owns its memory: distinct arrays, distinct memory
        self.owners = all(key[p][2] & _OWNDATA for p in self.guarded + self.others)

    def accepts(self, args):
        """Do ``args`` (of this signature) pass every check?  False means: run the
        full checks (they may still pass)."""
        if not shapes_hold(args, self.same_shape, self.scalar_slots):
            return False
        for p in self.self_checks:
            if arrays.self_overlapping(args[p]):
                return False
        if self.owners:
            ids = {id(args[p]) for p in self.guarded}
            if len(ids) != len(self.guarded):
                return False
            for p in self.others:
                if id(args[p]) in ids:
                    return False
            return True
        return self._apart(args)

    def _apart(self, args):
        """No guarded array meets another array: pairs with different traced owners
        are apart; the others are tested on their bounds (``np.may_share_memory``;
        when the bounds meet, the full checks decide exactly)."""
        owner = {p: _owner(args[p]) for p in self.guarded + self.others}
        for k, p in enumerate(self.guarded):
            for q in self.guarded[k + 1:] + self.others:
                op, oq = owner[p], owner[q]
                if (op is None or oq is None or op is oq) and \
                        np.may_share_memory(args[p], args[q]):
                    return False
        return True


def _owner(a):
    """The array owning ``a``'s memory (``a``, or its base), or None when not known."""
    if a.flags.owndata:
        return a
    b = a.base
    return b if type(b) is np.ndarray and b.flags.owndata else None


def remember(cache, key, comp, args):
    """Keep the facts of a call with ``key`` that the full checks accepted."""
    if len(cache) >= MAX_SIGNATURES:
        cache.clear()
    cache[key] = CallFacts(comp, args, key)
