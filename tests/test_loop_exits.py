"""Loops with several exits: ``while True`` left by several breaks (with or without
code of their own), breaks under ``and``/``or`` and conditional expressions, ``break``
with ``continue``, ``return`` beside ``break``, a ``for`` that may return inside a ``while
True`` left by a break after it, and nested loops.  Gradients are
compared with float64 central finite differences (tests/fdcheck.py) of the bounds-checked
kernels (tests/conftest.py); CUDA forms run in the simulator and through compile_ptx."""
import math

import numpy as np
import pytest
from numba import njit

import kadj
from cudatools import nvvm_available, run_sim_cases
from fdcheck import fd_check


@njit
def and_break(x, y):
    z = x[0]
    k = 0
    while True:
        z = 0.5 * z + math.sin(z) * x[1]
        k += 1
        if k > 3 and abs(z) < 0.5:
            break
        if k > 40:
            break
    y[0] = z


@njit
def ternary_break(x, y):
    z = x[0]
    k = 0
    while True:
        z = 0.5 * z + math.sin(z) * x[1]
        k += 1
        if (z > 2.0) if k > 5 else (z > 3.0):
            break
        if k > 10:
            break
    y[0] = z


@njit
def break_and_continue(x, y):
    i = 0
    s = 0.0
    while True:
        i += 1
        if i >= x.shape[0]:
            break
        if x[i] < 0.0:
            continue
        s += x[i] * x[i - 1]
        if s > 1.5:
            s = s * 0.5
            break
    y[0] = s


@njit
def three_code_exits(x, y):
    z = x[0]
    k = 0
    while True:
        k += 1
        z = 0.8 * z + 0.3 * math.sin(z) * x[1]
        if z > 1.0 and k > 1:
            y[0] = z * z
            break
        elif z < -1.0:
            y[0] = -z * x[2]
            break
        if k > 8:
            y[0] = 3.0 * z
            break
    y[1] = z * x[2]


@njit
def return_or_break(x, y):
    z = x[0]
    k = 0
    while True:
        k += 1
        z = 0.8 * z + 0.3 * math.sin(z) * x[1]
        if z > 5.0 and k > 1:
            return z
        if k > 4 or z < -1.0:
            break
    y[0] = z
    return z * x[2]


@njit
def nested_while_breaks(x, y):
    z = x[0]
    n = 0
    while True:
        n += 1
        k = 0
        while True:
            k += 1
            z = 0.9 * z + 0.1 * x[1]
            if k > 2 and z > 0.0:
                break
            if k > 5:
                break
        if n > 3 or z > 2.0:
            break
    y[0] = z * z


@njit
def elif_breaks_with_code(x, y):
    s = 0.0
    for i in range(x.shape[0]):
        if x[i] > 1.0:
            s += x[i]
            y[1] = s
            break
        elif x[i] < -1.0:
            s -= x[i] * x[i]
            y[2] = s
            break
        else:
            s += math.sin(x[i])
    y[0] = s * s


@njit
def inner_break_outer_continue(x, y):
    s = 0.0
    for i in range(x.shape[0]):
        for j in range(x.shape[0]):
            if x[j] > x[i] or j > i + 1:
                break
            s += x[j] * x[i]
        else:
            continue
        s = s * 0.5 + x[i]
    y[0] = s


@njit
def guarded_while_break(x, y):
    z = x[0]
    k = 0
    while k < 30 and z < 2.0:
        z = z + 0.3 * math.cos(z) * x[1]
        k += 1
        if z < -1.0 or z > 1.5:
            z = z * x[2]
            break
    y[0] = z


@njit
def many_and_breaks(x, y):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * x[i]
        if s > 3.0 and x[i] > 0.0:
            break
        if s > 4.0 and x[i] < 0.0:
            break
        if s > 5.0 and i > 2:
            break
        if s > 6.0 and i > 3:
            break
        if s > 7.0 and i > 4:
            break
        s = s * 0.95
    y[0] = s


@njit
def many_exits_while(x, y):
    s = 0.0
    i = 0
    while True:
        s += x[i] * x[i]
        i += 1
        if s > 3.0 and x[i - 1] > 0.0:
            break
        if s > 4.0 and x[i - 1] < 0.0:
            s = s * x[i - 1]
            break
        if s > 5.0 and i > 2 or s > 9.0:
            break
        if (s > 6.0 and i > 3) if i % 2 == 0 else s > 6.5:
            break
        if i >= x.shape[0] or (s > 7.0 and i > 4):
            break
        s = s * 0.95
    y[0] = s


@njit
def for_return_then_break(x, y):
    # ``while True`` around a ``for`` that may return, left by a break after it
    z = 0.1
    i = 0
    while True:
        for j in range(x.shape[0]):
            if x[j] * z > 4.0:
                return z * x[j]
            z += x[j] * 0.5
        i += 1
        if i > 2:
            break
    y[0] = z * z
    return z


@njit
def for_return_or_break_then_break(x, y):
    # the ``for`` may return or break; the ``while True`` is left by a break after it
    z = 0.1
    n = 0
    while True:
        n += 1
        for j in range(x.shape[0]):
            z = z * x[j] + 0.1
            if z > 3.0:
                return z
            if z < 0.2:
                break
        z += x[0]
        if z > 1.0 or n > 5:
            break
    y[0] = z
    return z


def _v(*xs):
    return np.array(xs, dtype=np.float64)


CASES = [
    ("and_break", and_break, lambda: (_v(0.3, 0.9, 1.3), np.zeros(1))),
    ("ternary_break", ternary_break, lambda: (_v(0.3, 0.9, 1.3), np.zeros(1))),
    ("break_and_continue", break_and_continue,
     lambda: (_v(0.3, 0.4, -0.3, 1.2, 0.9, 1.1), np.zeros(1))),
    ("three_code_exits_first", three_code_exits,
     lambda: (_v(0.3, 0.9, 1.3), np.zeros(2))),
    ("three_code_exits_second", three_code_exits,
     lambda: (_v(-0.3, -0.9, 1.3), np.zeros(2))),
    ("three_code_exits_third", three_code_exits,
     lambda: (_v(0.1, 0.1, 1.3), np.zeros(2))),
    ("return_or_break_breaks", return_or_break,
     lambda: (_v(0.3, 0.9, 1.3), np.zeros(1))),
    ("return_or_break_returns", return_or_break,
     lambda: (_v(4.0, 9.0, 1.3), np.zeros(1))),
    ("nested_while_breaks", nested_while_breaks,
     lambda: (_v(0.3, 0.9, 1.3), np.zeros(1))),
    ("elif_breaks_with_code", elif_breaks_with_code,
     lambda: (_v(0.3, 0.4, -1.3, 1.2), np.zeros(3))),
    ("inner_break_outer_continue", inner_break_outer_continue,
     lambda: (_v(0.31, -0.52, 1.13, 0.24, -0.75), np.zeros(1))),
    ("guarded_while_break", guarded_while_break,
     lambda: (_v(0.3, 0.9, 1.3), np.zeros(1))),
    ("many_and_breaks", many_and_breaks,
     lambda: (_v(0.3, 0.4, -1.3, 1.2, 0.9, 1.1, 1.5, 1.6), np.zeros(1))),
    ("many_exits_while_negative", many_exits_while,
     lambda: (_v(0.3, 0.4, -1.3, 1.2, 0.9, 1.1, 1.5, 1.6), np.zeros(1))),
    ("many_exits_while_late", many_exits_while,
     lambda: (_v(0.3, 0.4, 0.5, -0.2, 0.6, 0.1, 0.7, 0.2), np.zeros(1))),
    ("many_exits_while_end", many_exits_while,
     lambda: (_v(0.3, 0.4, 0.5, -0.2, 0.6), np.zeros(1))),
    ("for_return_then_break_returns", for_return_then_break,
     lambda: (_v(1.3, 0.9, 1.2, 1.1, 0.8), np.zeros(1))),
    ("for_return_then_break_breaks", for_return_then_break,
     lambda: (_v(0.3, 0.2, 0.4, 0.1), np.zeros(1))),
    ("for_return_or_break_returns", for_return_or_break_then_break,
     lambda: (_v(1.5, 2.5, 2.0, 2.5), np.zeros(1))),
    ("for_return_or_break_breaks", for_return_or_break_then_break,
     lambda: (_v(1.2, 0.9, 0.6), np.zeros(1))),
    ("for_return_or_break_inner_break", for_return_or_break_then_break,
     lambda: (_v(0.7, 0.1, 0.9, 0.6), np.zeros(1))),
]


@pytest.mark.parametrize("name,kernel,make", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(name, kernel, make):
    fd_check(kadj.differentiate(kernel), make(), rtol=1e-5, atol=1e-8)


def test_exits_leave_by_a_selector_after_the_loop():
    # three breaks with code of their own: one loop, left by a selector value; the code
    # of each exit is dispatched after it, and the code after the loop is not copied
    region = kadj.differentiate(three_code_exits).show_stage(
        "region", _v(0.3, 0.9, 1.3), np.zeros(2))
    assert region.count("while True:") == 1, region
    assert "_exit" in region and "_took_exit" in region, region
    assert region.count("y[1] =") == 1 and region.count("y[0] =") == 3, region
    assert "return" not in region.split("while True:")[1].split("_took_exit")[0], region


def test_short_circuit_breaks_do_not_copy_the_rest_of_the_loop():
    # each ``if a and b: break`` is decided into a flag, so the code after it is
    # structured once instead of once per operand (2**5 copies)
    region = kadj.differentiate(many_and_breaks).show_stage(
        "region", _v(0.3, 0.4, -1.3, 1.2, 0.9), np.zeros(1))
    assert region.count("s > 7.0") == 1 and region.count("0.95") == 1, region


@njit
def endless(x, y):
    z = x[0]
    while True:
        z = 0.5 * z + x[1]
        y[0] = z


def test_endless_loop_is_refused_with_its_location():
    with pytest.raises(kadj.DifferentiationError) as info:
        kadj.differentiate(endless).adjoint_plan(_v(0.3, 0.2), np.zeros(1))
    msg = str(info.value)
    assert "never ends" in msg and "test_loop_exits.py" in msg, msg


SIM_CASES = ["newton_and_stop", "damped_exits", "checked_scale"]


@pytest.fixture(scope="module")
def sim_results():
    return run_sim_cases("loop_exits_cuda_sim.py", SIM_CASES)


@pytest.mark.parametrize("name", SIM_CASES)
def test_cuda_simulator_gradient(sim_results, name):
    status, detail = sim_results[name]
    assert status == "OK", detail


_PTX_OK, _PTX_WHY = nvvm_available()


@pytest.mark.skipif(not _PTX_OK, reason=_PTX_WHY)
def test_cuda_adjoint_compiles_to_ptx():
    from numba import cuda

    @kadj.differentiate
    @cuda.jit
    def newton_two_stops(a, out):
        i = cuda.grid(1)
        if i < a.shape[0]:
            x = 1.0
            k = 0
            while True:
                d = 0.5 * (x - a[i] / x)
                x = x - d
                k += 1
                if k >= 2 and abs(d) < 1e-13:
                    break
                if k >= 60:
                    x = -1.0
                    break
            out[i] = x * a[i]

    ptx = newton_two_stops.adjoint_ptx(np.ones(8), np.zeros(8), cc=(9, 0))
    assert ".entry" in ptx


# A for loop whose header numba gives a block that only jumps to the loop's test, left
# by early returns from an inner loop besides its own end: the code after the loop was
# taken from the first early return (``return w * 2.0 + a[i, j]`` in place of ``return
# s + t + u + w``), a wrong value and gradient; found by random kernels.  The block
# layout depends on the exact bytecode and line numbers, so the kernel is compiled
# from this text.
_TRIVIAL_HEADER = '''def trivial_header(x, a, y):
    n = x.shape[0]
    m = a.shape[1]
    s = x[0]
    u = x[1]
    w = x[0] * x[1]
    t = x[1] * 2.0
    for i in range(n):
        if i % 3 == 1:
            w += 0.0
        for j in range(m):
                s = 0.0
        for j in range(m):
            if a[i, j] > 0.5:
                u = math.exp(x[i])
                t *= x[i]
                w /= 2.0
                s = u / (x[n - 1] + 1.0)
                w = math.sin(x[n - 1]) * x[j % n]
            if a[i, j] > 0.5 and i == 3:
                return w * 2.0 + a[i, j]
            if x[0] > 0.5 and i == 3:
                return s * 2.0 + x[i]
    return s + t + u + w
'''


def test_the_code_after_a_loop_with_a_jump_only_header_is_its_own():
    from kadj import ir, pipeline
    from kadj.targets import cpu
    from kadj.testing import check_grad
    ns = {"math": math}
    exec(compile(_TRIVIAL_HEADER, "<trivial_header>", "exec"), ns)
    fn = njit(ns["trivial_header"])
    rng = np.random.default_rng(0)
    for n in (2, 5):
        x, a, y = rng.uniform(0.1, 0.9, n), rng.uniform(0.0, 1.0, (n, 3)), np.zeros(n)
        k = kadj.differentiate(fn)
        gx, ga, gy = np.zeros(n), np.zeros((n, 3)), np.zeros(n)
        assert k.adjoint(x, a, y, gx, ga, gy, adj_return=1.0) == fn(x, a, y)
        check_grad(k, (x, a, y))
    out = pipeline.stages(cpu.CPU, kadj.differentiate(fn),
                          tuple(__import__("numba").typeof(v) for v in (x, a, y)),
                          until="region")
    tail = ir.fmt(out["region"].body[-1:])
    assert "w * 2.0" not in tail and "$binop_add" in tail, tail
