"""Forward mode of a differentiated kernel: ``kernel.jvp(...)`` (a CUDA kernel's:
``kernel.jvp[blocks, threads](...)``) and ``kernel.jvp_source()``.

The tangent function (:mod:`kadj.tangent`) is built on the adjoint's own stages up to
the analysis facts, then the "tangent" stage writes it
(:func:`kadj.pipeline.tangent_stages`); it is
compiled and cached on disk like an adjoint (:mod:`kadj.codegen`), under a key that
differs from the adjoint's.

Call: ``kernel.jvp(*forward_args, *tangents)``; the tangent slots are the adjoint's
(``.adjoint``: the ``wrt`` inputs plus every written floating-point array), in argument
order, also by keyword as ``dot_<name>=``.  The forward runs (arguments change as in a
forward call); each tangent array holds, on entry, the tangent of its argument's state
before the call and, on return, of its state after it.  A scalar's tangent is a
1-element array, read only.  A kernel returning a float returns ``(value, tangent)``.
"""
from __future__ import annotations

import dataclasses

from numba.core.errors import NumbaError

from . import call_cache, codegen, pipeline, rules, validate
from .compiling import compiling
from .errors import DifferentiationError
from .tangent import check_target
from .targets.base import CompiledAdjoint

MODE = "jvp"        # the part of the disk-cache key that tells a tangent from an adjoint


def cache_key(target, req):
    options = dict(req.jit_options)
    options.update((k, v) for k, v in req.options.items() if v is not None)
    options["mode"] = MODE
    return codegen.cache_key(req.py_func, req.arg_types, req.wrt, options, target.name)


def compile(target, req):
    """The compiled tangent function of ``req``: from the disk cache when an entry
    matches, else built (and written to the cache when it may be)."""
    check_target(target, req.name)
    req = dataclasses.replace(req, options={k: None for k in req.options})
    key = cache_key(target, req)
    cached = codegen.load_cached(key)
    if cached is not None:
        pipeline.RUNS["loaded"] += 1
        plan, source, pyfn, _report = cached
        return _jitted(target, plan, source, pyfn, True, req.jit_options)
    out = pipeline.tangent_stages(target, req)
    src, typed = out["tangent"], out["typed"]
    files = codegen.source_files(typed.func_ir)
    pyfn, disk = codegen.build(src, out["plan"], key, files, func_ir=typed.func_ir)
    return _jitted(target, out["plan"], src.source, pyfn, disk, req.jit_options)


def _jitted(target, plan, source, pyfn, disk, jit_options):
    """The compiled tangent: the target's (a device kernel), else numba's njit."""
    if target.compile_tangent is not None:
        return target.compile_tangent(plan, source, pyfn, disk, jit_options)
    return CompiledAdjoint(plan, source, *codegen.jit(pyfn, disk, jit_options))


# ---- the kernel object's side ---------------------------------------------------------
class _TangentPlan:
    """The adjoint plan seen with the tangents' names (``dot_<name>``), for the buffer
    checks of :mod:`kadj.validate`."""

    def __init__(self, plan):
        self._plan = plan
        self.arg_names, self.written = plan.arg_names, plan.written
        self.adjoint_args = plan.adjoint_args

    def adjoint_names(self):
        return tuple("dot_" + self.arg_names[i] for i in self.adjoint_args)


def compiled(kernel, fwd):
    """The compiled tangent function of ``kernel`` for the forward arguments ``fwd``,
    kept on the kernel per argument types (rebuilt when the rule table changes)."""
    check_target(kernel.target, kernel.__name__)
    arg_types = kernel._arg_types(fwd)
    cache = kernel.__dict__.setdefault("_jvp_cache", {})
    key = (rules.generation(), arg_types)
    hit = cache.get(key)
    if hit is None:
        hit = compile(kernel.target, kernel.request(arg_types))
        cache[key] = hit
    kernel._jvp_last = hit
    return hit


def split_call(call, kernel, args, kwargs, device=False):
    """(compiled tangent, forward arguments, tangents in slot order) of
    ``kernel.jvp(...)`` (``device``: a launch, whose arrays may be device arrays)."""
    names = kernel.arg_names
    defaults = kernel.py_func.__defaults__ or ()
    fwd, positional, dot_kw = validate.split_adjoint_call(call, names, defaults, args,
                                                          kwargs, slot="tangent")
    try:
        comp = compiled(kernel, fwd)
    except (NumbaError, DifferentiationError) as exc:
        validate.blame_omitted_default(call, names, defaults, args, kwargs, exc,
                                       "tangent")
        clear = validate.explain_failure(call, names, fwd, exc) \
            if isinstance(exc, NumbaError) else None
        if clear is not None:
            raise clear from exc
        raise
    plan = _TangentPlan(comp.plan)
    expected = plan.adjoint_names()
    try:
        tangents = _order_tangents(call, expected, positional, dot_kw)
    except TypeError as exc:
        validate.blame_omitted_default(call, names, defaults, args, kwargs, exc,
                                       "tangent")
        raise
    if dot_kw:
        raise TypeError(f"{call}: {tuple(dot_kw)} are not tangent slots (given twice, or "
                        f"not a differentiated floating-point argument); the tangents are "
                        f"{expected}.")
    validate.check_adjoint_call(call, plan, fwd, tangents, host=not device,
                                slot="tangent")
    if device:
        validate.check_transferable(call, names + expected, tuple(fwd) + tangents)
    return comp, fwd, tangents


def _order_tangents(call, expected, positional, dot_kw):
    """The tangents in slot order, from positional ones and ``dot_<name>=`` (popped)."""
    if len(positional) > len(expected):
        raise TypeError(f"{call} expects {len(expected)} tangent argument(s) {expected} "
                        f"after the forward arguments, got {len(positional)}.")
    tangents = list(positional)
    for name in expected[len(positional):]:
        if name not in dot_kw:
            raise TypeError(f"{call} is missing tangent argument(s) "
                            f"{expected[len(positional):]}; it expects {expected}.")
        tangents.append(dot_kw.pop(name))
    return tuple(tangents)


def run(kernel, args, kwargs, config=None):
    """``kernel.jvp(*args, **kwargs)``, or the launch ``kernel.jvp[config](...)`` of a
    device kernel (which returns nothing)."""
    from . import tape as _tape
    call = f"{kernel.__name__}.jvp"
    if _tape.active() is not None:
        raise DifferentiationError(
            f"{call} ran while a kadj.Tape records; forward mode needs no tape, and a "
            "forward the tape does not see would make its gradient wrong",
            kernel=kernel.__name__, construct="jvp inside a Tape",
            remedy="call jvp outside the `with kadj.Tape()` block")
    if config is None and not kwargs:
        # a repeated host call of a checked signature tests only what the values
        # decide (kadj.call_cache: the layout is the adjoint's, tangents for adjoints)
        gen, calls = kernel.__dict__.get("_jvp_calls", (None, None))
        if gen != rules.generation():       # the rule table changed: check afresh
            calls = {}
            kernel._jvp_calls = (rules.generation(), calls)
        key = call_cache.signature(args)
        facts = calls.get(key) if key is not None else None
        if facts is not None and facts.accepts(args):
            kernel._jvp_last = facts.comp
            kernel.raise_as_forward(facts.comp.plan, args[:len(kernel.arg_names)])
            return _result(facts.comp, facts.comp.function(*args))
    comp, fwd, tangents = split_call(call, kernel, args, kwargs,
                                     device=config is not None)
    if config is not None:
        comp.launch(config, *fwd, *tangents)
        return None
    if not kwargs and key is not None and len(args) == len(fwd) + len(tangents) and \
            all(a is b for a, b in zip(args, tuple(fwd) + tangents)):
        call_cache.remember(calls, key, comp, args)
    kernel.raise_as_forward(comp.plan, fwd)
    with compiling():   # (a first call compiles)
        return _result(comp, comp.function(*fwd, *tangents))


def _result(comp, result):
    if comp.plan.returns_value:
        value, tangent = result
        return value, tangent
    return result


def source(kernel, example_args):
    """The tangent function's source for these arguments (or the last one built)."""
    if example_args:
        return compiled(kernel, kernel.complete_args(example_args)).source
    last = getattr(kernel, "_jvp_last", None)
    if last is None:
        raise DifferentiationError(
            "jvp_source() needs example arguments until the tangent function has been "
            "compiled once", kernel=kernel.__name__,
            remedy=f"call {kernel.__name__}.jvp_source(*args) with example arguments")
    return last.source

