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
  the load's innermost loop, and no iteration before the load's writes the element it
  reads: the index names the counter of every loop around the load once, each plus a
  constant (``for`` loops with a constant step and a lowest counter value at which no
  index goes negative, counters not assigned in their bodies) and otherwise only
  constants and variables the loops do not assign, and each store's index differs only
  in the innermost counter's constant, by an amount that puts the element in a later
  iteration, or in none, or in the same one with the store after the load in the body.
  ``for i: y[i] = f(y[i])``, ``for i: for j: y[i, j] *= s``, and the forward neighbour
  of an update in place going up, ``y[i + 1]`` in ``y[i] = g(y[i - 1], y[i], y[i + 1])``
  (``y[i - 1]`` is the previous iteration's: not marked).

An array that the kernel passes to a call, copies or returns is left alone.
"""
from __future__ import annotations

from dataclasses import replace

from numba.core import types

from . import ir
from .gather_plan import _single_defs, coord_offset

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
    defs = _single_defs(kernel)
    for st, stack, pos in found.loads:
        arr = st.expr.array.name
        if arr in stores and _entry(st.expr, stack, pos, stores[arr], defs):
            marked.add(pos)
    if not marked:
        return kernel
    at = [0]

    def seq(stmts):
        out = []
        for s in stmts:
            at[0] += 1          # the walk order of _Found.visit
            if at[0] in marked:
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


def _entry(load, stack, pos, stores, defs):
    """Does ``load`` (at walk position ``pos``, inside the loops ``stack``) read the
    value its array had on entry?  ``stores``: the array's stores with theirs;
    ``defs``: the kernel's variables assigned once, with their expressions."""
    if not stack:
        return all(p > pos for _, _, p in stores)
    outer, inner = stack[0], stack[-1]
    nest = None
    for st, st_stack, p in stores:
        if not _inside(st_stack, outer):
            if p < pos:
                return False     # before the loop nest
            continue             # after it
        if not (st_stack and st_stack[-1] is inner):
            return False
        if nest is None:
            if not all(isinstance(loop, ir.ForRange) for loop in stack):
                return False     # a while loop may reach the element again
            nest = _Nest(stack, defs)
            at = nest.coords(load.index)
            if at is None:
                return False
        ahead = nest.ahead(at, nest.coords(st.index))
        if ahead is None or (ahead == 0 and p < pos):
            return False
    return True


class _Nest:
    """The loop nest around a load: its counters, each loop's lowest counter value,
    and the elements an index addresses in terms of them."""

    def __init__(self, stack, defs):
        self.stack = stack
        self.depth = {loop.index: d for d, loop in enumerate(stack)}
        # what coord_offset may follow: computations in the innermost loop's body (run
        # again at each iteration) and constants
        inside = ir.assigned(stack[-1].body)
        self.offset_defs = {v: e for v, e in defs.items()
                            if v in inside or isinstance(e, ir.Const)}
        self.outer_assigned = ir.assigned(stack[0].body)
        self.lowest = []
        for loop in stack:
            ok = ir.never_negative(loop) and loop.index not in ir.assigned(loop.body)
            step = loop.step.value if ok else 0
            bound = loop.start if step > 0 else loop.stop
            self.lowest.append(None if not ok else
                               bound.value if step > 0 else bound.value + 1)

    def coords(self, index):
        """Per position of ``index``: ``(depth, constant)`` for a counter plus a
        constant (never below 0), or ``("fixed", operand)`` for a constant or a
        variable the nest does not assign; None for anything else, or when some loop's
        counter is at no position or at two."""
        out = []
        for x in index:
            off = coord_offset(x, self.depth, self.offset_defs)
            if off is not None:
                low = self.lowest[off[0]]
                if low is None or low + off[1] < 0:
                    return None      # a negative index wraps onto another element
                out.append(off)
            elif isinstance(x, ir.Const) or (isinstance(x, ir.Var) and
                                             x.name not in self.outer_assigned):
                out.append(("fixed", x))
            else:
                return None
        depths = sorted(c[0] for c in out if c[0] != "fixed")
        return out if depths == list(range(len(self.stack))) else None

    def ahead(self, load, store):
        """How many iterations of the innermost loop after the load's the store
        writes the load's element (0: the same iteration; the outer loops' iterations
        are the load's), when not before it; else None."""
        if store is None or len(store) != len(load):
            return None
        gap = 0
        for a, b in zip(load, store):
            if a[0] == "fixed" or b[0] == "fixed":
                if a[0] != b[0] or not ir.same_index((a[1],), (b[1],)):
                    return None
                continue
            if a[0] != b[0]:
                return None
            if a[0] < len(self.stack) - 1:
                if a[1] != b[1]:
                    return None      # another iteration of an outer loop
                continue
            gap = a[1] - b[1]
        if gap == 0:
            return 0
        if gap * self.stack[-1].step.value < 0:
            return None              # an earlier iteration writes it
        return 1                     # a later one (or none: a step it skips)
