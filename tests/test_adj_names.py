"""Names after what they hold, and paired save/restore comments, in generated adjoints."""
import inspect

import numpy as np
from numba import njit

import kadj
import golden_kernels as gk


@njit
def scaled_copy(u, out, a):
    for i in range(u.shape[0]):
        out[i] = a * u[i]


@njit
def user_named_u_i(u, out):
    for i in range(u.shape[0]):
        u_i = 2.0 * u[i]
        out[i] = u_i * u[i]


@njit
def in_place_double(x):
    for i in range(x.shape[0]):
        x[i] = x[i] * x[i]


def test_loaded_and_stored_values_are_named_after_their_elements():
    k = kadj.differentiate(scaled_copy)
    u = np.linspace(0.5, 2.0, 6)
    src = k.adjoint_source(u, np.zeros(6), 3.0)
    assert "adj_out_i = adj_out[i]" in src
    assert "adj_t" not in src
    adj_u, adj_a = np.zeros(6), np.zeros(1)
    w = np.arange(1.0, 7.0)
    k.adjoint(u, np.zeros(6), 3.0, adj_u, w.copy(), adj_a)
    np.testing.assert_allclose(adj_u, 3.0 * w, rtol=1e-12)
    np.testing.assert_allclose(adj_a[0], (w * u).sum(), rtol=1e-12)


def test_a_kernel_variable_keeps_its_name():
    # the load u[i] would be named u_i, which the kernel's own variable has: the
    # variable keeps it, the temporary does not take it
    k = kadj.differentiate(user_named_u_i)
    u = np.linspace(0.5, 2.0, 5)
    src = k.adjoint_source(u, np.zeros(5))
    assert "u_i = 2.0 * " in src
    assert "u_i_2" not in src
    adj_u, w = np.zeros(5), np.linspace(1.0, 2.0, 5)
    k.adjoint(u, np.zeros(5), adj_u, w.copy())
    np.testing.assert_allclose(adj_u, 4.0 * u * w, rtol=1e-12)


def test_an_element_read_and_written_keeps_t_names():
    # x[i] holds two values in turn: no name after the element
    k = kadj.differentiate(in_place_double)
    x = np.linspace(0.5, 2.0, 4)
    src = k.adjoint_source(x.copy())
    assert "x_i" not in src
    adj_x = np.ones(4)
    k.adjoint(x.copy(), adj_x)
    np.testing.assert_allclose(adj_x, 2.0 * x, rtol=1e-12)


def test_saves_and_restores_are_paired_and_name_the_overwriting_line():
    lines, first = inspect.getsourcelines(gk.horner)
    line = first + next(n for n, t in enumerate(lines) if "p = p * x[i] + c[k]" in t)
    src = kadj.differentiate(gk.horner).adjoint_source(np.ones(3), np.ones(4), np.zeros(3))
    assert f"# save p (overwritten at golden_kernels.py:{line})" in src
    # one save and one restore per copy of the loop (the loop run eight iterations
    # side by side, kadj.lane_jam, and the plain loop of the leftover iterations)
    assert src.count("# save ") == src.count("# restore ") >= 1
    body = src.splitlines()
    restores = [n for n, t in enumerate(body) if t.strip() == "# restore p"]
    assert restores
    for at in restores:
        assert any(t.strip().startswith("p = _tape_f64[_sp_f64")
                   for t in body[at + 1:at + 10]), body[at:at + 10]


def test_a_lambda_kernel_gets_an_adjoint_named_as_an_identifier():
    """A lambda's ``__name__`` is ``<lambda>``: its adjoint and tangent functions are
    named ``_lambda__adjoint`` / ``_lambda__jvp`` (the generated source compiled; it
    was a SyntaxError)."""
    k = kadj.differentiate(njit(lambda x, a: a * np.sum(x * x)))
    x = np.arange(1.0, 4.0)
    assert "def _lambda__adjoint(" in k.adjoint_source(x, 2.0)
    gx, ga = np.zeros(3), np.zeros(1)
    k.adjoint(x, 2.0, gx, ga)
    np.testing.assert_allclose(gx, 4.0 * x)
    np.testing.assert_allclose(ga, [14.0])
    value, tangent = kadj.jvp(k, (x, 2.0), (np.ones(3), 0.0))
    assert value == 28.0 and tangent == 24.0
