"""The CPU's accumulation policy for scalar adjoints summed in loops.

A reversed loop often adds into one scalar adjoint (``adj_alpha += g * t``, a local sum
``_acc_x2 += adj_acc * acc``).  Printed as ``+=``, that sum is a serial chain of
floating-point additions that LLVM may not reorder, and the loop cannot be vectorised.
:func:`vector_sums` marks such accumulations ``how="sum"``; the printer spells them
``t = _sum_add(t, v)`` (:class:`kadj.printer.Syntax`, :mod:`kadj.sum_intrinsic`), one
addition LLVM may reassociate, so it can keep several partial sums.

Only these sums change: the forward values the adjoint recomputes, its branch
conditions and loop exits are computed exactly as the kernel computes them (no
fast-math flag on anything else), so the adjoint takes the forward's path.  Marked:
``+=`` accumulations, still plain, into a float32/float64 scalar adjoint or local sum
that the innermost loop around them only sums into (a reduction: no other statement
of that loop assigns or reads it), outside loops made parallel (whose reductions numba
recognises by their ``+=``).
"""
from __future__ import annotations

from dataclasses import fields

from numba.core import types

from . import adj_ir as A
from .adj_refs import names
from .parallel import is_parallel_for
from .sum_intrinsic import _sum_add

def vector_sums(fn, w):
    """Mark the scalar sums of ``fn`` (an adjoint IR function, simplified) that are
    reductions of a loop ``how="sum"``; binds the function the printer spells them
    with in the writer ``w``'s namespace when one is marked.  Returns the number
    marked."""
    marked = []
    seen = {}       # id(loop) -> (loop, the names it mentions other than as such sums)

    def visit(seq, loop):
        for x in seq:
            if isinstance(x, A.ReverseLoop) and x.parallel or is_parallel_for(x):
                continue
            if loop is not None and _summable(w, x) and \
                    x.target.name not in _not_only_summed(loop, seen):
                x.how = "sum"
                marked.append(x)
            inner = x if isinstance(x, (A.For, A.While)) else loop
            for body in x.children():
                visit(body, inner)
    visit(fn.body, None)
    if marked:
        w.ns[w.syntax.sum_add] = _sum_add
    return len(marked)


def _summable(w, x):
    """A plain ``+=`` into a float32/float64 scalar adjoint or local sum."""
    if not (isinstance(x, A.Accumulate) and x.op == "+=" and x.how == "plain"):
        return False
    t = x.target
    if isinstance(t, A.AdjVar):
        typ = w.T.get(t.var)
    elif isinstance(t, A.Local) and t.array is not None:
        typ = getattr(w.T.get(t.array), "dtype", None)
    else:
        return False
    return isinstance(typ, types.Float)


def _not_only_summed(loop, seen):
    """The names that, in ``loop`` (the innermost loop around a sum), are not only the
    target of such sums: assigned otherwise or read (its header too: variable, range,
    condition).  A name not among them is a reduction, whose partial sums no statement
    of the loop sees.  Kept in ``seen`` per loop (marking a sum changes none of it)."""
    got = seen.get(id(loop))
    if got is not None and got[0] is loop:
        return got[1]
    out = set(_mentioned(loop))
    for x in A.walk(loop.body):
        if isinstance(x, A.Accumulate) and x.op == "+=" and x.how in ("plain", "sum") \
                and isinstance(x.target, (A.AdjVar, A.Local)):
            name = x.target.name
            read = set(names(x.value))
            out |= _mentioned(x) - {name} | (read & {name})
            continue
        out |= _mentioned(x)
    seen[id(loop)] = (loop, out)
    return out


def _mentioned(x):
    """The names a node mentions in its own fields (targets, texts), not its bodies
    nor its comments."""
    found = set()
    if isinstance(x, A.Comment):
        return found
    for f in fields(x):
        v = getattr(x, f.name)
        if f.name == "note":
            continue
        if isinstance(v, str):
            found.update(names(v))
        elif isinstance(v, (A.AdjVar, A.Local)):
            found.add(v.name)
        elif isinstance(v, A.AdjElem):
            found.add(v.base)
            for text in v.index_texts:
                found.update(names(text))
        elif isinstance(v, (tuple, list)) and not (v and isinstance(v[0], A.Node)):
            for item in v:
                if isinstance(item, str):
                    found.update(names(item))
    return found
