"""Whole-array NumPy inside ``@njit`` kernels, lowered to element loops while structuring.

The region tree (:mod:`kadj.ir`) knows only element operations, so each whole-array
operation of the typed Numba IR becomes a scratch array and a loop nest here, and the
rest of the pipeline sees ordinary element loops:

* element-wise operators (``+ - * / ** // %``, comparisons, unary ``-``) and NumPy
  ufuncs with a scalar derivative rule (``np.exp(a)``, ``np.maximum(a, b)``,
  ``abs(a)``), and ``np.where(c, a, b)``: ``d = x - t`` becomes
  ``d = np.empty(shape, dtype)`` and ``for i: d[i] = x[i] - t[i]``.  Scalars are used as
  they are; arrays broadcast NumPy's way (trailing dimensions aligned, a dimension of
  size 1 stretched).  Each NumPy temporary gets its own scratch array (``a * x + b``
  allocates two) unless it is an intermediate result of an expression, which is
  fused into the operation that reads it (:mod:`kadj.array_fusion`).
* reductions of a whole array: ``np.sum``, ``np.mean``, ``np.max``/``np.min`` (and the
  ``a.sum()`` method forms), ``np.linalg.norm`` of a vector or matrix (Frobenius);
  ``np.sum(a, axis=k)`` / ``a.sum(k)`` along a constant axis; ``np.cumsum`` of a 1-D
  array; ``np.dot``/``@`` of 1-D and 2-D arrays, ``np.outer`` of 1-D arrays;
  ``np.clip(a, lo, hi)`` element by element.
* basic slices and views, ``a[1:-1]``, ``a[::2]``, ``x[i, :]``: never copied; an element
  of a view is read from (or written to) its base array at the mapped index.
* assignment into slices (``u[1:-1] = expr``, ``out[:] = 0.0``) and in-place operators
  on arrays (``y += x``): loops storing into the array itself.  A right-hand side that
  is another view of the same array is copied to a scratch array first, as NumPy does.

Views live in :mod:`kadj.array_views`, reductions and products in
:mod:`kadj.array_reduce`.  Anything else on whole arrays (fancy indexing, a variable
axis, ``np.cumprod``, ``np.sort``...), an array variable bound twice, and every
whole-array form in a CUDA kernel raise :class:`~kadj.DifferentiationError` at its
line, naming the supported forms.  Operand shapes are checked where NumPy checks them
(operands that must broadcast, the inner dimensions of a matrix product, the value
assigned into a slice or updated in place): the generated code raises ``ValueError``
(:mod:`kadj.array_checks`) before a loop reads outside an operand or writes into an
array.
"""
from __future__ import annotations

import operator

import numpy as np
from numba.core import ir as nir
from numba.core import types
from numba.np import numpy_support

from . import array_checks as checks
from . import ir
from .array_fusion import FusionLowering, Fused
from .array_reduce import METHODS, ReduceLowering
from .array_views import ViewLowering

__all__ = ["METHODS", "ArrayLowering", "lowering", "is_view", "check_no_views"]

SUPPORTED = ("supported whole-array forms: element-wise operators and ufuncs with a "
             "derivative rule, np.where, np.clip, np.sum/np.mean/np.max/np.min/"
             "np.linalg.norm of a whole array, np.sum along a constant axis, np.cumsum "
             "of a 1-D array, np.dot and @ of 1-D/2-D arrays, np.outer, basic slices "
             "(a[1:-1], a[::2], x[i, :]), slice assignment and in-place operators")


def lowering(st):
    """The :class:`ArrayLowering` of structurizer ``st`` (created on first use); for a
    CUDA kernel, whose device code has no scratch arrays to lower into, the refusals
    (:class:`_Refusals`)."""
    low = st.__dict__.get("_array_lowering")
    if low is None:
        low = st._array_lowering = ArrayLowering(st) if st.tk.target == "cpu" else \
            _Refusals(st)
    return low


def is_view(st, name):
    low = st.__dict__.get("_array_lowering")
    return low is not None and st.alias.get(name, name) in low.views


def check_no_views(st, body):
    """Refuse a view used where only its elements could be (returned, passed on)."""
    low = st.__dict__.get("_array_lowering")
    if low is None or not low.views:
        return
    for s in ir.walk(body):
        bad = ir.stmt_reads(s) & set(low.views)
        if bad:
            st.error(f"the array view '{sorted(bad)[0]}' is used here in a way kadj cannot "
                     "follow (only its elements, .shape/.size and whole-array "
                     "expressions can be used)", loc=getattr(s, "loc", None),
                     construct="array view", remedy="index the base array instead, or "
                     "copy the view into a scratch array with a loop")


class ArrayLowering(ViewLowering, ReduceLowering, FusionLowering):
    def __init__(self, st):
        self.st = st
        self.views = {}   # view variable -> _View
        self.fused = {}   # fused result -> :class:`kadj.array_fusion.Fused`
        self._index_uses()
        self.defs = {}   # definitions per variable, ``y = y.1`` after ``y += x`` not
        inplace = {s.target.name: s.value.lhs.name for blk in st.blocks.values()
                   for s in blk.body if isinstance(s, nir.Assign) and
                   isinstance(s.value, nir.Expr) and s.value.op == "inplace_binop"}
        # ... and not counting an array name's copies of other arrays either (a buffer
        # swap, ``a, b = b, a``, after ``a = u.copy()``: kadj.buffer_swap), for the
        # checks that a new array's name is not rebound
        self.value_defs = {}
        copies = {s.target.name: s.value.name for blk in st.blocks.values()
                  for s in blk.body if isinstance(s, nir.Assign) and
                  isinstance(s.value, nir.Var) and s.target.name.startswith("$")}

        def names_an_array(var):
            """Is ``var`` (through numba's temporaries) another array's name?"""
            name = var.name
            for _ in range(8):
                if not name.startswith("$"):
                    return isinstance(st.types.get(name), types.Array)
                if name not in copies:
                    return False
                name = copies[name]
            return False
        for blk in st.blocks.values():
            for s in blk.body:
                if isinstance(s, nir.Assign) and not (
                        isinstance(s.value, nir.Var) and
                        inplace.get(s.value.name) == s.target.name):
                    self.defs[s.target.name] = self.defs.get(s.target.name, 0) + 1
                    if not (isinstance(s.value, nir.Var) and names_an_array(s.value)):
                        self.value_defs[s.target.name] = \
                            self.value_defs.get(s.target.name, 0) + 1

    # ---- small helpers ---------------------------------------------------------------
    def name(self, var):
        return self.st.alias.get(var.name, var.name)

    def typ(self, var):
        return self.st.types.get(var.name if isinstance(var, nir.Var) else var)

    def tmp(self, out, base, typ, expr, loc):
        name = self.st.fresh(base, typ)
        out.append(ir.Assign(name, expr, loc=loc))
        return ir.Var(name)

    def iop(self, out, fn, args, loc):
        """An integer operation, folded when its operands are constants."""
        if all(isinstance(a, ir.Const) for a in args):
            return ir.Const(fn(*(a.value for a in args)))
        if fn is operator.add and ir.Const(0) in args:
            return args[1] if args[0] == ir.Const(0) else args[0]
        if fn is operator.mul and ir.Const(1) in args:
            return args[1] if args[0] == ir.Const(1) else args[0]
        return self.tmp(out, "n", types.intp, ir.Op(fn, tuple(args)), loc)

    def checked(self, out, fn, args, loc):
        """``fn(*args)``, one of the shape checks of :mod:`kadj.array_checks` (it
        raises ``ValueError`` at run time where NumPy would): folded when the operands
        are constants that pass it, or the same operand twice."""
        a, b = args
        if a == b:
            return ir.Const(1) if fn is checks.stretch else a
        if isinstance(a, ir.Const) and isinstance(b, ir.Const):
            try:
                return ir.Const(fn.py_func(a.value, b.value))
            except ValueError:
                pass
        return self.tmp(out, "n", types.intp, ir.Op(fn, tuple(args)), loc)

    def nonempty(self, out, n, loc):
        """Extent ``n`` checked not to be 0 (:func:`kadj.array_checks.nonempty`):
        ``np.max``/``np.min`` over no element raise ``ValueError`` as in NumPy."""
        if isinstance(n, ir.Const) and n.value > 0:
            return n
        return self.tmp(out, "n", types.intp, ir.Op(checks.nonempty, (n,)), loc)

    def refuse(self, what, loc, remedy=None):
        self.st.error(f"{what} is not supported yet ({SUPPORTED})", loc=loc,
                      construct=what, remedy=remedy or "write the operation as an "
                      "element-wise loop")

    def extents(self, name, out, loc):
        """Extent operands of array (or view, or fused result) ``name``, computed into
        ``out``."""
        if name in self.views:
            return list(self.views[name].extents)
        if name in self.fused:
            return list(self.fused[name].exts)
        t = self.st.types[name]
        if t.ndim == 0:
            self.refuse("a 0-d array", loc)
        shape = self.tmp(out, "shape", types.UniTuple(types.intp, t.ndim),
                         ir.Attr(ir.Var(name), "shape"), loc)
        return [self.tmp(out, "n", types.intp, ir.Item(shape, k), loc)
                for k in range(t.ndim)]

    def element(self, name, index, out, loc, wrap=False):
        """(array, index) reading element ``index`` of array or view ``name``.
        ``wrap``: ``index`` is the kernel's own (``w[k - 1]``), where a negative value
        counts from the end of the view, as NumPy reads it; its place in the base array
        is not the base's element at the same negative offset."""
        view = self.views.get(name)
        if view is None:
            return ir.Var(name), tuple(index)
        idx, k = [], 0
        for d in view.dims:
            if d[0] == "fix":
                idx.append(d[1])
            else:
                i = index[k]
                if wrap and not (isinstance(i, ir.Const) and i.value >= 0):
                    i = self.wrap_index(i, d[3], out, loc)
                scaled = self.iop(out, operator.mul, (i, d[2]), loc)
                idx.append(self.iop(out, operator.add, (d[1], scaled), loc))
                k += 1
        return ir.Var(view.base), tuple(idx)

    def ndim(self, name):
        view = self.views.get(name)
        return len(view.extents) if view is not None else self.st.types[name].ndim

    def base_of(self, name):
        view = self.views.get(name)
        return view.base if view is not None else name

    # ---- hooks: views ----------------------------------------------------------------
    def binop(self, tgt, e, loc):
        op = e.op
        fn = e.immutable_fn if op == "inplace_binop" else e.fn
        args = [e.lhs, e.rhs] if op != "unary" else [e.value]
        if fn is operator.matmul:
            return self.matmul(tgt, args, loc)
        if not isinstance(self.typ(tgt), types.Array):
            self.refuse(f"array {getattr(fn, '__name__', fn)} with a scalar result", loc)
        if op == "inplace_binop" and isinstance(self.typ(e.lhs), types.Array):
            dest = self.name(e.lhs)
            if self.defs.get(tgt, 0) > 1:
                self.rebound(tgt, loc)
            out = self.elementwise(None, fn, args, loc, into=dest)
            if dest in self.views:
                self.views[tgt] = self.views[dest]
            else:
                self.st.alias[tgt] = dest
            return out
        return self.elementwise(tgt, fn, args, loc)

    def acc_name(self, typ):
        return self.st.fresh("acc", typ)

    def update(self, body, acc, fn, e, typ, loc):
        """``acc = fn(acc, e)`` through a temporary, as numba writes ``s += e``."""
        new = self.tmp(body, "r", typ, ir.Op(fn, (acc, e)), loc)
        body.append(ir.Assign(acc.name, ir.Copy(new), loc=loc))

    def rebound(self, tgt, loc):
        self.st.error(f"the array variable '{tgt.split('.')[0]}' is assigned a "
                      "whole-array expression and assigned again elsewhere", loc=loc,
                      construct="array variable rebound",
                      remedy="give each whole-array result a name of its own, or update "
                             "the array in place (d[:] = ..., d += ...)")

    def operand_info(self, v):
        """("array", name) or ("scalar", operand)."""
        if isinstance(self.typ(v), types.Array):
            return ("array", self.name(v))
        return ("scalar", self.st.operand(v))

    def elementwise(self, tgt, fn, args, loc, into=None, combine=None):
        """``tgt = fn(*args)`` element by element (a new array), or into the existing
        array (or view) ``into``; ``combine(out, elems, loc)`` builds the element
        value instead of ``fn`` (``np.where``)."""
        st = self.st
        out = []
        ops = [self.operand_info(a) for a in args]
        if into is not None:   # other views of the destination's memory: copy first
            base = self.base_of(into)
            for k, (kind, v) in enumerate(ops):
                if kind == "array" and v in self.fused and base in self.fused_reads(v):
                    ops[k] = ("array", self.materialize(v, out, loc))
                elif kind == "array" and v != into and self.base_of(v) == base:
                    ops[k] = ("array", self.copy_of(v, out, loc))
            rtype = st.types[into] if into not in self.views else None
            ndim = len(self.views[into].extents) if into in self.views else rtype.ndim
            dtype = (st.types[self.base_of(into)]).dtype
            exts = self.extents(into, out, loc)
        else:
            rtype = st.types[tgt]
            if self.value_defs.get(tgt, 0) > 1 or any(v == tgt for k, v in ops
                                                       if k == "array"):
                self.rebound(tgt, loc)
            ndim, dtype = rtype.ndim, rtype.dtype
            exts = None
        arrays = []   # distinct array operands: (name, extents)
        for kind, v in ops:
            if kind == "array" and v not in [a for a, _ in arrays]:
                arrays.append((v, self.extents(v, out, loc)))
        # loop extents and, per array and dimension, the stride multiplier (0: size 1)
        mult = {}
        loop_exts = []
        for d in range(ndim):
            have = [(a, ex[d - (ndim - len(ex))]) for a, ex in arrays
                    if d - (ndim - len(ex)) >= 0]
            if exts is not None:
                n = exts[d]
            elif len(have) == 1:
                n = have[0][1]
            else:
                hi = self.iop(out, max, tuple(x for _, x in have[:2]), loc)
                lo = self.iop(out, min, tuple(x for _, x in have[:2]), loc)
                for _, x in have[2:]:
                    hi = self.iop(out, max, (hi, x), loc)
                    lo = self.iop(out, min, (lo, x), loc)
                n = self.iop(out, operator.mul,
                             (hi, self.iop(out, min, (lo, ir.Const(1)), loc)), loc)
            loop_exts.append(n)
            for a, x in have:   # checked: x broadcasts to n (ValueError otherwise)
                if (exts is None and len(have) == 1) or a == into:
                    continue
                mult[(a, d)] = self.checked(out, checks.stretch, (x, n), loc)
        if into is None and self.fusable(tgt):   # computed where it is read
            self.fused[tgt] = Fused(fn, ops, mult, loop_exts, combine, dtype, ndim)
            return out
        if into is None:
            out += self.alloc(tgt, rtype, loop_exts, loc)
            into = tgt
        idx = [ir.Var(st.fresh("i", types.intp)) for _ in range(ndim)]
        body = []
        elems = self.elements(ops, mult, ndim, idx, body, loc)
        value = self.value(fn, combine, elems, dtype, body, loc)
        darr, didx = self.element(into, idx, body, loc)
        body.append(ir.Store(darr, didx, value, loc=loc))
        out += self.nest(idx, loop_exts, body, loc)
        return out

    def nest(self, idx, exts, body, loc):
        inner = tuple(body)
        for i, n in reversed(list(zip(idx, exts))):
            self.st.uid += 1
            inner = (ir.ForRange(i.name, ir.Const(0), n, ir.Const(1), inner, loc=loc,
                                 uid=self.st.uid),)
        return list(inner)

    def alloc(self, tgt, rtype, exts, loc):
        if self.value_defs.get(tgt, 0) > 1:
            self.rebound(tgt, loc)
        out = []
        scalar = numpy_support.as_dtype(rtype.dtype).type
        kws = (("dtype", ir.GlobalRef(scalar, name=f"np.{scalar.__name__}")),)
        if len(exts) == 1:
            shape = exts[0]
        else:
            shape = self.tmp(out, "shape", types.UniTuple(types.intp, len(exts)),
                             ir.Op(ir.make_tuple, tuple(exts)), loc)
        self.st.types[tgt] = types.Array(rtype.dtype, rtype.ndim, "C")
        return out + [ir.Assign(tgt, ir.Alloc(np.empty, (shape,), kws), loc=loc)]

    def copy_of(self, name, out, loc):
        """A scratch copy of array or view ``name`` (an overlapping right-hand side)."""
        base = self.st.types[self.base_of(name)]
        ndim = len(self.views[name].extents) if name in self.views else base.ndim
        tmp = self.st.fresh("copy", types.Array(base.dtype, ndim, "C"))
        out += self.elementwise(tmp, None, [nir.Var(None, name, loc)], loc)
        return tmp

    def where(self, tgt, args, loc):
        def combine(body, elems, dtype, loc):
            v = self.st.fresh("v", dtype)
            body.append(ir.If(elems[0], (ir.Assign(v, ir.Copy(elems[1]), loc=loc),),
                              (ir.Assign(v, ir.Copy(elems[2]), loc=loc),), loc=loc))
            return ir.Var(v)
        return self.elementwise(tgt, None, args, loc, combine=combine)

    # ---- reductions and products -------------------------------------------------------
class _Refusals:
    """Whole-array forms in a CUDA kernel: refused, each with its message."""

    views = {}

    def __init__(self, st):
        self.st = st

    def binop(self, tgt, e, loc):
        fn = e.immutable_fn if e.op == "inplace_binop" else e.fn
        self.st.error("whole-array NumPy expressions are not supported yet", loc=loc,
                      construct=f"array {getattr(fn, '__name__', fn)}",
                      remedy="write the operation as an element-wise loop")

    def getitem(self, tgt, e, loc):
        self.st.error("array slices and views are not supported", loc=loc,
                      construct="array slice", remedy="index single elements inside a loop")

    def setitem(self, stmt, loc):
        self.st.error("slice assignment is not supported", loc=loc,
                      construct="slice assignment", remedy="write the elements in a loop")

    def call(self, tgt, e, fn, fname, loc):
        self.st.error(f"whole-array call {fname}() is not supported yet", loc=loc,
                      construct=f"{fname} on an array",
                      remedy="write the reduction or operation as an element-wise loop")

    def method(self, tgt, e, loc):
        return None

    def attr(self, tgt, e, loc):
        self.st.error(f"attribute '.{e.attr}' is not supported", loc=loc,
                      construct=f"getattr {e.attr}",
                      remedy="read array elements by index, and .shape, .size or .ndim; "
                             "compute other values outside the kernel and pass them in "
                             "as arguments")
