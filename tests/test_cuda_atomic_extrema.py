"""cuda.atomic.max / atomic.min in differentiated CUDA kernels (kadj.cuda.atomic_extrema).

- Simulator (tests/atomic_extrema_cuda_sim.py in a subprocess): max pooling, a max over
  all elements above a pre-call floor, a row-wise atomic.min on a 2-D launch, a
  scatter-max in a per-thread loop, an atomic.min in a grid-stride while loop on three
  launch shapes, two calls on one array, against float64 central differences; the exact
  cotangent routing; ties (the pre-call value first, then the lowest thread, then the
  thread's first contribution); the forward arguments unchanged by the adjoint launch;
  a launch too large for numbered contributions refused.
- PTX: the adjoint, with its winner array, and the claim kernel compile with
  numba.cuda.compile_ptx.
- Refusals, located: the returned value used, nanmax, on a shared array, the target
  read elsewhere, forward mode (jvp).
"""
from __future__ import annotations

import numpy as np
import pytest
from numba import cuda, float64

import atomic_extrema_cuda_sim as sim
import kadj
from cudatools import nvvm_available, run_sim_cases
from kadj.cuda.atomic_extrema import claim_ptx


@pytest.mark.slow   # the CUDA simulator; its PTX tests run by default (-m slow runs it)
def test_gradients_in_the_simulator():
    names = list(sim.CASES) + list(sim.EXTRA) + [f"tape:{n}" for n in sim.CASES]
    res = run_sim_cases("atomic_extrema_cuda_sim.py", names)
    bad = {n: r for n, r in res.items() if r[0] != "OK"}
    assert not bad, bad


def test_on_a_tape_in_the_simulator():
    # the tape keeps the claimed arrays' pre-call contents (plan.read): it kept none,
    # and tape.grad was zero for the contributions
    res = run_sim_cases("atomic_extrema_cuda_sim.py",
                        [f"tape:{n}" for n in ("max_pool", "scatter_max", "min_pool_2d")])
    bad = {n: r for n, r in res.items() if r[0] != "OK"}
    assert not bad, bad


@pytest.mark.parametrize("name", sorted(sim.CASES))
def test_the_claimed_array_is_read(name):
    k, config, make = sim.CASES[name]
    args = make(np.random.default_rng(0))
    plan = k.adjoint_plan(*args)
    claimed = {i for i, a in enumerate(plan.arg_names) if a in ("out",)}
    assert claimed and claimed <= plan.read and claimed <= plan.written, plan


def test_adjoint_takes_the_winner_array():
    src = sim.max_pool.adjoint_source(np.zeros(16), np.zeros(4))
    assert "def max_pool_adjoint(x, out, kadj_win_out, adj_x, adj_out)" in src, src
    rep = sim.max_pool.adjoint_report(np.zeros(16), np.zeros(4))
    assert rep["atomic_extrema"][0]["array"] == "out"
    assert rep["arrays"]["x"]["accumulation"] == "plain", rep["arrays"]


@pytest.mark.parametrize("name", list(sim.CASES))
def test_adjoint_compiles_to_ptx(name):
    ok, why = nvvm_available()
    if not ok:
        pytest.skip(why)
    k, config, make = sim.CASES[name]
    args = make(np.random.default_rng(0))
    ptx = k.adjoint_ptx(*args, cc=(9, 0))
    assert ".entry" in ptx and "ld.global" in ptx
    claim = claim_ptx(k, args, cc=(9, 0))
    assert ".entry" in claim and "atom.global.min.s64" in claim, claim[-2000:]


def test_loop_contributions_are_numbered():
    src = sim.scatter_max.adjoint_source(*sim._scatter_args(np.random.default_rng(0)))
    assert "kadj_n_out = kadj_n_out + 1" in src and "* 4294967296" in src, src
    rep = sim.scatter_max.adjoint_report(*sim._scatter_args(np.random.default_rng(0)))
    assert rep["atomic_extrema"][0].get("numbered") is True, rep["atomic_extrema"]
    # one call outside loops: keyed by the thread alone
    src = sim.max_pool.adjoint_source(np.zeros(16), np.zeros(4))
    assert "kadj_n_" not in src and "4294967296" not in src, src


@pytest.mark.parametrize("kernel", ["two_on_one", "in_loop"])
def test_several_calls_and_loops_accepted(kernel):
    src = globals()[kernel].adjoint_source(np.zeros(8), np.zeros(8))
    assert "kadj_win_out" in src and "kadj_n_out" in src, src


@kadj.differentiate
@cuda.jit
def uses_result(x, out, old):
    i = cuda.grid(1)
    old[i] = cuda.atomic.max(out, 0, x[i])


@kadj.differentiate
@cuda.jit
def nan_max(x, out):
    i = cuda.grid(1)
    cuda.atomic.nanmax(out, 0, x[i])


@kadj.differentiate
@cuda.jit
def two_on_one(x, out):
    i = cuda.grid(1)
    cuda.atomic.max(out, 0, x[i])
    cuda.atomic.max(out, 1, 2.0 * x[i])


@kadj.differentiate
@cuda.jit
def in_loop(x, out):
    i = cuda.grid(1)
    for j in range(3):
        cuda.atomic.max(out, j, x[i] * j)


@kadj.differentiate
@cuda.jit
def on_shared(x, out):
    i = cuda.grid(1)
    sm = cuda.shared.array(1, float64)
    cuda.atomic.max(sm, 0, x[i])
    cuda.syncthreads()
    if i == 0:
        out[0] = sm[0]


@kadj.differentiate
@cuda.jit
def target_read(x, out):
    i = cuda.grid(1)
    cuda.atomic.max(out, 0, x[i] * out[1])


@cuda.jit(device=True)
def _emit_max(out, k, v):
    cuda.atomic.max(out, k, v)


@kadj.differentiate
@cuda.jit
def in_device_function(x, out):
    # refused when the adjoint is built, at the helper's line (was refused only
    # when the adjoint was launched, without a location)
    i = cuda.grid(1)
    _emit_max(out, 0, x[i])


@pytest.mark.parametrize("kernel, nargs, words", [
    (uses_result, 3, "the value returned by cuda.atomic.max"),
    (in_device_function, 2, "cuda.atomic.max() stands in a device function"),
    (nan_max, 2, "cuda.atomic.nanmax() in a differentiated kernel is not supported"),
    (on_shared, 2, "not an argument of the kernel"),
    (target_read, 2, "also read elsewhere"),
])
def test_refused_with_location(kernel, nargs, words):
    with pytest.raises(kadj.DifferentiationError) as info:
        kernel.adjoint_source(*[np.zeros(8)] * nargs)
    msg = str(info.value)
    assert words in msg, msg
    assert "test_cuda_atomic_extrema.py:" in msg, msg


def test_jvp_refused_with_location():
    with pytest.raises(kadj.DifferentiationError) as info:
        sim.max_pool.jvp_source(np.zeros(16), np.zeros(4))
    msg = str(info.value)
    assert "forward mode (jvp) of cuda.atomic.max/min" in msg, msg
    assert "atomic_extrema_cuda_sim.py:" in msg, msg
