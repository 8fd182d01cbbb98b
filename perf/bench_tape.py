"""Tape benchmarks: per-launch recording and replay overhead, and the memory and time
of a whole-simulation gradient, store-everything against :func:`kadj.checkpointed_loop`.

Not part of the default test run; run explicitly::

    pytest perf/bench_tape.py --benchmark-only
    python scripts/bench_tape.py            # the same measurements as one table

Cases:

- *overhead*: a 1-D three-point stencil on 64 elements, ``launches`` ping-pong launches
  recorded on a :class:`kadj.Tape`, then ``tape.backward``.  Recording cost per launch
  is the recorded loop's time over ``launches`` (the forward itself, a few
  microseconds, included; the plain forward is timed alongside); replay cost is the
  backward's time over ``launches`` (the adjoint kernels included).
- *heat*: a 2-D explicit heat simulation (``size`` x ``size``, ping-pong buffers,
  ``steps`` steps) and a squared-error loss; the gradient with respect to the initial
  field, by the store-everything tape or by ``checkpointed_loop`` with ``snapshots``
  state copies.  Time of the whole gradient (forward, backward, ``tape.grad``), peak
  memory traced by :mod:`tracemalloc` during it (a separate run: tracing slows Python
  down), and the forward step executions per step against the binomial schedule's
  (:func:`kadj.schedules.binomial_cost`).
- *CUDA* (``python scripts/bench_tape.py --cuda``; needs a CUDA GPU): the same two
  cases with ``@cuda.jit`` kernels on numba device arrays -- per-launch recording and
  replay cost of a 1-D stencil launch, and the 2-D heat gradient with time
  (synchronised), the tape's peak snapshot bytes, and the peak device memory in use
  (``cuMemGetInfo`` sampled at every step executed and after the backward).
"""
from __future__ import annotations

import gc
import time
import tracemalloc

import numba
import numpy as np
import pytest
from numba import cuda

import kadj
from kadj import schedules

ROUNDS = 3


@kadj.differentiate
@numba.njit
def stencil1d(u, v, alpha):
    n = u.shape[0]
    for i in range(1, n - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])
    v[0] = u[0]
    v[n - 1] = u[n - 1]


@kadj.differentiate
@numba.njit
def sumsq(u, out):
    s = 0.0
    for i in range(u.shape[0]):
        s += u[i] * u[i]
    out[0] = s


@kadj.differentiate
@numba.njit
def heat2d(u, v, alpha):
    nx, ny = u.shape
    for i in range(1, nx - 1):
        for j in range(1, ny - 1):
            v[i, j] = u[i, j] + alpha * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] +
                                         u[i, j + 1] - 4.0 * u[i, j])
    for j in range(ny):
        v[0, j] = u[0, j]
        v[nx - 1, j] = u[nx - 1, j]
    for i in range(1, nx - 1):
        v[i, 0] = u[i, 0]
        v[i, ny - 1] = u[i, ny - 1]


@kadj.differentiate
@numba.njit
def misfit2d(u, target, out):
    s = 0.0
    for i in range(u.shape[0]):
        for j in range(u.shape[1]):
            d = u[i, j] - target[i, j]
            s += d * d
    out[0] = s


# ---- per-launch overhead ---------------------------------------------------------------
def record_and_replay(launches, n=64):
    """(record us per launch, replay us per launch) of ``launches`` ping-pong stencil
    launches on ``n`` elements."""
    u, v, out = np.random.default_rng(0).random(n), np.zeros(n), np.zeros(1)
    gc.collect()
    with kadj.Tape() as tape:
        a, b = u, v
        t0 = time.perf_counter()
        for _ in range(launches):
            stencil1d(a, b, 0.1)
            a, b = b, a
        t1 = time.perf_counter()
        sumsq(a, out)
    t2 = time.perf_counter()
    tape.backward(out)
    t3 = time.perf_counter()
    return (t1 - t0) / launches * 1e6, (t3 - t2) / (launches + 1) * 1e6


def plain_forward(launches=1000, n=64):
    """us per unrecorded launch of the stencil (the forward alone)."""
    u, v = np.random.default_rng(0).random(n), np.zeros(n)
    t0 = time.perf_counter()
    for _ in range(launches):
        stencil1d(u, v, 0.1)
    return (time.perf_counter() - t0) / launches * 1e6


def warm_up():
    """Compile every kernel and adjoint of this module (not timed)."""
    record_and_replay(3)
    heat_gradient(8, 4, None)
    heat_gradient(8, 4, 2)


# ---- the heat simulation's gradient ----------------------------------------------------
def heat_inputs(size):
    rng = np.random.default_rng(1)
    return rng.random((size, size)), rng.random((size, size))


def heat_gradient(size, steps, snapshots, alpha=0.2, trace=False):
    """Gradient of the misfit after ``steps`` heat steps w.r.t. the initial field.

    ``snapshots=None``: the store-everything tape; else ``checkpointed_loop``.  Returns
    dict(seconds, peak_bytes (with ``trace``, else None), state_bytes, executions,
    grad)."""
    init, target = heat_inputs(size)
    u0, v0, out = init.copy(), np.zeros_like(init), np.zeros(1)

    def step(i, u, v):
        heat2d(u, v, alpha)
        return v, u

    gc.collect()
    if trace:
        tracemalloc.start()
        tracemalloc.reset_peak()
    t0 = time.perf_counter()
    with kadj.Tape() as tape:
        if snapshots is None:
            u, v = u0, v0
            for i in range(steps):
                u, v = step(i, u, v)
        else:
            u, v = kadj.checkpointed_loop(step, (u0, v0), steps=steps,
                                          snapshots=snapshots)
        misfit2d(u, target, out)
    tape.backward(out)
    g = tape.grad(u0)
    seconds = time.perf_counter() - t0
    peak = None
    if trace:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    loops = tape.memory_report().loops
    executions = loops[0].forward_executions if loops else steps
    return dict(seconds=seconds, peak_bytes=peak, state_bytes=u0.nbytes + v0.nbytes,
                executions=executions, grad=g)


def theoretical_executions(steps, snapshots):
    """Forward step executions of the binomial schedule (the store-everything tape:
    one per step)."""
    return steps if snapshots is None else schedules.binomial_cost(steps, snapshots)


# ---- pytest-benchmark ------------------------------------------------------------------
@pytest.fixture(scope="module")
def warm():
    warm_up()


@pytest.mark.parametrize("launches", [100, 1000, 5000])
def test_record(benchmark, warm, launches):
    benchmark.group = "tape overhead: record"
    u, v = np.random.default_rng(0).random(64), np.zeros(64)

    def record():
        with kadj.Tape():
            a, b = u, v
            for _ in range(launches):
                stencil1d(a, b, 0.1)
                a, b = b, a

    benchmark.pedantic(record, rounds=ROUNDS, iterations=1, warmup_rounds=1)


@pytest.mark.parametrize("launches", [100, 1000, 5000])
def test_replay(benchmark, warm, launches):
    benchmark.group = "tape overhead: replay"
    u, v, out = np.random.default_rng(0).random(64), np.zeros(64), np.zeros(1)
    with kadj.Tape() as tape:
        a, b = u, v
        for _ in range(launches):
            stencil1d(a, b, 0.1)
            a, b = b, a
        sumsq(a, out)
    benchmark.pedantic(tape.backward, args=(out,), rounds=ROUNDS, iterations=1,
                       warmup_rounds=1)


@pytest.mark.parametrize("snapshots", [None, 10, 20, 40],
                         ids=["store-everything", "s10", "s20", "s40"])
def test_heat_gradient(benchmark, warm, snapshots):
    benchmark.group = "heat 64x64, 1000 steps: gradient"
    result = benchmark.pedantic(heat_gradient, args=(64, 1000, snapshots), rounds=1,
                                iterations=1)
    traced = heat_gradient(64, 1000, snapshots, trace=True)
    benchmark.extra_info.update(
        peak_traced_bytes=traced["peak_bytes"], state_bytes=traced["state_bytes"],
        recompute_factor=result["executions"] / 1000,
        theoretical_factor=theoretical_executions(1000, snapshots) / 1000)


# ---- CUDA: kernels on numba device arrays -----------------------------------------------
@kadj.differentiate
@cuda.jit
def stencil1d_cuda(u, v, alpha):
    i = cuda.grid(1)
    n = u.shape[0]
    if i > 0 and i < n - 1:
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])
    elif i == 0 or i == n - 1:
        v[i] = u[i]


@kadj.differentiate
@cuda.jit
def sumsq_cuda(u, out):
    i = cuda.grid(1)
    if i < u.shape[0]:
        cuda.atomic.add(out, 0, u[i] * u[i])


@kadj.differentiate
@cuda.jit
def heat2d_cuda(u, v, alpha):
    i, j = cuda.grid(2)
    nx, ny = u.shape
    if i < nx and j < ny:
        if i > 0 and i < nx - 1 and j > 0 and j < ny - 1:
            v[i, j] = u[i, j] + alpha * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] +
                                         u[i, j + 1] - 4.0 * u[i, j])
        else:
            v[i, j] = u[i, j]


@kadj.differentiate
@cuda.jit
def misfit2d_cuda(u, target, out):
    i, j = cuda.grid(2)
    if i < u.shape[0] and j < u.shape[1]:
        d = u[i, j] - target[i, j]
        cuda.atomic.add(out, 0, d * d)


def cuda_problem():
    """None when CUDA kernels can run here, else why not (for a clear message)."""
    if numba.config.ENABLE_CUDASIM:
        return None
    try:
        if cuda.is_available():
            return None
    except Exception as exc:          # a broken driver install
        return f"numba.cuda cannot reach the driver: {exc}"
    return "no CUDA GPU is available to numba (numba.cuda.is_available() is False)"


def _device_used():
    """Bytes of device memory in use now (0 in the CUDA simulator)."""
    if numba.config.ENABLE_CUDASIM:
        return 0
    free, total = cuda.current_context().get_memory_info()
    return total - free


def cuda_record_and_replay(launches, n=64):
    """(record us per launch, replay us per launch) of ``launches`` ping-pong launches
    of a 1-D CUDA stencil on device arrays (each time ends with a synchronisation)."""
    u = cuda.to_device(np.random.default_rng(0).random(n))
    v, out = cuda.device_array(n), cuda.to_device(np.zeros(1))
    blocks = (n + 127) // 128
    gc.collect()
    cuda.synchronize()
    with kadj.Tape() as tape:
        a, b = u, v
        t0 = time.perf_counter()
        for _ in range(launches):
            stencil1d_cuda[blocks, 128](a, b, 0.1)
            a, b = b, a
        cuda.synchronize()
        t1 = time.perf_counter()
        sumsq_cuda[blocks, 128](a, out)
    cuda.synchronize()
    t2 = time.perf_counter()
    tape.backward(out)
    cuda.synchronize()
    t3 = time.perf_counter()
    return (t1 - t0) / launches * 1e6, (t3 - t2) / (launches + 1) * 1e6


def cuda_plain_forward(launches=1000, n=64):
    """us per unrecorded launch of the CUDA stencil (synchronised at the end)."""
    u = cuda.to_device(np.random.default_rng(0).random(n))
    v = cuda.device_array(n)
    blocks = (n + 127) // 128
    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(launches):
        stencil1d_cuda[blocks, 128](u, v, 0.1)
    cuda.synchronize()
    return (time.perf_counter() - t0) / launches * 1e6


def cuda_warm_up():
    """Compile every CUDA kernel and adjoint of this module (not timed)."""
    cuda_record_and_replay(3)
    cuda_heat_gradient(8, 4, None)
    cuda_heat_gradient(8, 4, 2)


def cuda_heat_gradient(size, steps, snapshots, alpha=0.2):
    """:func:`heat_gradient` with CUDA kernels on device arrays.  Returns dict(seconds,
    peak_device_bytes (in use, sampled, above the level before the run),
    peak_snapshot_bytes, state_bytes, executions, grad (on the host))."""
    init, target = heat_inputs(size)
    u0, v0 = cuda.to_device(init), cuda.to_device(np.zeros_like(init))
    target_d, out = cuda.to_device(target), cuda.to_device(np.zeros(1))
    threads = (16, 16)
    blocks = ((size + 15) // 16, (size + 15) // 16)
    peak = [0]

    def step(i, u, v):
        heat2d_cuda[blocks, threads](u, v, alpha)
        peak[0] = max(peak[0], _device_used())
        return v, u

    gc.collect()
    cuda.synchronize()
    base = _device_used()
    t0 = time.perf_counter()
    with kadj.Tape() as tape:
        if snapshots is None:
            u, v = u0, v0
            for i in range(steps):
                u, v = step(i, u, v)
        else:
            u, v = kadj.checkpointed_loop(step, (u0, v0), steps=steps,
                                          snapshots=snapshots)
        misfit2d_cuda[blocks, threads](u, target_d, out)
    tape.backward(out)
    peak[0] = max(peak[0], _device_used())
    g = tape.grad(u0)
    cuda.synchronize()
    seconds = time.perf_counter() - t0
    report = tape.memory_report()
    loops = report.loops
    executions = loops[0].forward_executions if loops else steps
    return dict(seconds=seconds, peak_device_bytes=max(0, peak[0] - base),
                peak_snapshot_bytes=report.peak_snapshot_bytes,
                state_bytes=2 * init.nbytes, executions=executions,
                grad=g.copy_to_host())
