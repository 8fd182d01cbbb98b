"""CUDA intrinsics in kadj's region tree.

Every CUDA intrinsic is an :class:`~kadj.ir.Op` whose ``fn`` is a :class:`CudaIntrinsic`
naming its attribute path under ``numba.cuda`` (``grid``, ``gridsize``,
``threadIdx.x``...).  The path, not the Python object, identifies it, so the same tree
comes out of numba-cuda's typing context and of the simulator shim
(:mod:`kadj.cuda.shim`), and the generated source calls ``cuda.<path>``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..targets.base import Intrinsics

INDEX_FUNCS = {"grid", "gridsize"}
#: block-wide votes: a barrier that also returns an integer from every thread's predicate
VOTES = {"syncthreads_or", "syncthreads_and", "syncthreads_count"}
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


def _name(obj):
    return "cuda." + obj.path if isinstance(obj, CudaIntrinsic) else None


def _value(fn):
    if isinstance(fn, CudaIntrinsic) and fn.path in SPECIAL_REGS:
        return "cuda." + fn.path
    return None


#: how the adjoint's source names CUDA intrinsics (the CUDA target's table)
TABLE = Intrinsics(name=_name, value=_value)
