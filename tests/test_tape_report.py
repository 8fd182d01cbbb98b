"""tape.memory_report(), tape.scalar_grad(), and checkpointed_loop(until=...)."""
import numba
import numpy as np
import pytest

import kadj
from kadj.errors import DifferentiationError
from kadj.schedules import binomial_cost

N = 12
RNG = np.random.default_rng(5)
X0 = RNG.random(N)
TARGET = RNG.random(N)


@kadj.differentiate
@numba.njit
def heat(u, v, alpha):
    for i in range(1, u.shape[0] - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + 0.05 * u[i] * u[i]


@kadj.differentiate
@numba.njit
def damp(u, v, alpha):
    for i in range(u.shape[0]):
        v[i] = u[i] * (1.0 - alpha)


@kadj.differentiate
@numba.njit
def sqloss(u, target, out):
    s = 0.0
    for i in range(u.shape[0]):
        s += (u[i] - target[i]) ** 2
    out[0] = s


def step(i, u, v):
    heat(u, v, 0.1)
    return v, u


def ping_pong(n, checkpoint=None, until=None):
    u0, v0, out = X0.copy(), np.zeros(N), np.zeros(1)
    with kadj.Tape() as tape:
        if until is not None:
            u, v = kadj.checkpointed_loop(step, (u0, v0), snapshots=checkpoint,
                                          until=until)
        elif checkpoint:
            u, v = kadj.checkpointed_loop(step, (u0, v0), steps=n, snapshots=checkpoint)
        else:
            u, v = u0, v0
            for i in range(n):
                u, v = step(i, u, v)
        sqloss(u, TARGET, out)
    tape.backward(out)
    return tape, u0


def test_memory_report_store_everything_exact_bytes():
    n = 6
    tape, _ = ping_pong(n)
    rep = tape.memory_report()
    # launch k >= 1 overwrites the array launch k-1 read: one copy of N doubles each
    assert rep.launches == n + 1
    assert rep.snapshots == n - 1
    assert rep.snapshot_bytes == rep.peak_snapshot_bytes == (n - 1) * N * 8
    assert rep.by_array == {"heat.u (launch #0)": 3 * N * 8,
                            "heat.v (launch #0)": 2 * N * 8}
    assert rep.by_level == {"host": (n - 1) * N * 8}
    assert rep.loops == ()
    assert "5 snapshots" in str(rep) and "480 B" in str(rep)


def test_memory_report_checkpointed_loop_exact_bytes():
    n, s = 10, 3
    tape, _ = ping_pong(n, checkpoint=s)
    rep = tape.memory_report()
    (lp,) = rep.loops
    state = 2 * N * 8
    # the tape copies the initial state (both arrays); the loop held at most s - 1
    # more copies during the run, none once the backward is done
    assert rep.snapshots == 2
    assert lp.steps == n and lp.snapshot_limit == s
    assert lp.peak_snapshots == s and lp.snapshots_now == 1
    assert lp.snapshot_bytes == 0 and lp.peak_snapshot_bytes == (s - 1) * state
    assert lp.working_bytes == state
    assert lp.forward_executions == binomial_cost(n, s) == 16
    assert lp.recomputed_steps == 16 - n
    assert rep.snapshot_bytes == state
    assert rep.peak_snapshot_bytes == state + (s - 1) * state
    assert "6 recomputed" in str(rep)


def test_scalar_grad_sums_over_launches_and_loops():
    alpha = 0.07

    def run(a, checkpoint):
        u0, v0, w, out = X0.copy(), np.zeros(N), np.zeros(N), np.zeros(1)

        def st(i, u, v):
            heat(u, v, a)
            return v, u

        with kadj.Tape() as tape:
            if checkpoint:
                u, v = kadj.checkpointed_loop(st, (u0, v0), steps=5, snapshots=2)
            else:
                u, v = u0, v0
                for i in range(5):
                    u, v = st(i, u, v)
            heat(u, w, a)
            damp(w, v, 0.3)
            sqloss(v, TARGET, out)
        tape.backward(out)
        return tape, out[0]

    eps = 1e-6
    fd = (run(alpha + eps, False)[1] - run(alpha - eps, False)[1]) / (2 * eps)
    for checkpoint in (False, True):
        tape, _ = run(alpha, checkpoint)
        assert tape.scalar_grad("alpha", kernel="heat") == pytest.approx(fd, rel=1e-6)
        assert tape.scalar_grad("alpha", kernel=heat) == pytest.approx(fd, rel=1e-6)
        with pytest.raises(DifferentiationError, match="several kernels"):
            tape.scalar_grad("alpha")
        assert tape.scalar_grad("alpha", kernel="damp") == pytest.approx(
            sum(g.value for g in tape.scalar_grads() if g.kernel_name == "damp"))
        with pytest.raises(DifferentiationError, match="no recorded launch|No recorded"):
            tape.scalar_grad("beta")


@pytest.mark.parametrize("stop,s", [(1, 1), (2, 3), (9, 2), (25, 4)])
def test_loop_until_matches_store_everything(stop, s):
    ref, ref_u0 = ping_pong(stop)
    seen = []

    def until(i, u, v):
        seen.append(i)
        return i + 1 == stop

    got, u0 = ping_pong(None, checkpoint=s, until=until)
    assert seen == list(range(stop))          # checked once per step, first sweep only
    np.testing.assert_allclose(got.grad(u0), ref.grad(ref_u0), rtol=1e-12, atol=1e-15)
    (lp,) = got.memory_report().loops
    assert lp.steps == stop
    assert lp.forward_executions <= binomial_cost(stop, s // 2 + 1) + stop - 1
    assert lp.peak_snapshots <= s
    got.zero()                                # a second backward: same gradient
    got.backward(seeds=[(got.launches[-1].args[2], np.ones(1))])
    np.testing.assert_allclose(got.grad(u0), ref.grad(ref_u0), rtol=1e-12, atol=1e-15)


def test_loop_needs_steps_or_until():
    with kadj.Tape():
        with pytest.raises(DifferentiationError, match="steps= .* or until="):
            kadj.checkpointed_loop(step, (np.zeros(N), np.zeros(N)), snapshots=2)
