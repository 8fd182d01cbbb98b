"""Complex values on the CPU: the rule table over complex domains, and kernels against
complex128 central finite differences in the real and imaginary directions.

Convention: the adjoint of a complex z = x + iy holds dL/dx + i dL/dy."""
import cmath
import math

import numba
import numpy as np
import pytest

import kadj
from kadj.rules import RULES


pytestmark = pytest.mark.usefixtures("private_cache_dir")


# ---- rules over complex domains ----------------------------------------------------------
def _complex_rules():
    seen, out = set(), []
    for r in RULES.values():
        if r.complex_domain and id(r) not in seen:
            seen.add(id(r))
            out.append(r)
    return out


COMPLEX_RULES = _complex_rules()


def _primal(rule, args):
    for key, r in RULES.items():
        if r is rule and callable(key):
            try:
                v = complex(key(*args))
            except Exception:
                continue
            if cmath.isfinite(v):
                return key
    pytest.fail(f"no key of rule {rule.name} is callable on complex {args}")


def test_some_rules_hold_on_complex_values():
    names = {r.name for r in COMPLEX_RULES}
    assert {"mul", "truediv", "exp", "log", "sqrt", "sin", "abs", "conj", "real", "imag",
            "phase"} <= names


@pytest.mark.parametrize("rule", COMPLEX_RULES, ids=[r.name for r in COMPLEX_RULES])
def test_rule_matches_finite_differences_on_complex(rule):
    """For L = Re(conj(g) * f(z)), dL/dx_j + i dL/dy_j == rule contribution j."""
    rng = np.random.default_rng(len(rule.name))
    for _ in range(4):
        args = [complex(rng.uniform(*re), rng.uniform(*im)) for re, im in rule.complex_domain]
        f = _primal(rule, args)
        out = complex(f(*args))
        g = complex(rng.standard_normal(), rng.standard_normal())
        if isinstance(f(*args), (float, np.floating)):
            g = g.real       # a real result has a real cotangent
        contribs = rule.vjp(g, out, *args)

        def loss(a):
            return (np.conj(g) * complex(f(*a))).real

        for j, c in enumerate(contribs):
            if c is None:
                continue
            fd = 0j
            for d in (1.0, 1j):
                h = 1e-6
                ap, am = list(args), list(args)
                ap[j] += h * d
                am[j] -= h * d
                fd += d * (loss(ap) - loss(am)) / (2 * h)
            assert abs(complex(c) - fd) <= 1e-5 * max(1.0, abs(fd)), (
                f"{rule.name} ({f!r}) arg{j} at {args}, g={g}: rule {c}, fd {fd}")


# ---- kernels ----------------------------------------------------------------------------
def _fd_grad(f, args, wrt, h=1e-6):
    """d f / d Re + i d f / d Im of argument ``wrt`` (an array), by central differences."""
    x = args[wrt]
    g = np.zeros(x.shape, np.complex128)
    for idx in np.ndindex(x.shape):
        for d in (1.0, 1j):
            ap = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            am = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            ap[wrt][idx] += h * d
            am[wrt][idx] -= h * d
            g[idx] += d * (f(*ap) - f(*am)) / (2 * h)
    return g


@kadj.differentiate
@numba.njit
def dft_power(x, out):
    """An FFT-free DFT, and a real loss of its coefficients."""
    n = x.shape[0]
    s = 0.0
    for k in range(n):
        acc = 0j
        for j in range(n):
            w = cmath.exp(-2j * np.pi * k * j / n)
            acc += x[j] * w
        out[k] = acc
        s += abs(acc) ** 2 + acc.real * acc.imag
    return s


@kadj.differentiate
@numba.njit
def split_step(psi, v, dt, out):
    """One Schroedinger split step: the potential's phase per point, then a kinetic
    stencil; the loss is the norm of the result weighted by the position."""
    n = psi.shape[0]
    for i in range(n):
        out[i] = psi[i] * cmath.exp(-1j * v[i] * dt)
    s = 0.0
    for i in range(1, n - 1):
        lap = out[i - 1] - 2.0 * out[i] + out[i + 1]
        phi = out[i] + 0.5j * dt * lap
        s += i * (phi * np.conj(phi)).real
    return s


@kadj.differentiate
@numba.njit
def wave(u, c, out):
    """A complex-coefficient wave stencil; loss |out|^2 summed."""
    n = u.shape[0]
    s = 0.0
    for i in range(1, n - 1):
        out[i] = u[i] + c * (u[i - 1] - 2.0 * u[i] + u[i + 1])
        s += out[i].real ** 2 + out[i].imag ** 2
    return s


@kadj.differentiate
@numba.njit
def mixes(z, r):
    s = 0.0
    for i in range(z.shape[0]):
        w = np.conj(z[i]) * r[i] + cmath.sqrt(z[i]) - cmath.log(z[i]) * 1j
        s += abs(w) + w.imag * z[i].real + (cmath.sin(z[i]) / z[i]).real
    return s


def _adjoint(k, args):
    adj = [np.zeros_like(a) if isinstance(a, np.ndarray) else
           np.zeros(1, np.asarray(a).dtype) for a in args]
    k.adjoint(*[a.copy() if isinstance(a, np.ndarray) else a for a in args], *adj,
              adj_return=1.0)
    return adj


def _rc(rng, n, dtype=np.complex128):
    return (rng.uniform(0.3, 1.5, n) + 1j * rng.uniform(-1, 1, n)).astype(dtype)


def _close(a, b, rtol=1e-6):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * np.max(np.abs(b)))


def test_dft_against_finite_differences():
    rng = np.random.default_rng(1)
    x, out = _rc(rng, 5), np.zeros(5, np.complex128)
    adj = _adjoint(dft_power, (x, out))
    _close(adj[0], _fd_grad(lambda x, o: dft_power(x, o), [x, out], 0))


def test_split_step_against_finite_differences():
    rng = np.random.default_rng(2)
    psi, v, out = _rc(rng, 6), rng.uniform(-1, 1, 6), np.zeros(6, np.complex128)
    dt = 0.3
    adj = _adjoint(split_step, (psi, v, dt, out))
    f = lambda p, v, d, o: split_step(p, v, d, o)   # noqa: E731
    _close(adj[0], _fd_grad(f, [psi, v, dt, out], 0))
    assert adj[1].dtype == np.float64     # a real argument's adjoint stays real
    fd_v = _fd_grad(lambda p, v, d, o: split_step(p, v.real, d, o),
                    [psi, v.astype(np.complex128), dt, out], 1)
    _close(adj[1], fd_v.real)
    h = 1e-6
    fd_dt = (split_step(psi, v, dt + h, out.copy()) -
             split_step(psi, v, dt - h, out.copy())) / (2 * h)
    assert abs(adj[2][0] - fd_dt) <= 1e-6 * max(1, abs(fd_dt))


def test_wave_complex_scalar_coefficient():
    rng = np.random.default_rng(3)
    u, out = _rc(rng, 7), np.zeros(7, np.complex128)
    c = 0.3 + 0.4j
    adj = _adjoint(wave, (u, c, out))
    assert adj[1].dtype == np.complex128 and adj[1].shape == (1,)
    _close(adj[0], _fd_grad(lambda u, c, o: wave(u, c[0], o), [u, np.array([c]), out], 0))
    fd_c = _fd_grad(lambda u, c, o: wave(u, c[0], o), [u, np.array([c]), out], 1)
    _close(adj[1], fd_c)


def test_conj_real_imag_abs_mix():
    rng = np.random.default_rng(4)
    z, r = _rc(rng, 4), rng.uniform(-1, 1, 4)
    adj = _adjoint(mixes, (z, r))
    _close(adj[0], _fd_grad(lambda z, r: mixes(z, r), [z, r], 0))
    fd_r = _fd_grad(lambda z, r: mixes(z, r.real), [z, r.astype(np.complex128)], 1)
    _close(adj[1], fd_r.real)


def test_gradient_descent_step_descends():
    """z -= lr * grad lowers the loss: the returned gradient is dL/dx + i dL/dy."""
    rng = np.random.default_rng(5)
    u, out = _rc(rng, 7), np.zeros(7, np.complex128)
    c = 0.3 + 0.4j
    g = _adjoint(wave, (u, c, out))[0]
    assert wave(u - 1e-3 * g, c, out.copy()) < wave(u, c, out.copy())


def test_complex64_at_looser_tolerance():
    rng = np.random.default_rng(6)
    x = _rc(rng, 4, np.complex64)
    out = np.zeros(4, np.complex64)
    adj = _adjoint(dft_power, (x, out))
    assert adj[0].dtype == np.complex64
    ref = _fd_grad(lambda x, o: dft_power(x.astype(np.complex64), o),
                   [x.astype(np.complex128), out], 0, h=1e-2)
    _close(adj[0], ref, rtol=2e-2)


def _rdot(a, b):
    """The real inner product Re(sum(conj(a) * b))."""
    return float(np.sum(np.conj(np.asarray(a)) * np.asarray(b)).real)


def test_jvp_dot_product_and_finite_differences():
    rng = np.random.default_rng(7)
    u, out = _rc(rng, 6), np.zeros(6, np.complex128)
    c = 0.2 - 0.5j
    du = _rc(rng, 6)
    dc = np.array([0.3 + 0.1j])
    dout = np.zeros(6, np.complex128)
    val, tan = wave.jvp(u.copy(), c, out.copy(), du.copy(), dc.copy(), dout)
    h = 1e-6
    fd = (wave(u + h * du, c + h * dc[0], out.copy()) -
          wave(u - h * du, c - h * dc[0], out.copy())) / (2 * h)
    assert abs(tan - fd) <= 1e-6 * max(1.0, abs(fd))
    # <J v, w>_R == <v, J^T w>_R with w = 1 on the returned loss
    adj = _adjoint(wave, (u, c, out))
    assert abs(tan - (_rdot(adj[0], du) + _rdot(adj[1], dc))) <= 1e-9 * max(1, abs(tan))


def test_jvp_of_mixes_matches_finite_differences():
    rng = np.random.default_rng(8)
    z, r = _rc(rng, 4), rng.uniform(-1, 1, 4)
    dz, dr = _rc(rng, 4), rng.standard_normal(4)
    val, tan = mixes.jvp(z.copy(), r.copy(), dz.copy(), dr.copy())
    h = 1e-6
    fd = (mixes(z + h * dz, r + h * dr) - mixes(z - h * dz, r - h * dr)) / (2 * h)
    assert abs(tan - fd) <= 1e-6 * max(1.0, abs(fd))


def test_complex_values_refused_on_targets_without_them():
    """CPU and CUDA kernels differentiate complex values (tests/test_complex_cuda.py);
    a target that does not is refused with the kernel's name."""
    import dataclasses

    from kadj.complex_check import COMPLEX_TARGETS, check_target
    from kadj.targets.cuda import CUDA

    assert {"cpu", "cuda"} <= COMPLEX_TARGETS

    class K:
        types = {"z": numba.types.complex128}
        loc = None

    check_target(CUDA, K(), "k")     # accepted
    other = dataclasses.replace(CUDA, name="other", title="Other")
    with pytest.raises(kadj.DifferentiationError, match="complex .*Other kernels"):
        check_target(other, K(), "k")


@kadj.differentiate
@numba.njit
def phase_step(psi, v, dt, out):
    for i in range(psi.shape[0]):
        out[i] = psi[i] * cmath.exp(-1j * v[i] * dt)


@kadj.differentiate
@numba.njit
def weighted_norm(z, loss):
    s = 0.0
    for i in range(z.shape[0]):
        s += (i + 1.0) * (z[i].real ** 2 + z[i].imag ** 2) + z[i].real * z[i].imag
    loss[0] = s


def test_real_loss_of_complex_kernels_through_the_tape():
    rng = np.random.default_rng(5)
    psi, v = _rc(rng, 6), rng.uniform(-1, 1, 6)

    def run(p):
        mid, end, loss = (np.zeros(6, np.complex128), np.zeros(6, np.complex128),
                          np.zeros(1))
        phase_step(p, v, 0.3, mid)
        phase_step(mid, v, 0.2, end)       # a second launch reads the first's output
        weighted_norm(end, loss)
        return loss[0]

    mid, end, loss = np.zeros(6, np.complex128), np.zeros(6, np.complex128), np.zeros(1)
    with kadj.Tape() as tape:
        phase_step(psi, v, 0.3, mid)
        phase_step(mid, v, 0.2, end)
        weighted_norm(end, loss)
    tape.backward(loss)
    g = tape.grad(psi)
    h = 1e-6
    fd = np.array([(run(psi + h * e) - run(psi - h * e)) / (2 * h)
                   + 1j * (run(psi + 1j * h * e) - run(psi - 1j * h * e)) / (2 * h)
                   for e in np.eye(6)])
    _close(g, fd)
    assert g.dtype == np.complex128
    gv = tape.grad(v)
    assert np.isrealobj(gv)

    def run_v(vv):
        mid, end, loss = (np.zeros(6, np.complex128), np.zeros(6, np.complex128),
                          np.zeros(1))
        phase_step(psi, vv, 0.3, mid)
        phase_step(mid, vv, 0.2, end)
        weighted_norm(end, loss)
        return loss[0]

    fd_v = np.array([(run_v(v + h * e) - run_v(v - h * e)) / (2 * h) for e in np.eye(6)])
    _close(gv, fd_v)


def test_complex_scalar_gradients_through_the_tape():
    # tape.scalar_grads() / scalar_grad() of a complex scalar keep its imaginary part
    # (a regression: they were converted with float(), which dropped it with only a
    # ComplexWarning)
    rng = np.random.default_rng(8)
    u, c = _rc(rng, 7), 0.3 + 0.4j

    def run(cc):
        out, loss = np.zeros(7, np.complex128), np.zeros(1)
        wave(u, cc, out)
        weighted_norm(out, loss)
        return loss[0]

    out, loss = np.zeros(7, np.complex128), np.zeros(1)
    with kadj.Tape() as tape:
        wave(u, c, out)
        weighted_norm(out, loss)
    tape.backward(loss)
    h = 1e-6
    fd = ((run(c + h) - run(c - h)) / (2 * h)
          + 1j * (run(c + 1j * h) - run(c - 1j * h)) / (2 * h))
    (entry,) = [g for g in tape.scalar_grads() if g.arg_name == "c"]
    assert isinstance(entry.value, complex) and abs(entry.value.imag) > 1e-3
    assert abs(entry.value - fd) <= 1e-6 * max(1.0, abs(fd))
    assert tape.scalar_grad("c") == entry.value


@numba.njit
def _real_into_complex(r, a, oz, tz):
    for i in range(r.shape[0]):
        oz[i] = r[i]                    # a real value stored into a complex array
        t = math.sin(r[i]) * a          # a real local, stored too
        tz[i] = t
    s = np.zeros(r.shape[0], np.complex128)
    for i in range(r.shape[0]):
        s[i] = 2.0 * r[i]               # into a complex scratch array
        tz[i] += s[i] * r[i]


def test_real_values_stored_into_complex_arrays():
    """numba casts a real value stored into a complex array; its adjoint is the real
    part of the element's (the adjoint crashed with a typing error: a complex element
    added into a real adjoint).  Against finite differences of real and imaginary
    parts (check_grad)."""
    from kadj.testing import check_grad
    rng = np.random.default_rng(5)
    args = (rng.standard_normal(6), 0.7, np.zeros(6, np.complex128),
            np.zeros(6, np.complex128))
    k = kadj.differentiate(_real_into_complex)
    check_grad(k, args)
    ct = rng.standard_normal(6) + 1j * rng.standard_normal(6)
    adj_r, adj_a = np.zeros(6), np.zeros(1)
    k.adjoint(*args, adj_r, adj_a, ct.copy(), np.zeros(6, np.complex128))
    np.testing.assert_allclose(adj_r, ct.real)
