"""Complex numbers in CUDA kernels, in the simulator (run by tests/test_complex_cuda.py
in a subprocess with NUMBA_ENABLE_CUDASIM=1 set before numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/complex_cuda_sim.py wave_c [case ...]

Convention (as on the CPU): the adjoint of a complex z = x + iy holds dL/dx + i dL/dy,
and a complex cotangent w of an output o stands for the real loss L = Re(sum conj(w) o).
For each case, with random complex tangents ``v`` and cotangents ``w`` of every slot:

- the adjoint matches float64 central differences of L in the real and in the
  imaginary direction of sampled elements of every complex input (the real direction
  only for real inputs);
- ``k.jvp`` changes the arguments as a forward launch and its tangents match central
  differences of forward launches along ``v``;
- the dot-product test ``Re<J v, w> == Re<v, J^T w>``.

Prints ``CASE <name> OK <detail>`` or ``CASE <name> FAIL <why>``.  (Imported without
the simulator, the module only defines the kernels and their cases: tests/
test_complex_cuda.py compiles them to PTX.)
"""
import cmath
import math
import os
import sys

import numpy as np
from numba import cuda

import kadj


@kadj.differentiate
@cuda.jit
def wave_c(u, c, out):
    """A complex-coefficient wave stencil: every thread reads its neighbours (atomic
    accumulation into adj_u) and the scalar coefficient (a block sum)."""
    i = cuda.grid(1)
    n = u.shape[0]
    if i >= 1 and i < n - 1:
        out[i] = u[i] + c * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@cuda.jit
def phase_split_step(psi, v, dt):
    """The potential half of a split-step Schroedinger solver, in place: the phase of
    a real potential (an input too), several steps per thread."""
    i = cuda.grid(1)
    if i < psi.shape[0]:
        for _ in range(3):
            psi[i] *= cmath.exp(-1j * v[i] * dt)
            psi[i] = psi[i] + 0.1j * dt * psi[i].real


@kadj.differentiate
@cuda.jit
def dft_thread(x, out):
    """A DFT, one coefficient per thread: every thread reads every input element."""
    k = cuda.grid(1)
    n = x.shape[0]
    if k < out.shape[0]:
        acc = 0j
        for j in range(n):
            acc += x[j] * cmath.exp(-2j * math.pi * k * j / n)
        out[k] = acc


@kadj.differentiate
@cuda.jit
def power_loss(z, r, loss):
    """A real loss of complex values summed with an atomic (conj, abs, real, imag)."""
    i = cuda.grid(1)
    if i < z.shape[0]:
        w = z[i].conjugate() * r[i] + cmath.sqrt(z[i])
        cuda.atomic.add(loss, 0, abs(w) + w.imag * z[i].real + (w * np.conj(w)).real)


@kadj.differentiate
@cuda.jit
def wave_c64(u, c, out):
    i = cuda.grid(1)
    n = u.shape[0]
    if i >= 1 and i < n - 1:
        out[i] = u[i] + c * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@kadj.differentiate
@cuda.jit
def shared_tile_c(u, k, out):
    """A complex shared tile between barriers, read at the neighbour's element."""
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    tile = cuda.shared.array(8, np.complex128)
    if i < u.shape[0]:
        tile[t] = u[i] * k
    cuda.syncthreads()
    if i < u.shape[0] and t < 7:
        out[i] = tile[t] * tile[t + 1].conjugate() + cmath.asinh(tile[t])


@kadj.differentiate
@cuda.jit
def coeffs_c(u, c, out):
    """Complex coefficients every thread reads at constant indices: summed in locals,
    over the block, then one (split) atomic per block and element."""
    i = cuda.grid(1)
    if i < u.shape[0]:
        out[i] = c[0] * u[i] + c[1] * u[i] * u[i]


@kadj.differentiate
@cuda.jit
def rotations_c64(z, v, out):
    """A complex state carried through a loop (reversed from checkpoints, the state
    saved as its real and imaginary parts), complex64 arrays."""
    i = cuda.grid(1)
    if i < z.shape[0]:
        s = z[i]
        for j in range(3):
            s = s * cmath.exp(1j * v[i] * (j + 1)) + 0.1 * s * s
        out[i] = s


@kadj.differentiate
@cuda.jit
def rotations_local(z, v, out):
    """Refused: a thread-local complex array the reversed loop would save on the
    (real) tape; its forward mode is fine."""
    i = cuda.grid(1)
    if i < z.shape[0]:
        w = cuda.local.array(3, np.complex128)
        s = z[i]
        for j in range(3):
            s = s * cmath.exp(1j * v[i] * (j + 1)) + 0.1 * s * s
            w[j] = s
        out[i] = w[0] + w[1] * w[2]


def _rc(rng, n, dtype=np.complex128):
    return (rng.uniform(0.3, 1.5, n) + 1j * rng.uniform(-1, 1, n)).astype(dtype)


CASES = {
    "wave_c": lambda r: (wave_c, (2, 8), [_rc(r, 13), complex(0.3, -0.2),
                                          np.zeros(13, np.complex128)]),
    "phase_split_step": lambda r: (phase_split_step, (2, 4),
                                   [_rc(r, 7), r.uniform(-1, 1, 7), 0.4]),
    "dft_thread": lambda r: (dft_thread, (2, 4), [_rc(r, 6),
                                                  np.zeros(6, np.complex128)]),
    "power_loss": lambda r: (power_loss, (2, 4), [_rc(r, 7), r.uniform(0.5, 1.5, 7),
                                                  np.zeros(1)]),
    "wave_c64": lambda r: (wave_c64, (2, 8), [_rc(r, 11, np.complex64),
                                              np.complex64(0.3 - 0.2j),
                                              np.zeros(11, np.complex64)]),
    "shared_tile_c": lambda r: (shared_tile_c, (2, 8), [_rc(r, 16), complex(0.7, 0.4),
                                                        np.zeros(16, np.complex128)]),
    "coeffs_c": lambda r: (coeffs_c, (2, 4), [_rc(r, 7), _rc(r, 2),
                                              np.zeros(7, np.complex128)]),
    "rotations_c64": lambda r: (rotations_c64, (2, 4),
                                [_rc(r, 7, np.complex64) * np.complex64(0.5),
                                 r.uniform(-1, 1, 7).astype(np.float32),
                                 np.zeros(7, np.complex64)]),
}

REFUSED = {
    "rotations_local": lambda r: (rotations_local, (2, 4),
                                  [_rc(r, 7) * 0.5, r.uniform(-1, 1, 7),
                                   np.zeros(7, np.complex128)]),
}


def copy(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def _dtype(a):
    return np.asarray(a).dtype


def random_like(a, rng):
    """A random tangent or cotangent of ``a`` (a 1-element array for a scalar)."""
    shape = a.shape if isinstance(a, np.ndarray) else (1,)
    x = rng.standard_normal(shape)
    if np.iscomplexobj(np.asarray(a)):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(_dtype(a))


def shifted(args, slots, v, h):
    """The arguments moved by ``h * v`` (complex ``h`` allowed on complex slots)."""
    out = copy(args)
    for i, d in zip(slots, v):
        a = args[i]
        step = h * d.astype(np.complex128)
        if not np.iscomplexobj(np.asarray(a)):
            step = step.real        # (a real argument moves along real directions)
        if isinstance(a, np.ndarray):
            out[i] = (a + step).astype(a.dtype)
        else:
            out[i] = type(a)(a + step[0])
    return out


def forward(k, config, args):
    out = copy(args)
    k.forward(config, *out)
    return out


def rdot(a, b):
    """The real inner product Re(sum conj(a) b)."""
    a, b = np.asarray(a).astype(np.complex128), np.asarray(b).astype(np.complex128)
    return float(np.real(np.vdot(a.ravel(), b.ravel())))


def loss(k, config, args, slots, w):
    after = forward(k, config, args)
    return sum(rdot(c, np.atleast_1d(after[i])) for i, c in zip(slots, w)
               if isinstance(args[i], np.ndarray))


def check(name, seed=0):
    jvp_only = name.endswith(":jvp")     # a kernel whose adjoint is refused
    name = name.split(":")[0]
    rng = np.random.default_rng(seed)
    k, config, args = {**CASES, **REFUSED}[name](rng)
    low = any(_dtype(a) in (np.complex64, np.float32) for a in args)
    if jvp_only:    # (the tangent's own plan: adjoint_plan would build the adjoint)
        from kadj import jvp_call
        slots = jvp_call.compiled(k, k.complete_args(args)).plan.adjoint_args
    else:
        slots = k.adjoint_plan(*args).adjoint_args
    v = [random_like(args[i], rng) for i in slots]
    w = [random_like(args[i], rng) for i in slots]
    h = 1e-2 if low else 1e-6
    rtol = 2e-2 if low else 1e-6
    worst = 0.0
    if not jvp_only:
        adj = [d.copy() for d in w]
        k.adjoint[config](*copy(args), *adj)
        worst = check_adjoint(k, config, args, slots, v, w, adj, h, rtol, rng)
    check_jvp(k, config, args, slots, v, h, rtol)
    if jvp_only:
        return worst, 0.0
    return worst, dot_test(v, w, adj, tangents_of(k, config, args, v), low)


def check_adjoint(k, config, args, slots, v, w, adj, h, rtol, rng):
    """The adjoint against central differences of L in both directions."""
    worst = 0.0
    for j, i in enumerate(slots):
        a = args[i]
        flat = a.size if isinstance(a, np.ndarray) else 1
        for e in sorted(set(rng.integers(0, flat, 3).tolist())):
            dirs = [1.0, 1j] if np.iscomplexobj(np.asarray(a)) else [1.0]
            for d in dirs:
                basis = [np.zeros_like(x) for x in v]
                basis[j].ravel()[e] = 1.0
                lp = loss(k, config, shifted(args, slots, basis, h * d), slots, w)
                lm = loss(k, config, shifted(args, slots, basis, -h * d), slots, w)
                fd = (lp - lm) / (2 * h)
                g = adj[j].ravel()[e]
                if not isinstance(a, np.ndarray):
                    g = g - w[j].ravel()[e]   # a scalar's own cotangent is not L's
                got = complex(g).real if d == 1.0 else complex(g).imag
                err = abs(got - fd)
                worst = max(worst, err / max(1.0, abs(fd)))
                if not err <= rtol * max(1.0, abs(fd)):
                    part = "real" if d == 1.0 else "imaginary"
                    raise AssertionError(
                        f"adjoint of {k.arg_names[i]}[{e}] ({part} part) {got!r} vs "
                        f"central differences {fd!r}")
    return worst


def tangents_of(k, config, args, v):
    tangents = [d.copy() for d in v]
    k.jvp[config](*copy(args), *tangents)
    return tangents


def check_jvp(k, config, args, slots, v, h, rtol):
    """jvp: the forward's effect, and tangents against central differences along v."""
    after = copy(args)
    tangents = [d.copy() for d in v]
    k.jvp[config](*after, *tangents)
    plain = forward(k, config, args)
    for i, (a, b) in enumerate(zip(after, plain)):
        if isinstance(a, np.ndarray) and not np.allclose(a, b, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"jvp changed argument {k.arg_names[i]} unlike the "
                                 f"forward")
    plus = forward(k, config, shifted(args, slots, v, h))
    minus = forward(k, config, shifted(args, slots, v, -h))
    for j, i in enumerate(slots):
        if not isinstance(args[i], np.ndarray):
            continue
        wide = np.complex128
        fd = (plus[i].astype(wide) - minus[i].astype(wide)) / (2 * h)
        got = tangents[j].astype(wide)
        err = float(np.max(np.abs(fd - got)))
        scale = max(1.0, float(np.max(np.abs(fd))))
        if not err <= rtol * scale:
            raise AssertionError(f"tangent of {k.arg_names[i]} differs from central "
                                 f"differences by {err:.3e}:\njvp {got[:6]}\nfd  {fd[:6]}")


def dot_test(v, w, adj, tangents, low):
    """The dot-product test: Re<J v, w> == Re<v, J^T w>."""
    lhs = sum(rdot(c, t) for t, c in zip(tangents, w))
    rhs = sum(rdot(d, g) for d, g in zip(v, adj))
    mag = max(1.0, abs(lhs) + abs(rhs))
    tol = 1e-4 if low else 1e-10
    if not abs(lhs - rhs) <= tol * mag:
        raise AssertionError(f"dot-product test: {lhs!r} vs {rhs!r}")
    return abs(lhs - rhs) / mag


def check_grad_cases():
    """``kadj.testing.check_grad_cuda`` probes complex inputs in the real and the
    imaginary direction of each element."""
    from kadj.testing import check_grad_cuda
    worst = 0.0
    for name in ("wave_c", "dft_thread"):
        k, config, args = CASES[name](np.random.default_rng(2))
        res = check_grad_cuda(k, config, args)
        worst = max(worst, res.max_rel_error)
    return worst, 0.0


def main(names):
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"
    for name in names:
        try:
            fd_err, dot_err = check_grad_cases() if name == "check_grad_cuda" else \
                check(name)
            print(f"CASE {name} OK fd {fd_err:.2e} dot {dot_err:.2e}", flush=True)
        except Exception as exc:  # reported to the parent test
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            print(f"CASE {name} FAIL {msg}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or list(CASES) + ["rotations_local:jvp", "check_grad_cuda"])
