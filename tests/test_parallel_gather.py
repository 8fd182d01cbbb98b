"""The gather form of a CPU stencil's adjoint, run in parallel (kadj.parallel,
kadj.cpu_gather): a stencil nest asked to be parallel (written with prange, or
differentiate(..., parallel=True)) gets the gather form with its loop over the elements
and its sums' loop as numba.prange, each found race-free by kadj.parallel's analysis
(each element's adjoint written once by its own iteration; the scalars' sums are
reductions); parallel=False keeps both serial.  Gradients against float64 finite
differences at small sizes, and against the serial gather form (parallel=False) at
larger ones: the arrays' adjoints bit for bit, the scalars' (reductions) to rounding.
Run with two threads."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from numba import njit, prange

import kadj
from fdcheck import fd_check
from kadj.parallel import BLOCK, is_parallel_source
from kernels.cpu.stencils import (diffusion_1d_parallel, diffusion_2d_parallel,
                                  laplacian_5pt)

ROOT = Path(__file__).resolve().parents[1]


@njit(parallel=True)
def p_diffusion_3d(u, kappa, out, dt):
    for i in prange(1, u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            for k in range(1, u.shape[2] - 1):
                lap = (u[i - 1, j, k] + u[i + 1, j, k] + u[i, j - 1, k] + u[i, j + 1, k]
                       + u[i, j, k - 1] + u[i, j, k + 1] - 6.0 * u[i, j, k])
                out[i, j, k] = u[i, j, k] + dt * kappa[i, j, k] * lap


def _args(shape, dt, seed=0):
    r = np.random.default_rng(seed)
    return r.standard_normal(shape), 0.5 + r.random(shape), np.zeros(shape), dt


CASES = {   # kernel, small shape (finite differences), larger shape (against serial)
    "1d": (diffusion_1d_parallel, (23,), (3 * BLOCK + 11,)),   # blocks, the last partial
    "2d": (diffusion_2d_parallel, (7, 9), (61, 75)),
    "3d": (p_diffusion_3d, (5, 4, 6), (13, 15, 17)),
}


@pytest.fixture(autouse=True)
def two_threads():
    """Real threads: two where numba has them (the subprocess test below always)."""
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    yield
    numba.set_num_threads(before)


def _adjoints(k, args):
    """The adjoint buffers after one call, from fixed random cotangents."""
    plan = k.adjoint_plan(*args)
    r = np.random.default_rng(1)
    bufs = [r.standard_normal(args[i].shape) if isinstance(args[i], np.ndarray)
            else np.zeros(1) for i in plan.adjoint_args]
    k.adjoint(*[a.copy() if isinstance(a, np.ndarray) else a for a in args], *bufs)
    return bufs


def _prange_bodies(src):
    """The text of every numba.prange loop's body."""
    lines = src.splitlines()
    bodies = []
    for k, ln in enumerate(lines):
        if "numba.prange(" in ln and ln.lstrip().startswith("for "):
            indent = len(ln) - len(ln.lstrip())
            body = []
            for nxt in lines[k + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt)
            bodies.append("\n".join(body))
    return bodies


def _assert_parallel_gather(src, ndim):
    lines = [ln.strip() for ln in src.splitlines()]
    assert any(ln.startswith("# gather form") for ln in lines)
    # the loop over the elements (1-D: its interior, in blocks of iterations; n-D: the
    # outermost dimension)
    outer = r"for _blk in numba\.prange\(0, " if ndim == 1 else r"for _p0_\w+ in numba\.prange\("
    assert any(re.match(outer, ln) for ln in lines), src
    # the loop after it over the iterations, consuming the outputs' adjoints
    assert any(re.match(r"for i_? in numba\.prange\(1, ", ln) for ln in lines), src
    assert "(summed over the threads: adj_dt)" in src
    # no sum inside a parallel loop is spelled _sum_add (numba's reductions are +=)
    assert not any("_sum_add" in body for body in _prange_bodies(src)), src
    # the 1-D edges (a few elements) stay serial; nothing inside a parallel loop is
    assert not any(re.match(r"for _e\w+ in numba\.prange\(", ln) for ln in lines)
    assert sum("numba.prange(" in ln for ln in lines) == 2
    assert is_parallel_source(src)
    gather, after = _prange_bodies(src)
    # the scalar's sums are added in the loop over the elements: the function of a
    # row (n-D) or a block of iterations (1-D) returns its sum
    assert "adj_dt +=" in gather and "adj_dt" not in after, src
    assert re.search(r"adj_dt \+= _row1\(", gather) and "return adj_dt" in src, src


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "3d" else c
                                  for c in CASES])
def test_prange_stencil_gather_form_runs_in_parallel(case):
    kernel, small, large = CASES[case]
    k = kadj.differentiate(kernel)
    args = _args(small, 0.15)
    src = k.adjoint_source(*args)
    _assert_parallel_gather(src, {"1d": 1, "2d": 2, "3d": 3}[case])
    if case == "1d":
        # an innermost parallel loop's counter is bound from its constant start, so
        # that LLVM sees the indices are not negative and vectorises the body as in
        # the serial loop; the loop over the elements, which sums adj_dt, runs in
        # blocks, each a function whose serial loop sums with _sum_add
        lines = [ln.strip() for ln in src.splitlines()]
        assert "i = _at_least(i_, 1)" in lines, src
        assert any(re.fullmatch(r"_p0_\w+ = _at_least\(_p0_\w+_, 2\)", ln)
                   for ln in lines), src
        assert re.search(r"\n\s+for _blk in numba\.prange\(.*\n\s+adj_dt \+= "
                         r"_row1\(_blk, ", src), src
        assert re.search(r"adj_dt = _sum_add\(adj_dt, ", src), src
    else:
        # the loop over rows (planes) calls its body, which holds the inner loops, as a
        # function of its own (kadj.row_outline): numba's parallel body took twice
        # the serial time; called as a function it takes less
        (call,) = re.findall(
            r"\n\s+for (_p0_\w+) in numba\.prange\(.*\n\s+adj_dt \+= (_row1\(.*\))\n", src)
        assert call[1].startswith(f"_row1({call[0]}, "), src
        assert "@numba.njit(error_model='numpy', no_cfunc_wrapper=True)\ndef _row1(" in src
    fd_check(k, args, rtol=1e-6, atol=1e-8)
    # the serial gather form (a serial 3-D stencil takes the scatter form by default)
    ser = kadj.differentiate(kernel, parallel=False, gather=True)
    big = _args(large, 0.1, seed=2)
    for a, b, x in zip(_adjoints(k, big), _adjoints(ser, big),
                       [big[i] for i in k.adjoint_plan(*big).adjoint_args]):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(a, b)     # each element written once: exact
        else:                                       # a reduction: to rounding
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [3, 4, 5, 6, BLOCK + 3, BLOCK + 4, BLOCK + 5, 2 * BLOCK + 4])
def test_1d_blocks_at_their_edges(n):
    """The 1-D interior (elements 2 .. n - 3) in blocks of BLOCK: one element short of
    a block, exactly one, one over, two, and sizes with no interior at all; each
    element's adjoint is the serial form's exactly, the scalar's to rounding."""
    kernel = CASES["1d"][0]
    big = _args((n,), 0.1, seed=n)
    par, ser = kadj.differentiate(kernel), kadj.differentiate(kernel, parallel=False)
    for a, b, x in zip(_adjoints(par, big), _adjoints(ser, big),
                       [big[i] for i in par.adjoint_plan(*big).adjoint_args]):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    if n == BLOCK + 5:      # two blocks, against finite differences too
        fd_check(par, big, rtol=1e-6, atol=1e-8)


def test_parallel_false_keeps_the_gather_form_serial():
    kernel, small, _ = CASES["2d"]
    k = kadj.differentiate(kernel, parallel=False)
    args = _args(small, 0.15)
    src = k.adjoint_source(*args)
    assert "# gather form" in src and "numba.prange" not in src
    assert not is_parallel_source(src)
    fd_check(k, args, rtol=1e-6, atol=1e-8)


def test_plain_for_stencil_in_parallel_only_when_asked():
    args = (np.random.default_rng(4).random((8, 7)), np.zeros((8, 7)), 4.0)
    default = kadj.differentiate(laplacian_5pt)
    asked = kadj.differentiate(laplacian_5pt, parallel=True)
    dsrc, asrc = default.adjoint_source(*args), asked.adjoint_source(*args)
    assert "# gather form" in dsrc and not is_parallel_source(dsrc)
    assert "# gather form" in asrc and is_parallel_source(asrc)
    assert re.search(r"for _p0_\w+ in numba\.prange\(", asrc)
    fd_check(asked, args, rtol=1e-6, atol=1e-8)


_TWO_THREADS = """
import numba, numpy as np, kadj
assert numba.get_num_threads() == 2, numba.get_num_threads()
from test_parallel_gather import CASES, _args, _adjoints
for case in ("1d", "2d"):
    kernel, _, large = CASES[case]
    big = _args(large, 0.1, seed=5)
    par, ser = kadj.differentiate(kernel), kadj.differentiate(kernel, parallel=False)
    assert "numba.prange" in par.adjoint_source(*big)
    gp, gs = _adjoints(par, big), _adjoints(ser, big)
    for a, b in zip(gp[:-1], gs[:-1]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(gp[-1], gs[-1], rtol=1e-12, atol=1e-12)
print("ok")
"""


def test_gradients_with_two_threads_in_a_fresh_process():
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "tests"), str(ROOT)] + env.get("PYTHONPATH", "").split(os.pathsep))
    r = subprocess.run([sys.executable, "-c", _TWO_THREADS], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
