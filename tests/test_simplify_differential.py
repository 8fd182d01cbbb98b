"""The readability passes (kadj/simplify.py: resets sunk, copies propagated, dead code
removed, single uses folded, accumulations merged) change how an adjoint reads, never
what it computes: every CPU gallery adjoint, with and without checkpoints, built with
them and built without them (only empty bodies filled, so that it compiles), gives the
same adjoint buffers and return value, to rounding, for random cotangents.  (A
reordering bug once moved an adjoint definition one statement too far, past an
addition into the same adjoint; a differential check finds such bugs without finite
differences.)  Slow suite: every kernel compiles twice."""
import numpy as np
import pytest

import kadj
import kadj.cpu_gather
import kadj.reverse
import kadj.simplify
from kadj.tape_measure import adjoint_buffers


def _gallery():
    from kernels.cpu import GALLERY
    return GALLERY


def _raw(fn, types=None, joins=True):
    kadj.simplify._fill_empty_bodies([fn])
    return fn


def _run(ex, options):
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt, **options)
    args = tuple(ex.make_args(np.random.default_rng(1)))
    plan = k.adjoint_plan(*args)
    fwd = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    bufs = adjoint_buffers(plan, fwd)
    rng = np.random.default_rng(2)
    for b in bufs:
        b[...] = rng.standard_normal(b.shape).astype(b.dtype)
    extra = {"adj_return": 0.7} if plan.returns_value else {}
    ret = k.adjoint(*fwd, *bufs, **extra)
    return k.adjoint_source(*args), bufs, ret


@pytest.mark.slow
@pytest.mark.parametrize("checkpoints", [None, 2])
@pytest.mark.parametrize("ex", _gallery(), ids=[ex.name for ex in _gallery()])
def test_simplified_adjoint_computes_what_the_raw_one_does(ex, checkpoints, monkeypatch):
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")
    options = {} if checkpoints is None else {"checkpoints": checkpoints}
    src, bufs, ret = _run(ex, options)
    monkeypatch.setattr(kadj.reverse, "simplify", _raw)
    monkeypatch.setattr(kadj.cpu_gather, "simplify", _raw)
    raw_src, raw_bufs, raw_ret = _run(ex, options)
    assert raw_src != src or "adj" not in src, "the raw adjoint was not rebuilt"
    tol = 1e-4 if any(b.dtype == np.float32 for b in bufs) else 1e-10
    for a, b in zip(bufs, raw_bufs):
        scale = max(1.0, float(np.abs(b).max(initial=0.0)))
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale, err_msg=ex.name)
    if ret is not None:
        assert ret == pytest.approx(raw_ret, rel=tol, abs=tol)
