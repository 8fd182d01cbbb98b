"""The first contribution to an adjoint known to be zero assigns it
(kadj.simplify_zero): rewritten where every path brings a zero, left alone where one
path may not, and the same results as the code as built on random programs."""
import math
import random

import numpy as np
import pytest
from numba import njit

import kadj
from kadj import adj_ir as A
from kadj.printer import render
from kadj.simplify_zero import assign_first_contributions, float64_only
from kadj.testing import check_grad

pytestmark = pytest.mark.usefixtures("private_cache_dir")


def v(name):
    return A.AdjVar(name, name)


def acc(name, value, op="+="):
    return A.Accumulate(v(name), op, value)


def reset(name):
    return A.Assign(v(name), "0.0")


def fn(*body, prologue=()):
    return A.Function("f_adjoint", ("x", "out"), "doc", list(prologue), list(body))


def ops(f):
    return [x.op for x in A.walk(f.prologue + f.body) if isinstance(x, A.Accumulate)]


def test_after_the_initialisation_and_after_a_reset():
    f = fn(acc("adj_a", "x[0]"), A.Assign("out[0]", "adj_a"), reset("adj_a"),
           acc("adj_a", "x[1]", "-="), A.Assign("out[1]", "adj_a"),
           acc("adj_a", "x[2]"), prologue=[reset("adj_a")])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["=", "=", "+="]
    assert "adj_a = -x[1]" in render(f)


def test_in_a_loop_whose_body_ends_with_the_reset():
    loop = A.For("i", "range(3)", [acc("adj_a", "x[i]"), acc("adj_a", "x[i] * 2.0"),
                                   A.Assign("out[i]", "adj_a"), reset("adj_a")])
    f = fn(loop, prologue=[reset("adj_a")])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["=", "+="]


def test_not_when_one_arm_leaves_it_unreset():
    branch = A.If("x[0] > 0", [acc("adj_a", "x[1]"), reset("adj_a")],
                  [acc("adj_a", "x[2]")])
    f = fn(branch, acc("adj_a", "x[3]"), prologue=[reset("adj_a")])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["=", "=", "+="]


def test_not_when_the_loop_does_not_reset_it():
    loop = A.For("i", "range(3)", [acc("adj_s", "x[i]")])     # a sum over iterations
    f = fn(loop, prologue=[reset("adj_s")])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["+="]


def test_not_when_a_continue_skips_the_reset():
    loop = A.For("i", "range(3)", [acc("adj_a", "x[i]"), A.Assign("out[i]", "adj_a"),
                                   A.If("x[i] > 0", [A.Continue()]), reset("adj_a")])
    f = fn(loop, prologue=[reset("adj_a")])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["+="]


def test_not_after_a_loop_left_by_break_before_the_reset():
    loop = A.For("i", "range(3)", [acc("adj_a", "x[i]"),
                                   A.If("x[i] > 0", [A.Break()]), reset("adj_a")])
    f = fn(loop, acc("adj_a", "1.0"), prologue=[reset("adj_a")])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["=", "+="]


def test_not_when_the_value_reads_it_nor_into_sums_nor_in_prange():
    f = fn(acc("adj_a", "adj_a * 2.0"), prologue=[reset("adj_a")])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["+="]
    s = acc("adj_b", "x[0]")
    s.how = "sum"
    f = fn(s, prologue=[reset("adj_b")])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["+="]
    loop = A.For("i", "numba.prange(3)", [acc("adj_c", "x[i]"), reset("adj_c")])
    f = fn(loop, prologue=[reset("adj_c")])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["+="]


def test_not_after_a_statement_it_does_not_know():
    f = fn(A.Call("g(adj_a)"), acc("adj_a", "x[0]"), prologue=[reset("adj_a")])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["+="]


def test_a_float32_adjoint_takes_only_a_float32_cast():
    z32 = "np.float32(0.0)"
    f = fn(acc("adj_a", "np.float32(x[0] * 2.0)"), A.Assign("out[0]", "adj_a"),
           A.Assign(v("adj_a"), z32), acc("adj_a", "x[1]"),
           prologue=[A.Assign(v("adj_a"), z32)])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["=", "+="]        # x[1] is a float64 value: kept as an addition
    f = fn(acc("adj_b", "np.float32(x[0]) * x[1]"), prologue=[A.Assign(v("adj_b"), z32)])
    assign_first_contributions(f, float64=True)
    assert ops(f) == ["+="]             # not one cast as a whole


def test_a_float64_zero_needs_a_float64_kernel():
    f = fn(acc("adj_a", "x[0]"), prologue=[reset("adj_a")])
    assign_first_contributions(f, float64=False)
    assert ops(f) == ["+="]


def test_float64_only():
    from numba.core import types
    assert float64_only({"a": types.float64, "n": types.intp,
                         "x": types.Array(types.float64, 1, "C")})
    assert not float64_only({"a": types.float64, "x": types.Array(types.float32, 1, "C")})
    assert not float64_only({"z": types.complex128})
    assert not float64_only({"t": types.UniTuple(types.float32, 2)})


# ---- random programs: rewritten, they compute what the code as built computes ----
_VARS = ("adj_a", "adj_b", "adj_c")


class _Gen:
    def __init__(self, rng):
        self.rng = rng
        self.depth = 0
        self.loops = 0
        self.counter = 0

    def expr(self, target):
        r = self.rng
        terms = [f"x[{r.randrange(8)}]"]
        others = [w for w in _VARS if w != target]
        if r.random() < 0.5:
            terms.append(f"{r.choice(others)} * {r.choice(['0.5', '-1.5', 'x[3]'])}")
        return " + ".join(terms)

    def stmts(self, n):
        return [self.stmt() for _ in range(n)]

    def stmt(self):
        r = self.rng
        k = r.random()
        name = r.choice(_VARS)
        if self.depth < 3 and k < 0.15:
            self.depth += 1
            x = A.If(f"x[{r.randrange(8)}] > {r.choice(['0.0', '0.5'])}",
                     self.stmts(r.randrange(1, 4)), self.stmts(r.randrange(0, 3)))
            self.depth -= 1
            return x
        if self.depth < 3 and k < 0.27:
            self.depth += 1
            self.loops += 1
            self.counter += 1
            var = f"i{self.counter}"
            if r.random() < 0.6:
                x = A.For(var, f"range({r.randrange(0, 4)})", self.stmts(r.randrange(1, 5)))
            else:       # a while loop counting itself
                body = [A.Assign(var, f"{var} + 1")] + self.stmts(r.randrange(1, 5))
                x = A.If("True", [A.Assign(var, "0"),
                                  A.While(f"{var} < {r.randrange(0, 4)}", body)])
            self.loops -= 1
            self.depth -= 1
            return x
        if self.loops and k < 0.33:
            return A.If(f"x[{r.randrange(8)}] > 0.3", [r.choice([A.Break(), A.Continue()])])
        if k < 0.5:
            return reset(name)
        if k < 0.62:
            return A.Assign(f"out[{r.randrange(4)}]", f"out[{r.randrange(4)}] + {name}")
        if k < 0.66:
            return A.Accumulate(v(name), "=", self.expr(name))
        return acc(name, self.expr(name), r.choice(["+=", "+=", "-="]))


def _program(seed):
    g = _Gen(random.Random(seed))
    body = g.stmts(8) + [A.Assign(f"out[{4 + k}]", w) for k, w in enumerate(_VARS)]
    return fn(*body, prologue=[reset(w) for w in _VARS])


def _run(f, x):
    ns = {}
    exec(render(f), ns)
    out = np.zeros(8)
    ns["f_adjoint"](x, out)
    return out


@pytest.mark.parametrize("seed", range(300))
def test_random_programs_compute_the_same(seed):
    f = _program(seed)
    before = ops(f)
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(8) for _ in range(3)]
    want = [_run(f, x) for x in xs]
    assign_first_contributions(f, float64=True)
    got = [_run(f, x) for x in xs]
    for w, g in zip(want, got):
        assert np.array_equal(w, g), render(f)   # (-0.0 == 0.0: a signed zero may differ)
    assert len(ops(f)) == len(before)


def test_the_random_programs_exercise_the_rewrite():
    changed = 0
    for seed in range(300):
        f = _program(seed)
        before = ops(f)
        assign_first_contributions(f, float64=True)
        changed += ops(f) != before
    assert changed > 100


# ---- kernels -------------------------------------------------------------------
@njit
def pair_energy(pos, k, out):
    n = pos.shape[0]
    for i in range(n):
        e = 0.0
        for j in range(n):
            if j == i:
                continue
            d = pos[j] - pos[i]
            r = math.sqrt(d * d + 0.1)
            e += k * r * math.exp(-r)
        out[i] = e


@njit
def pair_energy_f32(pos, k, out):
    n = pos.shape[0]
    for i in range(n):
        e = np.float32(0.0)
        for j in range(n):
            if j != i:
                d = pos[j] - pos[i]
                e += k * d * d
        out[i] = e


def test_a_pair_loop_assigns_its_first_contributions_and_its_gradient_is_right():
    rng = np.random.default_rng(3)
    args = (rng.standard_normal(7), 0.8, np.zeros(7))
    k = kadj.differentiate(pair_energy)
    src = k.adjoint_source(*args)
    assert "adj_e = adj_out[i]" in src
    assert "adj_r = " in src and "adj_r += " not in src.split("adj_r = ")[0]
    check_grad(pair_energy, args, wrt=("pos", "k"))


def test_a_float32_kernel_assigns_float32_casts_and_its_gradient_is_right():
    rng = np.random.default_rng(4)
    args = (rng.standard_normal(6).astype(np.float32), np.float32(0.5),
            np.zeros(6, np.float32))
    src = kadj.differentiate(pair_energy_f32).adjoint_source(*args)
    assert "adj_e = np.float32(adj_out[i])" in src
    assert "adj_d = np.float32(" in src and "adj_d += np.float32(" in src
    check_grad(pair_energy_f32, args, wrt=("pos", "k"))
