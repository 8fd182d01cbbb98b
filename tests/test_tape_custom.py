"""Custom steps (Python code between launches, with their own adjoints) against
finite differences of the whole sequence."""
import numba
import numpy as np
import pytest

import kadj
from kadj.errors import DifferentiationError

N = 9
RNG = np.random.default_rng(3)
X0 = RNG.random(N) + 0.5
TARGET = RNG.random(N)


@kadj.differentiate
@numba.njit
def heat(u, v, alpha):
    for i in range(1, u.shape[0] - 1):
        v[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1]) + 0.1 * u[i] * u[i]
    v[0] = u[0]
    v[u.shape[0] - 1] = u[u.shape[0] - 1]


@kadj.differentiate
@numba.njit
def sqloss(u, target, out):
    s = 0.0
    for i in range(u.shape[0]):
        s += (u[i] - target[i]) ** 2 * (i + 1.0)
    out[0] = s


def dirichlet(u, tape=None):
    def forward():
        u[0] = 0.0
        u[-1] = 0.0

    def adjoint(adj_u):
        adj_u[0] = 0.0
        adj_u[-1] = 0.0

    if tape is None:
        forward()
    else:
        tape.record_custom(forward, adjoint, reads=(u,), writes=(u,))


def heat_bc(x0, tape=None, steps=4):
    u, v, out = x0, np.zeros(N), np.zeros(1)
    for _ in range(steps):
        heat(u, v, 0.2)
        dirichlet(v, tape)
        u, v = v, u
    sqloss(u, TARGET, out)
    return out, u


def fd(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for k in range(x.size):
        xp, xm = x.copy(), x.copy()
        xp[k] += eps
        xm[k] -= eps
        g[k] = (f(xp) - f(xm)) / (2 * eps)
    return g


def test_dirichlet_boundary_between_launches():
    x0 = X0.copy()
    with kadj.Tape() as tape:
        out, _ = heat_bc(x0, tape)
    tape.backward(out)
    ref = fd(lambda x: heat_bc(x)[0][0], X0)
    np.testing.assert_allclose(tape.grad(x0), ref, rtol=1e-6, atol=1e-9)
    assert np.abs(ref).max() > 1e-3


def test_unrecorded_boundary_is_refused():
    x0 = X0.copy()
    with kadj.Tape() as tape:
        u, v, out = x0.copy(), np.zeros(N), np.zeros(1)
        heat(u, v, 0.2)
        dirichlet(v)                      # not recorded
        sqloss(v, TARGET, out)
    with pytest.raises(DifferentiationError, match="changed outside the recorded"):
        tape.backward(out)


def scaled(x0, tape=None, factor=-1.7):
    """heat(x -> a); b = factor * a (custom); heat(b -> c); loss(c)."""
    a, b, c, out = np.zeros(N), np.zeros(N), np.zeros(N), np.zeros(1)
    heat(x0, a, 0.3)

    def forward():
        np.multiply(a, factor, out=b)
        return "done"

    def adjoint(adj_a, adj_b):
        adj_a += factor * adj_b
        adj_b[:] = 0.0

    if tape is None:
        forward()
    else:
        assert tape.record_custom(forward, adjoint, reads=(a,), writes=(b,)) == "done"
    heat(b, c, 0.3)
    heat(a, b, 0.1)                       # overwrites b: the custom step's write
    sqloss(c, TARGET, out)
    return out


def test_scaling_step_against_finite_differences():
    x0 = X0.copy()
    with kadj.Tape() as tape:
        out = scaled(x0, tape)
    tape.backward(out)
    ref = fd(lambda x: scaled(x)[0], X0)
    np.testing.assert_allclose(tape.grad(x0), ref, rtol=1e-6, atol=1e-9)


def test_custom_step_with_values():
    """A nonlinear custom step (w = u**3 in place) that asks for its inputs."""
    def run(x0, tape=None):
        u, v, out = np.zeros(N), np.zeros(N), np.zeros(1)
        heat(x0, u, 0.2)

        def forward():
            u[:] = u ** 3

        def adjoint(u_before, adj_u):
            adj_u *= 3.0 * u_before ** 2

        if tape is None:
            forward()
        else:
            tape.record_custom(forward, adjoint, reads=(u,), writes=(u,), values=True)
        heat(u, v, 0.2)
        sqloss(v, TARGET, out)
        return out

    x0 = X0.copy()
    with kadj.Tape() as tape:
        out = run(x0, tape)
    tape.backward(out)
    np.testing.assert_allclose(tape.grad(x0), fd(lambda x: run(x)[0], X0),
                               rtol=1e-6, atol=1e-9)


def test_custom_step_inside_checkpointed_loop():
    def step(i, u, v):
        heat(u, v, 0.2)
        kadj.custom_step(lambda: v.__setitem__(0, 0.0),
                         lambda adj_v: adj_v.__setitem__(0, 0.0),
                         reads=(v,), writes=(v,), name="left_boundary")
        return v, u

    def run(x0, checkpoint):
        u0, v0, out = x0.copy(), np.zeros(N), np.zeros(1)
        with kadj.Tape() as tape:
            if checkpoint:
                u, _ = kadj.checkpointed_loop(step, (u0, v0), steps=7, snapshots=2)
            else:
                u, v = u0, v0
                for i in range(7):
                    u, v = step(i, u, v)
            sqloss(u, TARGET, out)
        tape.backward(out)
        return tape.grad(u0)

    ref = run(X0, False)
    np.testing.assert_allclose(run(X0, True), ref, rtol=1e-12, atol=1e-15)
    assert np.abs(ref).max() > 0


def test_custom_step_arguments_are_checked():
    with pytest.raises(DifferentiationError, match="must list arrays"):
        kadj.Tape().record_custom(lambda: None, lambda: None, reads=(1.0,))
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(DifferentiationError, match="read-only"):
        kadj.Tape().record_custom(lambda: None, lambda a: None, writes=(ro,))


def test_custom_adjoint_arity_is_checked_when_recorded():
    """An adjoint that cannot take one buffer per distinct array (after their earlier
    contents with values=True) is refused when recorded, before forward runs (was a raw
    TypeError at backward); one whose signature cannot be read is accepted."""
    u, v = np.zeros(3), np.zeros(3)
    ran = []
    cases = [(lambda: None, {}, "signature \\(\\), but the backward calls it with 2 "
                                "adjoint buffers, one per distinct array of reads \\+ "
                                "writes"),
             (lambda a, b: None, {"values": True}, "with 4 arguments: the 2 arrays' "
                                                    "contents from before forward"),
             (lambda a, b, c: None, {}, "signature \\(a, b, c\\)")]
    for adjoint, options, match in cases:
        with kadj.Tape() as tape:
            with pytest.raises(DifferentiationError,
                               match="^Custom step 'fwd': its adjoint '<lambda>' has the "
                               ".*" + match):
                tape.record_custom(lambda: ran.append(1), adjoint, reads=(u,),
                                   writes=(u, v), name="fwd", **options)
        assert not tape.launches and not ran
    with kadj.Tape() as tape:
        with pytest.raises(DifferentiationError, match="calls it with 1 adjoint buffer,"):
            kadj.custom_step(lambda: ran.append(1), lambda: None, writes=v)
    assert not tape.launches and not ran
    with kadj.Tape() as tape:                   # accepted: *args, and no signature
        tape.record_custom(lambda: None, lambda *adj: None, reads=(u,), writes=(v,))
        tape.record_custom(lambda: None, lambda a, b, c=0: None, reads=(u,), writes=(v,))
        tape.record_custom(lambda: None, max, reads=(u,), writes=(v,))
    assert len(tape.launches) == 3
