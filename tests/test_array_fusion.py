"""Element-wise NumPy expressions fused into one loop (kadj/array_fusion.py): the
intermediate results of an expression are computed where the next operation reads
them.  Each kernel's gradient is checked against float64 finite differences of the
undecorated kernel (kadj.testing.check_grad, bounds-checked adjoint), and the region
tree is checked for the scratch arrays and loops that remain."""
import numpy as np
import pytest
from numba import njit, typeof

import kadj
from kadj import ir
from kadj.frontend import type_cpu_kernel
from kadj.structurize import structurize
from kadj.testing import check_grad


def _tree(kernel, args):
    k = structurize(type_cpu_kernel(kernel, tuple(typeof(a) for a in args)))
    stmts = list(ir.walk(k.body))
    allocs = [s.target for s in stmts
              if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Alloc)]
    loops = [s for s in stmts if isinstance(s, ir.ForRange)]
    return allocs, loops


def _rng(seed=3):
    return np.random.default_rng(seed)


@njit
def diffuse(u, alpha, steps):
    for t in range(steps):
        u[1:-1] = u[1:-1] + alpha * (u[:-2] - 2.0 * u[1:-1] + u[2:])


@pytest.mark.parametrize("n", [3, 4, 17, 2000])
def test_update_of_an_array_from_its_own_neighbours(n):
    # five operations, one loop computing the right-hand side into one scratch array
    # (it reads u at other offsets than it writes: NumPy computes it first) and the
    # loop storing it
    u = _rng(n).standard_normal(n)
    allocs, loops = _tree(diffuse, (u, 0.2, 3))
    assert len(allocs) == 1 and len(loops) == 1 + 2
    check_grad(diffuse, (u, 0.2, 3))


@njit
def shifted_inplace(y, c):
    y[1:] += y[:-1] * c
    y[:-1] -= np.sin(y[1:]) * c


def test_inplace_operator_reading_the_destination_elsewhere():
    # NumPy computes ``y[:-1] * c`` before adding it into ``y[1:]`` (no running sum):
    # the fused products read y, so each is computed into a scratch array first
    # (``np.sin(y[1:]) * c`` in one loop); the sums are copied before they are stored
    # back into y (numba's in-place operator on a slice)
    y = _rng().standard_normal(11)
    allocs, loops = _tree(shifted_inplace, (y, 0.7))
    assert len(allocs) == 4 and len(loops) == 8
    assert sum(a.startswith("$binop_mul") for a in allocs) == 2
    check_grad(shifted_inplace, (y, 0.7))
    want = y.copy()
    want[1:] += want[:-1] * 0.7
    want[:-1] -= np.sin(want[1:]) * 0.7
    got = y.copy()
    shifted_inplace(got, 0.7)
    np.testing.assert_allclose(got, want, rtol=1e-15)


@njit
def axpy_into(x, y, a, out):
    out[:] = a * x + np.exp(y) * 0.5


def test_chain_into_another_array():
    # nothing of out is read: the whole right-hand side is computed in the loop that
    # stores it, no scratch array at all
    r = _rng()
    x, y = r.standard_normal(9), r.standard_normal(9)
    allocs, loops = _tree(axpy_into, (x, y, 0.3, np.zeros(9)))
    assert allocs == [] and len(loops) == 1
    check_grad(axpy_into, (x, y, 0.3, np.zeros(9)))


@njit
def reductions(x, y, loss):
    loss[0] = np.sum((x - y) ** 2) + 0.5 * np.mean(np.abs(x * y)) + \
        0.25 * np.max(np.tanh(x) * y) + 0.1 * np.linalg.norm(x - 2.0 * y)


def test_reductions_of_expressions():
    # each reduction loop computes the elements of its operand: no scratch array
    r = _rng()
    x, y = r.standard_normal(13), r.standard_normal(13)
    allocs, loops = _tree(reductions, (x, y, np.zeros(1)))
    assert allocs == [] and len(loops) == 4
    check_grad(reductions, (x, y, np.zeros(1)))


@njit
def broadcast_rows(A, r, B, loss):
    C = A * r + B[0:1, :] * 2.0
    loss[0] = np.sum(C * C * r)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (40, 30)])
def test_broadcasting_through_fused_operands(shape):
    # r (a row) and B[0:1, :] (one row) stretch over A's rows inside the fused element;
    # C, a variable of the source read by one statement only, is fused as well
    r = _rng(shape[0])
    m, n = shape
    args = (r.standard_normal((m, n)), r.standard_normal(n),
            r.standard_normal((m, n)), np.zeros(1))
    allocs, _ = _tree(broadcast_rows, args)
    assert allocs == []
    check_grad(broadcast_rows, args)


@njit
def where_and_ints(x, k, loss):
    s = np.where(x > 0.0, x * 2.0, np.exp(x))
    loss[0] = np.sum(s * s) + x[0] * np.max(k * 2 - 1)


def test_where_and_an_integer_max_of_fused_operands():
    # np.max of an int expression starts from its first element, computed from the
    # fused operands before the loop; s is read by one statement: fused too
    r = _rng()
    x = r.standard_normal(10)
    k = r.integers(-5, 5, 10)
    allocs, _ = _tree(where_and_ints, (x, k, np.zeros(1)))
    assert allocs == []
    check_grad(where_and_ints, (x, k, np.zeros(1)), wrt=("x",))


@njit
def matmul_of_expression(W, x, out):
    out[:] = np.tanh(W @ (x + 1.0))


def test_operand_of_a_matrix_product_is_not_fused():
    # a matrix product reads each element of its operand many times: x + 1.0 stays
    # a scratch array, and so does the product; np.tanh is computed in the loop that
    # stores out
    r = _rng()
    args = (r.standard_normal((4, 3)), r.standard_normal(3), np.zeros(4))
    allocs, _ = _tree(matmul_of_expression, args)
    assert len(allocs) == 2
    check_grad(matmul_of_expression, args)


@njit
def reused_temporary(x, out):
    d = x * 2.0            # read by two operations (d * d, then + d): kept
    out[:] = d * d + d


@njit
def later_store(x, y, out):
    d = x * 2.0            # read by one operation, but x is written in between: d
    x[0] = 1.0             # keeps the old x[0]
    out[:] = d * y


def test_variables_read_by_two_operations_or_after_a_store_are_not_fused():
    r = _rng()
    args = (r.standard_normal(5), r.standard_normal(5), np.zeros(5))
    allocs, _ = _tree(later_store, args)
    assert allocs == ["d"]
    check_grad(later_store, args)
    r = _rng()
    allocs, _ = _tree(reused_temporary, (r.standard_normal(5), np.zeros(5)))
    assert allocs == ["d"]
    check_grad(reused_temporary, (r.standard_normal(5), np.zeros(5)))


@njit
def mismatched(a, b, out):
    out[:] = (a + 1.0) * b


def test_shapes_still_checked_where_each_operation_stands():
    k = kadj.differentiate(mismatched)
    with pytest.raises(ValueError):
        k.adjoint(np.ones(4), np.ones(3), np.zeros(4), np.zeros(4), np.zeros(3),
                  np.ones(4))
