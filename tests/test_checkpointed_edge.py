"""kadj.checkpointed_loop on the bug classes known from checkpointing tools, each
against the store-everything tape (the same launches recorded one by one): very short
loops (n = 1, 2, n <= s + 1) and s = 1; an array read only every third step; a second
forward at new inputs before backward; steps reading ``target[:, t]`` by step number;
parameters read by every step; two checkpointed loops on one tape; three rotating
buffers; scalars from a Python clock and arrays made anew at each call, refused."""
import numba
import numpy as np
import pytest

import kadj
from kadj.errors import DifferentiationError
from kadj.schedules import binomial_cost

N = 10
RNG = np.random.default_rng(3)
X0 = RNG.random(N)
F = RNG.random(N) * 0.03
H = RNG.random(N) * 0.05
TARGET = RNG.random(N)
TARGETS = RNG.random((N, 17))      # column t is the target of step t


@kadj.differentiate
@numba.njit
def heat(u, v, alpha, f):
    for i in range(1, u.shape[0] - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + f[i] * u[i] * u[i]


@kadj.differentiate
@numba.njit
def init(x, u):
    for i in range(u.shape[0]):
        u[i] = np.sin(x[i])


@kadj.differentiate
@numba.njit
def sqloss(u, target, out):
    s = 0.0
    for i in range(u.shape[0]):
        s += (u[i] - target[i]) ** 2
    out[0] = s


@kadj.differentiate
@numba.njit
def misfit(u, t, acc):
    s = 0.0
    for i in range(u.shape[0]):
        s += (u[i] - t[i]) ** 2
    acc[0] = acc[0] + s


@kadj.differentiate
@numba.njit
def wave(a, b, c, k):
    for i in range(1, b.shape[0] - 1):
        c[i] = 2.0 * b[i] - a[i] + k * (b[i - 1] - 2.0 * b[i] + b[i + 1]) \
            - 0.1 * b[i] * b[i] * b[i]


def run(body, state, n, s, checkpoint):
    """The loop over ``state`` inside the caller's tape: checkpointed, or launch by
    launch; returns the final state and the loop's tape entry (None without)."""
    if checkpoint:
        return kadj.checkpointed_loop(body, state, steps=n, snapshots=s)
    for i in range(n):
        state = body(i, *state)
    return tuple(state)


def assert_same(got, ref):
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)


def loop_entry(tape, k=0):
    return [launch.kernel for launch in tape.launches
            if launch.kernel.__name__ == "checkpointed_loop"
            and hasattr(launch.kernel, "schedule")][k]


# -- n = 1, 2, n <= s + 1, s = 1; parameters read by every step (array and scalar);
#    an array read only every third step
def heat_third(n, s, checkpoint, x0=X0):
    u0, v0, out = np.zeros(N), np.zeros(N), np.zeros(1)

    def step(i, u, v):
        heat(u, v, 0.1 + 0.01 * (i % 2), H if i % 3 == 2 else F)
        return v, u

    with kadj.Tape() as tape:
        init(x0, u0)
        u, v = run(step, (u0, v0), n, s, checkpoint)
        sqloss(u, TARGET, out)
    tape.backward(out)
    return tape


SHORT = [(1, 1), (2, 1), (3, 1), (6, 1), (1, 3), (2, 2), (3, 2), (4, 3), (5, 4),
         (3, 6), (8, 2)]


@pytest.mark.parametrize("n,s", SHORT)
def test_short_loops_every_third_step_and_parameters(n, s):
    ref, got = heat_third(n, s, False), heat_third(n, s, True)
    assert_same(got.grad(X0), ref.grad(X0))
    for x in (F, H):
        if any(launch.kernel.__name__ == "heat" and launch.args[3] is x
               for launch in ref.launches):
            assert_same(got.grad(x), ref.grad(x))
        else:                      # H unread when n < 3: the loop never saw it either
            with pytest.raises(DifferentiationError, match="never saw"):
                got.grad(x)
    assert np.abs(ref.grad(F)).max() > 0
    if n >= 3:
        assert np.abs(ref.grad(H)).max() > 0
    # the scalar read by every step (with two values): one total, as launch by launch
    assert got.scalar_grad("alpha", kernel="heat") == \
        pytest.approx(ref.scalar_grad("alpha", kernel="heat"), rel=1e-12, abs=1e-15)
    loop = loop_entry(got)
    assert loop.executions == binomial_cost(n, s)
    (report,) = got.memory_report().loops
    assert report.peak_snapshots <= s and loop.peak_snapshots <= s
    assert report.recomputed_steps == binomial_cost(n, s) - n


# -- a second forward at new inputs before backward (a new tape)
def test_second_forward_on_new_arrays_before_backward():
    x1 = X0[::-1].copy()
    first = heat_third(7, 2, True)             # backward already run: run it again
    first.zero()
    second = heat_third(7, 2, True, x0=x1)     # a new tape, new arrays, new inputs
    first.backward(first.launches[-1].args[2])
    assert_same(first.grad(X0), heat_third(7, 2, False).grad(X0))
    assert_same(second.grad(x1), heat_third(7, 2, False, x0=x1).grad(x1))
    assert not np.allclose(first.grad(X0), second.grad(x1))


def test_second_forward_in_the_same_arrays_is_refused_by_the_first_tape():
    u0, v0, out = np.zeros(N), np.zeros(N), np.zeros(1)
    x = X0.copy()

    def step(i, u, v):
        heat(u, v, 0.1, F)
        return v, u

    def forward():
        with kadj.Tape() as tape:
            init(x, u0)
            u, v = kadj.checkpointed_loop(step, (u0, v0), steps=5, snapshots=2)
            sqloss(u, TARGET, out)
        return tape

    first = forward()
    x[:] = X0[::-1]                            # new inputs, in place
    second = forward()
    second.backward(out)
    u1, v1, out1 = np.zeros(N), np.zeros(N), np.zeros(1)
    with kadj.Tape() as ref:
        init(x, u1)
        u, v = u1, v1
        for i in range(5):
            u, v = step(i, u, v)
        sqloss(u, TARGET, out1)
    ref.backward(out1)
    assert_same(second.grad(x), ref.grad(x))
    with pytest.raises(DifferentiationError, match="changed outside the recorded"):
        first.backward(out)


# -- steps reading target[:, t] by step number, accumulating a misfit in the state
def misfit_loop(n, s, checkpoint):
    u0, v0, acc0 = np.zeros(N), np.zeros(N), np.zeros(1)

    def step(i, u, v, acc):
        heat(u, v, 0.1, F)
        misfit(v, TARGETS[:, i], acc)
        return v, u, acc

    with kadj.Tape() as tape:
        init(X0, u0)
        u, v, acc = run(step, (u0, v0, acc0), n, s, checkpoint)
    tape.backward(acc)
    return tape, float(acc[0])


@pytest.mark.parametrize("n,s", [(1, 1), (2, 1), (9, 2), (16, 3)])
def test_target_columns_by_step_number(n, s):
    ref, ref_loss = misfit_loop(n, s, False)
    got, loss = misfit_loop(n, s, True)
    assert loss == ref_loss
    assert_same(got.grad(X0), ref.grad(X0))
    assert_same(got.grad(F), ref.grad(F))
    for t in range(n):
        g = ref.grad(TARGETS[:, t])
        assert np.abs(g).max() > 0
        assert_same(got.grad(TARGETS[:, t]), g)
    with pytest.raises(DifferentiationError, match="never saw"):
        got.grad(TARGETS[:, n])                 # a column no step read


# -- two checkpointed loops on one tape, the second over the first's final state
def two_loops(n1, n2, s, checkpoint, repeat=1):
    u0, v0, out = np.zeros(N), np.zeros(N), np.zeros(1)

    def first(i, u, v):
        heat(u, v, 0.1, F)
        return v, u

    def second(i, u, v):
        heat(u, v, 0.2, H)
        return v, u

    with kadj.Tape() as tape:
        init(X0, u0)
        u, v = run(first, (u0, v0), n1, s, checkpoint)
        u, v = run(second, (u, v), n2, s, checkpoint)
        sqloss(u, TARGET, out)
    grads = []
    for _ in range(repeat):
        tape.zero()
        tape.backward(out)
        grads.append([tape.grad(x) for x in (X0, F, H)])
    return tape, grads


@pytest.mark.parametrize("n1,n2,s", [(1, 1, 1), (4, 7, 2), (6, 3, 3)])
def test_loop_followed_by_another_loop(n1, n2, s):
    _, (ref,) = two_loops(n1, n2, s, False)
    tape, got = two_loops(n1, n2, s, True, repeat=2)
    for gg in got:                     # and a second backward gives the same
        for g, r in zip(gg, ref):
            assert_same(g, r)
    assert all(np.abs(r).max() > 0 for r in ref)
    reports = tape.memory_report().loops
    assert len(reports) == 2
    assert all(rep.peak_snapshots <= s for rep in reports)
    assert [rep.steps for rep in reports] == [n1, n2]


# -- three rotating buffers, one launch per step (leapfrog wave)
def wave_loop(n, s, checkpoint):
    a0, b0, c0, out = np.zeros(N), np.zeros(N), np.zeros(N), np.zeros(1)

    def step(i, a, b, c):
        wave(a, b, c, 0.3)
        return b, c, a

    with kadj.Tape() as tape:
        init(X0, a0)
        init(X0, b0)
        a, b, c = run(step, (a0, b0, c0), n, s, checkpoint)
        sqloss(b, TARGET, out)
    tape.backward(out)
    return tape


@pytest.mark.parametrize("n,s", [(1, 1), (2, 1), (3, 1), (4, 4), (10, 3)])
def test_three_buffer_swap(n, s):
    ref, got = wave_loop(n, s, False), wave_loop(n, s, True)
    assert_same(got.grad(X0), ref.grad(X0))
    assert np.abs(ref.grad(X0)).max() > 0
    assert got.scalar_grad("k") == pytest.approx(ref.scalar_grad("k"), rel=1e-12,
                                                 abs=1e-15)
    assert loop_entry(got).executions == binomial_cost(n, s)


def test_finite_differences_of_the_short_loop():
    """An independent reference for one of the cases above (n <= s + 1)."""
    n, s = 4, 3

    def loss(x):
        u, v = np.zeros(N), np.zeros(N)
        init.forward(x, u)
        for i in range(n):
            heat.forward(u, v, 0.1 + 0.01 * (i % 2), H if i % 3 == 2 else F)
            u, v = v, u
        out = np.zeros(1)
        sqloss.forward(u, TARGET, out)
        return out[0]

    g = heat_third(n, s, True).grad(X0)
    eps = 1e-6
    for k in (0, 4, 9):
        e = np.zeros(N)
        e[k] = eps
        assert g[k] == pytest.approx((loss(X0 + e) - loss(X0 - e)) / (2 * eps),
                                     rel=1e-6, abs=1e-9)


# -- a parameter array computed by a launch before the loop; loops of unknown length
#    that stop after one or two steps; a loop recorded on two nested tapes
def computed_parameter(n, s, checkpoint, until=False, nested=False):
    u0, v0, f, out = np.zeros(N), np.zeros(N), np.zeros(N), np.zeros(1)

    def step(i, u, v):
        heat(u, v, 0.1, f)
        return v, u

    with kadj.Tape() as tape:
        init(X0, u0)
        init(H, f)                          # f = sin(H), read by every step
        with (kadj.Tape() if nested else _Nothing()) as inner:
            if checkpoint and until:
                u, v = kadj.checkpointed_loop(step, (u0, v0), snapshots=s,
                                              until=lambda i, u, v: i == n - 1)
            else:
                u, v = run(step, (u0, v0), n, s, checkpoint)
            sqloss(u, TARGET, out)
    tape.backward(out)
    if nested:
        inner.backward(out)
    return tape, inner


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("n,s,until", [(5, 2, False), (1, 1, True), (2, 1, True),
                                       (2, 2, True), (6, 2, True)])
def test_parameter_computed_before_the_loop(n, s, until):
    ref, _ = computed_parameter(n, s, False)
    got, _ = computed_parameter(n, s, True, until=until)
    for x in (X0, H):
        assert_same(got.grad(x), ref.grad(x))
    assert np.abs(ref.grad(H)).max() > 0
    assert loop_entry(got).n == n


def test_loop_recorded_on_nested_tapes():
    ref, _ = computed_parameter(6, 2, False)
    outer, inner = computed_parameter(6, 2, True, nested=True)
    for x in (X0, H):
        assert_same(outer.grad(x), ref.grad(x))
    # the inner tape saw u0 and f as they were when it was entered: the loop's start
    ref_inner = kadj.Tape()
    u0, v0, out = np.zeros(N), np.zeros(N), np.zeros(1)
    init.forward(X0, u0)
    f = np.zeros(N)
    init.forward(H, f)
    with ref_inner:
        u, v = u0, v0
        for i in range(6):
            heat(u, v, 0.1, f)
            u, v = v, u
        sqloss(u, TARGET, out)
    ref_inner.backward(out)
    loop_u0 = inner.launches[0].args[0]
    assert_same(inner.grad(loop_u0), ref_inner.grad(u0))


def test_input_overlapping_the_state_is_refused():
    """A step reading a view of a state array would take it for a constant."""
    u0, v0 = X0.copy(), np.zeros(N)

    def step(i, u, v):
        heat(u, v, 0.1, u[::-1])           # u[::-1] changes with the state
        return v, u

    with kadj.Tape():
        with pytest.raises(DifferentiationError, match="overlaps in memory the state"):
            kadj.checkpointed_loop(step, (u0, v0), steps=3, snapshots=2)


@pytest.mark.parametrize("change", ["reads", "writes"])
def test_recomputation_that_differs_late_is_refused(change):
    """The backward checks a recomputed launch once per distinct launch (kernel, state,
    argument memory keys, scalar types): a later step that launches differently from
    its first run (reads another array, or writes one that is not state) is still
    caught, after earlier steps' identical launches were checked and passed."""
    u0, v0 = X0.copy(), np.zeros(N)
    other, scratch = H.copy(), np.zeros(N)
    recomputing = {"on": False}

    def step(i, u, v):
        late = recomputing["on"] and i >= 4
        if late and change == "reads":
            heat(u, v, 0.1, other)           # F when the step first ran
        elif late:
            heat(u, scratch, 0.1, F)         # v when the step first ran
        else:
            heat(u, v, 0.1, F)
        return v, u

    with kadj.Tape() as tape:
        u, v = kadj.checkpointed_loop(step, (u0, v0), steps=8, snapshots=3)
        out = np.zeros(1)
        sqloss(u, TARGET, out)
    recomputing["on"] = True
    words = ("when checkpointed_loop ran a step again" if change == "reads"
             else "which is not a state array it was given")
    with pytest.raises(DifferentiationError, match=words):
        tape.backward(out)


@pytest.mark.parametrize("clock", ["python", "step number"])
def test_a_scalar_from_a_python_clock_is_refused(clock):
    """A step whose scalar comes from Python state advanced at each call (t += dt)
    passes another value when the loop runs it again: refused at the first step run
    again (its gradient was wrong, with no error); computed from the step number it
    equals the store-everything tape's."""
    def make_step():
        state = {"t": 0.0}

        def step(i, u, v):
            t = state["t"] if clock == "python" else 0.5 * i
            heat(u, v, 0.05 * (1.0 + t), F)
            state["t"] += 0.5
            return v, u
        return step

    grads = []
    for checkpoint in (True, False):
        u0, v0 = X0.copy(), np.zeros(N)
        with kadj.Tape() as tape:
            u, v = run(make_step(), (u0, v0), 12, 3, checkpoint)
            out = np.zeros(1)
            sqloss(u, TARGET, out)
        if checkpoint and clock == "python":
            with pytest.raises(DifferentiationError, match=r"step 11 did not do what it "
                               r"did when it first ran \(launches of .heat."):
                tape.backward(out)
            return
        tape.backward(out)
        grads.append(tape.grad(u0))
    assert np.any(grads[1] != 0)
    assert_same(grads[0], grads[1])


@pytest.mark.parametrize("drift", ["buffers by call", "order set after the loop"])
def test_a_step_that_uses_the_state_otherwise_when_run_again_is_refused(drift):
    """A step that hands the state arrays to its launches in other places (a flag
    flipped at every call), or returns the next state in another order (a setting
    changed after the loop ran), when the backward runs it again: refused (its
    gradient was wrong, with no error); a step deciding by the parity of i passes."""
    flag = {"odd": False, "swap": True}

    def step(i, u, v):
        if drift == "buffers by call":
            if flag["odd"]:
                heat(v, u, 0.1, F)
            else:
                heat(u, v, 0.1, F)
            flag["odd"] = not flag["odd"]
            return u, v
        heat(u, v, 0.1, F)
        return (v, u) if flag["swap"] else (u, v)

    with kadj.Tape() as tape:
        u, v = kadj.checkpointed_loop(step, (X0.copy(), np.zeros(N)), steps=9,
                                      snapshots=3)
        out = np.zeros(1)
        sqloss(u, TARGET, out)
    flag["swap"] = False
    with pytest.raises(DifferentiationError, match="did not do what it did"):
        tape.backward(out)


def test_a_step_deciding_by_the_parity_of_i_passes():
    def step(i, u, v):
        if i % 2:
            heat(v, u, 0.1, F)
        else:
            heat(u, v, 0.1, F)
        return u, v

    grads = []
    for checkpoint in (True, False):
        u0, v0 = X0.copy(), np.zeros(N)
        with kadj.Tape() as tape:
            u, v = run(step, (u0, v0), 9, 3, checkpoint)
            out = np.zeros(1)
            sqloss(u if 9 % 2 == 0 else v, TARGET, out)
        tape.backward(out)
        grads.append(tape.grad(u0))
    assert np.any(grads[1] != 0)
    assert_same(grads[0], grads[1])


def test_an_array_made_anew_at_each_call_is_refused_with_what_to_do():
    def step(i, u, v):
        heat(u, v, 0.1, np.sin(0.5 * i) * F)      # a new array at each call
        return v, u

    with kadj.Tape() as tape:
        u, v = kadj.checkpointed_loop(step, (X0.copy(), np.zeros(N)), steps=6,
                                      snapshots=2)
        out = np.zeros(1)
        sqloss(u, TARGET, out)
    with pytest.raises(DifferentiationError, match="makes anew at each call") as info:
        tape.backward(out)
    assert "indexed by the step number" in str(info.value)


def test_recomputed_scalar_of_another_type_is_checked_again():
    """A recomputed launch whose scalar changes type (int, then float) is a new
    launch for the checks; the gradient equals the store-everything tape's."""
    def step(i, u, v):
        heat(u, v, 0 if i % 3 == 0 else 0.1, F)
        return v, u

    grads = []
    for checkpoint in (True, False):
        u0, v0 = X0.copy(), np.zeros(N)
        with kadj.Tape() as tape:
            u, v = run(step, (u0, v0), 7, 2, checkpoint)
            out = np.zeros(1)
            sqloss(u, TARGET, out)
        tape.backward(out)
        grads.append(tape.grad(u0))
    assert np.any(grads[1] != 0)
    assert_same(grads[0], grads[1])


def test_backward_stores_snapshots_in_freed_ones(monkeypatch):
    """The backward stores its snapshots into the arrays of freed ones (the binomial
    schedule stores and frees again and again) rather than allocating new ones; the
    gradient equals the store-everything tape's."""
    from kadj import checkpointing, schedules
    n, s = 40, 4
    stores = sum(1 for a in schedules.binomial(n, s).backward if a[0] == schedules.STORE)
    frees = sum(1 for a in schedules.binomial(n, s).backward if a[0] == schedules.FREE)
    assert stores > 3 and frees > 3

    def step(i, u, v):
        heat(u, v, 0.1, F)
        return v, u

    grads = []
    for checkpoint in (True, False):
        u0, v0 = X0.copy(), np.zeros(N)
        with kadj.Tape() as tape:
            u, v = run(step, (u0, v0), n, s, checkpoint)
            out = np.zeros(1)
            sqloss(u, TARGET, out)
        made = []
        copy = checkpointing.arrays.copy
        monkeypatch.setattr(checkpointing.arrays, "copy",
                            lambda a: made.append(a.shape) or copy(a))
        tape.backward(out)
        monkeypatch.undo()
        grads.append(tape.grad(u0))
        if checkpoint:
            assert len(made) < 2 * stores     # without reuse: two arrays per store
    assert np.any(grads[1] != 0)
    assert_same(grads[0], grads[1])


@pytest.mark.parametrize("where", ["between launches", "after the last launch",
                                   "before the first launch", "in the last step"])
def test_a_change_the_step_makes_outside_its_launches_is_refused(where):
    """A boundary condition set by the step function's Python (``v[0] = 0.0``) is not
    a launch: the loop would recompute and reverse the step without it, a wrong
    gradient (``u[0] += 0.5`` and the like here).  The first sweep compares the state with what the launches left, and
    refuses the change, whichever step and place it is made at."""
    u0, v0 = X0.copy(), np.zeros(N)

    def step(i, u, v):
        last = i == 5
        if where == "before the first launch" and i == 2:
            u[1] += 0.5
        heat(u, v, 0.1, F)
        if where == "between launches" and i == 3:
            v[0] += 0.5
        heat(v, u, 0.1, F)
        if (where == "after the last launch" and i == 1) or \
                (where == "in the last step" and last):
            u[0] += 0.5
        return u, v

    with kadj.Tape():
        with pytest.raises(DifferentiationError,
                           match="changed at or after step .* outside the kernels"):
            kadj.checkpointed_loop(step, (u0, v0), steps=6, snapshots=3)


def test_a_change_made_by_a_custom_step_is_recorded():
    """The same boundary condition launched as kadj.custom_step, with its adjoint, is
    part of the step: no error, and the gradient is the plain tape's."""
    def zero_first_adjoint(adj_v):
        adj_v[0] = 0.0              # v[0]'s old value is overwritten: consumed

    def run(checkpointed):
        u0, v0 = X0.copy(), np.zeros(N)

        def step(i, u, v):
            heat(u, v, 0.1, F)
            kadj.custom_step(lambda: v.__setitem__(0, 0.0), zero_first_adjoint,
                             reads=(v,), writes=(v,))
            return v, u

        with kadj.Tape() as tape:
            if checkpointed:
                u, v = kadj.checkpointed_loop(step, (u0, v0), steps=5, snapshots=2)
            else:
                u, v = u0, v0
                for i in range(5):
                    u, v = step(i, u, v)
            out = np.zeros(1)
            sqloss(u, TARGET, out)
        tape.backward(out)
        return tape.grad(u0)

    assert_same(run(True), run(False))


@pytest.mark.parametrize("when", ["before a step's launch", "after the first step's launch"])
def test_a_parameter_the_steps_read_changed_from_python_is_refused(when):
    """An array the steps read but do not write is a constant to the loop; changing it
    from the step function (a forcing set per step into one array) would be recomputed
    and reversed as if it were not: refused, with what to do."""
    u0, v0, forcing = X0.copy(), np.zeros(N), F.copy()

    def step(i, u, v):
        if when == "before a step's launch" and i == 2:
            forcing[3] += 0.5
        heat(u, v, 0.1, forcing)
        if when == "after the first step's launch" and i == 0:
            forcing[3] += 0.5
        return v, u

    with kadj.Tape():
        with pytest.raises(DifferentiationError, match="read but do not write"):
            kadj.checkpointed_loop(step, (u0, v0), steps=4, snapshots=2)


def test_a_loop_of_no_steps_is_the_state_itself():
    """steps=0 (a length computed as 0): the state, unchanged, and its own gradient."""
    def step(i, u, v):
        heat(u, v, 0.1, F)
        return v, u

    u0, v0 = X0.copy(), np.zeros(N)
    with kadj.Tape() as tape:
        u, v = kadj.checkpointed_loop(step, (u0, v0), steps=0, snapshots=2)
        out = np.zeros(1)
        sqloss(u, TARGET, out)
    assert u is u0 and v is v0 and np.array_equal(u0, X0)
    tape.backward(out)
    assert np.allclose(tape.grad(u0), 2 * (X0 - TARGET))
    assert kadj.checkpointed_loop(step, (u0, v0), steps=0, snapshots=2) == (u0, v0)
