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
                    after writing them).
    returns_value:  True when the kernel returns a float (the adjoint then takes
                    ``adj_return=``).
    """

    kernel_name: str
    arg_names: tuple
    adjoint_args: tuple
    written: frozenset
    read: frozenset
    returns_value: bool

    def adjoint_names(self):
        return tuple("adj_" + self.arg_names[i] for i in self.adjoint_args)
