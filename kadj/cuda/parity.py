"""Checkerboard (red-black) updates in place: which neighbours no thread writes.

A red-black Gauss-Seidel or SOR sweep updates one colour of a grid in place, reading
the neighbours, which have the other colour::

    i, j = cuda.grid(2)
    if 0 < i < n - 1 and 0 < j < m - 1:
        if (i + j) % 2 == color:
            u[i, j] = (1 - w) * u[i, j] + 0.25 * w * (u[i - 1, j] + u[i + 1, j] + ...)

Each thread writes only its own element, and only when the parity of its coordinates
matches ``color``; the neighbours it reads sit one step away, at the other parity, so
no thread writes them during the launch.  :func:`checkerboard_key` proves that from
the conditions around the accesses, and the own element then becomes a *cell*
(:mod:`kadj.cuda.cells`), while the neighbours stay plain loads: the adjoint reads
them from the user's (pre-call) array, which holds what the launch read, and adds
into their adjoints with atomics; no thread consumes a neighbour's adjoint, so the
consuming of the own element's adjoint races with no thread's addition.

The proof works modulo 2.  A condition on the path to an access asserts a linear form
over the integers modulo 2 to be zero: ``(i + j) % 2 == color`` asserts
``i + j + color``, ``(i + color) & 1`` false asserts ``i + color``; a form's terms are
thread coordinates (the roots of the own element's key) and integer kernel
arguments the kernel never assigns (the same for every thread).  A read at the own
element plus offsets, under a form F that every store also sits under, with
``F(offsets)`` odd, reads an element no thread writes: a thread writing it would have
coordinates equal to the reader's plus the offsets, and F zero at both.
"""
from __future__ import annotations

import builtins
import operator

from numba.core import types

from .. import ir

__all__ = ["checkerboard_key"]

_DEPTH = 8


def checkerboard_key(kernel, index, name):
    """(own key, ids of the loads at other elements) when every store into argument
    array ``name`` is at the thread's own element and every other load is of an
    element no thread of the launch writes, by parity (module docstring); else None."""
    stores, loads = [], []
    lin = _Forms(kernel, index)

    def visit(seq, forms):
        for s in seq:
            if isinstance(s, ir.Store) and s.array.name == name:
                stores.append((s, forms))
            elif isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load) and \
                    s.expr.array.name == name:
                loads.append((s, forms))
            elif isinstance(s, ir.If):
                visit(s.then, forms | lin.asserted(s.cond, True))
                visit(s.orelse, forms | lin.asserted(s.cond, False))
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                visit(s.body, forms)

    visit(kernel.body, frozenset())
    for s in ir.walk(kernel.body):     # nothing else may see the array (a view, a call)
        if name in ir.stmt_reads(s) and not (
                isinstance(s, ir.Store) and s.array.name == name or
                isinstance(s, ir.Assign) and isinstance(s.expr, (ir.Load, ir.Attr))):
            return None
    if not stores or not loads or any(s.accumulate for s, _ in stores):
        return None
    keys = {index.owned_key(tuple(s.index)) for s, _ in stores}
    if len(keys) != 1 or None in keys:
        return None
    key = keys.pop()
    # the forms every store sits under, over the key's coordinates and uniform names
    roots = {v for kind, v in key if kind == "c"}
    common = frozenset.intersection(*(f for _, f in stores))
    common = {f for f in common if f[0] & roots and f[0] <= roots | lin.uniform}
    foreign = set()
    for s, forms in loads:
        idx = tuple(s.expr.index)
        if index.owned_key(idx) == key:
            continue
        offsets = lin.offsets(idx, key)
        if offsets is None:
            return None
        if not any(sum(offsets.get(v, 0) for v in terms) % 2 == 1
                   for terms, _ in common & forms):
            return None
        foreign.add(id(s))
    if not foreign:
        return None
    return key, foreign


class _Forms:
    """Integer-linear and mod-2 forms of a kernel's index arithmetic."""

    def __init__(self, kernel, index):
        self.k, self.index = kernel, index
        assigned = ir.assigned(kernel.body)
        self.uniform = {a for a in kernel.args
                        if isinstance(kernel.types.get(a), types.Integer)
                        and a not in assigned}

    def linear(self, x, depth=0):
        """({term: coefficient}, constant) of integer ``x``: thread coordinates (by
        their root) and uniform arguments as terms; None when not linear."""
        ix = self.index
        if isinstance(x, ir.Const):
            v = x.value
            return ({}, v) if isinstance(v, int) and not isinstance(v, bool) else None
        if not isinstance(x, ir.Var) or depth > _DEPTH:
            return None
        if x.name in ix.consts:
            return {}, ix.consts[x.name]
        if x.name in ix.coord:
            return {ix.root.get(x.name, x.name): 1}, 0
        if x.name in self.uniform:
            return {x.name: 1}, 0
        e = ix.defs.get(x.name)
        if isinstance(e, ir.Copy):
            return self.linear(e.src, depth + 1)
        if not (isinstance(e, ir.Op) and len(e.args) == 2 and
                e.fn in (operator.add, operator.sub, operator.mul)):
            return None
        a, b = (self.linear(y, depth + 1) for y in e.args)
        if a is None or b is None:
            return None
        if e.fn is operator.mul:
            if a[0] and b[0]:
                return None
            (terms, c), k = (a, b[1]) if not b[0] else (b, a[1])
            return {v: k * n for v, n in terms.items()}, k * c
        sign = 1 if e.fn is operator.add else -1
        terms = dict(a[0])
        for v, n in b[0].items():
            terms[v] = terms.get(v, 0) + sign * n
        return {v: n for v, n in terms.items() if n}, a[1] + sign * b[1]

    def parity(self, x, depth=0):
        """(odd terms, constant bit, whether ``x`` is 0 or 1) of integer ``x`` modulo
        2, or None."""
        if isinstance(x, ir.Var) and depth <= _DEPTH:
            e = self.index.defs.get(x.name)
            if isinstance(e, ir.Copy):
                return self.parity(e.src, depth + 1)
            if isinstance(e, ir.Op) and len(e.args) == 2 and (
                    (e.fn is operator.mod and _is_const(e.args[1], 2)) or
                    (e.fn is operator.and_ and _is_const(e.args[1], 1))):
                inner = self.parity(e.args[0], depth + 1)
                return None if inner is None else (inner[0], inner[1], True)
        form = self.linear(x)
        if form is None:
            return None
        terms, c = form
        odd = frozenset(v for v, n in terms.items() if n % 2)
        return odd, c % 2, not terms and c in (0, 1)

    def asserted(self, cond, truth, depth=0):
        """The forms (odd terms, constant bit) that ``cond`` being ``truth`` makes
        zero modulo 2, as a frozenset (empty when it says nothing about parity)."""
        if not isinstance(cond, ir.Var) or depth > _DEPTH:
            return frozenset()
        e = self.index.defs.get(cond.name)
        if isinstance(e, ir.Copy):
            return self.asserted(e.src, truth, depth + 1)
        if not isinstance(e, ir.Op):
            return frozenset()
        if e.fn in (builtins.bool, operator.truth) and len(e.args) == 1:
            inner = e.args[0]
            d = self.index.defs.get(inner.name) if isinstance(inner, ir.Var) else None
            if isinstance(d, ir.Op) and d.fn in (operator.eq, operator.ne,
                                                 operator.not_):
                return self.asserted(inner, truth, depth + 1)
            p = self.parity(inner)
            if p is None or not p[2]:
                return frozenset()
            return _form(p[0], p[1] ^ truth)        # a bit: true means it is 1
        if e.fn is operator.not_ and len(e.args) == 1:
            return self.asserted(e.args[0], not truth, depth + 1)
        if e.fn in (operator.eq, operator.ne) and len(e.args) == 2:
            equal = truth if e.fn is operator.eq else not truth
            p, q = (self.parity(y) for y in e.args)
            if p is None or q is None:
                return frozenset()
            terms, c = p[0] ^ q[0], p[1] ^ q[1]
            if equal:
                return _form(terms, c)
            if p[2] and q[2]:                       # two bits that differ
                return _form(terms, c ^ 1)
        return frozenset()

    def offsets(self, idx, key):
        """{coordinate root: constant} when index ``idx`` is the own element ``key``
        shifted by constants, else None."""
        if len(idx) != len(key):
            return None
        out = {}
        for x, (kind, v) in zip(idx, key):
            form = self.linear(x)
            if form is None:
                return None
            terms, c = form
            if kind == "k":
                if terms or c != v:
                    return None
            elif terms != {v: 1}:
                return None
            else:
                out[v] = c
        return out


def _form(terms, bit):
    return frozenset({(frozenset(terms), bit)}) if terms else frozenset()


def _is_const(x, value):
    return isinstance(x, ir.Const) and x.value == value and not isinstance(x.value, bool)
