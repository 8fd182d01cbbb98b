"""Custom steps: Python code between launches, recorded on a Tape with its own adjoint.

:class:`CustomStep` looks like a differentiated kernel to the tape (``adjoint_plan``,
``forward``, ``adjoint``), so its writes are versioned and the contents its adjoint or
an earlier launch's adjoint needs are kept, exactly as for launches.
:func:`kadj.custom_step` (in :mod:`kadj.tape`) records one on the active tape (inside :func:`kadj.checkpointed_loop`,
on the loop, which re-runs it when it recomputes the step) or just runs it.
"""
from __future__ import annotations

import inspect
import types

import numpy as np

from . import arrays
from .errors import DifferentiationError
from .plan import AdjointPlan

__all__ = ["CustomStep"]


class CustomStep:
    """``forward()`` with ``adjoint(*adjoints)`` (or ``adjoint(*before, *adjoints)``
    with ``values=True``) over the distinct arrays of ``reads + writes``."""

    def __init__(self, forward, adjoint, reads=(), writes=(), *, name=None,
                 values=False):
        if not callable(forward) or not callable(adjoint):
            raise DifferentiationError(
                "A custom step needs two callables: forward() and adjoint(*adjoints).")
        reads, writes = _arrays_of(reads, "reads"), _arrays_of(writes, "writes")
        distinct = []
        for a in reads + writes:
            if not any(a is b for b in distinct):
                distinct.append(a)
        self.arrays = tuple(distinct)
        self.fn, self.adjoint_fn, self.values = forward, adjoint, bool(values)
        self.__name__ = name or getattr(forward, "__name__", "custom_step")
        index = {id(a): j for j, a in enumerate(self.arrays)}
        for a in writes:
            if not arrays.writeable(a):
                raise DifferentiationError(
                    f"Custom step '{self.__name__}' lists a read-only array "
                    f"({arrays.describe(a)}) in writes=.")
        self.plan = AdjointPlan(
            kernel_name=self.__name__,
            arg_names=tuple(f"{'read' if j < len(reads) else 'write'}"
                            f"{j if j < len(reads) else j - len(reads)}"
                            for j in range(len(self.arrays))),
            adjoint_args=tuple(j for j, a in enumerate(self.arrays)
                               if np.dtype(a.dtype).kind in "fc"),
            written=frozenset(index[id(a)] for a in writes),
            # the pre-call contents the adjoint needs: none, unless it asks for them
            read=frozenset(range(len(self.arrays))) if self.values else frozenset(),
            returns_value=False)
        self.arg_names = self.plan.arg_names
        _check_arity(self.__name__, adjoint, len(self.arrays), self.values)

    def adjoint_plan(self, *args):
        return self.plan

    def forward(self, *args):
        return self.fn()

    def adjoint(self, *args):
        n = len(self.arrays)
        before, given = args[:n], args[n:]
        slots = dict(zip(self.plan.adjoint_args, given))
        adjoints = tuple(slots.get(j) for j in range(n))
        if self.values:
            self.adjoint_fn(*before, *adjoints)
        else:
            self.adjoint_fn(*adjoints)


# (code, number of defaults, keyword defaults, argument count) of Python functions
# whose signature took their arguments: a step made anew for every call (a lambda in a
# loop) is inspected once
_ARITY_OK = set()


def _check_arity(name, adjoint, n, values):
    """Refuse an adjoint that cannot take the arguments the backward will pass it: one
    adjoint per distinct array of ``reads + writes`` (after the ``n`` arrays' earlier
    contents with ``values=True``).  Skipped when the signature cannot be inspected."""
    count = 2 * n if values else n
    key = None
    if type(adjoint) is types.FunctionType:
        key = (adjoint.__code__, len(adjoint.__defaults__ or ()),
               tuple(adjoint.__kwdefaults__ or ()), count)
        if key in _ARITY_OK:
            return
    try:
        sig = inspect.signature(adjoint)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*[None] * count)
        if key is not None and len(_ARITY_OK) < 4096:
            _ARITY_OK.add(key)
    except TypeError:
        plural = "" if n == 1 else "s"
        whose = "array's" if n == 1 else "arrays'"
        takes = (f"{count} arguments: the {n} {whose} contents from before "
                 f"forward (values=True), then {'its' if n == 1 else 'their'} adjoint "
                 f"buffer{plural}" if values else
                 f"{n} adjoint buffer{plural}, one per distinct array of reads + writes "
                 "(None for an array that is not floating point)")
        raise DifferentiationError(
            f"Custom step '{name}': its adjoint {getattr(adjoint, '__name__', adjoint)!r} "
            f"has the signature {sig}, but the backward calls it with {takes}. Give it one "
            "parameter per argument (or *args).") from None


def _arrays_of(given, what):
    if arrays.is_array(given):
        given = (given,)
    given = tuple(given)
    for a in given:
        if not arrays.is_array(a):
            raise DifferentiationError(
                f"A custom step's {what}= must list arrays, but got "
                f"{arrays.describe(a)}; scalars are not differentiated by custom steps.")
    return given
