"""``_sum_add(acc, v)``: ``acc + v`` that LLVM may reassociate with the other such sums.

A loop that adds into one scalar (``s += a[i] * b[i]``) is a serial chain of
floating-point additions: without permission to reassociate them, LLVM keeps their
order and cannot vectorise the loop.  ``_sum_add`` is one ``fadd`` carrying only the
``reassoc`` fast-math flag, so LLVM may split such a sum into several partial sums
(vector lanes).  Only the sum is affected: the operands are computed exactly as
written, and no other instruction of the function gets a fast-math flag.  The result
type is that of ``acc + v``; float32 and float64 sums carry the flag, any other
scalar (integer, complex) is a plain addition.  Called from Python (an adjoint's
source run as Python), ``_sum_add`` is ``acc + v``.
"""
from __future__ import annotations

import operator

from numba.core import types
from numba.extending import intrinsic, overload

#: the fast-math flags of the addition
SUM_FLAGS = ("reassoc",)


def _sum_add(acc, v):
    """``acc + v`` (in compiled code: an addition LLVM may reassociate)."""
    return acc + v


@overload(_sum_add)
def _sum_add_compiled(acc, v):
    if isinstance(acc, types.Number) and isinstance(v, types.Number):
        return lambda acc, v: _reassociable_add(acc, v)
    return None


@intrinsic
def _reassociable_add(typingctx, acc, v):
    if not isinstance(acc, types.Number) or not isinstance(v, types.Number):
        return None
    found = typingctx.resolve_function_type(operator.add, (acc, v), {})
    if found is None:
        return None
    rt = found.return_type
    sig = rt(acc, v)

    def codegen(context, builder, signature, args):
        a = context.cast(builder, args[0], acc, rt)
        b = context.cast(builder, args[1], v, rt)
        if isinstance(rt, types.Float):
            return builder.fadd(a, b, flags=SUM_FLAGS)
        return context.get_function(operator.add, rt(rt, rt))(builder, [a, b])
    return sig, codegen
