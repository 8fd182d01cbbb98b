"""What an adjoint call expects: the argument layout of one compiled adjoint.

An :class:`AdjointPlan` is computed once per argument-type signature by the
pipeline and is what the runtime (argument checks, :class:`kadj.Tape`,
:func:`kadj.testing.check_grad`) relies on.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdjointPlan:
    """Argument layout of a kernel's adjoint for one signature.

    kernel_name:    the user's function name.
    arg_names:      the forward arguments' names, in order.
    adjoint_args:   indices (into the forward arguments) of the arguments that
                    take an adjoint slot, in argument order: the ``wrt``
                    floating-point inputs plus every written floating-point array.
    written:        indices of array arguments the kernel may write.
    read:           indices of array arguments the kernel may read (before or
                    after writing them; an atomic max/min reads its element).
    returns_value:  True when the kernel returns a float (the adjoint then takes
                    ``adj_return=``).
    forward_raises: True when the kernel has a ``raise`` (or ``assert``) that the
                    generated code leaves out (it differentiates the path without
                    one): ``jvp`` and the transforms of functions then run the
                    forward first, on copies, so that it raises as the kernel does.
    """

    kernel_name: str
    arg_names: tuple
    adjoint_args: tuple
    written: frozenset
    read: frozenset
    returns_value: bool
    forward_raises: bool = False

    def adjoint_names(self):
        return tuple("adj_" + self.arg_names[i] for i in self.adjoint_args)


def _is_float_type(t):
    from numba.core import types
    return isinstance(t, (types.Float, types.Complex)) or (
        isinstance(t, types.Array) and isinstance(t.dtype, (types.Float, types.Complex)))


def build_plan(kernel_name, arg_names, wrt, kernel, arg_types):
    """The :class:`AdjointPlan` of region tree ``kernel`` (:class:`kadj.ir.Kernel`) for
    ``arg_types``; ``wrt`` None means every floating-point argument."""
    from numba.core import types

    from . import ir
    from .errors import DifferentiationError
    stored = ir.stored_arrays(kernel.body)
    # an element an atomic max/min claims is read too: its adjoint compares the
    # contributions with the value the element held before the call
    loaded = ir.loaded_arrays(kernel.body) | {
        s.array.name for s in ir.walk(kernel.body)
        if isinstance(s, ir.Store) and s.accumulate == "claim"}
    slots, written, read = [], set(), set()
    for i, (name, t) in enumerate(zip(arg_names, arg_types)):
        is_arr = isinstance(t, types.Array)
        if is_arr and name in stored:
            written.add(i)
        if is_arr and name in loaded:
            read.add(i)
        if not _is_float_type(t):
            if wrt is not None and name in wrt:
                raise DifferentiationError(
                    f"argument '{name}' has type {t}, which is not floating point",
                    kernel=kernel_name, construct=f"wrt={wrt}",
                    remedy="only float32/float64 arguments can be differentiated")
            continue
        if isinstance(t, types.Array) and t.dtype != t.dtype:
            continue
        if wrt is None or name in wrt or (is_arr and name in stored):
            slots.append(i)
    returns = isinstance(kernel.return_type, types.Float)
    if isinstance(kernel.return_type, types.BaseTuple) and any(
            isinstance(t, (types.Float, types.Complex)) for t in kernel.return_type):
        raise DifferentiationError(
            f"it returns a tuple ({kernel.return_type}); only a single float return "
            "value carries a gradient", kernel=kernel_name, construct="tuple return",
            remedy="return one float (the loss) and write other results into output "
                   "arrays, or return (loss, aux) and use kadj.grad(f, has_aux=True)")
    if isinstance(kernel.return_type, types.Complex):
        raise DifferentiationError("complex return values are not supported yet",
                                   kernel=kernel_name, construct="complex return")
    return AdjointPlan(kernel_name=kernel_name, arg_names=tuple(arg_names),
                       adjoint_args=tuple(slots), written=frozenset(written),
                       read=frozenset(read), returns_value=returns,
                       forward_raises=bool(getattr(kernel, "raises", False)))
