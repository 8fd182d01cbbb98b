"""Basic slices and views of arrays in whole-array NumPy (part of
:mod:`kadj.array_lowering`): ``a[1:-1]``, ``a[::2]``, ``x[i, :]`` are never copied;
a view records, per dimension of its base array, a fixed index or a range (start,
constant step, extent), and each element of the view is read from or written to the
base array at the mapped index.  Bounds follow Python's rules (negative ones count from
the end, out-of-range ones are clipped); a variable bound is normalized at run time."""
from __future__ import annotations

import operator

import numpy as np
from numba.core import ir as nir
from numba.core import types

from . import ir
from .array_reduce import METHODS


class _View:
    """A view of ``base``: per base dimension ``("fix", index)`` or
    ``("range", start, step, extent)`` (operands)."""

    __slots__ = ("base", "dims")

    def __init__(self, base, dims):
        self.base, self.dims = base, dims

    @property
    def extents(self):
        return [d[3] for d in self.dims if d[0] == "range"]


class ViewLowering:
    """Methods of :class:`kadj.array_lowering.ArrayLowering` for views."""

    def getitem(self, tgt, e, loc):
        """``tgt = a[...]``: a view (slice) or an element of a view."""
        src = self.name(e.value)
        parts = self.index_parts(e, loc)
        if parts is None:
            self.refuse("this array index (fancy or boolean indexing)", loc)
        out = []
        ndim = self.ndim(src)
        if len(parts) == ndim and not any(p[0] == "slice" for p in parts):
            arr, idx = self.element(src, [p[1] for p in parts], out, loc,  # an element
                                    wrap=True)
            out.append(ir.Assign(tgt, ir.Load(arr, idx), loc=loc))
            return out
        if self.defs.get(tgt, 0) > 1:
            self.st.error(f"the array view '{tgt.split('.')[0]}' is assigned in more than "
                          "one place", loc=loc, construct="array view rebound",
                          remedy="give each view its own name, or index the base array")
        parts = parts + [("slice", None, None, None)] * (ndim - len(parts))
        exts = self.extents(src, out, loc)
        dims = []
        for p, n in zip(parts, exts):
            if p[0] == "int":
                dims.append(("fix", self.wrap_index(p[1], n, out, loc)))
            else:
                dims.append(("range",) + self.slice_range(p[1:], n, out, loc))
        inner = self.views.get(src)
        if inner is not None:   # a view of a view: map into the base array
            composed, k = [], 0
            for d in inner.dims:
                if d[0] == "fix":
                    composed.append(d)
                    continue
                mine = dims[k]
                k += 1
                if mine[0] == "fix":
                    at = self.iop(out, operator.mul, (mine[1], d[2]), loc)
                    composed.append(("fix", self.iop(out, operator.add, (d[1], at), loc)))
                else:
                    at = self.iop(out, operator.mul, (mine[1], d[2]), loc)
                    composed.append(("range", self.iop(out, operator.add, (d[1], at), loc),
                                     self.iop(out, operator.mul, (mine[2], d[2]), loc),
                                     mine[3]))
            dims = composed
        self.views[tgt] = _View(self.base_of(src), dims)
        return out

    def index_parts(self, e, loc):
        """``[("int", operand) | ("slice", start, stop, step)]`` of an index, or None."""
        st = self.st
        if e.op == "static_getitem" or isinstance(e, (nir.StaticSetItem,)):
            idx = e.index
            items = idx if isinstance(idx, tuple) else (idx,)
            if all(isinstance(i, (int, np.integer, slice)) for i in items):
                return [("int", ir.Const(int(i))) if not isinstance(i, slice) else
                        ("slice",) + tuple(None if v is None else ir.Const(int(v))
                                           for v in (i.start, i.stop, i.step))
                        for i in items]
            var = e.index_var
        else:
            var = e.index
        if var is None:
            return None
        items = st.direct_index.get(var.name)
        if items is None:
            d = st._chase(var)
            items = d.items if isinstance(d, nir.Expr) and d.op == "build_tuple" else [var]
        out = []
        for v in items:
            t = self.typ(v)
            if isinstance(t, types.Integer):
                out.append(("int", st.operand(v)))
            elif isinstance(t, types.SliceType):
                d = st._chase(v)
                if not (isinstance(d, nir.Expr) and d.op == "call"):
                    return None
                args = [None if isinstance(self.typ(a), types.NoneType) else st.operand(a)
                        for a in d.args] + [None] * (3 - len(d.args))
                out.append(("slice",) + tuple(args[:3]))
            else:
                return None
        return out

    def wrap_index(self, i, n, out, loc):
        """A fixed index as NumPy reads it (negative counts from the end)."""
        if isinstance(i, ir.Const):
            return i if i.value >= 0 else self.iop(out, operator.add, (n, i), loc)
        return self.normalized(i, n, out, loc, clamp=False)

    def normalized(self, v, n, out, loc, clamp=True):
        """``v + n if v < 0 else v`` (clamped to [0, n] for slice bounds)."""
        if isinstance(v, ir.Const):
            w = v.value + n.value if isinstance(n, ir.Const) and v.value < 0 else None
            if w is not None:
                return ir.Const(max(0, min(w, n.value)) if clamp else w)
            r = self.iop(out, operator.add, (n, v), loc) if v.value < 0 else v
        else:
            name = self.st.fresh("b", types.intp)
            neg = self.tmp(out, "neg", types.boolean, ir.Op(operator.lt, (v, ir.Const(0))),
                           loc)
            out.append(ir.If(neg, (ir.Assign(name, ir.Op(operator.add, (v, n)), loc=loc),),
                             (ir.Assign(name, ir.Copy(v), loc=loc),), loc=loc))
            r = ir.Var(name)
        if clamp:
            r = self.iop(out, min, (self.iop(out, max, (r, ir.Const(0)), loc), n), loc)
        return r

    def slice_range(self, sl, n, out, loc):
        """(start, step, extent) of slice ``(start, stop, step)`` over extent ``n``."""
        start, stop, step = sl
        step = step if step is not None else ir.Const(1)
        if not isinstance(step, ir.Const) or step.value == 0:
            self.refuse("a slice with a variable or zero step", loc,
                        remedy="use a constant step (a[::2])")
        if step.value > 0:
            lo = ir.Const(0) if start is None else self.normalized(start, n, out, loc)
            hi = n if stop is None else self.normalized(stop, n, out, loc)
            span = self.iop(out, operator.sub, (hi, lo), loc)
        else:
            last = self.iop(out, operator.sub, (n, ir.Const(1)), loc)
            lo = last if start is None else self.iop(
                out, min, (self.normalized(start, n, out, loc), last), loc)
            hi = ir.Const(-1) if stop is None else self.iop(
                out, operator.sub, (self.normalized(stop, n, out, loc), ir.Const(1)), loc)
            span = self.iop(out, operator.sub, (lo, hi), loc)
        k = abs(step.value)
        if k != 1:
            span = self.iop(out, operator.floordiv,
                            (self.iop(out, operator.add, (span, ir.Const(k - 1)), loc),
                             ir.Const(k)), loc)
        extent = self.iop(out, max, (span, ir.Const(0)), loc)
        return lo, step, extent

    def attr(self, tgt, e, loc):
        """``.shape``/``.size``/``.ndim`` of a view; ``a.sum`` (read where called)."""
        if e.attr in METHODS:
            return []
        view = self.views[self.name(e.value)]
        exts = view.extents
        if e.attr == "ndim":
            return [ir.Assign(tgt, ir.Copy(ir.Const(len(exts))), loc=loc)]
        if e.attr == "shape":
            return [ir.Assign(tgt, ir.Op(ir.make_tuple, tuple(exts)), loc=loc)]
        if e.attr == "size":
            out, size = [], ir.Const(1)
            for n in exts:
                size = self.iop(out, operator.mul, (size, n), loc)
            return out + [ir.Assign(tgt, ir.Copy(size), loc=loc)]
        self.refuse(f"attribute '.{e.attr}' of an array view", loc)

    def setitem(self, stmt, loc):
        """``a[...] = value`` where ``a`` is a view or the index has a slice."""
        arr = self.name(stmt.target)
        parts = self.index_parts(_Index(None, stmt, arr), loc)
        if parts is None:
            self.refuse("this array index (fancy or boolean indexing)", loc)
        out = []
        if len(parts) == self.ndim(arr) and not any(p[0] == "slice" for p in parts):
            dest, idx = self.element(arr, [p[1] for p in parts], out, loc, wrap=True)
            return out + [ir.Store(dest, idx, self.st.operand(stmt.value), loc=loc)]
        dest = self.st.fresh("dst", self.st.types[stmt.target.name])
        out += self.getitem(dest, _Index(None, stmt, arr), loc)
        self.st.types[dest] = types.Array(self.st.types[stmt.target.name].dtype,
                                          len(self.views[dest].extents), "A")
        return out + self.elementwise(None, None, [stmt.value], loc, into=dest)

    # ---- element-wise ----------------------------------------------------------------


class _Index:
    """An index expression's stand-in: ``index`` (a variable), or the static index of
    ``stmt`` (a ``StaticSetItem``) with the array's name."""

    op = "getitem"

    def __init__(self, index, stmt=None, arr=None):
        self.index = index
        if stmt is not None:
            self.op = "static_getitem" if isinstance(stmt, nir.StaticSetItem) else \
                "getitem"
            self.index = stmt.index
            self.index_var = getattr(stmt, "index_var", None)
        self.value = nir.Var(None, arr, stmt.loc) if arr else None
