"""Element-wise NumPy expressions fused into one loop (part of
:mod:`kadj.array_lowering`).

``u[1:-1] = u[1:-1] + alpha * (u[:-2] - 2.0 * u[1:-1] + u[2:])`` is five element-wise
operations; lowered one by one, each writes a scratch array in a loop of its own and
the next reads it back.  An intermediate result that only the next element-wise
operation of the same expression reads is *fused* instead: no scratch array and no
loop of its own; the operation that reads it computes its element where it would have
loaded it, in its own loop (``e = 2.0 * u[i + 1]; v = u[i] - e; ...``).  Chains fuse
whole: the statement above becomes one loop computing the right-hand side into one
scratch array (the destination is read at other offsets, so NumPy's semantics need
the copy) and the loop storing it.

An intermediate result is fused when it is defined once by an element-wise operation
(one of numba's temporaries, a ``$`` name, or a variable of the source assigned once:
``d = u - target``) and read by exactly one later statement of the same block (``d * d``
reads ``d`` twice, in one operation), an element-wise operator or ufunc (or
``np.where``), a whole-array reduction (``np.sum(d * d)``), or an assignment into a
slice or an in-place operator; and everything between its definition and that use
only computes numba's temporaries (no store, no call that could write an array, no
assignment of a variable of the source).  Its operands are then unchanged when it is
computed at its use.  A fused result that
reads the array a slice assignment or in-place operator writes is computed into a
scratch array first (:meth:`FusionLowering.materialize`), as NumPy computes the
right-hand side before it writes.  Shapes are still checked where each operation
stands (:mod:`kadj.array_checks`): the checks and extents are computed at the
definition; only the allocation and the loop move.
"""
from __future__ import annotations

import dataclasses
import operator

import numpy as np
from numba.core import ir as nir
from numba.core import types

from . import ir
from .array_reduce import REDUCE
from .frontend import resolve_value

#: calls between a fused result's definition and its use that write no array
_PURE_CALLS = (slice, range, len, abs, min, max)

#: expression kinds that compute a temporary without writing any array
_PURE_EXPRS = frozenset({"binop", "unary", "getattr", "static_getitem", "getitem",
                         "build_tuple", "cast", "typed_getitem"})


@dataclasses.dataclass
class Fused:
    """An element-wise result computed where it is read: ``fn(*ops)`` (or
    ``combine``), operands broadcast by ``mult`` over ``exts``."""
    fn: object
    ops: list
    mult: dict
    exts: list
    combine: object
    dtype: object
    ndim: int


class FusionLowering:
    """Methods of :class:`kadj.array_lowering.ArrayLowering` for fused results."""

    def _index_uses(self):
        """Where each variable is defined and used: ``{name: (label, position)}`` and
        ``{name: [(label, position), ...]}``."""
        self.def_at, self.uses = {}, {}
        for label, blk in self.st.blocks.items():
            for k, s in enumerate(blk.body):
                target = s.target.name if isinstance(s, nir.Assign) else None
                if target is not None:
                    self.def_at[target] = (label, k)
                for v in s.list_vars():
                    if v.name != target:
                        self.uses.setdefault(v.name, []).append((label, k))

    def fusable(self, tgt):
        """May element-wise result ``tgt`` be computed where it is read?"""
        if self.defs.get(tgt, 0) != 1:
            return False
        use, at = set(self.uses.get(tgt, ())), self.def_at.get(tgt)
        if len(use) != 1 or at is None:
            return False
        use = sorted(use)
        if use[0][0] != at[0] or use[0][1] <= at[1]:
            return False
        body = self.st.blocks[at[0]].body
        return all(self._computes_only(s) for s in body[at[1] + 1:use[0][1]]) and \
            self._reads_elementwise(body[use[0][1]], tgt)

    def _resolve(self, func):
        try:
            return resolve_value(self.st.fir, func)
        except (LookupError, AttributeError):
            return None

    def _computes_only(self, s):
        """Does statement ``s`` only compute a temporary (writing no array)?"""
        if isinstance(s, nir.Del):
            return True
        if not isinstance(s, nir.Assign) or not s.target.name.startswith("$"):
            return False
        v = s.value
        if isinstance(v, (nir.Const, nir.Global, nir.FreeVar, nir.Var)):
            return True
        if not isinstance(v, nir.Expr):
            return False
        if v.op in _PURE_EXPRS:
            return True
        if v.op == "call" and not v.kws and v.vararg is None:
            fn = self._resolve(v.func)
            return any(fn is f for f in _PURE_CALLS) or isinstance(fn, np.ufunc)
        return False

    def _reads_elementwise(self, s, tgt):
        """Is statement ``s`` an operation that reads ``tgt`` element by element?"""
        if isinstance(s, (nir.SetItem, nir.StaticSetItem)):
            return s.value.name == tgt and s.target.name != tgt
        if not (isinstance(s, nir.Assign) and isinstance(s.value, nir.Expr)):
            return False
        e, ttype = s.value, self.typ(s.target)
        if e.op in ("binop", "unary", "inplace_binop"):
            fn = e.immutable_fn if e.op == "inplace_binop" else e.fn
            if e.op == "inplace_binop" and e.lhs.name == tgt:
                return False
            return fn is not operator.matmul and isinstance(ttype, types.Array)
        if e.op != "call" or e.kws or e.vararg is not None:
            return False
        fn = self._resolve(e.func)
        if isinstance(fn, np.ufunc) or fn is abs:
            return isinstance(ttype, types.Array) and len(e.args) == (
                1 if fn is abs else fn.nin)
        if fn is np.where:
            return isinstance(ttype, types.Array) and len(e.args) == 3
        return REDUCE.get(fn) is not None and len(e.args) == 1 and \
            not isinstance(ttype, types.Array)

    # ---- computing elements ------------------------------------------------------------
    def load(self, name, index, body, loc):
        """The element ``index`` of array, view or fused result ``name``, computed into
        ``body``."""
        fused = self.fused.get(name)
        if fused is not None:
            elems = self.elements(fused.ops, fused.mult, fused.ndim, index, body, loc)
            return self.value(fused.fn, fused.combine, elems, fused.dtype, body, loc)
        arr, aidx = self.element(name, index, body, loc)
        et = self.st.types[self.base_of(name)].dtype
        return self.tmp(body, "e", et, ir.Load(arr, aidx), loc)

    def elements(self, ops, mult, ndim, index, body, loc):
        """The operands' elements at ``index`` (of an ``ndim``-dimensional result)."""
        elems, loaded = [], {}
        for kind, v in ops:
            if kind == "scalar":
                elems.append(v)
                continue
            if v not in loaded:
                k = self.ndim(v)
                my = []
                for j in range(k):
                    d = j + ndim - k
                    m = mult.get((v, d))
                    my.append(index[d] if m is None else
                              self.iop(body, operator.mul, (index[d], m), loc))
                loaded[v] = self.load(v, my, body, loc)
            elems.append(loaded[v])
        return elems

    def value(self, fn, combine, elems, dtype, body, loc):
        if combine is not None:
            return combine(body, elems, dtype, loc)
        if fn is None:
            return elems[0]
        return self.tmp(body, "v", dtype, ir.Op(fn, tuple(elems)), loc)

    def fused_reads(self, name):
        """The base arrays fused result ``name`` reads (through fused operands too)."""
        out = set()
        for kind, v in self.fused[name].ops:
            if kind == "array":
                out |= self.fused_reads(v) if v in self.fused else {self.base_of(v)}
        return out

    def materialize(self, name, out, loc):
        """Compute fused result ``name`` into a scratch array of that name, in a loop
        appended to ``out`` (it is read where its own operands' elements may change)."""
        fused = self.fused.pop(name)
        out += self.alloc(name, self.st.types[name], fused.exts, loc)
        idx = [ir.Var(self.st.fresh("i", types.intp)) for _ in range(fused.ndim)]
        body = []
        elems = self.elements(fused.ops, fused.mult, fused.ndim, idx, body, loc)
        value = self.value(fused.fn, fused.combine, elems, fused.dtype, body, loc)
        darr, didx = self.element(name, idx, body, loc)
        body.append(ir.Store(darr, didx, value, loc=loc))
        out += self.nest(idx, fused.exts, body, loc)
        return name
