"""Serial CPU adjoints lower element accesses, range loops and values without counted
references leanly (kadj.lean_lowering), and compute what numba's lowering computes."""
import math

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba.core import lowering
from numba.core.codegen import JITCodeLibrary
from numba.core.runtime import rtsys

import kadj
from kadj import lean_lowering
from kadj.kept_helpers import _kept_array
from kadj.lean_lowering import LeanLower
from kadj.ssa_free import AdjointCompiler, WithSSA
from kadj.tape_measure import adjoint_buffers

from kernels.cpu import by_name

from fdcheck import fd_check
# (_changes_type: typed only with SSA reconstruction)
from test_lean_library import _changes_type, nrt_stats


def _lean(fn, **options):
    return numba.njit(pipeline_class=AdjointCompiler, **options)(fn)


def _numbas(fn, **options):
    return numba.njit(**options)(fn)


def _pass_names(dispatcher):
    (cres,) = dispatcher.overloads.values()
    return [name.split("_", 1)[1] for times in cres.metadata["pipeline_times"].values()
            for name in times]


# ---- the pass in both pipelines --------------------------------------------------------
def _sum(x, n):
    s = 0.0
    for i in range(n):
        s += x[i]
    return s


def test_both_pipelines_lower_with_lean_lowering():
    f = _lean(_sum)
    assert f(np.arange(4.0), 3) == 3.0
    assert "kadj_native_lowering" in _pass_names(f)
    assert "native_lowering" not in _pass_names(f)
    g = _lean(_changes_type)                 # typed only with SSA: the fallback
    assert g(2) == 3.0
    assert "kadj_native_lowering" in _pass_names(g)
    h = numba.njit(pipeline_class=WithSSA)(_sum)
    assert h(np.arange(4.0), 4) == 6.0
    assert "kadj_native_lowering" in _pass_names(h)


def test_a_statement_that_fails_to_lower_gets_numbas_error(monkeypatch):
    """Without numba's error context around every statement, a statement whose lowering
    raises one of numba's errors still gets numba's context (the statement, its line)
    added, as numba's lowering adds it; another exception passes through, as in numba;
    the location numba's implementations read is the statement's."""
    from numba.core import errors
    seen = []

    def failing(original, kind, text):
        def lower_inst(self, inst):
            seen.append(errors.loc_info.get("loc"))
            if "inplace_binop" in str(inst):
                raise kind(text)
            return original(self, inst)
        return lower_inst
    for kind, text in ((errors.NumbaError, "no lowering for this one"),
                       (ValueError, "nor this one")):
        texts = []
        for cls, compile_ in ((LeanLower, _lean), (lowering.Lower, _numbas)):
            monkeypatch.setattr(cls, "lower_inst", failing(cls.lower_inst, kind, text))
            with pytest.raises(kind) as info:
                compile_(_sum)(np.arange(4.0), 3)
            monkeypatch.undo()
            texts.append(str(info.value))
        assert texts[0] == texts[1].replace("Pass native_lowering",
                                            "Pass kadj_native_lowering"), texts
        if kind is errors.NumbaError:
            line = _sum.__code__.co_firstlineno + 3           # s += x[i]
            assert "During: lowering" in texts[0] and \
                f"test_lean_lowering.py ({line})" in texts[0], texts[0]
        else:
            assert texts[0] == "nor this one"
    assert seen and all(loc is not None and loc.filename == __file__ for loc in seen)


def test_switched_off_lowers_with_numbas_class(monkeypatch):
    seen = []
    original = lowering.Lower.lower

    def spy(self):
        seen.append(type(self))
        return original(self)

    monkeypatch.setattr(lowering.Lower, "lower", spy)
    _lean(_sum)(np.ones(3), 3)
    monkeypatch.setenv("KADJ_LEAN_LOWERING", "0")
    _lean(_sum)(np.ones(3), 3)
    assert seen == [LeanLower, lowering.Lower]
    assert not lean_lowering.enabled()


# ---- what is lowered: the same results as numba's lowering ---------------------------
def _elements(a, b, c, i, j):
    out = 0.0
    out += a[i] + a[-1] + a[i - a.shape[0]]          # wraparound of negative indices
    b[i, j] = b[j, i] * 2.0 + c[i, j, 1]
    c[-1, -2, 0] = a[j]
    return out


def _ints_and_bools(m, k, flags, i):
    m[i] = m[i] + np.int64(7)
    k[np.int32(i)] = k[np.uint64(i)] * 3             # index types other than intp
    if flags[i]:
        flags[i + 1] = not flags[i + 1]
    return m[i] + k[i]


def _stores_cast(x32, i, v):
    x32[i] = v                # a float64 stored into float32 elements
    x32[i + 1] = 3            # an integer stored into float elements
    return x32[i]


def _views(a):
    s = 0.0
    v = a[::2]                # a strided view ('A' layout)
    t = a.T                   # Fortran order
    for i in range(v.shape[0]):
        s += v[i, 1] * t[1, i]
        v[i, 0] = s
    return s


def _loops(n, m, s):
    total = 0
    for i in range(n):
        total += i
    for i in range(n, m):
        total += 2 * i
    for i in range(m, n, -1):
        total += 3 * i
    for i in range(n, m, s):
        total = total * 7 + i
        if i > 40:
            break
        if i % 3 == 0:
            continue
        total += 1
    for i in range(0):
        total += 1000
    for j, v in enumerate(range(n, m)):
        total += j * v
    k = 0
    for k in range(n):
        pass
    return total + k


def _narrow_loops(n32, u64):
    total = 0
    for i in range(n32):
        total += i
    for i in range(u64):
        total += i
    return total


def _copy_all(a, b):
    for i in range(a.shape[0]):
        b[i] = a[i]


def _case_args():
    rng = np.random.default_rng(0)
    return [
        (_elements, lambda: (rng.random(5), rng.random((5, 5)), rng.random((5, 5, 2)), 3, 1)),
        (_ints_and_bools, lambda: (np.arange(6), np.arange(6, dtype=np.int32),
                                   np.array([True, False, True, True, False, True]), 2)),
        (_stores_cast, lambda: (np.zeros(4, np.float32), 1, 1.0 / 3.0)),
        (_views, lambda: (rng.random((8, 4)),)),
        (_loops, lambda: (3, 17, 4)),
        (_loops, lambda: (17, 3, -2)),
        (_loops, lambda: (5, 5, 1)),
        (_narrow_loops, lambda: (np.int32(7), np.uint64(5))),
    ]


def _same(got, want):
    for g, w in zip(got, want):
        if isinstance(w, np.ndarray):
            np.testing.assert_array_equal(g, w)
        else:
            assert g == w and type(g) is type(w)


@pytest.mark.parametrize("case", range(8))
def test_lowers_what_numba_lowers(case):
    fn, make = _case_args()[case]
    args_a, args_b = make(), None
    args_b = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args_a)
    got = _lean(fn)(*args_a)
    want = _numbas(fn)(*args_b)
    _same([got, *args_a], [want, *args_b])


def test_readonly_arrays_read():
    a = np.arange(5.0)
    a.setflags(write=False)
    assert _lean(_sum)(a, 5) == 10.0


def test_bounds_checked_where_numba_checks_them():
    f = _lean(_copy_all, boundscheck=True)
    with pytest.raises(IndexError):
        f(np.ones(5), np.zeros(3))
    with pytest.raises(IndexError):
        _lean(_elements, boundscheck=True)(np.ones(5), np.ones((5, 5)), np.ones((5, 5, 2)),
                                           7, 1)
    b = np.zeros(5)
    f(np.ones(5), b)
    assert b.tolist() == [1.0] * 5


def _stepped(a, b, s):
    total = 0
    for i in range(a, b, s):
        total = total * 3 + i + 1
    return total


def test_zero_step_raises_as_in_numba():
    with pytest.raises(ValueError, match="range\\(\\) arg 3 must not be zero"):
        _lean(_stepped)(0, 5, 0)


_stepped_lean = _lean(_stepped)


@settings(max_examples=200, deadline=None)
@given(a=st.integers(-50, 50), b=st.integers(-50, 50),
       s=st.integers(-7, 7).filter(lambda s: s != 0))
def test_range_loops_visit_pythons_values(a, b, s):
    want = 0
    for i in range(a, b, s):
        want = want * 3 + i + 1
    want = (want + 2 ** 63) % 2 ** 64 - 2 ** 63       # int64 wraparound, as compiled
    assert _stepped_lean(a, b, s) == want


def test_range_at_the_int64_limits():
    big = 2 ** 63 - 1
    f, g = _lean(_stepped), _numbas(_stepped)
    for a, b, s in [(big - 3, big, 1), (-big - 1, -big + 2, 1), (-big - 1, big, 1),
                    (big, -big - 1, 1), (big, big - 5, -2),
                    (-big - 1, big, big), (big, -big - 1, -big)]:
        assert f(a, b, s) == g(a, b, s)


# ---- less LLVM IR --------------------------------------------------------------------
def _lowered_text(monkeypatch, fn, args, name):
    """The LLVM IR numba lowered for ``fn`` (the module with its body), as text."""
    texts = []
    original = JITCodeLibrary.add_ir_module

    def spy(self, ir_module):
        text = str(ir_module)
        if name in text:
            texts.append(text)
        return original(self, ir_module)

    monkeypatch.setattr(JITCodeLibrary, "add_ir_module", spy)
    fn(*args)
    return texts[0]


def _function_body(text, name):
    start = next(i for i, line in enumerate(text.splitlines())
                 if line.startswith("define") and name in line and "cpython" not in line)
    lines = text.splitlines()[start:]
    return lines[:lines.index("}")]


def _stencil(u, out):
    for i in range(1, u.shape[0] - 1):
        out[i] = u[i - 1] - 2.0 * u[i] + u[i + 1]


def test_fewer_instructions_and_no_stack_copies(monkeypatch):
    args = (np.ones(8), np.zeros(8))
    lean_text = _lowered_text(monkeypatch, _lean(_stencil), args, "_stencil")
    monkeypatch.setenv("KADJ_LEAN_LOWERING", "0")
    plain_text = _lowered_text(monkeypatch, _lean(_stencil), args, "_stencil")
    lean = _function_body(lean_text, "_stencil")
    plain = _function_body(plain_text, "_stencil")
    def array_slots(body):
        return len([ln for ln in body if "alloca {i8*, i8*, i64, i64, double*" in ln])

    # numba: a stack copy of the array for each of the four element accesses
    assert array_slots(plain) == array_slots(lean) + 4
    # the check of a zero step, left out where the step is a constant (here 1)
    assert "must not be zero" in plain_text and "must not be zero" not in lean_text
    # a unit step's trip count by a select, no division (numba: branches, a division)
    assert any(" sdiv " in ln for ln in plain) and not any(" sdiv " in ln for ln in lean)
    assert len(lean) < 0.6 * len(plain), (len(lean), len(plain))


# ---- adjoints ------------------------------------------------------------------------
def test_adjoint_lowered_lean_and_gradient_against_finite_differences(monkeypatch):
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")
    ex = by_name("kepler_solve")
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    args = tuple(ex.make_args(np.random.default_rng(3)))
    comp = k.compiled(*args)
    k.adjoint(*args, *adjoint_buffers(comp.plan, args, fill=0.0))
    assert "kadj_native_lowering" in _pass_names(comp.function)
    fd_check(k, args)


def test_adjoint_same_both_ways(monkeypatch, tmp_path):
    """An adjoint with tapes, replays and range loops of every step: the same
    gradients lowered either way (no sum LLVM may reassociate in this one)."""
    monkeypatch.delenv("KADJ_DISABLE_CACHE", raising=False)
    seen = []
    original = lowering.Lower.lower

    def spy(self):
        if "adjoint" in self.fndesc.qualname:
            seen.append(type(self))
        return original(self)

    monkeypatch.setattr(lowering.Lower, "lower", spy)
    ex = by_name("thomas_batched")
    args = tuple(ex.make_args(np.random.default_rng(4)))
    outs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("KADJ_LEAN_LOWERING", flag)
        monkeypatch.setenv("KADJ_CACHE_DIR", str(tmp_path / flag))   # compiled afresh
        k = kadj.differentiate(numba.njit(ex.kernel.py_func), wrt=ex.wrt)
        fwd = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        bufs = adjoint_buffers(k.adjoint_plan(*fwd), fwd, fill=0.5)
        k.adjoint(*fwd, *bufs)
        assert "_sum_add" not in k.adjoint_source(*args)
        outs.append([np.asarray(b).copy() for b in bufs])
    assert seen == [LeanLower, lowering.Lower]
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)
        assert not math.isnan(float(np.sum(a)))


# ---- reference counts ----------------------------------------------------------------
def _allocates(n, keep, need):
    a = np.empty(n)
    b = a[1:]
    pair = (a, b)
    for i in range(n):
        a[i] = i
    c = np.zeros(n) if n > 2 else a
    d = _kept_array(keep, n, np.float64, need, 1)       # a view of keep, or new memory
    d[0] = 1.0
    e = d
    for i in range(2):
        e = pair[i]
    return pair[1].sum() + c[0] + d[0] + e[0]


def test_every_allocation_released(monkeypatch):
    """Arrays, views, tuples of arrays, arrays reassigned in loops, kept memory and its
    fallback: as many releases as allocations, lowered either way."""
    keep = np.empty(64, np.uint8)
    with nrt_stats():
        _every_allocation_released(monkeypatch, keep)


def _every_allocation_released(monkeypatch, keep):
    for flag in ("1", "0"):
        monkeypatch.setenv("KADJ_LEAN_LOWERING", flag)
        f = _lean(_allocates)
        for n, need in ((5, np.zeros(4, np.int64)), (50, np.array([0, 0, 0, 64]))):
            f(n, keep, need)            # (compiled)
            before = rtsys.get_allocation_stats()
            for _ in range(3):
                assert f(n, keep, need) == _allocates(n, keep, need)
            after = rtsys.get_allocation_stats()
            assert after.alloc - before.alloc == after.free - before.free > 0
            assert after.mi_alloc - before.mi_alloc == after.mi_free - before.mi_free


def test_wrappers_count_arrays_by_their_meminfo(monkeypatch):
    """An adjoint's Python wrapper releases an array argument through its meminfo
    alone; a function numba compiles for anything else keeps numba's code."""
    args = (np.ones(8), np.zeros(8))
    lean = _lowered_text(monkeypatch, _lean(_stencil), args, "cpython")
    plain = _lowered_text(monkeypatch, _numbas(_stencil), args, "cpython")
    # each array argument's fields are read once to pass them to the function; numba
    # reads them all again for each release (on the error path and after the call)
    assert "NRT_decref" in lean
    assert plain.count("extracted.parent") >= 2 * lean.count("extracted.parent") > 0
    assert not getattr(lean_lowering._lowering, "lean", False)
