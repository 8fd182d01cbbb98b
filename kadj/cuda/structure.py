"""Region tree of a CUDA kernel: kadj.structurize plus CUDA intrinsics.

Every CUDA intrinsic becomes an :class:`~kadj.ir.Op` whose ``fn`` is a
:class:`CudaIntrinsic` naming its attribute path under ``numba.cuda``
(``grid``, ``gridsize``, ``threadIdx.x``...).  The path, not the Python object, is what
identifies it, so the same tree comes out of numba-cuda's typing context and of the
simulator shim (:mod:`kadj.cuda.shim`), and the generated source calls ``cuda.<path>``.

Refused for now (DifferentiationError): atomics, shared/local arrays, syncthreads and
other intrinsics.
"""
from __future__ import annotations

from dataclasses import dataclass

from numba.core import ir as nir

from .. import ir
from ..errors import DifferentiationError
from ..structurize import Structurizer
from . import shim as _shim

INDEX_FUNCS = {"grid", "gridsize"}
SPECIAL_REGS = {f"{r}.{c}" for r in ("threadIdx", "blockIdx", "blockDim", "gridDim")
                for c in "xyz"} | {"warpsize", "laneid"}


@dataclass(frozen=True)
class CudaIntrinsic:
    path: str

    @property
    def __name__(self):  # noqa: D401 - used by kadj's printers
        return "cuda." + self.path

    def __repr__(self):
        return "cuda." + self.path


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
        if path is not None:
            if path in INDEX_FUNCS:
                args = tuple(self.operand(a) for a in e.args)
                return [ir.Assign(tgt, ir.Op(CudaIntrinsic(path), args), loc=loc)]
            remedy = {
                "atomic.add": "not supported yet in this version of kadj's CUDA support",
            }.get(path, "only cuda.grid, cuda.gridsize and threadIdx/blockIdx/blockDim/"
                        "gridDim are supported so far")
            raise DifferentiationError(
                f"cuda.{path}() is not supported yet", kernel=self.tk.name, loc=loc,
                construct=f"cuda.{path}", remedy=remedy)
        return super().convert_call(tgt, e, loc)


def ir_var(name, loc):
    return nir.Var(None, name, loc)


def structurize_cuda(tk):
    return CudaStructurizer(tk).run()
