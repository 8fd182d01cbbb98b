"""Scalar adjoints summed in loops, on the CPU: ``_sum_add`` (kadj/sum_intrinsic.py) and
the CPU target's policy that uses it (kadj/vector_sums.py).

- ``_sum_add`` is an addition: a loop summing with it gives the exact sum within
  rounding, for float32 and float64, at lengths 0, 1, 3 and 1001;
- the CPU adjoints of a stencil with a scalar parameter and of Horner's polynomial sum
  their scalar adjoints with it and pass float64 finite-difference checks;
- a loop whose exit depends on a running sum recomputed by the adjoint takes exactly
  the forward's path (the recompute stays a plain, ordered sum), with data chosen so
  that a reassociated sum would exit one iteration earlier or later;
- LLVM vectorises such a sum: the optimised IR of a compiled adjoint holds a vector
  ``fadd reassoc``, and no other instruction carries a fast-math flag.
"""
import math
import re

import numpy as np
import pytest
from llvmlite import binding as llvm
from numba import njit

import kadj
from fdcheck import fd_check
from kadj.sum_intrinsic import _sum_add


@njit
def _summed(a):
    s = a.dtype.type(0)
    for i in range(a.shape[0]):
        s = _sum_add(s, a[i])
    return s


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 3, 1001])
def test_sum_add_is_the_sum(dtype, n):
    a = np.random.default_rng(n).standard_normal(n).astype(dtype)
    got = _summed(a)
    name = np.dtype(dtype).name
    sig = [sg for sg in _summed.nopython_signatures if str(sg.args[0].dtype) == name]
    assert str(sig[0].return_type) == name     # summed in its own type
    exact = math.fsum(float(v) for v in a)
    eps = np.finfo(dtype).eps
    bound = 2 * (n + 1) * eps * float(np.sum(np.abs(a.astype(np.float64))))
    assert abs(float(got) - exact) <= bound, (float(got), exact, bound)
    if n <= 3:  # a short sum in order is exact in its own precision
        plain = dtype(0)
        for v in a:
            plain = dtype(plain + v)
        assert np.float32(got) == plain if dtype == np.float32 else got == plain


def test_sum_add_mixed_types_follow_plus():
    @njit
    def mixed(a, b, i):
        return _sum_add(a, b), _sum_add(a, i), _sum_add(i, i)

    f32, f64, i64 = mixed(np.float32(1.5), 2.25, 3)
    assert f32 == 3.75 and f64 == 4.5 and i64 == 6
    assert isinstance(i64, int)
    # called from Python (an adjoint's source run as Python): a plain addition
    assert _sum_add(np.float32(1.5), np.float32(2.25)) == np.float32(3.75)
    assert type(_sum_add(np.float32(1.5), np.float32(2.25))) is np.float32


# ---- the generated CPU adjoints ---------------------------------------------------------
@njit
def _heat_alpha(u, u_new, alpha):
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@njit
def _horner(x, c, out):
    for i in range(x.shape[0]):
        p = c[c.shape[0] - 1]
        for k in range(c.shape[0] - 2, -1, -1):
            p = p * x[i] + c[k]
        out[i] = p


@njit
def _scale(x, a, y):
    for i in range(x.shape[0]):
        y[i] = a * x[i] + 1.0


def _sum_lines(source):
    return [line.strip() for line in source.splitlines() if "_sum_add(" in line]


def test_stencil_with_scalar_parameter_sums_with_sum_add():
    k = kadj.differentiate(_heat_alpha)
    rng = np.random.default_rng(1)
    args = (rng.standard_normal(9), np.zeros(9), 0.3)
    lines = _sum_lines(k.adjoint_source(*args))
    # the gather form's edges and interior each add the iteration's sum
    assert len(lines) == 2 and all(re.fullmatch(
        r"adj_alpha = _sum_add\(adj_alpha, adj_t\d+ \* t\d+\)", ln) for ln in lines), lines
    fd_check(k, args)


def test_horner_sums_with_sum_add():
    k = kadj.differentiate(_horner)
    rng = np.random.default_rng(2)
    args = (rng.uniform(-1, 1, 5), rng.standard_normal(4), np.zeros(5))
    # the local sum of x[i]'s adjoint over the reversed inner loop: one per lane of the
    # iterations run side by side, eight of them (kadj/lane_jam.py), then the
    # remainder loop's
    lanes = [f"_acc_x1{s} = _sum_add(_acc_x1{s}, adj_p{s} * p{s})"
             for s in [f"_l{n}" for n in range(7, 0, -1)] + [""]]
    assert _sum_lines(k.adjoint_source(*args)) == lanes + [lanes[-1]]
    fd_check(k, args)


def test_parallel_reductions_stay_plain():
    """numba recognises a prange loop's reductions by their ``+=``: the parallel loop
    (over blocks of iterations) adds each block's sum with ``+=``; the block's own
    serial loop, a function of its own (kadj.row_outline), sums with _sum_add."""
    k = kadj.differentiate(_scale, parallel=True)
    args = (np.linspace(0.0, 1.0, 9) ** 2, 0.3, np.zeros(9))
    source = k.adjoint_source(*args)
    adjoint = source[source.index("def _scale_adjoint("):]
    assert "numba.prange" in adjoint and "adj_a += _row1(" in adjoint
    assert "_sum_add" not in adjoint
    row = source[source.index("def _row1("):source.index("def _scale_adjoint(")]
    assert "adj_a = _sum_add(adj_a, " in row and "numba.prange" not in row
    fd_check(k, args)


# ---- an exit decided by a recomputed running sum ------------------------------------------
@njit
def _until_over(x, w, limit, out):
    s = 0.0
    i = 0
    n = x.shape[0]
    while i < n:
        s += w * x[i] * x[i]
        if s > limit:
            break
        i += 1
    out[0] = s


def _plain_prefix(terms):
    out, s = [], 0.0
    for t in terms:
        s = s + t
        out.append(s)
    return out


def _lane_prefix(terms, lanes=4):
    """The prefix sums as a vectorised (reassociated) loop would form them."""
    out, acc = [], [0.0] * lanes
    for i, t in enumerate(terms):
        acc[i % lanes] = acc[i % lanes] + t
        total = 0.0
        for a in acc:
            total = total + a
        out.append(total)
    return out


def test_exit_on_a_recomputed_sum_takes_the_forward_path():
    rng = np.random.default_rng(7)
    x = rng.uniform(0.5, 1.5, 40) * 10.0 ** rng.uniform(-3, 1, 40)
    w = 0.7
    terms = [(w * v) * v for v in x]
    plain, lanes = _plain_prefix(terms), _lane_prefix(terms)
    k_at = next(j for j in range(20, 40) if plain[j] != lanes[j])
    limit = min(plain[k_at], lanes[k_at])     # exactly one of the two exceeds it

    def stop(prefix):
        return next((j for j, s in enumerate(prefix) if s > limit), len(prefix) - 1)
    forward_stop = stop(plain)
    assert forward_stop != stop(lanes), "the data must tell the two orders apart"

    k = kadj.differentiate(_until_over)
    out = np.zeros(1)
    k(x, w, limit, out)
    assert out[0] == plain[forward_stop]
    assert "_sum_add(adj_w" in k.adjoint_source(x, w, limit, out)

    adj_x, adj_w, adj_limit = np.zeros_like(x), np.zeros(1), np.zeros(1)
    k.adjoint(x, w, limit, out, adj_x, adj_w, adj_limit, np.ones(1))
    taken = np.arange(x.shape[0]) <= forward_stop
    np.testing.assert_allclose(adj_x, np.where(taken, 2.0 * w * x, 0.0), rtol=1e-14)
    np.testing.assert_allclose(adj_w[0], math.fsum(x[taken] ** 2), rtol=1e-12)
    assert adj_limit[0] == 0.0


# ---- LLVM vectorises the sum ------------------------------------------------------------
def _has_simd():
    features = llvm.get_host_cpu_features()
    return any(features.get(f, False) for f in ("sse2", "avx", "neon", "asimd"))


@pytest.mark.skipif(not _has_simd(), reason="this CPU has no SIMD instructions")
def test_llvm_vectorises_the_sum(monkeypatch, tmp_path):
    # bounds checks (on in this suite, tests/conftest.py) keep loops scalar
    monkeypatch.setenv("NUMBA_BOUNDSCHECK", "0")
    monkeypatch.setenv("KADJ_CACHE_DIR", str(tmp_path))
    k = kadj.differentiate(_scale)
    x = np.linspace(-1.0, 1.0, 1001)
    args = (x, 0.5, np.zeros_like(x))
    comp = k.compiled(*args)
    adj_x, adj_a, adj_y = np.zeros_like(x), np.zeros(1), np.cos(x)
    k.adjoint(*args, adj_x, adj_a, adj_y)
    np.testing.assert_allclose(adj_a[0], math.fsum(np.cos(x) * x), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(adj_x, 0.5 * np.cos(x), rtol=1e-15)
    fn = comp.function
    ir = fn.inspect_llvm(fn.signatures[0])
    assert re.search(r"fadd reassoc <\d+ x double>", ir), "the sum was not vectorised"
    flagged = re.findall(r"= (f\w+) ((?:reassoc|nnan|ninf|nsz|arcp|contract|afn|fast)"
                         r"(?: (?:reassoc|nnan|ninf|nsz|arcp|contract|afn|fast))*) ", ir)
    assert flagged and {(op, flags) for op, flags in flagged} == {("fadd", "reassoc")}
