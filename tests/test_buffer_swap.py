"""Time loops that swap or rotate array names at the end of each step (``u, un = un,
u``; ``u_prev, u, u_next = u, u_next, u_prev``), unrolled by :mod:`kadj.buffer_swap`.

Gradients are compared with float64 central finite differences (``check_grad``,
bounds-checked) at trip counts 0 to 7 (every remainder of the unrolling, none at all),
with code after the loop that reads the swapped arrays and without, a time loop
starting past 0, two scratch arrays swapped, and at sizes whose tapes
outgrow their first capacity.  Swaps the rewrite does not cover are refused with a
message that says what is supported and what to do instead.
"""
import numpy as np
import pytest
from numba import njit

import kadj
from kadj.testing import check_grad

pytestmark = pytest.mark.usefixtures("private_cache_dir")


@njit
def heat_swap(u, un, alpha, nsteps):
    n = u.shape[0]
    for t in range(nsteps):
        for i in range(1, n - 1):
            un[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])
        un[0] = u[0]
        un[n - 1] = u[n - 1]
        u, un = un, u
    s = 0.0
    for i in range(n):
        s += u[i] ** 2          # the state the last step left, in either array
    return s


@njit
def heat_swap_no_tail(u, un, alpha, nsteps):
    n = u.shape[0]
    for t in range(1, nsteps + 1):      # a loop that does not start at 0
        for i in range(1, n - 1):
            un[i] = u[i] + alpha * t * (u[i - 1] - 2.0 * u[i] + u[i + 1])
        un[0] = u[0]
        un[n - 1] = u[n - 1]
        u, un = un, u


@njit
def wave_rotate(u_prev, u, u_next, c2, nsteps):
    n = u.shape[0]
    for t in range(nsteps):
        for i in range(1, n - 1):
            u_next[i] = 2.0 * u[i] - u_prev[i] + c2 * (u[i - 1] - 2.0 * u[i] + u[i + 1])
        u_next[0] = 0.0
        u_next[n - 1] = 0.0
        u_prev, u, u_next = u, u_next, u_prev
    e = 0.0
    for i in range(n):
        e += (u[i] - u_prev[i]) ** 2 + u[i] * u[i]
    return e


@njit
def swap_with_scratch(u, out, kappa, nsteps):
    n = u.shape[0]
    a = np.empty_like(u)
    b = np.empty_like(u)
    for i in range(n):
        a[i] = u[i]
    for t in range(nsteps):
        for i in range(n):
            b[i] = a[i] + kappa * np.tanh(a[(i + 1) % n] - a[i])
        a, b = b, a
    for i in range(n):
        out[i] = a[i] * a[i]


@njit
def swap_with_a_copy(u, out, kappa, nsteps):
    n = u.shape[0]
    a = u.copy()                # a whole-array result whose name the swap rebinds
    b = np.empty_like(u)
    for t in range(nsteps):
        for i in range(n):
            b[i] = a[i] + kappa * np.tanh(a[(i + 1) % n] - a[i])
        a, b = b, a
    for i in range(n):
        out[i] = a[i] * a[i]


def _heat(n, steps, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random(n), rng.random(n), 0.2, steps


@pytest.mark.parametrize("steps", range(8))
def test_swap_every_remainder(steps):
    check_grad(kadj.differentiate(heat_swap), _heat(7, steps))


@pytest.mark.parametrize("steps", [0, 1, 2, 5])
def test_swap_without_code_after_the_loop(steps):
    check_grad(kadj.differentiate(heat_swap_no_tail), _heat(6, steps))


@pytest.mark.parametrize("steps", range(7))
def test_rotation_of_three_arrays(steps):
    rng = np.random.default_rng(steps)
    args = (rng.random(8), rng.random(8), rng.random(8), 0.3, steps)
    check_grad(kadj.differentiate(wave_rotate), args)


@pytest.mark.parametrize("kernel", [swap_with_scratch, swap_with_a_copy],
                         ids=lambda k: k.__name__)
@pytest.mark.parametrize("steps", [0, 1, 4, 5])
def test_scratch_arrays_swapped(kernel, steps):
    rng = np.random.default_rng(steps)
    check_grad(kadj.differentiate(kernel), (rng.random(9), np.zeros(9), 0.1, steps))


@pytest.mark.parametrize("n,steps", [(1500, 3), (300, 41), (64, 600)])
def test_at_sizes_whose_tapes_grow(n, steps):
    check_grad(kadj.differentiate(heat_swap), _heat(n, steps, seed=n),
               full_jacobian_max=0)


def test_the_loop_is_unrolled_and_no_name_is_rebound():
    k = kadj.differentiate(heat_swap)
    region = k.show_stage("region", *_heat(7, 3))
    assert "for _swap_p in range(_swap_groups)" in region, region
    assert "u = " not in region.replace("_u = ", "") and "un = " not in region, region
    # the two copies of the step: one writes un from u, the other u from un
    assert region.count("un[i] = ") == 2 and region.count("    u[i] = ") == 1, region


def test_user_arrays_hold_what_the_forward_leaves():
    k = kadj.differentiate(heat_swap)
    u, un, alpha, steps = _heat(9, 5)
    fu, fun = u.copy(), un.copy()
    expect = heat_swap(fu, fun, alpha, steps)
    au, aun = u.copy(), un.copy()
    got = k.adjoint(au, aun, alpha, steps, np.zeros(9), np.zeros(9), np.zeros(1))
    assert got == expect
    np.testing.assert_array_equal(au, u)           # the adjoint writes no user array
    np.testing.assert_array_equal(aun, un)


# ---- what stays refused, and what the refusal says --------------------------------

@njit
def swap_under_a_branch(u, un, alpha, nsteps):
    for t in range(nsteps):
        for i in range(1, u.shape[0] - 1):
            un[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])
        if t % 3 != 2:
            u, un = un, u


@njit
def swap_in_a_loop_with_break(u, un, alpha, nsteps):
    for t in range(nsteps):
        for i in range(1, u.shape[0] - 1):
            un[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])
        if un[1] > 10.0:
            break
        u, un = un, u


@pytest.mark.parametrize("kernel", [swap_under_a_branch, swap_in_a_loop_with_break],
                         ids=lambda k: k.__name__)
def test_other_swaps_are_refused_with_what_to_do(kernel):
    with pytest.raises(kadj.DifferentiationError) as info:
        kadj.differentiate(kernel).adjoint_source(*_heat(6, 3)[:2], 0.2, 3)
    text = str(info.value)
    assert "rebound" in text and "buffer swap" in text and "u2[t % 2, i]" in text, text
