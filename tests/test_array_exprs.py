"""Whole-array NumPy inside @njit kernels (kadj/array_lowering.py): element-wise
expressions, ufuncs, broadcasting, reductions, matrix products, slices, views, slice
assignment and in-place operators, lowered to element loops.  Gradients are checked
against float64 finite differences of the undecorated kernels (kadj.testing.check_grad,
bounds-checked adjoints); the forms still refused keep their located error."""
import numpy as np
import pytest
from numba import njit

import kadj
from kadj.testing import check_grad


def _rng():
    return np.random.default_rng(7)


@njit
def misfit(u, target, weight, loss):
    """A loss mixing a loop with whole-array operations."""
    n = u.shape[0]
    for i in range(1, n):
        u[i] += 0.3 * u[i - 1]
    d = u - target
    loss[0] = 0.5 * np.sum(d * d) + weight * np.sum(np.abs(d))


def test_loss_mixing_loops_and_arrays():
    r = _rng()
    check_grad(misfit, (r.standard_normal(9), r.standard_normal(9), 0.7, np.zeros(1)))


@njit
def elementwise(a, b, out):
    """Binary operators with scalars, unary minus, ** and the unary ufuncs."""
    out[:] = np.exp(-a) * np.sin(b) / (1.0 + a * a) + np.abs(b) ** 1.5 \
        - np.tanh(a) * np.cos(b) + np.log(a * a + 1.0) + np.sqrt(b * b + 2.0)


@pytest.mark.slow   # numba compiles many array-expression kernels; -m slow runs it
def test_elementwise_and_ufuncs():
    r = _rng()
    check_grad(elementwise, (r.standard_normal(5), r.standard_normal(5), np.zeros(5)))


@njit
def broadcast(A, w, b, c, out):
    """1-D against 2-D (trailing dimension), a size-1 array stretched, a column."""
    out[:, :] = A * w + b - c * A


@pytest.mark.slow   # numba compiles many array-expression kernels; -m slow runs it
def test_broadcasting():
    r = _rng()
    args = (r.standard_normal((3, 5)), r.standard_normal(5), r.standard_normal(1),
            r.standard_normal((3, 1)), np.zeros((3, 5)))
    check_grad(broadcast, args)


@njit
def reductions(x, y, z, A, B):
    """Whole-array reductions and products returning a float."""
    v = A @ x                      # 2-D @ 1-D
    M = A @ B                      # 2-D @ 2-D
    row = z @ A                    # 1-D @ 2-D
    return np.sum(x) + np.mean(A) + np.dot(x, y) + x @ y + np.max(x) - np.min(A) \
        + np.linalg.norm(y) + A.sum() + np.sum(v) + np.sum(M) + np.sum(row)


@pytest.mark.slow   # numba compiles many array-expression kernels; -m slow runs it
def test_reductions_and_products():
    r = _rng()
    x = np.array([0.3, -1.2, 2.5, 0.7])    # the maximum is not tied
    args = (x, r.standard_normal(4), r.standard_normal(3), r.standard_normal((3, 4)),
            r.standard_normal((4, 2)))
    check_grad(reductions, args)


@njit
def slices(a, A, k, out):
    """Read-only slices and views: offsets, steps, reversal, rows, columns, a
    variable (possibly negative) bound, a view of a view."""
    s = np.sum(a[1:-1] * a[2:]) + np.sum(a[::2]) + np.sum(a[::-1] * a) + np.sum(a[k:])
    for i in range(A.shape[0]):
        row = A[i, :]
        s += np.dot(row, a[:4]) + row[1] * 0.5
    col = A[:, 1]
    sub = A[1:, ::2]
    out[0] = s + np.sum(col * col) + np.sum(sub[0] * sub[1]) + sub.shape[1]


def test_slices_and_views():
    r = _rng()
    for k in (2, -3):
        check_grad(slices, (r.standard_normal(8), r.standard_normal((3, 4)), k,
                            np.zeros(1)))


@njit
def view_recurrence(m, a, out):
    """Elements of views at the kernel's own indices: ``w[k - 1]`` at ``k = 0`` is the
    view's last element (NumPy counts a negative index from the view's end), not the
    base array's element before the view."""
    w = m[1:, 2]
    for k in range(w.shape[0]):
        w[k] = w[k] + a * w[k - 1]
    r = m[2, ::2]
    for k in range(r.shape[0]):
        out[k] = r[-1 - k] * w[k]


def test_negative_indices_of_view_elements():
    r = _rng()
    m = r.uniform(0.5, 1.0, (5, 3))
    expected = m.copy()
    view_recurrence.py_func(expected, 0.7, np.zeros(2))
    got = m.copy()
    view_recurrence(got, 0.7, np.zeros(2))
    np.testing.assert_allclose(got, expected)
    check_grad(view_recurrence, (m, 0.7, np.zeros(2)))


@njit
def slice_stores(u, v, steps):
    """Assignments into slices, including a right-hand side that overlaps the
    destination (copied first, as NumPy does), and in-place operators on views."""
    for t in range(steps):
        u[1:-1] = u[1:-1] + 0.2 * (u[:-2] - 2.0 * u[1:-1] + u[2:])
    u[1:] = u[:-1]
    v[::2] += 2.0 * u[:3]
    v[1::2] *= u[1:4]
    v[0] = 1.5


@pytest.mark.slow   # numba compiles many array-expression kernels; -m slow runs it
def test_slice_assignment_and_in_place():
    r = _rng()
    check_grad(slice_stores, (r.standard_normal(6), r.standard_normal(6), 3))


@njit
def where_and_inplace(x, y, out):
    z = np.where(x > 0.0, x * y, -0.5 * x)
    z += y
    z *= 2.0
    out[:] = np.maximum(z, y)


def test_where_and_in_place_on_new_array():
    x = np.array([0.5, -1.0, 2.0, -0.3, 1.1])
    y = np.array([0.2, 0.4, -2.0, 3.0, 0.1])
    check_grad(where_and_inplace, (x, y, np.zeros(5)))


@njit
def axes_and_functions(A, B, x, y, lo, out):
    """Sums along a constant axis (keyword, positional, negative, the method form, of
    a 3-D array and of a view), running sums (function and method), an outer product
    and clipping (one bound an array, one a scalar), combined by loops."""
    c0 = np.sum(A, axis=0)
    r1 = A.sum(1)
    t = np.sum(B, axis=-2)
    v = np.sum(A[:, ::2], axis=1)
    cs = np.cumsum(x)
    cm = y.cumsum()
    o = np.outer(x, y)
    cl = np.clip(x, lo, 0.6)
    s = t[0, 1] * t[1, 0] + t[0, 0] ** 2 + c0[3] * t[1, 1]
    for i in range(3):
        s += r1[i] * cm[i] * c0[i] + v[i] * v[i] + o[i + 1, i] * o[i, i]
    for i in range(5):
        s += cs[i] * cs[i] * x[i] + cl[i] * cl[i] * x[i]
    out[0] = s


def test_axis_sums_cumsum_outer_clip():
    r = _rng()
    x = np.array([0.31, -0.72, 1.3, 0.05, -1.1])   # away from the clip bounds
    args = (r.standard_normal((3, 4)), r.standard_normal((2, 3, 2)), x,
            r.standard_normal(3), np.array([-0.5, -0.2, 0.4, -0.3, -0.9]), np.zeros(1))
    check_grad(axes_and_functions, args)


@njit
def small_misfit(x, t, loss):
    loss[0] = np.sum((x - t) ** 2)


def test_float32():
    r = _rng()
    x = r.standard_normal(7).astype(np.float32)
    t = r.standard_normal(7).astype(np.float32)
    check_grad(small_misfit, (x, t, np.zeros(1, np.float32)))


def test_lowered_to_loops():
    """The region tree holds element loops and scratch arrays only."""
    from kadj.frontend import type_cpu_kernel
    from kadj.structurize import structurize
    from kadj import ir
    from numba import typeof
    from numba.core import types

    args = (np.ones(4), np.ones(4), 0.5, np.zeros(1))
    tk = type_cpu_kernel(misfit, tuple(typeof(a) for a in args))
    k = structurize(tk)
    stmts = list(ir.walk(k.body))
    allocs = [s for s in stmts if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Alloc)]
    # d only: d * d and np.abs(d) are fused into the sums that read them
    # (kadj/array_fusion.py)
    assert len(allocs) == 1
    for s in stmts:                    # every load and store reads one element
        if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Op):
            assert s.expr.fn is not np.sum
            assert not any(isinstance(k.types.get(a.name), types.Array)
                           for a in s.expr.args if isinstance(a, ir.Var))
    loops = [s for s in ir.walk(k.body) if isinstance(s, ir.ForRange)]
    assert len(loops) == 1 + 1 + 2     # the user's loop; d; two sums


@njit
def variable_axis(A, k, out):
    out[:] = np.sum(A, axis=k)


@njit
def cumprod(x, out):
    out[:] = np.cumprod(x)


@njit
def cumsum_2d(A, out):
    out[:] = np.cumsum(A)


@njit
def cumsum_in_branches(x, flag, out):
    if flag:
        c = np.cumsum(x)
    else:
        c = np.cumsum(x * 2.0)
    out[0] = np.sum(c * x)


@njit
def fancy(x, idx, out):
    out[:] = x[idx]


@njit
def one_view_name_in_two_loops(f, out):
    # ``fk`` names another view in each loop; each read sees one (kadj.view_webs)
    q, n = f.shape
    s = 0.0
    for k in range(q):
        fk = f[k]
        s += fk[0] * fk[1]
    for k in range(q):
        fk = f[k]
        out[k] = fk[n - 1] * s


@njit
def one_view_name_in_each_arm(f, out, c):
    if c > 0:
        fk = f[0]
        out[0] = fk[0] * 2.0
    else:
        fk = f[1]
        out[0] = fk[1] * 3.0
    fk = f[2, 1:]
    out[1] = fk[0] * fk[1] * out[0]


def test_a_view_name_assigned_where_each_read_sees_one():
    r = np.random.default_rng(11)
    check_grad(one_view_name_in_two_loops, (r.standard_normal((3, 4)), np.zeros(3)))
    for c in (1.0, -1.0):
        check_grad(one_view_name_in_each_arm, (r.standard_normal((3, 4)), np.zeros(2), c))


@njit
def view_in_branches(x, y, c):
    if c > 0:
        s = x[1:]
    else:
        s = x[:-1]
    y[0] = np.sum(s)


@njit
def rebound(x, y):
    d = x * 2.0
    for i in range(3):
        d = d + x
    y[0] = d[0]


@pytest.mark.parametrize("kernel, args, words, line", [
    (view_in_branches, (np.ones(4), np.zeros(1), 1.0), "assigned in more than one place",
     "s = x[1:]"),
    (rebound, (np.ones(4), np.zeros(1)), "assigned again elsewhere", "d = x * 2.0"),
    (variable_axis, (np.ones((2, 3)), 0, np.zeros(3)), "not a constant integer",
     "np.sum(A, axis=k)"),
    (cumprod, (np.ones(3), np.zeros(3)), "whole-array call cumprod()", "np.cumprod(x)"),
    (cumsum_2d, (np.ones((2, 3)), np.zeros(6)), "more than one dimension",
     "np.cumsum(A)"),
    (cumsum_in_branches, (np.ones(3), True, np.zeros(1)), "assigned again elsewhere",
     "c = np.cumsum(x)"),
    (fancy, (np.ones(3), np.arange(3), np.zeros(3)), "fancy or boolean indexing",
     "x[idx]"),
])
def test_unsupported_forms_are_refused_with_their_line(kernel, args, words, line):
    with pytest.raises(kadj.DifferentiationError) as exc:
        check_grad(kernel, args)
    msg = str(exc.value)
    assert words in msg and "test_array_exprs.py" in msg and line in msg
