"""A ``while`` loop nested in a ``for`` loop reserves tape room at each of its
iterations: its per-iteration amount is not what one run of the loop pushes, so the
enclosing loop's reservation cannot absorb it.  Thousands of trips per run overflow
the initial tape (1024 entries) unless every push is covered; the suite runs with
bounds checks (tests/conftest.py), so an uncovered push raises ``IndexError``."""
import math

import numpy as np
from numba import njit

import kadj
from fdcheck import fd_check


@njit
def inner_while(x, n, y):
    s = 0.0
    for i in range(x.shape[0]):
        z = x[i] + s
        k = 0
        while True:
            z = math.sin(z) * 0.9 + x[i]
            k += 1
            if k >= n:
                break
        s = 0.5 * z
        y[i] = z


def test_many_trips_of_a_nested_while_loop_stay_on_the_tape():
    k = kadj.differentiate(inner_while)
    source = k.adjoint_source(np.zeros(2), 3, np.zeros(2))
    loop = source.split("while True:")[1].split("break")[0]
    assert "_reserve(" in loop, source   # the while loop reserves at each iteration
    fd_check(k, (np.array([0.3, 0.5]), 3000, np.zeros(2)), rtol=1e-5, atol=1e-8)
