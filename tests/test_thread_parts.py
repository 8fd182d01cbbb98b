"""Parallel reversed loops whose iterations add into shared elements (kadj.thread_parts):
gathers through index arrays, row loops reading a shared vector, a scatter-form stencil.
The iterations run in parts, one per thread, each adding into a copy of its own.
Gradients against float64 finite differences and against the serial adjoint
(parallel=False), to rounding (the same sums in another order); the parts' arithmetic
checked for 1 to 7 parts at sizes 0 to 23 by running the adjoint's source as Python."""
import math
import re

import numba
import numpy as np
import pytest
from numba import njit, prange

import kadj
from fdcheck import fd_check
from kadj import call_memory
from kadj.parallel import is_parallel_source
from kadj.thread_parts import PART_BYTES, _thread_parts

rng = np.random.default_rng(11)


@njit(parallel=True)
def p_gather(x, idx, out):
    for i in prange(idx.shape[0]):
        out[i] = 2.0 * x[idx[i]] ** 2


@njit(parallel=True)
def p_matvec(a, x, y):
    for i in prange(a.shape[0]):
        s = 0.0
        for j in range(a.shape[1]):
            s += a[i, j] * x[j]
        y[i] = math.tanh(s)


@njit(parallel=True)
def p_table_rows(w, idx, v, out, c):
    # rows of a table picked by an index array: adj_w[idx[i], j] (rank 2) and adj_v[j]
    # shared, adj_c a sum over the threads
    for i in prange(idx.shape[0]):
        s = 0.0
        for j in range(v.shape[0]):
            s += w[idx[i], j] * v[j]
        out[i] = s + c * w[idx[i], 0]


@njit(parallel=True)
def p_stencil(u, out, alpha):
    for i in prange(1, u.shape[0] - 1):
        out[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@njit(parallel=True)
def p_horner(coeffs, x, y):
    # a replayed loop (the recurrence's values on a tape) whose iterations add into
    # every adj_coeffs[j]: in parts, each part's iterations four side by side
    k = coeffs.shape[0]
    for i in prange(x.shape[0]):
        xi = x[i]
        p = coeffs[k - 1]
        for j in range(k - 2, -1, -1):
            p = p * xi + coeffs[j]
        y[i] = p


@njit
def histogram(x, bins, h, a):
    for i in range(x.shape[0]):
        h[bins[i]] += a * x[i]


@njit
def decaying_histogram(x, bins, h, a):
    for i in range(x.shape[0]):
        h[bins[i]] = a * h[bins[i]] + x[i]


@njit
def scatter(x, idx, out):
    for i in range(x.shape[0]):
        out[idx[i]] = math.sin(x[i])


def _gather_args(n=300, m=41):
    return (rng.standard_normal(m), rng.integers(0, m, n), np.zeros(n))


def _matvec_args(rows=37, cols=53):
    return (rng.standard_normal((rows, cols)), rng.standard_normal(cols) * 0.3,
            np.zeros(rows))


def _table_args(n=120, rows=9, cols=13):
    return (rng.standard_normal((rows, cols)) * 0.5, rng.integers(0, rows, n),
            rng.standard_normal(cols), np.zeros(n), 0.7)


def _stencil_args(n=203):
    return (rng.standard_normal(n), np.zeros(n), 0.3)


def _horner_args(n=103, k=7):
    return (rng.standard_normal(k) * 0.5, rng.uniform(-1.0, 1.0, n), np.zeros(n))


CASES = [
    pytest.param(p_gather, _gather_args, {}, ["adj_x"], id="index_gather"),
    pytest.param(p_matvec, _matvec_args, {}, ["adj_x"], id="matvec_rows"),
    pytest.param(p_table_rows, _table_args, {}, ["adj_w", "adj_v"], id="table_rows"),
    pytest.param(p_stencil, _stencil_args, {"gather": False}, ["adj_u"],
                 id="scatter_stencil"),
    pytest.param(p_horner, _horner_args, {}, ["adj_coeffs"], id="replayed_horner"),
]


def _adjoints(k, args, seed=1):
    """Adjoint buffers after one call, from the same random cotangents every time."""
    plan = k.adjoint_plan(*args)
    r = np.random.default_rng(seed)
    bufs = [_cotangent(r, args[i]) if isinstance(args[i], np.ndarray)
            else np.zeros(1) for i in plan.adjoint_args]
    k.adjoint(*[a.copy() if isinstance(a, np.ndarray) else a for a in args], *bufs)
    return bufs


def _cotangent(r, a):
    c = r.standard_normal(a.shape)
    if np.iscomplexobj(a):
        c = c + 1j * r.standard_normal(a.shape)
    return c.astype(a.dtype)


@pytest.fixture
def threads():
    before = numba.get_num_threads()
    yield
    numba.set_num_threads(before)


@pytest.mark.parametrize("kernel, make, opts, shared", CASES)
def test_shared_sums_run_in_parts(kernel, make, opts, shared, threads):
    args = make()
    par = kadj.differentiate(kernel, **opts)
    ser = kadj.differentiate(kernel, **opts, parallel=False)
    src = par.adjoint_source(*args)
    assert is_parallel_source(src) and "_thread_parts(" in src, src
    for name in shared:
        assert f"{name}_part" in src and f"_copies_{name}" in src, src
    assert "_thread_parts(" not in ser.adjoint_source(*args)
    if kernel is p_horner:      # each part's iterations side by side
        assert "side by side" in src.split("def ")[1], src
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    reference = _adjoints(ser, args)
    for count in (1, numba.config.NUMBA_NUM_THREADS):
        # (one part: the serial loop's sums, in forward order where the serial
        # loop's replayed iterations run backwards)
        numba.set_num_threads(count)
        first = _adjoints(par, args)
        for a, b in zip(first, reference):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    # a second call reuses the parts' copies (kept memory): they start from zero again
    for a, b in zip(_adjoints(par, args), first):
        np.testing.assert_array_equal(a, b)


def _source_function(k, args):
    """``k``'s adjoint for ``args``'s types from its source run as Python
    (numba.prange as range, the row functions compiled)."""
    src = k.adjoint_source(*args)
    ns = {}
    exec(compile(src, f"<adjoint of {k.__name__}>", "exec"), ns)
    return ns[re.findall(r"^def (\w+)\(", src, re.M)[-1]]


@pytest.mark.parametrize("kernel, make, sizes", [
    (p_gather, lambda n: _gather_args(n, 5), range(0, 24)),
    (p_matvec, lambda n: _matvec_args(n, 6), range(0, 12)),
    (p_table_rows, lambda n: _table_args(n, 4, 3), range(0, 12)),
    (p_stencil, lambda n: _stencil_args(n), range(0, 14)),
    (p_horner, lambda n: _horner_args(n, 4), range(0, 24)),
])
def test_every_iteration_in_exactly_one_part(kernel, make, sizes, monkeypatch):
    """1 to 7 parts (more than this machine's threads: numba.get_num_threads patched
    while the source runs as Python) at every size from 0: the same gradient as the
    serial adjoint, also where there are more parts than iterations."""
    opts = {"gather": False} if kernel is p_stencil else {}
    par = kadj.differentiate(kernel, **opts)
    ser = kadj.differentiate(kernel, **opts, parallel=False)
    fn = None
    for n in sizes:
        args = make(n)
        fn = fn or _source_function(par, args)
        reference = _adjoints(ser, args)
        plan = par.adjoint_plan(*args)
        for parts in range(1, 8):
            r = np.random.default_rng(1)
            bufs = [r.standard_normal(args[i].shape) if isinstance(args[i], np.ndarray)
                    else np.zeros(1) for i in plan.adjoint_args]
            monkeypatch.setattr(numba, "get_num_threads", lambda: parts)
            fn(*[a.copy() if isinstance(a, np.ndarray) else a for a in args], *bufs,
               *call_memory.fresh_for(fn))
            monkeypatch.undo()
            for a, b in zip(bufs, reference):
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12,
                                           err_msg=f"n={n}, {parts} parts")


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-5), (np.complex128, 1e-12)])
def test_float32_and_complex_copies_keep_their_dtype(dtype, rtol, threads):
    x = rng.standard_normal(29) + (1j * rng.standard_normal(29) if dtype is np.complex128
                                   else 0)
    args = (x.astype(dtype), rng.integers(0, 29, 500), np.zeros(500, dtype))
    par = kadj.differentiate(p_gather)
    ser = kadj.differentiate(p_gather, parallel=False)
    assert "_thread_parts(" in par.adjoint_source(*args)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    got, want = _adjoints(par, args), _adjoints(ser, args)
    assert got[0].dtype == dtype
    np.testing.assert_allclose(got[0], want[0], rtol=rtol, atol=rtol)
    assert np.abs(want[0]).max() > 1.0       # (not all zeros)


def test_the_number_of_parts(monkeypatch):
    monkeypatch.setattr(numba, "get_num_threads", lambda: 16)  # (Python: the interpreted helper)
    assert _thread_parts(100, 8) == 16
    assert _thread_parts(5, 8) == 5           # at most one per iteration
    assert _thread_parts(0, 8) == 1           # at least one
    assert _thread_parts(100, PART_BYTES) == 2          # one copy fits
    assert _thread_parts(100, PART_BYTES // 4) == 5
    assert _thread_parts(100, PART_BYTES + 1) == 1      # no copy fits: serial


def test_a_histograms_reverse_leaves_the_bins_adjoint_alone(threads):
    """h[bins[i]] += a * x[i]: the reverse reads adj_h[bins[i]] and nothing else
    touches it (kadj.simplify_adj.keep_readded_elements), so each iteration writes
    only its own adj_x[i] and sums adj_a: parallel, no copies."""
    args = (rng.standard_normal(300), rng.integers(0, 7, 300), np.zeros(7), 0.5)
    par = kadj.differentiate(histogram, parallel=True)
    ser = kadj.differentiate(histogram, parallel=False)
    src = par.adjoint_source(*args)
    assert is_parallel_source(src) and "_thread_parts(" not in src, src
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    for a, b in zip(_adjoints(par, args), _adjoints(ser, args)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel, args", [
    # reads its shared element's adjoint and adds back a multiple of it
    (decaying_histogram, lambda: (rng.standard_normal(50), rng.integers(0, 7, 50),
                                  rng.standard_normal(7), 0.5)),
    # consumes out[idx[i]]'s adjoint: assigns it, not only adds
    (scatter, lambda: (rng.standard_normal(30), rng.permutation(30), np.zeros(30))),
])
def test_reading_or_assigning_shared_elements_stays_serial(kernel, args):
    args = args()
    par = kadj.differentiate(kernel, parallel=True)
    src = par.adjoint_source(*args)
    assert not is_parallel_source(src), src
    fd_check(par, args, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("n", [1, 9, 103, 1001])
def test_replayed_parts_bounds_checked(n, threads):
    """The parts' jammed loops (each with its own tape) run with numba's bounds checking
    (kadj.testing.check_grad), on every thread of this machine."""
    from kadj.testing import check_grad
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    check_grad(kadj.differentiate(p_horner), _horner_args(n, 6))
