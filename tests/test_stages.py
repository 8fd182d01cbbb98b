"""Stage-level tests: the region tree and the analysis facts of small construct
kernels, asserted from what each kernel means (not from the generated adjoint).

The region tree is checked through its skeleton (loops, ifs, breaks, stores: see
``skeleton``) and through :func:`kadj.dump.region`; the facts through the frozen
:class:`kadj.analysis.Facts` fields and :func:`kadj.dump.facts`.  Where the analysis
is conservative (it knows less than the kernel's meaning allows), a comment says so.
"""
import dataclasses
import math

import numba
import numpy as np
import pytest
from numba import cuda, float64
from numba.core import types

import kadj
from kadj import analysis, dump, frontend, ir, structurize
from kadj.analysis import Facts, MemoryPolicy, analyze
from kadj.testing import check_grad


# ---- building the stages ---------------------------------------------------------------
def _slots(kernel, arg_types, wrt):
    """The arguments with adjoints, as kadj's plan chooses them: float arguments in
    ``wrt`` (all when None), and every float array the kernel writes."""
    stored = ir.stored_arrays(kernel.body)
    out = []
    for name, t in zip(kernel.args, arg_types):
        ft = t.dtype if isinstance(t, types.Array) else t
        if isinstance(ft, types.Float) and (wrt is None or name in wrt or (
                isinstance(t, types.Array) and name in stored)):
            out.append(name)
    return tuple(out)


def cpu_stages(fn, *args, wrt=None):
    """(region tree, facts) of an ``@njit`` kernel for these example arguments."""
    arg_types = tuple(numba.typeof(x) for x in args)
    kernel = structurize.structurize(frontend.type_cpu_kernel(fn, arg_types))
    facts = analyze(kernel, _slots(kernel, arg_types, wrt),
                    isinstance(kernel.return_type, types.Float))
    return kernel, facts


def cuda_stages(fn, *args):
    """(region tree, facts) of a ``@cuda.jit`` kernel, typed without a GPU and prepared
    as the CUDA target prepares it: scalar cells for a thread's own elements, and the
    memory policy (local arrays private, shared arrays block-shared, checkpoints)."""
    from kadj.cuda import cells
    from kadj.cuda.frontend import type_kernel
    from kadj.cuda.indexing import ThreadIndex, array_accesses
    from kadj.cuda.structure import structurize_cuda
    arg_types = tuple(numba.typeof(x) for x in args)
    kernel = structurize_cuda(type_kernel(fn.py_func, arg_types))
    slots = _slots(kernel, arg_types, None)
    index = ThreadIndex.of(kernel)
    classes = {name: index.classify(name, idxs)
               for name, idxs in array_accesses(kernel).items()}
    params = {a for a in kernel.args if isinstance(kernel.types.get(a), types.Array)}
    kernel, cell_arrays = cells.insert_cells(kernel, index, classes, params)
    space = {s.target: getattr(s.expr.fn, "path", None) for s in ir.walk(kernel.body)
             if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Alloc)}
    shared = {v for v, p in space.items() if p == "shared.array"}
    owned = getattr(cells, "owned_shared", None)
    if owned is None:
        from kadj.cuda_api import _owned_shared as owned
    policy = MemoryPolicy(
        carried_replay=True, unwritten=frozenset(cell_arrays),
        private_scratch=frozenset(v for v, p in space.items() if p == "local.array"),
        shared_scratch=frozenset(shared), owned_shared=frozenset(owned(kernel, shared)))
    return kernel, analyze(kernel, slots, False, policy=policy)


def skeleton(stmts):
    """The shape of a region tree: loops, ifs (``if(then | else)``), break, continue,
    return, barriers and stores (``a[]=``), nothing else."""
    out = []
    for s in stmts:
        if isinstance(s, ir.ForRange):
            out.append(f"for {s.index}({skeleton(s.body)})")
        elif isinstance(s, ir.Loop):
            out.append(f"while({skeleton(s.body)})")
        elif isinstance(s, ir.If):
            inner = skeleton(s.then)
            if s.orelse:
                inner += f" | {skeleton(s.orelse)}"
            out.append(f"if({inner})")
        elif isinstance(s, ir.Store):
            out.append(f"{s.array.name}[]{'+' if s.accumulate else ''}=")
        elif isinstance(s, (ir.Break, ir.Continue, ir.Return, ir.Barrier)):
            out.append(type(s).__name__.lower())
    return " ".join(out)


def loops(kernel):
    """The kernel's loops in source order (pre-order walk)."""
    return [s for s in ir.walk(kernel.body) if isinstance(s, (ir.ForRange, ir.Loop))]


def names(f, vs):
    """User-visible names among variables ``vs`` (numba's SSA versions ``s.1`` -> ``s``;
    temporaries dropped)."""
    return {v.split(".")[0] for v in vs if not v.startswith("$")}


def loop_named(kernel, index):
    return next(s for s in loops(kernel) if isinstance(s, ir.ForRange) and s.index == index)


def the_while(kernel):
    return next(s for s in loops(kernel) if isinstance(s, ir.Loop))


Z = np.zeros(8)
Z2 = np.zeros((5, 6))


# ---- construct kernels -------------------------------------------------------------------
@numba.njit
def heat(u, u_new, alpha):
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@numba.njit
def exp_map(x, y, c):
    for i in range(x.shape[0]):
        y[i] = math.exp(x[i]) * c


@numba.njit
def sumsq(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * x[i]
    return s


@numba.njit
def recurrence(a, x0):
    x = x0
    for i in range(a.shape[0]):
        x = x * a[i] + math.sin(x)
    return x


@numba.njit
def square_in_place(u):
    for i in range(u.shape[0]):
        u[i] = u[i] * u[i]


@numba.njit
def matvec(A, x, y):
    for i in range(A.shape[0]):
        acc = 0.0
        for j in range(A.shape[1]):
            acc += A[i, j] * x[j]
        y[i] = acc


@numba.njit
def newton_sqrt(x, y):
    for i in range(x.shape[0]):
        v = x[i]
        while True:
            v = 0.5 * (v + x[i] / v)
            if abs(v * v - x[i]) < 1e-12:
                break
        y[i] = v


@numba.njit
def sum_until_negative(x):
    s = 0.0
    for i in range(x.shape[0]):
        if x[i] < 0.0:
            return 2.0 * s
        s += x[i] * x[i]
    return s


@numba.njit
def sum_until_negative_same(x):
    s = 0.0
    for i in range(x.shape[0]):
        if x[i] < 0.0:
            return s
        s += x[i] * x[i]
    return s


@numba.njit
def leaky_relu(x, y):
    for i in range(x.shape[0]):
        if x[i] > 0.0:
            y[i] = x[i]
        else:
            y[i] = 0.1 * x[i]


@numba.njit
def skip_negative(x, y):
    for i in range(x.shape[0]):
        if x[i] < 0.0:
            continue
        y[i] = x[i] * x[i]


@numba.njit
def overwritten(x, y):
    t = x[0] * x[0]
    y[0] = math.sin(t)
    t = x[1] * 2.0
    y[1] = math.cos(t)


@numba.njit
def scratch_diff(x, y):
    tmp = np.empty_like(x)
    for i in range(x.shape[0]):
        tmp[i] = x[i] * x[i]
    for i in range(1, x.shape[0]):
        y[i] = tmp[i] - tmp[i - 1]


@numba.njit
def accumulate_then_read(w, x):
    # h[i] is summed into in place, then read by a later loop (nonlinearly): no store
    # into h follows that read, so at its reverse h holds what the forward read
    n = x.shape[0]
    h = np.zeros(n)
    for i in range(n):
        for j in range(3):
            h[i] += w[i, j] * x[i]
        h[i] = math.tanh(h[i])
    s = 0.0
    for i in range(n):
        s += h[i] * h[i] * x[i]
    return s


@numba.njit
def read_then_store_again(w, x):
    # the second loop reads h, the third overwrites it, the fourth reads it again:
    # the second loop's reverse needs h as it was before the third loop
    n = x.shape[0]
    h = np.zeros(n)
    for i in range(n):
        h[i] += w[i, 0] * x[i]
    s = 0.0
    for i in range(n):
        s += h[i] * h[i]
    for i in range(n):
        h[i] = h[i] * x[i]
    for i in range(n):
        s += h[i] * h[i] * w[i, 1]
    return s


@numba.njit
def laplace_2d(u, out):
    for i in range(1, u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            out[i, j] = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]


@numba.njit
def horner(c, x):
    p = 0.0
    for i in range(c.shape[0] - 1, -1, -1):
        p = p * x + c[i]
    return p


@numba.njit
def square_of_sum(x):
    s = 0.0
    for i in range(x.shape[0]):
        s = s + x[i]
    return s * s


@numba.njit
def sin_iterate(x, y):
    for i in range(x.shape[0]):
        v = x[i]
        for k in range(4):
            v = math.sin(v)
        y[i] = v


@cuda.jit
def cuda_carried(x, y, n):
    i = cuda.grid(1)
    if i < x.shape[0]:
        v = x[i]
        for k in range(n):
            v = v * v * 0.5 + 0.1
        y[i] = v


@cuda.jit
def cuda_block_sum(x, out):
    sm = cuda.shared.array(16, float64)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    if i < x.shape[0]:
        sm[tid] = x[i] * x[i]
    else:
        sm[tid] = 0.0
    cuda.syncthreads()
    s = 8
    while s > 0:
        if tid < s:
            sm[tid] += sm[tid + s]
        cuda.syncthreads()
        s //= 2
    if tid == 0:
        cuda.atomic.add(out, 0, sm[0])


@cuda.jit
def cuda_tiled_dot(x, w, out):
    tile = cuda.shared.array(4, float64)
    i = cuda.grid(1)
    tx = cuda.threadIdx.x
    acc = 0.0
    for t in range(cuda.gridDim.x):
        tile[tx] = 0.0
        if t * 4 + tx < x.shape[0]:
            tile[tx] = x[t * 4 + tx]
        cuda.syncthreads()
        for j in range(4):
            acc += tile[j] * w[j]
        cuda.syncthreads()
    if i < out.shape[0]:
        out[i] = acc


@cuda.jit
def cuda_local_stages(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        k = cuda.local.array(3, float64)
        for j in range(3):
            k[j] = x[i] * (j + 1.0)
        y[i] = k[0] * k[1] * k[2]


@cuda.jit
def cuda_square_own(x):
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i] = x[i] * x[i]


# ---- region trees and facts -----------------------------------------------------------
def test_heat_stencil():
    k, f = cpu_stages(heat, Z, Z, 0.2)
    assert skeleton(k.body) == "for i(u_new[]=) return"
    text = dump.region(k)
    assert "for i in range(1, t3):" in text and "u_new[i] = t14" in text
    loop, = loops(k)
    # every iteration reads u and writes its own u_new[i]: independent iterations
    assert f.ascending == {loop.uid}
    assert f.varied_arrays == {"u", "u_new"} and "alpha" in f.varied
    assert not f.pushed and not f.work_arrays and not f.restore_arrays and not f.replay
    # the reverse sweep recomputes the three loads of u instead of recording them
    assert ir.loaded_arrays(f.recompute[loop.uid]) == {"u"}
    assert "ascending: for i in range(1, t3):" in dump.facts(f)


def test_map_not_differentiated_wrt_constant():
    k, f = cpu_stages(exp_map, Z, Z, 0.2, wrt=("x",))
    assert skeleton(k.body) == "for i(y[]=) return"
    loop, = loops(k)
    assert f.slot_args == ("x", "y")   # outputs always get adjoints; c is not asked for
    assert "c" not in f.varied and f.ascending == {loop.uid} and not f.pushed


def test_sum_reduction_returns_value():
    k, f = cpu_stages(sumsq, Z)
    assert skeleton(k.body) == "for i() return"
    loop, = loops(k)
    assert "s" in names(f, f.varied)
    # the adjoint of `s += x[i]*x[i]` needs x[i] (recomputed), never s: no tape
    assert not f.pushed and not f.loop_saved
    assert ir.loaded_arrays(f.recompute[loop.uid]) == {"x"}
    # conservative: a sum's reversed iterations could run in any order, but the
    # analysis orders every loop that carries an active value
    assert loop.uid not in f.ascending


def test_scalar_recurrence_records_the_carried_value():
    k, f = cpu_stages(recurrence, Z, 0.5)
    loop, = loops(k)
    # d/dx (x*a[i] + sin x) = a[i] + cos x needs each iteration's x: recorded
    assert "x" in names(f, f.pushed)
    assert loop.uid not in f.ascending and not f.replay  # CPU: no checkpoints
    assert "x0" in f.varied


def test_in_place_update_works_on_a_copy_and_records_the_old_values():
    k, f = cpu_stages(square_in_place, Z)
    assert skeleton(k.body) == "for i(u[]=) return"
    loop, = loops(k)
    assert f.work_arrays == {"u"}
    # u[i] is overwritten, its old value is needed by d(u*u): recorded, not recomputed
    assert f.pushed and not f.recompute[loop.uid]
    assert loop.uid not in f.ascending


def test_nested_loops_matvec():
    k, f = cpu_stages(matvec, Z2, np.zeros(6), np.zeros(5))
    assert skeleton(k.body) == "for i(for j() y[]=) return"
    outer, inner = loops(k)
    # rows are independent; the inner loop carries acc
    assert outer.uid in f.ascending and inner.uid not in f.ascending
    assert not f.pushed
    assert ir.loaded_arrays(f.recompute[inner.uid]) == {"A", "x"}


def test_while_loop_with_break_is_replayed_per_element():
    k, f = cpu_stages(newton_sqrt, Z, Z)
    assert skeleton(k.body) == "for i(while(if(break | continue)) y[]=) return"
    outer = loop_named(k, "i")
    inner = the_while(k)
    # each element's Newton iteration records its iterates; the elements are
    # independent, so the outer loop is replayed one element at a time
    assert "v" in names(f, f.pushed)
    assert outer.uid in f.replay and inner.uid not in f.replay
    assert "replay_fresh: v = x[i]" in dump.facts(f)


def test_early_return_in_loop_becomes_a_break_with_a_flag():
    k, f = cpu_stages(sum_until_negative, Z)
    loop, = loops(k)
    assert not any(isinstance(s, ir.Return) for s in ir.walk(loop.body))
    assert any(isinstance(s, ir.Break) for s in ir.walk(loop.body))
    # the flag is recorded, but not around the loop: its value before the loop (False)
    # is read by no reverse (kadj.analysis.loops: loop_unsaved)
    flag = next(iter(f.loop_unsaved[loop.uid]))
    assert loop.uid not in f.loop_saved
    # after the loop, the flag decides which value is returned
    assert skeleton(k.body).endswith("if(return | return)")
    assert flag in f.pushed and "s" in names(f, f.varied)
    assert loop.uid not in f.ascending


def test_early_return_of_what_the_loop_returns_after_becomes_a_plain_break():
    """``return s`` inside the loop and ``return s`` right after it: the return is a
    break, with no flag (Python 3.12 compiles a ``break`` before ``return s`` this way
    too, copying the return)."""
    k, f = cpu_stages(sum_until_negative_same, Z)
    loop, = loops(k)
    assert any(isinstance(s, ir.Break) for s in ir.walk(loop.body))
    assert not any(isinstance(s, ir.Return) for s in ir.walk(loop.body))
    assert skeleton(k.body).endswith(") return") and not f.pushed
    x = np.array([0.5, -1.2, 0.7, -0.3, 2.0])
    for data in (x, np.abs(x), -np.abs(x)):
        check_grad(kadj.differentiate(sum_until_negative_same), (data,))


def test_if_else_in_loop():
    k, f = cpu_stages(leaky_relu, Z, Z)
    assert skeleton(k.body) == "for i(if(y[]= | y[]=)) return"
    loop, = loops(k)
    branch = next(s for s in loop.body if isinstance(s, ir.If))
    assert f.has_rev[id(branch)] and f.ascending == {loop.uid} and not f.pushed
    # the branch condition is recomputed in the reverse sweep, not recorded
    assert branch.cond.name in f.recompute_vars[loop.uid]


def test_loop_with_continue():
    k, f = cpu_stages(skip_negative, Z, Z)
    # `continue` as the last statement of an iteration is the empty arm of the if
    assert skeleton(k.body) == "for i(if( | y[]=)) return"
    loop, = loops(k)
    assert f.ascending == {loop.uid} and not f.pushed


def test_overwritten_scalar_in_straight_line_code_needs_no_tape():
    k, f = cpu_stages(overwritten, Z, Z)
    assert skeleton(k.body) == "y[]= y[]= return"
    # numba's SSA gives each assignment of t its own version: both are kept
    ts = [s.target for s in ir.walk(k.body) if isinstance(s, ir.Assign)
          and s.target.split(".")[0] == "t"]
    assert len(ts) == 2 and len(set(ts)) == 2
    assert set(ts) <= f.varied and set(ts) <= f.needed and not f.pushed


def test_scratch_array():
    k, f = cpu_stages(scratch_diff, Z, Z)
    assert skeleton(k.body) == "for i(tmp[]=) for i(y[]=) return"
    first, second = loops(k)
    assert f.scratch_arrays == {"tmp"} and "tmp" in f.varied_arrays
    assert "tmp" not in f.work_arrays and "tmp = np.empty_like(x)" in dump.region(k)
    assert second.uid in f.ascending
    # the reverse sweep reads no value of tmp (the second loop's adjoint needs none of
    # its loads): the first loop's stores save nothing, and its iterations are
    # independent
    assert not f.restore_arrays and not f.pushed and first.uid in f.ascending
    k2 = kadj.differentiate(numba.njit(scratch_diff.py_func))
    x = np.random.default_rng(0).standard_normal(9)
    check_grad(k2, (x, np.zeros(9)))
    assert "_tape" not in k2.adjoint_source(x, np.zeros(9))


def test_scratch_array_read_after_its_last_store_is_not_restored():
    w = np.random.default_rng(1).standard_normal((7, 3))
    x = np.random.default_rng(2).standard_normal(7)
    k, f = cpu_stages(accumulate_then_read, w, x)
    # the last loop reads h, and no store into h can run during or after it
    assert f.scratch_arrays == {"h"} and "h" not in f.restore_arrays
    k2 = kadj.differentiate(numba.njit(accumulate_then_read.py_func))
    check_grad(k2, (w, x))
    src = k2.adjoint_source(w, x)
    assert "save h[" not in src and "restore h[" not in src


def test_scratch_array_stored_after_a_read_is_restored():
    w = np.random.default_rng(1).standard_normal((7, 2))
    x = np.random.default_rng(2).standard_normal(7)
    k, f = cpu_stages(read_then_store_again, w, x)
    assert "h" in f.restore_arrays
    k2 = kadj.differentiate(numba.njit(read_then_store_again.py_func))
    check_grad(k2, (w, x))


def test_2d_stencil():
    k, f = cpu_stages(laplace_2d, Z2, Z2)
    assert skeleton(k.body) == "for i(for j(out[]=)) return"
    outer, inner = loops(k)
    assert f.ascending == {outer.uid, inner.uid} and not f.pushed
    assert ir.loaded_arrays(f.recompute[inner.uid]) == {"u"}


def test_reversed_range():
    k, f = cpu_stages(horner, Z, 0.3)
    loop, = loops(k)
    assert loop.step == ir.Const(-1) and loop.stop == ir.Const(-1)
    assert ", -1, -1):" in dump.region(k)
    # p*x + c[i]: d/dx needs p at each step, d/dp needs x
    assert "p" in names(f, f.pushed) and loop.uid not in f.ascending


def test_value_needed_only_after_the_loop_is_not_recorded_in_it():
    k, f = cpu_stages(square_of_sum, Z)
    loop, = loops(k)
    # s*s after the loop needs the final s; the loop's own reverse never reads s, nor
    # does any reverse read its value before the loop (s = 0.0): not recorded in the
    # loop, not saved around it
    assert names(f, f.loop_unsaved[loop.uid]) == {"s"} and not f.loop_saved
    assert "loop_unsaved[for i in range(t2):" in dump.facts(f)


def test_inner_recurrence_replayed_per_outer_iteration():
    k, f = cpu_stages(sin_iterate, Z, Z)
    assert skeleton(k.body) == "for i(for k() y[]=) return"
    outer, inner = loops(k)
    assert f.replay == {outer.uid: ("v",)} and f.pushed == {"v"}
    assert not f.checkpoint  # the outer iteration carries nothing


def test_cuda_per_thread_loop_with_carried_state():
    k, f = cuda_stages(cuda_carried, Z, Z, 3)
    assert skeleton(k.body) == "if(for k() y[]= return | return)"
    loop, = loops(k)
    assert f.carried_replay
    # v carries from one iteration to the next: checkpointed, each iteration replayed
    assert f.checkpoint[loop.uid] == ("v",) and "v" in f.replay[loop.uid]


def test_cuda_shared_memory_tree_reduction():
    k, f = cuda_stages(cuda_block_sum, Z, Z)
    sk = skeleton(k.body)
    assert sk.count("barrier") == 2 and "while(if(sm[]=) barrier" in sk
    assert sk.endswith("if(out[]+= return | return)")
    loop = the_while(k)
    assert f.scratch_arrays == {"sm"} and f.shared_scratch == {"sm"}
    assert "sm" in f.varied_arrays
    # the halving stride s is the loop's carried state; each thread's own element of
    # sm is checkpointed by that thread
    assert f.checkpoint[loop.uid] == ("s",) and f.checkpoint_owned[loop.uid] == ("sm",)


def test_cuda_shared_tile_forces_the_tile_loop_to_replay():
    k, f = cuda_stages(cuda_tiled_dot, Z, Z, Z)
    assert skeleton(k.body).startswith("for t(tile[]= if(tile[]=) barrier for j() barrier)")
    tiles, inner = loops(k)
    # the inner loop reads the tile of the current outer iteration: replaying that
    # outer iteration rewrites it
    assert tiles.uid in f.force_replay and f.replay_shared[tiles.uid] == ("tile",)
    assert f.checkpoint[tiles.uid] == ("acc",)
    # the question is answered from the frozen facts, without changing them
    assert analysis.stale_loads_harmless(inner, f) is True


def test_cuda_local_scratch():
    k, f = cuda_stages(cuda_local_stages, Z, Z)
    assert skeleton(k.body) == "if(for j(k[]=) y[]= return | return)"
    loop, = loops(k)
    assert f.private_scratch == {"k"} and f.scratch_arrays == {"k"}
    assert loop.uid in f.ascending


def test_cuda_own_element_update_uses_a_cell():
    k, f = cuda_stages(cuda_square_own, Z)
    assert skeleton(k.body) == "if(x[]= return | return)"
    assert "x__cell = x[i]" in dump.region(k)
    # the cell holds the old value: x is never written by the adjoint, no copy of it
    assert f.unwritten == {"x"} and not f.work_arrays and not f.restore_arrays


# ---- the facts are frozen ---------------------------------------------------------------
def test_facts_are_frozen():
    k, f = cpu_stages(newton_sqrt, Z, Z)
    assert isinstance(f, Facts) and analysis.Analysis is Facts
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.pushed = frozenset()
    with pytest.raises(AttributeError):
        f.pushed.add("x")
    with pytest.raises(TypeError):
        f.replay[0] = ()
    with pytest.raises(TypeError):
        f.has_rev[0] = True
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.policy.carried_replay = True
    for fl in dataclasses.fields(f):
        v = getattr(f, fl.name)
        assert not isinstance(v, (set, dict, list)), fl.name
        if hasattr(v, "values") and fl.name != "kernel":
            assert all(isinstance(x, (tuple, frozenset, int, bool)) for x in v.values())


def test_policy_record_and_keywords_agree():
    k, f = cuda_stages(cuda_block_sum, Z, Z)
    g = analyze(k, f.slot_args, False, carried_replay=True,
                shared_scratch={"sm"}, owned_shared={"sm"}, unwritten=f.unwritten)
    assert dump.facts(g) == dump.facts(f)
    with pytest.raises(TypeError):
        analyze(k, f.slot_args, False, carried_replay=True, policy=f.policy)


def test_dumps_are_deterministic():
    k, f = cpu_stages(newton_sqrt, Z, Z)
    k2, f2 = cpu_stages(newton_sqrt, Z, Z)
    assert dump.facts(f) == dump.facts(f2) and dump.region(k) == dump.region(k2)
    text = dump.facts(f) + dump.region(k)
    assert "$" not in text
    assert not any(len(w) > 5 and w.isdigit() for w in text.replace(":", " ").split())
    assert dump.region(k, locs=False).count("#") == 0


def test_a_scratch_row_the_reverse_sweep_never_reads_is_not_recorded():
    """heat_steps_scratch writes a scratch row b and copies it back into u at every
    step: the reverse sweep recomputes from u (recorded before each copy) and reads
    no value of b, so b's overwritten elements are not saved."""
    from kernels.cpu.stencils import heat_steps_scratch
    k = kadj.differentiate(heat_steps_scratch)
    for n, steps in ((5, 1), (16, 5), (40, 3)):
        args = (np.random.default_rng(n).random(n), 0.15, steps)
        src = k.adjoint_source(*args)
        assert "save u_work[i]" in src and "save b[" not in src and "restore b[" not in src
        check_grad(k, args)


def test_values_under_a_recorded_condition_are_recomputed():
    """budget_sum's loop leaves by a break on a running total; the condition is
    recorded, and the values of the other arm (value[i], sqrt(cost[i])), which depend
    only on the index and unwritten arrays, are recomputed under it, not recorded."""
    from kernels.cpu.misc import budget_sum, budget_sum_sized
    k = kadj.differentiate(budget_sum)
    k0, f = cpu_stages(budget_sum, np.ones(8), np.ones(8), 5.5)
    loop, = loops(k0)
    assert len(f.pushed) == 1 and f.recompute[loop.uid]
    for n in (2, 3, 7, 50, 1500):
        args = budget_sum_sized(np.random.default_rng(n), n)
        src = k.adjoint_source(*args)
        assert "_tape_f64" not in src and "_tape_i64" in src
        check_grad(k, args)


@numba.njit
def recurrence_behind(y, x, a):
    for i in range(1, y.shape[0]):
        y[i] = a * y[i - 1] + x[i]


@numba.njit
def recurrence_down(y, x, a):
    # going down: y[i + 1] was written by the previous iteration
    for i in range(y.shape[0] - 2, -1, -1):
        y[i] = math.tanh(a * y[i + 1]) + x[i]


@numba.njit
def recurrence_down_reading_below(y, x, a):
    # going down, reading y[i - 1]: the next iteration overwrites it, so the element
    # read is what y held on entry (kadj/entry_loads.py)
    for i in range(y.shape[0] - 1, 0, -1):
        y[i] = a * y[i - 1] * y[i - 1] + x[i]


@numba.njit
def recurrence_ahead(y, x, a):
    # reads the element the next iteration overwrites: what y held on entry
    for i in range(0, y.shape[0] - 1):
        y[i] = a * y[i + 1] * y[i + 1] + x[i]


@numba.njit
def recurrence_then_store(y, x, a):
    # y[0], read by the first iteration, is overwritten after the loop
    n = y.shape[0]
    for i in range(1, n):
        y[i] = a * y[i - 1] * y[i - 1] + x[i]
    y[0] = 0.5 * y[n - 1]


@numba.njit
def recurrence_wrapping(y, x, a):
    # at i = 0, y[i - 1] is y[-1]: the last element, overwritten later
    for i in range(y.shape[0]):
        y[i] = a * y[i - 1] * y[i - 1] + x[i]


@numba.njit
def recurrence_in_time_loop(y, x, a, steps):
    for t in range(steps):
        for i in range(1, y.shape[0]):
            y[i] = a * y[i - 1] * y[i - 1] + x[i]


@pytest.mark.parametrize("fn", [recurrence_behind, recurrence_down])
def test_recurrence_reads_behind_itself_without_a_tape(fn):
    # y[i - 1] (going up; y[i + 1] going down) was written by the previous iteration and
    # no later one writes it: at the reverse it still holds what was read
    # (kadj/analysis/memory.py: written_behind)
    y = np.random.default_rng(1).uniform(-1, 1, 9)
    x = np.random.default_rng(2).uniform(-1, 1, 9)
    k, f = cpu_stages(fn, y, x, 0.7)
    assert not f.pushed and "y" not in f.restore_arrays
    k2 = kadj.differentiate(numba.njit(fn.py_func))
    for n in (1, 2, 3, 9, 1500):
        args = (np.random.default_rng(n).uniform(-1, 1, n),
                np.random.default_rng(n + 1).uniform(-1, 1, n), 0.7)
        check_grad(k2, args)
    assert "_tape" not in k2.adjoint_source(y, x, 0.7)


@pytest.mark.parametrize("fn", [recurrence_ahead, recurrence_down_reading_below])
def test_reads_ahead_of_the_recurrence_are_read_on_entry(fn):
    # the element the next iteration overwrites still holds, in the user's array, what
    # this iteration read: no tape, no work copy (kadj/entry_loads.py)
    for n in (1, 2, 3, 8, 1500):
        args = (np.random.default_rng(n).uniform(-1, 1, n),
                np.random.default_rng(n + 1).uniform(-1, 1, n), 0.6)
        k = kadj.differentiate(numba.njit(fn.py_func))
        check_grad(k, args)
    src = k.adjoint_source(*args)
    assert "_tape" not in src and "y_work" not in src, src


@pytest.mark.parametrize("fn,extra", [(recurrence_then_store, ()),
                                      (recurrence_wrapping, ()),
                                      (recurrence_in_time_loop, (3,))])
def test_reads_the_recurrence_overwrites_later_are_recorded(fn, extra):
    for n in (1, 2, 3, 8):
        args = (np.random.default_rng(n).uniform(-1, 1, n),
                np.random.default_rng(n + 1).uniform(-1, 1, n), 0.6) + extra
        k = kadj.differentiate(numba.njit(fn.py_func))
        check_grad(k, args)
        if n == 8:
            assert "_tape" in k.adjoint_source(*args)


# ---- an iteration's sums recomputed (kadj/analysis/recompute.py: _iteration_sums) ----

@numba.njit
def force_sum(x, a, k, m):
    """A chain's force with free ends: a sum started at 0.0 each iteration, added to
    under conditions, read once complete."""
    n = x.shape[0]
    for i in range(n):
        f = 0.0
        if i > 0:
            f += k * (x[i - 1] - x[i])
        if i < n - 1:
            f += k * (x[i + 1] - x[i])
        f -= 0.1 * x[i]
        a[i] = f / m


@numba.njit
def force_sum_in_time_loop(x, a, k, m, steps):
    n = x.shape[0]
    for t in range(steps):
        for i in range(n):
            f = 0.0
            if i > 0:
                f += k * (x[i - 1] - x[i])
            if i < n - 1:
                f += k * (x[i + 1] - x[i])
            a[i] = f / m
        for i in range(n):
            x[i] += 0.1 * a[i] * a[i]


@numba.njit
def sum_read_midway(x, a, k):
    for i in range(x.shape[0]):
        f = 0.0
        if i > 0:
            f += k * x[i - 1]
        a[i] = f * f              # reads the sum before its last addition
        f += x[i]
        a[i] += f * f


@numba.njit
def sum_scaled(x, a, k):
    for i in range(x.shape[0]):
        f = x[i]
        if i > 0:
            f *= k * x[i - 1]     # the adjoint of a product needs the old value
        a[i] = f * f


@numba.njit
def sum_read_after_loop(x, a, k):
    f = 0.0
    for i in range(x.shape[0]):
        f = 0.0
        if i > 0:
            f += k * x[i - 1]
        a[i] = f * f
    a[0] += f * f


@numba.njit
def sum_of_a_written_array(x, a, k):
    for i in range(x.shape[0]):
        f = 0.0
        if i > 0:
            f += k * a[i - 1]     # a is written by the loop: this load is recorded
        f += x[i]
        a[i] = math.tanh(f)


@numba.njit
def sum_in_inner_loop(x, a, k):
    for i in range(x.shape[0]):
        f = 0.0
        for j in range(3):
            f += k * x[(i + j) % x.shape[0]]
        a[i] = f * f


def _sums_recomputed(fn, *args):
    k, f = cpu_stages(fn, *args)
    return {v.split("_v2_")[-1] for rv in f.recompute_vars.values() for v in rv}, f


def test_an_iterations_sum_is_recomputed_not_recorded():
    rng = np.random.default_rng(4)
    x, a = rng.uniform(-1, 1, 9), np.zeros(9)
    rvars, f = _sums_recomputed(force_sum, x, a, 2.0, 1.5)
    assert "f" in rvars and not f.pushed
    k = kadj.differentiate(numba.njit(force_sum.py_func))
    assert "_tape" not in k.adjoint_source(x, a, 2.0, 1.5)
    for n in (1, 2, 3, 9, 1500):
        check_grad(k, (rng.uniform(-1, 1, n), np.zeros(n), 2.0, 1.5))
    # inside a time loop whose array a is restored: f / m recomputed, not recorded
    k = kadj.differentiate(numba.njit(force_sum_in_time_loop.py_func))
    src = k.adjoint_source(x, a, 2.0, 1.5, 3)
    assert "save f" not in src and "restore t" not in src.split("reverse sweep")[1]
    for n in (1, 2, 7, 300):
        check_grad(k, (rng.uniform(-1, 1, n), np.zeros(n), 0.7, 1.5, 3))


@pytest.mark.parametrize("fn", [sum_read_midway, sum_scaled, sum_read_after_loop,
                                sum_of_a_written_array, sum_in_inner_loop])
def test_sums_that_do_not_qualify_are_recorded(fn):
    """A sum read before its last addition, multiplied, read after the loop, adding a
    value that is itself recorded, or summed in an inner loop is not recomputed (its
    gradient checked, at sizes 1..300)."""
    rng = np.random.default_rng(5)
    rvars, _ = _sums_recomputed(fn, rng.uniform(-1, 1, 6), np.zeros(6), 0.8)
    assert "f" not in rvars
    k = kadj.differentiate(numba.njit(fn.py_func))
    for n in (1, 2, 5, 300):
        check_grad(k, (rng.uniform(-1, 1, n), np.zeros(n), 0.8))


# ---- rows of a scratch array each iteration of a loop owns (memory.py: _own_rows) ----

@numba.njit
def rows_forward_back(a, b, out):
    """Each system s writes and then reads only its own row of c."""
    ns, n = a.shape
    c = np.empty((ns, n))
    for s in range(ns):
        acc = 0.0
        for i in range(n):
            acc = acc * 0.5 + a[s, i]
            c[s, i] = acc
        for i in range(n - 1, -1, -1):
            out[s, i] = c[s, i] * c[s, i] * b[s, i]


@numba.njit
def rows_previous_row_written(a, b, out):
    """System s also overwrites row s - 1, which system s - 1 read."""
    ns, n = a.shape
    c = np.zeros((ns, n))
    for s in range(ns):
        for i in range(n):
            c[s, i] = a[s, i] + 1.0
            if s > 0:
                c[s - 1, i] = 0.0
        for i in range(n - 1, -1, -1):
            out[s, i] = c[s, i] * c[s, i] * b[s, i]


@numba.njit
def rows_transposed_read(a, b, out):
    """Row s written, column s read: other iterations write what it reads."""
    n = a.shape[0]
    c = np.zeros((n, n))
    for s in range(n):
        for i in range(n):
            c[s, i] = a[s, i] * 2.0
        for i in range(n):
            out[s, i] = c[i, s] * c[i, s] * b[s, i]


@numba.njit
def rows_from_minus_one(a, b, out):
    """Rows s = -1 and s = ns - 1 are one row (numba wraps -1 around): system ns - 1
    overwrites what system -1 read."""
    ns, n = a.shape
    c = np.empty((ns, n))
    r = 0.0
    for s in range(-1, ns):
        for i in range(n):
            c[s, i] = a[s, i] * a[s, i] + 0.1 * s
        for i in range(n):
            r += c[s, i] * c[s, i] * b[s, i]
    return r


def test_rows_each_iteration_owns_are_not_restored():
    rng = np.random.default_rng(8)
    args = (rng.uniform(-1, 1, (3, 5)), rng.uniform(-1, 1, (3, 5)), np.zeros((3, 5)))
    _, f = cpu_stages(rows_forward_back, *args)
    assert "c" not in f.restore_arrays
    k = kadj.differentiate(numba.njit(rows_forward_back.py_func))
    for shape in ((1, 1), (1, 4), (4, 1), (3, 7), (40, 60)):
        check_grad(k, (rng.uniform(-1, 1, shape), rng.uniform(-1, 1, shape),
                       np.zeros(shape)))


@pytest.mark.parametrize("fn", [rows_previous_row_written, rows_transposed_read,
                                rows_from_minus_one])
def test_rows_other_iterations_write_are_restored(fn):
    """(Both give wrong gradients when c is not restored.)"""
    rng = np.random.default_rng(9)
    args = (rng.uniform(-1, 1, (4, 4)), rng.uniform(-1, 1, (4, 4)), np.zeros((4, 4)))
    _, f = cpu_stages(fn, *args)
    assert "c" in f.restore_arrays
    k = kadj.differentiate(numba.njit(fn.py_func))
    for n in (1, 2, 4, 9):
        check_grad(k, (rng.uniform(-1, 1, (n, n)), rng.uniform(-1, 1, (n, n)),
                       np.zeros((n, n))))
