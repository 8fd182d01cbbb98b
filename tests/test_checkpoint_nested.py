"""A loop nested in a loop reversed from checkpoints reads values of the outer
iteration that the iteration overwrites after it.

The reverse sweep replays the inner loop (from its own checkpoints) after the reverse
of the statements that follow it in the outer iteration, so what it reads from
outside must be restored to its version before the inner loop (a regression: the
outer state ``y``, overwritten after the inner loop, was read at its new value and
the gradient was off by a few percent, without an error).  Each kernel is checked
with and without checkpoints against float64 central differences (tests/fdcheck.py).
"""
import math

import numpy as np
import pytest
from numba import njit

import kadj
from fdcheck import fd_check


@njit
def inner_reads_state(x, out, dt):
    for i in range(x.shape[0]):
        y = x[i]
        for t in range(4):
            ys = y
            acc = 0.0
            for s in range(3):
                ks = math.sin(ys) - 0.3 * ys
                acc += ks
                ys = y + 0.5 * dt * ks      # the inner loop reads y ...
            y = y + dt * acc / 4.0          # ... which the iteration overwrites after it
        out[i] = y


@njit
def inner_while_reads_state(x, out, dt):
    for i in range(x.shape[0]):
        y = x[i]
        for t in range(4):
            ys = y
            acc = 0.0
            s = 0
            while s < 3:
                ks = math.sin(ys) - 0.3 * ys
                acc += ks
                ys = y + 0.5 * dt * ks
                s += 1
            y = y + dt * acc / 4.0
        out[i] = y


@njit
def inner_reads_value_written_after(x, out, dt):
    for i in range(x.shape[0]):
        y = x[i]
        g = 0.5
        for t in range(4):
            acc = 0.0
            ys = y
            for s in range(3):
                ks = math.sin(ys * g)       # g: assigned after the inner loop
                acc += ks
                ys = y + dt * ks
            g = 0.3 + 0.1 * g
            y = y + dt * acc
        out[i] = y


@njit
def inner_reads_array_element(x, c, out, dt):
    for i in range(x.shape[0]):
        for t in range(4):
            ys = c[0]
            acc = 0.0
            for s in range(3):
                ks = math.sin(ys) - 0.3 * ys
                acc += ks
                ys = c[0] + 0.5 * dt * ks   # an element the iteration rewrites after
            c[0] = c[0] + dt * acc / 4.0 + x[i]
        out[i] = c[0]


def _args(name):
    x = np.random.default_rng(5).uniform(-1.0, 1.0, 4)
    if name == "inner_reads_array_element":
        return (x * 0.1, np.array([0.4]), np.zeros(4), 0.2)
    return (x, np.zeros(4), 0.2)


KERNELS = {k.__name__: k for k in (inner_reads_state, inner_while_reads_state,
                                   inner_reads_value_written_after,
                                   inner_reads_array_element)}


@pytest.mark.parametrize("checkpoints", [None, pytest.param(1, marks=pytest.mark.slow), 2,
                                         pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", list(KERNELS))
def test_nested_replay_reads_outer_values(name, checkpoints):
    k = kadj.differentiate(KERNELS[name], checkpoints=checkpoints)
    fd_check(k, _args(name))


@njit
def while_in_recorded_loop(x, y, a):
    """A while loop reversed from checkpoints inside a loop that is recorded, not
    replayed (``y[i]`` read in the loop and overwritten after it): each outer iteration's
    trip count is recorded after its while loop (a regression: the reverse used the
    last iteration's count for every iteration, a wrong gradient without an error)."""
    c = 0.5
    for i in range(x.shape[0]):
        w = 0
        while w < 3 and c < 4.0:
            c = c + 0.5 * math.tanh(x[i - 1] + y[i]) + 0.6
            w += 1
        y[i] = y[i] * 0.5 + max(a, c)


@pytest.mark.parametrize("checkpoints", [None, 1, 2, 3])
def test_while_trip_counts_in_a_recorded_loop(checkpoints):
    k = kadj.differentiate(while_in_recorded_loop, checkpoints=checkpoints)
    assert "reversed from checkpoints" in k.adjoint_source(
        np.zeros(3), np.zeros(3), 0.6) or checkpoints is None
    for n in (1, 2, 3, 5, 9, 40):
        for seed in range(3):
            g = np.random.default_rng(100 * n + seed)
            fd_check(k, (g.uniform(-1, 1, n), g.uniform(-1, 1, n), 0.6))


@njit
def while_reads_iteration_value(x, a):
    """The while loop, replayed from checkpoints in the reverse sweep, reads ``s``,
    which each iteration of the recorded loop around it assigns: ``s`` is recorded per
    iteration (a regression: it was saved once around the loop, as if only read after
    it, and every replay read the last iteration's ``s``)."""
    c = 0.5
    s = 0.0
    for i in range(1, x.shape[0]):
        x[i] += x[i - 1]
        s = x[i]
        while c < 4.0:
            c = c + 0.5 * math.tanh(a + s) + 0.6
    return s + c


@pytest.mark.parametrize("checkpoints", [None, 2])
def test_while_replay_reads_values_of_its_iteration(checkpoints):
    k = kadj.differentiate(while_reads_iteration_value, checkpoints=checkpoints)
    for n in (1, 2, 3, 5, 9, 40):
        for seed in range(3):
            g = np.random.default_rng(100 * n + seed)
            fd_check(k, (g.uniform(-1, 1, n), 0.6))


@njit
def exit_reads_recomputed_value(x, y):
    """The inner loop, left by ``break`` and replayed from checkpoints in the reverse
    sweep, reads ``u = x[i]``, which the reverse of each outer iteration recomputes
    rather than records: the recomputation is emitted for what the replay reads (a
    regression: it was not, and every replay read the last iteration's ``u``)."""
    for i in range(x.shape[0]):
        u = x[i]
        v = y[i]
        w = u
        for k in range(3):
            if w > 0.8:
                break
            w = w + u / (1.5 + v * w * v * w)
        y[i] = w


@njit
def _settle(u, v):
    w = u
    for k in range(3):
        if w > 0.8:
            return w
        w = w + u / (1.5 + v * w * v * w)
    return w


@njit
def exit_in_a_helper(x, y):
    for i in range(x.shape[0]):
        y[i] = _settle(x[i], y[i])


@pytest.mark.parametrize("checkpoints", [None, 1, 2])
@pytest.mark.parametrize("fn", [exit_reads_recomputed_value, exit_in_a_helper])
def test_replay_reads_recomputed_values_of_its_iteration(fn, checkpoints):
    k = kadj.differentiate(fn, checkpoints=checkpoints)
    for n in (1, 2, 3, 5, 9, 40):
        for seed in range(3):
            g = np.random.default_rng(100 * n + seed)
            fd_check(k, (g.uniform(-1, 1, n), g.uniform(-1, 1, n)))
