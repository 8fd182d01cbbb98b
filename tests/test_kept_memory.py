"""Memory a CPU adjoint keeps between calls (kadj/call_memory.py, kadj/kept_memory.py).

Kept memory must change nothing an adjoint computes: the same buffers, bit for bit, as
a call whose arrays are all new memory, at a size after a larger and after a smaller
one, on several threads at once, with a tape that grows (a ``while`` loop), with work
copies and scratch arrays (1-D, 2-D, F-ordered), and with the pool limited or off;
gradients against finite differences.  What it is for: a repeated call does not fault
its pages in again.
"""
import math
import sys
import threading

import numpy as np
import pytest
from numba import njit
from numba.core import types as nbtypes

import kadj
from kadj import adj_ir as A
from kadj import call_memory
from kadj.kept_memory import keep_memory
from fdcheck import fd_check
from kernels.cpu.recurrences import euler_until as grow_while  # a tape that grows
from kernels.cpu.stencils import heat_steps_scratch as scratch_steps  # work copy, scratch


@njit
def tanh_chain(x, w, out):
    """A taped recurrence: h's every value is recorded."""
    h = 0.0
    for i in range(x.shape[0]):
        h = math.tanh(w * h + x[i])
        out[i] = h


@njit
def two_tapes(x, k, out):
    """A float64 and an int64 tape (a data-dependent trip count per element)."""
    for i in range(x.shape[0]):
        v = x[i]
        m = int(abs(v) * k) % 4 + 1
        for j in range(m):
            v = math.sin(v) + 0.5 * v
        out[i] = v


def _args_chain(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, n), 0.7, np.zeros(n))


def _args_two(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-2, 2, n), 3.0, np.zeros(n))


def _args_grow(n, seed=0, t_end=3.0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, n), np.zeros(n), 0.8, 0.01, t_end)


@njit
def grid_scratch(a, out):
    """A 2-D scratch array of the kernel's own, and a 2-D argument written in place and
    read again (another element of the row: one the loop may have written)."""
    m, n = a.shape
    w = np.empty((m, n))
    for i in range(m):
        for j in range(n):
            w[i, j] = math.sin(a[i, j]) * (i + 1)
    for i in range(m):
        for j in range(n):
            a[i, j] = w[i, j] * w[m - 1 - i, j]
            out[i] += a[i, n - 1 - j] ** 2


def _args_scratch(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, max(n, 3)), 0.2, 3)


def _args_grid(n, seed=0):
    rng = np.random.default_rng(seed)
    m = max(n // 7, 1)
    return (rng.uniform(-1, 1, (m, 7)), np.zeros(m))


def _args_grid_f(n, seed=0):
    a, out = _args_grid(n, seed)
    return (np.asfortranarray(a), out)


# (the step count of euler_until depends on dt: no derivative in dt to check)
CASES = {"tanh_chain": (tanh_chain, _args_chain, None),
         "two_tapes": (two_tapes, _args_two, None),
         "grow_while": (grow_while, _args_grow, ("y0", "rate")),
         "scratch_steps": (scratch_steps, _args_scratch, None),
         "grid_scratch": (grid_scratch, _args_grid, None),
         "grid_scratch_f": (grid_scratch, _args_grid_f, None)}


def _buffers(plan, args, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in plan.adjoint_args:
        a = args[i]
        out.append(rng.standard_normal(a.shape) if isinstance(a, np.ndarray)
                   else np.zeros(1))
    return out


def _pooled(k, args, seed=1):
    """Buffers after ``k.adjoint`` (through the pool)."""
    fwd = [a.copy(order="K") if isinstance(a, np.ndarray) else a for a in args]
    bufs = _buffers(k.adjoint_plan(*args), fwd, seed)
    k.adjoint(*fwd, *bufs)
    return bufs


def _fresh(k, args, seed=1):
    """Buffers after the compiled adjoint called with every tape new memory."""
    comp = k.compiled(*args)
    fwd = [a.copy(order="K") if isinstance(a, np.ndarray) else a for a in args]
    bufs = _buffers(comp.plan, fwd, seed)
    comp.function(*fwd, *bufs, *comp.fresh_memory())
    return bufs


def _same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def _regions(kept):
    """[(offset, size, asked)] of each slot of a kept set (kadj.call_memory.layout),
    checked to lie apart inside its buffer."""
    buf, meta = kept.args
    n = (meta.shape[0] - 1) // 3
    need, offset, size = call_memory.layout(n)
    out = [(int(meta[offset(s)]), int(meta[size(s)]), int(meta[need(s)]))
           for s in range(1, n + 1)]
    spans = sorted((at, at + b) for at, b, _ in out if b)
    assert all(a % call_memory.ALIGN == 0 for a, _ in spans), spans
    assert all(e <= a2 for (_, e), (a2, _) in zip(spans, spans[1:])), spans
    assert not spans or spans[-1][1] <= buf.shape[0], (spans, buf.shape)
    return out


@pytest.fixture(autouse=True)
def _default_limit():
    call_memory.set_limit(None)
    yield
    call_memory.set_limit(None)


@pytest.mark.parametrize("name", sorted(CASES))
def test_adjoint_keeps_its_memory_and_computes_the_same(name):
    kernel, make, wrt = CASES[name]
    k = kadj.differentiate(kernel, wrt=wrt)
    comp = k.compiled(*make(40))
    assert comp.memory is not None and comp.memory.slots, comp.source
    assert "_keep_need" in comp.source and "_kept_" in comp.source
    for n in (40, 400, 7, 400, 1000, 3):      # larger, smaller, repeated sizes
        args = make(n, seed=n)
        _same(_pooled(k, args), _fresh(k, args))
        kept = comp.memory._free[-1]
        regions = _regions(kept)
        assert len(regions) == len(comp.memory.slots)
        assert any(b > 0 for _, b, _ in regions), "nothing kept after a call"
        assert all(b == asked for _, b, asked in regions), \
            "kept sizes are not the most the calls asked for"
        assert kept.args[-1][0] == 0, "a need flag left set"
    fd_check(k, make(9, seed=3))


def test_what_is_kept_in_a_scratch_kernel():
    k = kadj.differentiate(scratch_steps)
    src = k.adjoint_source(*_args_scratch(10))
    assert "u_work = _kept_copy(_keep_bytes, u, _keep_need, " in src, src
    assert "b = _kept_zeros(_keep_bytes, n, np.float64, _keep_need, " in src, src
    assert "adj_b = _kept_zeros_like(_keep_bytes, b, _keep_need, " in src, src
    assert "Kept between calls: " in src and "u_work" in src.split("Kept between")[1]


def test_an_f_ordered_argument_keeps_its_own_work_copy():
    """numba's copy of an F-ordered array is C-ordered, its empty_like F-ordered: the
    kept forms are C-ordered, so an F-ordered array's are left as they were."""
    k = kadj.differentiate(grid_scratch)
    f_src = k.adjoint_source(*_args_grid_f(21))
    c_src = k.adjoint_source(*_args_grid(21))
    assert "a_work = _kept_" in c_src
    assert "a_work = _kept_" not in f_src and "Kept between calls: w" in f_src


def test_kept_memory_is_what_the_largest_call_needed():
    k = kadj.differentiate(tanh_chain)
    comp = k.compiled(*_args_chain(10))
    assert comp.memory.slots == ("tape_f64",)
    for n in (100, 2000, 50):
        _pooled(k, _args_chain(n))
    (kept,) = comp.memory._free
    assert [b for _, b, _ in _regions(kept)] == [2000 * 8]    # one f64 per element


def test_growable_tape_is_kept_at_its_grown_size():
    k = kadj.differentiate(grow_while, wrt=("y0", "rate"))
    args = _args_grow(30, t_end=20.0)   # 2000 steps per element, replayed one at a time
    comp = k.compiled(*args)
    tape = comp.memory.slots.index("tape_f64")
    _same(_pooled(k, args), _fresh(k, args))
    (kept,) = comp.memory._free
    big = _regions(kept)[tape][1]
    assert big > 1024 * 8, "the tape never grew past its first allocation"
    _same(_pooled(k, args), _fresh(k, args))
    assert _regions(comp.memory._free[0])[tape][1] == big, "grew again on the same call"
    fd_check(k, _args_grow(3, t_end=0.3))


def test_concurrent_calls_never_share_memory():
    k = kadj.differentiate(scratch_steps)
    sizes = [3000 + 17 * t for t in range(6)]
    want = [_fresh(k, _args_scratch(n, seed=n)) for n in sizes]
    got, errors = [None] * len(sizes), []
    barrier = threading.Barrier(len(sizes))

    def work(t):
        try:
            barrier.wait()
            for _ in range(20):
                got[t] = _pooled(k, _args_scratch(sizes[t], seed=sizes[t]))
        except Exception as exc:        # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(len(sizes))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for g, w in zip(got, want):
        _same(g, w)
    assert 1 <= len(k.compiled(*_args_scratch(3)).memory._free) <= call_memory._MAX_SETS


def test_limit_zero_keeps_nothing_and_a_small_limit_keeps_no_more():
    k = kadj.differentiate(tanh_chain)
    args = _args_chain(5000)
    pool = k.compiled(*args).memory
    call_memory.set_limit(0)
    _same(_pooled(k, args), _fresh(k, args))
    assert all(s.args[0].shape[0] == 0 for s in pool._free)
    assert call_memory.stats()["bytes"] == 0
    call_memory.set_limit(8 * 100)      # room for 100 entries, the call needs 5000
    _same(_pooled(k, args), _fresh(k, args))
    assert all(s.args[0].shape[0] == 0 for s in pool._free)
    call_memory.set_limit(None)
    _pooled(k, args)
    assert pool._free[0].args[0].shape[0] == 5000 * 8
    assert call_memory.stats()["bytes"] >= 5000 * 8
    call_memory.clear()
    assert pool._free == []


def test_a_kept_set_never_grows_past_the_limit():
    """A set that holds memory and would grow beyond the limit stays as it is (its
    larger calls allocate as without it)."""
    k = kadj.differentiate(tanh_chain)
    args = _args_chain(5000)
    pool = k.compiled(*args).memory
    call_memory.clear()
    call_memory.set_limit(5000 * 8 + 100)          # room for this call's tape, not twice
    _pooled(k, args)
    assert pool._free[0].args[0].shape[0] == 5000 * 8
    big = _args_chain(9000)
    _same(_pooled(k, big), _fresh(k, big))
    assert call_memory.stats()["bytes"] <= 5000 * 8 + 100
    assert pool._free[0].args[0].shape[0] == 5000 * 8
    call_memory.set_limit(None)
    _pooled(k, big)
    assert pool._free[0].args[0].shape[0] == 9000 * 8


def test_limit_is_checked():
    for bad in (-1, "1 GB", 1.5, True):
        with pytest.raises(ValueError, match="number of bytes"):
            call_memory.set_limit(bad)


def test_limit_from_the_environment(monkeypatch):
    monkeypatch.setenv("KADJ_KEPT_MEMORY_BYTES", "4096")
    assert call_memory.limit() == 4096
    monkeypatch.setenv("KADJ_KEPT_MEMORY_BYTES", "lots")
    with pytest.raises(ValueError, match="KADJ_KEPT_MEMORY_BYTES"):
        call_memory.limit()


def test_bounds_checked_run_still_gets_tapes_of_exactly_their_size():
    """A bounds-checked run (kadj.testing) passes no kept memory: each tape is exactly
    what its reservation asked, so a push past it raises instead of landing in a
    larger kept array."""
    from kadj.testing.boundscheck import _BoundsChecked
    k = kadj.differentiate(tanh_chain)
    args = _args_chain(64)
    _pooled(k, _args_chain(5000))                  # a large kept tape exists
    checked = _BoundsChecked(k)
    fwd = [a.copy(order="K") if isinstance(a, np.ndarray) else a for a in args]
    bufs = _buffers(k.adjoint_plan(*args), fwd, 1)
    checked.adjoint(*fwd, *bufs)
    _same(bufs, _fresh(k, args))


def test_only_allocations_made_once_are_kept():
    """An array allocated in a loop body (each iteration its own), or a name assigned
    again elsewhere, is not taken from kept memory; a tape or scratch array allocated in
    the prologue or the straight-line body is."""
    loop = A.For("i", "range(n)", [A.Assign("_tape_i64", "np.empty((n,), np.int64)"),
                                   A.Assign("s", "np.zeros(n)")])
    fn = A.Function("f_adjoint", ("n", "x"), "doc",
                    prologue=[A.Assign("_tape_f64", "np.empty((1024,), np.float64)"),
                              A.Assign("_sp_f64", "0"),
                              A.Assign("x_work", "x.copy()"),
                              A.Assign("y", "np.empty((n, 3), dtype=np.float32)"),
                              A.Assign("z", "np.zeros(n)"),
                              A.Assign("s", "np.zeros(n)")],
                    body=[loop, A.Block("b", [A.Assign("_tape_f32",
                                                       "np.empty((n,), np.float32)"),
                                              A.Assign("z", "x_work")])])
    ns = {}
    layouts = {"x": nbtypes.float64[:]}
    assert keep_memory(fn, ns, layouts) == ("_tape_f64", "x_work", "y", "_tape_f32")
    assert fn.params == ("n", "x", "_keep_bytes", "_keep_need")
    assert fn.doc == "doc\n\n    Kept between calls: tape_f64, x_work, y, tape_f32."
    values = [x.value for x in fn.prologue]
    # (slot 1's region size: entry 2 * 4 + 1 of the layout)
    assert values[0] == "_kept_array(_keep_bytes, max(1024, _keep_need[9] // 8), " \
                        "np.float64, _keep_need, 1)"
    assert values[2] == "_kept_copy(_keep_bytes, x, _keep_need, 2)"
    assert values[3] == "_kept_array(_keep_bytes, (n, 3), np.float32, _keep_need, 3)"
    assert values[4:] == ["np.zeros(n)", "np.zeros(n)"]     # z, s: assigned again
    assert fn.body[1].body[0].value == "_kept_array(_keep_bytes, n, np.float32, " \
                                       "_keep_need, 4)"
    assert loop.body[0].value == "np.empty((n,), np.int64)"
    assert {"_kept_array", "_kept_copy"} <= set(ns)


def test_growth_of_a_kept_tape_notes_its_size():
    fn = A.Function("f_adjoint", ("n",), "doc",
                    prologue=[A.Assign("_tape_f64", "np.empty((1024,), np.float64)"),
                              A.Assign("_sp_f64", "0")],
                    body=[A.While("True", [A.Reserve(None, {"f64": "2"})])])
    keep_memory(fn, {}, {})
    (grow,) = fn.body[0].body
    assert isinstance(grow, A.If) and grow.cond == "_sp_f64 + 2 > _tape_f64.shape[0]"
    assert [x.value for x in grow.then] == [
        "_reserve(_tape_f64, _sp_f64 + 2)", "max(_keep_need[1], _tape_f64.nbytes)", "1"]


def test_user_arrays_untouched_by_kept_calls():
    k = kadj.differentiate(scratch_steps)
    args = _args_scratch(300, seed=5)
    before = [a.copy(order="K") if isinstance(a, np.ndarray) else a for a in args]
    bufs = _buffers(k.adjoint_plan(*args), args, 2)
    for _ in range(3):
        k.adjoint(*args, *[b.copy() for b in bufs])
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)


def test_helpers_keep_numpys_errors():
    from kadj.kept_helpers import _kept_array, _kept_zeros
    need, keep = np.zeros(1, np.int64), np.empty(4096, np.uint8)
    with pytest.raises(ValueError):
        _kept_array(keep, -1, np.float64, need, 0)
    need = np.array([0, 0, 0, 4096], np.int64)     # one slot: all 4096 bytes
    z = _kept_zeros(keep, (3, 5), np.complex128, need, 1)
    assert z.shape == (3, 5) and z.dtype == np.complex128 and not z.any()
    assert list(need[:2]) == [0, 0]              # it fits in the 4096 kept bytes
    z = _kept_zeros(keep, (30, 50), np.complex128, need, 1)
    assert not z.any() and list(need[:2]) == [1, 30 * 50 * 16]


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="counts page faults with getrusage (Linux)")
def test_repeated_call_does_not_fault_its_tape_in_again():
    """A 48 MB tape (above glibc's largest mmap threshold, 32 MiB): the first call
    faults its pages in; a repeated call, in kept memory, faults only a few."""
    import resource
    k = kadj.differentiate(tanh_chain)
    n = 6_000_000
    args = _args_chain(n)
    fwd = [a.copy() for a in (args[0], args[2])]
    bufs = [np.zeros(n), np.zeros(1), np.ones(n)]
    k.adjoint(fwd[0], 0.7, fwd[1], *bufs)         # compiles, keeps the tape

    def faults():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        k.adjoint(fwd[0], 0.7, fwd[1], *bufs)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    pages = n * 8 // 4096
    kept = min(faults() for _ in range(3))
    call_memory.set_limit(0)
    fresh = min(faults() for _ in range(3))
    assert fresh > pages // 2, (fresh, pages)
    assert kept < pages // 10, (kept, fresh, pages)


@njit
def named_like_kept(x, _keep_need, _keep_bytes):
    """A user's names that look like the kept-memory parameters."""
    b = np.zeros(x.shape[0])
    _keep_tmp = 0.0
    for i in range(x.shape[0]):
        b[i] = math.sin(x[i]) * _keep_need
        _keep_tmp += b[i]
    _keep_bytes[0] = _keep_tmp * b[x.shape[0] - 1]


def test_user_names_like_the_kept_parameters_get_their_own():
    k = kadj.differentiate(named_like_kept)
    args = (np.linspace(0.1, 1.0, 7), 1.5, np.zeros(1))
    src = k.adjoint_source(*args)
    params = src.split("def named_like_kept_adjoint(")[1].split(")")[0].split(", ")
    assert len(set(params)) == len(params), params
    assert params[-2:] == ["_keep_bytes", "_keep_need"], params
    assert params[1] == "_keep_need_2" and params[2] == "_keep_bytes_2", params  # the user's
    assert "b" in k.compiled(*args).memory.slots
    for _ in range(2):
        fd_check(k, args)
