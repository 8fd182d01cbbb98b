"""Loops asked to run in parallel whose iterations record values (kadj.iteration_slots):
each iteration stores its values at its own row of the tape and its reversed iteration
loads them there, so both the forward sweep's loop and the reversed one may run as
numba.prange.  Gradients against float64 finite differences (bounds-checked adjoints)
at sizes from 0 up, and bit for bit against the serial adjoint (parallel=False), whose
stack form is unchanged.

Each kernel's iteration first halves its element where ``x[i] > 0.5``: what the
iteration then reads of ``y[i]`` is the element as the iteration left it, which the
reverse finds only on the tape.  (Without that, each iteration would read what ``y[i]``
held on entry, which the adjoint reads from the user's array: nothing recorded.)"""
import math

import numpy as np
import pytest
from numba import njit, prange

import kadj
from kadj.testing import check_grad


@njit(parallel=True)
def sin_in_place(x, y):
    # t = y[i] is read before the iteration overwrites y[i]; the test of y[i] after
    for i in prange(x.shape[0]):
        if x[i] > 0.5:
            y[i] = y[i] * 0.5
        t = y[i]
        y[i] = np.sin(t) * x[i]
        if y[i] > 0:
            y[i] = y[i] * 2.0


@njit(parallel=True)
def weight_by_sign(x, y):
    # the constants chosen by a test on the element the iteration overwrites
    for i in prange(x.shape[0]):
        if x[i] > 0.5:
            y[i] = y[i] * 0.5
        if y[i] > 0:
            w = 0.5
        else:
            w = 1.3
        y[i] = w * x[i]


@njit(parallel=True)
def from_one(x, y):
    # a loop from 1: row i - 1 of the tape; the reverse adds into adj_x[i - 1] and
    # runs in parts (kadj.thread_parts: that loop and the one adding the parts'
    # copies), the forward sweep's loop runs in parallel
    for i in prange(1, x.shape[0]):
        if x[i] > 0.5:
            y[i] = y[i] * 0.5
        if y[i] > 0:
            w = 0.5
        else:
            w = 1.3
        y[i] = w * x[i] * x[i - 1]


@njit
def plain_loop(x, y, a):
    # a plain for loop: parallel only with differentiate(..., parallel=True)
    for i in range(x.shape[0]):
        if x[i] > 0.5:
            y[i] = y[i] * 0.5
        t = y[i] * a
        y[i] = math.tanh(t) + x[i]


@njit(parallel=True)
def saved_twice(x, y):
    # t is assigned twice in an iteration: its first value is saved inside the
    # iteration, at its own place in the row
    for i in prange(x.shape[0]):
        if x[i] > 0.5:
            y[i] = y[i] * 0.5
        t = y[i] * x[i]
        y[i] = np.sin(t)
        t = y[i] * y[i]
        y[i] = np.cos(t) * x[i]


@njit(parallel=True)
def inner_steps(x, y, dt):
    # an inner loop records at every step: the iteration's count of values is not
    # one row's, which keeps the stack form (serial, exact)
    for i in prange(x.shape[0]):
        if x[i] > 0.5:
            y[i] = y[i] * 0.5
        v = y[i]
        for k in range(3):
            v = v + dt * math.sin(v) * x[i]
        y[i] = v


def _prange_loops(src):
    return sum(1 for ln in src.splitlines()
               if ln.strip().startswith("for ") and "numba.prange(" in ln)


def _args(kernel, n, rng):
    args = [rng.uniform(-1.0, 1.0, n) + 0.05, rng.uniform(-1.0, 1.0, n) + 0.05]
    if kernel in (plain_loop, inner_steps):
        args.append(0.7 if kernel is plain_loop else 0.1)
    return tuple(args)


def _buffers(k, args, seed):
    plan = k.adjoint_plan(*args)
    r = np.random.default_rng(seed)
    bufs = [r.standard_normal(args[i].shape) if isinstance(args[i], np.ndarray)
            else np.zeros(1) for i in plan.adjoint_args]
    k.adjoint(*[a.copy() if isinstance(a, np.ndarray) else a for a in args], *bufs)
    return bufs


CASES = [(sin_in_place, {}, 2), (weight_by_sign, {}, 2), (from_one, {}, 3),
         (plain_loop, {"parallel": True}, 2), (saved_twice, {}, 2)]


@pytest.mark.parametrize("kernel, opts, parallel_loops", CASES,
                         ids=[c[0].__name__ for c in CASES])
def test_recorded_values_in_rows_of_the_tape(kernel, opts, parallel_loops):
    rng = np.random.default_rng(3)
    par = kadj.differentiate(kernel, **opts)
    ser = kadj.differentiate(kernel, **{**opts, "parallel": False})
    args = _args(kernel, 50, rng)
    src = par.adjoint_source(*args)
    assert _prange_loops(src) == parallel_loops, src
    assert "_slots_" in src and "_sp_i64 += 1" not in src
    assert "_slots_" not in ser.adjoint_source(*args)
    for n in (1, 2, 3, 17, 200):
        check_grad(par, _args(kernel, n, rng))
    for n in (0, 5, 100_003):
        args = _args(kernel, n, rng)
        for a, b, arg in zip(_buffers(par, args, n), _buffers(ser, args, n), args):
            if isinstance(arg, np.ndarray) and "_thread_parts(" not in src:
                np.testing.assert_array_equal(a, b)
            else:   # a sum over the threads, or over parts: equal to rounding
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_an_inner_loop_that_records_keeps_the_stack():
    rng = np.random.default_rng(5)
    par = kadj.differentiate(inner_steps)
    args = _args(inner_steps, 30, rng)
    src = par.adjoint_source(*args)
    assert "_slots_" not in src and _prange_loops(src) == 0
    for n in (1, 2, 40):
        check_grad(par, _args(inner_steps, n, rng))


def test_the_users_arrays_are_left_alone():
    rng = np.random.default_rng(9)
    par = kadj.differentiate(sin_in_place)
    x, y = _args(sin_in_place, 1000, rng)
    x0, y0 = x.copy(), y.copy()
    gx, gy = np.zeros_like(x), rng.standard_normal(1000)
    par.adjoint(x, y, gx, gy)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)


# ---- a prange loop nested in a time loop ---------------------------------------------------
@njit(parallel=True)
def steps_in_place(x, y, steps):
    # each step's iteration records v and the element it overwrites: rows per step
    for t in range(steps):
        for i in prange(y.shape[0]):
            v = math.sin(y[i])
            y[i] = v * x[i] + 0.1 * t


@njit(parallel=True)
def steps_with_flag(x, y, steps):
    # a flag decided by the element each step overwrites, and a loss summed after
    # every step (serial: the outer loop's own work between the runs)
    total = 0.0
    for t in range(steps):
        for i in prange(1, y.shape[0]):
            if y[i] > 0.0:
                w = 0.9
            else:
                w = 1.2
            y[i] = w * y[i] * x[i] + 0.5 * x[i - 1]
        total += y[0] * y[y.shape[0] - 1]
    return total


@njit(parallel=True)
def steps_growing(x, y, steps):
    # a run of t + 1 iterations at step t: its tape grows with checks, which keeps
    # the stack form (serial, exact)
    for t in range(steps):
        for i in prange(t + 1):
            v = math.sin(y[i])
            y[i] = v * x[i]


def _nested_args(n, rng, steps=3):
    return rng.uniform(-1.0, 1.0, n) + 0.05, rng.uniform(-1.0, 1.0, n) + 0.05, steps


@pytest.mark.parametrize("kernel, parallel_loops", [(steps_in_place, 2),
                                                     (steps_with_flag, 3)])
def test_a_prange_loop_in_a_time_loop_gets_rows_per_step(kernel, parallel_loops):
    rng = np.random.default_rng(13)
    par = kadj.differentiate(kernel)
    ser = kadj.differentiate(kernel, parallel=False)
    args = _nested_args(40, rng)
    src = par.adjoint_source(*args)
    # the forward sweep's loop and the reversed one (steps_with_flag's in parts, its
    # adj_x[i - 1] shared); no values saved by one iteration for the next, none left
    # after a run
    assert _prange_loops(src) == parallel_loops, src
    assert "_slots_" in src and "its last iteration's values" not in src
    if kernel is steps_in_place:    # (steps_with_flag's time loop saves y[0], y[-1])
        assert "_tape_f64[_sp_f64] =" not in src
    for n, steps in ((1, 2), (2, 1), (3, 4), (17, 3), (200, 2), (5, 0)):
        check_grad(par, _nested_args(n, rng, steps))
    for n in (1, 2, 50_001):     # (steps_with_flag reads y[0])
        args = _nested_args(n, rng, 3)
        for a, b in zip(_buffers(par, args, n), _buffers(ser, args, n)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_a_nested_run_whose_length_changes_keeps_the_stack():
    rng = np.random.default_rng(17)
    par = kadj.differentiate(steps_growing)
    args = _nested_args(12, rng, 5)
    src = par.adjoint_source(*args)
    assert "_slots_" not in src and _prange_loops(src) == 0
    for steps in (0, 1, 4, 12):
        check_grad(par, _nested_args(12, rng, steps))
