"""Every generated CUDA adjoint compiles to PTX (numba.cuda.compile_ptx, no GPU), with
exactly the atomics kadj's report promises: none for thread-private accesses."""
import math
import re

import numpy as np
import pytest

cuda = pytest.importorskip("numba.cuda")

import kadj  # noqa: E402
from kadj import DifferentiationError  # noqa: E402
from cudatools import nvvm_available  # noqa: E402


_OK, _WHY = nvvm_available()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)


@kadj.differentiate
@cuda.jit
def heat_step(u, u_new, alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@cuda.jit
def laplace2d(u, v, c):
    i, j = cuda.grid(2)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1:
        v[i, j] = c * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
                       - 4.0 * u[i, j])


@kadj.differentiate
@cuda.jit
def pointwise(x, w, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * w[i] + math.exp(-x[i])


@kadj.differentiate
@cuda.jit
def scaled_sin32(x, y, a):
    i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    if i < x.shape[0]:
        y[i] = a * math.sin(x[i])


@cuda.jit(device=True)
def _scaled_tanh(a, b):
    return a * math.tanh(b)


@kadj.differentiate
@cuda.jit
def with_device_helper(x, y, s):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = _scaled_tanh(s, x[i])


@kadj.differentiate
@cuda.jit
def strided(z, p, v, out, dt):
    i = cuda.grid(1)
    if i < out.shape[0]:
        acc = z[2 * i] * z[2 * i + 1]
        for k in range(3):
            acc += p[3 * i + k] * math.sin(v[3 * i + k] * dt)
        out[i] = acc


@kadj.differentiate
@cuda.jit
def strides_that_meet(x, w, y):
    # 2 * i + 2 is thread i + 1's 2 * i, 3 * i + 4 thread i + 1's 3 * i + 1: atomics
    i = cuda.grid(1)
    if i < y.shape[0]:
        y[i] = x[2 * i] * x[2 * i + 2] + w[3 * i + 1] * w[3 * i + 4]


@kadj.differentiate
@cuda.jit
def stride_below_zero(x, y):
    # thread 0's x[2 * i - 1] is x[-1], the last element: another thread's
    i = cuda.grid(1)
    if i < y.shape[0]:
        y[i] = x[2 * i] * x[2 * i - 1]


def _atomics(ptx, space="global"):
    return [ln for ln in ptx.splitlines() if re.search(rf"\b(atom|red)\.{space}\.", ln)]


CASES = {
    # kernel, args, expected global atomics: adj_u: u[i - 1], u[i + 1] and the two loads
    # of u[i] merged into one (3) + adj_alpha (1 per block); adj_u_new none
    "heat_step": (heat_step, (np.zeros(8), np.zeros(8), 0.1), 4),
    # 5 neighbour loads of u + adj_c
    "laplace2d": (laplace2d, (np.zeros((4, 4)), np.zeros((4, 4)), 0.5), 6),
    # everything indexed by cuda.grid(1) only: no atomics at all
    "pointwise": (pointwise, (np.zeros(8), np.zeros(8), np.zeros(8)), 0),
    # index built from threadIdx + blockIdx * blockDim: private; only a (block-reduced)
    "scaled_sin32": (scaled_sin32, (np.zeros(8, np.float32), np.zeros(8, np.float32),
                                    np.float32(2.0)), 1),
    # the helper is inlined into the adjoint (no device call, so compile_ptx never asks
    # the driver for the compute capability); x[i] private, only adj_s is atomic
    "with_device_helper": (with_device_helper, (np.zeros(8), np.zeros(8), 0.3), 1),
    # each thread's own elements by strides (z[2 * i], z[2 * i + 1], p[3 * i + k] for k
    # in range(3)): no atomics but adj_dt's
    "strided": (strided, (np.zeros(8), np.zeros(12), np.zeros(12), np.zeros(4), 0.5), 1),
    # x: 2 loads (x[2 * i] and x[2 * i + 2] meet across threads); w: 2
    "strides_that_meet": (strides_that_meet, (np.zeros(12), np.zeros(16), np.zeros(4)),
                          4),
    "stride_below_zero": (stride_below_zero, (np.zeros(8), np.zeros(4)), 2),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_adjoint_ptx_atomics(name):
    k, args, expected = CASES[name]
    report = k.adjoint_report(*args)
    assert report["atomics"] == expected, k.adjoint_source(*args)
    ptx = k.adjoint_ptx(*args, cc=(9, 0))
    assert ".entry" in ptx or ".visible .entry" in ptx
    assert len(_atomics(ptx)) == expected, "\n".join(_atomics(ptx))
    # real scalar adjoints: summed over the block with warp shuffles (no shared-memory
    # atomics), one global atomic per block
    assert len(_atomics(ptx, "shared")) == report["shared_atomics"] == 0
    assert all("warp shuffles" in how for how in report["scalars"].values())
    if report["scalars"]:
        assert "shfl.sync.down" in ptx


def test_thread_private_store_has_no_atomic():
    src = heat_step.adjoint_source(np.zeros(8), np.zeros(8), 0.1)
    assert "adj_u_new[i] = 0.0" in src
    assert "cuda.atomic.add(adj_u_new" not in src
    # alpha's adjoint: summed over the block, then one atomic (kadj.cuda.block_sum)
    assert "_block_add_f64(adj_alpha_buf, 0, adj_alpha)" in src


def test_float32_adjoint_stays_float32():
    args = CASES["scaled_sin32"][1]
    ptx = scaled_sin32.adjoint_ptx(*args, cc=(9, 0))
    atoms = _atomics(ptx)
    assert atoms and all(".f32" in ln for ln in atoms), "\n".join(atoms)
    assert "f64" not in " ".join(atoms)


def test_plan_matches_cpu_layout():
    plan = heat_step.adjoint_plan(np.zeros(8), np.zeros(8), 0.1)
    assert plan.adjoint_names() == ("adj_u", "adj_u_new", "adj_alpha")


def test_atomic_nanmax_is_refused():
    # atomic.max/min are differentiated (tests/test_cuda_atomic_extrema.py); nanmax not
    @kadj.differentiate
    @cuda.jit
    def amax(x, y):
        i = cuda.grid(1)
        cuda.atomic.nanmax(y, 0, x[i])

    with pytest.raises(DifferentiationError, match="atomic.nanmax"):
        amax.adjoint_source(np.zeros(4), np.zeros(1))


@pytest.mark.parametrize("name", ["heat_step", "laplace2d"])
def test_gather_form_has_no_atomics_on_neighbours(name):
    k, args, _ = CASES[name]
    report = k.adjoint_report(*args)
    assert report["gather"]["arrays"] and "u" in report["gather"]["arrays"]
    gather = k.adjoint_ptx(*args, cc=(9, 0), form="gather")
    # global atomics left: the scalar's one per block, and one per load at a negative
    # offset for an index below zero (it wraps around; never taken inside the guards)
    negative = sum(1 for o in report["gather"]["arrays"]["u"] if min(o) < 0)
    assert len(_atomics(gather)) <= 1 + negative, "\n".join(_atomics(gather))
    zero = k.adjoint_ptx(*args, cc=(9, 0), form="zero")
    # the consume kernel's one atomic: block 0 adds the scalar's slots (kadj.cuda.slots)
    assert len(_atomics(zero)) == 1 and not _atomics(zero, "shared")
    assert "slot_total_f64(_slots, 0, adj_" in k.adjoint_source(*args, form="zero")
    assert "block_slot_f64(_slots, 0, adj_" in k.adjoint_source(*args, form="gather")
    lines = k.adjoint_source(*args, form="gather").splitlines()
    for n, line in enumerate(lines):
        if "cuda.atomic.add(adj_u" in line:
            assert "< 0" in lines[n - 1], line


@kadj.differentiate
@cuda.jit
def heat_two_coefficients(u, v, a, b):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        v[i] = u[i] + a * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + b * u[i] * u[i]


@kadj.differentiate
@cuda.jit
def conv3_f32(x, y, w0, w1, w2):
    i = cuda.grid(1)
    if 0 < i < x.shape[0] - 1:
        y[i] = w0 * x[i - 1] + w1 * x[i] + w2 * x[i + 1]


@pytest.mark.parametrize("k,args", [
    (heat_two_coefficients, (np.ones(20), np.zeros(20), 0.1, 0.2)),
    (conv3_f32, (np.ones(20, np.float32), np.zeros(20, np.float32), np.float32(0.2),
                 np.float32(0.5), np.float32(0.3))),
], ids=["two_f64", "three_f32"])
def test_consume_kernel_with_several_scalars_compiles(k, args):
    # the consume kernel sums each scalar's slots (kadj.cuda.block_sum.slot_total_*):
    # two calls used to bring two copies of a shared array's symbol, which NVVM
    # refused to link ("symbol multiply defined"); one atomic per scalar now
    nscalars = sum(1 for a in args if not isinstance(a, np.ndarray))
    zero = k.adjoint_ptx(*args, cc=(9, 0), form="zero")
    assert len(_atomics(zero)) == nscalars and not _atomics(zero, "shared"), \
        "\n".join(_atomics(zero))
    assert ".entry" in k.adjoint_ptx(*args, cc=(9, 0), form="gather")


def test_no_gather_form_without_neighbour_arrays():
    k, args, _ = CASES["pointwise"]
    assert k.adjoint_report(*args)["gather"]["used"] is False
    with pytest.raises(DifferentiationError, match="no gather form"):
        k.adjoint_source(*args, form="gather")


@kadj.differentiate
@cuda.jit
def hostile_names(x, adj_x, adj_alpha_buf, alpha, t1, _tape_f64):
    i = cuda.grid(1)
    if i < x.shape[0]:
        adj_v = alpha * 2.0
        _p0 = x[i] * adj_v
        for _k1 in range(3):
            _p0 = math.tanh(_p0 + t1[i])
        adj_x[i] = _p0
        _tape_f64[i] = _p0 * adj_alpha_buf[i]


@pytest.mark.parametrize("form", ["scatter", "gather", "zero"])
def test_names_like_generated_ones_compile(form):
    # arguments and locals named like kadj's own names (adj_*, t1, _tape_f64, _p0, _k1):
    # the generated adjoint has distinct parameters and compiles to PTX (the gradient is
    # checked in the simulator: tests/cuda_sim_cases.py, "hostile_names")
    args = (np.zeros(8), np.zeros(8), np.zeros(8), 0.3, np.zeros(8), np.zeros(8))
    if form != "scatter" and not hostile_names.adjoint_report(*args)["gather"]["used"]:
        with pytest.raises(DifferentiationError, match="no gather form"):
            hostile_names.adjoint_source(*args, form=form)
        return
    src = hostile_names.adjoint_source(*args, form=form)
    params = src.split("(", 1)[1].split(")", 1)[0].split(", ")
    assert len(params) == len(set(params)), src
    ptx = hostile_names.adjoint_ptx(*args, cc=(9, 0), form=form)
    assert ".entry" in ptx


def test_strided_classes_in_the_report():
    args = CASES["strided"][1]
    arrays = strided.adjoint_report(*args)["arrays"]
    assert {n: arrays[n]["class"] for n in ("z", "p", "v")} == dict.fromkeys(
        ("z", "p", "v"), "private")
    assert "by strides" in arrays["p"]["why"]
    arrays = strides_that_meet.adjoint_report(*CASES["strides_that_meet"][1])["arrays"]
    assert arrays["x"]["class"] != "private" and arrays["w"]["class"] != "private"


@kadj.differentiate
@cuda.jit
def row_norm(x, y):
    r = cuda.grid(1)
    if r < x.shape[0]:
        s = 0.0
        for j in range(x.shape[1]):
            s += x[r, j] * x[r, j]
        for j in range(x.shape[1]):
            y[r, j] = x[r, j] / (1.0 + s)


@kadj.differentiate
@cuda.jit
def row_and_next(x, y):
    r = cuda.grid(1)
    if r < x.shape[0] - 1:
        for j in range(x.shape[1]):
            y[r, j] = x[r, j] * x[r + 1, j]


@kadj.differentiate
@cuda.jit
def rows_2d_launch(x, y):
    i, k = cuda.grid(2)
    if i < x.shape[0] and k < y.shape[1]:
        s = 0.0
        for j in range(x.shape[1]):
            s += x[i, j] * x[i, j]
        y[i, k] = s


def test_thread_own_rows_take_plain_adds():
    # read only in the thread's own row (r from cuda.grid(1), any column): plain +=,
    # no atomic left in the PTX; gradients in tests/test_cuda_sim.py (row_private)
    args = (np.zeros((4, 3)), np.zeros((4, 3)))
    rep = row_norm.adjoint_report(*args)
    assert rep["arrays"]["x"]["class"] == "private", rep["arrays"]["x"]
    assert rep["arrays"]["x"]["accumulation"] == "plain"
    ptx = row_norm.adjoint_ptx(*args, cc=(9, 0))
    assert rep["atomics"] == 0 and not _atomics(ptx), _atomics(ptx)


@pytest.mark.parametrize("kernel, args", [
    (row_and_next, (np.zeros((4, 3)), np.zeros((4, 3)))),
    # a 2-D launch: the threads (i, 0), (i, 1), ... share row i of x
    (rows_2d_launch, (np.zeros((4, 3)), np.zeros((4, 2)))),
])
def test_rows_other_threads_touch_keep_atomics(kernel, args):
    rep = kernel.adjoint_report(*args)
    assert rep["arrays"]["x"]["class"] != "private", rep["arrays"]["x"]
    assert rep["arrays"]["x"]["accumulation"] == "atomic"


@kadj.differentiate
@cuda.jit
def weight_by_lane(x, w, y):
    i = cuda.grid(1)
    if 0 < i < y.shape[0] - 1:
        y[i] = math.sin(w[cuda.threadIdx.x]) * (x[i - 1] + x[i + 1])


def test_why_no_gather_form_names_no_temporaries():
    why = weight_by_lane.adjoint_report(np.ones(16), np.ones(8), np.zeros(16))["gather"]
    assert not why["used"] and "$" not in why["why"], why
    import inspect
    lines, first = inspect.getsourcelines(weight_by_lane.py_func)
    line = first + next(n for n, t in enumerate(lines) if "threadIdx" in t)
    assert f"line {line}" in why["why"], why
