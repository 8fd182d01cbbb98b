"""Singular points: adjoints follow IEEE arithmetic, with a strong zero.

At a point where a partial derivative is infinite or undefined (``sqrt`` at 0, ``x / 0``,
``asin`` at 1, ``hypot(0, 0)``...), for each rule family:

(a) a zero cotangent contributes exactly 0, with no exception;
(b) a non-zero cotangent gives the documented value (README: inf, nan, or the
    convention of JAX/PyTorch for ``x ** y`` at ``x = 0`` and ``abs`` at 0), with no
    exception;
(c) away from the singular point the gradient still matches float64 central
    differences.

CPU kernels are checked here; CUDA ones in the simulator (this file run as a script in
a subprocess with ``NUMBA_ENABLE_CUDASIM=1`` set before numba is imported) and by
compiling their PTX.  Each kernel writes one output per family, each output reading only
its own inputs, so one compiled adjoint checks every family at once.
"""
import json
import math
import os
import subprocess
import sys

import numpy as np
from numba import cuda, njit

import kadj

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fdcheck import fd_check  # noqa: E402

INF, NAN = math.inf, math.nan


# ---- CPU kernels -----------------------------------------------------------------------
@kadj.differentiate
@njit
def unary(x, out):
    out[0] = math.sqrt(x[0])
    out[1] = np.sqrt(x[1])
    out[2] = np.cbrt(x[2])
    out[3] = math.log(x[3])
    out[4] = np.log(x[4])
    out[5] = math.log2(x[5])
    out[6] = math.log10(x[6])
    out[7] = math.log1p(x[7])
    out[8] = math.asin(x[8])
    out[9] = np.arcsin(x[9])
    out[10] = math.acos(x[10])
    out[11] = np.arccos(x[11])
    out[12] = math.acosh(x[12])
    out[13] = math.atanh(x[13])
    out[14] = x[14] ** 0.5
    out[15] = math.pow(x[15], 0.5)
    out[16] = abs(x[16])


# (singular point, d out / d x there with cotangent 1, a regular point) per output
UNARY = [
    (0.0, INF, 0.7),     # sqrt
    (0.0, INF, 0.7),     # np.sqrt
    (0.0, INF, -0.6),    # cbrt
    (0.0, INF, 0.7),     # log
    (0.0, INF, 1.3),     # np.log
    (0.0, INF, 0.7),     # log2
    (0.0, INF, 0.7),     # log10
    (-1.0, INF, 0.3),    # log1p
    (1.0, INF, 0.4),     # asin
    (-1.0, INF, -0.4),   # np.arcsin
    (1.0, -INF, 0.3),    # acos
    (-1.0, -INF, -0.3),  # np.arccos
    (1.0, INF, 1.6),     # acosh
    (1.0, INF, 0.5),     # atanh
    (0.0, INF, 0.8),     # x ** 0.5
    (0.0, INF, 0.8),     # math.pow(x, 0.5)
    (0.0, 0.0, -0.7),    # abs: 0 at 0 (JAX, PyTorch)
]


@kadj.differentiate
@njit
def binary(x, y, out):
    out[0] = math.hypot(x[0], y[0])
    out[1] = math.atan2(x[1], y[1])
    out[2] = math.sqrt(x[2] * x[2] + y[2] * y[2])
    out[3] = x[3] ** y[3]
    out[4] = math.pow(x[4], y[4])
    out[5] = x[5] ** y[5]
    out[6] = x[6] ** y[6]
    out[7] = x[7] ** y[7]


# ((x, y) singular, (d/dx, d/dy) with cotangent 1, (x, y) regular) per output
BINARY = [
    ((0.0, 0.0), (NAN, NAN), (0.6, -0.8)),    # hypot(0, 0)
    ((0.0, 0.0), (NAN, NAN), (0.5, 0.9)),     # atan2(0, 0)
    ((0.0, 0.0), (NAN, NAN), (0.3, 0.4)),     # sqrt(x*x + y*y) at 0
    ((0.0, 2.0), (0.0, 0.0), (0.7, 2.0)),     # 0 ** 2
    ((0.0, 0.5), (INF, 0.0), (0.7, 0.5)),     # pow(0, 0.5)
    ((0.0, 0.0), (0.0, 0.0), (0.7, 1.3)),     # 0 ** 0: d/dx 0 where y == 0
    ((0.0, -1.0), (-INF, -INF), (0.7, -1.2)),  # 0 ** -1
    ((0.0, 1.0), (1.0, 0.0), (0.9, 1.0)),     # 0 ** 1
]


@kadj.differentiate
@njit(error_model="numpy")  # the forward itself divides by zero without raising
def divide(x, y, out):
    out[0] = x[0] / y[0]
    out[1] = x[1] / y[1]
    out[2] = 1.0 / y[2]
    out[3] = x[3] / y[3]
    out[4] = x[4] % y[4]


DIVIDE = [
    ((1.0, 0.0), (INF, -INF), (0.8, 1.7)),    # 1 / 0: out = inf
    ((0.0, 0.0), (INF, NAN), (-0.6, 0.9)),    # 0 / 0: out = nan
    ((0.0, 0.0), (0.0, -INF), (0.0, -1.4)),   # 1 / 0 (x unused)
    ((1.0, -0.0), (-INF, -INF), (0.5, -0.7)),  # 1 / -0: out = -inf
    ((1.0, 0.0), (1.0, NAN), (2.3, 0.7)),     # 1 % 0: out = nan
]


def _cpu_adjoint(k, inputs, g):
    n = inputs[0].shape[0]
    bufs = [np.zeros(n) for _ in inputs]
    k.adjoint(*inputs, np.zeros(n), *bufs, np.full(n, g))
    return bufs


def _check_families(k, inputs, expected):
    for g in (0.0, 1.0):
        grads = _cpu_adjoint(k, inputs, g)
        for j, got in enumerate(grads):
            want = np.zeros_like(got) if g == 0.0 else np.array([e[j] for e in expected])
            np.testing.assert_array_equal(
                got, want, err_msg=f"{k.__name__}: gradient of input {j}, cotangent {g}")


def test_unary_singular_points():
    x = np.array([p for p, _, _ in UNARY])
    _check_families(unary, [x], [(d,) for _, d, _ in UNARY])
    fd_check(unary, (np.array([r for _, _, r in UNARY]), np.zeros(len(UNARY))))


def test_binary_singular_points():
    for k, table in ((binary, BINARY), (divide, DIVIDE)):
        x = np.array([p[0] for p, _, _ in table])
        y = np.array([p[1] for p, _, _ in table])
        _check_families(k, [x, y], [d for _, d, _ in table])
        fd_check(k, (np.array([r[0] for _, _, r in table]),
                     np.array([r[1] for _, _, r in table]), np.zeros(len(table))))


def test_float32_adjoint_at_singular_points():
    x = np.array([p for p, _, _ in UNARY], dtype=np.float32)
    for g in (0.0, 1.0):
        adj_x = np.zeros_like(x)
        unary.adjoint(x, np.zeros_like(x), adj_x, np.full_like(x, g))
        assert adj_x.dtype == np.float32
        want = np.zeros(len(UNARY)) if g == 0.0 else np.array([d for _, d, _ in UNARY])
        np.testing.assert_array_equal(adj_x, want.astype(np.float32))


# ---- masked and zero-weighted singular points in real losses ---------------------------
@njit
def weighted_sqrt_loss(x, w):
    s = 0.0
    for i in range(x.shape[0]):
        s += w[i] * math.sqrt(x[i])
    return s


def test_zero_weight_at_sqrt_zero_gives_zero_gradient():
    x = np.array([0.0, 0.5, 2.0, 0.0])
    w = np.array([0.0, 1.5, -0.5, 3.0])
    gx = kadj.grad(weighted_sqrt_loss)(x, w)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = w / (2.0 * np.sqrt(x))   # analytic; inf where x = 0 and w != 0
    want[0] = 0.0                       # strong zero: w = 0 contributes exactly 0
    np.testing.assert_array_equal(gx[[0, 3]], want[[0, 3]])
    np.testing.assert_allclose(gx[1:3], want[1:3], rtol=1e-14)


@kadj.differentiate
@njit(error_model="numpy")
def guarded_ratio(a, b, out):
    for i in range(a.shape[0]):
        r = a[i] / b[i]
        if b[i] == 0.0:
            r = 0.0
        out[i] = r


def test_overwritten_division_by_zero_gives_zero_gradient():
    a = np.array([1.0, 0.0, 2.0, -3.0])
    b = np.array([0.0, 0.0, 4.0, 0.5])
    adj_a, adj_b = np.zeros(4), np.zeros(4)
    guarded_ratio.adjoint(a, b, np.zeros(4), adj_a, adj_b, np.ones(4))
    nz = b != 0.0
    np.testing.assert_array_equal(adj_a[~nz], 0.0)
    np.testing.assert_array_equal(adj_b[~nz], 0.0)
    np.testing.assert_allclose(adj_a[nz], 1.0 / b[nz], rtol=1e-14)
    np.testing.assert_allclose(adj_b[nz], -a[nz] / b[nz] ** 2, rtol=1e-14)


@kadj.differentiate
@njit
def norms(x, y, n):
    for i in range(x.shape[0]):
        n[i] = math.sqrt(x[i] * x[i] + y[i] * y[i])


@kadj.differentiate
@njit
def weighted_sum(n, w, loss):
    for i in range(n.shape[0]):
        loss[0] += w[i] * n[i]


def test_tape_with_a_zero_vector_of_weight_zero():
    x = np.array([0.0, 3.0, -1.0])
    y = np.array([0.0, 4.0, 2.0])
    w = np.array([0.0, 0.5, 2.0])
    n, loss = np.zeros(3), np.zeros(1)
    with kadj.Tape() as tape:
        norms(x, y, n)
        weighted_sum(n, w, loss)
    tape.backward(loss)
    r = np.hypot(x[1:], y[1:])
    np.testing.assert_array_equal(tape.grad(x)[0], 0.0)
    np.testing.assert_array_equal(tape.grad(y)[0], 0.0)
    np.testing.assert_allclose(tape.grad(x)[1:], w[1:] * x[1:] / r, rtol=1e-14)
    np.testing.assert_allclose(tape.grad(y)[1:], w[1:] * y[1:] / r, rtol=1e-14)


# ---- CUDA ------------------------------------------------------------------------------
@kadj.differentiate
@cuda.jit
def cuda_families(x, y, out):
    i = cuda.grid(1)
    if i == 0:
        out[0] = math.sqrt(x[0])
        out[1] = math.asin(x[1])
        out[2] = math.acos(x[2])
        out[3] = math.acosh(x[3])
        out[4] = math.hypot(x[4], y[4])
        out[5] = math.atan2(x[5], y[5])
        out[6] = math.sqrt(x[6] * x[6] + y[6] * y[6])
        out[7] = x[7] ** y[7]
        out[8] = x[8] / y[8]


# the simulator runs the kernels' Python with NumPy scalars and Python's math module,
# which raises where the GPU returns inf (math.log(0), math.pow(0, -0.5)): those
# families are checked in PTX only
CUDA = [
    ((0.0, 0.0), (INF, 0.0), (0.7, 0.0)),
    ((1.0, 0.0), (INF, 0.0), (0.4, 0.0)),
    ((-1.0, 0.0), (-INF, 0.0), (-0.3, 0.0)),
    ((1.0, 0.0), (INF, 0.0), (1.6, 0.0)),
    ((0.0, 0.0), (NAN, NAN), (0.6, -0.8)),
    ((0.0, 0.0), (NAN, NAN), (0.5, 0.9)),
    ((0.0, 0.0), (NAN, NAN), (0.3, 0.4)),
    ((0.0, 2.0), (0.0, 0.0), (0.7, 1.3)),
    ((1.0, 0.0), (INF, -INF), (0.8, 1.7)),
]


@kadj.differentiate
@cuda.jit
def cuda_ptx_families(x, y, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = (math.log(x[i]) + math.log1p(x[i]) + math.atanh(x[i]) + x[i] ** 0.5
                  + math.pow(x[i], y[i]) + math.sqrt(x[i]) + math.hypot(x[i], y[i])
                  + x[i] / y[i] + math.asin(x[i]))


def _simulator_main():
    """Run in the subprocess: the adjoint at the singular points (cotangent 0 and 1)
    and at the regular points (random cotangent, with central differences of the
    forward kernel), printed as one JSON line."""
    import warnings
    warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's divide-by-zero notices
    xs = np.array([p[0] for p, _, _ in CUDA])
    ys = np.array([p[1] for p, _, _ in CUDA])
    res = {}
    for g in (0.0, 1.0):
        ax, ay = np.zeros(len(CUDA)), np.zeros(len(CUDA))
        cuda_families.adjoint[1, 1](xs, ys, np.zeros(len(CUDA)), ax, ay,
                                    np.full(len(CUDA), g))
        res[str(g)] = [ax.tolist(), ay.tolist()]
    xr = np.array([r[0] for _, _, r in CUDA])
    yr = np.array([r[1] for _, _, r in CUDA])
    ct = np.random.default_rng(0).standard_normal(len(CUDA))
    ax, ay = np.zeros(len(CUDA)), np.zeros(len(CUDA))
    cuda_families.adjoint[1, 1](xr, yr, np.zeros(len(CUDA)), ax, ay, ct.copy())

    def f(x, y):
        out = np.zeros(len(CUDA))
        cuda_families[1, 1](x, y, out)
        return float(ct @ out)

    fd = [[], []]
    for j in range(len(CUDA)):
        for slot, (base, other) in enumerate(((xr, yr), (yr, xr))):
            h = 1e-6
            p, m = base.copy(), base.copy()
            p[j] += h
            m[j] -= h
            args = ((p, other), (m, other)) if slot == 0 else ((other, p), (other, m))
            fd[slot].append((f(*args[0]) - f(*args[1])) / (2 * h))
    res["regular"] = [ax.tolist(), ay.tolist()]
    res["fd"] = fd
    print("RESULT " + json.dumps(res))


def test_cuda_simulator_singular_points():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, f"simulator subprocess failed:\n{proc.stdout}\n{proc.stderr}"
    res = json.loads(lines[-1][len("RESULT "):])
    np.testing.assert_array_equal(np.array(res["0.0"]), 0.0)
    want = np.array([[d[0] for _, d, _ in CUDA], [d[1] for _, d, _ in CUDA]])
    np.testing.assert_array_equal(np.array(res["1.0"]), want)
    np.testing.assert_allclose(np.array(res["regular"]), np.array(res["fd"]),
                               rtol=1e-6, atol=1e-8)


def test_cuda_adjoint_ptx_at_every_precision():
    # the guarded contributions compile for the GPU (numba-cuda's default error model is
    # "numpy": IEEE division, no exception) and a float32 adjoint stays float32
    from cudatools import nvvm_available
    ok, why = nvvm_available()
    if not ok:
        import pytest
        pytest.skip(why)
    for dt in (np.float64, np.float32):
        x = np.zeros(4, dt)
        ptx = cuda_ptx_families.adjoint_ptx(x, x, x, cc=(9, 0))
        assert ".entry" in ptx
        if dt is np.float32:
            assert ".f64" not in ptx, "the float32 adjoint promoted to float64"


if __name__ == "__main__":
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    _simulator_main()
