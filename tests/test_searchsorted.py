"""``np.searchsorted(xp, v)`` of a sorted 1-D array and one number (table lookups,
piecewise-linear interpolation): lowered to a binary search loop over the array's own
elements (:mod:`kadj.array_reduce`), an integer without derivative.  Checked: the index
equals NumPy's on both sides, at exact ties and outside the table (the tangent function
computes the kernel's values with the lowered search); gradients of interpolation
kernels against float64 central differences at small sizes (every argument) and at
10^5 knots and 2 * 10^5 queries; refusals of the forms it does not lower.  Likewise
``np.argmax`` / ``np.argmin`` of a 1-D array: NumPy's first index, gradients through
the elements they pick."""
import numpy as np
import pytest
from numba import njit

import kadj
from kadj.testing import check_grad


@njit
def index_left(xp, xq, out):
    for i in range(xq.shape[0]):
        out[i] = np.searchsorted(xp, xq[i]) + 0.0 * xq[i]


@njit
def index_right(xp, xq, out):
    for i in range(xq.shape[0]):
        out[i] = np.searchsorted(xp, xq[i], side="right") + 0.0 * xq[i]


@njit
def interp(xp, fp, xq, out):
    n = xp.shape[0]
    for i in range(xq.shape[0]):
        j = np.searchsorted(xp, xq[i])
        if j < 1:
            j = 1
        if j > n - 1:
            j = n - 1
        t = (xq[i] - xp[j - 1]) / (xp[j] - xp[j - 1])
        out[i] = (1.0 - t) * fp[j - 1] + t * fp[j]


@njit
def interp_right_view(xp, fp, xq, out):
    n = xp.shape[0] - 1
    knots = xp[1:]                       # a view: the search reads the base array
    for i in range(xq.shape[0]):
        j = min(max(np.searchsorted(knots, xq[i], "right"), 1), n - 1)
        t = (xq[i] - knots[j - 1]) / (knots[j] - knots[j - 1])
        out[i] = (1.0 - t) * fp[j - 1] + t * fp[j] * fp[j]


@njit
def queries_as_array(xp, xq, out):
    out[:] = np.searchsorted(xp, xq) * 1.0



def _table(rng, n):
    return np.sort(rng.uniform(0.0, 10.0, n))


@pytest.mark.parametrize("kernel", [index_left, index_right],
                         ids=["left", "right"])
def test_the_index_is_numpys(kernel):
    rng = np.random.default_rng(0)
    xp = np.repeat(_table(rng, 9), 2)            # duplicated knots
    xq = np.concatenate([xp, [-1.0, 11.0, xp[0], xp[-1]], rng.uniform(-1.0, 11.0, 40)])
    want = np.zeros(len(xq))
    kernel(xp, xq, want)
    got = np.zeros(len(xq))
    kadj.differentiate(kernel).jvp(xp, xq, got, np.zeros_like(xp), np.zeros_like(xq),
                                   np.zeros_like(got))
    assert np.array_equal(got, want)
    side = "right" if kernel is index_right else "left"
    assert np.array_equal(want, np.searchsorted(xp, xq, side=side))


@pytest.mark.parametrize("kernel", [interp, interp_right_view])
def test_interpolation_gradients(kernel):
    rng = np.random.default_rng(1)
    xp, fp = _table(rng, 12), rng.standard_normal(12)
    xq = rng.uniform(-1.0, 11.0, 30)
    check_grad(kadj.differentiate(kernel), (xp, fp, xq, np.zeros(30)))


def test_interpolation_at_scale():
    rng = np.random.default_rng(2)
    xp, fp = _table(rng, 100_000), rng.standard_normal(100_000)
    xq = rng.uniform(-1.0, 11.0, 200_000)
    # (fp only: with 10^5 knots, a step in xp or xq crosses knots somewhere)
    check_grad(kadj.differentiate(interp), (xp, fp, xq, np.zeros(200_000)), wrt=("fp",))


@pytest.mark.parametrize("kernel, args, words", [
    (queries_as_array, (np.arange(4.0), np.ones(3), np.zeros(3)), "one number"),
])
def test_other_forms_are_refused(kernel, args, words):
    with pytest.raises(kadj.DifferentiationError, match=words):
        kadj.differentiate(kernel).adjoint_source(*args)


@njit
def pick_extremes(x, w, out):
    for r in range(x.shape[0]):
        j = np.argmax(x[r])
        k = np.argmin(x[r, 1:]) + 1                # of a view
        out[r] = w[r] * x[r, j] - x[r, k] ** 2


@njit
def extreme_indices(x, out):
    for r in range(x.shape[0]):
        out[r] = np.argmax(x[r]) + 10.0 * np.argmin(x[r]) + 0.0 * x[r, 0]


def test_argmax_and_argmin_are_numpys_first_index():
    # lowered to a loop keeping the first extreme element's index (ties: the first)
    x = np.array([[1.0, 3.0, 3.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0],
                  [-1.0, -5.0, 4.0, -5.0, 4.0]])
    want, got = np.zeros(3), np.zeros(3)
    extreme_indices(x, want)
    kadj.differentiate(extreme_indices).jvp(x, got, np.zeros_like(x), np.zeros(3))
    assert np.array_equal(got, want)
    assert np.array_equal(want, np.argmax(x, axis=1) + 10.0 * np.argmin(x, axis=1))


def test_gradients_through_argmax_and_argmin():
    rng = np.random.default_rng(3)
    check_grad(kadj.differentiate(pick_extremes),
               (rng.standard_normal((6, 7)), rng.uniform(0.5, 1.5, 6), np.zeros(6)))
