"""``while`` loops whose condition holds a conditional expression and whose counter
starts at a constant (the forms numba's dead-branch pruning sees with constant
operands: ``k = 0; while (x[k] if k < n else 0.0) > 0.5 and k < 10``, ``while k < (n
if flag else 3)``, a local flag, a counter that never changes and a loop left by
``break``).  The kernels are differentiated (no internal error) and their gradients
checked against float64 central differences (kadj.testing.check_grad)."""
import numpy as np
import pytest
from numba import njit

import kadj
from kadj.testing import check_grad


@njit
def ternary_whiles(x, n, flag, out):
    k = 0
    s = 0.0
    while (x[k] if k < n else 0.0) > 0.5 and k < 10:    # the element read guarded
        s += x[k] * x[k]
        k += 1
    j = 0
    while j < (n if flag else 3):                        # the bound chosen by a flag
        s += np.sin(x[j]) * s
        j += 1
    on = True
    m = 1
    while m < (4 if on else 2):                          # a local constant flag
        s += x[m] * x[m - 1]
        m += 1
    c = 0
    i = 0
    while (x[i] if c < 1 else 0.0) > -5.0:               # c never changes
        s += 0.1 * x[i] * s
        i += 1
        if i >= n:
            break
    out[0] = s


X = np.array([0.9, 0.8, 0.7, 0.2, 0.9, 0.6, 0.75])


@pytest.mark.parametrize("n, flag", [(5, True), (5, False), (2, True), (7, False)])
def test_ternary_while_conditions(n, flag):
    check_grad(kadj.differentiate(ternary_whiles), (X.copy(), n, flag, np.zeros(1)))


