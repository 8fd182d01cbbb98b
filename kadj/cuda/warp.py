"""Warp-level primitives in differentiated CUDA kernels.

Shuffles (``cuda.shfl_sync``, ``shfl_up_sync``, ``shfl_down_sync``, ``shfl_xor_sync``)
move a value between the lanes of a warp; they are linear, and the adjoint of a
shuffle is the reverse shuffle of the adjoint.  With the hardware's semantics (PTX
``shfl.sync``, width 32; the lane operand is taken modulo 32), lane ``l`` reads:

- ``shfl_down_sync(mask, x, d)``: lane ``l + d`` when ``l + d < 32``, else its own x;
  lane ``s`` therefore receives the adjoint of lane ``s - d`` (when ``s >= d``) plus its
  own when ``s + d >= 32``: a ``shfl_up_sync`` of the adjoint and two lane tests;
- ``shfl_up_sync(mask, x, d)``: the mirror image (a ``shfl_down_sync`` of the adjoint);
- ``shfl_xor_sync(mask, x, m)``: lane ``l ^ m``; it is its own inverse;
- ``shfl_sync(mask, x, src)``: lane ``src % 32``; the adjoint of lane ``t`` is the sum
  of the adjoints of the lanes that read it.  With a constant source lane and the full
  mask it is a butterfly warp sum given to that lane; otherwise every lane gathers, lane
  by lane, the adjoints of the lanes whose source it is (64 shuffles).

A lane outside ``mask`` took no part in the forward shuffle: it contributes nothing.

The adjoints are device functions (:func:`helpers`) called in one expression, so the
reversed shuffle runs unconditionally, like the forward one.  That is correct only if
the same lanes run it together: a shuffle under control flow that depends on the
thread (a branch, a loop whose trip count differs by thread, an early return) is
refused (:func:`check_convergent`), with its location.  The adjoint mirrors the
forward's control flow, so a shuffle at a uniform point has its reverse at a uniform
point too.

``cuda.ballot_sync``, ``cuda.activemask``, ``cuda.lanemask_lt`` and ``cuda.laneid`` are
integers: never active.  Forward mode: the tangent of a shuffle is the same shuffle
of the tangent (:func:`tangent_term`).
"""
from __future__ import annotations

import functools

from numba.core import types

from .. import ir
from .. import ops
from .. import rules
from ..errors import DifferentiationError
from .intrinsics import CudaIntrinsic

SHUFFLES = ("shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync")
#: integer-valued warp functions: (number of arguments, numba-cuda's return type)
MASKS = {"ballot_sync": (2, types.int32), "activemask": (0, types.uint32),
         "lanemask_lt": (0, types.uint32)}
FUNCS = frozenset(SHUFFLES) | frozenset(MASKS)
FULL_MASK = 0xFFFFFFFF
_KIND = {"shfl_sync": "idx", "shfl_up_sync": "up", "shfl_down_sync": "down",
         "shfl_xor_sync": "xor"}


# ---- typing of the simulator shim (kadj.cuda.shim): numba-cuda's declarations --------
def _shuffle_type(mask, value, lane):
    value = types.unliteral(value)
    if value in (types.int32, types.int64, types.float32, types.float64) and \
            isinstance(types.unliteral(mask), types.Integer) and \
            isinstance(types.unliteral(lane), types.Integer):
        return value
    return None


def _ballot_type(mask, predicate):
    if isinstance(types.unliteral(mask), types.Integer) and isinstance(
            types.unliteral(predicate), (types.Integer, types.Boolean)):
        return types.int32
    return None


def shim_typers():
    """{attribute of ``cuda``: typer} for the simulator shim."""
    out = {name: _shuffle_type for name in SHUFFLES}
    out["ballot_sync"] = _ballot_type
    out["activemask"] = lambda: types.uint32
    out["lanemask_lt"] = lambda: types.uint32
    return out


# ---- structure: the calls as ops, and where they may stand --------------------------
def convert(structurizer, tgt, e, loc, path):
    """``v = cuda.<path>(...)`` -> an Op of the intrinsic (positional arguments)."""
    nargs = 3 if path in SHUFFLES else MASKS[path][0]
    if len(e.args) != nargs or e.kws:
        structurizer.error(
            f"cuda.{path} takes {nargs} positional argument(s) here", loc=loc,
            construct=f"cuda.{path}",
            remedy="call it as cuda.shfl_*_sync(mask, value, lane) (the width is "
                   "always 32) or cuda.ballot_sync(mask, predicate)")
    args = tuple(structurizer.operand(a) for a in e.args)
    return [ir.Assign(tgt, ir.Op(CudaIntrinsic(path), args), loc=loc)]


def _shuffle(s):
    return isinstance(s, ir.Assign) and isinstance(s.expr, ir.Op) and isinstance(
        s.expr.fn, CudaIntrinsic) and s.expr.fn.path in SHUFFLES


def _exits(seq):
    return any(isinstance(x, (ir.Break, ir.Continue, ir.Return)) for x in ir.walk(seq))


def check_convergent(kernel):
    """Refuse a shuffle that the lanes of a warp may not run together: one under a
    branch whose condition depends on the thread, in a loop whose bounds or exits do,
    or after an early exit taken by some threads only.  Returns ``kernel``."""
    if not any(_shuffle(s) for s in ir.walk(kernel.body)):
        return kernel
    deps = _WarpDeps(kernel)

    def varies(xs):     # within a warp: on the thread's index, not its block's or warp's
        return any(c[0] == "t" for x in xs if isinstance(x, ir.Var) for c in deps.of(x))

    def visit(seq, why):
        for s in seq:
            if _shuffle(s) and why is not None:
                name = s.expr.fn.path
                raise DifferentiationError(
                    f"cuda.{name}() stands where the lanes of a warp may not all arrive "
                    f"together ({why[0]}, line {_line(why[1])}); its adjoint, a shuffle "
                    "too, would then be run by other lanes than the forward's",
                    kernel=kernel.name, loc=s.loc, construct=f"cuda.{name} under "
                    "thread-dependent control flow",
                    remedy="call the shuffle at a point every lane of the warp reaches "
                           "(e.g. give out-of-range threads a zero value instead of "
                           "branching around the shuffle: v = x[i] if i < n else 0.0)")
            if isinstance(s, ir.If):
                inner = why or (("a branch on a thread-dependent condition", s.loc)
                                if varies((s.cond,)) else None)
                visit(s.then, inner)
                visit(s.orelse, inner)
                if why is None and inner is not None and _exits(s.then + s.orelse):
                    why = ("an exit taken by some threads only", s.loc)
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                inner = why
                if inner is None and isinstance(s, ir.ForRange) and varies(
                        (s.start, s.stop, s.step)):
                    inner = ("a loop whose bounds depend on the thread", s.loc)
                if inner is None and any(
                        isinstance(x, ir.If) and _exits(x.then + x.orelse) and
                        varies((x.cond,)) for x in ir.walk(s.body)):
                    inner = ("a loop whose exit depends on the thread", s.loc)
                visit(s.body, inner)

    visit(kernel.body, None)
    for s in ir.walk(kernel.body):
        mask = s.expr.args[0] if _shuffle(s) else None
        if isinstance(mask, ir.Const) and int(mask.value) & FULL_MASK != FULL_MASK:
            name = s.expr.fn.path
            raise DifferentiationError(
                f"cuda.{name}() with the constant mask {int(mask.value):#x}: kadj "
                "differentiates a shuffle with the full mask 0xffffffff or a mask held "
                "in a variable", kernel=kernel.name, loc=s.loc,
                construct=f"cuda.{name} with a partial constant mask",
                remedy="use 0xffffffff, or a mask from a variable (e.g. mask = "
                       "cuda.activemask())")
    return kernel


def _warp_deps_class():
    from .threads import ThreadDeps, thread_dims

    class WarpDeps(ThreadDeps):
        """What each variable depends on, with ``threadIdx.x // 32`` (or ``>> 5``, or
        any multiple of 32 or shift of at least 5) the warp's component ``("w", 0)``,
        the same in every lane, in a kernel whose blocks are 1-D (it reads no other
        thread index; its adjoint's launch is refused otherwise:
        :func:`kadj.cuda.threads.check_launch_dims`), where a warp is 32 consecutive
        ``threadIdx.x``."""

        def __init__(self, kernel):
            self.one_d = thread_dims(kernel)[0] in ((), (0,))
            super().__init__(kernel)

        def _expr_deps(self, e):
            if self.one_d and isinstance(e, ir.Op) and len(e.args) == 2 and \
                    _warp_divisor(e) and self._is_thread_x(e.args[0]):
                return {("w", 0)}
            return super()._expr_deps(e)

        def _is_thread_x(self, x, depth=0):
            while isinstance(x, ir.Var) and depth < 8:
                entries = self.sources.get(x.name, ())
                if len(entries) != 1:
                    return False
                e = entries[0][0]
                if isinstance(e, ir.Op) and isinstance(e.fn, CudaIntrinsic):
                    return e.fn.path == "threadIdx.x"
                if not isinstance(e, ir.Copy):
                    return False
                x, depth = e.src, depth + 1
            return False
    return WarpDeps


def _warp_divisor(e):
    import operator
    c = e.args[1].value if isinstance(e.args[1], ir.Const) else None
    if not isinstance(c, int) or isinstance(c, bool):
        return False
    return (e.fn is operator.floordiv and c > 0 and c % 32 == 0) or (
        e.fn is operator.rshift and c >= 5)


def _WarpDeps(kernel):
    return _warp_deps_class()(kernel)


def _line(loc):
    return getattr(loc, "line", "?")


# ---- reverse mode: the adjoint of each shuffle -------------------------------------------
def _int_const(x):
    c = ops.constant(x)
    return None if c is None else int(c.real if isinstance(c, complex) else c)


def _full_mask(mask):
    """Is ``mask`` a constant (the full mask: :func:`check_convergent` refuses the
    others), not a variable?"""
    return _int_const(mask) is not None


def _rule(name):
    def vjp(g, out, mask, x, lane):
        full = _full_mask(mask)
        if name == "shfl_sync" and full and _int_const(lane) is not None:
            return (None, ops.helper_call("warp_idx_const_adjoint", g, lane), None)
        helper = f"warp_{_KIND[name]}_adjoint"
        if full:
            return (None, ops.helper_call(helper + "_full", g, lane), None)
        return (None, ops.helper_call(helper, mask, g, lane), None)
    vjp.__name__ = f"vjp_{name}"
    return vjp


def register_rules():
    for name in SHUFFLES:
        rules.register(CudaIntrinsic(name), domain=(), name=f"cuda.{name}")(_rule(name))
    for name in list(_HELPERS):
        ops.HELPERS[name] = functools.partial(helper, name)


# ---- the device functions the adjoints call ---------------------------------------------
# Plain functions over the module's global ``cuda`` (bound to numba.cuda by helpers():
# the simulator swaps that global for its per-thread module); helpers() compiles each
# as a device function and binds its name here to the compiled one, which the ``_full``
# variants call.
cuda = None


def warp_down_adjoint(mask, g, delta):
    m = int(mask)
    d = int(delta) & 31
    lane = cuda.laneid
    r = cuda.shfl_up_sync(m, g, d)
    out = 0.0
    if lane >= d and (m >> (lane - d)) & 1:
        out += r
    if lane + d >= 32:
        out += g
    return out


def warp_up_adjoint(mask, g, delta):
    m = int(mask)
    d = int(delta) & 31
    lane = cuda.laneid
    r = cuda.shfl_down_sync(m, g, d)
    out = 0.0
    if lane + d < 32 and (m >> (lane + d)) & 1:
        out += r
    if lane < d:
        out += g
    return out


def warp_xor_adjoint(mask, g, lanemask):
    m = int(mask)
    b = int(lanemask) & 31
    r = cuda.shfl_xor_sync(m, g, b)
    out = 0.0
    if (m >> (cuda.laneid ^ b)) & 1:
        out += r
    return out


def warp_idx_adjoint(mask, g, src):
    m = int(mask)
    s = int(src)
    lane = cuda.laneid
    out = 0.0
    for j in range(32):
        gj = cuda.shfl_sync(m, g, j)
        sj = cuda.shfl_sync(m, s, j)
        if (m >> j) & 1 and (sj & 31) == lane:
            out += gj
    return out


def warp_idx_const_adjoint(g, src):
    total = g + 0.0
    k = 16
    while k > 0:
        total += cuda.shfl_xor_sync(0xFFFFFFFF, total, k)
        k //= 2
    out = 0.0
    if cuda.laneid == (int(src) & 31):
        out += total
    return out


def warp_down_adjoint_full(g, delta):
    return warp_down_adjoint(0xFFFFFFFF, g, delta)


def warp_up_adjoint_full(g, delta):
    return warp_up_adjoint(0xFFFFFFFF, g, delta)


def warp_xor_adjoint_full(g, lanemask):
    return warp_xor_adjoint(0xFFFFFFFF, g, lanemask)


def warp_idx_adjoint_full(g, src):
    return warp_idx_adjoint(0xFFFFFFFF, g, src)


_HELPERS = ("warp_down_adjoint", "warp_up_adjoint", "warp_xor_adjoint",
            "warp_idx_adjoint", "warp_idx_const_adjoint", "warp_down_adjoint_full",
            "warp_up_adjoint_full", "warp_xor_adjoint_full", "warp_idx_adjoint_full")


# the plain functions, out of the module's namespace until compiled: importing one of
# these names (a generated adjoint's header does) gives the compiled device function
_SOURCES = {name: globals().pop(name) for name in _HELPERS}


@functools.lru_cache(maxsize=None)
def helpers():
    """{name: device function} of the shuffles' adjoints (compiled on first use)."""
    global cuda
    from numba import cuda as numba_cuda

    cuda = numba_cuda   # (the simulator swaps this global for its per-thread module)
    compile_ = numba_cuda.jit(device=True)
    out = {}
    for name in _HELPERS:
        out[name] = globals()[name] = compile_(_SOURCES[name])
    return out


def helper(name):
    return helpers()[name]


def __getattr__(name):
    if name in _SOURCES:
        return helpers()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- forward mode ---------------------------------------------------------------------
def tangent_term(w, s):
    """The tangent of ``v = cuda.shfl_*(mask, x, lane)``: the shuffle of x's tangent
    (text), or None when ``s`` is no shuffle of an active value."""
    if not _shuffle(s):
        return None
    mask, x, lane = s.expr.args
    if not w.active(x):
        return None
    return f"cuda.{s.expr.fn.path}({w.o(mask)}, {w.dot(x.name)}, {w.o(lane)})"


register_rules()
