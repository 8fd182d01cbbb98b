"""Reductions and products of whole arrays (part of :mod:`kadj.array_lowering`):
``np.sum``, ``np.mean``, ``np.max``/``np.min`` (and the ``a.sum()`` method forms),
``np.linalg.norm`` (a vector's 2-norm, a matrix's Frobenius norm) become an accumulator
loop nest (``acc = 0; for i: acc = acc + a[i]``); ``np.dot``/``@`` of 1-D and 2-D arrays
a loop over the contracted index for each result element.  ``np.max``/``np.min`` go
through the scalar ``max``/``min`` rules (the adjoint flows to the arg max, the first
one where several elements tie); unlike NumPy they skip NaNs and return -inf/+inf for
an empty float array.

A constant ``axis`` (``np.sum(A, axis=0)``, ``A.sum(1)``, negative axes counted from
the end) reduces along that dimension only: a loop nest over the result's elements,
each accumulated over the axis (numba types ``axis=`` for ``np.sum`` and ``.sum``
only).  ``np.cumsum(x)`` / ``x.cumsum()`` of a 1-D array is a running sum stored at
each step, ``np.outer(a, b)`` of 1-D arrays a product per element of the result."""
from __future__ import annotations

import math
import operator

import numpy as np
from numba.core import ir as nir
from numba.core import types

from . import array_checks as checks
from . import ir
from . import rules

REDUCE = {np.sum: "sum", np.mean: "mean", np.max: "max", np.min: "min",
          np.amax: "max", np.amin: "min", np.linalg.norm: "norm"}
METHODS = {"sum": "sum", "mean": "mean", "max": "max", "min": "min", "cumsum": "cumsum",
           "copy": "copy"}


class ReduceLowering:
    """Methods of :class:`kadj.array_lowering.ArrayLowering` for reductions."""

    def call(self, tgt, e, fn, fname, loc):
        """A call with an array argument (``fn`` resolved), or None when it is none of
        the whole-array forms (the caller refuses it)."""
        args = list(e.args)
        ttype = self.typ(tgt)
        if fn is len and args and self.name(args[0]) in self.views:
            return [ir.Assign(tgt, ir.Copy(self.views[self.name(args[0])].extents[0]),
                              loc=loc)]
        if fn is slice:
            return []
        kind = REDUCE.get(fn)
        if kind is not None and args and isinstance(self.typ(args[0]), types.Array):
            if kind == "norm" and len(args) > 1:
                self.refuse("np.linalg.norm with an ord argument", loc)
            axis = self.axis_of(args[1:], e.kws, fname, loc)
            return self.reduce_along(tgt, kind, self.name(args[0]), axis, loc)
        if fn is np.searchsorted and 2 <= len(args) + len(e.kws) <= 3:
            return self.searchsorted(tgt, args, dict(e.kws), loc)
        if fn in (np.argmax, np.argmin) and len(args) == 1 and not e.kws:
            return self.arg_extremum(tgt, args[0], fn is np.argmax, loc)
        if e.kws or e.vararg is not None:
            self.refuse(f"{fname}() with keyword arguments (axis=, ord=, ...)", loc)
        if fn is np.where and len(args) == 3 and isinstance(ttype, types.Array):
            return self.where(tgt, args, loc)
        if fn is np.clip and len(args) == 3 and isinstance(ttype, types.Array):
            return self.clip(tgt, args, loc)
        if fn in (np.dot, np.matmul, np.vdot) and len(args) == 2:
            return self.matmul(tgt, args, loc)
        if fn is np.outer and len(args) == 2:
            return self.outer(tgt, args, loc)
        if fn is np.cumsum and len(args) == 1:
            return self.cumsum(tgt, self.name(args[0]), loc)
        if fn is np.copy and len(args) == 1 and not e.kws and \
                isinstance(self.typ(args[0]), types.Array):
            return self.copied(tgt, args[0], loc)
        elementwise = (type(fn).__name__ == "ufunc" and len(args) == fn.nin) or \
            fn is abs and len(args) == 1
        if elementwise and isinstance(ttype, types.Array) and (
                rules.lookup(fn) is not None or fn in rules.NONDIFFERENTIABLE):
            return self.elementwise(tgt, fn, args, loc)
        return None

    def searchsorted(self, tgt, args, kws, loc):
        """``tgt = np.searchsorted(a, v)`` (``side="left"`` or ``"right"``, a constant)
        of a sorted 1-D array and one number: a binary search loop, ``lo = 0; hi = n;
        while lo < hi: mid = (lo + hi) // 2; if a[mid] < v (<= v on the right): lo =
        mid + 1 else: hi = mid``.  An integer: no derivative; the reverse sweep takes the
        same decisions from the same elements (the loads are the kernel's own)."""
        st = self.st
        a, v = (args + [kws.pop("v", None)])[:2] if len(args) < 2 else args[:2]
        side = args[2] if len(args) > 2 else kws.pop("side", None)
        if kws or a is None or v is None or not isinstance(self.typ(a), types.Array) or \
                self.ndim(self.name(a)) != 1 or \
                not isinstance(self.typ(v), (types.Number, types.Boolean)):
            self.refuse("np.searchsorted other than of a 1-D array and one number "
                        "(an array of queries, sorter=)", loc,
                        remedy="loop over the queries and search each one")
        right = False
        if side is not None:
            c = st.const_of(side)
            value = c.value if c is not None else getattr(self.typ(side),
                                                          "literal_value", None)
            if value not in ("left", "right"):
                self.refuse("np.searchsorted with a side that is not the constant "
                            "'left' or 'right'", loc)
            right = value == "right"
        src, out = self.name(a), []
        (n,) = self.extents(src, out, loc)
        lo, hi = (ir.Var(st.fresh(b, types.intp)) for b in ("lo", "hi"))
        out += [ir.Assign(lo.name, ir.Copy(ir.Const(0)), loc=loc),
                ir.Assign(hi.name, ir.Copy(n), loc=loc)]
        body = []
        more = self.tmp(body, "more", types.boolean, ir.Op(operator.lt, (lo, hi)), loc)
        body.append(ir.If(more, (), (ir.Break(loc=loc),), loc=loc))
        total = self.tmp(body, "n", types.intp, ir.Op(operator.add, (lo, hi)), loc)
        mid = self.tmp(body, "mid", types.intp,
                       ir.Op(operator.floordiv, (total, ir.Const(2))), loc)
        arr, aidx = self.element(src, [mid], body, loc)
        elem = self.tmp(body, "e", st.types[self.base_of(src)].dtype, ir.Load(arr, aidx),
                        loc)
        below = self.tmp(body, "below", types.boolean, ir.Op(
            operator.le if right else operator.lt, (elem, self.st.operand(v))), loc)
        up = self.tmp([], "up", types.intp, ir.Op(operator.add, (mid, ir.Const(1))), loc)
        body.append(ir.If(below, (
            ir.Assign(up.name, ir.Op(operator.add, (mid, ir.Const(1))), loc=loc),
            ir.Assign(lo.name, ir.Copy(up), loc=loc)),
            (ir.Assign(hi.name, ir.Copy(mid), loc=loc),), loc=loc))
        st.uid += 1
        out.append(ir.Loop(tuple(body), loc=loc, uid=st.uid))
        out.append(ir.Assign(tgt, ir.Copy(lo), loc=loc))
        return out

    def arg_extremum(self, tgt, src, largest, loc):
        """``tgt = np.argmax(a)`` (``np.argmin``) of a 1-D array: a loop keeping the
        index of the first largest (smallest) element, as NumPy does; an integer, no
        derivative.  NaN elements aside: NumPy returns the first NaN's index."""
        st = self.st
        src = self.name(src)
        if self.ndim(src) != 1:
            self.refuse(f"np.{'argmax' if largest else 'argmin'} of an array with more "
                        "than one dimension (NumPy flattens it)", loc,
                        remedy="loop over the elements and keep the index")
        out = []
        (n,) = self.extents(src, out, loc)
        dtype = st.types[self.base_of(src)].dtype
        at = ir.Var(st.fresh("at", types.intp))
        best = ir.Var(st.fresh("best", dtype))
        first = []
        arr0, idx0 = self.element(src, [ir.Const(0)], first, loc)
        first.append(ir.Assign(best.name, ir.Load(arr0, idx0), loc=loc))
        nonempty = self.tmp(out, "nonempty", types.boolean,
                            ir.Op(operator.gt, (n, ir.Const(0))), loc)
        zero = 0.0 if isinstance(dtype, types.Float) else 0
        out += [ir.Assign(at.name, ir.Copy(ir.Const(0)), loc=loc),
                ir.If(nonempty, tuple(first),     # (NumPy raises for an empty array)
                      (ir.Assign(best.name, ir.Copy(ir.Const(zero)), loc=loc),), loc=loc)]
        i = ir.Var(st.fresh("i", types.intp))
        body = []
        arr, aidx = self.element(src, [i], body, loc)
        elem = self.tmp(body, "e", dtype, ir.Load(arr, aidx), loc)
        better = self.tmp(body, "better", types.boolean, ir.Op(
            operator.gt if largest else operator.lt, (elem, best)), loc)
        body.append(ir.If(better, (ir.Assign(best.name, ir.Copy(elem), loc=loc),
                                   ir.Assign(at.name, ir.Copy(i), loc=loc)), (), loc=loc))
        st.uid += 1
        out.append(ir.ForRange(i.name, ir.Const(1), n, ir.Const(1), tuple(body), loc=loc,
                               uid=st.uid))
        out.append(ir.Assign(tgt, ir.Copy(at), loc=loc))
        return out

    def copied(self, tgt, src, loc):
        """``tgt = a.copy()`` or ``np.copy(a)``: a new array, filled element by element
        (a view's elements read from its base)."""
        return self.elementwise(tgt, None, [src], loc,
                                combine=lambda out, elems, dtype, at: elems[0])

    def method(self, tgt, e, loc):
        """``a.sum()``, ``a.mean()``, ``a.max()``, ``a.min()``, ``a.copy()``, or
        None."""
        d = self.st._chase(e.func)
        if not (isinstance(d, nir.Expr) and d.op == "getattr" and
                isinstance(self.typ(d.value), types.Array)):
            return None
        if d.attr == "copy" and not e.args and not e.kws:
            return self.copied(tgt, d.value, loc)
        kind = METHODS.get(d.attr)
        if kind is None or (kind == "cumsum" and (e.args or e.kws)):
            self.refuse(f"the array method .{d.attr}() with these arguments", loc)
        if kind == "cumsum":
            return self.cumsum(tgt, self.name(d.value), loc)
        axis = self.axis_of(list(e.args), e.kws, f".{d.attr}", loc)
        return self.reduce_along(tgt, kind, self.name(d.value), axis, loc)

    def axis_of(self, rest, kws, fname, loc):
        """The constant axis of a reduction (``np.sum(a, 0)``, ``axis=0``), or None."""
        kws = dict(kws)
        if len(rest) > 1 or set(kws) - {"axis"} or (rest and kws):
            self.refuse(f"{fname}() with arguments other than the array and a constant "
                        "axis (dtype=, out=, ord=, keepdims=, ...)", loc)
        var = rest[0] if rest else kws.get("axis")
        if var is None or isinstance(self.typ(var), types.NoneType):
            return None
        c = self.st.const_of(var)
        value = c.value if c is not None else getattr(self.typ(var), "literal_value",
                                                      None)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            self.refuse(f"{fname}() along an axis that is not a constant integer", loc,
                        remedy="write the axis as a literal (axis=0), or write the "
                               "reduction as a loop")
        return int(value)

    def reduce_along(self, tgt, kind, src, axis, loc):
        """A whole-array reduction, or one along constant ``axis``."""
        nd = self.ndim(src)
        if axis is not None:
            if not -nd <= axis < nd:
                self.refuse(f"an axis ({axis}) outside the array's {nd} dimensions", loc)
            axis %= nd
        if axis is None or nd == 1:
            if isinstance(self.st.types.get(tgt), types.Array):
                self.refuse(f"np.{kind} with this result", loc)
            return self.reduce(tgt, kind, src, loc)
        return self.reduce_axis(tgt, kind, src, axis, loc)

    def reduce(self, tgt, kind, src, loc):
        st = self.st
        out = []
        exts = self.extents(src, out, loc)
        ttype = st.types[tgt]
        dtype = st.types[self.base_of(src)].dtype
        idx = [ir.Var(st.fresh("i", types.intp)) for _ in exts]
        body = []
        e = self.load(src, idx, body, loc)      # (an element of a fused result too)
        acc = ir.Var(self.acc_name(ttype))
        if kind in ("max", "min"):
            exts = [self.nonempty(out, n, loc) for n in exts]
            if isinstance(dtype, types.Float):
                start = ir.Const(-math.inf if kind == "max" else math.inf)
            else:
                start = self.load(src, [ir.Const(0)] * len(exts), out, loc)
            out.append(ir.Assign(acc.name, ir.Copy(start), loc=loc))
            self.update(body, acc, max if kind == "max" else min, e, ttype, loc)
        else:
            zero = 0.0 if isinstance(ttype, types.Float) else 0
            out.append(ir.Assign(acc.name, ir.Copy(ir.Const(zero)), loc=loc))
            if kind == "norm":
                e = self.tmp(body, "sq", dtype, ir.Op(operator.mul, (e, e)), loc)
            self.update(body, acc, operator.add, e, ttype, loc)
        out += self.nest(idx, exts, body, loc)
        if kind == "mean":
            size = ir.Const(1)
            for n in exts:
                size = self.iop(out, operator.mul, (size, n), loc)
            out.append(ir.Assign(tgt, ir.Op(operator.truediv, (acc, size)), loc=loc))
        elif kind == "norm":
            out.append(ir.Assign(tgt, ir.Op(math.sqrt, (acc,)), loc=loc))
        else:
            out.append(ir.Assign(tgt, ir.Copy(acc), loc=loc))
        return out

    def matmul(self, tgt, args, loc):
        """``a @ b``, ``np.dot(a, b)`` for 1-D and 2-D arrays."""
        st = self.st
        a, b = (self.operand_info(v) for v in args)
        if a[0] != "array" or b[0] != "array":
            self.refuse("np.dot or @ with a scalar operand", loc)
        an, bn = (len(self.views[v].extents) if v in self.views else st.types[v].ndim
                  for _, v in (a, b))
        if an not in (1, 2) or bn not in (1, 2):
            self.refuse("np.dot or @ of arrays with more than 2 dimensions", loc)
        out = []
        ea, eb = self.extents(a[1], out, loc), self.extents(b[1], out, loc)
        ttype = st.types[tgt]
        dtype = ttype.dtype if isinstance(ttype, types.Array) else ttype
        res_exts = ea[:-1] + (eb[1:] if bn == 2 else [])
        ridx = [ir.Var(st.fresh("i", types.intp)) for _ in res_exts]
        k = ir.Var(st.fresh("k", types.intp))
        ia = ridx[:an - 1] + [k]
        ib = [k] + ridx[an - 1:]
        acc = self.acc_name(dtype)
        if res_exts:
            out += self.alloc(tgt, ttype, res_exts, loc)
        inner = []
        xa, xia = self.element(a[1], ia, inner, loc)
        xb, xib = self.element(b[1], ib, inner, loc)
        va = self.tmp(inner, "e", st.types[self.base_of(a[1])].dtype, ir.Load(xa, xia), loc)
        vb = self.tmp(inner, "e", st.types[self.base_of(b[1])].dtype, ir.Load(xb, xib), loc)
        p = self.tmp(inner, "p", dtype, ir.Op(operator.mul, (va, vb)), loc)
        self.update(inner, ir.Var(acc), operator.add, p, dtype, loc)
        zero = ir.Const(0.0 if isinstance(dtype, types.Float) else 0)
        inner_n = self.checked(out, checks.inner_extent, (ea[-1], eb[0]), loc)
        body = [ir.Assign(acc, ir.Copy(zero), loc=loc)] + self.nest([k], [inner_n], inner,
                                                                    loc)
        if res_exts:
            body.append(ir.Store(ir.Var(tgt), tuple(ridx), ir.Var(acc), loc=loc))
            out += self.nest(ridx, res_exts, body, loc)
        else:
            out += body + [ir.Assign(tgt, ir.Copy(ir.Var(acc)), loc=loc)]
        return out

    def reduce_axis(self, tgt, kind, src, axis, loc):
        """``tgt = np.<kind>(src, axis=axis)`` of an array with two or more dimensions:
        per result element, an accumulator over the axis."""
        st = self.st
        out = []
        exts = self.extents(src, out, loc)
        ttype = st.types[tgt]
        dtype = st.types[self.base_of(src)].dtype
        rdtype = ttype.dtype
        res_exts = exts[:axis] + exts[axis + 1:]
        out += self.alloc(tgt, ttype, res_exts, loc)
        ridx = [ir.Var(st.fresh("i", types.intp)) for _ in res_exts]
        k = ir.Var(st.fresh("k", types.intp))
        acc = ir.Var(self.acc_name(rdtype))
        body, inner = [], []
        arr, aidx = self.element(src, ridx[:axis] + [k] + ridx[axis:], inner, loc)
        e = self.tmp(inner, "e", dtype, ir.Load(arr, aidx), loc)
        if kind in ("max", "min"):
            if isinstance(dtype, types.Float):
                start = ir.Const(-math.inf if kind == "max" else math.inf)
            else:
                first, fidx = self.element(src, ridx[:axis] + [ir.Const(0)] + ridx[axis:],
                                           body, loc)
                start = self.tmp(body, "first", dtype, ir.Load(first, fidx), loc)
            body.append(ir.Assign(acc.name, ir.Copy(start), loc=loc))
            self.update(inner, acc, max if kind == "max" else min, e, rdtype, loc)
        else:
            zero = 0.0 if isinstance(rdtype, types.Float) else 0
            body.append(ir.Assign(acc.name, ir.Copy(ir.Const(zero)), loc=loc))
            if kind == "norm":
                e = self.tmp(inner, "sq", dtype, ir.Op(operator.mul, (e, e)), loc)
            self.update(inner, acc, operator.add, e, rdtype, loc)
        body += self.nest([k], [exts[axis]], inner, loc)
        value = acc
        if kind == "mean":
            value = self.tmp(body, "v", rdtype, ir.Op(operator.truediv, (acc, exts[axis])),
                             loc)
        elif kind == "norm":
            value = self.tmp(body, "v", rdtype, ir.Op(math.sqrt, (acc,)), loc)
        body.append(ir.Store(ir.Var(tgt), tuple(ridx), value, loc=loc))
        return out + self.nest(ridx, res_exts, body, loc)

    def cumsum(self, tgt, src, loc):
        """``tgt = np.cumsum(src)`` of a 1-D array: a running sum, stored each step."""
        st = self.st
        if self.ndim(src) != 1:
            self.refuse("np.cumsum of an array with more than one dimension (NumPy "
                        "flattens it)", loc, remedy="write the running sum as a loop")
        out = []
        exts = self.extents(src, out, loc)
        ttype = st.types[tgt]
        dtype = st.types[self.base_of(src)].dtype
        out += self.alloc(tgt, ttype, exts, loc)
        acc = ir.Var(self.acc_name(ttype.dtype))
        zero = 0.0 if isinstance(ttype.dtype, types.Float) else 0
        out.append(ir.Assign(acc.name, ir.Copy(ir.Const(zero)), loc=loc))
        i = ir.Var(st.fresh("i", types.intp))
        body = []
        arr, aidx = self.element(src, [i], body, loc)
        e = self.tmp(body, "e", dtype, ir.Load(arr, aidx), loc)
        self.update(body, acc, operator.add, e, ttype.dtype, loc)
        body.append(ir.Store(ir.Var(tgt), (i,), acc, loc=loc))
        return out + self.nest([i], exts, body, loc)

    def outer(self, tgt, args, loc):
        """``tgt = np.outer(a, b)`` of 1-D arrays: ``tgt[i, j] = a[i] * b[j]``."""
        st = self.st
        a, b = (self.operand_info(v) for v in args)
        if a[0] != "array" or b[0] != "array" or self.ndim(a[1]) != 1 or \
                self.ndim(b[1]) != 1:
            self.refuse("np.outer of operands that are not 1-D arrays", loc)
        out = []
        ea, eb = self.extents(a[1], out, loc), self.extents(b[1], out, loc)
        ttype = st.types[tgt]
        out += self.alloc(tgt, ttype, ea + eb, loc)
        i, j = (ir.Var(st.fresh("i", types.intp)) for _ in range(2))
        outer_body, inner = [], []
        xa, xia = self.element(a[1], [i], outer_body, loc)
        va = self.tmp(outer_body, "e", st.types[self.base_of(a[1])].dtype,
                      ir.Load(xa, xia), loc)
        xb, xib = self.element(b[1], [j], inner, loc)
        vb = self.tmp(inner, "e", st.types[self.base_of(b[1])].dtype, ir.Load(xb, xib), loc)
        p = self.tmp(inner, "p", ttype.dtype, ir.Op(operator.mul, (va, vb)), loc)
        inner.append(ir.Store(ir.Var(tgt), (i, j), p, loc=loc))
        outer_body += self.nest([j], [eb[0]], inner, loc)
        return out + self.nest([i], [ea[0]], outer_body, loc)

    def clip(self, tgt, args, loc):
        """``np.clip(a, lo, hi)``: ``min(max(a, lo), hi)`` element by element (the
        operands broadcast; at a bound the adjoint flows to ``a``, as for the scalar
        rule)."""
        def combine(body, elems, dtype, loc):
            lo = self.tmp(body, "v", dtype, ir.Op(max, (elems[0], elems[1])), loc)
            return self.tmp(body, "v", dtype, ir.Op(min, (lo, elems[2])), loc)
        return self.elementwise(tgt, None, args, loc, combine=combine)
