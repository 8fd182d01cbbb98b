"""A loop over rows whose iterations rewrite a shared scratch row whole before reading
it, or touch only their own row of an argument, is reversed one replayed iteration at
a time (kadj.analysis.rewrites): no recorded elements of the scratch rows or of the
rows, no whole-array tape, the forward sweep of the loop not run at all.

- The gallery's batched Thomas solve (scratch rows ``c``, ``d`` shared by the systems)
  and per-row softmax written in place (and its out-of-place twin) take that path;
  their gradients match float64 central differences at shapes from one element to
  tapes of hundreds of entries per replayed iteration (bounds-checked adjoints), and the
  adjoints leave their arguments untouched.
- Where the proof must fail the recorded path is kept, and the gradients still match:
  a scratch row read before the iteration writes it (the previous system's values), an
  element left unwritten before the first read (another iteration's value), a store
  under a condition, a scratch row used after the loop; an argument row of another
  iteration (``x[r - 1, j]``), rows touched again after the loop, a row loop inside a
  time loop (whose later runs find the rows changed), a loop from a negative row (which
  wraps around onto rows later iterations own).
"""
import math
import re

import numpy as np
import pytest
from numba import njit

import kadj
from kadj import ir
from kadj.testing import check_grad
from kernels.cpu.recurrences import (thomas_batched, thomas_batched_private,
                                     thomas_batched_shaped)
from kernels.cpu.reductions import softmax_rows, softmax_rows_inplace, softmax_rows_shaped


def _facts(kernel, args):
    return kadj.differentiate(kernel).stages(*args, until="facts")["facts"]


def _row_loop(facts):
    """The kernel's first loop at its top level."""
    return next(x for x in facts.kernel.body if isinstance(x, ir.ForRange))


def _replayed(kernel, args):
    """(is the row loop replayed, the arrays whose overwritten elements are recorded,
    the adjoint's source)."""
    f = _facts(kernel, args)
    src = kadj.differentiate(kernel).adjoint_source(*args)
    return _row_loop(f).uid in f.replay, set(f.restore_arrays), src


def _check(kernel, args):
    check_grad(kadj.differentiate(kernel), args)


# ---- the proof holds: replayed rows ---------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1), (2, 1), (3, 2), (5, 7), (3, 300), (400, 6)])
def test_thomas_batched_gradient(shape):
    _check(thomas_batched, thomas_batched_shaped(np.random.default_rng(1), *shape))


def test_thomas_batched_replays_each_system():
    replayed, restored, src = _replayed(
        thomas_batched, thomas_batched_shaped(np.random.default_rng(0), 4, 5))
    assert replayed and not restored & {"c", "d"}
    # the tape holds one system's values, allocated once before the reversed loop
    assert "save c[" not in src and "save d[" not in src and "nsys" not in \
        next(line for line in src.splitlines() if "_tape_f64 = _kept_array(" in line)
    # the forward sweep no longer runs the solves
    forward = src.split("# ---- reverse sweep ----")[0]
    assert "for s in range" not in forward


@pytest.mark.parametrize("shape", [(1, 1), (4, 1), (5, 7), (3, 200), (300, 3)])
def test_softmax_rows_inplace_gradient(shape):
    _check(softmax_rows_inplace, (softmax_rows_shaped(np.random.default_rng(2), *shape),))


@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (3, 200)])
def test_softmax_rows_gradient(shape):
    x = softmax_rows_shaped(np.random.default_rng(3), *shape)
    _check(softmax_rows, (x, np.zeros_like(x)))


def test_softmax_rows_inplace_replays_rows():
    x = softmax_rows_shaped(np.random.default_rng(0), 4, 5)
    replayed, restored, src = _replayed(softmax_rows_inplace, (x,))
    assert replayed and "x" not in restored
    assert re.search(r"x_work\[r, (_j\d+)\] = x\[r, \1\]", src)   # the row restored,
    assert "save x_work" not in src                  # ... not recorded,
    assert "x_work = _kept_like(_keep_bytes, x, " in src   # no copy of the whole argument


def test_thomas_private_scratch_keeps_recording():
    """The out-of-place twin is not replayed: its 2-D scratch rows ``c[s, i]`` are
    written and read back within system ``s`` (no later system writes row ``s``), so
    they need no restoring (kadj/analysis/memory.py, ``_own_rows``); ``d[s, i]``,
    whose values the reverse sweep never reads, is not restored either.  The
    recurrence's own values are recorded."""
    replayed, restored, src = _replayed(
        thomas_batched_private, thomas_batched_shaped(np.random.default_rng(0), 4, 5))
    assert not replayed and "c" not in restored and "d" not in restored
    assert "save c[" not in src and "save d[" not in src and "save cp" in src
    _check(thomas_batched_private, thomas_batched_shaped(np.random.default_rng(4), 5, 6))


@njit
def rows_and_scratch(a, y, w):
    """Both at once: each row's own elements of ``y`` in place, a scratch row ``t``
    rewritten whole, a scalar ``w`` read by every row."""
    nrow, n = y.shape
    t = np.empty(n)
    for r in range(nrow):
        for i in range(n):
            t[i] = math.sin(a[r, i]) * w
        acc = 0.0
        for i in range(n):
            acc += t[i] * y[r, i]
            y[r, i] = acc * t[i]


def test_rows_and_scratch_together():
    rng = np.random.default_rng(5)
    args = (rng.standard_normal((6, 5)), rng.standard_normal((6, 5)), 0.7)
    replayed, restored, _ = _replayed(rows_and_scratch, args)
    assert replayed and not restored
    _check(rows_and_scratch, args)


@njit
def normalise_rows(a, y):
    """A scratch row filled and summed in one loop (each element read right after it
    is stored), then read by the next."""
    nrow, n = a.shape
    p = np.empty(n)
    for r in range(nrow):
        s = 0.0
        for i in range(n):
            p[i] = math.exp(a[r, i])
            s += p[i]
        for i in range(n):
            y[r, i] = p[i] / s


def test_scratch_filled_and_read_in_one_loop():
    args = (_mat(9, (6, 5)), np.zeros((6, 5)))
    replayed, restored, _ = _replayed(normalise_rows, args)
    assert replayed and "p" not in restored
    _check(normalise_rows, (_mat(10, (6, 5)), np.zeros((6, 5))))


# ---- the proof fails: the recorded path is kept -----------------------------------------

@njit
def scratch_read_ahead(a, y):
    """The filling loop reads the last element before storing it: the previous row's."""
    nrow, n = a.shape
    p = np.zeros(n)
    for r in range(nrow):
        s = 0.0
        for i in range(n):
            p[i] = math.exp(a[r, i])
            s += p[i] * p[n - 1]
        for i in range(n):
            y[r, i] = p[i] * s


@njit
def scratch_read_first(a, y):
    """Each row's recurrence starts from the previous row's last value, read from the
    scratch row before this row writes it."""
    nrow, n = a.shape
    c = np.zeros(n)
    for s in range(nrow):
        prev = c[n - 1]
        for i in range(n):
            c[i] = math.sin(a[s, i]) + 0.5 * prev
            prev = c[i]
        for i in range(n):
            y[s, i] = c[i] * c[i]


@njit
def scratch_left_unwritten(a, y):
    """Element n - 1 of the scratch row is read before this row writes it: it holds
    the previous row's value."""
    nrow, n = a.shape
    c = np.zeros(n)
    for s in range(nrow):
        for i in range(n - 1):
            c[i] = a[s, i] * a[s, i]
        acc = 0.0
        for i in range(n):
            acc += math.sin(c[i])
        c[n - 1] = a[s, n - 1] * acc
        y[s, 0] = acc


@njit
def scratch_stored_if(a, y):
    """The scratch element is rewritten only where the row's entry is positive."""
    nrow, n = a.shape
    c = np.ones(n)
    for s in range(nrow):
        for i in range(n):
            if a[s, i] > 0.0:
                c[i] = a[s, i]
        for i in range(n):
            y[s, i] = c[i] * math.cos(a[s, i])


@njit
def scratch_used_after(a, y):
    """The scratch row, rewritten by each row, is read again after the loop."""
    nrow, n = a.shape
    c = np.empty(n)
    for s in range(nrow):
        for i in range(n):
            c[i] = math.exp(0.3 * a[s, i])
        for i in range(n):
            y[s, i] = c[i] * a[s, i]
    for i in range(n):
        y[0, i] += c[i] * c[i]


@njit
def rows_read_previous(x):
    """Each row is updated from the row before it (another iteration's row)."""
    n, m = x.shape
    for r in range(1, n):
        for j in range(m):
            x[r, j] = x[r, j] * math.cos(x[r - 1, j])


@njit
def rows_touched_after(x):
    """Each row scaled in place, then one element of the first row again."""
    n, m = x.shape
    for r in range(n):
        for j in range(1, m):
            x[r, j] = x[r, j] * math.sin(x[r, j - 1])
    x[0, 0] = x[0, 0] * x[0, m - 1]


@njit
def rows_in_time_loop(x, steps):
    """The row loop runs once per step: its later runs find the rows changed."""
    n, m = x.shape
    for t in range(steps):
        for r in range(n):
            for j in range(1, m):
                x[r, j] = x[r, j] + 0.5 * math.sin(x[r, j - 1])


@njit
def rows_wrapping(x):
    """Rows -2 and -1 are rows n - 2 and n - 1 again: two iterations per row."""
    n, m = x.shape
    for r in range(-2, n):
        for j in range(1, m):
            x[r, j] = x[r, j] * math.sin(x[r, j - 1]) + 0.1


def _mat(seed, shape=(5, 6)):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape)


FAILING = {
    "scratch_read_first": (scratch_read_first, lambda: (_mat(0), np.zeros((5, 6))), "c"),
    "scratch_left_unwritten": (scratch_left_unwritten,
                               lambda: (_mat(1), np.zeros((5, 6))), "c"),
    "scratch_stored_if": (scratch_stored_if, lambda: (_mat(2), np.zeros((5, 6))), "c"),
    "scratch_used_after": (scratch_used_after, lambda: (_mat(3), np.zeros((5, 6))), "c"),
    "scratch_read_ahead": (scratch_read_ahead, lambda: (_mat(8), np.zeros((5, 6))), "p"),
    "rows_read_previous": (rows_read_previous, lambda: (_mat(4),), "x"),
    "rows_touched_after": (rows_touched_after, lambda: (_mat(5),), "x"),
    "rows_wrapping": (rows_wrapping, lambda: (_mat(11),), "x"),
}


@pytest.mark.parametrize("name", sorted(FAILING))
def test_proof_fails_and_the_recorded_path_stays(name):
    kernel, make, arr = FAILING[name]  # arr: the array the proof is about
    args = make()
    replayed, restored, src = _replayed(kernel, args)
    assert not replayed, src
    assert not re.search(rf"{arr}_work\[r, _j\d+\] = {arr}\[r", src)
    _check(kernel, make())


def test_row_loop_in_a_time_loop_is_not_replayed():
    args = (_mat(6, (4, 5)), 3)
    f = _facts(rows_in_time_loop, args)
    time_loop = _row_loop(f)
    rows = next(x for x in time_loop.body if isinstance(x, ir.ForRange))
    assert rows.uid not in f.replay and time_loop.uid not in f.replay
    _check(rows_in_time_loop, args)


@pytest.mark.parametrize("shape", [(1, 1), (6, 9)])
def test_adjoint_leaves_arguments_untouched(shape):
    x = softmax_rows_shaped(np.random.default_rng(7), *shape)
    k = kadj.differentiate(softmax_rows_inplace)
    before = x.copy()
    g = np.random.default_rng(8).standard_normal(shape)
    k.adjoint(x, g)
    np.testing.assert_array_equal(x, before)
    # and the gradient is the softmax's: J^T g = p * (g - <p, g>) per row
    p = np.exp(before - before.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    g0 = np.random.default_rng(8).standard_normal(shape)
    expected = p * (g0 - np.sum(p * g0, axis=1, keepdims=True))
    np.testing.assert_allclose(g, expected, rtol=1e-12, atol=1e-14)


# A loop that reads the row (or scratch row), then a later loop of the same iteration
# that overwrites it, or a loop around both that stores again on its next trip:
# replaying the iteration runs it all forward before the reading loop is reversed, so
# its loads may not be recomputed from the work row (they were, and read what the later
# store left: the gradients of these seven were wrong, with no error).  The elements
# are recorded instead.
@njit
def normalise_rows_inplace(a):
    for r in range(a.shape[0]):
        s = 0.0
        for j in range(a.shape[1]):
            s += a[r, j] * a[r, j]
        s = math.sqrt(s)
        for j in range(a.shape[1]):
            a[r, j] /= s


@njit
def softmax_read_then_write(a):
    for r in range(a.shape[0]):
        m = a[r, 0]
        for j in range(1, a.shape[1]):
            if a[r, j] > m:
                m = a[r, j]
        s = 0.0
        for j in range(a.shape[1]):
            s += math.exp(a[r, j] - m)
        for j in range(a.shape[1]):
            a[r, j] = math.exp(a[r, j] - m) / s


@njit
def sum_into_first_column(a):
    for r in range(a.shape[0]):
        s = 0.0
        for j in range(a.shape[1]):
            s += a[r, j] * a[r, j]
        a[r, 0] = s


@njit
def scratch_row_normalised(x, out):
    rows, cols = x.shape
    c = np.empty(cols)
    for r in range(rows):
        for j in range(cols):
            c[j] = x[r, j] * x[r, j] + 0.1
        s = 0.0
        for j in range(cols):
            s += c[j] * c[j]
        for j in range(cols):
            c[j] = c[j] / s
        for j in range(cols):
            out[r, j] = c[j] * x[r, j]


@njit
def sweeps_store_then_read(a, out):
    # the store comes first in the sweep, but the next sweep runs it after the read
    rows, cols = a.shape
    for r in range(rows):
        s = 0.1
        for sweep in range(3):
            for j in range(cols):
                a[r, j] = a[r, j] - 0.1 * s * a[r, j] ** 2
            s = 0.0
            for j in range(cols):
                s += a[r, j] * a[r, j]
        out[r] = s


@njit
def sweeps_until_small(a, out):
    rows, cols = a.shape
    for r in range(rows):
        s = 1.0
        it = 0
        while it < 4:
            for j in range(cols):
                a[r, j] = a[r, j] - 0.05 * s * a[r, j] ** 3
            s = 0.0
            for j in range(cols):
                s += a[r, j] ** 2
            it += 1
            if s < 0.01:
                break
        out[r] = s


@njit
def scratch_row_sweeps(x, out):
    rows, cols = x.shape
    c = np.empty(cols)
    for r in range(rows):
        for j in range(cols):
            c[j] = x[r, j]
        s = 0.2
        for sweep in range(2):
            for j in range(cols):
                c[j] = c[j] * (1.0 - 0.1 * s)
            s = 0.0
            for j in range(cols):
                s += c[j] * c[j]
        for j in range(cols):
            out[r, j] = c[j] * s


READ_THEN_WRITE = [normalise_rows_inplace, softmax_read_then_write,
                   sum_into_first_column, scratch_row_normalised, sweeps_store_then_read,
                   sweeps_until_small, scratch_row_sweeps]
TWO_ARGS = {scratch_row_normalised, sweeps_store_then_read, sweeps_until_small,
            scratch_row_sweeps}


@pytest.mark.parametrize("kernel", READ_THEN_WRITE, ids=lambda k: k.__name__)
@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (20, 9), (300, 40)])
def test_a_row_read_then_overwritten_in_one_iteration(kernel, shape):
    x = np.random.default_rng(sum(shape)).uniform(0.1, 1.0, shape)
    if kernel not in TWO_ARGS:
        args = (x,)
    else:
        out_shape = shape if kernel in (scratch_row_normalised, scratch_row_sweeps) \
            else shape[:1]
        args = (x, np.zeros(out_shape))
    _check(kernel, args)


@njit
def dead_scratch_row(a, b, out):
    # the scratch row is written and never read: its allocation is left out of the
    # adjoint, and so are its stores in the replayed iteration (they named an array
    # the adjoint did not define: numba's NameError)
    rows, cols = a.shape
    c = np.empty(cols)
    for r in range(rows):
        s = 0.1 * b[r, 0]
        it = 0
        while True:
            before = s
            for j in range(cols):
                c[j] = 0.5 * a[r, j] * a[r, j] - 0.3 * s
            s = s + 0.01 * a[r, 0]
            it += 1
            if abs(s - before) < 1e-12 or it >= 4:
                break
        out[r] = s


@pytest.mark.parametrize("shape", [(1, 1), (3, 4)])
def test_a_scratch_row_nothing_reads(shape):
    x = np.random.default_rng(5).uniform(0.1, 1.0, shape)
    _check(dead_scratch_row, (x, x.copy(), np.zeros(shape[0])))
