"""Region tree of a CUDA kernel: kadj.structurize plus CUDA intrinsics.

Every CUDA intrinsic becomes an :class:`~kadj.ir.Op` whose ``fn`` is a
:class:`CudaIntrinsic` naming its attribute path under ``numba.cuda``
(``grid``, ``gridsize``, ``threadIdx.x``...).  The path, not the Python object, is what
identifies it, so the same tree comes out of numba-cuda's typing context and of the
simulator shim (:mod:`kadj.cuda.shim`), and the generated source calls ``cuda.<path>``.

``cuda.atomic.add``/``sub`` become accumulating :class:`~kadj.ir.Store` statements.
``cuda.atomic.max``/``min``: a store of the winning thread (:mod:`kadj.cuda.atomic_extrema`).
Refused (DifferentiationError): atomics on complex arrays (no such atomic in numba-cuda)
and intrinsics not listed.
"""
from __future__ import annotations

import operator

import numpy as np
from numba.core import ir as nir
from numba.core import types

from .. import ir
from ..frontend import resolve_value
from ..structurize import Structurizer, run_structurizer
from . import shim as _shim
from . import atomic_extrema, warp
from .intrinsics import INDEX_FUNCS, SPECIAL_REGS, VOTES, CudaIntrinsic

_FOLD = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.lshift,
         operator.rshift}


def _is_cuda_module(obj):
    import numba
    return obj is _shim.shim or obj is getattr(numba, "cuda", None)


class CudaStructurizer(Structurizer):
    def cuda_path(self, var):
        """Attribute path of ``var`` under the ``cuda`` module, or None."""
        parts = []
        for _ in range(20):
            try:
                d = self.fir.get_definition(var)
            except Exception:
                return None
            if isinstance(d, nir.Var):
                var = d
                continue
            if isinstance(d, nir.Expr) and d.op == "getattr":
                parts.append(d.attr)
                var = d.value
                continue
            if isinstance(d, (nir.Global, nir.FreeVar)) and _is_cuda_module(d.value):
                return ".".join(reversed(parts))
            return None
        return None

    def convert_expr(self, tgt, e, loc):
        if e.op == "getattr":
            path = self.cuda_path(ir_var(tgt, loc))
            if path is not None:
                if path in SPECIAL_REGS:
                    return [ir.Assign(tgt, ir.Op(CudaIntrinsic(path), ()), loc=loc)]
                return []  # cuda.grid etc.: resolved where called
        return super().convert_expr(tgt, e, loc)

    def convert_call(self, tgt, e, loc):
        path = self.cuda_path(e.func)
        if path is None:
            return super().convert_call(tgt, e, loc)
        if path in INDEX_FUNCS:
            args = tuple(self.operand(a) for a in e.args)
            return [ir.Assign(tgt, ir.Op(CudaIntrinsic(path), args), loc=loc)]
        if path == "syncthreads":
            return [ir.Barrier(loc=loc)]
        if path in VOTES:
            return self.convert_vote(tgt, e, loc, path)
        if path in ("shared.array", "local.array"):
            return self.convert_array(tgt, e, loc, path)
        if path == "const.array_like":
            return self.convert_const_array(tgt, e, loc)
        if path in warp.FUNCS:
            return warp.convert(self, tgt, e, loc, path)
        if path in ("atomic.add", "atomic.sub"):
            return self.convert_atomic(tgt, e, loc, path[len("atomic."):])
        if path in atomic_extrema.PATHS:
            return atomic_extrema.convert(self, tgt, e, loc, path)
        self.error(f"cuda.{path}() is not supported in differentiated kernels", loc=loc,
                   construct=f"cuda.{path}",
                   remedy="supported: cuda.grid, cuda.gridsize, threadIdx/blockIdx/"
                          "blockDim/gridDim, cuda.atomic.add/sub/max/min, cuda.shfl_*_sync, "
                          "cuda.ballot_sync, cuda.activemask, cuda.lanemask_lt, "
                          "cuda.syncthreads_or/_and/_count")

    def convert_vote(self, tgt, e, loc, path):
        """``v = cuda.syncthreads_or(p)`` (``_and``, ``_count``) -> a barrier, then the
        vote: the barrier is what the adjoint mirrors (its reverse sweep needs one
        there, as for ``cuda.syncthreads()``); the vote's integer is never active, and
        the adjoint's forward sweep takes it again where a branch needs it."""
        if len(e.args) != 1 or e.kws:
            self.error(f"cuda.{path} takes one predicate", loc=loc,
                       construct=f"cuda.{path}")
        vote = ir.Op(CudaIntrinsic(path), (self.operand(e.args[0]),))
        return [ir.Barrier(loc=loc), ir.Assign(tgt, vote, loc=loc)]

    def atomic_operands(self, tgt, e, loc, path):
        """(array, index operands, value) of ``cuda.<path>(a, idx, v)``, refusing a call
        of another shape, a non-array and a used result (the element's old value)."""
        construct = f"cuda.{path}"
        if len(e.args) != 3 or e.kws:
            self.error(f"cuda.{path} takes (array, index, value)", loc=loc,
                       construct=construct)
        arr, idx, val = e.args
        if not isinstance(self.types.get(arr.name), types.Array):
            self.error(f"cuda.{path} on a non-array", loc=loc, construct=construct)
        if self.var_used(tgt):
            self.error(f"the value returned by cuda.{path} (the element's old value) is "
                       "used; kadj does not differentiate that", loc=loc,
                       construct=f"result of cuda.{path}",
                       remedy="do not use the return value of the atomic in a "
                              "differentiated kernel")
        c = self.const_of(idx)
        if c is not None:
            index = tuple(ir.Const(int(x)) for x in c.value) if isinstance(
                c.value, tuple) else (c,)
        else:
            index = self.index_operands(idx)
        return arr, index, val

    def convert_atomic(self, tgt, e, loc, op):
        """``cuda.atomic.add(a, idx, v)`` -> an accumulating Store; its result (the old
        value) must be unused."""
        arr, index, val = self.atomic_operands(tgt, e, loc, f"atomic.{op}")
        if isinstance(self.types[arr.name].dtype, types.Complex):
            # (the simulator would run it; numba-cuda has no complex atomics)
            self.error(f"cuda.atomic.{op} on the complex array '{arr.name}': numba-cuda "
                       "has no atomic operations on complex values", loc=loc,
                       construct=f"complex cuda.atomic.{op}",
                       remedy="accumulate into two real arrays (the real and the "
                              "imaginary parts) with float atomics instead")
        return [ir.Store(self.avar(arr), index, self.operand(val), loc=loc,
                         accumulate=op)]

    def convert_array(self, tgt, e, loc, path):
        """``cuda.shared.array(shape, dtype)`` / ``cuda.local.array`` -> an Alloc with a
        constant shape (int or tuple) and the dtype object."""
        given = dict(zip(("shape", "dtype"), e.args))
        given.update(dict(e.kws))
        try:
            shape = self.literal(given["shape"])
            dtype = resolve_value(self.fir, given["dtype"])
        except (KeyError, LookupError, AttributeError):
            shape = None
        if isinstance(shape, (int, tuple)) and not isinstance(shape, bool):
            shape = tuple(int(x) for x in shape) if isinstance(shape, tuple) else int(shape)
        else:
            self.error(f"cuda.{path} needs a constant shape and dtype", loc=loc,
                       construct=f"cuda.{path}",
                       remedy="use a module-level constant or a literal for the shape")
        if path == "shared.array" and 0 in (shape if isinstance(shape, tuple) else
                                            (shape,)):
            # every dynamic shared array of a block starts at the same address: the
            # adjoint's own shared arrays would alias the kernel's, and their size is
            # the launch's, not known here
            self.error("dynamic shared memory (cuda.shared.array(0, ...), sized at "
                       "launch) is not supported in differentiated kernels", loc=loc,
                       construct="dynamic shared memory",
                       remedy="declare the shared array with a constant size (a "
                              "module-level constant: cuda.shared.array(TPB, float64)) "
                              "and launch with that many threads per block")
        return [ir.Assign(tgt, ir.Alloc(CudaIntrinsic(path), (
            ir.Const(shape), ir.GlobalRef(dtype, name=str(dtype)))), loc=loc)]

    def convert_const_array(self, tgt, e, loc):
        """``cuda.const.array_like(TABLE)`` of a module-level NumPy array: the table
        itself, read as the kernel reads a module-level array (numba puts both in
        constant memory); its elements carry no derivative."""
        try:
            table = resolve_value(self.fir, e.args[0]) if len(e.args) == 1 and \
                not e.kws else None
        except (LookupError, AttributeError):
            table = None
        if not isinstance(table, np.ndarray):
            self.error("cuda.const.array_like() of anything but a module-level NumPy "
                       "array is not supported", loc=loc,
                       construct="cuda.const.array_like",
                       remedy="pass a module-level NumPy array (a global constant), or "
                              "read that array directly")
        d = self.fir.get_definition(e.args[0])
        name = d.name if isinstance(d, (nir.Global, nir.FreeVar)) else "table"
        return [ir.Assign(tgt, ir.Copy(ir.GlobalRef(table, name=name)), loc=loc)]

    def literal(self, var):
        """A constant integer (or tuple of them): literal type, or static value."""
        t = self.types.get(var.name)
        if isinstance(t, types.IntegerLiteral):
            return t.literal_value
        if isinstance(t, types.BaseTuple) and all(
                isinstance(x, types.IntegerLiteral) for x in t):
            return tuple(x.literal_value for x in t)
        d = self.fir.get_definition(var)
        if isinstance(d, nir.Expr) and d.op == "binop" and d.fn in _FOLD:
            return d.fn(self.literal(d.lhs), self.literal(d.rhs))
        if isinstance(d, nir.Expr) and d.op == "build_tuple":
            return tuple(self.literal(x) for x in d.items)
        return resolve_value(self.fir, var)

    def var_used(self, name):
        for block in self.fir.blocks.values():
            for st in block.body:
                if isinstance(st, nir.Assign) and st.target.name == name:
                    if any(v.name == name for v in st.value.list_vars()):
                        return True
                    continue
                if isinstance(st, nir.Del):
                    continue
                if any(v.name == name for v in st.list_vars()):
                    return True
        return False


def ir_var(name, loc):
    return nir.Var(None, name, loc)


def structurize_cuda(tk):
    from .. import scratch_loops        # thread-local arrays allocated inside loops
    kernel = scratch_loops.hoist(run_structurizer(CudaStructurizer, tk), _thread_local)
    return atomic_extrema.attach(warp.check_convergent(kernel))


def _thread_local(alloc):
    return isinstance(alloc.fn, CudaIntrinsic) and alloc.fn.path.startswith("local.")
