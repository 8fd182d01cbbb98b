"""Loads that read what an argument array held on entry (CPU, before the analysis).

An adjoint never writes the user's arrays: its forward sweep runs on a work copy of
each argument array the kernel both reads and writes, and the reverse sweep finds there
only the array's last state.  A load that reads an element's value before any store of
the kernel can have changed that element reads, at any time, what the user's array
still holds: marked ``entry`` (:attr:`kadj.ir.Load.entry`), it is read from the user's
array in both sweeps, the reverse sweep recomputes what it feeds instead of taping it,
and an array read only by such loads needs no work copy at all.  An in-place update
``y[i] = f(x[i], y[i])`` then costs its adjoint neither a copy nor a tape.

A load of argument array ``y`` is marked when

- no loop encloses it and no store into ``y`` comes before it; or
- every store into ``y`` before the end of the outermost loop around the load lies in
  the load's innermost loop, after the load in the body, at the same index, and that
  index names the counter of every loop around the load (``for`` loops whose counters
  never go negative and are not assigned in their bodies) and otherwise only constants and
  variables those loops do not assign: each iteration then owns its element and reads
  it before writing it (``for i: y[i] = f(y[i])``, ``for i: for j: y[i, j] *= s``).

An array that the kernel passes to a call, copies or returns is left alone.
"""
from __future__ import annotations

from dataclasses import replace

from numba.core import types

from . import ir

__all__ = ["rewrite"]


def rewrite(kernel):
    """``kernel`` with its entry loads marked (itself if none)."""
    T = kernel.types
    params = {a for a in kernel.args if isinstance(T.get(a), types.Array)}
    found = _Found()
    found.visit(kernel.body, ())
    stores = {a: v for a, v in found.stores.items() if a in params - found.escaping}
    if not stores:
        return kernel
    marked = set()
    for st, stack, pos in found.loads:
        arr = st.expr.array.name
        if arr in stores and _entry(st.expr, stack, pos, stores[arr]):
            marked.add(id(st))
    if not marked:
        return kernel

    def seq(stmts):
        out = []
        for s in stmts:
            if id(s) in marked:
                s = replace(s, expr=replace(s.expr, entry=True))
            elif isinstance(s, ir.If):
                s = replace(s, then=seq(s.then), orelse=seq(s.orelse))
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                s = replace(s, body=seq(s.body))
            out.append(s)
        return type(stmts)(out)

    return replace(kernel, body=seq(kernel.body))


class _Found:
    """Stores and loads with their enclosing loops (outermost first) and walk order;
    arrays used otherwise than by element."""

    def __init__(self):
        self.stores, self.loads, self.escaping = {}, [], set()
        self.pos = 0

    def visit(self, stmts, stack):
        for s in stmts:
            self.pos += 1
            if isinstance(s, ir.Store):
                self.stores.setdefault(s.array.name, []).append((s, stack, self.pos))
            elif isinstance(s, ir.Assign):
                e = s.expr
                if isinstance(e, ir.Load):
                    self.loads.append((s, stack, self.pos))
                elif not isinstance(e, (ir.Attr, ir.Item)):
                    self.escaping |= ir.var_names(ir.operands(e))
            elif isinstance(s, ir.Return) and isinstance(s.value, ir.Var):
                self.escaping.add(s.value.name)
            if isinstance(s, ir.If):
                self.visit(s.then, stack)
                self.visit(s.orelse, stack)
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                self.visit(s.body, stack + (s,))


def _inside(stack, loop):
    return any(x is loop for x in stack)


def _entry(load, stack, pos, stores):
    """Does ``load`` (at walk position ``pos``, inside the loops ``stack``) read the
    value its array had on entry?  ``stores``: the array's stores with theirs."""
    if not stack:
        return all(p > pos for _, _, p in stores)
    outer, inner = stack[0], stack[-1]
    own = []
    for st, st_stack, p in stores:
        if not _inside(st_stack, outer):
            if p < pos:
                return False     # before the loop nest
            continue             # after it
        if not (st_stack and st_stack[-1] is inner and p > pos and
                ir.same_index(st.index, load.index)):
            return False
        own.append(st)
    return not own or _owned(load.index, stack)


def _owned(index, stack):
    """Does every iteration of the loop nest ``stack`` address its own element with
    ``index``?"""
    counters = set()
    for loop in stack:
        if not isinstance(loop, ir.ForRange) or not ir.never_negative(loop) or \
                loop.index in ir.assigned(loop.body):
            return False
        counters.add(loop.index)
    named = ir.var_names(index)
    if not counters <= named:
        return False
    assigned = ir.assigned(stack[0].body)
    return all(isinstance(x, ir.Const) or (isinstance(x, ir.Var) and (
        x.name in counters or x.name not in assigned)) for x in index)

