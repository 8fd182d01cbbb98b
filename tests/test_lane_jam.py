"""Replayed iterations run side by side on the CPU (kadj/lane_jam.py).

- kernels whose replayed loop qualifies (Horner's polynomial, a per-element
  recurrence with a scalar parameter summed across iterations, a branch on the inner
  counter that all lanes take alike, two inner loops with a value saved between them,
  a value saved from the inner loop's previous step (``if k > 0``) with its adjoint
  reset at the end of every reversed step)
  get the jammed loop and pass float64 finite-difference checks at trip counts around the
  lane counts, four and eight (0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17: no jammed iteration,
  only jammed ones, both),
  with inner loops of zero and one trip, and at sizes whose tape is larger than any
  earlier call's;
- neighbouring kernels (a branch per element, two inner loops, an output sum read by
  every iteration; not jammed today: not a replayed loop of the form above) pass the
  same checks whichever loop they get;
- kernels whose iteration order matters or that leave a loop early (an inner ``break``,
  an element every iteration overwrites) keep the plain loop and pass the same checks;
- the jammed adjoint gives the same gradients as the plain one on a larger problem
  (up to the rounding of the reordered sums).
"""
import math

import numpy as np
import pytest
from numba import njit

import kadj
import kadj.targets.cpu as cpu
from fdcheck import fd_check

JAMMED = "at a time, side by side"
SIZES = [0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17]


@njit
def horner(coeffs, x, y):
    k = coeffs.shape[0]
    for i in range(x.shape[0]):
        xi = x[i]
        p = coeffs[k - 1]
        for j in range(k - 2, -1, -1):
            p = p * xi + coeffs[j]
        y[i] = p


@njit
def recurrence(x0, a, b, y, steps):
    for i in range(x0.shape[0]):
        x = x0[i]
        for t in range(steps):
            x = x * a[i] + b
        y[i] = x


@njit
def alternating(x, a, b, y, steps):
    for i in range(x.shape[0]):
        v = x[i]
        for t in range(steps):
            if t % 2 == 0:          # the same way for every element: one branch, all lanes
                v = v * a + b
            else:
                v = v * 0.9 - 0.1
        y[i] = v


@njit
def two_loops(x, w, y):
    for i in range(x.shape[0]):
        v = x[i]
        for j in range(w.shape[0]):
            v = v * w[j] + 0.3
        u = v * v
        for j in range(w.shape[0] - 1, -1, -1):
            u = u * w[j] - v
        v = u * v + v               # a value saved outside the loops
        y[i] = v * u


@njit
def branchy(x, c, y):
    for i in range(x.shape[0]):
        v = x[i]
        for t in range(3):
            if v > 0.0:
                v = v * c + 0.5 * v * v
            else:
                v = v * c - 0.25
        y[i] = v


@njit
def two_inner(x, w, y):
    n = w.shape[0]
    for i in range(x.shape[0]):
        s = x[i]
        for j in range(n):
            s = s * w[j] + 0.1 * s * s
        for j in range(n):
            s = s + w[j] * s
        y[i] = s


@njit
def summed_out(x, w, out):
    for i in range(x.shape[0]):
        s = x[i]
        for j in range(w.shape[0]):
            s = s * w[j] + s * s * 0.05
        out[0] += s


@njit
def early_exit(x, w, y):
    for i in range(x.shape[0]):
        s = x[i]
        for j in range(w.shape[0]):
            s = s * w[j] + 0.1
            if s > 2.0:
                break
        y[i] = s


@njit
def shared_last(x, w, y, last):
    for i in range(x.shape[0]):
        s = x[i]
        for j in range(w.shape[0]):
            s = s * w[j] + 0.1 * s
        y[i] = s
        last[0] = s * s


def _rng(n):
    return np.random.default_rng(100 + n)


def _check(fn, args, jammed):
    k = kadj.differentiate(fn)
    src = k.adjoint_source(*args)
    fd_check(k, args)
    if jammed is not None:
        assert (JAMMED in src) == jammed, src


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("ncoef", [1, 2, 5])
def test_horner(n, ncoef):
    r = _rng(n)
    _check(horner, (r.standard_normal(ncoef) / 2, r.uniform(-1, 1, n), np.zeros(n)), True)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("steps", [0, 1, 6])
def test_recurrence(n, steps):
    r = _rng(n)
    _check(recurrence, (r.standard_normal(n), r.uniform(0.5, 0.95, n), 0.3, np.zeros(n),
                        steps), True)


@pytest.mark.parametrize("n", [0, 1, 4, 7, 9, 17])
@pytest.mark.parametrize("steps", [0, 1, 5])
def test_branch_the_same_for_every_lane(n, steps):
    """The tape under a branch that every lane takes alike (stack pointer moved by all
    lanes at once)."""
    r = _rng(n)
    _check(alternating, (r.uniform(-0.5, 0.5, n), 0.7, 0.2, np.zeros(n), steps), True)


@pytest.mark.parametrize("n", [0, 1, 5, 8, 9, 16, 17])
@pytest.mark.parametrize("m", [0, 1, 3])
def test_tape_addresses_of_two_loops_and_a_saved_value(n, m):
    """Addresses from loop counters (kadj/lane_tape.py): two loops of pushes, one in
    descending order, and a push between them."""
    r = _rng(n)
    _check(two_loops, (r.uniform(-0.5, 0.5, n), r.uniform(0.5, 0.9, m), np.zeros(n)), True)


@njit
def lagged(x, w, c, y):
    """``t = tanh(v)`` is saved at the top of the next step (``if k > 0``) and its
    adjoint is reset to zero at the end of every reversed step."""
    for i in range(x.shape[0]):
        v = x[i]
        for k in range(c.shape[0]):
            v = math.tanh(v) * c[k] + w[i]
        y[i] = v * x[i]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("m", [0, 1, 4])
def test_value_saved_from_the_previous_step_and_adjoint_reset_in_the_step(n, m):
    r = _rng(n)
    _check(lagged, (r.uniform(-1, 1, n), r.uniform(-1, 1, n), r.uniform(-1, 1, m),
                    np.zeros(n)), True)


@pytest.mark.parametrize("n", [0, 5, 9])
def test_branch_per_element(n):
    r = _rng(n)
    x = r.uniform(0.2, 1.0, n) * np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    _check(branchy, (x, 0.7, np.zeros(n)), None)


@pytest.mark.parametrize("n", [0, 4, 7])
@pytest.mark.parametrize("m", [0, 1, 3])
def test_two_inner_loops_ascending(n, m):
    r = _rng(n)
    _check(two_inner, (r.uniform(-0.5, 0.5, n), r.uniform(0.3, 0.8, m), np.zeros(n)), None)


@pytest.mark.parametrize("n", [1, 6])
def test_output_sum_read_by_every_iteration(n):
    r = _rng(n)
    _check(summed_out, (r.uniform(-0.5, 0.5, n), r.uniform(0.3, 0.8, 3), np.zeros(1)), None)


def test_growing_tape():
    """Larger inner trip counts after smaller ones: the tape is sized per call."""
    k = kadj.differentiate(recurrence)
    for steps in (2, 40, 7):
        r = _rng(steps)
        args = (r.standard_normal(6), r.uniform(0.5, 0.95, 6), 0.3, np.zeros(6), steps)
        assert JAMMED in k.adjoint_source(*args)
        fd_check(k, args)


@pytest.mark.parametrize("n", [3, 9])
def test_early_exit_keeps_the_plain_loop(n):
    r = _rng(n)
    _check(early_exit, (r.uniform(0.1, 1.0, n), r.uniform(0.8, 1.6, 4), np.zeros(n)), False)


@pytest.mark.parametrize("n", [3, 9])
def test_order_dependent_element_keeps_the_plain_loop(n):
    r = _rng(n)
    _check(shared_last, (r.uniform(-0.5, 0.5, n), r.uniform(0.3, 0.8, 3), np.zeros(n),
                         np.zeros(1)), False)


def test_same_gradients_as_the_plain_loop(monkeypatch, tmp_path):
    r = np.random.default_rng(7)
    n = 1003
    args = (r.standard_normal(n), r.uniform(0.5, 0.95, n), 0.3, np.zeros(n), 17)
    seeds = [np.zeros(n), np.zeros(n), np.zeros(1), r.standard_normal(n)]

    def grads():
        k = kadj.differentiate(recurrence)
        bufs = [s.copy() for s in seeds]
        k.adjoint(*args, *bufs)
        return k.adjoint_source(*args), bufs

    src, jammed = grads()
    monkeypatch.setenv("KADJ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu, "jam_replayed", lambda fn: 0)
    src_plain, plain = grads()
    assert JAMMED in src and JAMMED not in src_plain
    for a, b in zip(jammed, plain):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_a_value_left_by_a_loop_counts_only_for_a_loop_over_the_same_counters():
    """kadj.lane_check: ``t``, assigned in every step of a loop over ``range(0, m)``, is
    defined in the reverse loop ``range(m - 1, -1, -1)`` after it, unless ``m`` changes
    in between (the second loop may then run where the first did not)."""
    from kadj import adj_ir as A
    from kadj.lane_check import _exposed

    def seq(between):
        return [A.Block("replayed iteration", [
                    A.Assign("m", "c.shape[0]"),
                    A.For("k", "range(0, m, 1)", [A.Assign("t", "x[k] * 2.0")])]),
                *between,
                A.For("k", "range(m - 1, -1, -1)", [A.Assign("y", "t + 1.0")])]

    assert _exposed(seq([]), "t", False)[0] is False
    assert _exposed(seq([A.Assign("m", "m + 1")]), "t", False)[0] is True
    assert _exposed(seq([A.If("q > 0", [A.Assign("m", "m + 1")])]), "t", False)[0] is True


def test_eight_lanes_where_the_iteration_keeps_few_values():
    """Eight iterations side by side where an iteration keeps at most four values of its
    own (Horner: x[i], p and their adjoints), four where it keeps more (two_loops: v, u
    and the inner loops' values); the same on every machine."""
    from kadj.lane_jam import FEW_VALUES, LANES, WIDE
    assert (LANES, WIDE, FEW_VALUES) == (4, 8, 4)
    r = _rng(3)
    wide = kadj.differentiate(horner).adjoint_source(
        r.standard_normal(5), r.uniform(-1, 1, 9), np.zeros(9))
    assert "iterations 8 at a time" in wide and "xi_l7" in wide, wide
    assert "_tape_f64 = _kept_array(_keep_bytes, 8 * " in wide, wide
    narrow = kadj.differentiate(two_loops).adjoint_source(
        r.uniform(-0.5, 0.5, 9), r.uniform(0.5, 0.9, 3), np.zeros(9))
    assert "iterations 4 at a time" in narrow and "_l4" not in narrow, narrow


@pytest.mark.parametrize("n", [15, 16, 17, 203])
def test_eight_lanes_bounds_checked(n):
    """The eight-lane loop and its remainder, the adjoint run with numba's bounds
    checking (kadj.testing.check_grad), at sizes whose tape is reused many times."""
    from kadj.testing import check_grad
    r = _rng(n)
    k = kadj.differentiate(horner)
    args = (r.standard_normal(5) / 2, r.uniform(-1, 1, n), np.zeros(n))
    assert "iterations 8 at a time" in k.adjoint_source(*args)
    check_grad(k, args)
