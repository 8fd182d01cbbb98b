"""The tape's fast paths (arrays found by identity and by span, adjoints called
directly) refuse what the full checks refuse, in long tapes; gradients of long tapes
against an analytic reference; the memory of a long checkpointed loop stays bounded."""
import tracemalloc
import warnings

import numba
import numpy as np
import pytest

import kadj
from kadj.errors import DifferentiationError

N = 32
ALPHA = 0.2


@kadj.differentiate
@numba.njit
def smooth(u, v, alpha):
    n = u.shape[0]
    for i in range(1, n - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])
    v[0] = u[0]
    v[n - 1] = u[n - 1]


@kadj.differentiate
@numba.njit
def sumsq(u, out):
    s = 0.0
    for i in range(u.shape[0]):
        s += u[i] * u[i]
    out[0] = s


@pytest.fixture
def rng():
    return np.random.default_rng(3)


def smooth_matrix(n, alpha=ALPHA):
    m = np.eye(n)
    for i in range(1, n - 1):
        m[i, i - 1:i + 2] += alpha * np.array([1.0, -2.0, 1.0])
    return m


def test_long_tape_gradient_matches_the_analytic_one(rng):
    # ping-pong buffers and fresh arrays mixed: copies, versions and new arrays
    u0 = rng.random(N)
    out = np.zeros(1)
    fresh = [np.zeros(N) for _ in range(150)]
    with kadj.Tape() as tape:
        a, b = u0, np.zeros(N)
        for k in range(300):
            if k % 2:
                b = fresh[k // 2]
            smooth(a, b, ALPHA)
            a, b = b, a
        sumsq(a, out)
    tape.backward(out)
    m = np.linalg.matrix_power(smooth_matrix(N), 300)
    expected = 2.0 * m.T @ (m @ u0)
    np.testing.assert_allclose(tape.grad(u0), expected, rtol=1e-10, atol=1e-12)
    # the scalar's gradient: d/dalpha of |M(alpha)^300 u0|^2 by central differences
    h = 1e-6
    f = [float(np.sum((np.linalg.matrix_power(smooth_matrix(N, ALPHA + s), 300)
                       @ u0) ** 2)) for s in (h, -h)]
    assert tape.scalar_grad("alpha") == pytest.approx((f[0] - f[1]) / (2 * h), rel=1e-6)


def test_a_view_overlapping_an_early_array_is_refused_late_in_a_long_tape():
    pool = np.zeros(40 * N)
    with kadj.Tape():
        first = pool[:N]
        smooth(np.ones(N), first, ALPHA)
        scratch = [np.zeros(N) for _ in range(300)]
        for k in range(299):
            smooth(scratch[k], scratch[k + 1], ALPHA)
        with pytest.raises(DifferentiationError, match="overlaps in memory"):
            smooth(scratch[-1], pool[N // 2:N // 2 + N], ALPHA)


def test_interleaved_views_are_told_apart_exactly():
    pool = np.zeros(4 * N)
    with kadj.Tape():
        smooth(np.ones(N), pool[0::4], ALPHA)        # spans of these views meet,
        smooth(np.ones(N), pool[1::4], ALPHA)        # their elements do not
        smooth(np.ones(N), pool[2::4], ALPHA)
        with pytest.raises(DifferentiationError, match="overlaps in memory"):
            smooth(np.ones(N // 2), pool[0::8], ALPHA)   # every other element of [0::4]


def test_overlapping_arguments_of_one_launch_are_refused_in_a_long_tape(rng):
    u, v = rng.random(N), np.zeros(N)
    pool = np.zeros(3 * N)
    with kadj.Tape():
        for _ in range(200):
            smooth(u, v, ALPHA)
            u, v = v, u
        with pytest.raises(DifferentiationError, match="overlaps in memory"):
            smooth(pool[:N], pool[N // 2:N // 2 + N], ALPHA)     # both new
        with pytest.raises(DifferentiationError, match="same array"):
            smooth(u, u, ALPHA)                                   # both tracked


def test_a_change_between_launches_is_caught_after_many_launches(rng):
    u, v, out = rng.random(N), np.zeros(N), np.zeros(1)
    with kadj.Tape() as tape:
        a, b = u, v
        for k in range(400):
            if k == 250:
                a[3] += 1.0                   # unrecorded, on a tracked array
            smooth(a, b, ALPHA)
            a, b = b, a
        sumsq(a, out)
    with pytest.raises(DifferentiationError, match="changed outside the recorded"):
        tape.backward(out)


def test_an_array_object_changed_in_place_is_not_taken_for_its_old_view():
    buf = np.zeros(2 * N)
    a = buf[:N]
    with kadj.Tape():
        for _ in range(50):
            smooth(np.ones(N), a, ALPHA)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            a.strides = (16,)                 # the same object, now buf[::2]
        with pytest.raises(DifferentiationError, match="overlaps in memory"):
            smooth(np.ones(N), a, ALPHA)


def test_a_written_argument_whose_elements_share_memory_is_refused_late_in_a_tape():
    # refused when recorded, as k.adjoint refuses it (the tape used to record it and
    # leave the refusal to the replay)
    u = np.ones(N)
    base = np.zeros(N)
    stuck = np.lib.stride_tricks.as_strided(base, shape=(N,), strides=(0,))
    with kadj.Tape():
        for _ in range(20):
            smooth(u, np.zeros(N), ALPHA)
        with pytest.raises(kadj.DifferentiationError, match="share memory"):
            smooth(u, stuck, ALPHA)
    assert not base.any()


def _loop_gradient(n, steps, s):
    u0, v0, out = np.linspace(0.0, 1.0, n), np.zeros(n), np.zeros(1)

    def step(i, u, v):
        smooth(u, v, ALPHA)
        return v, u

    with kadj.Tape() as tape:
        u, v = kadj.checkpointed_loop(step, (u0, v0), steps=steps, snapshots=s)
        sumsq(u, out)
    tape.backward(out)
    return tape, tape.grad(u0)


def test_checkpointed_loop_memory_stays_within_the_snapshots():
    n, steps, s = 50_000, 1000, 10
    state_bytes = 2 * n * 8
    _loop_gradient(1024, 5, 2)                # compile outside the traced region
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        tape, g = _loop_gradient(n, steps, s)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    loop = tape.memory_report().loops[0]
    assert loop.peak_snapshots <= s
    # measured: s + 5.8 states.  The s snapshots (the tape's copy of the initial
    # state among them), the working state, the state's adjoints, while a step is
    # reversed its own tape's seeds, buffers and gradients (3 states), and the
    # schedule (Python lists, about 0.5 MB); the store-everything tape holds ~1000
    assert peak <= (s + 7) * state_bytes, peak / state_bytes
    m = np.linalg.matrix_power(smooth_matrix(64), 5)
    _, g_small = _loop_gradient(64, 5, 2)
    u0 = np.linspace(0.0, 1.0, 64)
    np.testing.assert_allclose(g_small, 2.0 * m.T @ (m @ u0), rtol=1e-10)
    assert np.isfinite(g).all() and np.abs(g).max() > 0
