"""Tape tests: recording, versioned snapshots, reverse replay, seeds and errors.

The first part uses small fake kernels with hand-written adjoints (the contract of
a differentiated kernel: forward, adjoint, adjoint_plan, and recording on call), so
the tape is checked independently of the code generator; every gradient is compared
with central finite differences of the whole launch sequence.  The last part runs
the same checks on real ``@kadj.differentiate @njit`` kernels.
"""
import threading

import numpy as np
import pytest

import kadj
import kadj.tape
from kadj.errors import DifferentiationError
from kadj.tape import Launch, Tape, active


# ----------------------------------------------------------------- fake kernels
from fake_kernels import (FakeKernel, axpy, close, fake, fd_gradient,  # noqa: E402,F401
                          scale, square_inplace, sumsq)


# y = x1 * x2
@fake(("x1", "x2", "y"), written={2}, read={0, 1})
def mul(x1, x2, y):
    y[:] = x1 * x2


@mul
def mul(fwd, adj):
    (x1, x2, y), (adj_x1, adj_x2, adj_y) = fwd, adj
    adj_x1 += x2 * adj_y
    adj_x2 += x1 * adj_y
    adj_y[:] = 0.0


# y = x[idx]  (idx: an integer array)
@fake(("x", "idx", "y"), written={2}, read={0, 1})
def gather(x, idx, y):
    y[:] = x[idx]


@gather
def gather(fwd, adj):
    (x, idx, y), (adj_x, adj_y) = fwd, adj
    np.add.at(adj_x, idx, adj_y)
    adj_y[:] = 0.0


# idx = (idx + 1) % n, in place, not differentiable
@fake(("idx",), written={0}, read={0})
def roll_index(idx):
    idx[:] = (idx + 1) % idx.shape[0]


@roll_index
def roll_index(fwd, adj):
    pass


# returns sum(x**3)
@fake(("x",), written=(), read={0}, returns_value=True)
def cube_sum(x):
    return float(np.sum(x ** 3))


@cube_sum
def cube_sum(fwd, adj, adj_return=1.0):
    (x,), (adj_x,) = fwd, adj
    adj_x += 3.0 * x * x * adj_return


@fake(("x", "y"), written={1}, read={0})
def broken(x, y):
    y[:] = x
    raise RuntimeError("forward failed")


@broken
def broken(fwd, adj):
    pass


# ----------------------------------------------------------------- helpers


@pytest.fixture
def rng():
    return np.random.default_rng(1)


# ------------------------------------------------------------- activation


def test_active_is_none_outside_a_tape():
    assert active() is None


def test_innermost_nested_tape_is_the_active_one():
    with Tape() as outer:
        assert active() is outer
        with Tape() as inner:
            assert active() is inner
        assert active() is outer
    assert active() is None


def test_active_tape_is_thread_local():
    seen = []
    with Tape():
        t = threading.Thread(target=lambda: seen.append(active()))
        t.start()
        t.join()
    assert seen == [None]


def test_entering_an_active_tape_again_is_refused():
    with Tape() as tape:
        with pytest.raises(DifferentiationError, match="already active"):
            with tape:
                pass


def test_calls_outside_a_tape_only_run_the_forward():
    x, y = np.arange(3.0), np.zeros(3)
    scale(x, y, 2.0)
    np.testing.assert_array_equal(y, [0.0, 2.0, 4.0])


# ------------------------------------------------------------- recording


def test_record_runs_the_forward_and_keeps_a_launch_record(rng):
    x, y = rng.standard_normal(4), np.zeros(4)
    with Tape() as tape:
        scale(x, y, 3.0)
    close(y, 3.0 * x)
    (launch,) = tape.launches
    assert isinstance(launch, Launch)
    assert launch.config is None and launch.index == 0
    assert launch.args[0] is x and launch.args[2] == 3.0
    with pytest.raises(AttributeError):
        launch.index = 1  # frozen


def test_record_returns_the_forward_result(rng):
    x = rng.standard_normal(3)
    with Tape():
        value = cube_sum(x)
    assert value == pytest.approx(np.sum(x ** 3))


def test_a_failing_forward_is_not_recorded(rng):
    x, y = rng.standard_normal(3), np.zeros(3)
    with Tape() as tape:
        with pytest.raises(RuntimeError):
            broken(x, y)
    assert tape.launches == ()


def test_grad_of_an_array_only_a_failed_launch_passed(rng):
    """tape.grad of an array passed only to a launch that raised says so (it said the
    array was not floating point or excluded with wrt=); the tape goes on recording."""
    x, y, loss = rng.standard_normal(3), np.zeros(3), np.zeros(1)
    a, b = rng.standard_normal(3), np.zeros(3)
    with Tape() as tape:
        scale(x, y, 2.0)
        with pytest.raises(RuntimeError):
            broken(a, b)
        sumsq(y, loss)
    tape.backward(loss)
    with pytest.raises(DifferentiationError, match=r"the launch of kernel 'broken' that "
                       "passed it raised RuntimeError, and a launch that raises is not "
                       "recorded"):
        tape.grad(a)
    close(tape.grad(x), 8.0 * x)


def test_messages_keep_kernel_names_as_written(rng):
    camel = FakeKernel(square_inplace.fn, square_inplace.adj, ("y",), {0}, {0})
    camel.__name__ = "squareInPlace"
    with Tape(copy_inputs=False):
        with pytest.raises(DifferentiationError) as info:
            camel(rng.standard_normal(3))
    assert "Launch #0 (kernel 'squareInPlace')" in str(info.value)


# -------------------------------------------------------- gradients vs FD


def test_single_launch_gradient(rng):
    x, y, loss = rng.standard_normal(5), np.zeros(5), np.zeros(1)
    with Tape() as tape:
        scale(x, y, 1.5)
        sumsq(y, loss)
    tape.backward(loss)
    close(tape.grad(x), 2 * 1.5 ** 2 * x)
    close(tape.grad(y), np.zeros(5))
    close(tape.grad(loss), [0.0])  # loss is overwritten by sumsq


def sequence_with_overwrite(x, y, loss, a=0.7, b=-1.3):
    scale(x, y, a)        # reads x
    square_inplace(x)     # overwrites x, which launch 0 read
    axpy(x, y, b)         # y += b * x**2
    sumsq(y, loss)


def sequence_loss(x, y, a=0.7, b=-1.3):
    loss = np.zeros(1)
    sequence_with_overwrite(x, y, loss, a, b)
    return loss[0]


def test_sequence_with_overwritten_input_matches_finite_differences(rng):
    x0, y0 = rng.standard_normal(5), rng.standard_normal(5)
    x, y, loss = x0.copy(), y0.copy(), np.zeros(1)
    with Tape() as tape:
        sequence_with_overwrite(x, y, loss)
    close(x, x0 ** 2)  # the forward really ran
    tape.backward(loss)
    g_x, g_y = fd_gradient(sequence_loss, [x0, y0])
    close(tape.grad(x), g_x)
    close(tape.grad(y), g_y)  # y0 is overwritten by launch 0: zero
    assert tape.snapshot_count == 2  # x before launch 1, y before launch 2


def test_scalar_gradients_are_per_launch(rng):
    x0, y0 = rng.standard_normal(5), rng.standard_normal(5)
    x, y, loss = x0.copy(), y0.copy(), np.zeros(1)
    with Tape() as tape:
        sequence_with_overwrite(x, y, loss, 0.7, -1.3)
    tape.backward(loss)
    eps = 1e-6
    d_a = (sequence_loss(x0.copy(), y0.copy(), 0.7 + eps)
           - sequence_loss(x0.copy(), y0.copy(), 0.7 - eps)) / (2 * eps)
    d_b = (sequence_loss(x0.copy(), y0.copy(), 0.7, -1.3 + eps)
           - sequence_loss(x0.copy(), y0.copy(), 0.7, -1.3 - eps)) / (2 * eps)
    grads = {(s.launch, s.arg_name): s for s in tape.scalar_grads()}
    assert set(grads) == {(0, "a"), (2, "b")}
    assert grads[(0, "a")].kernel_name == "scale"
    np.testing.assert_allclose(grads[(0, "a")].value, d_a, rtol=1e-7)
    np.testing.assert_allclose(grads[(2, "b")].value, d_b, rtol=1e-7)


def test_same_array_written_by_several_launches(rng):
    x0 = rng.standard_normal(4)
    x, loss = x0.copy(), np.zeros(1)
    with Tape() as tape:
        square_inplace(x)
        square_inplace(x)
        sumsq(x, loss)
    tape.backward(loss)
    close(tape.grad(x), 8 * x0 ** 7)  # loss = sum(x**8)


def test_read_only_array_passed_twice(rng):
    x, y, loss = rng.standard_normal(4), np.zeros(4), np.zeros(1)
    with Tape() as tape:
        mul(x, x, y)
        sumsq(y, loss)
    tape.backward(loss)
    close(tape.grad(x), 4 * x ** 3)


def test_integer_arrays_are_versioned_too(rng):
    x0 = rng.standard_normal(4)
    idx0 = np.array([3, 3, 0, 1])

    def run(x, idx, loss):
        y, z, w = np.zeros(4), np.zeros(4), np.zeros(4)
        gather(x, idx, y)      # reads idx
        roll_index(idx)        # overwrites idx
        gather(y, idx, z)
        mul(z, x, w)
        sumsq(w, loss)

    x, idx, loss = x0.copy(), idx0.copy(), np.zeros(1)
    with Tape() as tape:
        run(x, idx, loss)
    tape.backward(loss)

    def total(x):
        out = np.zeros(1)
        run(x, idx0.copy(), out)
        return out[0]

    (g_x,) = fd_gradient(total, [x0])
    close(tape.grad(x), g_x)


def test_identical_views_are_the_same_array(rng):
    u = np.zeros((3, 4))
    u[0] = rng.standard_normal(4)
    u0 = u[0].copy()
    loss = np.zeros(1)
    with Tape() as tape:
        for t in range(2):
            scale(u[t], u[t + 1], 0.5)  # fresh view objects each time
        sumsq(u[2], loss)
    tape.backward(loss)
    close(tape.grad(u[0]), 2 * 0.5 ** 4 * u0)


def test_returning_kernels_replay_with_zero_return_cotangent(rng):
    x, y, loss = rng.standard_normal(3), np.zeros(3), np.zeros(1)
    with Tape() as tape:
        cube_sum(x)
        scale(x, y, 2.0)
        sumsq(y, loss)
    tape.backward(loss)
    close(tape.grad(x), 8.0 * x)


def test_general_seeds(rng):
    x, y = rng.standard_normal(4), np.zeros(4)
    dy = rng.standard_normal(4)
    with Tape() as tape:
        scale(x, y, 3.0)
    tape.backward(seeds=[(y, dy)])
    close(tape.grad(x), 3.0 * dy)
    (s,) = tape.scalar_grads()
    assert s.value == pytest.approx(float(x @ dy))


def test_gradients_do_not_modify_user_arrays(rng):
    x0, y0 = rng.standard_normal(5), rng.standard_normal(5)
    x, y, loss = x0.copy(), y0.copy(), np.zeros(1)
    with Tape() as tape:
        sequence_with_overwrite(x, y, loss)
    after = [x.copy(), y.copy(), loss.copy()]
    tape.backward(loss)
    tape.grad(x)[:] = 99.0  # a copy
    for a, b in zip([x, y, loss], after):
        np.testing.assert_array_equal(a, b)
    close(tape.grad(x), fd_gradient(sequence_loss, [x0, y0])[0])


# ------------------------------------------------------- zero and reset


def test_backward_accumulates_until_zero(rng):
    x, y, loss = rng.standard_normal(4), np.zeros(4), np.zeros(1)
    with Tape() as tape:
        scale(x, y, 2.0)
        sumsq(y, loss)
    tape.backward(loss)
    first = tape.grad(x)
    tape.backward(loss)
    close(tape.grad(x), 2 * first)
    tape.zero()
    close(tape.grad(x), np.zeros(4))
    tape.backward(loss)
    close(tape.grad(x), first)


def test_reset_forgets_launches(rng):
    x, y, loss = rng.standard_normal(4), np.zeros(4), np.zeros(1)
    with Tape() as tape:
        scale(x, y, 2.0)
        sumsq(y, loss)
    tape.backward(loss)
    tape.reset()
    assert tape.launches == () and tape.snapshot_count == 0
    with pytest.raises(DifferentiationError, match="never saw"):
        tape.grad(x)
    with tape:
        sumsq(x, loss)
    tape.backward(loss)
    close(tape.grad(x), 2 * x)


# ----------------------------------------------------- copy_inputs=False


def test_no_copy_tape_refuses_to_overwrite_what_an_adjoint_needs(rng):
    x0 = rng.standard_normal(3)
    x, y = x0.copy(), np.zeros(3)
    with Tape(copy_inputs=False) as tape:
        scale(x, y, 2.0)
        with pytest.raises(DifferentiationError) as info:
            square_inplace(x)
    message = str(info.value)
    assert "Launch #1 (kernel 'square_inplace')" in message
    assert "launch #0 (kernel 'scale')" in message
    assert "'x'" in message and "copy_inputs=False" in message
    np.testing.assert_array_equal(x, x0)  # the refused forward did not run
    assert len(tape.launches) == 1


def test_no_copy_tape_refuses_in_place_updates(rng):
    with Tape(copy_inputs=False):
        with pytest.raises(DifferentiationError, match="reads and overwrites"):
            square_inplace(rng.standard_normal(3))


def test_no_copy_tape_records_sequences_without_overwrites(rng):
    x, y, loss = rng.standard_normal(4), np.zeros(4), np.zeros(1)
    with Tape(copy_inputs=False) as tape:
        scale(x, y, 2.0)
        sumsq(y, loss)
        sumsq(x, loss)  # overwrites loss, which no recorded launch read
    tape.backward(loss)
    assert tape.snapshot_count == 0
    close(tape.grad(x), 2 * x)


# --------------------------------------------------------------- errors


def recorded(rng):
    x, y, loss = rng.standard_normal(4), np.zeros(4), np.zeros(1)
    with Tape() as tape:
        scale(x, y, 2.0)
        sumsq(y, loss)
    return tape, x, y, loss


def test_backward_on_an_empty_tape(rng):
    with pytest.raises(DifferentiationError, match="recorded no launches"):
        Tape().backward(np.zeros(1))


def test_backward_needs_a_seed(rng):
    tape, *_ = recorded(rng)
    with pytest.raises(DifferentiationError, match="needs something"):
        tape.backward()


def test_backward_on_a_loss_with_several_elements(rng):
    tape, x, y, loss = recorded(rng)
    with pytest.raises(DifferentiationError, match="1-element"):
        tape.backward(y)


def test_backward_on_an_unseen_loss(rng):
    tape, *_ = recorded(rng)
    with pytest.raises(DifferentiationError, match="never saw the loss"):
        tape.backward(np.zeros(1))


def test_seed_shape_mismatch(rng):
    tape, x, y, loss = recorded(rng)
    with pytest.raises(DifferentiationError, match="shape"):
        tape.backward(seeds=[(y, np.ones(3))])


def test_malformed_seeds(rng):
    tape, x, y, loss = recorded(rng)
    for seeds, match in [
            ({0: (y, np.ones(4))}, r"tape.backward\(seeds=...\) takes a list of "
                                   r"\(array, cotangent\) pairs, got dict"),
            (y, "takes a list of .* got array of shape"),
            ((y, np.ones(4)), r"seeds\[0\] is array of shape \(4,\) and dtype float64 "
                              r"\(for one seed, pass a list holding one pair: "
                              r"seeds=\[\(y, dy\)\]\)"),
            ([(y,)], r"seeds\[0\] is tuple"),
            ([(y, np.ones(4)), 3.0], r"seeds\[1\] is float 3.0")]:
        with pytest.raises(DifferentiationError, match=match):
            tape.backward(seeds=seeds)
    tape.backward(seeds=[(y, np.ones(4))])
    close(tape.grad(x), np.full(4, 2.0))


def test_record_refuses_what_is_not_a_kernel():
    with Tape() as tape:
        with pytest.raises(TypeError, match="tape.record takes a differentiated kernel "
                           r"\(kadj.differentiate\) or a custom step, got <built-in "
                           "function print>.*record_custom"):
            tape.record(print, (1,))
    assert tape.launches == ()


def test_seed_on_an_integer_array(rng):
    idx, x, y = np.array([0, 1]), rng.standard_normal(2), np.zeros(2)
    with Tape() as tape:
        gather(x, idx, y)
    with pytest.raises(DifferentiationError, match="floating-point"):
        tape.backward(seeds=[(idx, np.ones(2))])


def test_grad_before_backward(rng):
    tape, x, *_ = recorded(rng)
    with pytest.raises(DifferentiationError, match="before tape.grad"):
        tape.grad(x)


def test_grad_of_an_unseen_array(rng):
    tape, x, y, loss = recorded(rng)
    tape.backward(loss)
    with pytest.raises(DifferentiationError, match="never saw"):
        tape.grad(np.zeros(4))


def test_grad_of_an_integer_array(rng):
    idx, x, y, loss = np.array([0, 1]), rng.standard_normal(2), np.zeros(2), np.zeros(1)
    with Tape() as tape:
        gather(x, idx, y)
        sumsq(y, loss)
    tape.backward(loss)
    with pytest.raises(DifferentiationError, match="not floating point"):
        tape.grad(idx)


def test_written_array_passed_twice_is_refused(rng):
    x = rng.standard_normal(3)
    with Tape():
        with pytest.raises(DifferentiationError, match="same array"):
            scale(x, x, 2.0)


def test_overlapping_views_are_refused(rng):
    u = rng.standard_normal(6)
    with Tape():
        scale(u[:4], np.zeros(4), 2.0)
        with pytest.raises(DifferentiationError, match="overlaps in memory"):
            scale(u[1:5], np.zeros(4), 2.0)


def test_a_written_array_whose_elements_share_memory_is_refused(rng):
    # as k.adjoint refuses it: the tape would give each element its own adjoint
    from numpy.lib.stride_tricks import as_strided
    cell = np.zeros(1)
    y = as_strided(cell, shape=(4,), strides=(0,))
    with Tape() as tape:
        with pytest.raises(DifferentiationError, match="share memory"):
            scale(rng.standard_normal(4), y, 2.0)
        scale(y, np.zeros(4), 2.0)      # read only: accepted, as by k.adjoint
    assert len(tape._launches) == 1 and cell[0] == 0.0


def test_empty_views_of_one_array_are_not_aliases(rng):
    # two empty slices of one array share no element: recorded (and run) as outside
    # a tape; an overlapping view says to pass the whole array and index it
    u = rng.standard_normal(8)
    with Tape() as tape:
        scale(u[3:3], u[5:5], 2.0)
    assert len(tape._launches) == 1
    with Tape():
        scale(u, np.zeros(8), 2.0)
        with pytest.raises(DifferentiationError, match="the whole array and the index"):
            scale(u[2:6], np.zeros(4), 2.0)


def test_tuples_holding_arrays_are_refused(rng):
    with Tape():
        with pytest.raises(DifferentiationError, match="tuple holding arrays"):
            scale((np.zeros(2),), np.zeros(2), 2.0)


def test_disjoint_interleaved_views_are_accepted(rng):
    u = rng.standard_normal(6)
    with Tape() as tape:
        scale(u[::2], u[1::2], 2.0)
    assert len(tape.launches) == 1


# ------------------------------------------------------ real kadj kernels

differentiate = getattr(kadj, "differentiate", None)
needs_core = pytest.mark.skipif(differentiate is None,
                                reason="kadj.differentiate is not available yet")

if differentiate is not None:
    from numba import njit

    @differentiate
    @njit
    def heat_step(u, u_new, alpha):
        for i in range(1, u.shape[0] - 1):
            u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])

    @differentiate
    @njit
    def relax(u, alpha):
        for i in range(1, u.shape[0] - 1):
            u[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])

    @differentiate
    @njit
    def l2_loss(u, target, loss):
        s = 0.0
        for i in range(u.shape[0]):
            d = u[i] - target[i]
            s += d * d
        loss[0] = s


def heat_sequence(u0, u1, u2, target, loss, alpha=0.2):
    heat_step(u0, u1, alpha)
    heat_step(u1, u2, alpha)
    l2_loss(u2, target, loss)


def ping_pong(a, b, target, loss, alpha=0.2):
    heat_step(a, b, alpha)
    heat_step(b, a, alpha)      # overwrites a, which launch 0 read
    heat_step(a, b, alpha)      # overwrites b, which launch 1 read
    relax(b, alpha)             # in place
    relax(b, alpha)             # the same array written again
    l2_loss(b, target, loss)


@pytest.fixture
def heat_data(rng):
    u0 = np.sin(np.linspace(0, 3, 12)) + 0.1 * rng.standard_normal(12)
    return u0, rng.standard_normal(12)


@needs_core
def test_heat_sequence_matches_finite_differences(heat_data):
    u0, target = heat_data
    def loss_of(u, t):
        loss = np.zeros(1)
        heat_sequence(u, np.zeros(12), np.zeros(12), t, loss)
        return loss[0]

    u1, u2, loss = np.zeros(12), np.zeros(12), np.zeros(1)
    with kadj.Tape() as tape:  # the public name
        heat_sequence(u0, u1, u2, target, loss)
    tape.backward(loss)
    g_u0, g_target = fd_gradient(loss_of, [u0, target])
    close(tape.grad(u0), g_u0)
    close(tape.grad(target), g_target)
    assert tape.snapshot_count == 0  # nothing is overwritten after being read


@needs_core
def test_ping_pong_and_in_place_updates_match_finite_differences(heat_data):
    a0, target = heat_data

    def loss_of(a, t):
        loss = np.zeros(1)
        ping_pong(a.copy(), np.zeros_like(a), t, loss)
        return loss[0]

    a, b, loss = a0.copy(), np.zeros(12), np.zeros(1)
    with Tape() as tape:
        ping_pong(a, b, target, loss)
    tape.backward(loss)
    (g_a,) = fd_gradient(lambda x: loss_of(x, target), [a0])
    close(tape.grad(a), g_a)
    alpha_grads = [s.value for s in tape.scalar_grads() if s.arg_name == "alpha"]
    eps = 1e-6

    def loss_alpha(alpha):
        loss = np.zeros(1)
        ping_pong(a0.copy(), np.zeros(12), target, loss, alpha)
        return loss[0]

    d_alpha = (loss_alpha(0.2 + eps) - loss_alpha(0.2 - eps)) / (2 * eps)
    assert len(alpha_grads) == 5
    np.testing.assert_allclose(sum(alpha_grads), d_alpha, rtol=1e-6)


@needs_core
def test_real_kernels_zero_and_reset(heat_data):
    u0, target = heat_data
    u1, u2, loss = np.zeros(12), np.zeros(12), np.zeros(1)
    with Tape() as tape:
        heat_sequence(u0, u1, u2, target, loss)
    tape.backward(loss)
    first = tape.grad(u0)
    tape.backward(loss)
    close(tape.grad(u0), 2 * first)
    tape.zero()
    tape.backward(loss)
    close(tape.grad(u0), first)
    tape.reset()
    assert tape.launches == ()
    with pytest.raises(DifferentiationError, match="never saw"):
        tape.grad(u0)


@needs_core
def test_real_kernels_refuse_overwrites_without_copies(heat_data):
    a, target = heat_data
    b = np.zeros(12)
    with Tape(copy_inputs=False):
        heat_step(a, b, 0.2)
        with pytest.raises(DifferentiationError) as info:
            heat_step(b, a, 0.2)
    assert "launch #0 (kernel 'heat_step')" in str(info.value)
    assert "argument 'u_new'" in str(info.value)


@needs_core
def test_real_kernels_run_the_forward_once_under_a_tape(heat_data):
    u0, target = heat_data
    expected = np.zeros(12)
    heat_step.forward(u0, expected, 0.2)
    u1 = np.zeros(12)
    with Tape() as tape:
        heat_step(u0, u1, 0.2)
    np.testing.assert_array_equal(u1, expected)
    assert len(tape.launches) == 1
