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

It is a numba builtin (a typing template and a lowering), not an ``@overload``: an
overload compiles a small function per argument types in every process and each call
then calls it, while a builtin is typed by one template and lowered in place to the
``fadd`` at each call, which is cheaper to compile in every adjoint that sums.
"""
from __future__ import annotations

import operator

from numba.core import types
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature

#: the fast-math flags of the addition
SUM_FLAGS = ("reassoc",)


def _sum_add(acc, v):
    """``acc + v`` (in compiled code: an addition LLVM may reassociate)."""
    return acc + v


@infer_global(_sum_add)
class _SumAddTyping(AbstractTemplate):
    """``_sum_add(acc, v)`` of two scalars has the type of ``acc + v``."""

    def generic(self, args, kws):
        if kws or len(args) != 2:
            return None
        acc, v = args
        if not isinstance(acc, types.Number) or not isinstance(v, types.Number):
            return None
        found = self.context.resolve_function_type(operator.add, (acc, v), {})
        if found is None:
            return None
        return signature(found.return_type, acc, v)


@lower_builtin(_sum_add, types.Number, types.Number)
def _sum_add_lowered(context, builder, sig, args):
    rt = sig.return_type
    a = context.cast(builder, args[0], sig.args[0], rt)
    b = context.cast(builder, args[1], sig.args[1], rt)
    if isinstance(rt, types.Float):
        return builder.fadd(a, b, flags=SUM_FLAGS)
    return context.get_function(operator.add, rt(rt, rt))(builder, [a, b])
