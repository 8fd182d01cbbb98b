"""Shape checks of lowered whole-array NumPy (kadj/array_checks.py): operands that do
not broadcast, a matrix product whose inner dimensions differ, a value assigned into a
slice or updated in place that does not fit it.  NumPy refuses each such call with
ValueError, and so does numba's forward (except for an in-place operator, which it does
not check); the adjoint, called directly, must refuse it the same way before any
loop reads outside an operand (the suite runs with NUMBA_BOUNDSCHECK=1: a missing check
shows as IndexError) and leave every array of the call untouched.  Shapes that do
broadcast (a size-1 extent stretched) still give the finite-difference gradient."""
import numpy as np
import pytest
from numba import njit

import kadj
from kadj.testing import check_grad


@njit
def forms(a, b, A, B, out, mode):
    """One whole-array form per ``mode`` (one compilation for all of them)."""
    if mode == 0:
        out[:] = a * b + 1.0                 # element-wise, 1-D against 1-D
    elif mode == 1:
        out[:] = A @ a                       # matrix @ vector
    elif mode == 2:
        out[0] = np.dot(a, b)                # vector . vector
    elif mode == 3:
        out[1:] = a                          # slice assignment
    elif mode == 4:
        out += a                             # in-place operator
    elif mode == 5:
        D = A - B                            # 2-D against 2-D
        out[0] = np.sum(D * D)
    else:
        out[:] = a[::2] * b                  # a strided view against an array


_K = kadj.differentiate(forms)


def _r(*shape):
    return np.random.default_rng(sum(shape) + 3).standard_normal(shape)


# (mode, arguments whose shapes NumPy refuses)
MISMATCHED = [
    (0, (_r(4), _r(3), _r(2, 2), _r(2, 2), np.zeros(4))),
    (0, (_r(3), _r(3), _r(2, 2), _r(2, 2), np.zeros(4))),     # result vs destination
    (1, (_r(3), _r(3), _r(4, 4), _r(2, 2), np.zeros(4))),
    (2, (_r(4), _r(5), _r(2, 2), _r(2, 2), np.zeros(1))),
    (3, (_r(4), _r(1), _r(2, 2), _r(2, 2), np.zeros(4))),
    (4, (_r(5), _r(1), _r(2, 2), _r(2, 2), np.zeros(4))),
    (5, (_r(1), _r(1), _r(3, 4), _r(2, 4), np.zeros(1))),
    (6, (_r(7), _r(3), _r(2, 2), _r(2, 2), np.zeros(3))),
]


@pytest.mark.parametrize("mode, args", MISMATCHED,
                         ids=[f"mode{m}-{i}" for i, (m, _) in enumerate(MISMATCHED)])
def test_mismatched_shapes_raise_in_forward_and_adjoint(mode, args):
    if mode == 4:   # numba's forward does not check ``out += a``; NumPy does
        with pytest.raises(ValueError):
            args[4].copy().__iadd__(args[0])
    else:
        with pytest.raises(ValueError):
            forms(*[x.copy() for x in args], mode)
    call = [x.copy() for x in args] + [mode]
    adj = [np.zeros_like(x) for x in args]
    before = [x.copy() for x in call[:5] + adj[:5]]
    with pytest.raises(ValueError) as exc:
        _K.adjoint(*call, *adj)
    assert "broadcast" in str(exc.value) or "inner dimensions" in str(exc.value)
    for x, y in zip(call[:5] + adj[:5], before):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("mode, args", [
    (0, (_r(4), _r(1), _r(2, 2), _r(2, 2), np.zeros(4))),    # b stretched
    (1, (_r(3), _r(3), _r(4, 3), _r(2, 2), np.zeros(4))),
    (3, (_r(1), _r(1), _r(2, 2), _r(2, 2), np.zeros(4))),    # one value, three places
    (4, (_r(4), _r(1), _r(2, 2), _r(2, 2), np.zeros(4))),
    (5, (_r(1), _r(1), _r(3, 4), _r(1, 4), np.zeros(1))),    # a row stretched
    (6, (_r(7), _r(4), _r(2, 2), _r(2, 2), np.zeros(4))),
])
def test_broadcasting_shapes_still_differentiate(mode, args):
    check_grad(_K, args + (mode,))


@njit
def extreme(x, k, mode):
    """``np.max``/``np.min`` of a float array, of an integer array, along an axis."""
    if mode == 0:
        return np.max(x * 2.0) - np.min(x)
    if mode == 1:
        return np.max(k) * np.sum(x)
    return np.min(x)


_E = kadj.differentiate(extreme)


@pytest.mark.parametrize("mode, x, k", [
    (0, np.zeros(0), np.ones(3, np.int64)),
    (1, _r(4), np.zeros(0, np.int64)),          # integer: the loop starts at k[0]
    (2, np.zeros(0), np.ones(3, np.int64)),
])
def test_max_min_of_no_element_raise_as_numpy_does(mode, x, k):
    """NumPy and numba's forward refuse ``np.max``/``np.min`` of an empty array (the
    reduction has no identity); the adjoint refused nothing and returned -inf (a
    float array) or read ``k[0]`` past the end (an integer array)."""
    with pytest.raises(ValueError, match="zero-size array"):
        extreme(x, k, mode)
    adj = np.zeros_like(x)
    before = (x.copy(), k.copy())
    with pytest.raises(ValueError, match="zero-size array"):
        _E.adjoint(x, k, mode, adj)
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(k, before[1])
    np.testing.assert_array_equal(adj, 0.0)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_max_min_of_one_element_and_more_differentiate(mode):
    for n in (1, 5):
        check_grad(_E, (_r(n), np.arange(3, dtype=np.int64), mode))
