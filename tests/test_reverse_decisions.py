"""Tests the reverse sweep re-decides only to restore what the forward saved inside
them: an ``if`` whose branch overwrites a value the adjoint reads later (a step size,
a counter, a running state that carries no derivative), and the entry tests of a
``while`` loop without derivatives, around which its state is saved once.  The
condition changes from one iteration to the next, so the reverse sweep must decide
with each iteration's own value, recomputed or restored (a regression: it used the
last iteration's, skipped restores, and read the tape out of step: wrong gradients
without an error).  An ``if`` whose arms only set constants the adjoint reads, on a
test of an element the iteration overwrites afterwards (``if y[i] > 0: w = 0.5``, then
``y[i] = w * x[i]``), is recomputed in reverse from the test's value of that iteration,
recorded (a regression: the test was saved once around the loop, and every iteration
was reversed with the last one's outcome).  Checked against float64 central differences at sizes 1..40, with
and without checkpoints."""
import math

import numpy as np
import pytest
from numba import njit

import kadj
from kadj.testing import check_grad


@njit
def damped_when_positive(x, y):
    c = 1.0
    for i in range(x.shape[0]):
        if x[i] > 0.0:                 # recomputable: x is never written
            c = c * 0.9 + 0.1          # no derivative, read by the next statement
        y[i] = y[i] * x[i] * c


@njit
def damped_in_else(x, y):
    c = 1.0
    for i in range(x.shape[0]):
        if x[i] > 0.0:
            y[i] = y[i] * 2.0
        else:
            c = c * 0.8 + 0.3
        y[i] = y[i] * x[i] * c


@njit
def capped_counter(x, y):
    c = 0.0
    for i in range(x.shape[0]):
        if c < 2.0:                     # reads the state itself
            c += 0.7
        y[i] = math.sin(x[i]) * c + y[i] * c


@njit
def rows_with_state(x, y):
    c = 1.0
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            if x[i, j] > 0.2:
                c = c * 0.95
            y[i, j] = x[i, j] * x[i, j] * c


@njit
def inactive_while_in_loop(x, y):
    s = 0.0
    c = 0.5
    for i in range(x.shape[0]):
        s += 0.5 + y[i]
        w = 0
        while w < 3 and c < 4.0:        # saved once around; its entry tests change
            c = c + 0.7
            w += 1
        y[i] += x[i] * (c * s)


@njit
def inactive_while_after_branch(x, y):
    c = 0.5
    for i in range(x.shape[0]):
        if x[i] > 0.0:
            w = 0
            while w < 2 and c < 3.0:
                c = c + 0.45
                w += 1
        y[i] = y[i] * 0.8 + x[i] * c


@njit
def counted_factor(x, y):
    cnt = 0
    for i in range(x.shape[0]):
        if x[i] > 0.0:
            cnt += 1                    # an integer counter
        y[i] = y[i] * (cnt + 1) + x[i] * cnt


@njit
def last_positive_index(x, y):
    k = 0
    for i in range(x.shape[0]):
        y[i] = y[i] * x[k]              # an index the test moves
        if x[i] > 0.0:
            k = i


@njit
def adaptive_step(x, y):
    h = 0.1
    s = 0.0
    for i in range(x.shape[0]):
        s = s + h * x[i] * s + x[i]
        if abs(s) > 1.0:
            h = h * 0.5
        else:
            h = min(h * 1.5, 0.2)
        y[i] = s * h
    return s


@njit
def constant_arms_on_overwritten(x, y):
    for i in range(x.shape[0]):
        if y[i] > 0.0:
            w = 0.5
        else:
            w = 1.3
        y[i] = w * x[i]


@njit
def _pick(u, v):
    if u > v:
        w = 0.5
    else:
        w = 1.3
    return w * u


@njit
def constant_arms_in_a_helper(x, y):
    for i in range(x.shape[0]):
        y[i] += _pick(x[i], y[i])


@njit
def offset_chosen_by_overwritten(x, y):
    n = x.shape[0]
    for i in range(n):
        if y[i] > 0.0:
            k = 1
        else:
            k = 0
        y[i] = x[i] * x[(i + k) % n]


def _vec(r, n):
    return (r.uniform(-1, 1, n), r.uniform(-1, 1, n))


CASES = {
    "damped_when_positive": (damped_when_positive, _vec),
    "damped_in_else": (damped_in_else, _vec),
    "capped_counter": (capped_counter, _vec),
    "rows_with_state": (rows_with_state,
                        lambda r, n: (r.uniform(-1, 1, (n, 3)), r.uniform(-1, 1, (n, 3)))),
    "counted_factor": (counted_factor, _vec),
    "last_positive_index": (last_positive_index, _vec),
    "adaptive_step": (adaptive_step, _vec),
    "inactive_while_in_loop": (inactive_while_in_loop, _vec),
    "inactive_while_after_branch": (inactive_while_after_branch, _vec),
    "constant_arms_on_overwritten": (constant_arms_on_overwritten, _vec),
    "constant_arms_in_a_helper": (constant_arms_in_a_helper, _vec),
    "offset_chosen_by_overwritten": (offset_chosen_by_overwritten, _vec),
}


@pytest.mark.parametrize("checkpoints", [None, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_reverse_decides_with_each_iterations_values(name, checkpoints):
    fn, make = CASES[name]
    k = kadj.differentiate(fn, checkpoints=checkpoints)
    for n in (1, 2, 3, 5, 9, 40):
        check_grad(k, make(np.random.default_rng(n), n))
