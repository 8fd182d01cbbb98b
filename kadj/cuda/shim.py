"""Typing of CUDA kernels without numba-cuda's typing context (the simulator).

Under ``NUMBA_ENABLE_CUDASIM=1`` numba-cuda's real typing modules cannot be imported
(the simulator replaces ``numba.cuda.cudadrv`` and friends in ``sys.modules``), and the
simulator's ``numba.cuda`` has no ``grid``/``threadIdx``: they are injected per thread at
launch.  kadj then types a clone of the kernel's Python function whose global ``cuda``
is this module's :data:`shim`, typed (never lowered) by numba's CPU typing context.
Device functions (simulator ``FakeCUDAKernel`` objects) are replaced by ``@njit`` clones
so that kadj's frontend inlines them.

The shim must give the typed IR numba-cuda gives (one verdict and one adjoint for the
simulator and the GPU; ``tests/test_cuda_verdict.py`` compares them), so it mirrors
numba-cuda's declarations (``numba/cuda/cudadecl.py``, ``stubs.py``, ``intrinsics.py``):

- ``threadIdx``/``blockIdx``/``blockDim``/``gridDim`` are classes whose ``x``/``y``/``z``
  are properties, like numba-cuda's stubs: numba's constant inference then takes
  ``cuda.threadIdx.x`` for a (non-integer) constant in both paths alike, and the
  attributes are typed ``int32``; ``laneid`` and ``warpsize`` are ``int32`` too;
- ``grid(n)``/``gridsize(n)`` are ``int64`` or ``UniTuple(int64, n)`` for a literal n;
- ``shared.array``/``local.array`` need a literal shape (an int or a tuple of ints) and a
  dtype; the ``atomic`` functions return the array's dtype;
- any other attribute of ``cuda`` (``cuda.fma``, ``cuda.popc``...) is an opaque function
  of the first argument's type, so that kadj's structurizer refuses it at its line, as it
  does for numba-cuda's typing;
- ``math`` functions are typed as numba-cuda declares them (:mod:`kadj.cuda.shim_math`:
  ``math.floor`` is a float there), in a typing context of the shim's own.

Only typing uses the shim: the region tree names every CUDA intrinsic by its attribute
path (``cuda.grid``, ``cuda.threadIdx.x``), and the generated source calls the real
``numba.cuda`` (simulator or not) by that name.
"""
from __future__ import annotations

import functools
import types as pytypes

from numba import njit
from numba.core import types
from numba.core.typing.templates import (AttributeTemplate, CallableTemplate,
                                         infer_getattr)
from numba.extending import models, register_model, typeof_impl
from .intrinsics import VOTES


class _ShimModule(pytypes.ModuleType):
    """A module whose unknown attributes are opaque functions (typed, never run)."""

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        fn = _opaque(f"{self.__name__[len('kadj_cuda_shim.'):]}.{name}".lstrip("."))
        setattr(self, name, fn)
        return fn


def _module(name, **attrs):
    m = _ShimModule(name)
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


def _stub(name):
    def stub(*args, **kwargs):  # pragma: no cover - typed only
        raise NotImplementedError(f"cuda.{name} is only typed by kadj, never called")
    stub.__name__ = stub.__qualname__ = name
    return stub


_FUNCTION_TYPES = {}  # shim function -> its numba type (typing_context() resolves them)


def _typed(name, typer):
    """A stub function typed by ``typer(*args, **kws) -> return type or None``."""
    fn = _stub(name)

    class _Template(CallableTemplate):
        key = fn

        def generic(self):
            return typer

    _FUNCTION_TYPES[fn] = types.Function(_Template)
    return fn


def _opaque(path):
    """``cuda.<path>``, unknown to the shim: typed as a function of its first
    argument's type, so the structurizer reaches it and refuses it."""
    return _typed(path, lambda *args: types.unliteral(args[0]) if args else types.none)


def _literal(t):
    return t.literal_value if isinstance(t, types.IntegerLiteral) else None


def _grid_type(ndim):
    n = _literal(ndim)
    if n == 1:
        return types.int64
    if n in (2, 3):
        return types.UniTuple(types.int64, n)
    return None


def _array_type(shape, dtype, alignment=None):
    """numba-cuda's ``Cuda_array_decl``: literal shape, numba dtype."""
    if isinstance(shape, types.Integer):
        ndim = 1 if isinstance(shape, types.IntegerLiteral) else None
    elif isinstance(shape, types.BaseTuple):
        ndim = len(shape) if all(isinstance(s, types.IntegerLiteral) for s in shape) \
            else None
    else:
        ndim = None
    if isinstance(dtype, (types.NumberClass, types.DType)):
        dtype = dtype.dtype
    if ndim is None or not isinstance(dtype, (types.Number, types.Boolean)):
        return None
    return types.Array(dtype, ndim, "C")


def _const_array_type(ary):
    """numba-cuda's ``cuda.const.array_like(a)``: a read-only array like the
    module-level one."""
    if not isinstance(ary, types.Array):
        return None
    return types.Array(ary.dtype, ary.ndim, "C", readonly=True)


def _vote_type(predicate):
    """numba-cuda's ``cuda.syncthreads_or`` (``_and``, ``_count``): an int32 of an
    integer predicate (numba-cuda refuses a bool)."""
    return types.int32 if isinstance(types.unliteral(predicate), types.Integer) else None


def _atomic_type(ary, idx, val):
    return ary.dtype if isinstance(ary, types.Array) else None


def _warp_typers():
    from .warp import shim_typers   # shuffles, ballot_sync, activemask, lanemask_lt
    return shim_typers()


shim = _module(
    "kadj_cuda_shim",
    grid=_typed("grid", _grid_type),
    gridsize=_typed("gridsize", _grid_type),
    syncthreads=_typed("syncthreads", lambda: types.none),
    **{vote: _typed(vote, _vote_type) for vote in VOTES},
    syncwarp=_typed("syncwarp", lambda *a: types.none),
    threadfence=_typed("threadfence", lambda: types.none),
    shared=_module("kadj_cuda_shim.shared", array=_typed("shared.array", _array_type)),
    local=_module("kadj_cuda_shim.local", array=_typed("local.array", _array_type)),
    const=_module("kadj_cuda_shim.const",
                  array_like=_typed("const.array_like", _const_array_type)),
    **{name: _typed(name, typer) for name, typer in _warp_typers().items()},
    atomic=_module("kadj_cuda_shim.atomic", **{
        op: _typed(f"atomic.{op}", _atomic_type)
        for op in ("add", "sub", "max", "min", "nanmax", "nanmin", "exch", "inc", "dec",
                   "and_", "or_", "xor")}),
)


# ---- special registers: classes with properties, like numba-cuda's stubs -------------
class _RegisterMeta(type):
    """Metaclass of the special-register stubs; numba types them by it."""


class _Dim3Meta(_RegisterMeta):
    pass


class _Dim3(metaclass=_Dim3Meta):
    x = property(lambda self: None)
    y = property(lambda self: None)
    z = property(lambda self: None)


class _Int32Register(metaclass=_RegisterMeta):
    pass


class _Dim3Type(types.Dummy):
    def __init__(self):
        super().__init__("Dim3")  # numba-cuda's name


_dim3_type = _Dim3Type()
register_model(_Dim3Type)(models.OpaqueModel)


@typeof_impl.register(_RegisterMeta)
def _typeof_register(val, c):
    return _dim3_type if isinstance(val, _Dim3Meta) else types.int32


@infer_getattr
class _Dim3Attrs(AttributeTemplate):
    key = _dim3_type

    def resolve_x(self, d):
        return types.int32

    def resolve_y(self, d):
        return types.int32

    def resolve_z(self, d):
        return types.int32


for _name in ("threadIdx", "blockIdx", "blockDim", "gridDim"):
    setattr(shim, _name, _Dim3Meta(_name, (_Dim3,), {}))
for _name in ("warpsize", "laneid"):
    setattr(shim, _name, _RegisterMeta(_name, (_Int32Register,), {}))


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


@functools.lru_cache(maxsize=None)
def typing_context():
    """A typing context of its own for the shim: numba's CPU one, with numba-cuda's
    math declarations (users' ``@njit`` functions keep the CPU's)."""
    from numba.core.registry import cpu_target

    from .shim_math import math_declarations
    math_types = math_declarations()

    class _ShimTypingContext(type(cpu_target.typing_context)):
        def resolve_value_type(self, val):
            if isinstance(val, pytypes.FunctionType) and val in _FUNCTION_TYPES:
                return _FUNCTION_TYPES[val]
            if isinstance(val, pytypes.BuiltinFunctionType) and val in math_types:
                return math_types[val]
            return super().resolve_value_type(val)

    ctx = _ShimTypingContext()
    ctx.refresh()
    return ctx


def type_with_shim(py_func, arg_types):
    """Typed IR of ``py_func`` with ``cuda`` typed by the shim (numba's CPU typing
    context with CUDA's math, nothing lowered)."""
    from numba.core.registry import cpu_target

    from ..frontend import _run
    return _run(clone_for_typing(py_func), typing_context(), cpu_target.target_context,
                arg_types, "cuda")
