"""The transforms (``kadj.grad(f)(x)``, ``kadj.value_and_grad``, ``kadj.jvp(f, ...)``,
``kadj.hvp(f)(x, v)``) of one jitted function, written inside an optimisation loop,
use the kernel they made of it the first time: its compiled adjoints are reused, not
loaded anew at every call (numba never frees compiled code).  ``kadj.differentiate``
itself makes a new kernel each time; the results stay right."""
import numpy as np
import pytest
from numba import njit

import kadj
from kadj import pipeline

pytestmark = pytest.mark.usefixtures("private_cache_dir")


@njit
def energy(x, a):
    s = 0.0
    for i in range(x.shape[0]):
        s += a * x[i] * x[i] + np.sin(x[i])
    return s


def test_transforms_share_one_kernel_and_differentiate_makes_new_ones():
    from kadj.api import _as_kernel
    k = _as_kernel(energy)
    assert _as_kernel(energy) is k and _as_kernel(k) is k
    assert kadj.differentiate(energy) is not k
    assert kadj.differentiate(energy) is not kadj.differentiate(energy)


def test_repeated_inline_transforms_compile_once():
    x, v = np.linspace(0.1, 1.0, 7), np.linspace(-1.0, 1.0, 7)
    expect = 2 * 0.3 * x + np.cos(x)
    np.testing.assert_allclose(kadj.grad(energy)(x, 0.3), expect, rtol=1e-12)
    kadj.jvp(energy, (x, 0.3), (v, 0.0))
    kadj.hvp(energy)(x, 0.3, v)
    before = dict(pipeline.RUNS)
    for _ in range(20):
        g = kadj.grad(energy)(x, 0.3)
        _, tangent = kadj.jvp(energy, (x, 0.3), (v, 0.0))
        hv = kadj.hvp(energy)(x, 0.3, v)
    assert dict(pipeline.RUNS) == before      # nothing typed, built or loaded again
    np.testing.assert_allclose(g, expect, rtol=1e-12)
    np.testing.assert_allclose(tangent, expect @ v, rtol=1e-12)
    np.testing.assert_allclose(hv, (2 * 0.3 - np.sin(x)) * v, rtol=1e-10)
