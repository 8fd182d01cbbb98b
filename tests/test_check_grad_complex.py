"""check_grad on complex arguments: each complex element is probed in its real and its
imaginary direction (the adjoint holds dL/dx + i dL/dy, the convention of kadj, Zygote
and PyTorch), so a correct complex kernel passes and a rule that forgets the conjugate
(g * f'(z) instead of g * conj(f'(z))) fails, naming the element and part; kadj.jvp
takes complex tangents."""
from __future__ import annotations

import cmath
import re

import numba
import numpy as np
import pytest

import kadj
from kadj.testing import check_grad


pytestmark = pytest.mark.usefixtures("private_cache_dir")


@numba.njit
def cube_right(z):
    return z * z * z


@numba.njit
def cube_wrong(z):
    return z * z * z


@kadj.register_adjoint(cube_right)
def _cube_right(g, out, z):
    return (g * kadj.ops.conj(3.0 * z * z),)


@kadj.register_adjoint(cube_wrong)
def _cube_wrong(g, out, z):
    return (g * (3.0 * z * z),)     # the conjugate forgotten: wrong off the real axis


@numba.njit
def _cubes_right(z, c, out):
    for i in range(z.shape[0]):
        out[i] = c * cube_right(z[i]) + z[i].conjugate() * cmath.exp(z[i])


@numba.njit
def _cubes_wrong(z, c, out):
    for i in range(z.shape[0]):
        out[i] = c * cube_wrong(z[i]) + z[i].conjugate() * cmath.exp(z[i])


def _args(dtype=np.complex128):
    rng = np.random.default_rng(3)
    z = (rng.uniform(0.3, 1.2, 5) + 1j * rng.uniform(-1, 1, 5)).astype(dtype)
    return z, dtype(0.4 - 0.7j), np.zeros(5, dtype)


def test_check_grad_passes_a_correct_complex_kernel():
    res = check_grad(kadj.differentiate(_cubes_right), _args())
    assert res.precision == "float64" and res.jacobian_checked
    assert res.inputs == ("z", "c", "out")
    assert res.max_rel_error < 1e-6


def test_check_grad_fails_a_complex_rule_without_the_conjugate():
    with pytest.raises(AssertionError, match=r"_cubes_wrong.*\bz\b") as info:
        check_grad(kadj.differentiate(_cubes_wrong), _args())
    assert ".imag" in str(info.value) or ".real" in str(info.value), str(info.value)


def test_check_grad_complex64_and_a_complex_scalar_probe():
    res = check_grad(kadj.differentiate(_cubes_right), _args(np.complex64), wrt="c")
    assert res.precision == "float32" and res.inputs == ("c",)


def test_conjugate_method_is_np_conj():
    k = kadj.differentiate(_cubes_right)
    src = k.adjoint_source(*_args())
    assert re.search(r"= np\.conj(ugate)?\(z\[i\]\)$", src, re.M), src


@numba.njit
def _energy(z, c):
    s = 0.0
    for i in range(z.shape[0]):
        w = c * z[i]
        s += w.real ** 2 + w.imag
    return s


def test_functional_jvp_takes_complex_tangents():
    """``kadj.jvp`` with a complex array and a complex scalar tangent, against central
    differences along them."""
    z, c, _ = _args()
    rng = np.random.default_rng(4)
    dz = rng.standard_normal(5) + 1j * rng.standard_normal(5)
    dc = complex(0.3, -1.1)
    value, tangent = kadj.jvp(_energy, (z, c), (dz, dc))
    h = 1e-6
    fd = (_energy(z + h * dz, c + h * dc) - _energy(z - h * dz, c - h * dc)) / (2 * h)
    assert value == pytest.approx(_energy(z, c), rel=1e-12)
    assert tangent == pytest.approx(fd, rel=1e-6)
