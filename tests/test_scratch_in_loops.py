"""Scratch arrays allocated inside loops (kadj/scratch_loops.py): hoisted before the
outermost loop and refilled where they were allocated; gradients against float64
finite differences of the undecorated kernels, refusals with their location."""
import math

import numpy as np
import pytest
from numba import njit

import kadj
from cudatools import nvvm_available
from fdcheck import fd_check
from kadj import ir


@njit
def smooth_steps(u, steps):
    """tmp = np.empty(n) per time step, every element written before it is read."""
    n = u.shape[0]
    for t in range(steps):
        tmp = np.empty(n)
        for i in range(n):
            left = u[i - 1] if i > 0 else u[i]
            right = u[i + 1] if i < n - 1 else u[i]
            tmp[i] = 0.25 * left + 0.5 * u[i] + 0.25 * right
        for i in range(n):
            u[i] = tmp[i] + 0.1 * math.sin(tmp[i] * u[i])
    s = 0.0
    for i in range(n):
        s += u[i] * u[i]
    return s


@njit
def zeros_relied_on(x, out):
    """np.zeros per element: the untouched entries must read zero in every iteration
    (a hoisted array that is not refilled would read the previous element's); an
    integer scratch array per element picks a neighbour."""
    n = x.shape[0]
    for i in range(n):
        acc = np.zeros(4)
        idx = np.zeros(2, np.int64)
        idx[1] = (i + 1) % n
        for j in range(i % 4):
            acc[j] = x[i] * (j + 1.0)
        out[i] = acc[0] * acc[0] + acc[1] * acc[2] + acc[3] * x[i] + \
            x[idx[0]] * x[idx[1]]


@njit
def ones_and_like_2d(a, out):
    """2-D np.ones with a tuple shape computed inside the loop, np.zeros_like of an
    argument, both in a branch of the loop body."""
    n = a.shape[0]
    for i in range(n):
        if a[i, 0] > 0.0:
            w = np.ones((2, a.shape[1]))
            z = np.zeros_like(out)
            for j in range(a.shape[1]):
                w[1, j] = a[i, j] * a[i, j]
                z[i, j] = w[0, j] + w[1, j]
            for j in range(a.shape[1]):
                out[i, j] = z[i, j] * a[i, j]
        else:
            for j in range(a.shape[1]):
                out[i, j] = 2.0 * a[i, j]


@njit
def inner_loop_scratch(x, out, m):
    """Allocation in the inner of two loops, size from an argument; a while loop."""
    n = x.shape[0]
    for i in range(n):
        total = 0.0
        for r in range(2):
            buf = np.empty(m)
            for k in range(m):
                buf[k] = x[i] * (k + r + 1.0)
            for k in range(m):
                total += math.tanh(buf[k])
        k = 0
        while k < 2:
            c = np.zeros(2)
            c[k] = total * x[i]
            total = total + c[0] * c[1] + c[k]
            k += 1
        out[i] = total


CASES = [
    (smooth_steps, lambda r: (r.uniform(0.1, 1.0, 7), 3)),
    (zeros_relied_on, lambda r: (r.uniform(0.5, 1.5, 9), np.zeros(9))),
    (ones_and_like_2d, lambda r: (np.where(r.random((5, 3)) > 0.4, 1.0, -1.0) *
                                  r.uniform(0.2, 1.0, (5, 3)), np.zeros((5, 3)))),
    (inner_loop_scratch, lambda r: (r.uniform(-0.5, 0.5, 5), np.zeros(5), 3)),
]


@pytest.mark.parametrize("kernel,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_gradient_matches_finite_differences(kernel, make):
    args = make(np.random.default_rng(3))
    fd_check(kadj.differentiate(kernel), args, rtol=1e-6, atol=1e-9)


def test_checkpointed_time_loop_with_scratch():
    args = (np.random.default_rng(4).uniform(0.1, 1.0, 7), 5)
    fd_check(kadj.differentiate(smooth_steps, checkpoints=3), args, rtol=1e-6, atol=1e-9)


def test_allocation_is_hoisted_and_refilled():
    k = kadj.differentiate(zeros_relied_on)
    region = k.show_stage("region", np.ones(4), np.zeros(4))
    lines = region.splitlines()
    alloc = next(n for n, line in enumerate(lines) if "np.zeros(4)" in line)
    loop = next(n for n, line in enumerate(lines) if line.strip().startswith("for i in"))
    assert alloc < loop and lines[alloc].startswith("    acc"), region
    assert any("acc[" in line and "= 0.0" in line for line in lines[loop:]), region


@njit
def partly_written(x, out):
    """np.empty per element, its loop writes only the first m elements: refilled."""
    n = x.shape[0]
    m = 2
    for i in range(n):
        buf = np.empty(3)
        for j in range(m):
            buf[j] = x[i] * j
        out[i] = buf[0] + buf[1]


def _fills(kernel, args):
    region = kadj.differentiate(kernel).show_stage("region", *args)
    return [line for line in region.splitlines() if "= 0.0" in line and "[_fill" in line]


def test_partly_written_gradient():
    args = (np.random.default_rng(5).uniform(0.5, 1.5, 5), np.zeros(5))
    fd_check(kadj.differentiate(partly_written), args, rtol=1e-6, atol=1e-9)


def test_empty_written_in_full_first_is_not_refilled():
    assert _fills(smooth_steps, (np.ones(4), 2)) == []
    assert len(_fills(partly_written, (np.ones(4), np.zeros(4)))) == 1


@njit
def shape_follows_index(x, out):
    for i in range(x.shape[0]):
        part = np.empty(i + 1)
        for j in range(i + 1):
            part[j] = x[j]
        out[i] = part[i] * part[0]


@njit
def shape_follows_outer_index(x, out):
    for i in range(1, x.shape[0]):
        for r in range(2):
            part = np.zeros(i)
            part[0] = x[i]
            out[i] += part[0] * part[i - 1]


@pytest.mark.parametrize("kernel", [shape_follows_index, shape_follows_outer_index])
def test_varying_shape_is_refused_with_location(kernel):
    with pytest.raises(kadj.DifferentiationError) as exc:
        kadj.differentiate(kernel).adjoint_source(np.ones(5), np.zeros(5))
    msg = str(exc.value)
    assert "shape of the scratch array 'part'" in msg and "changes" in msg
    assert "test_scratch_in_loops.py:" in msg and "np.empty/np.zeros" in msg


@njit
def allocated_twice(x, out):
    for i in range(x.shape[0]):
        if x[i] > 0.5:
            part = np.zeros(3)
        else:
            part = np.zeros(5)
        part[0] = x[i]
        out[i] = part[0] * part.shape[0]


def test_allocation_assigned_twice_is_refused_with_location():
    with pytest.raises(kadj.DifferentiationError) as exc:
        kadj.differentiate(allocated_twice).adjoint_source(np.ones(5), np.zeros(5))
    msg = str(exc.value)
    assert "'part' is allocated inside a loop and assigned elsewhere" in msg, msg
    assert "test_scratch_in_loops.py:" in msg


def test_kernels_without_scratch_in_loops_are_untouched():
    from kadj import scratch_loops
    body = (ir.Assign("a", ir.Alloc(np.empty, (ir.Const(3),))),
            ir.ForRange("i", ir.Const(0), ir.Const(3), ir.Const(1),
                        (ir.Store(ir.Var("a"), (ir.Var("i"),), ir.Const(1.0)),), uid=1))
    kern = ir.Kernel(name="k", args=(), body=body)
    assert scratch_loops.hoist(kern) is kern


# ---- CUDA: thread-local arrays allocated inside loops -------------------------------
SIM_CASES = ["local_stages_per_step", "local_partial_sums"]


@pytest.fixture(scope="module")
def sim_results():
    from cudatools import run_sim_cases
    return run_sim_cases("scratch_loops_cuda_sim.py", SIM_CASES)


@pytest.mark.parametrize("name", SIM_CASES)
def test_cuda_local_array_in_loop_simulator(sim_results, name):
    status, detail = sim_results[name]
    assert status == "OK", detail


_PTX_OK, _PTX_WHY = nvvm_available()


@pytest.mark.skipif(not _PTX_OK, reason=_PTX_WHY)
def test_cuda_local_array_in_loop_compiles_to_ptx():
    from numba import cuda, float64

    @kadj.differentiate
    @cuda.jit
    def local_per_step(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y = x[i]
            for t in range(3):
                k = cuda.local.array(2, float64)
                k[0] = math.sin(y)
                k[1] = k[0] * y
                y = y + 0.1 * (k[0] + k[1])
            out[i] = y

    ptx = local_per_step.adjoint_ptx(np.ones(8), np.zeros(8), cc=(9, 0))
    assert ".entry" in ptx


def test_cuda_shared_array_in_loop_is_still_refused():
    from numba import cuda, float64

    @cuda.jit
    def shared_per_step(x, out):
        i = cuda.grid(1)
        for t in range(2):
            tile = cuda.shared.array(8, float64)
            tile[cuda.threadIdx.x] = x[i] * t
            cuda.syncthreads()
            out[i] += tile[(cuda.threadIdx.x + 1) % 8]
            cuda.syncthreads()

    with pytest.raises(kadj.DifferentiationError, match="inside a loop"):
        kadj.differentiate(shared_per_step).adjoint_source(np.ones(8), np.zeros(8))
