"""Element updates in place (kadj.store_forwarding, kadj.entry_loads): a load after a
store of the same element reads the stored value, an overwritten store goes, and a load
that reads what the user's array held on entry is read from it in both sweeps.  Each
rewrite happens where it keeps the meaning and is refused where it would not; every
adjoint here is compared with central finite differences (fd_check, which also checks
that the user's arrays are unchanged) and, compiled with bounds checking, with
kadj.testing.check_grad at a size whose tapes grow."""
import math

import numpy as np
import pytest
from numba import njit, prange

import kadj
from kadj import entry_loads, ir, store_forwarding
from fdcheck import fd_check
from kernels.cpu.misc import inplace_update    # y[i] += ...; -= ...; *= ...; /= ...


def _prepared(kernel, args):
    return kadj.differentiate(kernel).stages(*args, until="prepared")["prepared"].kernel


def _loads(kernel, arr):
    return [s.expr for s in ir.walk(kernel.body)
            if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load) and
            s.expr.array.name == arr]


def _stores(kernel, arr):
    return [s for s in ir.walk(kernel.body) if isinstance(s, ir.Store) and s.array.name == arr]


def _checked(kernel, args, n_big=None, make=None):
    """fd_check at the given size; check_grad (adjoint compiled with bounds checking)
    at a size whose tapes, where the adjoint has any, grow past their first capacity."""
    fd_check(kadj.differentiate(kernel), args)
    if make is not None:
        kadj.testing.check_grad(kadj.differentiate(kernel), make(n_big), boundscheck=True)


def _src(kernel, args):
    return kadj.differentiate(kernel).adjoint_source(*args)


# ------------------------------------------------------------ the rewrite itself

def _four_args(n, dtype=np.float64):
    rng = np.random.default_rng(n)
    return (rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype),
            dtype(1.3), dtype(0.4))


def test_augmented_assignments_become_one_load_and_one_store():
    k = _prepared(inplace_update, _four_args(5))
    loads, stores = _loads(k, "y"), _stores(k, "y")
    assert len(loads) == 1 and loads[0].entry, ir.fmt(k.body)
    assert len(stores) == 1, ir.fmt(k.body)


def test_an_update_in_place_has_no_work_copy_and_no_tape():
    args = _four_args(9)
    src = _src(inplace_update, args)
    assert "y_work" not in src and "_tape_" not in src and "_keep_" not in src, src
    assert "y[i]" in src, src          # read from the user's array, at reverse time
    _checked(inplace_update, args, 5000, _four_args)


def test_float32_updates_forward_all_but_the_converting_store():
    """float32 arrays: ``y[i] /= 1.0 + x*x`` computes in float64 and rounds on the
    store, which stays (nothing loads the element after it); the three stores before it
    hold float32 values and go, with the loads that followed them."""
    args = _four_args(7, np.float32)
    k = _prepared(inplace_update, args)
    assert len(_stores(k, "y")) == 1 and len(_loads(k, "y")) == 1, ir.fmt(k.body)
    kadj.testing.check_grad(kadj.differentiate(inplace_update), args, boundscheck=True)


@njit
def converting_store(x, y):
    for i in range(x.shape[0]):
        y[i] = x[i] * 3.0          # float64 value into a float32 array: rounded
        y[i] = y[i] * y[i]


def test_a_converting_store_keeps_its_load():
    x = np.linspace(0.1, 1.0, 6)
    y = np.zeros(6, np.float32)
    k = _prepared(converting_store, (x, y))
    assert len(_stores(k, "y")) == 2 and len(_loads(k, "y")) == 2, ir.fmt(k.body)
    assert not any(ld.entry for ld in _loads(k, "y"))
    kadj.testing.check_grad(kadj.differentiate(converting_store), (x, y), boundscheck=True)


@njit
def store_between(x, y, z):
    for i in range(x.shape[0]):
        y[i] = x[i] * 2.0
        y[0] = 1.0                 # may be the same element
        z[i] = y[i] * y[i]


def test_a_store_into_the_array_in_between_stops_forwarding():
    args = (np.linspace(0.1, 1.0, 6), np.zeros(6), np.zeros(6))
    k = _prepared(store_between, args)
    assert len(_loads(k, "y")) == 2
    _checked(store_between, args)


@njit
def index_changes(x, y):
    for i in range(x.shape[0] - 1):
        j = i
        y[j] = x[i] * 2.0
        j = i + 1
        y[j] = y[j] + x[i]          # not the element stored above


def test_an_index_assigned_in_between_stops_forwarding():
    args = (np.linspace(0.1, 1.0, 6), np.linspace(1.0, 2.0, 6))
    k = _prepared(index_changes, args)
    assert len(_loads(k, "y")) == 1 and len(_stores(k, "y")) == 2
    _checked(index_changes, args)


@njit
def write_then_read_back(x, y, out):
    for i in range(x.shape[0]):
        y[i] = math.sin(x[i])
        out[i] = y[i] * y[i] + y[i]


def test_loads_after_a_store_read_the_stored_value():
    args = (np.linspace(0.1, 1.0, 6), np.zeros(6), np.zeros(6))
    k = _prepared(write_then_read_back, args)
    assert _loads(k, "y") == [] and len(_stores(k, "y")) == 1
    # the loads were numba temporaries: they read the stored variable itself
    (store,) = _stores(k, "y")
    assert not any(isinstance(s, ir.Assign) and isinstance(s.expr, ir.Copy) and
                   s.expr.src == store.value for s in ir.walk(k.body)), ir.fmt(k.body)
    assert sum(1 for s in ir.walk(k.body) if isinstance(s, ir.Assign) and
               store.value.name in ir.stmt_reads(s)) == 2, ir.fmt(k.body)
    _checked(write_then_read_back, args)


# ------------------------------------------------------------ entry loads

@njit
def sine_in_place(x, y):
    for i in range(y.shape[0]):
        y[i] = math.sin(y[i]) * x[i]


@njit
def grid_in_place(x, y):
    for i in range(y.shape[0]):
        for j in range(y.shape[1]):
            y[i, j] = y[i, j] * math.exp(x[i, j])


@njit
def conditional_in_place(x, y):
    for i in range(y.shape[0]):
        if x[i] > 0.0:
            y[i] = y[i] * y[i] * x[i]


@njit
def entry_read_before_the_loop(x, y, out):
    s = y[0] * 2.0
    for i in range(y.shape[0]):
        y[i] = y[i] * s + x[i]
    out[0] = s


def _pair(n, shape=None):
    rng = np.random.default_rng(n)
    shape = shape or (n,)
    return rng.uniform(-1.0, 1.0, shape), rng.uniform(0.5, 1.5, shape)


@pytest.mark.parametrize("kernel, make", [
    (sine_in_place, lambda n: _pair(n)),
    (grid_in_place, lambda n: _pair(n, (n, 3))),
    (conditional_in_place, lambda n: _pair(n)),
    (entry_read_before_the_loop, lambda n: _pair(n) + (np.zeros(1),)),
], ids=["sine", "grid", "conditional", "before-the-loop"])
def test_entry_loads_read_the_users_array(kernel, make):
    args = make(7)
    k = _prepared(kernel, args)
    assert all(ld.entry for ld in _loads(k, "y")), ir.fmt(k.body)
    src = _src(kernel, args)
    assert "y_work" not in src and "_tape_" not in src, src
    _checked(kernel, args, 3000, make)


@njit
def time_steps(x, y, nsteps):
    for t in range(nsteps):
        for i in range(y.shape[0]):
            y[i] = math.sin(y[i]) + x[i]


@njit
def neighbour(x, y):
    for i in range(1, y.shape[0]):
        y[i] = y[i] * y[i - 1] + x[i]


@njit
def accumulate_over_j(x, y):
    for i in range(y.shape[0]):
        for j in range(x.shape[0]):
            y[i] = y[i] * 0.5 + x[j]        # element i again for every j


@njit
def store_first(x, y):
    for i in range(y.shape[0]):
        y[i] = x[i]
    for i in range(y.shape[0]):
        y[i] = y[i] * y[i]


@njit
def negative_counter(x, y):
    for i in range(-2, y.shape[0] - 2):
        y[i] = y[i] * y[i] + x[i]           # y[-1] and y[n-1] are one element


@njit
def while_inside(x, y):
    for i in range(y.shape[0]):
        k = 0
        while k < 2:
            y[i] = y[i] * x[i] + 1.0        # the element again at each k
            k += 1


@njit
def counter_reassigned(x, y):
    for i in range(y.shape[0]):
        v = y[i] * x[i]
        i = 0
        y[i] = v


@pytest.mark.parametrize("kernel, args, entry", [
    (time_steps, (np.linspace(0.1, 1.0, 5), np.linspace(0.2, 0.9, 5), 3), []),
    (neighbour, (np.linspace(0.1, 1.0, 5), np.linspace(0.2, 0.9, 5)), ["y[i] (on entry)"]),
    (accumulate_over_j, (np.linspace(0.1, 1.0, 3), np.linspace(0.2, 0.9, 4)), []),
    (store_first, (np.linspace(0.1, 1.0, 5), np.linspace(0.2, 0.9, 5)), []),
    (negative_counter, (np.linspace(0.1, 1.0, 5), np.linspace(0.2, 0.9, 5)), []),
    (while_inside, (np.linspace(0.1, 1.0, 5), np.linspace(0.2, 0.9, 5)), []),
    (counter_reassigned, (np.linspace(0.1, 1.0, 5), np.linspace(0.2, 0.9, 5)), []),
], ids=["time-loop", "neighbour", "same-element-per-j", "stored-first", "negative",
        "while", "counter-assigned"])
def test_loads_that_may_read_a_stored_value_are_not_entry_loads(kernel, args, entry):
    """Only the loads listed read what the array held on entry (``neighbour``: its
    ``y[i]`` is read before the iteration stores it; ``y[i - 1]`` is the previous
    iteration's)."""
    k = _prepared(kernel, args)
    got = sorted(ir.fmt([ir.Assign("v", ld)]).split(" = ")[1] for ld in _loads(k, "y")
                 if ld.entry)
    assert got == entry, ir.fmt(k.body)
    fd_check(kadj.differentiate(kernel), args)


def test_the_rewrites_change_nothing_without_stores():
    @njit
    def pure(x, out):
        for i in range(x.shape[0]):
            out[i] = x[i] * x[i]
    args = (np.ones(3), np.zeros(3))
    k = kadj.differentiate(pure).stages(*args, until="region")["region"]
    assert store_forwarding.rewrite(k) is k and entry_loads.rewrite(k) is k


# ------------------------------------------------------------ mixed and parallel

@njit
def entry_and_later(x, y, out):
    for i in range(y.shape[0]):
        y[i] = y[i] * x[i]                  # entry load
    for i in range(1, y.shape[0]):
        out[i] = y[i - 1] * y[i]            # reads what the first loop stored


def test_entry_and_current_loads_of_one_array():
    args = (np.linspace(0.1, 1.0, 6), np.linspace(0.2, 0.9, 6), np.zeros(6))
    k = _prepared(entry_and_later, args)
    entry = [ld.entry for ld in _loads(k, "y")]
    assert entry.count(True) == 1 and entry.count(False) == 2, ir.fmt(k.body)
    src = _src(entry_and_later, args)
    assert "y_work" in src, src             # the second loop reads the stored values
    _checked(entry_and_later, args, 3000, lambda n: (
        np.linspace(0.1, 1.0, n), np.linspace(0.2, 0.9, n), np.zeros(n)))


@njit(parallel=True)
def parallel_in_place(x, y, a):
    for i in prange(y.shape[0]):
        y[i] = a * math.tanh(y[i]) + x[i] * y[i]


def test_a_parallel_update_in_place():
    args = (np.linspace(-1.0, 1.0, 9), np.linspace(0.2, 0.9, 9), 0.7)
    src = _src(parallel_in_place, args)
    assert "y_work" not in src and "_tape_" not in src, src
    fd_check(kadj.differentiate(parallel_in_place), args)




@njit
def stencil_in_place(x, y, a):
    for i in range(1, x.shape[0] - 1):
        y[i] = y[i] * y[i] + a * (x[i - 1] - 2.0 * x[i] + x[i + 1])


@pytest.mark.parametrize("gather", [True, False])
def test_an_in_place_stencil_in_both_forms(gather):
    """``y`` is read only on entry, so the kernel qualifies for the gather form (each
    ``adj_x`` element collected once) as an out-of-place stencil does."""
    args = (np.linspace(0.1, 1.0, 9), np.linspace(0.3, 1.2, 9), 0.7)
    k = kadj.differentiate(stencil_in_place, gather=gather)
    src = k.adjoint_source(*args)
    assert ("gather form" in src) == gather and "y_work" not in src, src
    fd_check(k, args)
    kadj.testing.check_grad(k, (np.linspace(0.1, 1.0, 3001), np.linspace(0.3, 1.2, 3001),
                                0.7), boundscheck=True)


# ------------------------------------------------------------ neighbours ahead

@njit
def heat_in_place(u, a):
    prev = u[0]
    for i in range(1, u.shape[0] - 1):
        cur = u[i]
        u[i] = cur + a * (prev - 2.0 * cur + u[i + 1])
        prev = cur


@njit
def sor_sweep(u, f, w):
    for i in range(1, u.shape[0] - 1):
        u[i] = (1.0 - w) * u[i] + w * 0.5 * (u[i - 1] + u[i + 1] + f[i] * f[i])


@njit
def sweep_down(u, a):
    for i in range(u.shape[0] - 2, 0, -1):
        u[i] = u[i] + a * u[i - 1] * u[i + 1]


@njit
def even_elements(x, y):
    for i in range(0, y.shape[0] - 1, 2):
        y[i] = y[i] * y[i + 1] + x[i]


@njit
def wraps_below_zero(x, y):
    for i in range(0, y.shape[0] - 1):
        y[i - 1] = y[i + 1] * y[i + 1] + x[i]    # y[-1] is y[n - 1], read later


@njit
def rows_in_place(u, a):
    for i in range(u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            u[i, j] = u[i, j] * u[i + 1, j] + a * (u[i, j + 1] - u[i, j - 1])


def _n(n):
    return np.linspace(0.2, 1.1, n) ** 2


@pytest.mark.parametrize("kernel, make, entry, current", [
    # (entry loads, other loads of the array)
    (heat_in_place, lambda n: (_n(n), 0.3), 3, 0),           # u[0], u[i], u[i + 1]
    (sor_sweep, lambda n: (_n(n), np.linspace(0.0, 1.0, n), 1.2), 2, 1),
    (sweep_down, lambda n: (_n(n), 0.4), 2, 1),              # going down: u[i - 1] ahead
    (even_elements, lambda n: (np.linspace(0.0, 1.0, n), _n(n)), 2, 0),
    (wraps_below_zero, lambda n: (np.linspace(0.0, 1.0, n), _n(n)), 0, 2),
    (rows_in_place, lambda n: (np.outer(_n(n), _n(5)), 0.3), 2, 2),
], ids=["heat", "sor", "down", "step-2", "wraps", "rows"])
def test_elements_ahead_of_the_sweep_are_read_on_entry(kernel, make, entry, current):
    """An update in place reads its neighbour ahead (``u[i + 1]`` going up, ``u[i - 1]``
    going down) before any iteration writes it; the neighbour behind it, a row an outer
    loop's other iteration writes (``u[i + 1, j]``), and an index that may wrap below 0
    are the stored values."""
    args = make(9)
    k = _prepared(kernel, args)
    arr = k.args[0] if kernel not in (even_elements, wraps_below_zero) else "y"
    flags = [ld.entry for ld in _loads(k, arr)]
    assert (flags.count(True), flags.count(False)) == (entry, current), ir.fmt(k.body)
    if current == 0:
        assert f"{arr}_work" not in _src(kernel, args)
    _checked(kernel, args, 3001, make)


@njit
def updated_then_summed(x, y):
    for i in range(x.shape[0]):
        y[i] += math.sin(x[i]) * x[i]
        y[i] *= y[i] + x[i]
    s = 0.0
    for i in range(x.shape[0]):
        s += y[i] * y[i]
    return s


def test_hessian_vector_product_of_an_update_in_place():
    """kadj.hvp differentiates the tangent function in reverse: both run through the
    rewrites.  Compared with central differences of kadj.grad along v."""
    rng = np.random.default_rng(0)
    x, y, v = rng.standard_normal(7), rng.standard_normal(7), rng.standard_normal(7)
    y0 = y.copy()
    hv = kadj.hvp(updated_then_summed)(x, y, v)
    np.testing.assert_array_equal(y, y0)
    g = kadj.grad(updated_then_summed)
    eps = 1e-6
    fd = (g(x + eps * v, y.copy()) - g(x - eps * v, y.copy())) / (2 * eps)
    np.testing.assert_allclose(hv, fd, rtol=1e-6, atol=1e-7)


@njit
def ahead_only(x, y, a):
    for i in range(0, y.shape[0] - 1):
        y[i] = a * y[i + 1] * y[i + 1] + x[i]


@pytest.mark.parametrize("opts", [{}, {"parallel": True}, {"gather": True}],
                         ids=["default", "parallel", "gather"])
def test_a_neighbour_read_on_entry_still_orders_the_reverse(opts):
    """``y[i + 1]`` is read on entry, but its adjoint goes to the element the next
    iteration stores: that iteration's reverse must take its cotangent first.  The
    reversed loop runs backwards, serially, in the scatter form."""
    k = kadj.differentiate(ahead_only, **opts)
    args = (np.linspace(-1.0, 1.0, 8), np.linspace(0.2, 0.9, 8), 0.6)
    src = k.adjoint_source(*args)
    assert "y_work" not in src and "_tape_" not in src, src
    assert "independent" not in src and "prange" not in src and \
        "gather form" not in src, src
    fd_check(k, args)
    kadj.testing.check_grad(k, (np.linspace(-1.0, 1.0, 3001), np.linspace(0.2, 0.9, 3001),
                                0.6), boundscheck=True)
