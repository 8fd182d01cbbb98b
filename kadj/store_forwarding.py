"""An element stored and read again in the same statement sequence (CPU, before the
analysis).

``y[i] += a * x[i]; y[i] *= a`` stores ``y[i]`` and loads it back in the next
statement.  Each load of an element the forward sweep has just written reads the work
copy's changing state, which the reverse sweep can only get back from a tape.  This
rewrite reads the stored value instead (the load becomes a copy of the variable stored;
a numba temporary assigned once is replaced by that variable wherever it is read, when
the variable too is assigned once) and drops a store that a later store of the same
sequence overwrites with nothing reading the array in between::

    y[i] = t1            ->   (dropped)
    t2 = y[i]            ->   t2 = t1        ($t2, a temporary: gone, its reads read t1)
    ...
    y[i] = t5            ->   y[i] = t5

It applies to an argument array's element (argument arrays never share memory: kadj
refuses aliased arguments at call time) with the same index text at the store and the
load, in one statement sequence, with nothing between them that may change the element
or the index: a store into the array (nested ones included), an assignment to an index
variable or to the stored variable, a call with an array operand, or a
``break``/``continue``/``return``.  The stored variable must have the array's dtype
(a store that converts the value is left alone).  A kernel's result is unchanged.

With the loads gone, the first load of the element in an iteration often reads the
value the array had on entry (:mod:`kadj.entry_loads`).
"""
from __future__ import annotations

from dataclasses import replace

from numba.core import types

from . import ir
from .gather_plan import _single_defs

__all__ = ["rewrite"]


def rewrite(kernel):
    """``kernel`` with element loads that follow a store of the element read from the
    stored variable, and overwritten stores dropped (itself if none)."""
    T = kernel.types
    params = {a for a in kernel.args if isinstance(T.get(a), types.Array)}
    if not params or not any(isinstance(s, ir.Store) and s.array.name in params
                             for s in ir.walk(kernel.body)):
        return kernel
    changed = [False]
    # variables one assignment (or the argument list) defines
    assigned = ir.assigned(kernel.body)
    once = (set(_single_defs(kernel)) - set(kernel.args)) | \
        {a for a in kernel.args if a not in assigned}
    renames = {}

    def seq(stmts):
        out = [ir.map_nested(s, seq) for s in stmts]
        if _forward(out, T, params, once, renames):
            changed[0] = True
            out = [s for s in out if s is not None]
        if _drop_overwritten(out, T, params):
            changed[0] = True
        return out

    body = type(kernel.body)(seq(kernel.body))
    if renames:
        def final(n):
            while n in renames:
                n = renames[n]
            return n
        body = ir.renamed_reads(body, {t: final(t) for t in renames})
    return replace(kernel, body=body) if changed[0] else kernel


def _plain(s, params):
    """A plain store into an argument array: ``y[i] = v`` (no atomic increment)."""
    return isinstance(s, ir.Store) and s.accumulate is None and s.array.name in params


def _may_change(x, arr, names, T):
    """Can statement ``x`` (with what it nests) change element ``arr[...]``, one of
    ``names``, or leave the sequence?"""
    for y in ir.walk([x]):
        if isinstance(y, (ir.Break, ir.Continue, ir.Return)):
            return True
        if isinstance(y, ir.Store) and y.array.name == arr:
            return True
        if isinstance(y, ir.Assign):
            if y.target in names:
                return True
            if isinstance(y.expr, (ir.Op, ir.Alloc)) and (
                    getattr(y.expr.fn, "_kadj_impure", False) or any(
                        isinstance(v, ir.Var) and isinstance(T.get(v.name), types.Array)
                        for v in ir.operands(y.expr))):
                return True
        elif isinstance(y, ir.ForRange) and y.index in names:
            return True
    return False


def _forward(out, T, params, once, renames):
    """Loads after a store of the same element in ``out`` (a list, changed in place)
    read the stored variable: a copy of it, or, for a numba temporary where both it and
    the stored variable are assigned once in the kernel, the stored variable itself
    wherever the temporary is read (the load becomes None in ``out``; ``renames`` gets
    the temporary's new name).  Returns whether any load was forwarded."""
    changed = False
    for p, s in enumerate(out):
        if not (_plain(s, params) and isinstance(s.value, ir.Var) and
                T.get(s.value.name) == T[s.array.name].dtype):
            continue
        arr = s.array.name
        names = ir.var_names(s.index) | {s.value.name}
        for q in range(p + 1, len(out)):
            x = out[q]
            if x is None:
                continue
            if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load) and \
                    x.expr.array.name == arr and ir.same_index(x.expr.index, s.index):
                changed = True
                if x.target.startswith("$") and x.target in once and \
                        s.value.name in once:
                    out[q] = None
                    renames[x.target] = s.value.name
                    continue
                out[q] = ir.Assign(x.target, ir.Copy(s.value), loc=x.loc)
                if x.target in names:
                    break
                continue
            if _may_change(x, arr, names, T):
                break
    return changed


def _reads(x, arr, T):
    """Can statement ``x`` (with what it nests) read array ``arr``?"""
    for y in ir.walk([x]):
        if isinstance(y, ir.Assign):
            e = y.expr
            if isinstance(e, ir.Load) and e.array.name == arr:
                return True
            if isinstance(e, (ir.Op, ir.Alloc, ir.Copy)) and any(
                    isinstance(v, ir.Var) and isinstance(T.get(v.name), types.Array)
                    for v in ir.operands(e)):
                return True
        elif isinstance(y, ir.Return) and isinstance(y.value, ir.Var) and \
                isinstance(T.get(y.value.name), types.Array):
            return True
    return False


def _drop_overwritten(out, T, params):
    """Drop from ``out`` (a list, changed in place) each store that a later store of
    the same element overwrites with nothing reading the array in between.  Returns
    whether any was dropped."""
    changed = False
    p = 0
    while p < len(out):
        if _plain(out[p], params) and _overwritten(out, p, T, params):
            del out[p]
            changed = True
        else:
            p += 1
    return changed


def _overwritten(out, p, T, params):
    """Does a later store of ``out`` overwrite store ``out[p]``'s element before
    anything can read the array or change the index?"""
    s = out[p]
    arr, names = s.array.name, ir.var_names(s.index)
    for x in out[p + 1:]:
        if _plain(x, params) and x.array.name == arr and ir.same_index(x.index, s.index):
            return True
        if _reads(x, arr, T) or _may_change(x, arr, names, T):
            return False
    return False
