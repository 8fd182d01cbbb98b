"""One variable per web (kadj/var_webs.py): a scalar name reused for unrelated values
becomes one variable per web, and the kernel's meaning is unchanged.

The region-level tests build the tree by hand and assert which reads see which
assignments; the kernel tests compare gradients with float64 finite differences and
check what the adjoint no longer records.
"""
import math

import numba
import numpy as np
import pytest
from numba import njit
from numba.core import types

import kadj
from kadj import ir
from kadj.testing import check_grad
from kadj.var_webs import split

F = types.float64
I = types.intp
rng = np.random.default_rng(7)


def V(n):
    return ir.Var(n)


def A(target, *args, fn=math.sin):
    return ir.Assign(target, ir.Op(fn, tuple(V(a) if isinstance(a, str) else a
                                            for a in args)))


def C(target, src):
    return ir.Assign(target, ir.Copy(V(src) if isinstance(src, str) else ir.Const(src)))


def kernel(body, **extra):
    typs = {"x": types.float64[:], "y": types.float64[:], "n": I, "i": I, "c": types.boolean,
            "t": F, "s": F, "u": F, **extra}
    return ir.Kernel("k", ("x", "y", "n"), tuple(body), types=typs)


def store(value, index="i"):
    return ir.Store(V("y"), (V(index),), V(value))


def loop(body, index="i"):
    return ir.ForRange(index, ir.Const(0), V("n"), ir.Const(1), tuple(body))


def assigned_names(k):
    return sorted(s.target for s in ir.walk(k.body) if isinstance(s, ir.Assign))


# ---- the region tree ---------------------------------------------------------------------
def test_two_loops_reusing_a_temporary_get_one_variable_each():
    k = kernel([loop([A("t", "x"), store("t")]), loop([A("t", "x"), store("t")])])
    out = split(k)
    first, second = out.body
    assert first.body[0].target == "t" and first.body[1].value == V("t")
    assert second.body[0].target == "t_2" and second.body[1].value == V("t_2")
    assert out.types["t_2"] == F


def test_assignments_in_both_arms_of_an_if_are_one_web():
    k = kernel([ir.If(V("c"), (C("t", 1.0),), (C("t", 2.0),)), store("t", "n")])
    assert split(k) is k


def test_a_loop_carried_sum_is_one_web_and_a_later_reuse_is_another():
    k = kernel([C("s", 0.0),
                loop([ir.Assign("s", ir.Op(math.fsum, (V("s"), V("x"))))]),
                store("s", "n"),
                C("s", 0.0),
                loop([ir.Assign("s", ir.Op(math.fsum, (V("s"), V("y"))))]),
                store("s", "n")])
    out = split(k)
    assert assigned_names(out) == ["s", "s", "s_2", "s_2"]
    assert out.body[2].value == V("s") and out.body[5].value == V("s_2")
    assert out.body[4].body[0].expr.args[0] == V("s_2")


def test_a_value_that_may_be_the_entry_value_keeps_the_name():
    # ``t`` read after a conditional assignment: that read may see the entry value, so
    # the assignment keeps the name; the later, unrelated assignment is split off
    k = kernel([ir.If(V("c"), (C("t", 1.0),), ()), store("t", "n"),
                C("t", 3.0), store("t", "n")])
    out = split(k)
    assert out.body[0].then[0].target == "t" and out.body[1].value == V("t")
    assert out.body[2].target == "t_2" and out.body[3].value == V("t_2")


def test_a_counter_read_after_its_loop_keeps_the_name():
    k = kernel([loop([A("u", "x"), store("u")]), store("u", "i"),
                C("i", 0), store("u", "i")], u=F)
    out = split(k)
    # the loop's counter and the read after it: one web with the counter, kept
    assert out.body[0].index == "i" and out.body[1].index == (V("i"),)
    # the later plain assignment of ``i`` is a web of its own
    assert out.body[2].target == "i_2" and out.body[3].index == (V("i_2"),)


def test_values_carried_around_a_while_loop_by_continue_and_break():
    # while True: if c: t = 1; continue   /   t = t + 1; if c: break
    # the value of ``t`` after the loop comes from the break; all of ``t``'s
    # assignments reach a common read (through the continue), so nothing is split
    body = (ir.If(V("c"), (C("t", 1.0), ir.Continue()), ()),
            ir.Assign("t", ir.Op(math.fsum, (V("t"), ir.Const(1.0)))),
            ir.If(V("c"), (ir.Break(),), ()))
    k = kernel([C("t", 0.0), ir.Loop(body), store("t", "n"), C("t", 5.0), store("t", "i")])
    out = split(k)
    assert [s.target for s in ir.walk(out.body[:2]) if isinstance(s, ir.Assign)] == \
        ["t", "t", "t"]
    assert out.body[2].value == V("t")
    assert out.body[3].target == "t_2" and out.body[4].value == V("t_2")


def test_a_read_after_the_loop_sees_only_the_break():
    # ``t`` assigned before the loop is never read: the loop assigns ``t`` before every
    # way out, so its web and the one before the loop are apart
    body = (C("t", 2.0), ir.If(V("c"), (ir.Break(),), ()))
    k = kernel([C("t", 0.0), store("t", "n"), ir.Loop(body), store("t", "n")])
    out = split(k)
    assert out.body[0].target == "t" and out.body[1].value == V("t")
    assert out.body[2].body[0].target == "t_2" and out.body[3].value == V("t_2")


def test_arguments_and_arrays_are_never_split():
    k = kernel([C("n", 3), store("t", "n"), C("n", 4), store("t", "n")])
    assert split(k) is k


def test_a_new_name_never_collides():
    k = kernel([C("t", 1.0), store("t", "n"), C("t", 2.0), store("t_2", "n"),
                store("t", "n")], t_2=F)
    out = split(k)
    assert out.body[2].target == "t_3" and out.body[4].value == V("t_3")
    assert out.body[3].value == V("t_2")


# ---- kernels: gradients and what the adjoint records -----------------------------------------
@njit
def two_loops(x, y):
    n = x.shape[0]
    for i in range(n):
        t = math.sin(x[i])
        y[i] = t * t
    for i in range(n):
        t = math.cos(x[i])
        y[i] += t * x[i]


@njit
def reuse_in_one_body(x, y):
    for i in range(x.shape[0]):
        t = math.sin(x[i])
        a = t * t
        t = math.exp(0.5 * x[i])
        y[i] = a + t * x[i]


@njit
def two_sums(x, w):
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * w[i]
    r = math.tanh(s)
    s = 0.0
    for i in range(x.shape[0]):
        s += math.sin(x[i]) * r
    return s


@njit
def while_then_reuse(x, y):
    k = 0
    t = 1.0
    while k < x.shape[0]:
        t = t * 0.5 + x[k]
        k += 1
        if t > 3.0:
            break
    y[0] = t
    for i in range(x.shape[0]):
        t = x[i] * x[i]
        y[i] += t


@pytest.mark.parametrize("n", [1, 7, 300])
def test_two_loops_gradient_and_no_tape(n):
    x, y = rng.standard_normal(n), np.zeros(n)
    k = kadj.differentiate(two_loops)
    check_grad(k, (x, y))
    src = k.adjoint_source(x, y)
    assert "_tape" not in src and "t_2" in src


def test_reuse_in_one_body_gradient_and_no_tape():
    x, y = rng.standard_normal(50), np.zeros(50)
    k = kadj.differentiate(reuse_in_one_body)
    check_grad(k, (x, y))
    assert "_tape" not in k.adjoint_source(x, y)


def test_two_sums_gradient_and_no_save():
    x, w = rng.standard_normal(40), rng.standard_normal(40)
    k = kadj.differentiate(two_sums)
    check_grad(k, (x, w))
    assert "_tape" not in k.adjoint_source(x, w)


@pytest.mark.parametrize("scale", [0.1, 3.0])
def test_while_then_reuse_gradient(scale):
    x, y = scale * rng.random(30), np.zeros(30)
    check_grad(kadj.differentiate(while_then_reuse), (x, y))


def test_jvp_and_hvp_of_a_kernel_with_reused_names():
    x, w = rng.standard_normal(20), rng.standard_normal(20)
    k = kadj.differentiate(two_sums)
    dx = rng.standard_normal(20)
    eps = 1e-6
    fd = (two_sums(x + eps * dx, w) - two_sums(x - eps * dx, w)) / (2 * eps)
    val, tan = kadj.jvp(k, (x, w), (dx, None))
    assert np.isclose(val, two_sums(x, w))
    assert np.isclose(tan, fd, rtol=1e-6, atol=1e-9)
    hv = kadj.hvp(k, argnums=0)(x, w, dx)
    g = kadj.grad(k, argnums=0)
    fd_h = (g(x + eps * dx, w) - g(x - eps * dx, w)) / (2 * eps)
    assert np.allclose(hv, fd_h, rtol=1e-5, atol=1e-7)
