"""CUDA red-black (checkerboard) sweeps that update one colour of a grid in place
(:mod:`kadj.cuda.parity`), in the simulator (run by tests/test_cuda_checkerboard.py in
a subprocess with NUMBA_ENABLE_CUDASIM=1 set before numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/checkerboard_cuda_sim.py sor_2d:0 [case ...]

CASES: an SOR sweep of a 2-D Poisson problem (``(i + j) % 2 == color``), a 1-D
Gauss-Seidel half sweep left by early returns (``(i + color) & 1``), one that only
writes its own element, a 3-D Jacobi-free
sweep (``(i + j + k + color) % 2 == 0``) and a grid-stride 1-D sweep (``i % 2 == 1 -
color``), each for both colours, against float64 central differences
(:func:`kadj.testing.check_grad_cuda`) on launches with more threads than points and
at larger grids along random directions.  ``sweeps`` records eight alternating
half sweeps on a :class:`kadj.Tape` and checks ``tape.grad`` of the initial grid
against central differences of the whole sequence;
``jvp:<case>`` checks the forward mode against the same differences;
``unchanged:<case>`` checks that ``k.adjoint[...]`` changes only the gradient buffers.
REFUSED: reads that the parity does not keep apart from the writes.  Prints ``CASE
<name> OK <detail>`` or ``CASE <name> FAIL <why>``.
"""
import os
import sys

import numpy as np
from numba import cuda

import kadj


@kadj.differentiate
@cuda.jit
def sor_2d(u, f, w, color):
    i, j = cuda.grid(2)
    n, m = u.shape
    if 0 < i < n - 1 and 0 < j < m - 1:
        if (i + j) % 2 == color:
            u[i, j] = (1.0 - w) * u[i, j] + 0.25 * w * (
                u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - f[i, j])


@kadj.differentiate
@cuda.jit
def gauss_seidel_1d(u, f, color):
    i = cuda.grid(1)
    if i < 1 or i >= u.shape[0] - 1:
        return
    if (i + color) & 1:
        return
    u[i] = 0.5 * (u[i - 1] + u[i + 1] - f[i] * u[i] * u[i])


@kadj.differentiate
@cuda.jit
def half_sweep_1d(u, f, color):
    # the own element only written: its old value is never read
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1 and (i + color) % 2 == 0:
        u[i] = 0.5 * (u[i - 1] + u[i + 1] - f[i])


@kadj.differentiate
@cuda.jit
def sor_3d(u, rhs, h2, w, color):
    i, j, k = cuda.grid(3)
    if i >= 1 and j >= 1 and k >= 1 and i < u.shape[0] - 1 and \
            j < u.shape[1] - 1 and k < u.shape[2] - 1:
        red = (i + j + k + color) % 2 == 0
        if red:
            s = (u[i - 1, j, k] + u[i + 1, j, k] + u[i, j - 1, k] + u[i, j + 1, k] +
                 u[i, j, k - 1] + u[i, j, k + 1])
            old = u[i, j, k]
            u[i, j, k] = old + w * ((s - h2 * rhs[i, j, k]) / 6.0 - old)


@kadj.differentiate
@cuda.jit
def strided_1d(u, c, color):
    start = cuda.grid(1)
    for i in range(start, u.shape[0], cuda.gridsize(1)):
        if i % 2 == 1 - color and 0 < i < u.shape[0] - 1:
            u[i] = u[i] + c[i] * (u[i - 1] - 2.0 * u[i] + u[i + 1])


# refused: reads that the parity does not keep apart from the writes
@kadj.differentiate
@cuda.jit
def reads_same_colour(u, color):
    i, j = cuda.grid(2)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1:
        if (i + j) % 2 == color:
            u[i, j] = 0.5 * (u[i - 1, j - 1] + u[i + 1, j + 1])


@kadj.differentiate
@cuda.jit
def reads_two_away(u, color):
    i = cuda.grid(1)
    if 1 < i < u.shape[0] - 2 and i % 2 == color:
        u[i] = 0.5 * (u[i - 2] + u[i + 2])


@kadj.differentiate
@cuda.jit
def colour_not_equal(u, color):
    # colour 5 would make every thread write: != says nothing about the parity
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1 and i % 2 != color:
        u[i] = 0.5 * (u[i - 1] + u[i + 1])


@kadj.differentiate
@cuda.jit
def colour_from_array(u, colours):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1 and i % 2 == colours[0]:
        u[i] = 0.5 * (u[i - 1] + u[i + 1])


@kadj.differentiate
@cuda.jit
def read_before_the_test(u, color):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        left = u[i - 1]
        if i % 2 == color:
            u[i] = 0.5 * (left + u[i + 1])


def _grid(r, shape):
    return r.uniform(0.5, 1.5, shape)


def _sor_2d(r, shape=(9, 7)):
    return [_grid(r, shape), r.standard_normal(shape), 1.4]


def _gs_1d(r, n=13):
    return [_grid(r, n), r.uniform(0.0, 0.2, n)]


def _sor_3d(r, shape=(5, 6, 5)):
    return [_grid(r, shape), r.standard_normal(shape), 0.1, 1.2]


def _strided(r, n=23):
    return [_grid(r, n), r.uniform(0.0, 0.4, n)]


def _blocks(shape, block):
    return tuple(-(-n // b) for n, b in zip(shape, block))


KERNELS = {      # kernel, arguments (without the colour), launch
    "sor_2d": (sor_2d, _sor_2d, lambda a: (_blocks(a[0].shape, (4, 4)), (4, 4))),
    "gauss_seidel_1d": (gauss_seidel_1d, _gs_1d, lambda a: (2, 8)),
    "half_sweep_1d": (half_sweep_1d, _gs_1d, lambda a: (2, 8)),
    "sor_3d": (sor_3d, _sor_3d, lambda a: (_blocks(a[0].shape, (2, 4, 2)), (2, 4, 2))),
    "strided_1d": (strided_1d, _strided, lambda a: (2, 4)),    # fewer threads than points
}
LARGE = {        # along random directions
    "sor_2d": lambda r: _sor_2d(r, (40, 33)),
    "gauss_seidel_1d": lambda r: _gs_1d(r, 301),
}

CASES = {}
for _name, (_k, _make, _launch) in KERNELS.items():
    for _c in (0, 1):
        CASES[f"{_name}:{_c}"] = (_k, _make, _launch, _c)
for _name, _make in LARGE.items():
    _k, _, _launch = KERNELS[_name]
    CASES[f"{_name}:large"] = (_k, _make, _launch, 1)

REFUSED = {
    "reads_same_colour": (reads_same_colour, lambda r: [_grid(r, (6, 6)), 0]),
    "reads_two_away": (reads_two_away, lambda r: [_grid(r, 12), 0]),
    "colour_not_equal": (colour_not_equal, lambda r: [_grid(r, 12), 0]),
    "colour_from_array": (colour_from_array,
                          lambda r: [_grid(r, 12), np.zeros(1, dtype=np.int64)]),
    "read_before_the_test": (read_before_the_test, lambda r: [_grid(r, 12), 1]),
}


def _args(name, seed):
    k, make, launch, color = CASES[name]
    args = make(np.random.default_rng(seed)) + [color]
    return k, launch(args), args


def _gradient(name):
    from kadj.testing import check_grad_cuda
    k, config, args = _args(name, 0)
    return check_grad_cuda(k, config, args).max_rel_error


def _unchanged(name):
    """k.adjoint changes the gradient buffers only."""
    from cudatools import adjoint_keeps_arguments
    k, config, args = _args(name, 2)
    return adjoint_keeps_arguments(k, config, args)


def _run(k, config, args):
    from cudatools import launched_on_copies
    return launched_on_copies(k, config, args)


def _jvp(name):
    """k.jvp against central differences of the launch, along a random direction."""
    k, config, args = _args(name, 4)
    r = np.random.default_rng(5)
    dirs = [r.standard_normal(np.shape(a)) if isinstance(a, np.ndarray)
            else (r.standard_normal(1) if isinstance(a, float) else None) for a in args]
    tangents = [d.copy() for d in dirs if d is not None]
    moved = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    k.jvp[config](*moved, *tangents)
    h = 1e-6

    def at(s):
        return [a + s * d if d is not None and isinstance(a, np.ndarray) else
                (a + s * float(d[0]) if d is not None else a) for a, d in zip(args, dirs)]
    plus, minus = _run(k, config, at(h)), _run(k, config, at(-h))
    fd = (plus[0] - minus[0]) / (2 * h)
    assert np.array_equal(moved[0], _run(k, config, args)[0]), "jvp's forward differs"
    err = np.abs(tangents[0] - fd).max() / np.abs(fd).max()
    assert err < 1e-6, f"jvp differs from central differences by {err:.2e}"
    return err


def _sweeps(_=None):
    """Eight alternating half sweeps on a Tape: tape.grad of the initial grid against
    central differences of the whole sequence."""
    r = np.random.default_rng(6)
    u0, f, w = _sor_2d(r, (12, 10))
    target = r.standard_normal(u0.shape)
    config = (_blocks(u0.shape, (4, 4)), (4, 4))

    def loss(u0, w):
        u = u0.copy()
        for s in range(8):
            sor_2d[config](u, f, w, s % 2)
        return float(np.sum(u * target))

    u = u0.copy()
    with kadj.Tape() as tape:
        for s in range(8):
            sor_2d[config](u, f, w, s % 2)
    tape.backward(seeds=[(u, target)])
    g_u0 = np.asarray(tape.grad(u))     # u's contents before the first launch: u0
    d = r.standard_normal(u0.shape)
    h = 1e-6
    fd = (loss(u0 + h * d, w) - loss(u0 - h * d, w)) / (2 * h)
    ad = float(np.sum(g_u0 * d))
    err = abs(ad - fd) / abs(fd)
    assert err < 1e-6, f"<grad u0, d> = {ad} but central differences give {fd}"
    return err


def main(names):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here]
    from cudatools import report_cases
    cases = {n: (lambda n=n: _gradient(n)) for n in CASES}
    for n in KERNELS:
        cases[f"jvp:{n}:1"] = lambda n=n: _jvp(f"{n}:1")
        cases[f"unchanged:{n}:0"] = lambda n=n: _unchanged(f"{n}:0")
    cases["sweeps"] = _sweeps
    report_cases(cases, names)


if __name__ == "__main__":
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    main(sys.argv[1:])
