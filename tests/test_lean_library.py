"""Serial CPU adjoints' LLVM module is optimised once, at O3 (kadj.lean_library), and
computes what numba's three rounds of optimisation compute."""
import contextlib
import re

import numba
import numpy as np
import pytest
from numba.core import config
from numba.core.codegen import JITCodeLibrary
from numba.core.runtime import _nrt_python as _nrt
from numba.core.runtime import rtsys

import kadj
from kadj.lean_library import LeanCodeLibrary
from kadj.ssa_free import AdjointCompiler
from kadj.tape_measure import adjoint_buffers

from kernels.cpu import GALLERY, by_name

from fdcheck import fd_check


@pytest.fixture(autouse=True)
def _compiled_here(monkeypatch):
    """Adjoints compiled in this process (a cached one has no LLVM passes to show)."""
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")


def _cres(dispatcher):
    (cres,) = dispatcher.overloads.values()
    return cres


def _compiled(ex, rng=0):
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    args = tuple(ex.make_args(np.random.default_rng(rng)))
    comp = k.compiled(*args)
    plan = comp.plan
    k.adjoint(*args, *adjoint_buffers(plan, args, fill=0.0))
    return k, comp, args


def _rejit(comp, **extra):
    """The compiled adjoint's source jitted afresh with its options (numba's own
    pipeline unless ``extra`` names another)."""
    options = {o: v for o, v in comp.function.targetoptions.items() if o != "nopython"}
    return numba.njit(**options, **extra)(comp.function.py_func)


def _pass_names(cres):
    return [rec.name for rec in cres.metadata["llvm_pass_timings"]]


def test_an_adjoint_is_optimised_once_over_its_module(monkeypatch):
    monkeypatch.setattr(config, "LLVM_PASS_TIMINGS", 1)
    _, comp, _ = _compiled(by_name("horner"))
    cres = _cres(comp.function)
    assert type(cres.library) is LeanCodeLibrary
    names = _pass_names(cres)
    # the full O3 pipeline over the module; no per-function round, no cheap round
    assert names == ["Module passes (full optimization)", "Finalize object"], names


def test_numba_rounds_when_switched_off(monkeypatch):
    monkeypatch.setattr(config, "LLVM_PASS_TIMINGS", 1)
    monkeypatch.setenv("KADJ_LEAN_LLVM", "0")
    _, comp, _ = _compiled(by_name("horner"))
    cres = _cres(comp.function)
    assert type(cres.library) is JITCodeLibrary
    names = _pass_names(cres)
    assert any(n.startswith("Function passes on") for n in names), names
    assert "Module passes (cheap optimization for refprune)" in names


def _changes_type(n):
    t = 1 << 60
    a = 0
    if n > 0:
        a = (t + 1) - t
        t = n * 1.5
    return a * t


def test_the_ssa_fallback_is_optimised_once_too():
    f = numba.njit(pipeline_class=AdjointCompiler)(_changes_type)
    assert f(2) == 3.0
    cres = _cres(f)
    assert list(cres.metadata["pipeline_times"]) == ["nopython"]
    assert type(cres.library) is LeanCodeLibrary


def test_parallel_adjoints_keep_numbas_library():
    _, comp, _ = _compiled(by_name("diffusion_1d_parallel"))
    assert comp.function.targetoptions.get("parallel")
    assert type(_cres(comp.function).library) is JITCodeLibrary


def _run(fn, comp, args, plan):
    fwd = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    bufs = adjoint_buffers(plan, fwd, fill=0.5)
    extra = (0.7,) if plan.returns_value else ()
    ret = fn(*fwd, *bufs, *extra, *comp.fresh_memory())
    return fwd + list(bufs), ret


def _same_as_numbas(ex, monkeypatch):
    """The adjoint's buffers and return value compiled by kadj's pipeline equal those
    of the same source compiled by numba's own (SSA reconstruction, numba's three
    rounds of LLVM optimisation): bit for bit, but
    for the sums LLVM may reassociate (``_sum_add``), which another pass order may add
    in another order (to within 1e-12 of the largest magnitude then)."""
    _, comp, args = _compiled(ex, rng=1)
    if comp.function.targetoptions.get("parallel"):
        pytest.skip("a parallel adjoint compiles with numba's own pipeline and library")
    assert type(_cres(comp.function).library) is LeanCodeLibrary
    monkeypatch.setenv("KADJ_LEAN_LLVM", "0")
    # (numba's own pipeline: SSA reconstruction and numba's three rounds)
    numbas = _rejit(comp)
    lean_out, lean_ret = _run(comp.function, comp, args, comp.plan)
    ref_out, ref_ret = _run(numbas, comp, args, comp.plan)
    assert type(_cres(numbas).library) is JITCodeLibrary
    exact = "_sum_add" not in comp.source
    for a, b in zip(lean_out + [lean_ret], ref_out + [ref_ret]):
        if a is None:
            assert b is None
            continue
        a, b = np.asarray(a), np.asarray(b)
        if exact:
            np.testing.assert_array_equal(a, b, err_msg=ex.name)
        else:
            scale = max(1.0, float(np.max(np.abs(b))) if b.size else 1.0)
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-12 * scale, err_msg=ex.name)


@pytest.mark.parametrize("name", ["heat_step", "horner", "rk4_pendulum", "thomas_batched",
                                  "softmax_f32", "fixed_point_cos", "csr_spmv"])
def test_adjoint_computes_what_numbas_rounds_compute(name, monkeypatch):
    _same_as_numbas(by_name(name), monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("ex", GALLERY, ids=[ex.name for ex in GALLERY])
def test_gallery_adjoint_computes_what_numbas_rounds_compute(ex, monkeypatch):
    _same_as_numbas(ex, monkeypatch)


def test_gradient_against_finite_differences():
    ex = by_name("rk4_pendulum")
    k, comp, args = _compiled(ex)
    assert type(_cres(comp.function).library) is LeanCodeLibrary
    fd_check(k, args)


def test_reference_count_pruning_outside_llvm(monkeypatch):
    """With numba's pruning pass outside LLVM (``NUMBA_LLVM_REFPRUNE_PASS=0``) the
    library prunes as numba does, and the adjoint computes the same."""
    ex = by_name("softmax")
    _, comp, args = _compiled(ex, rng=2)
    want, want_ret = _run(comp.function, comp, args, comp.plan)
    monkeypatch.setattr(config, "LLVM_REFPRUNE_PASS", 0)
    again = _rejit(comp, pipeline_class=AdjointCompiler)
    got, got_ret = _run(again, comp, args, comp.plan)
    assert type(_cres(again).library) is LeanCodeLibrary
    for a, b in zip(got + [got_ret], want + [want_ret]):
        if a is not None:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _attribute_groups(ll):
    """{group number: attribute text} of an LLVM module's text."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^attributes #(\d+) = \{ (.*) \}$",
                                                       ll, re.M)}


def _function_attributes(ll, name_part):
    """The attributes (group texts and inline ones) of the one function defined in
    ``ll`` whose name contains ``name_part``."""
    groups = _attribute_groups(ll)
    (line,) = [ln for ln in ll.splitlines() if ln.startswith("define") and name_part in ln]
    return " ".join(groups.get(g, "") for g in re.findall(r"#(\d+)", line))


def test_the_python_wrapper_is_compiled_without_optimisation():
    """The adjoint's Python wrapper (arguments unboxed once per call) is ``optnone``;
    the adjoint's own function is optimised; the gradient is right."""
    ex = by_name("linear_recurrence")
    k, comp, args = _compiled(ex)
    (ll,) = comp.function.inspect_llvm().values()
    wrapper = _function_attributes(ll, "_ZN7cpython")
    assert "optnone" in wrapper.split() and "noinline" in wrapper.split(), wrapper
    (body,) = [ln for ln in ll.splitlines() if ln.startswith("define")
               and "_adjoint" in ln and "cpython" not in ln]
    assert "optnone" not in _function_attributes(ll, body.split("@")[1].split("(")[0])
    fd_check(k, args)


def test_the_wrapper_is_optimised_when_switched_off(monkeypatch):
    monkeypatch.setenv("KADJ_LEAN_WRAPPER", "0")
    _, comp, _ = _compiled(by_name("linear_recurrence"))
    (ll,) = comp.function.inspect_llvm().values()
    assert "optnone" not in _function_attributes(ll, "_ZN7cpython").split()


@contextlib.contextmanager
def nrt_stats():
    """numba's allocation counts enabled within the block (as they were after it)."""
    was_on = _nrt.memsys_stats_enabled()
    _nrt.memsys_enable_stats()
    try:
        yield rtsys
    finally:
        if not was_on:
            _nrt.memsys_disable_stats()


def test_the_unoptimised_wrapper_releases_what_it_unboxes():
    """numba's memory records balance over repeated calls through the wrapper (every
    array it unboxes released again), and the arguments are left as they were."""
    _, comp, args = _compiled(by_name("softmax"))
    with nrt_stats():
        _run(comp.function, comp, args, comp.plan)
        before = rtsys.get_allocation_stats()
        for _ in range(50):
            out, _ret = _run(comp.function, comp, args, comp.plan)
        after = rtsys.get_allocation_stats()
    assert after.mi_alloc - before.mi_alloc == after.mi_free - before.mi_free > 0
    assert after.alloc - before.alloc == after.free - before.free
    for a, b in zip(out, args):
        if isinstance(b, np.ndarray):
            np.testing.assert_array_equal(a, b)
