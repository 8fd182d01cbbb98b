"""Small kernels with hand-written adjoints that follow the contract of a
differentiated kernel (forward, adjoint, adjoint_plan, recording on call), so the Tape
is tested independently of the code generator (tests/test_tape.py,
tests/test_tape_threads.py), and the finite differences they are compared with."""
import numpy as np

import kadj.tape
from kadj.plan import AdjointPlan


class FakeKernel:
    """A kernel with a hand-written adjoint that follows the kadj contract."""

    def __init__(self, fn, adjoint, arg_names, written, read, returns_value=False):
        self.fn, self.adj, self.arg_names = fn, adjoint, tuple(arg_names)
        self.written, self.read = frozenset(written), frozenset(read)
        self.returns_value = returns_value
        self.__name__ = fn.__name__

    def adjoint_plan(self, *args):
        floats = tuple(i for i, a in enumerate(args) if _is_float(a))
        return AdjointPlan(self.__name__, self.arg_names, floats, self.written,
                           self.read, self.returns_value)

    def forward(self, *args):
        return self.fn(*args)

    def adjoint(self, *args, adj_return=1.0):
        n = len(self.arg_names)
        kwargs = {"adj_return": adj_return} if self.returns_value else {}
        self.adj(args[:n], args[n:], **kwargs)

    def __call__(self, *args):  # as kadj.api.DifferentiatedKernel.__call__
        tape = kadj.tape.active()
        if tape is not None:
            return tape.record(self, args)
        kadj.tape.check_unrecorded(self, args)
        return self.forward(*args)


def _is_float(a):
    return np.asarray(a).dtype.kind == "f"


def fake(arg_names, written, read, returns_value=False):
    def wrap(fn):
        def with_adjoint(adj):
            return FakeKernel(fn, adj, arg_names, written, read, returns_value)
        return with_adjoint
    return wrap


# y = a * x
@fake(("x", "y", "a"), written={1}, read={0})
def scale(x, y, a):
    y[:] = a * x


@scale
def scale(fwd, adj):
    (x, y, a), (adj_x, adj_y, adj_a) = fwd, adj
    adj_x += a * adj_y
    adj_a[0] += np.sum(x * adj_y)
    adj_y[:] = 0.0


# y = y * y, in place
@fake(("y",), written={0}, read={0})
def square_inplace(y):
    y[:] = y * y


@square_inplace
def square_inplace(fwd, adj):
    (y,), (adj_y,) = fwd, adj
    adj_y *= 2.0 * y


# y += b * x
@fake(("x", "y", "b"), written={1}, read={0, 1})
def axpy(x, y, b):
    y += b * x


@axpy
def axpy(fwd, adj):
    (x, y, b), (adj_x, adj_y, adj_b) = fwd, adj
    adj_x += b * adj_y
    adj_b[0] += np.sum(x * adj_y)


# loss[0] = sum(x**2)
@fake(("x", "loss"), written={1}, read={0})
def sumsq(x, loss):
    loss[0] = np.sum(x * x)


@sumsq
def sumsq(fwd, adj):
    (x, loss), (adj_x, adj_loss) = fwd, adj
    adj_x += 2.0 * x * adj_loss[0]
    adj_loss[0] = 0.0


def fd_gradient(f, arrays, eps=1e-6):
    """Central differences of the scalar ``f(*copies)`` w.r.t. each array's elements."""
    grads = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a, dtype=np.float64)
        for j in np.ndindex(a.shape):
            plus = [b.copy() for b in arrays]
            minus = [b.copy() for b in arrays]
            plus[k][j] += eps
            minus[k][j] -= eps
            g[j] = (f(*plus) - f(*minus)) / (2 * eps)
        grads.append(g)
    return grads


def close(actual, desired):
    np.testing.assert_allclose(actual, desired, rtol=1e-7, atol=1e-9)
