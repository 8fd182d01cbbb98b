"""CUDA kernels whose threads update their own row of a 2-D array in place (``y[i, j]``,
i from ``cuda.grid(1)``), in the simulator (run by tests/test_cuda_own_rows.py in a
subprocess with NUMBA_ENABLE_CUDASIM=1 set before numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/own_rows_cuda_sim.py softmax_in_place:7 [case ...]

CASES: the in-place family (per-row softmax, in-place normalisation, a recurrence along
the row, a Thomas solve per row: :mod:`kadj.cuda.own_rows`) at rows of 1 and 7
elements (and 200 for the recurrence and the Thomas solve), softmax differentiated
with respect to ``x`` only, a recurrence whose loop every launched thread runs, and
the same computations written without reading back a written argument; each checked
against float64 central differences (:func:`kadj.testing.check_grad_cuda`, on a
launch with more threads than rows).  ``unchanged:<case>`` checks that
``k.adjoint[...]`` changes only the gradient buffers, ``repeated:<case>`` that a
repeated launch reuses its row buffers from :mod:`kadj.buffer_pool` (no new
allocation) and gives the same gradient.  REFUSED: rows other threads
touch, rows of 3-D arrays, a row rewritten in nested loops, rows picked by a
grid-stride loop.  Prints ``CASE <name> OK <detail>`` or ``CASE <name> FAIL <why>``.
"""
import math
import os
import sys

import numpy as np
from numba import cuda

import kadj


@kadj.differentiate
@cuda.jit
def softmax_in_place(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        m = x[i, 0]
        for j in range(1, x.shape[1]):
            m = max(m, x[i, j])
        for j in range(x.shape[1]):
            y[i, j] = math.exp(x[i, j] - m)
        s = 0.0
        for j in range(x.shape[1]):
            s += y[i, j]
        for j in range(x.shape[1]):
            y[i, j] /= s


@kadj.differentiate
@cuda.jit
def normalise_in_place(p):
    i = cuda.grid(1)
    if i < p.shape[0]:
        s = 0.0
        for j in range(p.shape[1]):
            s += p[i, j]
        for j in range(p.shape[1]):
            p[i, j] /= s


@kadj.differentiate
@cuda.jit
def recurrence_in_place(a, r):
    i = cuda.grid(1)
    if i < a.shape[0]:
        for t in range(1, a.shape[1]):
            a[i, t] = math.sin(a[i, t - 1]) * r[i] + a[i, t]


@kadj.differentiate
@cuda.jit
def thomas_in_place(lo, di, up, c, d, x):
    i = cuda.grid(1)
    if i < d.shape[0]:
        n = d.shape[1]
        c[i, 0] = up[i, 0] / di[i, 0]
        d[i, 0] = d[i, 0] / di[i, 0]
        for k in range(1, n):
            den = di[i, k] - lo[i, k] * c[i, k - 1]
            c[i, k] = up[i, k] / den
            d[i, k] = (d[i, k] - lo[i, k] * d[i, k - 1]) / den
        x[i, n - 1] = d[i, n - 1]
        for k in range(n - 2, -1, -1):
            x[i, k] = d[i, k] - c[i, k] * x[i, k + 1]


@kadj.differentiate
@cuda.jit
def neighbour_row(y):
    i = cuda.grid(1)
    if i < y.shape[0] - 1:
        for j in range(y.shape[1]):
            y[i, j] = y[i, j] * y[i + 1, j]


@kadj.differentiate
@cuda.jit
def recurrence_guard_inside(a):
    """Every launched thread runs the loop (threads past the last row store nothing):
    each saves and restores its own part of the buffers."""
    i = cuda.grid(1)
    for t in range(1, a.shape[1]):
        if i < a.shape[0]:
            a[i, t] = math.sin(a[i, t - 1]) + 0.5 * a[i, t]


@kadj.differentiate
@cuda.jit
def row_of_3d(y):
    i = cuda.grid(1)
    if i < y.shape[0]:
        for j in range(1, y.shape[1]):
            y[i, j, 0] = y[i, j - 1, 0] * y[i, j, 0]


@kadj.differentiate
@cuda.jit
def nested_row(y, r):
    i = cuda.grid(1)
    if i < y.shape[0]:
        for t in range(2):
            for j in range(1, y.shape[1]):
                y[i, j] = math.sin(y[i, j - 1]) * r[i]


@kadj.differentiate
@cuda.jit
def grid_stride_row(y):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, y.shape[0], step):
        for j in range(1, y.shape[1]):
            y[i, j] = y[i, j] * y[i, j - 1]


@kadj.differentiate
@cuda.jit
def softmax_recomputed(x, y):
    """Softmax per row, each stage recomputed from x instead of read back from y."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        m = x[i, 0]
        for j in range(1, x.shape[1]):
            m = max(m, x[i, j])
        s = 0.0
        for j in range(x.shape[1]):
            s += math.exp(x[i, j] - m)
        for j in range(x.shape[1]):
            y[i, j] = math.exp(x[i, j] - m) / s


@kadj.differentiate
@cuda.jit
def recurrence_scalar(a, r, out):
    """The recurrence along a row with its running value in a scalar."""
    i = cuda.grid(1)
    if i < a.shape[0]:
        v = a[i, 0]
        out[i, 0] = v
        for t in range(1, a.shape[1]):
            v = math.sin(v) * r[i] + a[i, t]
            out[i, t] = v


def _rows(r, shape=(5, 4)):
    return r.uniform(-1.0, 1.0, shape)


def _thomas(r, n=4):
    shape = (5, n)
    return [_rows(r, shape), _rows(r, shape) + 4.0, _rows(r, shape), np.zeros(shape),
            _rows(r, shape), np.zeros(shape)]


softmax_wrt_x = kadj.differentiate(softmax_in_place.dispatcher, wrt=("x",))

# the in-place family: kernel, example arguments for rows of n elements
FAMILY = {
    "softmax_in_place": (softmax_in_place,
                         lambda r, n: [_rows(r, (5, n)), np.zeros((5, n))]),
    "normalise_in_place": (normalise_in_place, lambda r, n: [_rows(r, (5, n)) + 2.0]),
    "recurrence_in_place": (recurrence_in_place,
                            lambda r, n: [_rows(r, (5, n)), r.uniform(0.5, 1.0, 5)]),
    "thomas_in_place": (thomas_in_place, _thomas),
}

CASES = {
    "softmax_recomputed": (softmax_recomputed, (2, 4),
                           lambda r: [_rows(r), np.zeros((5, 4))]),
    "recurrence_scalar": (recurrence_scalar, (2, 4),
                          lambda r: [_rows(r), r.uniform(0.5, 1.0, 5), np.zeros((5, 4))]),
    "softmax_wrt_x": (softmax_wrt_x, (2, 4),
                      lambda r: [_rows(r, (5, 7)), np.zeros((5, 7))]),
    "recurrence_guard_inside": (recurrence_guard_inside, (2, 4),
                                lambda r: [_rows(r, (5, 7))]),
}
# rows of 1, 7 and 200 elements (200: the two whose loops carry the most state)
for _name, (_k, _make) in FAMILY.items():
    _long = _name in ("recurrence_in_place", "thomas_in_place")
    for _n in (1, 7, 200) if _long else (1, 7):
        CASES[f"{_name}:{_n}"] = (_k, (2, 4), lambda r, m=_make, n=_n: m(r, n))

# kernel, example arguments: refused with their location
REFUSED = {
    "neighbour_row": (neighbour_row, lambda r: [_rows(r)]),
    "row_of_3d": (row_of_3d, lambda r: [_rows(r, (5, 4, 2))]),
    "nested_row": (nested_row, lambda r: [_rows(r), r.uniform(0.5, 1.0, 5)]),
    "grid_stride_row": (grid_stride_row, lambda r: [_rows(r)]),
}


def _unchanged(name):
    """k.adjoint changes the gradient buffers only: the user's arrays keep their
    values."""
    from cudatools import adjoint_keeps_arguments
    k, config, make = CASES[name]
    return adjoint_keeps_arguments(k, config, make(np.random.default_rng(2)))


def _repeated(name):
    """A repeated adjoint launch takes its row buffers from kadj.buffer_pool: the
    second launch allocates nothing (no pool miss, one hit per own-row array) and,
    on blocks the first launch left dirty, gives the same gradient."""
    from kadj import buffer_pool
    k, config, make = CASES[name]
    args = make(np.random.default_rng(2))
    cts = [np.random.default_rng(3).standard_normal(np.shape(a))
           if isinstance(a, np.ndarray) else np.zeros(1) for a in args]
    rows = len(k.adjoint_report(*args)["own_rows"])
    assert rows >= 1, "no own-row buffer"
    grads, counts = [], []
    for _ in range(3):
        adjs = [c.copy() for c in cts]
        before = buffer_pool.stats()
        k.adjoint[config](*args, *adjs)
        after = buffer_pool.stats()
        counts.append((after["misses"] - before["misses"], after["hits"] - before["hits"]))
        grads.append(adjs)
    assert counts[0][0] + counts[0][1] == rows, counts  # the first one takes every buffer
    assert counts[1:] == [(0, rows)] * 2, counts      # the repeats reuse them all
    for again in grads[1:]:
        for a, b in zip(grads[0], again):
            assert np.array_equal(a, b), "a repeated launch gave another gradient"
    return 0.0


def run_case(name):
    from kadj.testing import check_grad_cuda
    if name.startswith("unchanged:"):
        return _unchanged(name.split(":", 1)[1])
    if name.startswith("repeated:"):
        return _repeated(name.split(":", 1)[1])
    k, config, make = CASES[name]
    return check_grad_cuda(k, config, make(np.random.default_rng(0))).max_rel_error


def main(names):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here]
    from cudatools import report_cases
    cases = {n: (lambda n=n: run_case(n))
             for n in list(CASES) + [f"{w}:{c}" for c in CASES
                                     for w in ("unchanged", "repeated")]}
    report_cases(cases, names)


if __name__ == "__main__":
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    main(sys.argv[1:])
