"""Hessian-vector products, reverse over forward: ``kadj.hvp(f, argnums)(*args, v)``.

For an ``@njit`` function ``f`` returning a float, ``H v`` is the gradient of the
directional derivative ``<grad f(x), v>`` with respect to ``x``, ``v`` held fixed.  kadj
builds that directional derivative as a function of its own: the tangent function of
forward mode (:mod:`kadj.tangent`, built from the same region tree, facts and rule
table) with only the tangent of the returned float as its result (the "tangent value"
function, :class:`TangentValueWriter`).  That function is plain Numba-compilable Python;
kadj compiles it with ``@njit`` and differentiates it with its own reverse mode
(:mod:`kadj.api`), with respect to the primal arguments of ``argnums`` only.  The
tangents are its arguments, not differentiated: the adjoint's gradient is ``H v``.

Both derivatives are exact (no differences): ``H v`` is exact to rounding, and costs
one reverse sweep over a function about twice as long as ``f``, never a Hessian.

The tangent value function is written to kadj's disk cache like an adjoint (key:
``mode="hvp"``); its adjoint is cached as any adjoint is.  Both are kept on the
differentiated kernel per argument types and ``argnums``.
"""
from __future__ import annotations

import dataclasses
import inspect

import numpy as np
from numba.core import types

from . import adj_ir as A
from . import codegen, pipeline, rules
from .api import differentiate
from .errors import DifferentiationError
from .kernel import DifferentiatedKernel
from .printer import Syntax, render
from .reverse import AdjointSource
from .source_header import self_contained
from .tangent import TangentWriter, check_target, readable

MODE = "hvp"        # the part of the disk-cache key that tells this function apart


class TangentValueWriter(TangentWriter):
    """The tangent function of a kernel returning a float, returning only the tangent
    of that float (``<grad f, v>`` for the tangents ``v`` of its slots)."""

    def _ret_text(self, value):
        super()._ret_text(value)        # its refusals (a path without a return value)
        t = self.k.return_type
        return self.cast(self.dot(value.name), t) if self.active(value) \
            else self.zero(t)


@dataclasses.dataclass
class Compiled:
    """One Hessian-vector product of a kernel for one argument signature and
    ``argnums``: the tangent value function (``inner``, a differentiated kernel whose
    adjoint gives ``H v``), the forward plan of ``f`` restricted to ``argnums``
    (``plan``: which arguments have tangent slots) and the tangent value source."""
    plan: object
    inner: DifferentiatedKernel
    wrt: tuple
    source: str


def _argument_names(k, arg_types, idx):
    """The names of the arguments ``idx``, refused unless each is a floating-point
    scalar or array the kernel's ``wrt`` allows."""
    names = []
    for i in idx:
        name, t = k.arg_names[i], arg_types[i]
        dtype = t.dtype if isinstance(t, types.Array) else t
        if not isinstance(dtype, types.Float):
            raise DifferentiationError(
                f"argnums {i} is argument '{name}' of type {t}, which is not floating "
                "point, so it has no Hessian", kernel=k.__name__,
                construct=f"kadj.hvp(..., argnums={i})",
                remedy="choose float32/float64 arguments (scalars or arrays) in argnums")
        if k.wrt is not None and name not in k.wrt:
            raise DifferentiationError(
                f"argnums {i} is argument '{name}', which is not in the kernel's "
                f"wrt={k.wrt}", kernel=k.__name__,
                construct=f"kadj.hvp(..., argnums={i})",
                remedy="add it to wrt= or differentiate the undecorated function")
        names.append(name)
    return tuple(names)


def _tangent_value_function(k, arg_types, names):
    """(plan, source, jitted function) of the tangent value function of ``k`` with
    tangents for ``names`` (and the arrays the kernel writes)."""
    check_target(k.target, k.__name__)
    req = pipeline.request(k.target, k.dispatcher, arg_types, names, None,
                           k._options())
    options = dict(req.jit_options)
    options["mode"] = MODE
    key = codegen.cache_key(req.py_func, req.arg_types, req.wrt, options, k.target.name)
    cached = codegen.load_cached(key)
    if cached is not None:
        pipeline.RUNS["loaded"] += 1
        plan, source, pyfn, _report = cached
        return plan, source, codegen.jit(pyfn, True, req.jit_options)[0]
    out = pipeline.stages(k.target, req, req.arg_types, until="facts")
    plan = out["plan"]
    if not plan.returns_value:
        raise DifferentiationError(
            f"{k.__name__} does not return a float (it returns "
            f"{out['region'].return_type}), so it has no Hessian",
            kernel=k.__name__, construct="kadj.hvp",
            remedy="return the scalar loss from the function")
    pipeline.RUNS["tangent"] += 1
    slots = tuple(plan.arg_names[i] for i in plan.adjoint_args)
    w = TangentValueWriter(out["prepared"].kernel, out["facts"], slots, True,
                           f"{k.__name__}_tangent_value")
    fn = w.build()
    fn.doc = (f"Directional derivative of {k.__name__} along the tangents: its "
              "tangent function returning only the tangent (generated by kadj).")
    fn = A.built(readable(fn), "tangent")
    source, supplied = self_contained(render(fn, Syntax()), w.ns)
    src = AdjointSource(name=fn.name, source=source, namespace=supplied,
                        param_names=fn.params)
    typed = out["typed"]
    pyfn, disk = codegen.build(src, plan, key, codegen.source_files(typed.func_ir),
                               func_ir=typed.func_ir)
    return plan, src.source, codegen.jit(pyfn, disk, req.jit_options)[0]


def compiled(k, args, idx):
    """The :class:`Compiled` Hessian-vector product of ``k`` for the (complete)
    arguments ``args`` and argument indices ``idx``, kept on the kernel."""
    arg_types = k._arg_types(args)
    cache = k.__dict__.setdefault("_hvp_cache", {})
    key = (rules.generation(), arg_types, idx)
    hit = cache.get(key)
    if hit is None:
        names = _argument_names(k, arg_types, idx)
        plan, source, fn = _tangent_value_function(k, arg_types, names)
        inner = differentiate(fn, wrt=_param_names(fn, names, k),
                              checkpoints=k.options.get("checkpoints"))
        hit = Compiled(plan, inner, names, source)
        cache[key] = hit
    return hit


def _param_names(fn, wanted, k):
    """The tangent value function's own names of the primal arguments ``wanted`` (its
    first parameters are the kernel's arguments, in order, possibly renamed)."""
    params = tuple(inspect.signature(fn.py_func).parameters)
    pos = {name: i for i, name in enumerate(k.arg_names)}
    return tuple(params[pos[name]] for name in wanted)


def _tangent(x, v, name, kname):
    """The tangent slot for argument value ``x`` and direction ``v``."""
    dtype = np.asarray(x).dtype
    if isinstance(x, np.ndarray):
        t = np.asarray(v)
        if t.shape != x.shape:
            raise ValueError(f"kadj.hvp({kname}): the direction for '{name}' has shape "
                             f"{t.shape}, but '{name}' has shape {x.shape}.")
        return np.array(t, dtype=dtype)
    if np.ndim(v) != 0:
        raise ValueError(f"kadj.hvp({kname}): the direction for the scalar '{name}' must "
                         f"be a float, not an array of shape {np.shape(v)}.")
    return np.full(1, float(v), dtype)


def hvp_call(k, args, kwargs, argnums, v):
    """``H v`` of ``k`` at ``args`` (``argnums`` an int: ``v`` one direction, the
    result one array or float; a tuple: tuples of both)."""
    single = isinstance(argnums, (int, np.integer))
    nums = (int(argnums),) if single else tuple(int(i) for i in argnums)
    vs = (v,) if single else tuple(v)
    if len(vs) != len(nums):
        raise TypeError(f"kadj.hvp({k.__name__}): argnums={argnums} has {len(nums)} "
                        f"entries but {len(vs)} directions were given; pass v as a tuple "
                        "with one direction per argnums entry.")
    nargs = len(k.arg_names)
    for i in nums:
        if not -nargs <= i < nargs:
            raise IndexError(f"argnums {i} is out of range for {k.__name__}, which takes "
                             f"{nargs} arguments")
    idx = tuple(i % nargs for i in nums)
    if len(set(idx)) != len(idx):
        raise ValueError(f"kadj.hvp({k.__name__}): argnums={argnums} names an argument "
                         "twice.")
    args = k.complete_args(args, kwargs)
    comp = compiled(k, args, idx)
    direction = dict(zip(idx, vs))
    fwd = tuple(a.copy() if i in comp.plan.written else a for i, a in enumerate(args))
    tangents = []
    for i in comp.plan.adjoint_args:
        x = args[i]
        if i in direction:
            tangents.append(_tangent(x, direction[i], k.arg_names[i], k.__name__))
        else:       # an array the function writes: no tangent of its incoming state
            tangents.append(np.zeros_like(x) if isinstance(x, np.ndarray)
                            else np.zeros(1, np.asarray(x).dtype))
    inner = comp.inner
    inner_args = fwd + tuple(tangents)
    iplan = inner.adjoint_plan(*inner_args)
    bufs = [np.zeros_like(inner_args[j]) if isinstance(inner_args[j], np.ndarray)
            else np.zeros(1, np.asarray(inner_args[j]).dtype) for j in iplan.adjoint_args]
    inner.adjoint(*inner_args, *bufs, adj_return=1.0)
    out = []
    for i in idx:
        b = bufs[iplan.adjoint_args.index(i)]
        out.append(b if isinstance(args[i], np.ndarray) else b[0].item())
    return out[0] if single else tuple(out)


class HessianVectorProduct:
    """``kadj.hvp(f, argnums)``: call it as ``(*args, v)``; ``.source(*args)`` shows the
    tangent value function and its adjoint for these arguments."""

    def __init__(self, kernel, argnums):
        self.kernel, self.argnums = kernel, argnums
        self.__name__ = f"hvp({kernel.__name__})"

    def __call__(self, *args, **kwargs):
        if not args:
            raise TypeError(f"kadj.hvp({self.kernel.__name__}) is called as "
                            "(*args, v): the function's arguments, then the direction.")
        return hvp_call(self.kernel, args[:-1], kwargs, self.argnums, args[-1])

    def source(self, *args, **kwargs):
        """The tangent value function's source, then its adjoint's (which computes
        ``H v``), for these example arguments of the function."""
        k = self.kernel
        single = isinstance(self.argnums, (int, np.integer))
        nums = (self.argnums,) if single else tuple(self.argnums)
        args = k.complete_args(args, kwargs)
        idx = tuple(int(i) % len(k.arg_names) for i in nums)
        comp = compiled(k, args, idx)
        zeros = tuple(np.zeros_like(args[i]) if isinstance(args[i], np.ndarray)
                      else np.zeros(1, np.asarray(args[i]).dtype)
                      for i in comp.plan.adjoint_args)
        return comp.source + "\n\n" + comp.inner.adjoint_source(*args, *zeros)


def hvp(f, argnums=0):
    """``kadj.hvp(f, argnums=0)(*args, v)``: the Hessian of the ``@njit`` function ``f``
    (returning a float; decorated with ``@kadj.differentiate`` or not) with respect to
    ``args[argnums]``, times ``v``, exactly (reverse mode over forward mode), for a
    small constant multiple of one gradient's cost.  ``v`` is shaped like that argument
    (a float for a scalar); for a tuple ``argnums``, ``v`` is a tuple with one direction
    per entry and the result a tuple of the blocks' products
    ``sum_j H[i, j] v[j]``.  The arguments are not modified."""
    k = f if isinstance(f, DifferentiatedKernel) else differentiate(f)
    return HessianVectorProduct(k, argnums)
