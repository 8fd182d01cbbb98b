"""Primal values nothing reads are not computed (kadj.simplify_primal), and a
temporary's name loses a suffix it no longer needs (kadj.simplify_names): each rewrite
happens where it keeps the meaning, and is refused where it would not."""
import copy
import math
import re

import numpy as np
from numba import njit

import kadj
from kadj import adj_ir as A
from kadj.printer import render
from kadj.simplify_names import drop_free_suffixes
from kadj.simplify_primal import remove_unused_primal


def fn(*body, params=("x", "out"), temps=()):
    return A.Function("f_adjoint", params, "doc", [], list(body), temps=frozenset(temps))


def run(f, **env):
    ns = {}
    exec(render(f), ns)
    return ns["f_adjoint"](**env)


def lines(f):
    return [s.strip() for s in render(f).splitlines()[2:]]


def test_unread_primal_values_go_and_what_they_alone_read_follows():
    f = fn(A.Assign("t1", "x[0] * 2.0"),
           A.Assign("t2", "t1 + 1.0"),          # read by nothing: goes, then t1
           A.Assign("t3", "x[1]"),
           A.Assign("out[0]", "t3"),            # a store: stays, and keeps t3
           A.Assign("t4", "abs(x[2])"),
           A.Assign("t4", "1.0", "+="),         # reads only itself: goes with it
           A.Assign("_trips1", "0"),            # bookkeeping: left alone
           A.Assign("x", "0.0"))                # a parameter: left alone
    remove_unused_primal(f)
    assert lines(f) == ["t3 = x[1]", "out[0] = t3", "_trips1 = 0", "x = 0.0"]


def test_values_read_anywhere_stay():
    loop = A.For("k", "range(0, n, 1)", [
        A.If("k > 0", [A.Assign("out[k]", "prev")]),   # read in a later iteration
        A.Assign("prev", "x[k] * 2.0"),
        A.Assign("m", "x[k]")])
    f = fn(A.Assign("n", "x.shape[0]"),                  # read by the loop header
           A.Assign("m", "0.0"), loop,
           A.Assign("c", "m > 1.0"),
           A.While("c", [A.Assign("c", "False")]),      # read by a condition
           A.Assign("p", "x[1]"), A.Push("f64", "p"),  # read by a tape push
           A.Assign("r", "x[0] + 1.0"), A.Return("r"),
           A.Assign("e", "g(x)"),                        # a call with effects
           params=("x", "out", "g"))
    before = render(f)
    remove_unused_primal(f)
    assert render(f) == before


def test_cuda_thread_indexing_is_a_pure_read():
    f = fn(A.Assign("t1", "cuda.grid(2)"), A.Assign("t2", "t1"),
           A.Assign("t5", "cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x"),
           A.Assign("t6", "cuda.atomic.add(out, 0, 1.0)"),
           A.Assign("t7", "cuda.local.array(4, np.float64)"))
    remove_unused_primal(f)
    assert lines(f) == ["t6 = cuda.atomic.add(out, 0, 1.0)",
                        "t7 = cuda.local.array(4, np.float64)"]


def test_an_if_left_without_code_goes_and_an_empty_then_is_negated():
    f = fn(A.Assign("t3", "x[0] > 0.0"),
           A.If("t3", [A.Comment("# k.py:3: y = x[0] - 1.0"), A.Assign("t5", "x[0] - 1.0")],
                [A.Assign("t7", "x[0] < -1.0"),
                 A.If("t7", [A.Assign("t9", "x[0] + 1.0")])]),
           A.If("t3", [A.Assign("out[0]", "2.0")], [A.If("t7", [A.Assign("out[0]", "1.0")])]))
    remove_unused_primal(f)
    assert lines(f) == ["t3 = x[0] > 0.0", "if not t3:", "t7 = x[0] < -1.0",
                        "if t3:", "out[0] = 2.0", "else:",
                        "if t7:", "out[0] = 1.0"]
    for x0, want in ((2.0, 2.0), (-0.5, 0.0), (-2.0, 1.0)):
        out = np.zeros(1)
        run(f, x=np.array([x0]), out=out)
        assert out[0] == want


def test_suffixes_go_where_the_plain_name_is_free():
    f = fn(A.Assign("c_i_2", "x[0]"), A.Assign("c_i_3", "x[0]"),
           A.Assign("out[0]", "c_i_2 * c_i_3"),
           A.Accumulate(A.AdjVar("c_i_2", "adj_c_i_2"), "=", "out[1]"),
           A.Assign("out[2]", "adj_c_i_2 * 2.0"),
           temps=("c_i_2", "c_i_3"))
    drop_free_suffixes(f)
    assert lines(f) == ["c_i = x[0]", "c_i_3 = x[0]", "out[0] = c_i * c_i_3",
                        "adj_c_i = out[1]", "out[2] = adj_c_i * 2.0"]
    out = np.array([0.0, 5.0, 0.0])
    run(f, x=np.array([3.0]), out=out)
    assert list(out) == [9.0, 5.0, 10.0]


def test_suffixes_stay_where_the_plain_name_is_taken():
    cases = [
        # the plain name is another variable
        fn(A.Assign("c_i", "x[1]"), A.Assign("c_i_2", "x[0]"),
           A.Assign("out[0]", "c_i * c_i_2"), temps=("c_i", "c_i_2")),
        # the adjoint's plain name is taken: the pair would read apart
        fn(A.Assign("c_i_2", "x[0]"), A.Assign("adj_c_i", "x[1]"),
           A.Assign("out[0]", "adj_c_i * c_i_2"), temps=("c_i_2",)),
        # named in a comment
        fn(A.Comment("# c_i_2 holds x[0]"), A.Assign("c_i_2", "x[0]"),
           A.Assign("out[0]", "c_i_2"), temps=("c_i_2",)),
        # not a temporary: a user's own name
        fn(A.Assign("c_i_2", "x[0]"), A.Assign("out[0]", "c_i_2")),
        # a parameter
        fn(A.Assign("out[0]", "x_2[0]"), params=("x_2", "out"), temps=("x_2",)),
    ]
    for f in cases:
        before = render(f)
        drop_free_suffixes(f)
        assert render(f) == before


def unread_assignments(src):
    """Names (not the generated bookkeeping's) assigned in ``src`` but read nowhere."""
    code = [ln.split("#")[0] for ln in src.splitlines()]
    words = re.compile(r"(?<![\w.])[A-Za-z]\w*")
    target = re.compile(r"\s*([A-Za-z]\w*) (?:=|\+=|-=) (.*)")
    reads = {}
    for ln in code:
        m = target.fullmatch(ln)
        for w in words.findall(m.group(2) if m else ln):
            reads[w] = reads.get(w, 0) + 1
    return {m.group(1) for ln in code for m in [target.fullmatch(ln)]
            if m and not m.group(1).startswith("adj_") and not reads.get(m.group(1))}


@njit
def upwind(u, c, out, a):
    for i in range(1, u.shape[0] - 1):
        if c[i] > 0.0:
            out[i] = u[i] - a * c[i] * (u[i] - u[i - 1])
        else:
            out[i] = u[i] - a * c[i] * (u[i + 1] - u[i])


def test_upwind_adjoint_reads_as_written_and_its_gradient_is_exact():
    k = kadj.differentiate(upwind)
    rng = np.random.default_rng(3)
    u, c = rng.normal(size=8), rng.normal(size=8)
    src = k.adjoint_source(u, c, np.zeros(8), 0.7)
    assert "c_i = c[i]" in src and "c_i_2" not in src
    assert unread_assignments(src) == set()
    w = rng.normal(size=8)
    adj_u, adj_c, adj_a = np.zeros(8), np.zeros(8), np.zeros(1)
    k.adjoint(u, c, np.zeros(8), 0.7, adj_u, adj_c, w.copy(), adj_a)

    def loss(u, c):
        out = np.zeros(8)
        upwind.py_func(u, c, out, 0.7)
        return out @ w
    h = 1e-6
    for x, adj in ((u, adj_u), (c, adj_c)):
        fd = np.zeros(8)
        for j in range(8):
            xp, xm = x.copy(), x.copy()
            xp[j] += h
            xm[j] -= h
            fd[j] = ((loss(xp, c) - loss(xm, c)) / (2 * h) if x is u
                     else (loss(u, xp) - loss(u, xm)) / (2 * h))
        np.testing.assert_allclose(adj, fd, rtol=1e-6, atol=1e-8)


def test_no_golden_adjoint_computes_a_value_nothing_reads():
    import pathlib
    root = pathlib.Path(__file__).parent / "golden"
    files = sorted(root.glob("*.txt")) + sorted(root.glob("cuda/*.py.txt"))
    assert len(files) > 20
    unread = {p.name: unread_assignments(p.read_text()) for p in files}
    assert {k: v for k, v in unread.items() if v} == {}


def test_an_array_only_stored_into_goes_with_its_loop():
    """A work copy whose elements nothing but its own stores reads (the forward of
    y[j] += v, whose adjoint needs no value of y; a Gauss-Seidel sweep u[i] = (u[i-1] +
    u[i+1]) / 2 + v, whose adjoint needs no value of u): its allocation, stores and the
    loop left computing only what they read go; an array another statement reads, or
    a parameter, stays."""
    fwd = A.For("k", "range(0, n, 1)", [
        A.Assign("j", "idx[k]"),
        A.Assign("v", "x[k] * 2.0"),
        A.Assign("y_work[j]", "y_work[j] + v"),     # reads only its own element
        A.Assign("z_work[j]", "z_work[j + 1] + v"),  # reads another element of its own
        A.Assign("w_work[j]", "w_work[j - 1] + v"),  # read below: stays
        A.Assign("out[j]", "v")], primal=True)        # a parameter's store: stays
    rev = A.For("k", "range(n - 1, -1, -1)", [A.Assign("j", "idx[k]"),
                                              A.Assign("out[k]", "out[j] + w_work[j]")])
    f = fn(A.Assign("y_work", "y.copy()"), A.Assign("z_work", "np.empty_like(y)"),
           A.Assign("w_work", "y.copy()"),
           A.Assign("n", "idx.shape[0]"), fwd, rev, params=("idx", "x", "y", "out"))
    remove_unused_primal(f)
    text = "\n".join(lines(f))
    assert "y_work" not in text and "z_work" not in text, text
    assert "w_work = y.copy()" in text and "w_work[j] = w_work[j - 1] + v" in text, text
    # the same, with the store gone too: the loop computes nothing used after it
    fwd.body[:] = [x for x in fwd.body if not str(x.target).startswith(("w_", "out"))]
    rev.body[1] = A.Assign("out[k]", "out[j]")
    f.prologue[:] = []
    f.body[:] = [A.Assign("y_work", "y.copy()"), A.Assign("n", "idx.shape[0]"), fwd, rev]
    remove_unused_primal(f)
    assert lines(f) == ["n = idx.shape[0]", "for k in range(n - 1, -1, -1):",
                        "j = idx[k]", "out[k] = out[j]"], lines(f)


def test_a_loop_whose_values_are_read_later_stays():
    fwd = A.For("k", "range(0, n, 1)", [A.Assign("v", "x[k] * 2.0"),
                                        A.Assign("y_work[k]", "v")], primal=True)
    f = fn(A.Assign("y_work", "y.copy()"), A.Assign("n", "x.shape[0]"), fwd,
           A.Assign("out[0]", "v + k"),          # the last iteration's v and k
           params=("x", "y", "out"))
    remove_unused_primal(f)
    assert "for k in range(0, n, 1):" in lines(f) and "v = x[k] * 2.0" in lines(f)
    assert run(f, x=np.arange(3.0), y=np.zeros(3), out=np.zeros(1)) is None


def test_scatter_adjoints_copy_and_recompute_nothing():
    """y[idx[k]] += w[k] * x[k] (and its CSR form): the adjoint needs no value of y,
    so it neither copies y nor runs the forward loop; y's incoming adjoint is read and
    left in place (kadj.simplify_adj.keep_readded_elements)."""
    from fdcheck import fd_check
    from kernels.cpu.sparse import (csr_spmv_transpose, csr_spmv_transpose_sized,
                                    scatter_add, scatter_add_sized)
    rng = np.random.default_rng(2)
    for kernel, sized in ((scatter_add, scatter_add_sized),
                          (csr_spmv_transpose, csr_spmv_transpose_sized)):
        args = sized(rng, 40)
        k = kadj.differentiate(kernel)
        src = k.adjoint_source(*args)
        body = src[src.index("_adjoint("):]
        assert "y_work" not in src and "_keep_" not in src, src
        loops = [ln for ln in body.splitlines() if ln.strip().startswith("for k in")]
        assert len(loops) == 1 and re.search(r"adj_y\[\w+\] = 0\.0", body) \
            is None, src
        fd_check(k, args)


def test_a_sweep_whose_values_only_it_reads_is_neither_copied_nor_run():
    """Gauss-Seidel, u[i] = 0.5 * (u[i - 1] + u[i + 1] + h2 * f[i]) swept nsweeps
    times: linear in u, so its adjoint needs no value of u; the work copy of u and the
    forward sweeps that only it read go (no memory kept between calls), and the
    gradient stays exact."""
    from fdcheck import fd_check
    from kernels.cpu.stencils import gauss_seidel_1d, gauss_seidel_1d_sized
    args = gauss_seidel_1d_sized(np.random.default_rng(4), 30)
    k = kadj.differentiate(gauss_seidel_1d)
    src = k.adjoint_source(*args)
    body = src[src.index("_adjoint("):]
    assert "u_work" not in src and "_keep_" not in src, src
    loops = [ln.split(" in ")[0] for ln in body.splitlines()
             if ln.strip().startswith("for ")]
    assert loops == ["    for sweep", "        for i"], src
    assert "# stencils.py:83: for sweep in range(nsweeps):\n    # ---- reverse" \
        not in src, src      # (the dropped loop's line comment went with it)
    fd_check(k, args)


@njit
def _two_loops_one_name(x, y, z):
    for i in range(x.shape[0]):
        t0 = math.sin(x[i])
        y[i] = t0 * t0
    for i in range(x.shape[0]):
        t0 = math.cos(y[i])
        z[i] = t0 * x[i]


def test_a_forward_loop_whose_values_a_restore_replaces_goes():
    """The second loop's forward sweep computed t0 for nothing: its reverse replays
    each iteration, and t0's value from before the loop is restored from the tape
    after it (a restore assigns, it reads nothing)."""
    from fdcheck import fd_check
    args = (np.linspace(0.1, 1.0, 9), np.zeros(9), np.zeros(9))
    k = kadj.differentiate(_two_loops_one_name)
    src = k.adjoint_source(*args)
    forward = src[src.index("# ---- forward sweep"):src.index("# ---- reverse sweep")]
    assert "math.cos" not in forward, src
    fd_check(k, args)


def test_a_forward_loop_of_branches_and_inner_while_loops_goes():
    """A forward sweep's loop whose iterations each run a Newton iteration (a `while`
    left by `break`, `continue`), computing values only the replayed iterations of the
    reverse read: it goes, with the comment that said it was not recorded."""
    from kadj.simplify_scopes import exposed
    from kernels.cpu import GALLERY
    from kadj.testing import check_grad
    for name in ("newton_cbrt_converge", "kepler_newton", "euler_until",
                 "fixed_point_cos", "bracket_interp"):
        ex = next(e for e in GALLERY if e.name == name)
        args = ex.make_args(np.random.default_rng(4))
        k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
        src = k.adjoint_source(*args)
        forward = src[src.index("# ---- forward sweep"):src.index("# ---- reverse sweep")]
        code = [ln.strip() for ln in forward.splitlines() if not ln.strip().startswith("#")]
        assert not any(ln.startswith(("for ", "while ")) for ln in code), src
        assert "not recorded here" not in forward, src
        check_grad(k, args)
    # what only running a loop shows: a `while True` body's first run, and the saves of
    # the previous iteration's values (read only from the second iteration on)
    loop = A.While("True", [A.If("_trips > 1", [A.Push("f64", "t5")], fresh=True),
                            A.Assign("t5", "x[0]"), A.If("t5 > 1.0", [A.Break()]),
                            A.Assign("t6", "t5")])
    seq = [loop, A.Assign("out[0]", "t5 + t6")]
    assert exposed(seq, loops=True)[0] & {"t5", "t6"} == {"t6"}
    assert exposed(seq)[0] & {"t5", "t6"} == {"t5", "t6"}
    # the same saves outside any loop read what was there before
    assert "t5" in exposed(loop.body, loops=True)[0]


def test_a_forward_loop_read_after_a_while_that_may_not_assign_stays():
    body = [A.Assign("k", "0"), A.While("k < n", [A.Assign("t5", "x[k]"),
                                                  A.Assign("k", "k + 1")])]
    fwd = A.For("i", "range(0, n, 1)", list(body), primal=True)
    rev = A.For("i", "range(n - 1, -1, -1)", copy.deepcopy(body) + [
        A.Assign("out[i]", "t5")])
    f = fn(A.Assign("n", "x.shape[0]"), A.Assign("t5", "0.0"), fwd, rev,
           params=("x", "out"))
    remove_unused_primal(f)
    # the reverse's while may run no iteration, and then reads t5 as the forward left it
    assert "for i in range(0, n, 1):" in lines(f), lines(f)
