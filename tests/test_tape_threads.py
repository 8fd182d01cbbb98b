"""The Tape with nested tapes and threads: what it records, what it refuses.

Rules under test (kadj/tape.py):
- a launch is recorded on every tape active in the launching thread, so nested
  tapes each hold their own complete sequence;
- a launch made in a thread where no tape is active (or where other tapes are), that
  touches an array recorded by a tape active in another thread, is refused before it
  runs; launches on arrays no active tape has seen run unrecorded;
- a tape is active in at most one thread, once;
- record, backward and grad on one tape are serialized.

Gradients are compared with central finite differences of the same launches replayed
in the recorded order.  The fake kernels follow the kadj kernel contract (forward,
adjoint, adjoint_plan, recording on call) with hand-written adjoints.
"""
import sys
import threading
import time

import numpy as np
import pytest

import kadj
import kadj.tape
from kadj.errors import DifferentiationError
from kadj.tape import Tape, TapeError


from fake_kernels import (axpy, close, fake, fd_gradient, scale,  # noqa: E402
                          square_inplace, sumsq)


@fake(("x", "y", "b"), written={1}, read={0, 1})
def slow_axpy(x, y, b):                  # y += b * x, pausing between read and write
    old = y.copy()
    time.sleep(0.0005)
    y[:] = old + b * x


@slow_axpy
def slow_axpy(fwd, adj):
    (x, y, b), (adj_x, adj_y, adj_b) = fwd, adj
    adj_x += b * adj_y
    adj_b[0] += np.sum(x * adj_y)


ADJOINT_STARTED, ADJOINT_MAY_GO_ON = threading.Event(), threading.Event()


@fake(("x", "loss"), written={1}, read={0})
def waiting_sumsq(x, loss):              # sumsq whose adjoint waits for a signal
    loss[0] = np.sum(x * x)


@waiting_sumsq
def waiting_sumsq(fwd, adj):
    (x, loss), (adj_x, adj_loss) = fwd, adj
    ADJOINT_STARTED.set()
    ADJOINT_MAY_GO_ON.wait(timeout=0.5)
    adj_x += 2.0 * x * adj_loss[0]
    adj_loss[0] = 0.0


# ----------------------------------------------------------------- helpers


def replay(launches, initial):
    """Run the recorded launches' forwards in order on copies of the arrays.

    ``initial`` maps id(live array) to its contents before the first launch; the
    result maps id(live array) to the copy holding its final contents."""
    state = {k: v.copy() for k, v in initial.items()}
    for launch in launches:
        args = [state[id(a)] if isinstance(a, np.ndarray) else a for a in launch.args]
        launch.kernel.fn(*args)
    return state


def run_in_thread(fn, name="worker"):
    """Run ``fn`` in a new thread; return what it returned or the exception it raised."""
    out = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed back to the test's thread
            out["error"] = exc

    t = threading.Thread(target=body, name=name)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(7)


# ----------------------------------------------------------------- nesting


def test_a_launch_in_a_nested_tape_is_recorded_on_both_tapes(rng):
    x0 = rng.standard_normal(5)
    x, y, loss = x0.copy(), np.zeros(5), np.zeros(1)
    with Tape() as outer:
        scale(x, y, 0.7)
        with Tape() as inner:
            square_inplace(y)        # overwrites y, which outer's launch 0 wrote
            axpy(x, y, -1.3)
            sumsq(y, loss)
    assert [launch.kernel for launch in outer.launches] == \
        [scale, square_inplace, axpy, sumsq]
    assert [launch.kernel for launch in inner.launches] == [square_inplace, axpy, sumsq]

    def whole(x):                    # what the outer tape saw: a function of x
        y = (0.7 * x) ** 2 - 1.3 * x
        return np.sum(y * y)

    def nested(y, x):                # what the inner tape saw: y as it entered, and x
        y = y * y - 1.3 * x
        return np.sum(y * y)

    outer.backward(loss)
    (g_x,) = fd_gradient(whole, [x0])
    close(outer.grad(x), g_x)
    inner.backward(loss)
    g_y1, g_x1 = fd_gradient(nested, [0.7 * x0, x0])
    close(inner.grad(y), g_y1)
    close(inner.grad(x), g_x1)


def test_launches_after_the_inner_tape_exits_are_recorded_on_the_outer_one(rng):
    x0 = rng.standard_normal(4)
    x, y, out = x0.copy(), np.zeros(4), np.zeros(1)
    with Tape() as outer:
        with Tape() as inner:
            scale(x, y, 2.0)
        sumsq(y, out)
    assert len(inner.launches) == 1 and len(outer.launches) == 2
    outer.backward(out)
    close(outer.grad(x), 8.0 * x0)   # d/dx sum((2x)^2)


def test_an_enclosing_tape_refusal_stops_the_launch_on_every_tape(rng):
    x0 = rng.standard_normal(3)
    x, y = x0.copy(), np.zeros(3)
    with Tape(copy_inputs=False) as outer:
        scale(x, y, 2.0)
        with Tape() as inner:
            with pytest.raises(DifferentiationError, match="copy_inputs=False"):
                square_inplace(x)    # would overwrite x, which outer's launch 0 read
    np.testing.assert_array_equal(x, x0)   # the forward did not run
    assert inner.launches == () and len(outer.launches) == 1


def test_nested_tapes_share_the_copies_of_overwritten_inputs(rng):
    x0 = rng.standard_normal(4)
    x, loss = x0.copy(), np.zeros(1)
    with Tape() as outer:
        with Tape() as inner:
            square_inplace(x)
            sumsq(x, loss)
    assert outer.snapshot_count == inner.snapshot_count == 1
    outer.backward(loss)
    inner.backward(loss)
    close(outer.grad(x), 4.0 * x0 ** 3)
    close(inner.grad(x), 4.0 * x0 ** 3)


def test_a_tape_cannot_be_entered_again_in_the_same_thread():
    with Tape() as tape:
        with Tape():
            with pytest.raises(TapeError, match="already active in this thread"):
                tape.__enter__()
    assert kadj.tape.active() is None


# ----------------------------------------------------------------- threads


def test_another_thread_cannot_launch_on_arrays_a_tape_has_recorded(rng):
    x0 = rng.standard_normal(4)
    x, y, loss = x0.copy(), np.zeros(4), np.zeros(1)
    with Tape() as tape:
        scale(x, y, 3.0)
        before = y.copy()
        out = run_in_thread(lambda: square_inplace(y), name="loader-1")
        sumsq(y, loss)
    error = out.get("error")
    assert isinstance(error, TapeError), out
    message = str(error)
    assert "Kernel 'square_inplace'" in message and "argument 'y'" in message
    assert "thread 'loader-1'" in message and "thread 'MainThread'" in message
    assert "square_inplace.forward" in message
    np.testing.assert_array_equal(before, y)   # refused before the forward ran
    tape.backward(loss)
    close(tape.grad(x), 18.0 * x0)


def test_another_thread_cannot_launch_on_a_view_overlapping_a_recorded_array(rng):
    x, y = rng.standard_normal(8), np.zeros(8)
    with Tape():
        scale(x[::2], y[::2], 2.0)
        refused = run_in_thread(lambda: square_inplace(y[2:5]))
        disjoint = run_in_thread(lambda: square_inplace(y[1::2]))
        in_a_tuple = run_in_thread(lambda: square_inplace((np.zeros(2), x[::2])))
    assert isinstance(refused.get("error"), TapeError), refused
    assert isinstance(in_a_tuple.get("error"), TapeError), in_a_tuple
    assert "error" not in disjoint, disjoint


def test_other_threads_launch_freely_on_arrays_no_active_tape_has_seen(rng):
    x, y = rng.standard_normal(4), np.zeros(4)
    a0 = rng.standard_normal(4)
    a, b = a0.copy(), np.zeros(4)
    with Tape() as tape:
        scale(x, y, 2.0)
        out = run_in_thread(lambda: (scale(a, b, 3.0), square_inplace(b)))
    assert "error" not in out, out
    close(b, (3.0 * a0) ** 2)
    assert len(tape.launches) == 1


def test_a_thread_with_its_own_tape_cannot_touch_another_tapes_arrays(rng):
    x, y, z = rng.standard_normal(3), np.zeros(3), np.zeros(3)

    def worker():
        with Tape() as mine:
            scale(y, z, 2.0)         # y: recorded by the main thread's tape
        return mine

    with Tape() as tape:
        scale(x, y, 2.0)
        out = run_in_thread(worker)
    assert isinstance(out.get("error"), TapeError), out
    assert "argument 'x'" in str(out["error"])   # scale's name for its first argument
    assert len(tape.launches) == 1


def test_other_threads_may_launch_once_the_tape_has_exited(rng):
    x, y = rng.standard_normal(3), np.zeros(3)
    with Tape():
        scale(x, y, 2.0)
    expected = y * y
    out = run_in_thread(lambda: square_inplace(y))
    assert "error" not in out, out
    close(y, expected)


def test_forward_runs_deliberately_unrecorded_from_another_thread(rng):
    x, y, z = rng.standard_normal(3), np.zeros(3), np.zeros(3)
    with Tape() as tape:
        scale(x, y, 2.0)
        out = run_in_thread(lambda: scale.forward(y, z, 5.0))   # only reads y
    assert "error" not in out, out
    close(z, 10.0 * x)
    assert len(tape.launches) == 1


def test_tape_record_from_another_thread_records_on_that_tape(rng):
    x0 = rng.standard_normal(4)
    x, y, loss = x0.copy(), np.zeros(4), np.zeros(1)
    with Tape() as tape:
        scale(x, y, 0.5)
        out = run_in_thread(lambda: tape.record(square_inplace, (y,)))
        sumsq(y, loss)
    assert "error" not in out, out
    assert [launch.kernel for launch in tape.launches] == [scale, square_inplace, sumsq]
    tape.backward(loss)
    (g,) = fd_gradient(lambda x: np.sum((0.5 * x) ** 4), [x0])
    close(tape.grad(x), g)


def test_a_tape_active_in_one_thread_cannot_be_entered_in_another():
    tape = Tape()

    def enter():
        with tape:
            pass

    with tape:
        out = run_in_thread(enter, name="second")
    assert isinstance(out.get("error"), TapeError), out
    assert "already active in thread 'MainThread'" in str(out["error"])
    assert "thread 'second'" in str(out["error"])
    with tape:                       # exited in the main thread: free again
        pass


def test_a_tape_left_active_by_a_finished_thread_blocks_nothing(rng):
    tape = Tape()
    x, y = rng.standard_normal(3), np.zeros(3)

    def enter_and_leave_it_active():
        tape.__enter__()
        scale(x, y, 2.0)

    out = run_in_thread(enter_and_leave_it_active)
    assert "error" not in out, out
    square_inplace(y)                # that thread is gone: nothing records any more
    with tape:
        pass


# ------------------------------------------------------------ concurrency


def test_concurrent_records_on_one_tape_are_serialized(rng):
    y0 = rng.standard_normal(3)
    xs0 = [rng.standard_normal(3) for _ in range(4)]
    y, xs, loss = y0.copy(), [x.copy() for x in xs0], np.zeros(1)
    tape = Tape()

    def worker(k):
        for step in range(6):
            tape.record(slow_axpy, (xs[k], y, 0.1 * (k + 1)))
            if step == 2 and k == 0:
                tape.record(square_inplace, (y,))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    tape.record(sumsq, (y, loss))
    launches = tape.launches
    assert [launch.index for launch in launches] == list(range(26))
    initial = {id(y): y0, id(loss): np.zeros(1), **{id(x): x0 for x, x0 in zip(xs, xs0)}}
    final = replay(launches, initial)
    close(y, final[id(y)])           # the forwards ran one at a time, in tape order

    def loss_of(y_start, *x_start):
        start = {id(y): y_start, id(loss): np.zeros(1),
                 **{id(x): x1 for x, x1 in zip(xs, x_start)}}
        return replay(launches, start)[id(loss)][0]

    tape.backward(loss)
    grads = fd_gradient(loss_of, [y0, *xs0])
    close(tape.grad(y), grads[0])
    for x, g in zip(xs, grads[1:]):
        close(tape.grad(x), g)


def test_a_record_waits_for_a_backward_in_progress(rng):
    x0 = rng.standard_normal(4)
    x, loss = x0.copy(), np.zeros(1)
    with Tape() as tape:
        waiting_sumsq(x, loss)
    ADJOINT_STARTED.clear()
    ADJOINT_MAY_GO_ON.clear()
    t = threading.Thread(target=tape.backward, args=(loss,))
    t.start()
    try:
        assert ADJOINT_STARTED.wait(timeout=10)
        tape.record(square_inplace, (x,))   # overwrites x while the adjoint reads it
        ADJOINT_MAY_GO_ON.set()
    finally:
        ADJOINT_MAY_GO_ON.set()
        t.join(timeout=30)
    close(tape.grad(x), 2.0 * x0)        # the gradient of the one launch before


def test_concurrent_backward_calls_add_up(rng):
    x0 = rng.standard_normal(5)
    x, y, loss = x0.copy(), np.zeros(5), np.zeros(1)
    with Tape() as tape:
        scale(x, y, 1.5)
        square_inplace(y)
        sumsq(y, loss)
    threads = [threading.Thread(target=tape.backward, args=(loss,)) for _ in range(6)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        sys.setswitchinterval(interval)
    (g,) = fd_gradient(lambda x: np.sum((1.5 * x) ** 4), [x0])
    close(tape.grad(x), 6.0 * g)


# ------------------------------------------------------ real kadj kernels

if getattr(kadj, "differentiate", None) is not None:
    from numba import njit

    @kadj.differentiate
    @njit
    def smooth(u, u_new, alpha):
        for i in range(1, u.shape[0] - 1):
            u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@pytest.mark.skipif(getattr(kadj, "differentiate", None) is None,
                    reason="kadj.differentiate is not available")
def test_a_real_kernel_launched_from_another_thread_is_refused(rng):
    u0 = rng.standard_normal(6)
    u, v, w = u0.copy(), np.zeros(6), np.zeros(6)
    with kadj.Tape() as tape:
        smooth(u, v, 0.2)
        out = run_in_thread(lambda: smooth(v, u, 0.2), name="loader-2")
        fine = run_in_thread(lambda: smooth(w.copy(), np.zeros(6), 0.2))
    assert isinstance(out.get("error"), TapeError), out
    assert "Kernel 'smooth'" in str(out["error"])
    assert "argument 'u'" in str(out["error"])   # smooth's name for v
    assert "error" not in fine, fine
    np.testing.assert_array_equal(u, u0)
    assert len(tape.launches) == 1
