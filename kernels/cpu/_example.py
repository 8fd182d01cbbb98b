"""The gallery's record type."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple


@dataclass(frozen=True)
class Example:
    """One gallery entry.

    name:       unique name, used as the test id.
    kernel:     the plain ``@njit`` kernel (not decorated by kadj).
    make_args:  ``make_args(rng) -> tuple`` of small example arguments (arrays
                of 5..40 elements per axis) chosen away from nondifferentiable
                points: branch conditions away from ties, log/sqrt arguments
                positive.  Returns fresh arrays on every call.
    wrt:        ``wrt=`` for :func:`kadj.differentiate` (None: every float arg).
    tags:       free-form labels: ``"float32"``, ``"returns"`` (returns a float),
                ``"parallel"``, ``"2d"``, ``"3d"``, ``"branch"``, ...
    sized:      ``sized(rng, n) -> tuple``: the same kind of arguments for a problem
                of size ``n`` along the kernel's main loop, kept away from
                nondifferentiable points at every size: ``n`` elements of a 1-D array,
                rows, systems, samples or edges; about ``n`` cells of a 2-D or 3-D grid
                (axes unequal, each near ``n ** (1/d)``); about ``n`` pairs for
                pairwise kernels.  Sizes below the kernel's smallest meaningful one
                are raised to it.  None when size is not meaningful.
    """

    name: str
    kernel: Callable
    make_args: Callable
    wrt: Optional[Tuple[str, ...]] = None
    tags: Tuple[str, ...] = ()
    sized: Optional[Callable] = None
