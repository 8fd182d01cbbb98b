"""Operations the kernel wrote as several that kadj differentiates as one.

``x * math.sqrt(x)`` (``r2 * math.sqrt(r2)``: the ``|r|**3`` of gravity and Coulomb
kernels) is ``x ** 1.5``, whose derivative ``1.5 * sqrt(x)`` is finite everywhere on
``x >= 0``.  Differentiated as a product and a square root, its adjoint computes
``g * sqrt(x)``, ``g * x`` and then ``(g * x) / (2 * sqrt(x))`` behind a strong-zero
test: two multiplications, a division and a test more per evaluation, and ``0 / 0`` at
``x = 0`` that only the test keeps out.  :func:`rewrite` (a CPU kernel's preparation)
replaces such a product by :func:`x_sqrt_x`, which computes exactly what the kernel
wrote (the same multiplication of the same square root) and whose rule
(:mod:`kadj.rules`) is ``g * (1.5 * sqrt(x))``.  The square root's own assignment stays;
when nothing else reads it, it is no longer computed.

It applies where the square root is assigned earlier in the same statement sequence as
the product, from the product's other operand, and nothing in between assigns either
(so the square root is that of the value multiplied), all three of one float type.
"""
from __future__ import annotations

import math
import operator
from dataclasses import replace

import numpy as np
from numba.core import types
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature

from . import ir

__all__ = ["rewrite"]

_SQRT = (math.sqrt, np.sqrt)


def x_sqrt_x(x):
    """``x * math.sqrt(x)``: ``x ** 1.5`` computed as written."""
    return x * math.sqrt(x)


@infer_global(x_sqrt_x)
class _XSqrtXTyping(AbstractTemplate):
    def generic(self, args, kws):
        if kws or len(args) != 1 or not isinstance(args[0], types.Float):
            return None
        return signature(args[0], args[0])


@lower_builtin(x_sqrt_x, types.Float)
def x_sqrt_x_lowered(context, builder, sig, args):
    root = context.get_function(math.sqrt, sig)(builder, args)
    return builder.fmul(args[0], root)


def rewrite(kernel):
    """``kernel`` with each qualifying ``x * sqrt(x)`` written as :func:`x_sqrt_x`
    (itself if none)."""
    T = kernel.types
    changed = [False]

    def seq(stmts):
        out = []
        for k, s in enumerate(stmts):
            s = ir.map_nested(s, seq)
            fused = _fused(stmts, k, s, T)
            if fused is not None:
                s, changed[0] = fused, True
            out.append(s)
        return out

    body = seq(kernel.body)
    return replace(kernel, body=type(kernel.body)(body)) if changed[0] else kernel


def _fused(stmts, k, s, T):
    """The fused form of statement ``k`` of ``stmts`` (``s``), or None."""
    if not (isinstance(s, ir.Assign) and isinstance(s.expr, ir.Op) and
            s.expr.fn is operator.mul and len(s.expr.args) == 2 and not s.expr.kws and
            all(isinstance(a, ir.Var) for a in s.expr.args)):
        return None
    a, b = (v.name for v in s.expr.args)
    t = T.get(s.target)
    if a == b or not isinstance(t, types.Float) or T.get(a) != t or T.get(b) != t:
        return None
    for j in range(k - 1, -1, -1):
        d = stmts[j]
        if isinstance(d, ir.Assign) and d.target in (a, b):
            e = d.expr
            if isinstance(e, ir.Op) and e.fn in _SQRT and len(e.args) == 1 and \
                    not e.kws and isinstance(e.args[0], ir.Var) and \
                    e.args[0].name == ({a, b} - {d.target}).pop():
                x = e.args[0].name
                return ir.Assign(s.target, ir.Op(x_sqrt_x, (ir.Var(x),)), s.loc)
            return None
        if {a, b} & ir.assigned([d]):
            return None
    return None
