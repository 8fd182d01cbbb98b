"""Forward mode of CUDA kernels in the simulator (run by tests/test_jvp_cuda.py in a
subprocess with NUMBA_ENABLE_CUDASIM=1 set before numba is imported)::

    NUMBA_ENABLE_CUDASIM=1 python tests/jvp_cuda_sim.py heat1d_guarded [case ...]

A case is a CUDA gallery kernel (kernels/cuda) or a kernel of this file.  For each,
with random tangents ``v`` of the pre-call state and cotangents ``w`` of the post-call
state of every slot (the adjoint's: differentiated floating-point arguments):

- ``k.jvp[config](*args, *v)`` changes the forward arguments exactly as a forward launch;
- its tangents match float64 central differences of forward launches along ``v``
  (a float32 kernel is run as compiled, with a larger step);
- the dot-product test against ``.adjoint``: ``<J v, w> == <v, J^T w>``.

Fresh floating-point shared and local arrays are filled with NaN
(:func:`cuda_gallery_sim.poison_scratch_arrays`), so a tangent read of an element
nobody wrote shows.  Prints ``CASE <name> OK <detail>`` or ``CASE <name> FAIL <why>``.
"""
import os
import sys

assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", "set NUMBA_ENABLE_CUDASIM=1"

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import kadj  # noqa: E402

from kernels.cuda import by_name  # noqa: E402


@kadj.differentiate
@cuda.jit
def atomic_sub_squares(x, s, out):
    """out[i % 2] -= s * x[i]**2 with cuda.atomic.sub (the other atomic the forward
    may hold)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        cuda.atomic.sub(out, i % 2, s * x[i] * x[i])


def _atomic_sub_case(rng):
    return (2, 8), [rng.standard_normal(13), 0.7, rng.standard_normal(2)]


LOCAL = {"atomic_sub_squares": (atomic_sub_squares, _atomic_sub_case)}


def case_of(name, rng):
    """(kernel, config, args, float32?) of a case."""
    if name in LOCAL:
        k, make = LOCAL[name]
        config, args = make(rng)
    else:
        c = by_name(name)
        k, config, args = c.kernel, c.config, c.make_args(rng)
    f32 = any(np.asarray(a).dtype == np.float32 for a in args)
    return k, config, args, f32


def copy(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def slot_values(args, slots, rng):
    """A random tangent (or cotangent) per slot: an array shaped like the argument, a
    1-element array for a scalar."""
    out = []
    for i in slots:
        dt = np.asarray(args[i]).dtype
        shape = args[i].shape if isinstance(args[i], np.ndarray) else (1,)
        out.append(rng.standard_normal(shape).astype(dt))
    return out


def shifted(args, slots, v, h):
    """The arguments moved by ``h * v`` along the slots (in the arguments' dtypes)."""
    out = copy(args)
    for i, d in zip(slots, v):
        a = args[i]
        if isinstance(a, np.ndarray):
            out[i] = (a.astype(np.float64) + h * d.astype(np.float64)).astype(a.dtype)
        else:
            out[i] = type(a)(float(a) + h * float(d[0]))
    return out


def forward(k, config, args):
    out = copy(args)
    k.forward(config, *out)
    return out


def check(name, seed=0):
    rng = np.random.default_rng(seed)
    k, config, args, f32 = case_of(name, rng)
    slots = k.adjoint_plan(*args).adjoint_args
    v = slot_values(args, slots, rng)
    w = slot_values(args, slots, rng)

    # jvp: the forward's effect, and the tangents of the post-call state
    after = copy(args)
    tangents = [d.copy() for d in v]
    k.jvp[config](*after, *tangents)
    plain = forward(k, config, args)
    same = 1e-5 if f32 else 1e-12
    for i, (a, b) in enumerate(zip(after, plain)):
        if isinstance(a, np.ndarray) and not np.allclose(a, b, rtol=same, atol=same):
            raise AssertionError(f"jvp changed argument {k.arg_names[i]} unlike the "
                                 f"forward: {a} vs {b}")

    # central differences of the forward along v (float64 arithmetic)
    h = 1e-2 if f32 else 1e-6
    plus = forward(k, config, shifted(args, slots, v, h))
    minus = forward(k, config, shifted(args, slots, v, -h))
    rtol, atol = (2e-2, 1e-4) if f32 else (1e-6, 1e-9)
    worst = 0.0
    for j, i in enumerate(slots):
        if not isinstance(args[i], np.ndarray):
            if not np.array_equal(tangents[j], v[j]):
                raise AssertionError(f"jvp changed the tangent of the scalar "
                                     f"{k.arg_names[i]}: {tangents[j]} vs {v[j]}")
            continue
        fd = (plus[i].astype(np.float64) - minus[i].astype(np.float64)) / (2 * h)
        got = tangents[j].astype(np.float64)
        err = np.max(np.abs(fd - got)) if fd.size else 0.0
        scale = max(1.0, float(np.max(np.abs(fd))) if fd.size else 0.0)
        worst = max(worst, err / scale)
        if not err <= rtol * scale + atol:
            raise AssertionError(
                f"tangent of {k.arg_names[i]} differs from central differences by "
                f"{err:.3e} (scale {scale:.3e}):\njvp {got.ravel()[:12]}\n"
                f"fd  {fd.ravel()[:12]}")

    # the dot-product test with the adjoint: <J v, w> == <v, J^T w>
    adj = [d.copy() for d in w]
    k.adjoint[config](*copy(args), *adj)
    terms_l = [float(np.dot(t.astype(np.float64).ravel(), c.astype(np.float64).ravel()))
               for t, c in zip(tangents, w)]
    terms_r = [float(np.dot(d.astype(np.float64).ravel(), g.astype(np.float64).ravel()))
               for d, g in zip(v, adj)]
    lhs, rhs = sum(terms_l), sum(terms_r)
    mag = max(1.0, sum(abs(x) for x in terms_l + terms_r))
    tol = 1e-4 if f32 else 1e-10
    if not abs(lhs - rhs) <= tol * mag:
        raise AssertionError(f"dot-product test: <J v, w> = {lhs!r}, <v, J^T w> = "
                             f"{rhs!r} (relative {abs(lhs - rhs) / mag:.3e})")
    return worst, abs(lhs - rhs) / mag


def expect_error(kind, text, fn):
    try:
        fn()
    except kind as exc:
        if text not in str(exc):
            raise AssertionError(f"message lacks {text!r}: {exc}") from None
    else:
        raise AssertionError(f"no {kind.__name__} ({text!r})")


def launch_rules():
    """Tangents by keyword, launches that compose, buffers refused before anything
    runs, and no jvp while a tape records."""
    k = by_name("heat1d_guarded").kernel
    rng = np.random.default_rng(1)
    u, alpha = rng.random(13), 0.2
    du, dun, da = rng.standard_normal(13), np.zeros(13), np.array([0.5])
    u_new = np.zeros(13)
    k.jvp[2, 8](u, u_new, alpha, du, dot_u_new=dun, dot_alpha=da)
    ref = np.zeros(13)
    ref[1:-1] = du[1:-1] + alpha * (du[:-2] - 2 * du[1:-1] + du[2:]) + \
        0.5 * (u[:-2] - 2 * u[1:-1] + u[2:])
    if not np.allclose(dun, ref, rtol=1e-13, atol=1e-15):
        raise AssertionError(f"keyword tangents: {dun} vs {ref}")
    # two steps: the second launch's input tangent is the first's output tangent
    u2, du2 = np.zeros(13), np.zeros(13)
    k.jvp[2, 8](u_new, u2, alpha, dun, du2, np.zeros(1))
    ref2 = np.zeros(13)
    ref2[1:-1] = ref[1:-1] + alpha * (ref[:-2] - 2 * ref[1:-1] + ref[2:])
    if not np.allclose(du2, ref2, rtol=1e-13, atol=1e-15):
        raise AssertionError(f"composed launches: {du2} vs {ref2}")
    before = u_new.copy()
    expect_error(ValueError, "dot_u must have the shape and dtype of u",
                 lambda: k.jvp[2, 8](u, u_new, alpha, np.zeros(12), np.zeros(13),
                                     np.zeros(1)))
    expect_error(TypeError, "is missing tangent argument(s) ('dot_alpha',)",
                 lambda: k.jvp[2, 8](u, u_new, alpha, du, dun))
    expect_error(ValueError, "shares memory with the forward argument 'u'",
                 lambda: k.jvp[2, 8](u, u_new, alpha, u, dun, da))
    if not np.array_equal(u_new, before):
        raise AssertionError("a refused launch ran")
    with kadj.Tape():
        expect_error(kadj.DifferentiationError, "while a kadj.Tape records",
                     lambda: k.jvp[2, 8](u, u_new, alpha, du, dun, da))
    return 0.0, 0.0


def main(names):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cuda_gallery_sim import poison_scratch_arrays
    poison_scratch_arrays()
    import warp_sim_api             # the simulator has no warp shuffles (kernels/cuda/warps)
    warp_sim_api.install()
    for name in names:
        try:
            fd_err, dot_err = launch_rules() if name == "launch_rules" else check(name)
            print(f"CASE {name} OK fd {fd_err:.2e} dot {dot_err:.2e}", flush=True)
        except Exception as exc:  # reported to the parent test
            msg = f"{type(exc).__name__}: {exc}".replace("\n", " | ")
            print(f"CASE {name} FAIL {msg}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
