"""CPU gallery: realistic ``@njit`` kernels with small example arguments.

``GALLERY`` lists :class:`Example` entries; each holds the plain kernel (not
decorated by kadj) and ``make_args(rng)``.  The kernels are grouped by theme:

- :mod:`.stencils`     heat, Laplacians (2-D, 3-D), advection, Burgers, waves
- :mod:`.recurrences`  filters, prefix sums, Horner, RK4, Newton, while loops
- :mod:`.sparse`       CSR products, gathers and scatters through index arrays
- :mod:`.reductions`   dot, norms, softmax, logsumexp, losses returning a float
- :mod:`.physics`      N-body, Lennard-Jones, springs, Verlet, bond angles
- :mod:`.misc`         NN layers, clipping, in-place updates, tuples, break,
                       continue, early return, ``prange``
- :mod:`.exits`        loops left by several breaks, input checks (assert, raise)
- :mod:`.arrays`       whole-array NumPy: slices, element-wise expressions, reductions

Example::

    import numpy as np, kadj
    from kernels.cpu import GALLERY, by_name

    ex = by_name("heat_step")
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    args = ex.make_args(np.random.default_rng(0))
    k(*args)
"""
from __future__ import annotations

from . import arrays, exits, misc, physics, recurrences, reductions, scratch, sparse, stencils
from ._example import Example

GALLERY = [
    *stencils.EXAMPLES,
    *recurrences.EXAMPLES,
    *sparse.EXAMPLES,
    *reductions.EXAMPLES,
    *physics.EXAMPLES,
    *misc.EXAMPLES,
    *exits.EXAMPLES,
    *scratch.EXAMPLES,
    *arrays.EXAMPLES,
]


def by_name(name):
    """The gallery entry called ``name``."""
    for ex in GALLERY:
        if ex.name == name:
            return ex
    raise KeyError(f"no gallery example named {name!r}")


__all__ = ["Example", "GALLERY", "by_name"]
