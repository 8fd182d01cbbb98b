"""kadj.checkpointed_loop: gradients equal those of the store-everything tape (and of
finite differences), with the binomial schedule's exact number of step executions."""
import numba
import numpy as np
import pytest

import kadj
from kadj.errors import DifferentiationError
from kadj.schedules import binomial_cost

N = 12


@kadj.differentiate
@numba.njit
def heat(u, v, alpha, f):
    for i in range(1, u.shape[0] - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + f[i] * u[i] * u[i]


@kadj.differentiate
@numba.njit
def blend(a, b, c, g, beta):
    for i in range(a.shape[0]):
        c[i] = beta * a[i] * g[i] + (1.0 - beta) * b[i] * b[i]


@kadj.differentiate
@numba.njit
def sqloss(u, target, out):
    s = 0.0
    for i in range(u.shape[0]):
        s += (u[i] - target[i]) ** 2
    out[0] = s


@kadj.differentiate
@numba.njit
def init(x, u):
    for i in range(u.shape[0]):
        u[i] = np.sin(x[i])


RNG = np.random.default_rng(7)
F = RNG.random(N) * 0.02
G = RNG.random(N)
TARGET = RNG.random(N)
X0 = RNG.random(N)
FORCING = RNG.random((70, N)) * 0.01


def heat_loop(n, s, checkpoint, x0=X0, forcing=None):
    """init(x0) -> n ping-pong heat steps (+ forcing[i] by step number) -> loss."""
    u0, v0, out = np.zeros(N), np.zeros(N), np.zeros(1)
    calls = [0]

    def step(i, u, v):
        calls[0] += 1
        heat(u, v, 0.1, F if forcing is None else forcing[i])
        return v, u

    with kadj.Tape() as tape:
        init(x0, u0)
        if checkpoint:
            u, v = kadj.checkpointed_loop(step, (u0, v0), steps=n, snapshots=s)
        else:
            u, v = u0, v0
            for i in range(n):
                u, v = step(i, u, v)
        sqloss(u, TARGET, out)
    tape.backward(out)
    return tape, float(out[0]), calls[0]


def scalar_total(tape, kernel_name, arg):
    return sum(g.value for g in tape.scalar_grads()
               if g.kernel_name == kernel_name and g.arg_name == arg)


@pytest.mark.parametrize("n,s", [(1, 1), (2, 1), (3, 4), (7, 1), (10, 3), (23, 4)])
def test_heat_ping_pong_matches_store_everything(n, s):
    ref, ref_loss, _ = heat_loop(n, s, False)
    got, loss, calls = heat_loop(n, s, True)
    assert loss == ref_loss
    np.testing.assert_allclose(got.grad(X0), ref.grad(X0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.grad(F), ref.grad(F), rtol=1e-12, atol=1e-15)
    assert np.abs(ref.grad(F)).max() > 0
    # the loop's scalars sum over its steps into one entry per launch slot
    total = [g.value for g in got.scalar_grads() if g.arg_name == "heat[0].alpha"]
    assert len(total) == 1
    assert total[0] == pytest.approx(scalar_total(ref, "heat", "alpha"), rel=1e-12)
    # exact schedule: every step run once forward, then the binomial recomputation;
    # each reversal calls the step once more but runs none of its (single) launches
    loop = got.launches[1].kernel
    assert loop.executions == binomial_cost(n, s)
    assert calls == binomial_cost(n, s) + n
    assert loop.peak_snapshots <= s


def test_heat_loop_against_finite_differences():
    n, s = 9, 2
    tape, _, _ = heat_loop(n, s, True)
    g = tape.grad(X0)
    eps = 1e-6
    for k in (0, 3, 7):
        xp, xm = X0.copy(), X0.copy()
        xp[k] += eps
        xm[k] -= eps
        fd = (heat_loop(n, s, False, xp)[1] - heat_loop(n, s, False, xm)[1]) / (2 * eps)
        assert g[k] == pytest.approx(fd, rel=1e-6, abs=1e-9)


def test_forcing_indexed_by_step_number():
    n, s = 13, 3
    ref, _, _ = heat_loop(n, s, False, forcing=FORCING)
    got, _, _ = heat_loop(n, s, True, forcing=FORCING)
    for i in range(n):
        np.testing.assert_allclose(got.grad(FORCING[i]), ref.grad(FORCING[i]),
                                   rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.grad(X0), ref.grad(X0), rtol=1e-12, atol=1e-15)


def rotation_loop(n, s, checkpoint, repeat=1):
    """Three-buffer rotation with two launches per step; g is read every third step."""
    a0, b0, c0, out = X0.copy(), np.zeros(N), np.zeros(N), np.zeros(1)

    def step(i, a, b, c):
        heat(a, b, 0.05, F)
        if i % 3 == 0:
            blend(a, b, c, G, 0.3)
        else:
            blend(b, a, c, F, 0.6)
        return b, c, a

    with kadj.Tape() as tape:
        if checkpoint:
            a, b, c = kadj.checkpointed_loop(step, (a0, b0, c0), steps=n, snapshots=s)
        else:
            a, b, c = a0, b0, c0
            for i in range(n):
                a, b, c = step(i, a, b, c)
        sqloss(a, TARGET, out)
    grads = []
    for _ in range(repeat):
        tape.zero()
        tape.backward(out)
        grads.append((tape.grad(a0), tape.grad(G), tape.grad(F)))
    return tape, grads


@pytest.mark.parametrize("n,s", [(1, 2), (5, 2), (11, 3), (20, 5)])
def test_three_buffer_rotation_two_launches(n, s):
    _, (ref,) = rotation_loop(n, s, False)
    tape, got = rotation_loop(n, s, True, repeat=2)
    for gg in got:                      # a second backward gives the same gradients
        for r, g in zip(ref, gg):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-15)
    if n > 1:                           # G, read only every third step
        assert np.abs(ref[1]).max() > 0
    # the first backward uses the forward sweep's snapshots; the second redoes the sweep
    # from the initial state (n - 1 executions) before the same recomputation
    assert tape.launches[0].kernel.executions == 2 * binomial_cost(n, s) - 1


def test_step_writing_a_non_state_array_is_refused():
    u0, v0, w = np.zeros(N), np.zeros(N), np.zeros(N)

    def step(i, u, v):
        heat(u, w, 0.1, F)
        return v, u

    with kadj.Tape():
        with pytest.raises(DifferentiationError, match="not a state array"):
            kadj.checkpointed_loop(step, (u0, v0), steps=3, snapshots=2)


def test_step_returning_other_arrays_is_refused():
    u0, v0 = np.zeros(N), np.zeros(N)

    def step(i, u, v):
        heat(u, v, 0.1, F)
        return v, v.copy()

    with kadj.Tape():
        with pytest.raises(DifferentiationError, match="must return the next state"):
            kadj.checkpointed_loop(step, (u0, v0), steps=3, snapshots=2)


@pytest.mark.parametrize("returned,match", [
    (lambda u, v: (v.copy(), u.copy()), r"returned a tuple holding 2 new arrays \(not "
     r"the state arrays it was given: copies, for example\) at step 0; .*Return the "
     "given arrays themselves, having written the new values into them"),
    (lambda u, v: (v.copy(), u), r"returned a tuple holding 1 new array \(not one of "
     r"the state arrays it was given: a copy, for example\) at step 0"),
    (lambda u, v: (v, v), "returned a tuple holding one state array twice at step 0"),
    (lambda u, v: (v, 1.0), "returned a tuple holding float 1.0, not a state array"),
    (lambda u, v: (v,), "returned a tuple of 1 values at step 0"),
    (lambda u, v: None, "returned NoneType at step 0"),
])
def test_what_a_step_returned_instead_of_the_state(returned, match):
    """The refusal says what the step returned: copies of the state arrays (new
    arrays), one of them twice, another value, too few values."""
    u0, v0 = np.zeros(N), np.zeros(N)

    def step(i, u, v):
        heat(u, v, 0.1, F)
        return returned(u, v)

    with kadj.Tape():
        with pytest.raises(DifferentiationError, match="^The step function of "
                           "checkpointed_loop " + match):
            kadj.checkpointed_loop(step, (u0, v0), steps=3, snapshots=2)


def test_overwritten_input_is_detected_at_backward():
    u0, v0, f, out = X0.copy(), np.zeros(N), F.copy(), np.zeros(1)

    def step(i, u, v):
        heat(u, v, 0.1, f)
        return v, u

    with kadj.Tape() as tape:
        u, v = kadj.checkpointed_loop(step, (u0, v0), steps=4, snapshots=2)
        init(u, f)                       # overwrites f, which every step read
        sqloss(f, TARGET, out)
    with pytest.raises(DifferentiationError, match="overwritten by a later recorded"):
        tape.backward(out)


def test_without_a_tape_it_just_runs_the_loop():
    u0, v0 = X0.copy(), np.zeros(N)
    u1, v1 = X0.copy(), np.zeros(N)

    def step(i, u, v):
        heat(u, v, 0.1, F)
        return v, u

    u, v = kadj.checkpointed_loop(step, (u0, v0), steps=5, snapshots=2)
    ru, rv = u1, v1
    for i in range(5):
        ru, rv = step(i, ru, rv)
    np.testing.assert_array_equal(u, ru)
    assert u is v0 and v is u0            # the same buffers, in the final roles
