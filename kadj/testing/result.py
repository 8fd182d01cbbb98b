"""The record a gradient check returns: what was compared, and how close the
adjoint came to finite differences."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GradCheckResult:
    """What :func:`check_grad` compared, and how close the adjoint came.

    inputs / outputs:     names of the checked inputs and of the outputs
                          (``"return"`` for a return value), in flattening order.
    precision:            ``"float64"`` or ``"float32"``, which chose the defaults.
    eps:                  the relative step (see the package docstring).
    directional_fd:       ``<ct, J d>`` from central differences (per unit step),
                          summed over the directions of every argument.
    directional_adjoint:  ``<adjoint(ct), d>`` (per unit step), summed likewise.
    jacobian_checked:     whether full Jacobian columns were compared too.
    max_abs_error:        largest absolute mismatch over every comparison made.
    max_rel_error:        largest mismatch relative to the reference magnitude.
    """

    kernel_name: str
    inputs: tuple
    outputs: tuple
    precision: str
    eps: float
    rtol: float
    atol: float
    directional_fd: float
    directional_adjoint: float
    jacobian_checked: bool
    max_abs_error: float
    max_rel_error: float
