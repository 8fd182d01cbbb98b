"""tape.backward(loss, wrt=[...]): only the adjoints on a path from the seeds back to
the requested inputs run; their gradients equal the full backward's."""
import numba
import numpy as np
import pytest

import kadj
from kadj.errors import DifferentiationError

N = 8
RNG = np.random.default_rng(11)
U0, W0, Z0 = RNG.random(N) + 0.5, RNG.random(N) + 0.5, RNG.random(N)


@kadj.differentiate
@numba.njit
def adv(u, v, alpha):
    for i in range(1, u.shape[0] - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + 0.1 * u[i] * u[i]
    v[0] = u[0]
    v[u.shape[0] - 1] = u[u.shape[0] - 1]


@kadj.differentiate
@numba.njit
def adv_w(w, z, beta):
    for i in range(w.shape[0]):
        z[i] = w[i] * (1.0 + beta * w[i])


@kadj.differentiate
@numba.njit
def loss2(u, w, out):
    s = 0.0
    for i in range(u.shape[0]):
        s += u[i] * u[i] * (i + 1.0) + w[i] * u[i]
    out[0] = s


@kadj.differentiate
@numba.njit
def square(x, y):
    for i in range(x.shape[0]):
        y[i] = x[i] * x[i]


def two_fields(u0, w0, tape_kw=None):
    us = [u0.copy()] + [np.zeros(N) for _ in range(3)]
    ws = [w0.copy()] + [np.zeros(N) for _ in range(3)]
    out, diag = np.zeros(1), np.zeros(N)
    with kadj.Tape(**(tape_kw or {})) as tape:
        for k in range(3):
            adv(us[k], us[k + 1], 0.2)
            adv_w(ws[k], ws[k + 1], 0.3)
        loss2(us[3], ws[3], out)
        square(us[3], diag)          # feeds nothing seeded
    return tape, us, ws, out


def fd(f, x, eps=1e-6):
    return np.array([(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in np.eye(len(x))])


def counting(monkeypatch, kernel, counts):
    inner = kernel.adjoint_trusted

    def wrapped(*a, **k):
        counts[kernel.__name__] = counts.get(kernel.__name__, 0) + 1
        return inner(*a, **k)
    monkeypatch.setattr(kernel, "adjoint_trusted", wrapped)


def test_wrt_skips_the_branch_that_does_not_lead_to_the_input(monkeypatch):
    full, us, ws, out = two_fields(U0, W0)
    full.backward(out)
    tape, us2, ws2, out2 = two_fields(U0, W0)
    counts = {}
    for k in (adv, adv_w, loss2, square):
        counting(monkeypatch, k, counts)
    tape.backward(out2, wrt=[us2[0]])
    # w's kernels never feed u0's path; the diagnostic feeds nothing seeded
    assert counts == {"adv": 3, "loss2": 1}
    g = tape.grad(us2[0])
    np.testing.assert_array_equal(g, full.grad(us[0]))
    ref = fd(lambda x: _loss(x, W0), U0)
    np.testing.assert_allclose(g, ref, rtol=1e-6, atol=1e-7)
    with pytest.raises(DifferentiationError, match="wrt="):
        tape.grad(ws2[0])
    with pytest.raises(DifferentiationError, match="wrt="):
        tape.scalar_grad("beta")


def _loss(u0, w0):
    tape, us, ws, out = two_fields(u0, w0)
    return out[0]


def test_wrt_scalar_name_and_arrays_together(monkeypatch):
    full, us, ws, out = two_fields(U0, W0)
    full.backward(out)
    tape, us2, ws2, out2 = two_fields(U0, W0)
    counts = {}
    for k in (adv, adv_w, loss2, square):
        counting(monkeypatch, k, counts)
    tape.backward(out2, wrt=["beta", ws2[0]])
    assert counts == {"adv_w": 3, "loss2": 1}
    assert tape.scalar_grad("beta") == pytest.approx(full.scalar_grad("beta"), rel=1e-12)
    np.testing.assert_allclose(tape.grad(ws2[0]), full.grad(ws[0]), rtol=1e-12)
    with pytest.raises(DifferentiationError, match="wrt="):
        tape.scalar_grad("alpha")
    with pytest.raises(DifferentiationError, match="wrt="):
        tape.grad(us2[0])


def test_a_requested_scalar_off_the_path_to_the_seeds_has_a_zero_gradient():
    # beta is requested, but the launch that takes it does not lead to the seeded
    # array: 0.0 as from a full backward, not "no recorded launch has a differentiable
    # scalar argument 'beta'" (a regression)
    def run():
        u, w = U0.copy(), W0.copy()
        u1, w1, diag = np.zeros(N), np.zeros(N), np.zeros(N)
        with kadj.Tape() as tape:
            adv(u, u1, 0.2)
            adv_w(w, w1, 0.3)
            square(u1, diag)
        return tape, u, diag

    tape, u, diag = run()
    tape.backward(seeds=[(diag, np.ones(N))], wrt=["beta", u])
    assert tape.scalar_grad("beta") == 0.0
    full, u_f, diag_f = run()
    full.backward(seeds=[(diag_f, np.ones(N))])
    assert full.scalar_grad("beta") == 0.0
    np.testing.assert_allclose(tape.grad(u), full.grad(u_f), rtol=1e-12)


def test_overwritten_array_keeps_the_adjoint_that_consumes_it(monkeypatch):
    """k = x^2; y = k^2; k = z^2 (overwrites k, independent of x); loss of k and y.
    wrt=[x]: the overwrite must still run its adjoint (it consumes k's later
    cotangent), or k's earlier version would get the later one's cotangent."""
    def run(x):
        k, y, out = np.zeros(N), np.zeros(N), np.zeros(1)
        with kadj.Tape() as tape:
            square(x, k)
            square(k, y)
            square(Z0, k)
            loss2(k, y, out)
        return tape, out
    x0 = U0.copy()
    tape, out = run(x0)
    tape.backward(out, wrt=[x0])
    full_tape, full_out = run(U0.copy())
    full_tape.backward(full_out)
    np.testing.assert_allclose(tape.grad(x0), fd(lambda x: run(x)[1][0], U0),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(tape.grad(x0), full_tape.grad(
        full_tape.launches[0].args[0]))


def test_wrt_refuses_what_the_tape_cannot_give():
    tape, us, ws, out = two_fields(U0, W0)
    with pytest.raises(DifferentiationError, match="never saw"):
        tape.backward(out, wrt=[np.zeros(3)])
    with pytest.raises(DifferentiationError, match="gamma"):
        tape.backward(out, wrt=["gamma"])
    with pytest.raises(DifferentiationError, match="list of recorded arrays"):
        tape.backward(out, wrt=[1.5])


def test_gradients_add_up_only_for_what_every_call_requested():
    tape, us, ws, out = two_fields(U0, W0)
    tape.backward(out)
    tape.backward(out, wrt=[us[0]])
    full, us2, ws2, out2 = two_fields(U0, W0)
    full.backward(out2)
    np.testing.assert_allclose(tape.grad(us[0]), 2 * full.grad(us2[0]), rtol=1e-12)
    with pytest.raises(DifferentiationError, match="wrt="):
        tape.grad(ws[0])
    tape.zero()
    tape.backward(out)
    np.testing.assert_allclose(tape.grad(ws[0]), full.grad(ws2[0]), rtol=1e-12)


@kadj.differentiate
@numba.njit
def make_kappa(p, kappa):
    for i in range(kappa.shape[0]):
        kappa[i] = 0.5 + 0.4 * np.tanh(p[i])


@kadj.differentiate(wrt=("u",))
@numba.njit
def diffuse_u_only(u, kappa, v):
    for i in range(u.shape[0]):
        v[i] = u[i] * kappa[i] + np.sin(u[i])


@kadj.differentiate
@numba.njit
def sq(v, out):
    s = 0.0
    for i in range(v.shape[0]):
        s += v[i] * v[i]
    out[0] = s


def test_a_kernel_wrt_that_cuts_the_chain_is_refused():
    """kappa is computed by a recorded launch from p, then read by a kernel whose wrt
    leaves kappa out: the gradient of p would miss that path (it came out zero, with
    no error).  Refused, naming both launches; a copy of kappa passed instead is a
    constant, and backward(wrt=[u]) needs no gradient through kappa."""
    p, u = RNG.random(N) - 0.5, RNG.random(N)
    kappa, v, out = np.zeros(N), np.zeros(N), np.zeros(1)
    with kadj.Tape() as tape:
        make_kappa(p, kappa)
        diffuse_u_only(u, kappa, v)
        sq(v, out)
    with pytest.raises(DifferentiationError, match=r"reads argument 'kappa', which "
                       r"launch #0 \(kernel 'make_kappa'\) wrote") as info:
        tape.backward(out)
    assert "in wrt" in str(info.value) and "pass a copy" in str(info.value)
    tape.backward(out, wrt=[u])                      # no path through kappa asked for
    assert np.allclose(tape.grad(u), 2 * v * (kappa + np.cos(u)))
    with kadj.Tape() as tape:
        make_kappa(p, kappa)
        diffuse_u_only(u, kappa.copy(), v)           # a constant, by the user's choice
        sq(v, out)
    tape.backward(out)
    assert np.allclose(tape.grad(u), 2 * v * (kappa + np.cos(u)))
