"""How many values a CPU kernel's adjoint records on its tape in one call.

A CPU adjoint records overwritten values on growable tapes, one per kind
(``_tape_f64``, ``_tape_i64``, ...), each with its stack pointer ``_sp_<kind>``; the
entries it needs depend on the trip counts at run time.  :func:`cpu_tape_usage` runs the
generated adjoint once as plain Python (NumPy semantics, the same code numba compiles)
on copies of the arguments and follows each stack pointer, so its peak is exact for
these arguments.  Interpreting is slow: the run stops after ``max_lines`` executed lines
and the usage is then unknown (give smaller example arguments).  Checkpoint storage of
``checkpoints=N`` adjoints is not a tape and is not counted.
"""
from __future__ import annotations

import sys

import numpy as np

from .lowering import TAPE_DTYPES
from .select_intrinsic import as_conditional

MAX_LINES = 2_000_000


class TooLarge(Exception):
    """The interpreted run exceeded its line budget."""


def adjoint_buffers(plan, args, fill=1.0):
    """Fresh adjoint buffers for ``args`` (array adjoints filled with ``fill``, a
    scalar's 1-element buffer with zero)."""
    out = []
    for i in plan.adjoint_args:
        a = args[i]
        if isinstance(a, np.ndarray):
            out.append(np.full_like(a, fill))
        else:
            dtype = a.dtype if isinstance(a, np.inexact) else \
                np.result_type(type(a), np.float64)
            out.append(np.zeros(1, dtype=dtype))
    return out


def cpu_tape_usage(kernel, args, max_lines=MAX_LINES):
    """``{kind: (peak entries, bytes)}`` of one adjoint call of CPU ``kernel`` at
    ``args``; raises :class:`TooLarge` past ``max_lines`` interpreted lines."""
    comp = kernel.compiled(*args)
    # (each _select as the conditional expression: only the chosen value computed)
    fn = as_conditional(comp.function.py_func, comp.source)
    fwd = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    call = [*fwd, *adjoint_buffers(comp.plan, fwd)]
    if comp.plan.returns_value:
        call.append(1.0)
    call += comp.fresh_memory()
    code, peaks, budget = fn.__code__, {}, [max_lines]

    def note(frame):
        for name, v in frame.f_locals.items():
            if name.startswith("_sp_") and isinstance(v, (int, np.integer)):
                kind = name[4:]
                if v > peaks.get(kind, 0):
                    peaks[kind] = int(v)

    def local(frame, event, _arg):
        budget[0] -= 1
        if budget[0] < 0:
            raise TooLarge(f"more than {max_lines} lines")
        note(frame)
        return local

    def outer(frame, event, _arg):
        return local if frame.f_code is code else None

    old = sys.gettrace()
    sys.settrace(outer)
    try:
        fn(*call)
    finally:
        sys.settrace(old)
    for name in code.co_varnames:
        if name.startswith("_sp_"):
            peaks.setdefault(name[4:], 0)
    return {kind: (n, n * _itemsize(kind)) for kind, n in sorted(peaks.items())}


def _itemsize(kind):
    return np.dtype(TAPE_DTYPES.get(kind, "float64")).itemsize


def bounded_usage(entries):
    """``{kind: (entries, bytes)}`` of a bounded (per-thread) tape ``{kind: entries}``."""
    return {k: (int(n), int(n) * _itemsize(k)) for k, n in sorted(entries.items())}
