"""Replayed loops run in parallel blocks, each block with a tape of its own
(kadj.replay_blocks): an element-wise prange body that reassigns a local under branches
replays each iteration in its reverse; the blocks of 4096 iterations run as numba.prange,
each block's function allocating its own one-iteration tape.  Gradients against float64
finite differences (bounds-checked) at small sizes, and against the serial adjoint
(parallel=False) across several blocks: arrays bit for bit, sums over the threads to
rounding."""
import math

import numpy as np
import pytest
from numba import njit, prange

import kadj
from kadj.parallel import BLOCK
from fdcheck import fd_check
from kadj.testing import check_grad


@njit(parallel=True)
def soft_clip(x, out, lo, hi):
    for i in prange(x.shape[0]):
        v = x[i]
        if v > hi:
            v = hi + math.log(1.0 + v - hi)
        elif v < lo:
            v = lo - math.log(1.0 + lo - v)
        out[i] = v * v


@njit(parallel=True)
def limited_update(u, g, out, rate):
    # a local rescaled under a test of its own value, then used again
    for i in prange(u.shape[0]):
        step = rate * g[i]
        if abs(step) > 0.5:
            step = 0.5 * step / abs(step) + 0.1 * (step - 0.5 * step / abs(step))
        w = u[i] - step
        if w < 0.0:
            w = 0.2 * w
        out[i] = w * math.exp(-step * step)


@njit(parallel=True)
def newton_cbrt(a, out):
    # an inner loop of a constant trip count, replayed and reversed in each iteration:
    # its values are defined by the replay before its reverse reads them
    for i in prange(a.shape[0]):
        y = 1.0
        for it in range(8):
            y = y - (y * y * y - a[i]) / (3.0 * y * y)
        out[i] = y


@njit(parallel=True)
def substeps(pos, vel, dt, out):
    for i in prange(pos.shape[0]):
        v = vel[i]
        p = pos[i]
        for s in range(4):
            acc = -math.sin(p)
            v = v + dt * acc
            p = p + dt * v
        out[i] = p


def _args(kernel, n, rng):
    if kernel is soft_clip:
        return (rng.uniform(-2.0, 2.0, n), np.zeros(n), -0.5, 0.7)
    if kernel is newton_cbrt:
        return (rng.uniform(0.5, 2.0, n), np.zeros(n))
    if kernel is substeps:
        return (rng.uniform(-1.0, 1.0, n), rng.uniform(-1.0, 1.0, n), 0.1, np.zeros(n))
    return (rng.uniform(-1.0, 1.0, n), rng.uniform(-2.0, 2.0, n), np.zeros(n), 0.9)


def _buffers(k, args, seed):
    plan = k.adjoint_plan(*args)
    r = np.random.default_rng(seed)
    bufs = [r.standard_normal(args[i].shape) if isinstance(args[i], np.ndarray)
            else np.zeros(1) for i in plan.adjoint_args]
    k.adjoint(*args, *bufs)
    return bufs


@pytest.mark.parametrize("kernel, jammed", [(soft_clip, False), (limited_update, False),
                                            (newton_cbrt, True), (substeps, True)],
                         ids=lambda k: getattr(k, "__name__", str(k)))
def test_replayed_iterations_in_parallel_blocks(kernel, jammed):
    rng = np.random.default_rng(11)
    par = kadj.differentiate(kernel)
    ser = kadj.differentiate(kernel, parallel=False)
    src = par.adjoint_source(*_args(kernel, 20, rng))
    assert "for _blk in numba.prange(" in src, src
    block = src.split("def ")[1]            # the block's function
    assert "_tape_f64 = np.empty(" in block, src  # the block's own tape
    # iterations that can run four side by side do so within each block (on one
    # thread that beat one iteration at a time by 2.7x: newton_cbrt)
    assert ("side by side" in block) == jammed, src
    if jammed:
        assert "_tape_f64 = np.empty((4 * " in block, src
        assert "side by side" in ser.adjoint_source(*_args(kernel, 20, rng))
    assert "numba.prange" not in ser.adjoint_source(*_args(kernel, 20, rng))
    for n in (1, 2, 3, 17, 150):
        check_grad(par, _args(kernel, n, rng))
    for n in (0, 5, 3 * BLOCK + 7):
        args = _args(kernel, n, rng)
        kept = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        got, want = _buffers(par, args, n), _buffers(ser, args, n)
        for a, b in zip(args, kept):
            np.testing.assert_array_equal(a, b)     # the user's arrays untouched
        for g, w, i in zip(got, want, par.adjoint_plan(*args).adjoint_args):
            if isinstance(args[i], np.ndarray):
                np.testing.assert_array_equal(g, w)
            else:       # a sum over the threads, added in another order
                np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-12)


def test_a_loop_left_early_does_not_define_what_follows():
    from kadj import adj_ir as A
    from kadj.parallel import _read_before_defined
    body = [A.For("k", "range(0, 8, 1)", [A.Assign("t", "k * 2.0")]),
            A.Assign("u", "t + 1.0")]
    assert _read_before_defined(body, {"t"}, set()) == set()
    for exit_ in (A.Break(), A.Continue()):
        early = [A.For("k", "range(0, 8, 1)", [A.If("k > 2", [exit_]),
                                               A.Assign("t", "k * 2.0")]),
                 A.Assign("u", "t + 1.0")]
        assert _read_before_defined(early, {"t"}, set()) == {"t"}
    empty = [A.For("k", "range(0, 0, 1)", [A.Assign("t", "k * 2.0")]),
             A.Assign("u", "t + 1.0")]
    assert _read_before_defined(empty, {"t"}, set()) == {"t"}
    assert _read_before_defined(
        [A.For("k", "range(0, n, 1)", [A.Assign("t", "1.0")]), A.Assign("u", "t")],
        {"t"}, set()) == {"t"}


def test_blocks_not_moved_into_a_function_run_serially(monkeypatch):
    # (the block's tape and stack pointer are its own only inside its function)
    import kadj.targets.cpu as cpu
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")
    monkeypatch.setattr(cpu, "outline_rows", lambda fn, ns, options: 0)
    rng = np.random.default_rng(2)
    k = kadj.differentiate(soft_clip)
    src = k.adjoint_source(*_args(soft_clip, 20, rng))
    assert "numba.prange" not in src and "the block's tape is not its own" in src
    check_grad(k, _args(soft_clip, 40, rng))


@njit(parallel=True)
def blocks_then_recorded_rows(x, idx, a, w, y, z):
    # reversed first: a replayed loop in parallel blocks whose one-iteration tape
    # allocation was the tape's first; reversed next: a replayed loop recording in an
    # inner loop, which reserves room on that tape
    for i in prange(y.shape[0]):
        s = 0.0
        for j in range(x.shape[0]):
            s += a[i, j] * math.tanh(x[idx[i]])
        y[i] = math.sin(s)
    for i in prange(z.shape[0]):
        v = w[i]
        if v > 0.1:
            v = math.exp(v)
        else:
            v = v * v
        z[i] = v


def test_a_blocks_tape_allocation_that_a_later_loop_grows_stays():
    """The blocks' loop took the tape's first allocation into its blocks, and the
    later loop's reservation read an undefined tape (numba: "Variable '_tape_f64' is
    not defined").  Against finite differences and the serial adjoint."""
    rng = np.random.default_rng(8)
    n, m = 40, 3
    args = (rng.standard_normal(m), rng.integers(0, m, n), rng.standard_normal((n, m)),
            rng.standard_normal(n), np.zeros(n), np.zeros(n))
    par = kadj.differentiate(blocks_then_recorded_rows)
    ser = kadj.differentiate(blocks_then_recorded_rows, parallel=False)
    assert "numba.prange" in par.adjoint_source(*args)
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    got, want = [], []
    for k, out in ((par, got), (ser, want)):
        bufs = [np.zeros(m), np.zeros((n, m)), np.zeros(n), np.ones(n), np.ones(n)]
        k.adjoint(*args, *bufs)
        out.extend(bufs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
