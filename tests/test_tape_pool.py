"""Tape memory kept between calls of a CPU adjoint (kadj/tape_pool.py, kadj/kept_tapes.py).

A kept tape must change nothing an adjoint computes: the same buffers, bit for bit, as
a call whose tapes are all new memory, at a size after a larger and after a smaller
one, on several threads at once, with a tape that grows (a ``while`` loop), and with
the pool limited or off; gradients against finite differences.  What it is for: a
repeated call does not fault its tape's pages in again.
"""
import math
import sys
import threading

import numpy as np
import pytest
from numba import njit

import kadj
from kadj import adj_ir as A
from kadj import tape_pool
from kadj.kept_tapes import keep_tapes
from fdcheck import fd_check


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


@njit
def grow_while(y0, out, rate, dt, t_end):
    """A tape that grows: one push per step of a while loop."""
    for i in range(y0.shape[0]):
        y = y0[i]
        t = 0.0
        while t < t_end:
            y = y + dt * rate * math.cos(y)
            t += dt
        out[i] = y


def _args_chain(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, n), 0.7, np.zeros(n))


def _args_two(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-2, 2, n), 3.0, np.zeros(n))


def _args_grow(n, seed=0, t_end=3.0):
    rng = np.random.default_rng(seed)
    return (rng.uniform(-1, 1, n), np.zeros(n), 0.8, 0.01, t_end)


# (the step count of grow_while depends on dt: no derivative in dt to check)
CASES = {"tanh_chain": (tanh_chain, _args_chain, None),
         "two_tapes": (two_tapes, _args_two, None),
         "grow_while": (grow_while, _args_grow, ("y0", "rate"))}


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
    fwd = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    bufs = _buffers(k.adjoint_plan(*args), fwd, seed)
    k.adjoint(*fwd, *bufs)
    return bufs


def _fresh(k, args, seed=1):
    """Buffers after the compiled adjoint called with every tape new memory."""
    comp = k.compiled(*args)
    fwd = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    bufs = _buffers(comp.plan, fwd, seed)
    comp.function(*fwd, *bufs, *comp.fresh_tapes())
    return bufs


def _same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(autouse=True)
def _default_limit():
    tape_pool.set_limit(None)
    yield
    tape_pool.set_limit(None)


@pytest.mark.parametrize("name", sorted(CASES))
def test_adjoint_keeps_its_tapes_and_computes_the_same(name):
    kernel, make, wrt = CASES[name]
    k = kadj.differentiate(kernel, wrt=wrt)
    comp = k.compiled(*make(40))
    assert comp.tape_pool is not None and comp.tape_pool.kinds, comp.source
    assert "_keep_need" in comp.source and "_kept(" in comp.source
    for n in (40, 400, 7, 400, 1000, 3):      # larger, smaller, repeated sizes
        args = make(n, seed=n)
        _same(_pooled(k, args), _fresh(k, args))
        kept = comp.tape_pool._free[-1]
        assert all(a.shape[0] > 0 for a in kept[:-1]), "nothing kept after a call"
        assert not kept[-1].any(), "need counts not reset"
    fd_check(k, make(9, seed=3))


def test_kept_memory_is_what_the_largest_call_needed():
    k = kadj.differentiate(tanh_chain)
    comp = k.compiled(*_args_chain(10))
    for n in (100, 2000, 50):
        _pooled(k, _args_chain(n))
    (kept,) = comp.tape_pool._free
    assert [a.shape[0] for a in kept[:-1]] == [2000]    # one f64 per element


def test_growable_tape_is_kept_at_its_grown_size():
    k = kadj.differentiate(grow_while, wrt=("y0", "rate"))
    args = _args_grow(30, t_end=5.0)             # 500 steps per element: it grows
    comp = k.compiled(*args)
    _same(_pooled(k, args), _fresh(k, args))
    (kept,) = comp.tape_pool._free
    big = kept[0].shape[0]
    assert big > 1024, "the tape never grew past its first allocation"
    _same(_pooled(k, args), _fresh(k, args))
    assert comp.tape_pool._free[0][0].shape[0] == big, "grew again on the same call"
    fd_check(k, _args_grow(3, t_end=0.3))


def test_concurrent_calls_never_share_tape_memory():
    k = kadj.differentiate(tanh_chain)
    sizes = [3000 + 17 * t for t in range(6)]
    want = [_fresh(k, _args_chain(n, seed=n)) for n in sizes]
    got, errors = [None] * len(sizes), []
    barrier = threading.Barrier(len(sizes))

    def work(t):
        try:
            barrier.wait()
            for _ in range(20):
                got[t] = _pooled(k, _args_chain(sizes[t], seed=sizes[t]))
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
    assert 1 <= len(k.compiled(*_args_chain(3)).tape_pool._free) <= tape_pool._MAX_SETS


def test_limit_zero_keeps_nothing_and_a_small_limit_keeps_no_more():
    k = kadj.differentiate(tanh_chain)
    args = _args_chain(5000)
    pool = k.compiled(*args).tape_pool
    tape_pool.set_limit(0)
    _same(_pooled(k, args), _fresh(k, args))
    assert pool._free == []
    tape_pool.set_limit(8 * 100)      # room for 100 entries, the call needs 5000
    _same(_pooled(k, args), _fresh(k, args))
    assert all(s[0].shape[0] == 0 for s in pool._free)
    tape_pool.set_limit(None)
    _pooled(k, args)
    assert pool._free[0][0].shape[0] == 5000
    assert tape_pool.stats()["bytes"] >= 5000 * 8
    tape_pool.clear()
    assert pool._free == []


def test_limit_is_checked():
    with pytest.raises(ValueError, match="number of bytes"):
        tape_pool.set_limit(-1)
    with pytest.raises(ValueError, match="number of bytes"):
        tape_pool.set_limit("1 GB")


def test_limit_from_the_environment(monkeypatch):
    monkeypatch.setenv("KADJ_TAPE_POOL_BYTES", "4096")
    assert tape_pool.limit() == 4096
    monkeypatch.setenv("KADJ_TAPE_POOL_BYTES", "lots")
    with pytest.raises(ValueError, match="KADJ_TAPE_POOL_BYTES"):
        tape_pool.limit()


def test_bounds_checked_run_still_gets_tapes_of_exactly_their_size():
    """A bounds-checked run (kadj.testing) passes no kept memory: each tape is exactly
    what its reservation asked, so a push past it raises instead of landing in a
    larger kept array."""
    from kadj.testing.boundscheck import _BoundsChecked
    k = kadj.differentiate(tanh_chain)
    args = _args_chain(64)
    _pooled(k, _args_chain(5000))                  # a large kept tape exists
    checked = _BoundsChecked(k)
    fwd = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    bufs = _buffers(k.adjoint_plan(*args), fwd, 1)
    checked.adjoint(*fwd, *bufs)
    _same(bufs, _fresh(k, args))
    src = k.adjoint_source(*args)
    assert "_kept(_keep_f64, max(0, t" in src or "_kept(_keep_f64, " in src


def test_only_allocations_made_once_are_kept():
    """A tape allocated in a loop body (each iteration its own) is not taken from kept
    memory; one allocated in the prologue or the straight-line body is."""
    loop = A.For("i", "range(n)", [A.Assign("_tape_i64", "np.empty((n,), np.int64)")])
    fn = A.Function("f_adjoint", ("n",), "doc",
                    prologue=[A.Assign("_tape_f64", "np.empty((1024,), np.float64)"),
                              A.Assign("_sp_f64", "0")],
                    body=[loop, A.Block("b", [A.Assign("_tape_f32",
                                                       "np.empty((n,), np.float32)")])])
    ns = {}
    assert keep_tapes(fn, ns) == ("f32", "f64")
    assert fn.params == ("n", "_keep_f32", "_keep_f64", "_keep_need")
    assert fn.prologue[0].value == "_kept(_keep_f64, max(1024, _keep_f64.shape[0]), " \
                                   "_keep_need, 1)"
    assert fn.body[1].body[0].value == "_kept(_keep_f32, n, _keep_need, 0)"
    assert loop.body[0].value == "np.empty((n,), np.int64)"
    assert "_kept" in ns


def test_growth_of_a_kept_tape_notes_its_size():
    fn = A.Function("f_adjoint", ("n",), "doc",
                    prologue=[A.Assign("_tape_f64", "np.empty((1024,), np.float64)"),
                              A.Assign("_sp_f64", "0")],
                    body=[A.While("True", [A.Reserve(None, {"f64": "2"})])])
    keep_tapes(fn, {})
    (grow,) = fn.body[0].body
    assert isinstance(grow, A.If) and grow.cond == "_sp_f64 + 2 > _tape_f64.shape[0]"
    assert [x.value for x in grow.then] == [
        "_reserve(_tape_f64, _sp_f64 + 2)", "max(_keep_need[0], _tape_f64.shape[0])"]


def test_user_arrays_untouched_by_pooled_calls():
    k = kadj.differentiate(two_tapes)
    args = _args_two(300, seed=5)
    before = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    bufs = _buffers(k.adjoint_plan(*args), args, 2)
    for _ in range(3):
        k.adjoint(*args, *[b.copy() for b in bufs])
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)


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
    tape_pool.set_limit(0)
    fresh = min(faults() for _ in range(3))
    assert fresh > pages // 2, (fresh, pages)
    assert kept < pages // 10, (kept, fresh, pages)
