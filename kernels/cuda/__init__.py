"""CUDA gallery: realistic ``@cuda.jit`` kernels, each decorated by kadj.

Every module lists :class:`Case` entries in ``CASES``: the differentiated kernel, a
launch configuration ``(griddim, blockdim)`` and ``make_args(rng)`` returning small
example arguments (the CUDA simulator runs every thread as a Python thread, so sizes
stay small: at most 128 threads per launch), and ``sized(rng, n, trips=None)``
returning a launch and arguments at a chosen size (``tests/test_size_sweep_cuda.py``).

- :mod:`.stencils`    heat (1-D guarded, periodic, 2-D), wave leapfrog, upwind
                      advection, Jacobi, red-black SOR in place, 3-D Laplacian,
                      shared-memory tile
- :mod:`.sparse`      CSR SpMV, gathers and scatters through index arrays
- :mod:`.particles`   particle-to-grid deposits (atomics), histograms, grid-to-particle
                      interpolation, pairwise forces
- :mod:`.reductions`  block sums in shared memory, atomic dot products, grid-stride
                      sums, row norms, matrix-vector with a shared vector
- :mod:`.ode`         per-thread Euler / RK2 / RK4 integration, Horner, recurrences,
                      Newton iteration
- :mod:`.misc`        activations, dense layer, math functions (float32 and float64),
                      device helpers, grid-stride loops, early return
- :mod:`.warps`       warp reductions with shuffles: a dot-product loss (shfl_down, one
                      atomic per warp), a per-warp log-sum-exp (shfl_xor max and sum)

The modules import with or without ``NUMBA_ENABLE_CUDASIM=1``.  Gradients are checked
with :func:`kadj.testing.check_grad_cuda` in the simulator
(``tests/cuda_gallery_sim.py``) and every adjoint is compiled to PTX
(``tests/test_cuda_gallery.py``).

Example::

    import numpy as np
    from kernels.cuda import by_name

    case = by_name("heat1d_guarded")
    args = case.make_args(np.random.default_rng(0))
    case.kernel[case.config](*args)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

MODULES = ("stencils", "sparse", "particles", "reductions", "ode", "misc", "warps")


@dataclass(frozen=True)
class Case:
    """One gallery kernel.

    name:       unique name, used as the test id.
    kernel:     the differentiated kernel (``kadj.differentiate`` above ``cuda.jit``).
    config:     ``(griddim, blockdim)`` of the launch.
    make_args:  ``make_args(rng) -> list`` of fresh example arguments, chosen away
                from nondifferentiable points (branch conditions away from ties, cell
                boundaries away from particles, log/sqrt arguments positive).
    rtol:       relative tolerance of the gradient check (float32 kernels use the
                float32 default of :func:`kadj.testing.check_grad_cuda` when None).
    note:       what the kernel exercises.
    sized:      ``sized(rng, n, trips=None) -> (config, args)``: a launch and its
                arguments for about ``n`` elements (threads' worth of work: array
                length, rows, particles, grid cells; about ``n`` pairs for pairwise
                kernels), the grid rounded up so that the last block is partial
                unless ``n`` is a multiple of the block size.  ``trips`` sets the
                trip count of the per-thread loop named by ``trip_loop`` (None: the
                example's).  Sizes below the smallest meaningful one are raised to it.
    trip_loop:  the per-thread loop whose trip count ``sized``'s ``trips`` sets
                (empty: the kernel has none, and ``trips`` must be None).
    trip_plan:  ``((checkpoint slots, (trip counts...)), ...)`` for the size sweep's
                trip checks, when the default plan costs too much in the simulator
                (block-wide barriers in every trip); None: the default plan.
    """

    name: str
    kernel: object
    config: tuple
    make_args: Callable
    rtol: float | None = 1e-6
    note: str = ""
    sized: Callable | None = None
    trip_loop: str = ""
    trip_plan: tuple | None = None


def blocks(n, block):
    """Blocks of ``block`` threads covering ``n`` elements (at least one)."""
    return max(1, -(-int(n) // int(block)))


def launch_1d(n, block=32):
    """``(griddim, blockdim)`` of a 1-D launch over ``n`` elements."""
    return blocks(n, block), block


def launch_2d(nx, ny, block=(8, 4)):
    """``(griddim, blockdim)`` of a 2-D launch: ``nx`` elements along x
    (``cuda.grid(2)[0]``, ``threadIdx.x``), ``ny`` along y."""
    return (blocks(nx, block[0]), blocks(ny, block[1])), tuple(block)


def no_trips(trips, name):
    """Refuse ``trips`` for a kernel without a per-thread loop."""
    if trips is not None:
        raise ValueError(f"CUDA gallery kernel {name!r} has no per-thread loop whose "
                         "trip count sized() could set; pass trips=None")


def load(module):
    """The ``CASES`` of gallery module ``module`` (one of :data:`MODULES`)."""
    import importlib
    if module not in MODULES:
        raise KeyError(f"no CUDA gallery module named {module!r}")
    return importlib.import_module(f"{__name__}.{module}").CASES


def all_cases():
    return [c for m in MODULES for c in load(m)]


def by_name(name):
    for c in all_cases():
        if c.name == name:
            return c
    raise KeyError(f"no CUDA gallery case named {name!r}")


__all__ = ["Case", "MODULES", "all_cases", "blocks", "by_name", "launch_1d",
           "launch_2d", "load", "no_trips"]
