"""Forward mode of a CUDA kernel: the tangent kernel (``k.jvp[blocks, threads](...)``).

Each thread runs its part of the forward with the tangents alongside
(:class:`kadj.tangent.TangentWriter`); nothing is recorded and nothing is accumulated
across threads, so there is no tape and no atomic of kadj's own.  What a GPU thread
adds to the host's tangent function:

- the CUDA intrinsics are spelled as in the kernel (``cuda.grid(1)``,
  ``cuda.threadIdx.x``, from the target's table :data:`kadj.cuda.intrinsics.TABLE`); thread
  and block indices and sizes are integers, never active, so they have no tangent;
- ``cuda.syncthreads()`` stays where it is: the tangent of a shared array is a shared
  array declared the same way (``cuda.shared.array(shape, dtype)``, right after the
  primal's), written and read next to the primal between the same barriers; the tangent
  of a ``cuda.local.array`` is a local array of the same shape;
- ``cuda.atomic.add(x, idx, v)`` in the forward is linear: its tangent is
  ``cuda.atomic.add(dot_x, idx, dot_v)`` (``atomic.sub``: the negated tangent); the
  forward's own atomic stays an atomic.  ``atomic.max``/``min`` and the other atomics
  are refused by the structuring stage (:mod:`kadj.cuda.structure`), with their location.

The compiled tangent kernel (:class:`CompiledCudaTangent`) is ``cuda.jit`` of the printed
source, which starts with its imports like the adjoint's
(:func:`kadj.source_header.self_contained`).
"""
from __future__ import annotations

from dataclasses import dataclass

from numba.core import types

from .. import adj_ir as A
from .. import ir
from ..printer import render
from ..reverse import AdjointSource
from ..source_header import self_contained
from ..tangent import TangentWriter, readable
from .context import SYNTAX
from . import warp
from .intrinsics import TABLE, CudaIntrinsic


class CudaTangentWriter(TangentWriter):
    """The tangent kernel of one CUDA kernel, one GPU thread at a time."""

    def __init__(self, kernel, facts, slot_args, fname):
        super().__init__(kernel, facts, slot_args, False, fname)
        from numba import cuda
        self.ns["cuda"] = cuda

    # ---- the intrinsics in the source ---------------------------------------------------
    def bind(self, obj, hint):
        text = TABLE.name(obj)
        return text if text is not None else super().bind(obj, hint)

    def expr(self, e):
        if isinstance(e, ir.Op):
            text = TABLE.value(e.fn)
            if text is not None:
                return text
        return super().expr(e)

    def _op_terms(self, s, out_name):
        term = warp.tangent_term(self, s)   # a shuffle: the shuffle of the tangent
        return ([term], False) if term is not None else super()._op_terms(s, out_name)

    # ---- statements ---------------------------------------------------------------------
    def stmt(self, s, out):
        if isinstance(s, ir.Barrier):
            out.append(A.Barrier(loc=s.loc))
        else:
            super().stmt(s, out)

    def assign(self, s, out):
        e = s.expr
        if isinstance(e, ir.Alloc) and isinstance(e.fn, CudaIntrinsic):
            # the tangent array: declared like the primal's (a shared one is shared by
            # the block, a local one private to the thread), right after it
            self.comment(s.loc, out)
            decl = self.expr(e)
            out.append(A.Assign(self.n(s.target), decl))
            if self.active_array(s.target):
                out.append(A.Assign(self.dot(s.target), decl))
            return
        super().assign(s, out)

    def store(self, s, out):
        if s.accumulate == "claim":     # cuda.atomic.max/min (kadj.cuda.atomic_extrema)
            from .atomic_extrema import refuse_tangent
            refuse_tangent(self.k.name, s)
        if not s.accumulate:
            return super().store(s, out)
        # cuda.atomic.add / sub: an increment, linear in its value
        arr = s.array.name
        index = tuple(s.index)
        texts = tuple(self.o(i) for i in index)
        sign = "-" if s.accumulate == "sub" else ""
        self.comment(s.loc, out)
        if self.active_array(arr) and self.active(s.value):
            out.append(A.Accumulate(A.AdjElem(arr, index, self.dot(arr), texts), "+=",
                                    sign + self.dot(s.value.name), "atomic"))
        value = self.o(s.value)
        if sign:
            value = f"-{value}" if value.isidentifier() else f"-({value})"
        out.append(A.Accumulate(A.AdjElem(arr, index, self.arr(arr), texts), "+=",
                                value, "atomic"))


def write_tangent(prepared, facts, plan):
    """The :class:`kadj.reverse.AdjointSource` of the tangent kernel of the prepared
    CUDA kernel (:func:`kadj.targets.cuda._prepare`)."""
    kernel = prepared.kernel
    slot_args = tuple(plan.arg_names[i] for i in plan.adjoint_args)
    w = CudaTangentWriter(kernel, facts, slot_args, f"{kernel.name}_jvp")
    fn = A.built(readable(w.build()), "tangent")
    source, supplied = self_contained(render(fn, SYNTAX), w.ns)
    return AdjointSource(name=fn.name, source=source, namespace=supplied,
                         param_names=fn.params)


@dataclass(frozen=True)
class CompiledCudaTangent:
    """A compiled tangent kernel: ``launch(config, *args, *tangents)``."""

    plan: object
    source: str
    pyfunc: object          # the tangent kernel as a plain Python function
    kernel: object          # cuda.jit(pyfunc)
    disk_cached: bool = False

    def launch(self, config, *args):
        self.kernel[config](*args)

    def signature(self, arg_types):
        """numba signature of the tangent kernel for the forward's argument types: those,
        then one tangent per slot (a scalar's is a 1-element array)."""
        slots = tuple(t if isinstance(t, types.Array) else types.Array(t, 1, "C")
                      for t in (arg_types[i] for i in self.plan.adjoint_args))
        return tuple(arg_types) + slots


def compile_tangent(plan, source, pyfunc, disk_cached, jit_options):
    """The tangent kernel: ``cuda.jit`` (with the kernel's kept options) of ``pyfunc``."""
    from numba import cuda
    return CompiledCudaTangent(plan, source, pyfunc, cuda.jit(**jit_options)(pyfunc),
                               disk_cached)
