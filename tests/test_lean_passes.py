"""numba passes skipped where the IR shows they have nothing to do (kadj/lean_passes.py):
what each finds to do, and functions that need each pass compiled by the adjoints'
pipeline (kadj.ssa_free.AdjointCompiler) giving what Python gives; a long kernel's
gradient against finite differences."""
import functools

import numba
import numpy as np
import pytest
from numba import literal_unroll
from numba.core.compiler import run_frontend

import kadj
from kadj.lean_passes import closure_work, lifetimes_read, rewrite_work
from kadj.ssa_free import AdjointCompiler
from kadj.testing import check_grad
from kernels.long_kernels import limiter_kernel

from test_corpus import while_continue


def _closure(x):
    def f(v):
        return v * 2.0
    return f(x) + 1.0


def _comprehension(n):
    return np.array([i * 0.5 for i in range(n)]).sum()


def _reduced(n):
    return functools.reduce(lambda a, b: a + b, range(n))


def _array_expression(a, b, c):
    return (a + b * c).sum()


def _ufunc_on_arrays(a):
    return np.exp(a).sum()


def _constant_array(k):
    return np.array([1.0, 2.0, 3.0])[k]


def _element_loop(a, out):
    n = a.shape[0]
    t = a.shape
    for i in range(1, n - 1):
        out[i] = a[i - 1] - 2.0 * a[i] + a[i + 1] + t[0]


@pytest.mark.parametrize("fn, needs", [(_closure, True), (_comprehension, True),
                                       (_reduced, True), (_element_loop, False),
                                       (_array_expression, False)])
def test_what_closure_inlining_finds_to_do(fn, needs):
    assert closure_work(run_frontend(fn)) is needs


@pytest.mark.parametrize("fn, args, needs", [
    (_array_expression, (np.ones(3), np.ones(3), np.ones(3)), True),
    (_ufunc_on_arrays, (np.ones(3),), True),
    (_element_loop, (np.ones(5), np.zeros(5)), False),
])
def test_what_the_typed_rewrites_find_to_do(fn, args, needs, monkeypatch):
    from kadj import lean_passes
    seen = []
    real = lean_passes.rewrite_work
    monkeypatch.setattr(lean_passes, "rewrite_work",
                        lambda *a: seen.append(real(*a)) or seen[-1])
    numba.njit(pipeline_class=AdjointCompiler)(fn)(*args)
    assert seen == [needs]


@pytest.mark.parametrize("fn, args", [
    (_closure, (1.5,)), (_comprehension, (7,)),
    (_array_expression, (np.arange(4.0), np.arange(4.0) + 1, np.arange(4.0) - 2)),
    (_ufunc_on_arrays, (np.linspace(0, 1, 5),)), (_constant_array, (1,)),
])
def test_functions_that_need_the_passes_compile_right_in_the_adjoint_pipeline(fn, args):
    got = numba.njit(pipeline_class=AdjointCompiler)(fn)(*args)
    assert got == pytest.approx(fn(*args), rel=1e-12)


def test_an_element_loop_compiles_without_them():
    f = numba.njit(pipeline_class=AdjointCompiler)(_element_loop)
    a, out = np.arange(6.0) ** 2, np.zeros(6)
    f(a, out)
    want = np.zeros(6)
    _element_loop(a, want)
    assert np.array_equal(out, want)
    (cres,) = f.overloads.values()
    times = cres.metadata["pipeline_times"]["kadj_ssa_free"]
    assert any("kadj_inline_closure_likes" in name for name in times)
    assert any("kadj_strip_phis" in name for name in times)
    assert any("kadj_ir_processing" in name for name in times)
    assert any("kadj_generic_rewrites" in name for name in times)


def _unrolled(t):
    s = 0.0
    for v in literal_unroll(t):
        s += v
    return s


def _generator(n):
    for i in range(n):
        yield i


def _static_rewrites(a, k):
    """numba's rewrites before typing all apply: constant indices of a tuple and an
    array, a constant power, a constant raise, a print of constants."""
    t = a.shape
    if k < 0:
        raise ValueError("k must be at least 0")
    s = a[0] + t[0] ** 2
    print("static", 1)
    return s + a[k] ** 3


@pytest.mark.parametrize("fn, needs", [(_unrolled, True), (_generator, True),
                                       (_element_loop, False), (_static_rewrites, False)])
def test_what_reads_the_variables_lifetimes(fn, needs):
    assert lifetimes_read(run_frontend(fn)) is needs


@pytest.mark.parametrize("fn, args", [
    (_unrolled, ((1.0, 2, 3.5),)), (_static_rewrites, (np.arange(3.0) + 1, 2)),
    # a loop with a continue: two back edges, the graph made canonical
    (while_continue.py_func, (np.array([1.0, -2.0, 3.0, -4.0, 5.0]),)),
])
def test_functions_the_rewrites_and_graph_change_compile_right(fn, args, capsys):
    got = numba.njit(pipeline_class=AdjointCompiler)(fn)(*args)
    assert got == pytest.approx(fn(*args), rel=1e-12)


def test_a_constant_raise_still_raises():
    f = numba.njit(pipeline_class=AdjointCompiler)(_static_rewrites)
    with pytest.raises(ValueError, match="k must be at least 0"):
        f(np.arange(3.0), -1)


def test_a_long_kernel_has_the_right_gradient(tmp_path):
    k = kadj.differentiate(limiter_kernel(12, tmp_path))
    rng = np.random.default_rng(0)
    # values apart enough that no limiter branch flips within the finite differences
    u = np.cumsum(rng.uniform(0.2, 1.0, 30)) * np.where(np.arange(30) % 7 < 4, 1.0, -1.0)
    check_grad(k, (u, np.zeros(30), 0.3))


def test_the_frontend_types_kernels_with_the_lean_passes():
    """kadj's frontend (the forward's typed IR) runs numba's untyped pipeline with the
    passes above in place of numba's, and KadjWithBlocks in place of with-lifting."""
    from numba.core import untyped_passes as up
    from numba.core.compiler import Flags, StateDict

    from kadj import frontend, lean_passes

    state = StateDict()
    state.func_ir, state.flags = None, Flags()
    classes = [cls for cls, _ in frontend._untyped_pipeline(state).passes]
    for numbas in (up.IRProcessing, up.GenericRewrites, up.InlineClosureLikes,
                   up.WithLifting):
        assert numbas not in classes
    for lean in (lean_passes.LeanIRProcessing, lean_passes.LeanGenericRewrites,
                 lean_passes.LeanInlineClosureLikes, frontend.KadjWithBlocks):
        assert lean in classes


def _with_and_dicts(x):
    d = {"a": 1.0, "b": 2.0}
    d2 = {1: x, 2: x * 2.0, **{3: x}}
    with numba.objmode(y="float64"):
        y = float(x) + 1.0
    return d["a"] + d2[2] + y


def _plain_loop(x, y):
    s = 0.0
    for i in range(x.shape[0]):
        y[i] = x[i] * 2.0
        s += y[i]
    return s


@pytest.mark.parametrize("fn", [_with_and_dicts, _plain_loop, while_continue.py_func])
def test_lean_interpreter_gives_numbas_ir(fn):
    """The bytecode's IR with the peephole rewrites that find nothing skipped is
    numba's IR, statement for statement: a with block's __exit__ and dict literals
    (which the rewrites act on) and a plain loop (where they are skipped)."""
    from numba.core import bytecode, interpreter
    from kadj.lean_passes import _LeanInterpreter, _names_with_exit

    def ir_of(cls):
        func_id = bytecode.FunctionIdentity.from_function(fn)
        return cls(func_id).interpret(bytecode.ByteCode(func_id))
    ours, numbas = ir_of(_LeanInterpreter), ir_of(interpreter.Interpreter)
    assert ours.dump_to_string() == numbas.dump_to_string()
    assert _names_with_exit(ours) == (fn is _with_and_dicts)

    class Bare(interpreter.Interpreter):     # both rewrites skipped whatever the IR
        def post_process(self, peepholes, func_ir):
            return super().post_process(
                [p for p in peepholes if p not in (
                    interpreter.peep_hole_delete_with_exit,
                    interpreter.peep_hole_fuse_dict_add_updates)], func_ir)
    # (where they act, skipping them would change the IR)
    assert (ir_of(Bare).dump_to_string() != numbas.dump_to_string()) == \
        (fn is _with_and_dicts)
