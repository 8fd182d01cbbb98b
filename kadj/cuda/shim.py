"""Typing of CUDA kernels without numba-cuda's typing context (the simulator).

Under ``NUMBA_ENABLE_CUDASIM=1`` numba-cuda's real typing modules cannot be imported
(the simulator replaces ``numba.cuda.cudadrv`` and friends in ``sys.modules``), and the
simulator's ``numba.cuda`` has no ``grid``/``threadIdx``: they are injected per thread at
launch.  kadj then types a clone of the kernel's Python function whose global ``cuda``
is this module's :data:`shim`: a module whose ``grid``, ``gridsize``, ``threadIdx.x``...
are typed (never lowered) by numba's CPU typing context with the types numba-cuda gives
them (int64 indices, UniTuple(int64, n) for ``grid(n)`` with n > 1).  Device functions
(simulator ``FakeCUDAKernel`` objects) are replaced by ``@njit`` clones so that kadj's
frontend inlines them.

Only typing uses the shim: the region tree names every CUDA intrinsic by its attribute
path (``cuda.grid``, ``cuda.threadIdx.x``), and the generated source calls the real
``numba.cuda`` (simulator or not) by that name.
"""
from __future__ import annotations

import types as pytypes

import numpy as np

from numba import njit
from numba.core import types
from numba.extending import (overload, overload_attribute, register_model, models,
                             typeof_impl)

shim = pytypes.ModuleType("kadj_cuda_shim")


def _grid(ndim):  # pragma: no cover - typed only
    raise NotImplementedError


def _gridsize(ndim):  # pragma: no cover - typed only
    raise NotImplementedError


def _syncthreads():  # pragma: no cover - typed only
    raise NotImplementedError


def _grid_typing(ndim):
    if not isinstance(ndim, types.IntegerLiteral):
        return None
    n = ndim.literal_value
    if n == 1:
        return lambda ndim: 0
    if n == 2:
        return lambda ndim: (0, 0)
    if n == 3:
        return lambda ndim: (0, 0, 0)
    return None


overload(_grid, prefer_literal=True)(_grid_typing)
overload(_gridsize, prefer_literal=True)(_grid_typing)


@overload(_syncthreads)
def _sync_impl():
    return lambda: None


_grid.__name__, _gridsize.__name__, _syncthreads.__name__ = "grid", "gridsize", \
    "syncthreads"
shim.grid = _grid
shim.gridsize = _gridsize
shim.syncthreads = _syncthreads


def _typed_only(name, typing):
    def stub(*args):  # pragma: no cover - typed only
        raise NotImplementedError
    stub.__name__ = name
    overload(stub, prefer_literal=True)(typing)
    return stub


def _atomic_typing(ary, idx, val):
    return lambda ary, idx, val: ary[idx]


def _array_typing(shape, dtype):
    return lambda shape, dtype: np.empty(shape, dtype)


def _submodule(name, **attrs):
    m = pytypes.ModuleType(f"kadj_cuda_shim.{name}")
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


shim.atomic = _submodule("atomic", **{
    op: _typed_only(op, _atomic_typing)
    for op in ("add", "sub", "max", "min", "nanmax", "nanmin", "exch", "inc", "dec",
               "and_", "or_", "xor")})
shim.shared = _submodule("shared", array=_typed_only("array", _array_typing))
shim.local = _submodule("local", array=_typed_only("array", _array_typing))
shim.syncwarp = _typed_only("syncwarp", lambda *a: (lambda *a: None))
shim.threadfence = _typed_only("threadfence", lambda: (lambda: None))


class _Dim3:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"cuda.{self.name}"


class _Dim3Type(types.Dummy):
    def __init__(self):
        super().__init__("kadj_cuda_dim3")


_dim3_type = _Dim3Type()


@typeof_impl.register(_Dim3)
def _typeof_dim3(val, c):
    return _dim3_type


register_model(_Dim3Type)(models.OpaqueModel)

for _attr in ("x", "y", "z"):
    def _attr_impl(d):
        return lambda d: 0
    overload_attribute(_Dim3Type, _attr)(_attr_impl)

for _name in ("threadIdx", "blockIdx", "blockDim", "gridDim"):
    setattr(shim, _name, _Dim3(_name))
shim.warpsize = 32


def is_simulator_module(obj):
    """True for the simulator's ``numba.cuda`` module (or the real one)."""
    import numba
    return obj is getattr(numba, "cuda", None)


def clone_for_typing(py_func, _memo=None):
    """``py_func`` with ``cuda`` -> :data:`shim` and device kernels -> @njit clones."""
    memo = {} if _memo is None else _memo
    if py_func in memo:
        return memo[py_func]
    g = dict(py_func.__globals__)
    f = pytypes.FunctionType(py_func.__code__, g, py_func.__name__, py_func.__defaults__,
                             py_func.__closure__)
    f.__kwdefaults__ = py_func.__kwdefaults__
    f.__module__ = py_func.__module__
    f.__qualname__ = py_func.__qualname__
    memo[py_func] = f
    for k, v in list(g.items()):
        if is_simulator_module(v):
            g[k] = shim
        elif type(v).__name__ == "FakeCUDAKernel" and getattr(v, "_device", False):
            g[k] = njit(clone_for_typing(v.py_func, memo))
    return f


def type_with_shim(py_func, arg_types):
    import re

    from numba.core.errors import TypingError
    from numba.core.registry import cpu_target

    from ..errors import DifferentiationError
    from ..frontend import _run
    f = clone_for_typing(py_func)
    try:
        return _run(f, cpu_target.typing_context, cpu_target.target_context, arg_types,
                    "cuda")
    except (TypingError, AttributeError) as exc:
        m = re.search(r"Unknown attribute '(\w+)' of type Module\(<module "
                      r"'kadj_cuda_shim(\.\w+)?'", str(exc))
        if m is not None:
            path = ((m.group(2) or "")[1:] + "." + m.group(1)).lstrip(".")
        else:
            m = re.search(r"module 'kadj_cuda_shim(\.\w+)?' has no attribute '(\w+)'",
                          str(exc))
            if m is None:
                raise
            path = ((m.group(1) or "")[1:] + "." + m.group(2)).lstrip(".")
        raise DifferentiationError(
            f"cuda.{path} is not supported in differentiated kernels",
            kernel=py_func.__name__, construct=f"cuda.{path}",
            remedy="supported: cuda.grid, cuda.gridsize, threadIdx/blockIdx/blockDim/"
                   "gridDim, shared and local arrays, syncthreads, atomic.add/sub") from None
