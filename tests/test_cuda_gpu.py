"""kadj's CUDA adjoints on a real GPU: gradients against finite differences of forward
launches on the GPU, with adjoint buffers as numba device arrays, as NumPy arrays,
on a stream, and as CuPy arrays.

Skipped without a CUDA GPU, and under NUMBA_ENABLE_CUDASIM=1 (tests/test_cuda_sim.py
covers the simulator).  Each gradient check is the inner-product test: random
cotangents ``ct`` for the written arrays, one random direction ``d`` per differentiable
argument, ``<adjoint result, d>`` against the central difference of
``L = sum <ct, outputs>`` along ``d``, with the forward run in float64 on the GPU (a
float32 kernel's forward is launched on float64 copies of its arguments).
"""
import math

import numpy as np
import pytest
from numba import config as _numba_config
from numba import cuda

import kadj

if getattr(_numba_config, "ENABLE_CUDASIM", False):
    pytest.skip("NUMBA_ENABLE_CUDASIM is set: these tests need a real GPU",
                allow_module_level=True)
if not cuda.is_available():
    pytest.skip("no CUDA GPU present", allow_module_level=True)


# --------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------


@kadj.differentiate
@cuda.jit
def heat1d(u, u_new, alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@cuda.jit
def heat2d(u, u_new, alpha):
    j, i = cuda.grid(2)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1:
        u_new[i, j] = u[i, j] + alpha * (
            u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j])


@kadj.differentiate
@cuda.jit
def pointwise(x, w, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = math.sin(x[i]) * math.exp(-w[i] * x[i]) + math.sqrt(1.0 + x[i] * x[i])


@kadj.differentiate
@cuda.jit
def tanh_f32(x, y, a):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = a * math.tanh(x[i]) + x[i] * x[i]


@kadj.differentiate
@cuda.jit
def spmv(indptr, indices, data, x, y):
    row = cuda.grid(1)
    if row < y.shape[0]:
        s = 0.0
        for k in range(indptr[row], indptr[row + 1]):
            s += data[k] * x[indices[k]]
        y[row] = s


def _blocks(n, b):
    return (n + b - 1) // b


def _heat1d(rng):
    n = 4099
    return heat1d, ((_blocks(n, 128),), (128,)), (rng.standard_normal(n), np.zeros(n), 0.2)


def _heat2d(rng):
    shape = (67, 131)
    config = ((_blocks(shape[1], 32), _blocks(shape[0], 8)), (32, 8))
    return heat2d, config, (rng.standard_normal(shape), rng.standard_normal(shape), 0.15)


def _pointwise(rng):
    n = 5000
    return pointwise, ((_blocks(n, 256),), (256,)), (
        rng.uniform(-2, 2, n), rng.uniform(-1, 1, n), np.zeros(n))


def _tanh_f32(rng):
    n = 3000
    return tanh_f32, ((_blocks(n, 256),), (256,)), (
        rng.uniform(-2, 2, n).astype(np.float32), np.zeros(n, np.float32), np.float32(1.5))


def _spmv(rng):
    n = 2000
    counts = rng.integers(1, 12, size=n)
    indptr = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=indptr[1:])
    indices = rng.integers(0, n, size=int(indptr[-1])).astype(np.int32)
    return spmv, ((_blocks(n, 128),), (128,)), (
        indptr, indices, rng.standard_normal(indices.size), rng.standard_normal(n), np.zeros(n))


KERNELS = {"heat1d": _heat1d, "heat2d": _heat2d, "pointwise": _pointwise,
           "tanh_f32": _tanh_f32, "spmv": _spmv}


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _is_float(a):
    return np.asarray(a).dtype.kind == "f"


def _copy(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def _as_f64(args):
    out = []
    for a in args:
        if isinstance(a, np.ndarray):
            out.append(a.astype(np.float64) if a.dtype.kind == "f" else a.copy())
        elif _is_float(a):
            out.append(float(a))
        else:
            out.append(a)
    return out


def _forward_f64(k, config, args):
    """Forward launch on device copies of ``args`` promoted to float64; host results."""
    d = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in _as_f64(args)]
    k[config](*d)
    cuda.synchronize()
    return [a.copy_to_host() if hasattr(a, "copy_to_host") else a for a in d]


def _seeds(k, args, rng):
    """Initial adjoint buffers (NumPy): cotangents for written arrays, random values for
    read-only arrays and scalars (the adjoint adds to them)."""
    plan = k.adjoint_plan(*args)
    bufs = []
    for i in plan.adjoint_args:
        a = args[i]
        dtype = np.asarray(a).dtype
        shape = a.shape if isinstance(a, np.ndarray) else (1,)
        bufs.append(rng.standard_normal(shape).astype(dtype))
    return plan, bufs


def run_adjoint(k, config, args, seeds, mode):
    """kadj's adjoint with adjoint buffers (and forward arrays) of kind ``mode``;
    returns the adjoint buffers as NumPy arrays and the forward arrays afterwards."""
    if mode == "numpy":
        fwd, bufs = _copy(args), [b.copy() for b in seeds]
        k.adjoint[config](*fwd, *bufs)
        return bufs, fwd
    if mode == "cupy":
        import cupy
        fwd = [cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        bufs = [cupy.asarray(b) for b in seeds]
        k.adjoint[config](*fwd, *bufs)
        cupy.cuda.runtime.deviceSynchronize()
        return ([cupy.asnumpy(b) for b in bufs],
                [cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else a for a in fwd])
    fwd = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    bufs = [cuda.to_device(b) for b in seeds]
    if mode == "stream":
        stream = cuda.stream()
        k.adjoint[config[0], config[1], stream](*fwd, *bufs)
        stream.synchronize()
    else:
        k.adjoint[config](*fwd, *bufs)
        cuda.synchronize()
    return ([b.copy_to_host() for b in bufs],
            [a.copy_to_host() if hasattr(a, "copy_to_host") else a for a in fwd])


def check_gradient(name, mode, seed=0):
    """Inner-product test of kadj's adjoint on the GPU; returns the adjoint buffers."""
    rng = np.random.default_rng(seed)
    k, config, args = KERNELS[name](rng)
    plan, seeds = _seeds(k, args, rng)
    written = sorted(plan.written)
    got, after = run_adjoint(k, config, args, seeds, mode)
    for a, b in zip(after, args):
        if isinstance(b, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg="the adjoint modified a forward "
                                                        "argument")
    single = any(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in args)
    eps, rtol = (1e-3, 2e-4) if single else (1e-6, 1e-7)
    cts = {i: seeds[plan.adjoint_args.index(i)].astype(np.float64) for i in written}

    def loss(xargs):
        out = _forward_f64(k, config, xargs)
        return sum(float(np.sum(cts[i] * out[i])) for i in written)

    for slot, i in enumerate(plan.adjoint_args):
        a = args[i]
        grad = got[slot].astype(np.float64)
        if i not in plan.written:
            grad = grad - seeds[slot].astype(np.float64)
        plus, minus = _as_f64(args), _as_f64(args)
        if isinstance(a, np.ndarray):
            d = rng.standard_normal(a.shape)
            plus[i] = plus[i] + eps * d
            minus[i] = minus[i] - eps * d
        else:
            d = np.array([rng.standard_normal()])
            plus[i] = plus[i] + eps * float(d[0])
            minus[i] = minus[i] - eps * float(d[0])
        fd = (loss(plus) - loss(minus)) / (2 * eps)
        dot = float(np.sum(grad * d))
        scale = max(float(np.sum(np.abs(grad * d))), abs(fd), 1e-30)
        assert abs(dot - fd) <= rtol * scale, (
            f"{name} ({mode}): adjoint of {plan.arg_names[i]}: <adjoint, d> = {dot!r}, "
            f"finite difference {fd!r}")
    return got


def _same(a_bufs, b_bufs, single):
    rtol = 1e-5 if single else 1e-12
    for a, b in zip(a_bufs, b_bufs):
        scale = max(float(np.max(np.abs(b))), 1e-30)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)


# --------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_gradient_device_arrays(name):
    check_gradient(name, "device")


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_gradient_numpy_arrays(name):
    check_gradient(name, "numpy")


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_device_and_numpy_buffers_agree(name):
    rng = np.random.default_rng(3)
    k, config, args = KERNELS[name](rng)
    _, seeds = _seeds(k, args, rng)
    on_device, _ = run_adjoint(k, config, args, seeds, "device")
    on_host, _ = run_adjoint(k, config, args, seeds, "numpy")
    _same(on_device, on_host, name.endswith("f32"))


@pytest.mark.parametrize("name", ["heat2d", "spmv"])
def test_adjoint_on_a_stream(name):
    got = check_gradient(name, "stream")
    rng = np.random.default_rng(0)
    k, config, args = KERNELS[name](rng)
    _, seeds = _seeds(k, args, rng)
    default_stream, _ = run_adjoint(k, config, args, seeds, "device")
    _same(got, default_stream, False)


@pytest.mark.parametrize("name", ["heat1d", "pointwise", "tanh_f32"])
def test_cupy_arrays(name):
    try:
        import cupy  # noqa: F401
    except Exception as exc:
        pytest.skip(f"cupy is not importable: {exc}")
    got = check_gradient(name, "cupy")
    rng = np.random.default_rng(0)
    k, config, args = KERNELS[name](rng)
    _, seeds = _seeds(k, args, rng)
    on_device, _ = run_adjoint(k, config, args, seeds, "device")
    _same(got, on_device, name.endswith("f32"))


@pytest.mark.parametrize("form", ["scatter", "gather"])
def test_adjoint_resources(form):
    rng = np.random.default_rng(0)
    k, config, args = KERNELS["heat2d"](rng)
    res = k.adjoint_resources(*args, form=form)
    assert res["registers"] > 0 and res["max_threads_per_block"] > 0
    assert res["local_memory_per_thread"] >= 0


def _gallery_cases():
    try:
        from kernels.cuda import load
    except Exception:  # pragma: no cover - the gallery is part of the repository
        return []
    from kernels.cuda import MODULES
    return [(module, c) for module in MODULES for c in load(module)]


@pytest.mark.parametrize("module,case", _gallery_cases(),
                         ids=[c.name for _, c in _gallery_cases()])
def test_gallery_on_gpu(module, case):
    """Every kernel of kernels/cuda, on the device, against finite differences."""
    from kadj.testing import check_grad_cuda
    args = case.make_args(np.random.default_rng(0))
    check_grad_cuda(case.kernel, case.config, args, rtol=case.rtol)


@pytest.mark.parametrize("module,case", _gallery_cases(),
                         ids=[c.name for _, c in _gallery_cases()])
def test_gallery_on_gpu_at_scale(module, case):
    """Every kernel of kernels/cuda on the device at about 65,537 elements (a launch of
    thousands of blocks, the last one partial), and each kernel with a per-thread loop
    also at 300 trips (bisection over the checkpoint slots many levels deep), against
    finite differences: the sizes the simulator cannot reach.

    The particle kernels are piecewise smooth: linear (or constant) inside a cell, with
    kinks at the cell edges, and their positions are kept a tenth of a cell away from
    the edges.  The default step is relative to each position's magnitude, which
    reaches thousands of cells here, so it would move particles across edges; a step
    of 1e-8 relative keeps every particle inside its cell."""
    from kadj.testing import check_grad_cuda
    eps = 1e-8 if module == "particles" else None
    rng = np.random.default_rng(7)
    config, args = case.sized(rng, 65537)
    check_grad_cuda(case.kernel, config, args, directions=1, rtol=case.rtol, eps=eps)
    if case.trip_loop:
        config, args = case.sized(rng, 4097, trips=300)
        check_grad_cuda(case.kernel, config, args, directions=1, rtol=case.rtol, eps=eps)


def test_tape_with_device_arrays():
    rng = np.random.default_rng(1)
    u0 = rng.random(300)

    def run(x, on_device):
        mk = cuda.to_device if on_device else (lambda a: a)
        us = [mk(x.copy())] + [mk(np.zeros(300)) for _ in range(3)]
        with kadj.Tape() as tape:
            for step in range(3):
                heat1d[3, 128](us[step], us[step + 1], 0.2)
        return tape, us

    tape, us = run(u0, True)
    ct = rng.standard_normal(300)
    tape.backward(seeds=[(us[3], ct)])
    g = tape.grad(us[0]).copy_to_host()
    d = rng.standard_normal(300)
    eps = 1e-6
    f = [float(ct @ run(u0 + s * eps * d, False)[1][3]) for s in (1, -1)]
    fd = (f[0] - f[1]) / (2 * eps)
    assert abs(g @ d - fd) <= 1e-6 * max(1.0, abs(fd))
