"""kadj.counter_hint: ``_at_least(i, lo)`` is ``i``, with an LLVM assumption that it
is not below ``lo`` (the counter of a prange loop from a constant start)."""
import numba
import numpy as np
import pytest
from numba import njit

from kadj.counter_hint import _at_least


@njit
def _stencil_from(u, out, lo):
    for i_ in range(lo, u.shape[0] - 1):
        i = _at_least(i_, 1)
        out[i] = u[i - 1] - 2.0 * u[i] + u[i + 1]


def test_python_value_is_the_counter():
    assert _at_least(5, 2) == 5 and _at_least(np.int32(3), 0) == 3


@pytest.mark.parametrize("ty", [numba.int64, numba.int32, numba.uint64, numba.intp])
def test_compiled_value_and_type(ty):
    @njit
    def f(i):
        return _at_least(i, 2)
    assert f(ty(7)) == 7
    (sig,) = f.signatures
    assert f.overloads[sig].signature.return_type == ty


def test_the_assumption_reaches_llvm_and_the_loop_computes_as_written():
    u = np.random.default_rng(0).standard_normal(100)
    out = np.zeros(100)
    _stencil_from(u, out, 1)
    ref = np.zeros(100)
    ref[1:-1] = u[:-2] - 2.0 * u[1:-1] + u[2:]
    np.testing.assert_array_equal(out, ref)
    llvm = next(iter(_stencil_from.inspect_llvm().values()))
    assert "@llvm.assume(" in llvm
