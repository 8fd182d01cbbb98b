"""Small helpers that generated adjoints call (a tape's growth, trip counts).

``_reserve`` is a numba builtin, written in place at its call.  The jitted ones are
cached by numba on disk where numba can write (beside this file, in
``$NUMBA_CACHE_DIR`` or ``~/.cache/numba``) and compiled in every process otherwise
(:func:`kadj.cachedir.cached_njit`)."""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.imputils import impl_ret_new_ref, lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature
from numba.np.arrayobj import _empty_nd_impl, make_array

from .cachedir import cached_njit


@cached_njit(inline="always")
def _push(tape, sp, value):
    """Push ``value`` on a growable tape; returns the (possibly new) tape and pointer."""
    if sp == tape.shape[0]:
        bigger = np.empty(2 * tape.shape[0], tape.dtype)
        bigger[:sp] = tape[:sp]
        tape = bigger
    tape[sp] = value
    return tape, sp + 1


@cached_njit(inline="always")
def _sign(x):
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


def _reserve(tape, need):
    """The tape itself when it holds ``need`` entries, else a larger copy of it (its
    size doubled until it does).  In compiled code a numba builtin written in place
    (:func:`_reserve_lowered`): a jitted helper would be linked into, optimised and
    compiled to machine code again in every adjoint that grows a tape."""
    if need <= tape.shape[0]:
        return tape
    size = max(tape.shape[0], 1)   # a tape allocated with 0 entries grows too
    while size < need:
        size *= 2
    bigger = np.empty(size, tape.dtype)
    bigger[:tape.shape[0]] = tape
    return bigger


@infer_global(_reserve)
class _ReserveTyping(AbstractTemplate):
    """``_reserve(tape, need)`` of a 1-D C-ordered tape is a tape of its type."""

    def generic(self, args, kws):
        if kws or len(args) != 2:
            return None
        tape, need = args
        if isinstance(tape, types.Array) and tape.ndim == 1 and tape.layout == "C" and \
                isinstance(need, types.Integer):
            return signature(tape, tape, need)
        return None


@lower_builtin(_reserve, types.Array, types.Integer)
def _reserve_lowered(context, builder, sig, args):
    tapety, needty = sig.args
    intp = context.get_value_type(types.intp)
    tape = make_array(tapety)(context, builder, args[0])
    need = context.cast(builder, args[1], needty, types.intp)
    have = tape.nitems
    out = cgutils.alloca_once(builder, context.get_value_type(tapety))
    with builder.if_else(builder.icmp_signed("<=", need, have), likely=True) as (fits, grow):
        with fits:
            context.nrt.incref(builder, tapety, args[0])
            builder.store(args[0], out)
        with grow:
            size = cgutils.alloca_once_value(builder, builder.select(
                builder.icmp_signed(">", have, ir.Constant(intp, 1)), have,
                ir.Constant(intp, 1)))
            head = builder.append_basic_block("reserve.double")
            body = builder.append_basic_block("reserve.body")
            done = builder.append_basic_block("reserve.done")
            builder.branch(head)
            builder.position_at_end(head)
            builder.cbranch(builder.icmp_signed("<", builder.load(size), need), body, done)
            builder.position_at_end(body)
            builder.store(builder.shl(builder.load(size), ir.Constant(intp, 1)), size)
            builder.branch(head)
            builder.position_at_end(done)
            bigger = _empty_nd_impl(context, builder, tapety, [builder.load(size)])
            itemsize = context.get_abi_sizeof(context.get_data_type(tapety.dtype))
            cgutils.raw_memcpy(builder, bigger.data, tape.data, have, itemsize)
            builder.store(bigger._getvalue(), out)
    return impl_ret_new_ref(context, builder, tapety, builder.load(out))


@cached_njit(inline="always")
def _trips(start, stop, step):
    """Number of iterations of range(start, stop, step)."""
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    if step == 0:  # a loop that does not run here (range() refuses a zero step)
        return 0
    return max(0, (start - stop - step - 1) // (-step))
