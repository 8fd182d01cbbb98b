"""The declaration nodes of the adjoint IR and their CPU and CUDA lowerings.

The reverse pass leaves what only a target can spell as declaration nodes (tapes,
scratch arrays, local sums, the scalar arguments' final additions); each target's
table (kadj.lowering.HOST, kadj.cuda.lower.DECLARATIONS) lowers them.  These tests
assert on the nodes as built, then on what each target makes of them.
"""
import inspect
import math
import pkgutil
import re

import numpy as np
import pytest
from numba import cuda, float64, njit

import kadj
from kadj import adj_ir as A
from kadj import lowering, pipeline, reverse
from kadj.printer import render
from kadj.targets import CPU, CUDA
from kadj.tape_plan import bounded_tape


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")


def stages(target, kernel, *args, **options):
    types = tuple(target.typeof(kernel, a) for a in args)
    out = pipeline.stages(target, kernel, types, options=options or None, until="facts")
    plan = out["plan"]
    slot_names = tuple(plan.arg_names[i] for i in plan.adjoint_args)
    return out["prepared"], out["facts"], slot_names


def nodes(fn, cls):
    return [x for x in A.walk([fn]) if isinstance(x, cls)]


def undeclared(fn):
    return [x for x in A.walk([fn]) if isinstance(x, A.DECLARATIONS)]


@njit
def damped(x, alpha, out):
    s = 0.0
    for i in range(x.shape[0]):
        s = math.sin(s) * alpha + x[i]
    out[0] = s


def test_cpu_declarations_before_and_after_lowering():
    x = np.linspace(0.1, 0.9, 5)
    prepared, facts, slots = stages(CPU, damped, x, 0.7, np.zeros(1))
    fn, w = reverse.build_adjoint(prepared.kernel, facts, slots, False, lowered=False)
    # as built: a growable f64 tape allocated at the loop's reservation, its first use
    # (kadj/tape_alloc.py): the prologue only sets its pointer; alpha's final addition
    assert not nodes(fn, A.TapeDecl)
    assert (fn.prologue[0].target, fn.prologue[0].value) == ("_sp_f64", "0")
    assert [(a.target, a.value) for a in lowering.heap_tape(
        None, A.TapeDecl("f64", "growable", lowering.GROWABLE_START))] == [
        ("_tape_f64", "np.empty((1024,), np.float64)"), ("_sp_f64", "0")]
    (finish,) = nodes(fn, A.FinishScalar)
    assert finish.names == ("alpha",)
    assert fn.body[-2] is finish and isinstance(fn.body[-1], A.Return)
    assert not nodes(fn, A.LocalArray)       # no checkpoints asked
    lowering.lower_declarations(fn, w, w.ctx.declarations)
    assert not undeclared(fn)
    src = render(fn, w.syntax)
    assert "    _sp_f64 = 0\n" in src and "_reserve" not in src
    assert re.search(r"\n    _tape_f64 = np\.empty\(\(2 \* max\(0, \w+\),\), "
                     r"np\.float64\)\n", src), src
    assert "adj_alpha_buf[0] += adj_alpha\n    return None\n" in src
    assert "cuda" not in src


def test_cpu_checkpoint_slots_are_local_arrays_lowered_to_heap_arrays():
    x = np.linspace(0.1, 0.9, 6)
    prepared, facts, slots = stages(CPU, damped, x, 0.7, np.zeros(1), checkpoints=4)
    fn, w = reverse.build_adjoint(prepared.kernel, facts, slots, False, slots=4,
                                  lowered=False)
    arrays = nodes(fn, A.LocalArray)
    assert arrays and all(a.space == "local" and a.size == 4 for a in arrays)
    assert {str(a.dtype) for a in arrays} == {"int64", "float64"}  # iteration, s
    assert all(a in fn.prologue for a in arrays)
    names = [a.name for a in arrays]
    lowering.lower_declarations(fn, w, w.ctx.declarations)
    src = render(fn, w.syntax)
    for a in arrays:
        assert f"{a.name} = np.empty(4, np.{a.dtype})" in src
    assert all(src.count(n) > 1 for n in names)      # declared, then used
    # the lowered adjoint's gradient: central differences in float64
    k = kadj.differentiate(damped, checkpoints=4)
    adj_x, adj_alpha = np.zeros_like(x), np.zeros(1)
    k.adjoint(x, 0.7, np.zeros(1), adj_x, adj_alpha, np.ones(1))
    h = 1e-6
    for j in range(x.shape[0]):
        e = np.zeros_like(x)
        e[j] = h
        hi, lo = np.zeros(1), np.zeros(1)
        damped(x + e, 0.7, hi)
        damped(x - e, 0.7, lo)
        assert adj_x[j] == pytest.approx((hi[0] - lo[0]) / (2 * h), rel=1e-6, abs=1e-9)
    hi, lo = np.zeros(1), np.zeros(1)
    damped(x, 0.7 + h, hi)
    damped(x, 0.7 - h, lo)
    assert adj_alpha[0] == pytest.approx((hi[0] - lo[0]) / (2 * h), rel=1e-6)


@cuda.jit
def logistic(y0, r, y_out, capacity, dt, nsteps):
    i = cuda.grid(1)
    if i < y0.shape[0]:
        y = y0[i]
        for step in range(nsteps):
            y = y + dt * r[i] * y * (1.0 - y / capacity)
        y_out[i] = y


def _logistic_args():
    return [np.full(16, 0.3), np.ones(16), np.zeros(16), 2.0, 0.1, 5]


def test_cuda_bounded_tape_slots_and_block_sum():
    from kadj.cuda.writer import build_cuda_adjoint
    prepared, facts, slots = stages(CUDA, logistic, *_logistic_args())
    cells = prepared.extra["cells"]
    fn, w = build_cuda_adjoint(prepared.kernel, facts, slots, slots=6, cells=cells,
                               lowered=False)
    tapes = nodes(fn, A.TapeDecl)
    assert tapes and all(t.policy == "bounded" for t in tapes)
    sizes = bounded_tape([fn], "logistic")
    assert {t.kind: t.size for t in tapes} == {k: sizes.get(k, 1) for k in w.tapes}
    assert w.tape_size == sizes
    arrays = nodes(fn, A.LocalArray)
    assert arrays and all(a.space == "local" and a.size == 6 for a in arrays)
    (finish,) = nodes(fn, A.FinishScalar)
    assert set(finish.names) == {"capacity", "dt"}
    lowering.lower_declarations(fn, w, w.ctx.declarations)
    assert not undeclared(fn)
    src = render(fn, w.syntax)
    for t in tapes:
        assert f"_tape_{t.kind} = cuda.local.array({t.size}, " in src
    for a in arrays:
        assert f"{a.name} = cuda.local.array(6, " in src
    assert "np.empty" not in src
    # the block sums (warp shuffles, one atomic per block: kadj.cuda.block_sum)
    assert "_block_add_f64(adj_dt_buf, 0, " in src
    assert "_block_add_f64(adj_capacity_buf, 0, " in src
    assert "adj_dt_buf[0] +=" not in src
    assert w.state.scalar_report.keys() == {"capacity", "dt"}


@cuda.jit
def tile_sum(x, out):
    sm = cuda.shared.array(16, float64)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    sm[t] = x[i] * x[i]
    cuda.syncthreads()
    if t == 0:
        s = 0.0
        for k in range(16):
            s += sm[k]
        out[cuda.blockIdx.x] = s


def test_cuda_shared_scratch_declared_zeroed_by_the_block():
    from kadj.cuda.writer import build_cuda_adjoint
    prepared, facts, slots = stages(CUDA, tile_sum, np.ones(32), np.zeros(2))
    fn, w = build_cuda_adjoint(prepared.kernel, facts, slots,
                               cells=prepared.extra["cells"], lowered=False)
    decl = [x for x in fn.prologue if isinstance(x, (A.LocalArray, A.ZeroArray))]
    assert [(type(x).__name__, x.name, x.space) for x in decl] == [
        ("LocalArray", "sm", "shared"), ("LocalArray", "adj_sm", "shared"),
        ("ZeroArray", "adj_sm", "shared")]
    assert decl[-1].dims == (16,) and decl[-1].zero == "0.0"
    # the block meets once its shared adjoint is zeroed
    after = fn.prologue[fn.prologue.index(decl[-1]) + 1]
    assert isinstance(after, A.Barrier)
    lowering.lower_declarations(fn, w, w.ctx.declarations)
    src = render(fn, w.syntax)
    assert "sm = cuda.shared.array(16, " in src and "adj_sm = cuda.shared.array(16, " in src
    loop = [x for x in fn.prologue if isinstance(x, A.For)]
    assert len(loop) == 1
    assert re.fullmatch(r"range\(_tid\d+, 16, _nthreads\d+\)", loop[0].iter)
    assert "cuda.syncthreads()" in src


@cuda.jit
def heat1d(u, u_new, alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


def test_gather_passes_substitute_coordinates_and_finish_only_in_the_gather_form():
    from kadj.cuda.gather import build_gather, gather_plan
    from kadj.cuda.writer import build_cuda_adjoint
    prepared, facts, slots = stages(CUDA, heat1d, np.ones(32), np.zeros(32), 0.1)
    cells = prepared.extra["cells"]
    _, scatter = build_cuda_adjoint(prepared.kernel, facts, slots, cells=cells,
                                    lowered=False)
    plan, why = gather_plan(prepared.kernel, facts, scatter)
    assert set(plan) == {"u"}, why
    fn, w = build_gather(prepared.kernel, facts, slots, plan, "gather", cells=cells,
                         lowered=False)
    (finish,) = nodes(fn, A.FinishScalar)
    assert finish.names == ("alpha",)
    loads = [x.value for x in nodes(fn, A.Assign)
             if isinstance(x.target, str) and x.value.startswith("_p0")]
    # the coordinate of this thread, and of the threads one back and one ahead
    assert {"_p0", "_p0 - 1", "_p0 + 1"} <= set(loads)
    lowering.lower_declarations(fn, w, w.ctx.declarations)
    # the block's sum goes into a slot; the zero form's block 0 adds the slots up
    assert "_block_slot_f64(_slots, 0, adj_alpha)" in render(fn, w.syntax)
    zero, wz = build_gather(prepared.kernel, facts, slots, plan, "zero", cells=cells,
                            lowered=False)
    assert not nodes(zero, A.FinishScalar)
    lowering.lower_declarations(zero, wz, wz.ctx.declarations)
    body = render(zero, wz.syntax).split('"""')[-1]
    assert [ln.strip() for ln in body.splitlines() if "adj_alpha_buf" in ln] == \
        ["_slot_total_f64(_slots, 0, adj_alpha_buf, 0)"]


def test_no_cuda_module_subclasses_the_writer():
    import kadj.cuda
    found = []
    for info in pkgutil.iter_modules(kadj.cuda.__path__):
        mod = __import__(f"kadj.cuda.{info.name}", fromlist=["_"])
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == mod.__name__ and issubclass(cls, reverse.Writer):
                found.append(cls.__qualname__)
    assert found == []


def test_a_missing_lowering_is_an_error_not_a_silent_drop():
    fn = A.Function("f_adjoint", (), "doc", prologue=[A.LocalSums()],
                    body=[A.FinishScalar(("a",))])
    with pytest.raises(AssertionError, match="no lowering of FinishScalar"):
        lowering.lower_declarations(fn, None, {"LocalSums": lowering.no_local_sums})
