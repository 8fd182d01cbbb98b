"""Stage-level tests of the adjoint IR (kadj.adj_ir): what the reverse pass builds for
construct kernels, asserted on the nodes before any source text exists."""
import math

import numpy as np
import pytest
from numba import cuda, njit

import kadj
from kadj import adj_ir as A
from kadj.printer import render



@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    monkeypatch.setenv("KADJ_DISABLE_CACHE", "1")  # an adjoint from the cache is not built


def assert_printed(fn, syntax, src):
    """``src`` is the printer's text of ``fn`` after the import header it needs."""
    body = render(fn, syntax)
    assert src.endswith(body)
    head = src[:len(src) - len(body)]
    assert all(line.startswith(("import ", "from ", "#")) or not line.strip()
               for line in head.splitlines()), head


def built(kernel, *args, form="scatter"):
    """The adjoint IR of ``kernel`` for ``args`` and the adjoint's printed source."""
    with A.capture() as seen:
        if form == "scatter":
            src = kernel.adjoint_source(*args)
        else:
            src = kernel.adjoint_source(*args, form=form)
    fns = [fn for f, fn in seen if f == form]
    assert len(fns) == 1, seen
    return fns[0], src


def nodes(fn, cls):
    return [x for x in A.walk([fn]) if isinstance(x, cls)]


def strategies(fn):
    return [x.strategy for x in nodes(fn, A.ReverseLoop)]


# example arguments of this file's CUDA kernels (also for tests/test_cuda_verdict.py)
CUDA_ARGS = {
    "scaled_stencil": lambda r: [np.ones(32), np.ones(32), np.zeros(32)],
    "logistic": lambda r: [np.full(16, 0.3), np.ones(16), np.zeros(16), 2.0, 0.1, 5],
    "heat1d": lambda r: [np.ones(32), np.zeros(32), 0.1],
}


@njit
def heat_step(u, u_new, alpha):
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@njit
def overwritten_scalar(x, out):
    s = 0.0
    for i in range(x.shape[0]):
        s = math.sin(s) * x[i] + x[i]
    out[0] = s


@njit
def recurrence(y, a):
    for i in range(1, y.shape[0]):
        y[i] = a * y[i - 1] + y[i]


@njit
def recomputed_only(x, c, out):
    for i in range(1, x.shape[0]):
        t = x[i] * x[i - 1]
        out[i] = c * math.sin(t)


@njit
def while_break(x, out):
    s = 0.0
    k = 0
    while True:
        s = s * 0.5 + x[k]
        k += 1
        if k >= x.shape[0] or s > 10.0:
            break
    out[0] = s


def test_stencil_accumulates_into_three_offsets_and_consumes_the_store():
    n = 8
    fn, src = built(kadj.differentiate(heat_step, gather=False), np.ones(n), np.zeros(n),
                    0.1)
    assert_printed(fn, kadj.reverse.Writer.syntax, src)  # the printer made the text
    acc_u = [x for x in nodes(fn, A.Accumulate)
             if isinstance(x.target, A.AdjElem) and x.target.array == "u"]
    # u[i - 1], u[i] (u[i] and 2.0 * u[i], merged into one), u[i + 1]
    assert len(acc_u) == 3
    assert len({x.target.index_texts for x in acc_u}) == 3
    assert ("i",) in {x.target.index_texts for x in acc_u}
    assert all(x.op == "+=" and x.how == "plain" for x in acc_u)
    consumes = nodes(fn, A.Consume)
    assert [(c.target.array, c.target.index_texts) for c in consumes] == [("u_new", ("i",))]
    assert strategies(fn) == ["ascending"]
    assert not nodes(fn, A.Push) and not nodes(fn, A.Pop)


def test_overwritten_scalar_is_pushed_and_popped_in_pairs():
    fn, _ = built(kadj.differentiate(overwritten_scalar), np.linspace(0.1, 0.9, 5),
                  np.zeros(1))
    pushes, pops = nodes(fn, A.Push), nodes(fn, A.Pop)
    assert pushes and len(pushes) == len(pops)
    assert sorted(p.kind for p in pushes) == sorted(p.kind for p in pops)
    assert {p.kind for p in pushes} == {"f64"}
    # the growable CPU tape: the loop's pushes are reserved for at its entry, where the
    # tape is first used: it is allocated there (kadj/tape_alloc.py), the loop's trip
    # count written as arithmetic
    allocs = [x.value for x in nodes(fn, A.Assign) if x.target == "_tape_f64"]
    assert len(allocs) == 1 and allocs[0].startswith("_kept_array(_keep_bytes, 2 * max(0, "), allocs
    assert not [r for r in nodes(fn, A.Reserve) if r.amounts]
    assert strategies(fn) == ["taped"]


def test_recurrence_and_while_break_strategies():
    fn, _ = built(kadj.differentiate(recurrence), np.linspace(0.1, 0.9, 6), 0.5)
    # y[i - 1] was written by the previous iteration and by no later one: recomputed
    # in the reverse (kadj/analysis/memory.py: written_behind), nothing recorded
    assert strategies(fn) == ["recomputed"]
    # y[i] = a * y[i - 1] + y[i]: y[i]'s incoming adjoint, consumed, would be added
    # back whole; both go (kadj.simplify_adj.keep_readded_elements)
    assert not nodes(fn, A.Consume)
    assert any(x.target.base == "adj_y" for x in nodes(fn, A.Accumulate)
               if isinstance(x.target, A.AdjElem))
    fn, _ = built(kadj.differentiate(recomputed_only, gather=False),
                  np.linspace(0.1, 0.9, 6), 0.5, np.zeros(6))
    assert strategies(fn) in (["recomputed"], ["ascending"])
    fn, src = built(kadj.differentiate(while_break), np.linspace(0.1, 0.9, 6), np.zeros(1))
    (loop,) = nodes(fn, A.ReverseLoop)
    assert loop.strategy == "taped"
    # replayed backwards for the trip count the forward sweep recorded
    inner = [x for x in A.walk(loop.body) if isinstance(x, A.For)]
    assert inner and inner[0].iter.startswith("range(_trips")
    assert nodes(fn, A.Break) and "break" in src


def test_dump_prints_one_node_per_line():
    fn, _ = built(kadj.differentiate(heat_step, gather=False), np.ones(6), np.zeros(6), 0.1)
    text = A.dump(fn)
    lines = text.splitlines()
    assert lines[0].startswith("Function(name='heat_step_adjoint'")
    assert any(x.strip().startswith("ReverseLoop(strategy='ascending'") for x in lines)
    assert any("Consume(target=AdjElem(adj_u_new[i])" in x for x in lines)
    n_nodes = sum(1 for _ in A.walk([fn]))
    assert len([x for x in lines if not x.strip().startswith(".")]) == n_nodes


@cuda.jit
def scaled_stencil(u, w, out):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        out[i] = w[i] * (u[i - 1] + u[i + 1])


def test_cuda_stencil_accumulations_lowered_to_atomics_and_plain():
    k = kadj.differentiate(scaled_stencil)
    fn, src = built(k, *CUDA_ARGS["scaled_stencil"](None))
    how = {}
    for x in nodes(fn, A.Accumulate):
        if isinstance(x.target, A.AdjElem) and x.target.array in ("u", "w"):
            how.setdefault(x.target.array, []).append(x.how)
    assert how["u"] == ["atomic", "atomic"]   # neighbours' elements: other threads add
    assert how["w"] == ["plain"]              # the thread's own element
    assert src.count("cuda.atomic.add(adj_u,") == 2
    from kadj.cuda.context import SYNTAX
    assert_printed(fn, SYNTAX, src)
    report = k.adjoint_report(*CUDA_ARGS["scaled_stencil"](None))
    assert report["atomics"] >= 2 and report["plain_accumulations"] == 1


@cuda.jit
def logistic(y0, r, y_out, capacity, dt, nsteps):
    i = cuda.grid(1)
    if i < y0.shape[0]:
        y = y0[i]
        for step in range(nsteps):
            y = y + dt * r[i] * y * (1.0 - y / capacity)
        y_out[i] = y


def test_cuda_per_thread_loop_is_reversed_from_checkpoints():
    fn, _ = built(kadj.differentiate(logistic), *CUDA_ARGS["logistic"](None))
    assert strategies(fn) == ["checkpointed"]
    # the bounded per-thread tape reserves nothing and checks nothing
    assert all(r.amounts == {} for r in nodes(fn, A.Reserve))
    assert not nodes(fn, A.CapacityCheck)


@cuda.jit
def heat1d(u, u_new, alpha):
    i = cuda.grid(1)
    if 0 < i < u.shape[0] - 1:
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


def test_gather_forms_build_their_own_ir():
    k = kadj.differentiate(heat1d)
    with A.capture() as seen:
        k.adjoint_source(*CUDA_ARGS["heat1d"](None), form="gather")
    forms = dict(seen)
    assert sorted(forms) == ["gather", "scatter", "zero"]
    scatter, gather, zero = forms["scatter"], forms["gather"], forms["zero"]
    assert gather.name.endswith("_adjoint_gather") and zero.name.endswith("_adjoint_zero")

    def on_u(fn, how):
        return [x for x in nodes(fn, A.Accumulate) if x.how == how and
                isinstance(x.target, A.AdjElem) and x.target.array == "u"]
    assert len(on_u(scatter, "atomic")) == 3 and nodes(scatter, A.Consume)
    # gather: each thread sums its own element's adjoint in a local, adds it once
    # (but for u[i - 1] at i - 1 < 0, which wraps around: no thread gathers it)
    (wrap,) = on_u(gather, "atomic")
    assert any(wrap in x.then and x.cond.endswith("< 0") for x in nodes(gather, A.If))
    assert not nodes(gather, A.Consume)
    assert len(on_u(gather, "plain")) == 1
    assert any(isinstance(x.target, A.Local) for x in nodes(gather, A.Accumulate))
    # zero: consumes the stored elements' adjoints, accumulates nothing into arrays
    assert nodes(zero, A.Consume) and not on_u(zero, "atomic") and not on_u(zero, "plain")


def test_show_prints_the_adjoint_ir_stage(tmp_path, capsys):
    from kadj.__main__ import main
    src = tmp_path / "heat_cli.py"
    src.write_text("from numba import njit\n\n\n@njit\ndef heat(u, u_new, alpha):\n"
                   "    for i in range(1, u.shape[0] - 1):\n"
                   "        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])\n")
    assert main(["show", f"{src}:heat", "--args", "np.ones(6), np.zeros(6), 0.5",
                 "--stage", "adjoint-ir"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# ---- gather ----\nFunction(name='heat_adjoint'")  # a stencil
    assert "Accumulate(target=Local(_acc_u" in out
    assert "Consume(target=AdjElem(adj_u_new[i])" in out
    assert "def heat_adjoint" not in out   # the IR, not the source


def test_bounded_tape_sizes_from_the_loops_around_each_push():
    from kadj.tape_plan import bounded_tape
    fn = A.Function("f_adjoint", (), "doc", body=[
        A.Push("f64", "a"),                                    # once per thread
        A.For("k", "range(0, 3, 1)", primal=True, trip=3, body=[
            A.Push("f64", "b"),                                # 3 times
            A.For("j", "range(0, 2, 1)", primal=True, trip=2, body=[
                A.Push("i64", "int(j)")]),                     # 6 times
            A.For("once", "range(1)", body=[A.Push("f64", "c")])]),  # not a kernel loop
        A.For("r", "range(n)", primal=True, body=[             # unknown trip count ...
            A.Block("replayed iteration", body=[A.Push("f32", "d")]),  # ... but replayed
            A.Push("f64", "e", once=True)]),                   # saved state: once
        A.PushArray("f64", 5, "z", "buf[z]")])
    assert bounded_tape([fn], "f") == {"f64": 1 + 3 + 3 + 1 + 5, "i64": 6, "f32": 1}
    unbounded = A.Function("g_adjoint", (), "doc", body=[
        A.While("True", primal=True, body=[A.Push("f64", "s")])])
    with pytest.raises(kadj.DifferentiationError, match="tape must be bounded"):
        bounded_tape([unbounded], "g")


def test_a_conditional_expression_is_not_a_call():
    """``else (`` in ``a if c else (b)`` is a keyword, not a call: such texts are pure
    (kadj.adj_refs.pure), so the readability passes treat them like any other."""
    from kadj.adj_refs import pure
    assert pure("0.0 if (g == 0.0) else (g / t)")
    assert pure("x if (c and (y > 0)) else (-1.0 if z < 0 else (0.0))")
    assert not pure("0.0 if g == 0.0 else f(g)")
