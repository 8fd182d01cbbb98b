"""Gradient checks of CUDA kernels in the simulator (run by tests/test_cuda_sim.py in a
subprocess with NUMBA_ENABLE_CUDASIM=1 set before numba is imported).

Each case launches the forward in the simulator on NumPy arrays, builds the
vector-Jacobian product by float64 central differences of the forward, and compares it
with kadj's adjoint launched on the same grid.  Prints one line per case:
``CASE <name> OK <max abs error>`` or ``CASE <name> FAIL <message>``.
"""
import os
import sys

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import kadj  # noqa: E402
from cudatools import report_cases  # noqa: E402


@kadj.differentiate
@cuda.jit
def heat_step(u, u_new, alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@cuda.jit
def laplace2d(u, v, c):
    i, j = cuda.grid(2)
    if 0 < i < u.shape[0] - 1 and 0 < j < u.shape[1] - 1:
        v[i, j] = c * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
                       - 4.0 * u[i, j])


@kadj.differentiate
@cuda.jit
def scaled_sin(x, y, a):
    i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    if i < x.shape[0]:
        y[i] = a * math.sin(x[i]) + x[i] * x[i]


@kadj.differentiate
@cuda.jit
def pointwise(x, w, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = x[i] * w[i] + math.exp(-x[i])


@cuda.jit(device=True)
def _scaled_tanh(a, b):
    return a * math.tanh(b)


@kadj.differentiate
@cuda.jit
def with_device_helper(x, y, s):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = _scaled_tanh(s, x[i])


@kadj.differentiate
@cuda.jit
def logistic(y0, r, dt, out, nsteps):
    i = cuda.grid(1)
    if i < y0.shape[0]:
        y = y0[i]
        for k in range(nsteps):
            y = y + dt * r[i] * y * (1.0 - y)
        out[i] = y


# the scatter form (atomics) of heat_step's adjoint; heat_step itself runs the gather
# form whenever the launch has a thread for every element of u
heat_step_scatter = kadj.differentiate(heat_step.dispatcher, gather=False)


# the same kernel with 2 checkpoint slots: 37 steps cannot be bisected in 2 slots,
# so reversing replays longer stretches (exact, slower)
logistic_2slots = kadj.differentiate(logistic.dispatcher, checkpoints=2)


@kadj.differentiate
@cuda.jit
def newton_sqrt(a, out):
    i = cuda.grid(1)
    if i < a.shape[0]:
        x = 1.0
        it = 0
        while it < 30 and abs(x * x - a[i]) > 1e-12:
            x = 0.5 * (x + a[i] / x)
            it += 1
        out[i] = x


@kadj.differentiate
@cuda.jit
def gridstride_pendulum(y0, r, out, dt, nsteps):
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for i in range(start, y0.shape[0], stride):
        y = y0[i]
        v = 0.0
        for k in range(nsteps):
            v = v - dt * r[i] * math.sin(y)
            y = y + dt * v
        out[i] = y * y


@kadj.differentiate
@cuda.jit
def nested_carry(x, out, n):
    i = cuda.grid(1)
    if i < x.shape[0]:
        s = x[i]
        for k in range(3):
            t = s
            for m in range(n):
                t = t * 0.9 + math.sin(t)
            s = s + t * t
        out[i] = s


@kadj.differentiate
@cuda.jit
def relax_own_element(y, s):
    """The thread's own element read twice, linearly and inside sin, then overwritten
    (a regression: the adjoint lost the 0.5)."""
    i = cuda.grid(1)
    if i < y.shape[0]:
        y[i] = 0.5 * y[i] + math.sin(s * y[i])


@kadj.differentiate
@cuda.jit
def overwritten_store(x, y, a):
    """A store the thread overwrites later: the gather form is not used (a regression:
    the neighbour x[i - 1] got y[i]'s adjoint too)."""
    i = cuda.grid(1)
    if 0 < i < x.shape[0]:
        y[i] = x[i - 1]
        y[i] = x[i] * a


@kadj.differentiate
@cuda.jit
def dead_neighbour_read(x, y, s):
    """A neighbour read whose value is never used: the gather form's pass for that
    offset prints no statement (a regression: an empty ``if``, IndentationError)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        g = 0.0
        if i > 0:
            g = x[i - 1]
        y[i] = x[i] * s


@kadj.differentiate
@cuda.jit
def rows_rewritten_in_each_branch(x, Y):
    """The thread's own row rewritten by a loop in each arm of an if: each arm's
    reverse restores the row its own forward saved (a regression: the then-arm
    restored the else-arm's save, and the row's gradient was lost)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        if x[i] < 0.2:
            for j in range(Y.shape[1]):
                Y[i, j] = 0.5 * Y[i, j] * Y[i, j]
        else:
            for j in range(Y.shape[1]):
                Y[i, j] = Y[i, j] * Y[i, j] + x[i]


@cuda.jit(device=True)
def _halve(a, i):
    a[i] = 0.5 * a[i]


@kadj.differentiate
@cuda.jit
def helper_after_nested_return(x, y):
    """An early return nested in two ifs, then a helper that updates the thread's own
    element: the helper's index, copied on each path after the return, is still the
    thread's coordinate (a regression: refused as elements other threads may touch)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        if x[i] > 0.1:
            if x[i] > 0.2:
                return
        _halve(y, i)
        y[i] = y[i] * x[i]


@kadj.differentiate
@cuda.jit
def two_loops_with_returns(x, y, s, nt):
    """Two loops in a row, each left by an early return: the second runs under the
    first's return flag and sets it again (a regression: the reverse decided with the
    flag's final value and skipped the second loop's reverse)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        for k in range(nt):
            y[i] = s * float(k + 1)
            if y[i] > x[i]:
                return
        for t in range(nt):
            if y[i] * x[i] > 0.1:
                y[i] = -1.3 * y[i] + s
                return
            y[i] = s


@kadj.differentiate
@cuda.jit
def rebound_scalar(y, s):
    """A scalar argument rebound before its use (a regression: 3x its gradient)."""
    i = cuda.grid(1)
    if i < y.shape[0]:
        s = 2.0 * s
        y[i] = s * y[i]


@kadj.differentiate
@cuda.jit
def push_inplace(x, v, f, dt):
    i = cuda.grid(1)
    if i < x.shape[0]:
        v[i] += dt * f[i] * math.sin(x[i])
        x[i] += dt * v[i]
        v[i] = v[i] * v[i]


@kadj.differentiate
@cuda.jit
def rk2_local_state(y0, k, out, dt, n):
    i = cuda.grid(1)
    if i < y0.shape[0]:
        st = cuda.local.array(2, float64)
        st[0] = y0[i]
        st[1] = 0.0
        for m in range(n):
            a = st[0]
            b = st[1]
            st[0] = a + dt * b
            st[1] = b - dt * k[i] * a
        out[i] = st[0]


@kadj.differentiate
@cuda.jit
def heat_bc(u, un, alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        un[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])
    elif i == 0 or i == u.shape[0] - 1:
        un[i] = u[i]


@kadj.differentiate
@cuda.jit
def sq_loss(u, out):
    i = cuda.grid(1)
    if i < u.shape[0]:
        cuda.atomic.add(out, 0, u[i] * u[i])


@kadj.differentiate
@cuda.jit
def wrap_left(u, y):
    # u[i - 1] at i = 0 reads u[-1], the last element (indices wrap as in NumPy): the
    # gather form must still deliver that element's adjoint
    i = cuda.grid(1)
    if i < u.shape[0]:
        y[i] = 2.0 * u[i - 1] * u[i]


@kadj.differentiate
@cuda.jit
def thread_id_value(u, y, w):
    # threadIdx and blockIdx used as values: no gather form (a pass would see this
    # thread's ids instead of its neighbour's)
    i = cuda.grid(1)
    if i < u.shape[0] - 1:
        y[i] = (cuda.threadIdx.x + 1.0) * w[cuda.blockIdx.x] * u[i + 1]


@kadj.differentiate
@cuda.jit
def coefficients(x, p, y):
    # p[0], p[1], p[2]: the same elements for every thread, summed per block
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = p[0] * math.sin(x[i]) + p[1] * x[i] * x[i] + p[0] * p[2]


@kadj.differentiate
@cuda.jit
def burgers_upwind(u, un, nu, dt):
    # a branch that assigns a local: values recorded, still the gather form
    i = cuda.grid(1)
    n = u.shape[0]
    if 0 < i < n - 1:
        if u[i] > 0:
            d = u[i] - u[i - 1]
        else:
            d = u[i + 1] - u[i]
        un[i] = u[i] - dt * u[i] * d + nu * (u[i + 1] - 2.0 * u[i] + u[i - 1])


@kadj.differentiate
@cuda.jit
def tile_read_after_loop(x, y):
    # the last tile is read after the loop: the reverse sweep's first replay rewrites
    # the tile, so the block must meet before it (a race otherwise)
    tl = cuda.shared.array(8, float64)
    tid = cuda.threadIdx.x
    acc = 0.0
    for c in range(2):
        tl[tid] = x[c * 8 + tid]
        cuda.syncthreads()
        acc += tl[(tid + 1) % 8] * tl[tid]
        cuda.syncthreads()
    y[tid] = acc + tl[(tid + 3) % 8] * tl[tid]


@kadj.differentiate
@cuda.jit
def strided_elements(z, p, v, out, pairs, dt):
    # interleaved complex numbers and 3-vectors in flat arrays: each thread's elements
    # by strides (2 * i, 2 * i + 1; 3 * i + k), its adjoints added without atomics
    i = cuda.grid(1)
    if i < out.shape[0]:
        re = z[2 * i]
        im = z[2 * i + 1]
        acc = re * re - im * im
        for k in range(3):
            acc += p[3 * i + k] * math.sin(v[3 * i + k] * dt)
        out[i] = acc
        pairs[2 * i] = re * acc
        pairs[2 * i + 1] = im * dt


@cuda.jit(device=True)
def _block_sum(v, tid):
    # a tree reduction in shared memory inside a device helper: the loop with
    # barriers is reversed from checkpoints of each thread's own element, indexed
    # by the helper's (inlined) variable
    sm = cuda.shared.array(4, float64)
    sm[tid] = v
    cuda.syncthreads()
    s = 2
    while s > 0:
        if tid < s:
            sm[tid] += sm[tid + s]
        cuda.syncthreads()
        s //= 2
    return sm[0]


@kadj.differentiate
@cuda.jit
def block_sum_in_helper(x, out):
    i = cuda.grid(1)
    tid = cuda.threadIdx.x
    s = _block_sum(x[i] * x[i], tid)
    if tid == 0:
        out[cuda.blockIdx.x] = s


@kadj.differentiate
@cuda.jit
def tile_in_each_arm(w, x, out):
    # the tile is rewritten at every chunk in both arms of an if (not provably by one
    # store): no earlier chunk's contents are needed
    s = cuda.shared.array(4, float64)
    tx = cuda.threadIdx.x
    i = cuda.grid(1)
    acc = 0.0
    for c in range((x.shape[0] + 3) // 4):
        j = c * 4 + tx
        if j < x.shape[0]:
            s[tx] = x[j]
        else:
            s[tx] = 0.0
        cuda.syncthreads()
        if i < w.shape[0]:
            for k in range(4):
                if c * 4 + k < x.shape[0]:
                    acc += w[i, c * 4 + k] * s[k]
        cuda.syncthreads()
    if i < w.shape[0]:
        out[i] = acc * acc


def ptx_under_simulator_case():
    """adjoint_ptx() under the simulator compiles in a child process without it."""
    from kernels.cuda import by_name
    case = by_name("heat2d_step")
    args = case.make_args(np.random.default_rng(0))
    for form in ("scatter", "gather"):
        ptx = case.kernel.adjoint_ptx(*args, cc=(9, 0), form=form)
        assert ".entry" in ptx, ptx[:200]
    return 0.0


def tape_case(on_device):
    """Three heat steps and a loss on a Tape, NumPy or device arrays: tape.grad(u0)
    against finite differences of the whole sequence."""
    rng = np.random.default_rng(5)
    u0 = rng.random(12)

    def run(x, dev):
        mk = cuda.to_device if dev else (lambda a: a)
        us = [mk(x.copy())] + [mk(np.zeros(12)) for _ in range(3)]
        loss = mk(np.zeros(1))
        with kadj.Tape() as tape:
            for k in range(3):
                heat_bc[2, 8](us[k], us[k + 1], 0.2)
            sq_loss[2, 8](us[3], loss)
        return tape, us, loss

    tape, us, loss = run(u0, on_device)
    tape.backward(loss)
    g = tape.grad(us[0])
    if on_device:
        assert hasattr(g, "copy_to_host"), "tape.grad of a device array is on the device"
        g = g.copy_to_host()
    eps = 1e-6

    def f(x):
        return float(np.asarray(run(x, False)[2])[0])
    ref = np.array([(f(u0 + eps * e) - f(u0 - eps * e)) / (2 * eps) for e in np.eye(12)])
    err = float(np.max(np.abs(g - ref)))
    assert err < 1e-6, f"tape gradient differs by {err}"
    return err


def stream_and_errors_case():
    rng = np.random.default_rng(6)
    u, un = rng.random(12), np.zeros(12)
    aun = rng.random(12)
    bufs = [np.zeros(12), aun.copy(), np.zeros(1)]
    stream = cuda.stream()
    heat_bc.adjoint[2, 8, stream](u, un, 0.2, *bufs)
    stream.synchronize()
    ref = [np.zeros(12), aun.copy(), np.zeros(1)]
    heat_bc.adjoint[2, 8](u, un, 0.2, *ref)
    assert all(np.allclose(a, b) for a, b in zip(bufs, ref)), "stream launch differs"
    dev = [cuda.to_device(b) for b in (np.zeros(12), aun.copy(), np.zeros(1))]
    heat_bc.adjoint[2, 8](cuda.to_device(u), cuda.to_device(un), 0.2, *dev)
    assert all(np.allclose(d.copy_to_host(), b) for d, b in zip(dev, ref)), \
        "device-array launch differs"
    for bad, what in (([np.zeros(12), np.zeros(11), np.zeros(1)], "shape"),
                      ([np.zeros(12), np.zeros(12, np.float32), np.zeros(1)], "dtype"),
                      ([np.zeros(12), np.zeros(12), np.zeros(2)], "1-element")):
        try:
            heat_bc.adjoint[2, 8](u, un, 0.2, *bad)
        except ValueError as exc:
            assert what in str(exc) or "shape and dtype" in str(exc), str(exc)
        else:
            raise AssertionError(f"a wrong {what} was accepted")
    return 0.0


import math  # noqa: E402  (used by the kernels above at launch time)
from numba import float64  # noqa: E402


@kadj.differentiate
@cuda.jit
def hostile_names(x, adj_x, adj_alpha_buf, alpha, t1, _tape_f64):
    """Arguments and locals named like the names kadj generates (adj_*, t1, tapes)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        adj_v = alpha * 2.0
        _p0 = x[i] * adj_v
        for _k1 in range(3):                      # a loop that carries state
            _p0 = math.tanh(_p0 + t1[i])
        adj_x[i] = _p0
        _tape_f64[i] = _p0 * adj_alpha_buf[i]


def fd_check(k, config, args, eps=1e-6, seed=0):
    rng = np.random.default_rng(seed)
    plan = k.adjoint_plan(*args)
    written = [i for i in sorted(plan.written)]

    def outputs(xargs):
        cp = [a.copy() if isinstance(a, np.ndarray) else a for a in xargs]
        k[config](*cp)
        return [cp[i] for i in written]

    cts = {i: rng.standard_normal(args[i].shape) for i in written}

    def f(xargs):
        return sum(float(np.sum(cts[i] * o)) for i, o in zip(written, outputs(xargs)))

    bufs = []
    for i in plan.adjoint_args:
        x = args[i]
        if isinstance(x, np.ndarray):
            bufs.append(cts[i].copy() if i in cts else np.zeros_like(x))
        else:
            bufs.append(np.zeros(1, dtype=np.asarray(x).dtype))
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    k.adjoint[config](*args, *bufs)
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b), "the adjoint modified a forward argument"
    worst = 0.0
    for slot, i in enumerate(plan.adjoint_args):
        x = args[i]
        if isinstance(x, np.ndarray):
            ref = np.zeros(x.shape)
            for idx in np.ndindex(x.shape):
                xp = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
                xm = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
                xp[i][idx] += eps
                xm[i][idx] -= eps
                ref[idx] = (f(xp) - f(xm)) / (2 * eps)
            # written-only arrays: the adjoint of the state before the call
            got = bufs[slot]
        else:
            xp, xm = list(args), list(args)
            xp[i] = x + eps
            xm[i] = x - eps
            ref = np.array([(f(xp) - f(xm)) / (2 * eps)])
            got = bufs[slot]
        err = float(np.max(np.abs(got - ref)))
        scale = max(1.0, float(np.max(np.abs(ref))))
        if err > 1e-6 * scale:
            raise AssertionError(f"gradient of {plan.arg_names[i]} differs: max error "
                                 f"{err}\ngot {got}\nref {ref}")
        worst = max(worst, err)
    return worst


@kadj.differentiate
@cuda.jit
def capped_rows(x, limit, out):
    # a break test that reads the running sum: every reversed iteration must re-decide
    # its own branch (regression: the flag was saved once, for the last iteration)
    r = cuda.grid(1)
    if r < x.shape[0]:
        s = 0.0
        i = 0
        while i < x.shape[1]:
            s += x[r, i] * x[r, i]
            if s > limit:
                break
            i += 1
        out[r] = s


@kadj.differentiate
@cuda.jit
def inner_reads_state(x, out, dt):
    # the inner loop reads y, which the time step overwrites after it: the replay of the
    # inner loop from its checkpoints must see the y of its own step (regression)
    i = cuda.grid(1)
    if i < x.shape[0]:
        y = x[i]
        for t in range(4):
            ys = y
            acc = 0.0
            for s in range(3):
                ks = math.sin(ys) - 0.3 * ys
                acc += ks
                ys = y + 0.5 * dt * ks
            y = y + dt * acc / 4.0
        out[i] = y


@kadj.differentiate
@cuda.jit
def row_scale(x, w, y):
    # x is read only in the thread's own row: its adjoint is added without atomics;
    # w[j] is shared by every row (atomics)
    r = cuda.grid(1)
    if r < x.shape[0]:
        s = 0.0
        for j in range(x.shape[1]):
            s += x[r, j] * x[r, j]
        for j in range(x.shape[1]):
            y[r, j] = x[r, j] * w[j] / (1.0 + s)


@kadj.differentiate
@cuda.jit
def row_and_next(x, y):
    # x[r + 1, j] is another thread's row: atomics
    r = cuda.grid(1)
    if r < x.shape[0] - 1:
        for j in range(x.shape[1]):
            y[r, j] = x[r, j] * x[r + 1, j]


def main(names):
    rng = np.random.default_rng(1)
    cases = {
        "heat_step": lambda: fd_check(heat_step, (2, 8), [rng.random(13), np.zeros(13),
                                                          0.1]),
        "laplace2d": lambda: fd_check(laplace2d, ((2, 2), (4, 4)),
                                      [rng.random((7, 6)), np.zeros((7, 6)), 0.7]),
        "scaled_sin": lambda: fd_check(scaled_sin, (3, 4), [rng.random(10), np.zeros(10),
                                                            1.3]),
        "pointwise": lambda: fd_check(pointwise, (2, 8), [rng.random(11), rng.random(11),
                                                          np.zeros(11)]),
        "with_device_helper": lambda: fd_check(with_device_helper, (2, 8),
                                               [rng.random(9), np.zeros(9), 0.3]),
        "scatter_form": lambda: fd_check(heat_step_scatter, (2, 8),
                                         [rng.random(13), np.zeros(13), 0.1]),
        # 8 threads for 13 elements: no gather (elements 8.. have no thread)
        "grid_not_covering_uses_scatter": lambda: fd_check(
            heat_step, (1, 8), [rng.random(13), np.zeros(13), 0.1]),
        "gather_2d_blocks": lambda: fd_check(laplace2d, ((3, 2), (3, 4)),
                                             [rng.random((9, 7)), np.zeros((9, 7)), 0.7]),
        "gather_wrapped_index": lambda: fd_check(wrap_left, (2, 8),
                                                 [rng.random(16), np.zeros(16)]),
        "gather_refused_thread_ids": lambda: fd_check(
            thread_id_value, (2, 8), [rng.random(16), np.zeros(16), rng.random(2)]),
        "uniform_elements_block_reduced": lambda: fd_check(
            coefficients, (2, 4), [rng.random(11), rng.random(3), np.zeros(11)]),
        "gather_with_recorded_branch": lambda: fd_check(
            burgers_upwind, (2, 8), [rng.random(12) - 0.5, np.zeros(12), 0.1, 0.05]),
        "ptx_under_simulator": ptx_under_simulator_case,
        "shared_tile_read_after_loop": lambda: max(
            fd_check(tile_read_after_loop, (1, 8), [rng.random(16), np.zeros(8)])
            for _ in range(3)),
        "checkpointed_loop": lambda: fd_check(
            logistic, (2, 4), [rng.random(6) * 0.5, rng.random(6), 0.1, np.zeros(6), 37]),
        "checkpointed_loop_2_slots": lambda: fd_check(
            logistic_2slots, (2, 4),
            [rng.random(6) * 0.5, rng.random(6), 0.1, np.zeros(6), 37]),
        "newton_while": lambda: fd_check(newton_sqrt, (2, 4),
                                         [rng.random(6) + 0.5, np.zeros(6)]),
        "while_break_on_running_value": lambda: fd_check(
            capped_rows, (1, 4), [np.array([[0.5, 0.6, 0.7, 0.8, 0.9],
                                            [0.1, 0.2, 0.3, 0.2, 0.1],
                                            [0.9, 0.9, 0.1, 0.1, 0.1]]), 1.0,
                                  np.zeros(3)]),
        "gridstride_time_loop": lambda: fd_check(
            gridstride_pendulum, (2, 4),
            [rng.random(11), rng.random(11), np.zeros(11), 0.1, 9]),
        # (its own inputs, small: the iterated map grows fast and central differences
        # would lose digits)
        "nested_carried_loops": lambda: fd_check(
            nested_carry, (2, 4),
            [np.random.default_rng(7).random(5) * 0.3, np.zeros(5), 3]),
        "inner_loop_reads_overwritten_state": lambda: fd_check(
            inner_reads_state, (2, 4),
            [np.random.default_rng(5).uniform(-1.0, 1.0, 7), np.zeros(7), 0.2]),
        "row_private": lambda: fd_check(
            row_scale, (3, 4), [rng.random((10, 5)), rng.random(5), np.zeros((10, 5))]),
        "row_and_next_row": lambda: fd_check(
            row_and_next, (3, 4), [rng.random((10, 4)), np.zeros((10, 4))]),
        "in_place_update": lambda: fd_check(
            push_inplace, (2, 4), [rng.random(9), rng.random(9), rng.random(9), 0.1]),
        "own_element_read_twice": lambda: fd_check(
            relax_own_element, (2, 4), [rng.uniform(-1.0, 1.0, 9), 0.6]),
        "gather_store_overwritten": lambda: fd_check(
            overwritten_store, (2, 8), [rng.uniform(-1.0, 1.0, 16), np.zeros(16), 0.6]),
        "gather_dead_neighbour_read": lambda: fd_check(
            dead_neighbour_read, (2, 8), [rng.uniform(-1.0, 1.0, 16), np.zeros(16), 0.6]),
        "own_rows_in_each_branch": lambda: fd_check(
            rows_rewritten_in_each_branch, (2, 4),
            [rng.uniform(-0.3, 0.7, 7), rng.uniform(-1.0, 1.0, (7, 3))]),
        "helper_after_nested_return": lambda: fd_check(
            helper_after_nested_return, (2, 4),
            [np.array([0.0, 0.15, 0.3, 0.05, 0.5, -0.4, 0.12]), rng.uniform(-1.0, 1.0, 7)]),
        "two_loops_with_returns": lambda: fd_check(
            two_loops_with_returns, (2, 32),
            [rng.uniform(-1.0, 2.0, 37), rng.uniform(-1.0, 1.0, 37), 0.6, 2]),
        "strided_elements": lambda: fd_check(
            strided_elements, (2, 4),
            [rng.uniform(-1.0, 1.0, 14), rng.uniform(-1.0, 1.0, 21),
             rng.uniform(-1.0, 1.0, 21), np.zeros(7), np.zeros(14), 0.7]),
        "shared_reduction_in_helper": lambda: fd_check(
            block_sum_in_helper, (2, 4), [rng.uniform(-1.0, 1.0, 8), np.zeros(2)]),
        "tile_in_each_arm": lambda: fd_check(
            tile_in_each_arm, (2, 4), [rng.uniform(-1.0, 1.0, (6, 7)),
                                       rng.uniform(-1.0, 1.0, 7), np.zeros(6)]),
        "rebound_scalar": lambda: fd_check(
            rebound_scalar, (2, 4), [rng.uniform(-1.0, 1.0, 9), 0.6]),
        "local_array_state": lambda: fd_check(
            rk2_local_state, (2, 4), [rng.random(5), rng.random(5), np.zeros(5), 0.1, 6]),
        "hostile_names": lambda: fd_check(
            hostile_names, (2, 4), [rng.random(7), np.zeros(7), rng.random(7), 0.3,
                                    rng.random(7), np.zeros(7)]),
        "tape_numpy": lambda: tape_case(False),
        "tape_device_arrays": lambda: tape_case(True),
        "stream_device_arrays_errors": stream_and_errors_case,
    }
    report_cases(cases, names)


if __name__ == "__main__":
    main(sys.argv[1:])
