"""The loss part of a function that returns ``(loss, aux)`` (``kadj.grad(f,
has_aux=True)``).

:func:`kernel` wraps ``f`` in an ``@njit`` function of the same arguments that returns
``f(...)[0]``; kadj inlines ``f`` into it and differentiates the loss, and the
computations that only feed ``aux`` get no adjoint code (the copies that assemble
``aux`` are dropped from its region tree, so an array in ``aux`` is not an alias).
The wrapper is built once per differentiated kernel, with its ``wrt`` and options.
"""
from __future__ import annotations

import dataclasses
import keyword
import weakref

from . import ir, structurize
from .errors import DifferentiationError
from .kernel import DifferentiatedKernel

_WRAPPERS = weakref.WeakKeyDictionary()   # differentiated kernel -> its loss kernel
_CALLEE = "_kadj_has_aux_f"


def kernel(k):
    """The differentiated kernel of ``k``'s loss (the first element of its result)."""
    w = _WRAPPERS.get(k)
    if w is None:
        w = _WRAPPERS[k] = _build(k)
    return w


def _build(k):
    import numba
    if k.target.name != "cpu":
        raise DifferentiationError(
            f"has_aux=True applies to @njit functions, not to {k.target.title} kernels",
            kernel=k.__name__, construct="has_aux=True",
            remedy="write the loss into an output array and use kadj.Tape")
    names = k.arg_names
    if _CALLEE in names or any(keyword.iskeyword(n) for n in names):
        raise DifferentiationError(
            f"an argument of {k.__name__} is called {_CALLEE}", kernel=k.__name__,
            construct="has_aux=True", remedy="rename the argument")
    params = ", ".join(names)
    src = f"def {k.__name__}({params}):\n    return {_CALLEE}({params})[0]\n"
    ns = {_CALLEE: k.dispatcher}
    exec(compile(src, f"<kadj loss of {k.py_func.__qualname__}>", "exec"), ns)
    fn = ns[k.__name__]
    fn.__module__ = k.py_func.__module__
    fn.__qualname__ = f"{k.py_func.__qualname__}.<loss>"
    jit_options = dict(getattr(k.dispatcher, "targetoptions", {}) or {})
    for opt in ("cache", "nopython"):
        jit_options.pop(opt, None)
    jitted = numba.njit(**jit_options)(fn)
    options = {o: v for o, v in k.options.items() if v is not None}
    w = DifferentiatedKernel(jitted, wrt=k.wrt, **options)
    w.target = dataclasses.replace(w.target, structurize=_structurize)
    return w


def _structurize(typed):
    return drop_unread(structurize.structurize(typed))


_PURE = (ir.Copy, ir.Item, ir.Attr)


def drop_unread(kernel):
    """``kernel`` without the copies, items and attributes that nothing reads."""
    body = kernel.body
    while True:
        read = set()
        for s in ir.walk(body):
            read |= ir.stmt_reads(s)
        dead = {s.target for s in ir.walk(body) if isinstance(s, ir.Assign) and
                isinstance(s.expr, _PURE) and s.target not in read}
        if not dead:
            return dataclasses.replace(kernel, body=body)
        body = _without(body, dead)


def _without(stmts, dead):
    out = []
    for s in stmts:
        if isinstance(s, ir.Assign) and s.target in dead and isinstance(s.expr, _PURE):
            continue
        if isinstance(s, ir.If):
            s = dataclasses.replace(s, then=_without(s.then, dead),
                                    orelse=_without(s.orelse, dead))
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            s = dataclasses.replace(s, body=_without(s.body, dead))
        out.append(s)
    return tuple(out)
