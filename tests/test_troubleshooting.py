"""docs/troubleshooting.md lists the refusals as users see them.

Each case below makes kadj refuse a small kernel (or call) and names the stable part of
the message, the text after the kernel and ``file:line``; the test checks that the
refusal says it and that the page quotes it, so a reworded message cannot leave the
page stale.  Refusals happen before an adjoint is compiled: only numba's typing runs.
"""
import math
import os

import numpy as np
import pytest
from numba import cuda, float64, literal_unroll, njit

import kadj

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "docs", "troubleshooting.md")


def _x():
    return np.linspace(0.1, 1.0, 8)


def _source(fn, *args, **options):
    return kadj.differentiate(fn, **options).adjoint_source(*args)


# ---- kernels kadj refuses (one per case) -----------------------------------------------
def try_except():
    @njit
    def k(x, y):
        for i in range(x.shape[0]):
            try:
                y[i] = math.sqrt(x[i])
            except Exception:
                y[i] = 0.0
    _source(k, _x(), np.zeros(8))


def literal_unroll_loop():
    @njit
    def k(x, y):
        for c in literal_unroll((1.0, 2.0)):
            y[0] += c * x[0]
    _source(k, _x(), np.zeros(8))


def raise_always():
    @njit
    def k(x, y):
        raise ValueError("bad")
    _source(k, _x(), np.zeros(8))


def endless_loop():
    @njit
    def k(x, y):
        while True:
            y[0] += x[0]
    _source(k, _x(), np.zeros(8))


def iterate_array():
    @njit
    def k(x, y):
        s = 0.0
        for v in x:
            s += v
        y[0] = s
    _source(k, _x(), np.zeros(8))


def slice_assignment():
    @njit
    def k(x, y, idx):
        y[idx] = x[idx]
    _source(k, _x(), np.zeros(8), np.arange(3))


def whole_array_call():
    @njit
    def k(x, y):
        y[:] = np.cumprod(x)
    _source(k, _x(), np.zeros(8))


def array_slice():
    @njit
    def k(x, y):
        s = x[1:]
        return s
    _source(k, _x(), np.zeros(8))


def array_rebound():
    @njit
    def k(x):
        d = x * 2.0
        for i in range(3):
            d = d + x
        return d[0]
    _source(k, _x())


def no_rule():
    @njit
    def k(x, y):
        for i in range(x.shape[0]):
            y[i] = np.logaddexp(x[i], 1.0)
    _source(k, _x(), np.zeros(8))


def random_numbers():
    @njit
    def k(x, y):
        for i in range(x.shape[0]):
            y[i] = x[i] * np.random.random()
    _source(k, _x(), np.zeros(8))


def list_build():
    @njit
    def k(x, y):
        w = [1.0, 2.0]
        y[0] = x[0] * w[0]
    _source(k, _x(), np.zeros(8))


def np_full():
    @njit
    def k(x, y):
        w = np.full(x.shape[0], 2.0)
        for i in range(x.shape[0]):
            y[i] = x[i] * w[i]
    _source(k, _x(), np.zeros(8))


def transpose():
    @njit
    def k(x, y):
        z = x.T
        y[0] = z[0]
    _source(k, _x(), np.zeros(8))


def array_alias():
    @njit
    def k(x, y, c):
        z = x if c > 0 else y
        y[0] = z[1] * 2.0
    _source(k, _x(), np.zeros(8), 1.0)


@njit
def _fact(v, n):
    if n <= 0:
        return v
    return v * _fact(v, n - 1)


def recursion():
    @njit
    def k(x, y):
        y[0] = _fact(x[0], 3)
    _source(k, _x(), np.zeros(8))


def tuple_return():
    @njit
    def k(x):
        return x[0], x[1]
    _source(k, _x())


def grad_without_float():
    @njit
    def k(x, y):
        y[0] = x[0]
    kadj.grad(k)(_x(), np.zeros(8))


def rule_branches():
    f = njit(lambda v: v if v > 0 else 0.0)

    @kadj.register_adjoint(f)
    def _rule(g, out, v):
        if v > 0:
            return (g,)
        return (0.0,)

    @njit
    def k(x, y):
        for i in range(x.shape[0]):
            y[i] = f(x[i])
    _source(k, _x(), np.zeros(8))


def cuda_atomic_max():
    @cuda.jit
    def k(x, y):
        sm = cuda.shared.array(2, float64)
        i = cuda.grid(1)
        cuda.atomic.max(sm, 0, x[i])
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            y[0] = sm[0]
    _source(k, _x(), np.zeros(8))


def cuda_same_element():
    @cuda.jit
    def k(x, y):
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[0] = x[i]
    _source(k, _x(), np.zeros(8))


def cuda_neighbour_in_place():
    @cuda.jit
    def k(x):
        i = cuda.grid(1)
        if 0 < i < x.shape[0]:
            x[i] = x[i] * x[i - 1]
    _source(k, _x())


@kadj.differentiate
@njit
def _square(x, y):
    for i in range(x.shape[0]):
        y[i] = x[i] * x[i]


@kadj.differentiate
@njit
def _total(y, loss):
    s = 0.0
    for i in range(y.shape[0]):
        s += y[i]
    loss[0] = s


def tape_changed_outside():
    a, b, loss = _x(), np.zeros(8), np.zeros(1)
    with kadj.Tape() as tape:
        _square(a, b)
        b[0] = 5.0
        _total(b, loss)
    tape.backward(loss)


def tape_loss_shape():
    a, b = _x(), np.zeros(8)
    with kadj.Tape() as tape:
        _square(a, b)
    tape.backward(b)


def step_writes_other_array():
    a, b, c = _x(), np.zeros(8), np.zeros(8)

    def step(i, u, v):
        _square(u, c)
        _square(c, v)
        return v, u
    with kadj.Tape():
        kadj.checkpointed_loop(step, (a, b), steps=3, snapshots=2)


CASES = [
    (try_except, "try/except blocks are not supported in differentiated kernels"),
    (literal_unroll_loop, "loops over literal_unroll() are not supported"),
    (raise_always, "this raise statement (or failing assert) is reached on every path "
                   "through the kernel, so there is no path without an exception to "
                   "differentiate"),
    (endless_loop, "this loop never ends: no break, return or condition leaves it"),
    (iterate_array, "only loops over range() or prange() are supported"),
    (slice_assignment, "this array index (fancy or boolean indexing) is not supported yet"),
    (whole_array_call, "whole-array call cumprod() is not supported yet"),
    (array_slice, "is used here in a way kadj cannot follow"),
    (array_rebound, "is assigned a whole-array expression and assigned again elsewhere"),
    (no_rule, "no derivative rule for logaddexp()"),
    (random_numbers, "cannot be differentiated: the adjoint would draw different ones"),
    (list_build, "lists, sets and dicts are not supported in differentiated kernels"),
    (np_full, "np.full() is not supported in differentiated kernels"),
    (transpose, "attribute '.T' is not supported"),
    (array_alias, "array variables may not be rebound or aliased"),
    (recursion, "kadj differentiates helper functions by inlining them, which recursion "
                "cannot be"),
    (tuple_return, "only a single float return value carries a gradient"),
    (grad_without_float, "does not return a float, so it has no gradient"),
    (rule_branches, "branches on its arguments (a Python `if`, `and`, `or`, min or max on "
                    "them), whose outcome is only known when the adjoint runs"),
    (cuda_atomic_max, "which is not an argument of the kernel (a shared or local array); "
                      "kadj differentiates it on global arrays only"),
    (cuda_same_element, "(its index does not depend on blockIdx.x or threadIdx.x, and no "
                        "enclosing `if` picks one thread)"),
    (cuda_neighbour_in_place, "at elements other threads may touch (in-place updates are "
                              "supported only at the thread's own element, x[i] with i "
                              "from cuda.grid, or in a red-black sweep"),
    (tape_changed_outside, "was changed outside the recorded launches after that launch"),
    (tape_loss_shape, "tape.backward(loss) needs a 1-element loss array, but got an array "
                      "of shape (8,)"),
    (step_writes_other_array, "which is not a state array it was given."),
]


@pytest.fixture(scope="module")
def page():
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("make, stable", CASES, ids=[c[0].__name__ for c in CASES])
def test_refusal_is_documented(make, stable, page):
    with pytest.raises(kadj.DifferentiationError) as info:
        make()
    assert stable in str(info.value), str(info.value)
    assert stable in page, f"docs/troubleshooting.md does not quote: {stable}"


def test_omitted_default_refusal_is_documented(page):
    """A call error ("Calling an adjoint"): adjoints in the place of a None default."""
    @kadj.differentiate
    @njit
    def sq(x, y, scale=None):
        s = 1.0 if scale is None else scale
        for i in range(x.shape[0]):
            y[i] = s * x[i] * x[i]
    x, y = _x(), np.zeros(8)
    with pytest.raises(TypeError) as info:
        sq.adjoint(x, y, np.zeros(8), np.ones(8))
    assert str(info.value) in page, f"docs/troubleshooting.md does not quote: {info.value}"


def test_page_has_a_rewrite_for_each_group(page):
    """Every construct group says what to do, with code where a rewrite exists."""
    sections = page.split("\n## ")[1:]
    assert len(sections) >= 9
    for section in sections:
        title = section.splitlines()[0]
        assert "```" in section, f"section {title!r} quotes no message"
