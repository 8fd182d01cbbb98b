"""Branches inside loops whose branches record values but have no adjoint code of their
own (a ``break`` test on a running sum): every reversed iteration must re-decide its own
branch.  Regression: the condition was saved once around the loop, so every reversed
iteration took the last iteration's branch and the gradient was silently wrong.  The
CUDA form of the first kernel is ``while_break_on_running_value`` in
tests/cuda_sim_cases.py."""
import numba
import numpy as np
import pytest

import kadj
from kadj.testing import check_grad


@kadj.differentiate
@numba.njit
def capped_while(x, limit, out):
    s = 0.0
    i = 0
    while i < x.shape[0]:
        s += x[i] * x[i]
        if s > limit:
            break
        i += 1
    out[0] = s


@kadj.differentiate
@numba.njit
def capped_for(x, limit, out):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * x[i]
        if s > limit:
            break
    out[0] = s


@kadj.differentiate
@numba.njit
def counted_steps(x, limit, out):
    # the branch records the step count it changes, and nothing differentiable
    s = 0.0
    k = 0
    while k < 50:
        s = s * 0.9 + x[k % x.shape[0]]
        if s > limit:
            k += 10
        else:
            k += 1
    out[0] = s


@pytest.mark.parametrize("kernel", [capped_while, capped_for, counted_steps],
                         ids=lambda k: k.__name__)
def test_gradient_of_loop_with_recording_branch(kernel):
    x = np.array([0.5, 0.6, 0.7, 0.8, 0.9])
    check_grad(kernel, (x, 1.0, np.zeros(1)), wrt=["x"])


def test_capped_while_against_analytic_gradient():
    # stops after x[2]: s = x0^2 + x1^2 + x2^2 = 1.1 > 1
    x = np.array([0.5, 0.6, 0.7, 0.8, 0.9])
    adj_x = np.zeros(5)
    out = np.zeros(1)
    capped_while(x, 1.0, out)
    assert out[0] == pytest.approx(1.1)
    capped_while.adjoint(x, 1.0, out, adj_x, np.zeros(1), np.array([1.0]))
    np.testing.assert_allclose(adj_x, [1.0, 1.2, 1.4, 0.0, 0.0], rtol=1e-14)
