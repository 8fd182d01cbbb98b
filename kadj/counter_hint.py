"""``_at_least(i, lo)``: the counter ``i`` of a loop that starts at ``lo``, with that
fact handed to LLVM.

numba runs a ``prange`` loop's body in a function that receives the iterations to run
at run time, so LLVM cannot tell that the counter is never below the loop's start.
Every ``a[i - 1]`` then keeps numba's negative-index test (``i - 1 < 0 ? i - 1 + n :
i - 1``), and with it in the body LLVM does not vectorise the loop: a 1-D stencil ran
five to six times slower in parallel on one thread than the same loop serially.
``i = _at_least(i_, 1)`` is ``i_`` with an ``llvm.assume(i_ >= 1)``: the value and the
loop are unchanged, and LLVM drops the tests it can now prove never fire.  (Bounding
the counter by ``max(i_, 1)`` instead gives the same value but hides the counter's
step from LLVM's loop analysis, so the loop still does not vectorise.)

The assumption must hold: :mod:`kadj.parallel` writes it only for the counter of a
``prange`` loop over ``range(lo, hi)`` with a constant ``lo``, which numba's scheduler
never hands a value below ``lo``.  Called from Python (an adjoint's source run as
Python), ``_at_least(i, lo)`` is ``i``.
"""
from __future__ import annotations

from llvmlite import ir as llvm_ir
from numba.core import cgutils, types
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature


def _at_least(i, lo):
    """``i``, a loop counter never below ``lo`` (in compiled code: an LLVM assumption)."""
    return i


@infer_global(_at_least)
class _AtLeastTyping(AbstractTemplate):
    """``_at_least(i, lo)`` of two integers has ``i``'s type."""

    def generic(self, args, kws):
        if kws or len(args) != 2:
            return None
        i, lo = args
        if not isinstance(i, types.Integer) or not isinstance(lo, types.Integer):
            return None
        i = types.unliteral(i)
        return signature(i, i, types.unliteral(lo))


@lower_builtin(_at_least, types.Integer, types.Integer)
def _at_least_lowered(context, builder, sig, args):
    i, lo = args
    lo = context.cast(builder, lo, sig.args[1], sig.args[0])
    compare = builder.icmp_signed if sig.args[0].signed else builder.icmp_unsigned
    holds = compare(">=", i, lo)
    assume = cgutils.get_or_insert_function(
        builder.module, llvm_ir.FunctionType(llvm_ir.VoidType(), [llvm_ir.IntType(1)]),
        "llvm.assume")
    builder.call(assume, [holds])
    return i
