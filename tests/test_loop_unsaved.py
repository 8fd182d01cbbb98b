"""A value a loop overwrites without recording it (an inner sum ``s += a[i, j] * v[j]``)
is saved once around the loop only when a reverse reads its value on entry to the loop
(kadj/analysis/loops.py: ``loop_saved``, ``loop_unsaved``).  Gradients against float64
finite differences; the saves counted in the generated adjoint and in the facts.
"""
import math

import numba
import numpy as np
import pytest
from numba import njit

import kadj
from kadj import ir, pipeline
from kadj.targets import cpu
from kadj.testing import check_grad

rng = np.random.default_rng(11)


@njit
def quad_rows(a, v):
    # s = 0.0 starts every row's sum: its value before the inner loop is never read
    n, m = a.shape
    tot = 0.0
    for i in range(n):
        s = 0.0
        for j in range(m):
            s = s + a[i, j] * v[j]
        tot += s * v[i]
    return tot


@njit
def exp_then_sum(a, v):
    # the inner loop starts from exp(v[i]), whose partial reads its own value: the
    # value on entry to the inner loop is read by the reverse of its assignment
    n, m = a.shape
    tot = 0.0
    for i in range(n):
        s = math.exp(v[i])
        for j in range(m):
            s = s + a[i, j] * v[j]
        tot += s * v[i]
    return tot


@njit
def read_between(a, v):
    # the product between the assignment and the loop reads s in its partials
    n, m = a.shape
    tot = 0.0
    for i in range(n):
        s = 0.5 * v[i]
        tot += s * s
        for j in range(m):
            s = s + a[i, j] * v[j]
        tot += s * v[i]
    return tot


@njit
def branch_before(a, v, c):
    # the assignment before the loop sits in an if: its value may be the entry value
    # of an earlier iteration, so the save stays
    n, m = a.shape
    tot = 0.0
    s = 1.0
    for i in range(n):
        if v[i] > c:
            s = v[i] * v[i]
        for j in range(m):
            s = s + a[i, j] * v[j]
        tot += s * v[i]
    return tot


def _facts(fn, *args):
    arg_types = tuple(numba.typeof(x) for x in args)
    out = pipeline.stages(cpu.CPU, kadj.differentiate(fn), arg_types, until="facts")
    return out["prepared"].kernel, out["facts"]


def _inner(kernel):
    outer = next(s for s in kernel.body if isinstance(s, ir.ForRange))
    return next(s for s in ir.walk(outer.body) if isinstance(s, ir.ForRange))


def _pushes(src):
    return src.count("_tape_f64[_sp_f64] = ")


@pytest.mark.parametrize("shape", [(1, 1), (4, 5), (60, 30)])
def test_a_sum_started_again_is_not_saved_around_its_loop(shape):
    a, v = rng.standard_normal(shape), rng.standard_normal(shape[0])
    v = np.resize(v, max(shape))[:max(shape)]
    k = kadj.differentiate(quad_rows)
    check_grad(k, (a, v))
    kernel, f = _facts(quad_rows, a, v)
    inner = _inner(kernel)
    assert f.loop_unsaved.get(inner.uid) == ("s",) and inner.uid not in f.loop_saved
    # one record per row (the row's final sum, read by tot's adjoint), none around
    # the inner loop
    assert _pushes(k.adjoint_source(a, v)) == 1


@pytest.mark.parametrize("fn", [exp_then_sum, read_between])
def test_an_entry_value_a_reverse_reads_stays_saved(fn):
    a, v = rng.standard_normal((6, 6)), 0.5 * rng.standard_normal(6)
    k = kadj.differentiate(fn)
    check_grad(k, (a, v))
    kernel, f = _facts(fn, a, v)
    inner = _inner(kernel)
    assert "s" in f.loop_saved.get(inner.uid, ()) and inner.uid not in f.loop_unsaved


@pytest.mark.parametrize("c", [-10.0, 0.0, 10.0])
def test_an_assignment_under_a_branch_keeps_the_save(c):
    a, v = rng.standard_normal((5, 5)), rng.standard_normal(5)
    check_grad(kadj.differentiate(branch_before), (a, v, c))
    kernel, f = _facts(branch_before, a, v, c)
    inner = _inner(kernel)
    assert inner.uid not in f.loop_unsaved
