"""The per-launch fast paths of the tape: one-launch steps of checkpointed_loop replayed
without a private tape (kadj.tape_step) give the gradients of finite differences, and
the checks still refuse what they refused; kadj.arrays.KeyMemo gives memory_key's keys."""
import numba
import numpy as np
import pytest

import kadj
from kadj import arrays, tape_step
from kadj.errors import DifferentiationError

N = 10


@kadj.differentiate
@numba.njit
def relax(u, v, alpha, f):
    for i in range(1, u.shape[0] - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + f[i] * u[i] * u[i]


@kadj.differentiate
@numba.njit
def scale(u, v, beta):
    for i in range(u.shape[0]):
        v[i] = beta * u[i]


@kadj.differentiate
@numba.njit
def decay(u, f):
    for i in range(u.shape[0]):
        u[i] = u[i] * (0.9 + f[i]) - 0.1 * u[i] * u[i]


@kadj.differentiate
@numba.njit
def sqsum(u, out):
    s = 0.0
    for i in range(u.shape[0]):
        s += u[i] * u[i] * (1.0 + 0.1 * i)
    out[0] = s


RNG = np.random.default_rng(3)
F = RNG.random(N) * 0.05
X0 = RNG.random(N)


def run(u, f, steps, snapshots, two_launches=False):
    v, out = np.zeros(N), np.zeros(1)

    def step(i, u, v):
        relax(u, v, 0.1, f)
        if two_launches:
            scale(v, u, 0.9)
            return u, v
        return v, u

    u, v = kadj.checkpointed_loop(step, (u, v), steps=steps, snapshots=snapshots)
    sqsum(u, out)
    return out


def fd_grad(fn, x, h=1e-6):
    g = np.zeros_like(x)
    for k in range(x.size):
        xp, xm = x.copy(), x.copy()
        xp[k] += h
        xm[k] -= h
        g[k] = (fn(xp) - fn(xm)) / (2 * h)
    return g


@pytest.fixture
def replays(monkeypatch):
    """Counts the steps replayed without a private tape."""
    count = [0]
    original = tape_step.StepReplay.replay

    def counted(self, *args):
        count[0] += 1
        return original(self, *args)
    monkeypatch.setattr(tape_step.StepReplay, "replay", counted)
    return count


@pytest.mark.parametrize("two_launches", [False, True])
def test_one_launch_steps_skip_the_private_tape_and_match_fd(replays, two_launches):
    steps, snapshots = 9, 3
    x0, f = X0.copy(), F.copy()
    with kadj.Tape() as tape:
        out = run(x0, f, steps, snapshots, two_launches)
    tape.backward(out)
    g_x, g_f = tape.grad(x0), tape.grad(f)
    alpha = tape.scalar_grad("alpha")
    if two_launches:
        assert replays[0] == 0          # steps of two launches take the tape's path
    else:   # the last two steps (u -> v and v -> u) are checked by a private tape
        assert replays[0] == steps - 2
    ref_x = fd_grad(lambda x: run(x.copy(), F, steps, snapshots, two_launches)[0], X0)
    ref_f = fd_grad(lambda ff: run(X0.copy(), ff, steps, snapshots, two_launches)[0], F)
    np.testing.assert_allclose(g_x, ref_x, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(g_f, ref_f, rtol=1e-6, atol=1e-9)

    def with_alpha(a):
        u, v, out = X0.copy(), np.zeros(N), np.zeros(1)
        for _ in range(steps):
            relax.forward(u, v, a, F)
            if two_launches:
                scale.forward(v, u, 0.9)
            else:
                u, v = v, u
        sqsum.forward(u, out)
        return out[0]
    ref_alpha = (with_alpha(0.1 + 1e-6) - with_alpha(0.1 - 1e-6)) / 2e-6
    assert alpha == pytest.approx(ref_alpha, rel=1e-6)


def test_an_in_place_step_replayed_without_a_tape_matches_fd(replays):
    """One in-place launch per step (the private tape would keep a copy of the state
    array; the direct replay passes the unchanged array itself)."""
    def run_in_place(x, f):
        out = np.zeros(1)

        def step(i, u):
            decay(u, f)
            return (u,)
        (u,) = kadj.checkpointed_loop(step, (x,), steps=7, snapshots=3)
        sqsum(u, out)
        return out

    x, f = X0.copy(), F.copy()
    with kadj.Tape() as tape:
        out = run_in_place(x, f)
    tape.backward(out)
    assert replays[0] == 6
    np.testing.assert_allclose(
        tape.grad(x), fd_grad(lambda v: run_in_place(v.copy(), F)[0], X0),
        rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(
        tape.grad(f), fd_grad(lambda v: run_in_place(X0.copy(), v)[0], F),
        rtol=1e-6, atol=1e-9)


def test_a_second_backward_checks_again_and_adds_up(replays):
    x0 = X0.copy()
    with kadj.Tape() as tape:
        out = run(x0, F, 6, 2)
    tape.backward(out)
    first = tape.grad(x0)
    tape.backward(out)
    np.testing.assert_allclose(tape.grad(x0), 2 * first, rtol=1e-12)
    assert replays[0] == 2 * 4          # each backward checks its first steps again


def test_a_launch_unlike_the_checked_ones_is_checked_by_a_private_tape(replays):
    """Step 2 passes the same array as input and output: its launch differs from the
    checked ones (steps 6 and 5), goes through a private tape, and is refused."""
    u, v, out = X0.copy(), np.zeros(N), np.zeros(1)

    def step(i, u, v):
        relax(u, u if i == 2 else v, 0.1, F)
        return v, u

    with kadj.Tape() as tape:
        u, v = kadj.checkpointed_loop(step, (u, v), steps=7, snapshots=7)
        sqsum(u, out)
    with pytest.raises(DifferentiationError, match="same array"):
        tape.backward(out)
    assert replays[0] == 2              # steps 4 and 3, like steps 6 and 5


def test_key_memo_gives_memory_keys_and_follows_in_place_changes():
    memo = arrays.KeyMemo(limit=3)
    a = np.zeros((4, 6))
    assert memo.key(a) == arrays.memory_key(a)
    assert memo.span(a) == arrays.span(a)
    a.shape = (6, 4)                    # set in place: the key is computed again
    assert memo.key(a) == arrays.memory_key(a) != arrays.memory_key(a.T)
    views = [a[1:], a[:, ::2], a.T, a[2]]
    for b in views:                     # past the limit it starts over
        assert memo.key(b) == arrays.memory_key(b)
        assert memo.span(b) == arrays.span(b)
    assert len(memo._ids) <= 3


def test_a_snapshot_restored_for_the_last_time_is_reversed_in_place(monkeypatch):
    """Where the schedule restores a snapshot, reverses its step and frees it, the step
    is reversed on the snapshot's own arrays: the working state is not overwritten
    (fewer copies than restores), and the gradients are finite differences', with
    steps of one launch (replayed directly once checked) and of two (a private tape)."""
    from kadj import checkpointing, schedules
    sched = schedules.binomial(9, 3)
    restores = sum(a[0] == schedules.RESTORE for a in sched.backward)
    in_place = sum(a[0] == schedules.RESTORE and a[1] != 0 and
                   checkpointing._reversed_then_freed(sched.backward, k)
                   for k, a in enumerate(sched.backward))
    assert 0 < in_place < restores
    copies = []
    real = arrays.copy_into
    monkeypatch.setattr(arrays, "copy_into",
                        lambda dst, src: (copies.append(1), real(dst, src))[1])
    for two in (False, True):
        x0 = X0.copy()
        with kadj.Tape() as tape:
            out = run(x0, F, 9, 3, two)
        copies.clear()
        tape.backward(out)
        # two arrays per restore into the working state
        assert len(copies) == 2 * (restores - in_place), (len(copies), restores, in_place)
        ref = fd_grad(lambda x: run(x.copy(), F, 9, 3, two)[0], X0)
        np.testing.assert_allclose(tape.grad(x0), ref, rtol=1e-6, atol=1e-9)


def test_a_snapshot_of_another_layout_is_restored_as_before():
    """A snapshot whose arrays differ in layout from the working state's (never made by
    the loop itself) does not stand for it: _as_work says no, and the restore copies."""
    from kadj import checkpointing
    loop = checkpointing._Loop.__new__(checkpointing._Loop)
    loop.memo = arrays.KeyMemo()
    loop.work = (np.zeros((4, 3)), np.zeros(5))
    key = loop.memo.key
    same = (np.ones((4, 3)), np.ones(5))
    assert loop._as_work(same) == {key(same[0]): key(loop.work[0]),
                                   key(same[1]): key(loop.work[1])}
    assert loop._as_work((np.ones((4, 3), order="F"), np.ones(5))) is None
    assert loop._as_work((np.ones((4, 3), np.float32), np.ones(5))) is None
