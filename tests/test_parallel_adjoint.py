"""Parallel CPU adjoints (kadj.parallel): reversed prange loops run as numba.prange when
every write of the reversed body is private to its iteration or a reduction; loops whose
iterations add into shared elements run in parts (tests/test_thread_parts.py); a
neighbour stencil takes the gather form, run in parallel (tests/test_parallel_gather.py).
Gradients against float64 finite differences and against the serial adjoint
(parallel=False)."""
import math

import re

import numpy as np
import pytest
from numba import njit, prange

import kadj
from fdcheck import fd_check
from kadj.parallel import BLOCK, is_parallel_source

rng = np.random.default_rng(7)


@njit(parallel=True)
def p_map(x, y, out, a):
    for i in prange(x.shape[0]):
        t = a * x[i]
        out[i] = t * t + math.sin(t) * y[i]


@njit(parallel=True)
def p_rows(x, w, out):
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = math.tanh(x[i, j]) * w[i]


@njit(parallel=True)
def p_sum(x, w):
    s = 0.0
    for i in prange(x.shape[0]):
        s += w[i] * math.sin(x[i])
    return s


@njit(parallel=True)
def p_rows_scaled(x, a, out):
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = a * math.sin(x[i, j])


@njit(parallel=True)
def p_rows_two_scalars(x, a, b, out):
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = a * math.sin(x[i, j]) + b * x[i, j] * x[i, j]


@njit(parallel=True, fastmath=True)
def p_rows_fast(x, w, out):
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = math.exp(x[i, j]) * w[i]


@njit(parallel=True)
def p_branch_temp(x, y, out):
    # the reverse reads 1.0 / r under the test that computed it (if t6: t8 = ...,
    # later if t6: ... t8): defined on every path that reads it
    for i in prange(x.shape[0]):
        r = math.sqrt(x[i] * x[i] + y[i] * y[i])
        if r > 1.0:
            out[i] = 1.0 / r
        else:
            out[i] = r


@njit(parallel=True)
def p_adjoint_added_twice(x, out):
    # adj_r = g, then adj_r += g * s twice: the iteration's own, not a sum over threads
    for i in prange(x.shape[0]):
        r = x[i] * x[i]
        s = math.sin(r)
        out[i] = r + s * r


@njit
def plain_map(x, out, a):
    for i in range(x.shape[0]):
        out[i] = math.exp(a * x[i])


def _loop_line(src):
    # a parallel loop's counter is renamed i_ and bound as i = _at_least(i_, start);
    # one that sums scalars runs over blocks of iterations (_blk)
    return [ln.strip() for ln in src.splitlines()
            if re.match(r"for (i_?|_blk) in ", ln.strip())][-1]


def _serial_and_parallel(kernel, args, **opts):
    par = kadj.differentiate(kernel, **opts)
    ser = kadj.differentiate(kernel, **{**opts, "parallel": False})
    return par, ser, par.adjoint_source(*args), ser.adjoint_source(*args)


def _both_adjoints(par, ser, args):
    """Adjoint buffers of both, from the same random cotangents."""
    out = []
    for k in (par, ser):
        plan = k.adjoint_plan(*args)
        r = np.random.default_rng(1)
        bufs = [r.standard_normal(args[i].shape) if isinstance(args[i], np.ndarray)
                else np.zeros(1) for i in plan.adjoint_args]
        kw = {"adj_return": 0.7} if plan.returns_value else {}
        k.adjoint(*[a.copy() if isinstance(a, np.ndarray) else a for a in args],
                  *bufs, **kw)
        out.append(bufs)
    return out


@pytest.mark.parametrize("kernel, args", [
    (p_map, lambda: (rng.standard_normal(301), rng.standard_normal(301), np.zeros(301),
                     0.7)),
    (p_rows, lambda: (rng.standard_normal((37, 5)), rng.standard_normal(37),
                      np.zeros((37, 5)))),
    (p_sum, lambda: (rng.standard_normal(257), rng.standard_normal(257))),
    (p_branch_temp, lambda: (rng.uniform(-1, 1, 301), rng.uniform(-1, 1, 301),
                             np.zeros(301))),
    (p_adjoint_added_twice, lambda: (rng.uniform(-1, 1, 301), np.zeros(301))),
])
def test_private_writes_run_in_parallel(kernel, args):
    args = args()
    par, ser, psrc, ssrc = _serial_and_parallel(kernel, args)
    assert "numba.prange(" in _loop_line(psrc) and is_parallel_source(psrc)
    assert "numba.prange" not in ssrc and not is_parallel_source(ssrc)
    assert "adj_a" not in psrc or "(summed over the threads: adj_a)" in psrc
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    gp, gs = _both_adjoints(par, ser, args)
    for a, b in zip(gp, gs):    # a reduction's partial sums: equal to rounding
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("n", [2 * BLOCK + 5, 3 * BLOCK])
def test_a_loop_that_sums_runs_in_blocks(n):
    """A reversed parallel loop summing a scalar over the threads (adj_a) runs over
    blocks of BLOCK iterations, each a function whose serial loop sums with _sum_add;
    at sizes of several blocks (the last one partial, or full) the gradient is the
    serial form's (arrays exactly, the sum to rounding)."""
    args = (rng.standard_normal(n), rng.standard_normal(n), np.zeros(n), 0.7)
    par, ser, psrc, _ = _serial_and_parallel(p_map, args)
    assert re.search(r"\n\s+for _blk in numba\.prange\(0, \(t\d+ \+ 4095\) // 4096\):"
                     r"\n\s+\w+ \+= _row1\(_blk, ", psrc), psrc
    assert re.search(r"\n\s+_lo = _blk \* 4096\n\s+for i_ in range\(_lo, min\(_lo \+ 4096, "
                     r"t\d+\)\):\n\s+i = _at_least\(i_, 0\)\n", psrc), psrc
    assert "_sum_add(" in psrc
    gp, gs = _both_adjoints(par, ser, args)
    for a, b, i in zip(gp, gs, par.adjoint_plan(*args).adjoint_args):
        if isinstance(args[i], np.ndarray):
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-12)
    if n % BLOCK:           # several blocks, the last partial: finite differences too
        fd_check(par, args, rtol=1e-6, atol=1e-7)


def test_a_sum_the_forward_sweep_recomputes_runs_in_parallel():
    """The loss a prange loop sums (its value is the adjoint's return value, and the
    reverse sweep reads it) is recomputed by a parallel loop too, a reduction over the
    threads; the temporaries the reverse sweep assigns again do not keep it serial."""
    args = (rng.standard_normal(263), rng.standard_normal(263))
    par, ser, psrc, _ = _serial_and_parallel(p_sum, args)
    loops = [ln.strip() for ln in psrc.splitlines() if ln.strip().startswith("for ")]
    assert len(loops) == 2 and all("numba.prange(0, " in ln for ln in loops), psrc
    assert "(summed over the threads: s)" in psrc, psrc
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    gp, gs = _both_adjoints(par, ser, args)
    for a, b in zip(gp, gs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    plan = par.adjoint_plan(*args)
    bufs = [np.zeros_like(args[i]) for i in plan.adjoint_args]
    value = par.adjoint(*args, *bufs, adj_return=1.0)
    np.testing.assert_allclose(value, float(np.sum(args[1] * np.sin(args[0]))),
                               rtol=1e-12)


@njit(parallel=True)
def p_sum_then_reuse(x, y):
    """A prange sum, then a serial loop that reads the sum: the forward sweep's
    recomputation of s must be complete before the second loop reads it."""
    s = 0.0
    for i in prange(x.shape[0]):
        s += x[i] * x[i]
    for i in range(x.shape[0]):
        y[i] = s * x[i]


def test_a_forward_sum_read_by_a_later_loop_keeps_its_value():
    args = (rng.standard_normal(41), np.zeros(41))
    par, ser, psrc, _ = _serial_and_parallel(p_sum_then_reuse, args)
    assert "(summed over the threads: s)" in psrc, psrc
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    gp, gs = _both_adjoints(par, ser, args)
    for a, b in zip(gp, gs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_adjoint_ir_marks_the_parallel_loop():
    args = (rng.standard_normal(20), rng.standard_normal(20), np.zeros(20), 0.5)
    text = kadj.differentiate(p_map).show_stage("adjoint-ir", *args)
    assert "ReverseLoop(strategy='ascending', loop=1, parallel=True)" in text
    text = kadj.differentiate(p_map, parallel=False).show_stage("adjoint-ir", *args)
    assert "parallel=True" not in text


def test_plain_for_loop_only_when_asked():
    args = (rng.standard_normal(150), np.zeros(150), 0.4)
    default = kadj.differentiate(plain_map)
    asked = kadj.differentiate(plain_map, parallel=True)
    assert not is_parallel_source(default.adjoint_source(*args))
    assert is_parallel_source(asked.adjoint_source(*args))
    fd_check(asked, args, rtol=1e-6, atol=1e-8)
    gp, gs = _both_adjoints(asked, default, args)
    for a, b in zip(gp, gs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_parallel_option_is_checked():
    with pytest.raises(ValueError, match="parallel must be True or False"):
        kadj.differentiate(plain_map, parallel="yes")


def _row_functions(src):
    return re.findall(r"^(@numba\.njit\(.*\))\ndef (_row\w*)\((.*)\):$", src, re.M)


def test_parallel_body_with_loops_is_its_own_function():
    """A parallel loop whose body holds a loop calls that body as a jitted function
    (kadj.row_outline), compiled with the kernel's options; the gradient is the
    serial one exactly."""
    args = (rng.standard_normal((29, 6)), rng.standard_normal(29), np.zeros((29, 6)))
    par, ser, psrc, ssrc = _serial_and_parallel(p_rows, args)
    (deco, name, params), = _row_functions(psrc)
    assert deco == "@numba.njit(error_model='numpy', no_cfunc_wrapper=True)", psrc
    assert params.split(", ")[0] == "i" and "adj_x" in params and "adj_w" in params
    lines = [ln.strip() for ln in psrc.splitlines()]
    at = lines.index("for i in numba.prange(0, t2):")
    assert lines[at + 1] == f"{name}({params})", psrc
    assert not _row_functions(ssrc) and "numba" not in ssrc
    ir_text = par.show_stage("adjoint-ir", *args)      # the IR shows the function too
    assert f".helper: @numba.njit(error_model='numpy', no_cfunc_wrapper=True)" in ir_text
    assert f"Function(name='{name}'" in ir_text and f"Call(text='{name}(i, " in ir_text
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    gp, gs = _both_adjoints(par, ser, args)
    for a, b in zip(gp, gs):
        np.testing.assert_array_equal(a, b)
    fast = kadj.differentiate(p_rows_fast)
    (deco, _, _), = _row_functions(fast.adjoint_source(*args))
    assert deco == "@numba.njit(error_model='numpy', fastmath=True, no_cfunc_wrapper=True)"
    # (the difference quotient of a sum of 174 terms of size ~1 carries ~1e-8 of
    # rounding at this step: an element near zero needs that much absolute tolerance)
    fd_check(fast, args, rtol=1e-6, atol=5e-8)


def test_parallel_body_with_a_reduction_returns_its_sums():
    """adj_a is summed over the threads: the row function sums its part from zero (a
    sum that vectorises in its inner loop) and returns it; the loop adds it, and numba
    adds the threads' partial sums."""
    args = (rng.standard_normal((23, 7)), 0.8, np.zeros((23, 7)))
    par, ser, psrc, _ = _serial_and_parallel(p_rows_scaled, args)
    (_deco, name, params), = _row_functions(psrc)
    assert "adj_a" not in params.split(", "), psrc
    lines = [ln.strip() for ln in psrc.splitlines()]
    assert f"adj_a += {name}({params})" in lines, psrc
    assert "return adj_a" in lines and "adj_a = 0.0" in lines, psrc
    assert "adj_a = _sum_add(adj_a, " in psrc, psrc
    assert "(summed over the threads: adj_a)" in psrc
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    gp, gs = _both_adjoints(par, ser, args)
    for a, b in zip(gp, gs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_parallel_body_with_two_sums_returns_both():
    args = (rng.standard_normal((19, 6)), 0.8, -0.3, np.zeros((19, 6)))
    par, ser, psrc, _ = _serial_and_parallel(p_rows_two_scalars, args)
    (_deco, name, params), = _row_functions(psrc)
    lines = [ln.strip() for ln in psrc.splitlines()]
    at = lines.index(f"_sums = {name}({params})")
    assert sorted(lines[at + 1:at + 3]) == ["adj_a += _sums[0]", "adj_b += _sums[1]"] or \
        sorted(lines[at + 1:at + 3]) == ["adj_a += _sums[1]", "adj_b += _sums[0]"], psrc
    assert "return adj_" in psrc
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    gp, gs = _both_adjoints(par, ser, args)
    for a, b in zip(gp, gs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


@njit(parallel=True)
def p_two_row_loops(x, w, out, out2):
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = math.sin(x[i, j]) * w[i]
    for i in prange(x.shape[0]):
        for k in range(x.shape[1]):
            out2[i, k] = math.cos(x[i, k]) * w[i] + x[i, k]


@njit(parallel=True)
def p_two_row_loops_same_j(x, w, out, out2):
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = math.sin(x[i, j]) * w[i]
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            out2[i, j] = math.cos(x[i, j]) * w[i] + x[i, j]


def test_two_row_loops_with_the_same_inner_counter_both_run_in_parallel():
    """The second reversed loop assigns j (its inner counter) before reading it, so
    the first one's j, private to its iterations, is not read after it: both loops
    run in parallel."""
    args = (rng.standard_normal((13, 4)), rng.standard_normal(13), np.zeros((13, 4)),
            np.zeros((13, 4)))
    par, ser, psrc, _ = _serial_and_parallel(p_two_row_loops_same_j, args)
    assert [name for _, name, _ in _row_functions(psrc)] == ["_row1", "_row2"], psrc
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    gp, gs = _both_adjoints(par, ser, args)
    for a, b in zip(gp, gs):
        np.testing.assert_array_equal(a, b)


def test_two_parallel_loops_get_a_function_each():
    """Each parallel loop holding a loop becomes its own function, each passed only
    what its body reads from the adjoint (a name the other body assigns is not)."""
    args = (rng.standard_normal((17, 5)), rng.standard_normal(17), np.zeros((17, 5)),
            np.zeros((17, 5)))
    par, ser, psrc, _ = _serial_and_parallel(p_two_row_loops, args)
    rows = _row_functions(psrc)
    assert [name for _, name, _ in rows] == ["_row1", "_row2"], psrc
    for _, name, params in rows:    # the inner loops' counters are the functions' own
        assert "j" not in params.split(", ") and "k" not in params.split(", "), psrc
    fd_check(par, args, rtol=1e-6, atol=1e-8)
    gp, gs = _both_adjoints(par, ser, args)
    for a, b in zip(gp, gs):
        np.testing.assert_array_equal(a, b)


@njit
def sum_added_twice(x, y):
    """The reversed j loop adds three contributions to x[0, i] (fixed in the loop): a
    sum over the threads updated in three statements, which numba refuses in a prange
    body; its zero is set inside the i loop, so the body is not moved into a function
    that returns its sums."""
    n = x.shape[0]
    for t in range(2):
        for i in range(n):
            for j in range(1, n - 2):
                y[0, j] = 0.5 * (x[0, i] * x[0, i] + x[0, j] * x[0, i])


def test_a_sum_updated_twice_keeps_its_loop_serial():
    """(It raised numba's "Use of reduction variable ... other than in a supported
    reduction function" when the adjoint was compiled.)"""
    k = kadj.differentiate(sum_added_twice, parallel=True)
    args = (rng.uniform(-1, 1, (5, 5)), np.zeros((5, 5)))
    src = k.adjoint_source(*args)
    assert "numba refuses a sum over the threads updated twice" in src
    for n in (3, 4, 6):
        fd_check(k, (rng.uniform(-1, 1, (n, n)), np.zeros((n, n))))


def test_a_value_defined_under_a_test_is_defined_under_the_same_test():
    from kadj import adj_ir as A
    from kadj.parallel import _read_before_defined

    def body(between):
        return [A.Assign("t6", "r > 1.0"),
                A.If("t6", [A.Assign("t8", "1.0 / r")]),
                *between,
                A.If("t6", [A.Assign("u", "t8 * 2.0")], [A.Assign("u", "r")])]
    assert _read_before_defined(body([]), {"t8"}, set()) == set()
    # the test's variable assigned in between: the second test may go the other way
    assert _read_before_defined(body([A.Assign("t6", "r > 2.0")]), {"t8"}, set()) == \
        {"t8"}
    assert _read_before_defined(
        body([A.For("k", "range(3)", [A.Assign("t6", "k > 1")])]), {"t8"}, set()) == \
        {"t8"}
    # the else arm of the same test does not have it
    other = [A.Assign("t6", "r > 1.0"), A.If("t6", [A.Assign("t8", "1.0 / r")]),
             A.If("t6", [A.Assign("u", "r")], [A.Assign("u", "t8")])]
    assert _read_before_defined(other, {"t8"}, set()) == {"t8"}


@njit(parallel=True)
def p_guarded_in_and_out(x, w, y, z, a, b):
    # the strong-zero guards of 1 / (1 + b * b) and of log (x if c else y) occur in
    # the row functions' bodies and outside them: no parameter named 'if' or 'else'
    for i in prange(0, x.shape[0]):
        y[i] = 0.5 * y[i] + y[i] / (1.0 + b * b)
    for i in prange(0, x.shape[0]):
        if z[i] < 0.3:
            z[i] = math.tanh(math.exp(0.5 * math.tanh(0.5 * a + x[i]))) * 1.5
        elif x[i] > 0.3:
            z[i] = math.sin(y[i])
        else:
            z[i] = math.log(1.0 + (0.73 + x[i]) * (0.73 + x[i]))


def test_words_of_a_conditional_expression_are_no_parameters():
    args = (rng.random(9), rng.random(9), rng.random(9), rng.random(9), 0.3, 0.4)
    k = kadj.differentiate(p_guarded_in_and_out)
    src = k.adjoint_source(*args)
    assert is_parallel_source(src) and "def _row" in src
    fd_check(k, args, rtol=1e-6, atol=1e-8)
