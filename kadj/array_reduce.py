"""Reductions and products of whole arrays (part of :mod:`kadj.array_lowering`):
``np.sum``, ``np.mean``, ``np.max``/``np.min`` (and the ``a.sum()`` method forms),
``np.linalg.norm`` (a vector's 2-norm, a matrix's Frobenius norm) become an accumulator
loop nest (``acc = 0; for i: acc = acc + a[i]``); ``np.dot``/``@`` of 1-D and 2-D arrays
a loop over the contracted index for each result element.  ``np.max``/``np.min`` go
through the scalar ``max``/``min`` rules (the adjoint flows to the arg max); unlike NumPy
they skip NaNs and return -inf/+inf for an empty float array."""
from __future__ import annotations

import math
import operator

import numpy as np
from numba.core import ir as nir
from numba.core import types

from . import ir
from . import rules

REDUCE = {np.sum: "sum", np.mean: "mean", np.max: "max", np.min: "min",
          np.amax: "max", np.amin: "min", np.linalg.norm: "norm"}
METHODS = {"sum": "sum", "mean": "mean", "max": "max", "min": "min"}


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
        if e.kws or e.vararg is not None:
            self.refuse(f"{fname}() with keyword arguments (axis=, ord=, ...)", loc)
        if fn is np.where and len(args) == 3 and isinstance(ttype, types.Array):
            return self.where(tgt, args, loc)
        if fn in (np.dot, np.matmul, np.vdot) and len(args) == 2:
            return self.matmul(tgt, args, loc)
        kind = REDUCE.get(fn)
        if kind is not None and len(args) == 1 and not isinstance(ttype, types.Array):
            return self.reduce(tgt, kind, self.name(args[0]), loc)
        elementwise = (type(fn).__name__ == "ufunc" and len(args) == fn.nin) or \
            fn is abs and len(args) == 1
        if elementwise and isinstance(ttype, types.Array) and (
                rules.lookup(fn) is not None or fn in rules.NONDIFFERENTIABLE):
            return self.elementwise(tgt, fn, args, loc)
        return None

    def method(self, tgt, e, loc):
        """``a.sum()``, ``a.mean()``, ``a.max()``, ``a.min()``, or None."""
        d = self.st._chase(e.func)
        if not (isinstance(d, nir.Expr) and d.op == "getattr" and
                isinstance(self.typ(d.value), types.Array)):
            return None
        kind = METHODS.get(d.attr)
        if kind is None or e.args or e.kws:
            self.refuse(f"the array method .{d.attr}()", loc)
        return self.reduce(tgt, kind, self.name(d.value), loc)

    def reduce(self, tgt, kind, src, loc):
        st = self.st
        out = []
        exts = self.extents(src, out, loc)
        ttype = st.types[tgt]
        dtype = st.types[self.base_of(src)].dtype
        idx = [ir.Var(st.fresh("i", types.intp)) for _ in exts]
        body = []
        arr, aidx = self.element(src, idx, body, loc)
        e = self.tmp(body, "e", dtype, ir.Load(arr, aidx), loc)
        acc = ir.Var(self.acc_name(ttype))
        if kind in ("max", "min"):
            if isinstance(dtype, types.Float):
                start = ir.Const(-math.inf if kind == "max" else math.inf)
            else:
                first, fidx = self.element(src, [ir.Const(0)] * len(exts), out, loc)
                start = self.tmp(out, "first", dtype, ir.Load(first, fidx), loc)
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
        body = [ir.Assign(acc, ir.Copy(zero), loc=loc)] + self.nest([k], [ea[-1]], inner,
                                                                    loc)
        if res_exts:
            body.append(ir.Store(ir.Var(tgt), tuple(ridx), ir.Var(acc), loc=loc))
            out += self.nest(ridx, res_exts, body, loc)
        else:
            out += body + [ir.Assign(tgt, ir.Copy(ir.Var(acc)), loc=loc)]
        return out
