"""Scratch arrays allocated inside loops (``tmp = np.empty(n)`` in a time loop's body).

Each iteration of such a loop gets a fresh array.  The region tree is rewritten so that
the array is allocated once, before the outermost loop around the allocation, and
refilled where the allocation was: with ones for ``np.ones``/``np.ones_like``, with
zeros otherwise.  The refill keeps every iteration's array fresh for the adjoint too:
its stores consume the scratch array's adjoint, so no adjoint flows from one
iteration's array into another's, and a value the reverse sweep needs is recorded or
recomputed like that of any scratch array written in a loop.  (``np.empty``'s contents
are unspecified; zeros are one valid choice, and a kernel that writes every element it
reads gets the same values either way.)  A 1-D ``np.empty`` array that a loop over its
whole size writes, element by element, before anything else touches it needs no
refill (:func:`_filled_first`).

Hoisting needs the shape to be the same in every iteration: its operands are
constants, variables the loop does not assign, or integer values computed inside the
loop, once, from those (``np.zeros((n, 3))``, ``m = x.shape[0]``), which move along
with the allocation.  A shape that changes with the loop is refused with the
allocation's location.
"""
from __future__ import annotations

import operator
from dataclasses import replace

import numpy as np
from numba.core import types

from . import ir
from .errors import DifferentiationError

_ONES = (np.ones, np.ones_like)
# integer computations that may move before the loop (no side effect, cannot raise)
_PURE_OPS = {operator.add, operator.sub, operator.mul, max, min, ir.make_tuple}


def hoist(kernel, hoistable=None):
    """``kernel`` (:class:`kadj.ir.Kernel`) with the scratch arrays allocated inside
    loops allocated before them and refilled in place; ``kernel`` itself when it has
    none.  ``hoistable(alloc)`` (an :class:`kadj.ir.Alloc`) selects the allocations
    that may move (default: all; a CUDA kernel's thread-local arrays, not the arrays a
    block shares, which one thread cannot refill alone)."""
    hoistable = hoistable or (lambda e: True)
    if not any(isinstance(s, ir.Assign) and isinstance(s.expr, ir.Alloc) and
               hoistable(s.expr) for s in _in_loops(kernel.body)):
        return kernel
    work = _Hoist(kernel, hoistable)
    body = work.seq(kernel.body)
    return replace(kernel, body=tuple(body), types=work.types)


def _in_loops(stmts):
    for s in ir.walk(stmts):
        if isinstance(s, (ir.ForRange, ir.Loop)):
            yield from ir.walk(s.body)


class _Hoist:
    def __init__(self, kernel, hoistable):
        self.kernel = kernel
        self.hoistable = hoistable
        self.types = dict(kernel.types)
        self.counts = {}
        for s in ir.walk(kernel.body):
            if isinstance(s, ir.Assign):
                self.counts[s.target] = self.counts.get(s.target, 0) + 1
        self.uid = max([s.uid for s in ir.walk(kernel.body)
                        if isinstance(s, (ir.ForRange, ir.Loop))] + [0])
        self.names = 0

    def seq(self, stmts):
        """A statement sequence outside loops: each outermost loop that allocates is
        preceded by its hoisted allocations."""
        out = []
        for s in stmts:
            if isinstance(s, ir.If):
                out.append(replace(s, then=tuple(self.seq(s.then)),
                                   orelse=tuple(self.seq(s.orelse))))
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                before, loop = self.outer_loop(s)
                out.extend(before)
                out.append(loop)
            else:
                out.append(s)
        return out

    def outer_loop(self, loop):
        """(statements hoisted before ``loop``, the rewritten loop)."""
        allocs = [s for s in ir.walk(loop.body) if isinstance(s, ir.Assign) and
                  isinstance(s.expr, ir.Alloc) and self.hoistable(s.expr)]
        if not allocs:
            return [], loop
        assigned = ir.assigned(loop.body) | (
            {loop.index} if isinstance(loop, ir.ForRange) else set())
        defs = {s.target: s for s in ir.walk(loop.body) if isinstance(s, ir.Assign)}
        moved = []          # shape computations and allocations, in order
        moved_ids = set()
        for a in allocs:
            if self.counts.get(a.target) != 1:
                raise DifferentiationError(
                    f"the scratch array '{a.target}' is allocated inside a loop and "
                    "assigned elsewhere too", kernel=self.kernel.name, loc=a.loc,
                    construct="np.empty/np.zeros in a loop, assigned more than once",
                    remedy="give each allocation its own name, or allocate the array "
                           "once, before the loop")
            for x in ir.operands(a.expr):
                self.invariant(x, a, assigned, defs, moved, moved_ids)
            moved.append(a)
            moved_ids.add(id(a))
            assigned.discard(a.target)
        body = self.rewrite(loop.body, moved_ids)
        return moved, replace(loop, body=tuple(body))

    def invariant(self, x, alloc, assigned, defs, moved, moved_ids):
        """Check that operand ``x`` of ``alloc``'s shape has the same value in every
        iteration; the computations inside the loop it comes from join ``moved``."""
        if not isinstance(x, ir.Var) or x.name not in assigned:
            return
        d = defs.get(x.name)
        if d is not None and id(d) in moved_ids:
            return
        e = getattr(d, "expr", None)
        ok = d is not None and self.counts.get(x.name) == 1 and (
            isinstance(e, (ir.Copy, ir.Item)) or
            (isinstance(e, ir.Attr) and e.attr in ("shape", "size", "ndim")) or
            (isinstance(e, ir.Op) and e.fn in _PURE_OPS and not e.kws))
        t = self.types.get(x.name)
        ok = ok and (isinstance(t, (types.Integer, types.Array)) or (
            isinstance(t, types.BaseTuple) and all(isinstance(u, types.Integer) for u in t)))
        if not ok:
            raise DifferentiationError(
                f"the shape of the scratch array '{alloc.target}' allocated inside a loop "
                f"depends on '{x.name}', which the loop changes",
                kernel=self.kernel.name, loc=alloc.loc,
                construct="np.empty/np.zeros in a loop with a varying shape",
                remedy="allocate the largest array needed once, before the loop, and use "
                       "its first elements")
        for y in ir.operands(e):
            self.invariant(y, alloc, assigned, defs, moved, moved_ids)
        moved.append(d)
        moved_ids.add(id(d))
        assigned.discard(x.name)

    def rewrite(self, stmts, moved_ids, loop_body=True):
        out = []
        for k, s in enumerate(stmts):
            if id(s) in moved_ids:
                if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Alloc) and not (
                        loop_body and _filled_first(s, stmts[k + 1:], self.types)):
                    out.extend(self.refill(s))
            elif isinstance(s, ir.If):
                out.append(replace(s, then=tuple(self.rewrite(s.then, moved_ids, False)),
                                   orelse=tuple(self.rewrite(s.orelse, moved_ids, False))))
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                out.append(replace(s, body=tuple(self.rewrite(s.body, moved_ids))))
            else:
                out.append(s)
        return out

    def fresh(self, base, typ):
        self.names += 1
        name = f"_{base}{self.names}"
        while name in self.types:
            self.names += 1
            name = f"_{base}{self.names}"
        self.types[name] = typ
        return name

    def refill(self, alloc):
        """Loops that set every element of the hoisted array ``alloc.target``."""
        arr = self.types[alloc.target]
        one = alloc.expr.fn in _ONES
        dt = arr.dtype
        if isinstance(dt, types.Float):
            value = 1.0 if one else 0.0
        elif isinstance(dt, types.Boolean):
            value = one
        else:
            value = 1 if one else 0
        loc = alloc.loc
        stmts = []
        shape = self.fresh("shape", types.UniTuple(types.intp, arr.ndim))
        stmts.append(ir.Assign(shape, ir.Attr(ir.Var(alloc.target), "shape"), loc=loc))
        dims, idx = [], []
        for k in range(arr.ndim):
            d = self.fresh("dim", types.intp)
            stmts.append(ir.Assign(d, ir.Item(ir.Var(shape), k), loc=loc))
            dims.append(d)
            idx.append(self.fresh("fill", types.intp))
        index = tuple(ir.Var(i) for i in idx) if arr.ndim > 1 else (ir.Var(idx[0]),)
        inner = (ir.Store(ir.Var(alloc.target), index, ir.Const(value), loc=loc),)
        for d, i in reversed(list(zip(dims, idx))):
            self.uid += 1
            inner = (ir.ForRange(i, ir.Const(0), ir.Var(d), ir.Const(1), inner, loc=loc,
                                 uid=self.uid),)
        return stmts + list(inner)


def _mentions(s, arr):
    return any(arr in ir.stmt_reads(x) or (isinstance(x, ir.Store) and x.array.name == arr)
               for x in ir.walk([s]))


def _filled_first(alloc, rest, T):
    """Is 1-D ``np.empty`` array ``alloc.target`` (allocated at the top of a loop body,
    ``rest`` the statements after it) written in full before any of it is read?  True
    when the first statement that touches it is ``for j in range(size)`` (the
    allocation's size, no ``break``, ``continue`` or ``return`` inside) whose body
    stores ``arr[j]`` before it touches ``arr`` otherwise, and reads only ``arr[j]``.
    Then no iteration reads an earlier iteration's contents and the refill is not
    needed; otherwise (a conservative no) the array is refilled."""
    arr = alloc.target
    if alloc.expr.fn is not np.empty or T[arr].ndim != 1 or not alloc.expr.args:
        return False
    first = next((x for x in rest if _mentions(x, arr)), None)
    if not (isinstance(first, ir.ForRange) and first.start == ir.Const(0) and
            first.step == ir.Const(1) and first.stop == alloc.expr.args[0]):
        return False
    j = (ir.Var(first.index),)
    if any(isinstance(x, (ir.Break, ir.Continue, ir.Return)) for x in ir.walk(first.body)):
        return False
    stored = False
    for x in first.body:
        if isinstance(x, ir.Store) and x.array.name == arr and x.index == j and \
                not x.accumulate and not stored:
            stored = True
            continue
        if not _mentions(x, arr):
            continue
        if not stored:
            return False
        for y in ir.walk([x]):
            reads = ir.stmt_reads(y)
            if isinstance(y, ir.Store) and y.array.name == arr:
                return False
            if arr in reads and not (isinstance(y, ir.Assign) and
                                     isinstance(y.expr, ir.Load) and
                                     y.expr.array.name == arr and y.expr.index == j):
                return False
    return stored
