"""The CPU gallery (kernels/cpu), checked end to end.

For every gallery entry:

- the kernel runs under plain Numba, and its example arguments sit at smooth
  points (finite differences at two step sizes agree) -- this needs no kadj;
- ``kadj.differentiate(kernel)`` runs the forward exactly like the kernel;
- ``kadj.testing.check_grad`` passes;
- ``kernel.adjoint`` matches an independent reference written here: the full
  vector-Jacobian product by float64 central finite differences of the
  undecorated kernel, with the in/out rule of API.md (adjoint buffers hold the
  cotangent of the post-call state on entry, of the pre-call state on return;
  scalar slots accumulate), and the adjoint call leaves the forward arguments
  untouched.

float32 entries are compared against a float64 reference: the kernel's
``py_func`` compiled by Numba for float64 copies of the arguments.
"""
from __future__ import annotations

import inspect
import math

import numba
import numpy as np
import pytest

from kernels.cpu import GALLERY

SEED = 20240611
RET_COTANGENT = 0.7          # cotangent of a kernel's return value
SCALAR_SLOT_START = 0.25     # initial content of scalar slots in the "accumulate" mode

IDS = [ex.name for ex in GALLERY]


# --------------------------------------------------------------------------- helpers

def fresh_args(ex, seed=SEED):
    return tuple(ex.make_args(np.random.default_rng(seed)))


def copy_args(args):
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)


def is_float_array(a):
    return isinstance(a, np.ndarray) and a.dtype.kind == "f"


def is_float_scalar(a):
    return isinstance(a, (float, np.floating)) and not isinstance(a, bool)


def to_float64(args):
    out = []
    for a in args:
        if is_float_array(a):
            out.append(a.astype(np.float64))
        elif is_float_scalar(a):
            out.append(float(a))
        else:
            out.append(a.copy() if isinstance(a, np.ndarray) else a)
    return tuple(out)


_DIFFERENTIATED = {}
_FLOAT64_KERNELS = {}


def differentiated(ex):
    """kadj.differentiate(ex.kernel, wrt=ex.wrt), made once per entry."""
    import kadj

    if ex.name not in _DIFFERENTIATED:
        _DIFFERENTIATED[ex.name] = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    return _DIFFERENTIATED[ex.name]


def float64_kernel(ex):
    """The kernel for float64 finite differences (float32 entries: py_func re-jitted)."""
    if "float32" not in ex.tags:
        return ex.kernel
    if ex.name not in _FLOAT64_KERNELS:
        _FLOAT64_KERNELS[ex.name] = numba.njit(ex.kernel.py_func)
    return _FLOAT64_KERNELS[ex.name]


def reference_vjp(fn, args, wrt, seeds, ret_cotangent, rel_eps=1e-6):
    """Central-difference gradient of <seeds, post-call state> + ret_cotangent * return.

    fn:      the kernel to differentiate numerically, run on float64 copies.
    args:    the pre-call arguments (float32 ones are cast to float64).
    wrt:     indices of the float arguments to differentiate with respect to.
    seeds:   {index: cotangent array} for array arguments' post-call states.
    Returns {index: gradient} (arrays shaped like the argument, floats for scalars).
    """
    base = to_float64(args)
    seeds64 = {i: np.asarray(c, dtype=np.float64) for i, c in seeds.items()}

    def objective(a):
        a = copy_args(a)
        r = fn(*a)
        val = 0.0
        for i, c in seeds64.items():
            val += float(np.sum(c * a[i]))
        if ret_cotangent is not None:
            val += ret_cotangent * float(r)
        return val

    grads = {}
    for i in wrt:
        a = base[i]
        if isinstance(a, np.ndarray):
            g = np.zeros(a.shape)
            for j in np.ndindex(a.shape):
                h = rel_eps * max(1.0, abs(a[j]))
                plus, minus = list(base), list(base)
                xp, xm = a.copy(), a.copy()
                xp[j] += h
                xm[j] -= h
                plus[i], minus[i] = xp, xm
                g[j] = (objective(plus) - objective(minus)) / (xp[j] - xm[j])
            grads[i] = g
        else:
            h = rel_eps * max(1.0, abs(a))
            plus, minus = list(base), list(base)
            plus[i], minus[i] = a + h, a - h
            grads[i] = (objective(plus) - objective(minus)) / (2.0 * h)
    return grads


def assert_close(got, ref, rtol, atol_rel, what):
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol_rel * scale, err_msg=what)


# --------------------------------------------------------------------------- the registry

def test_gallery_size_and_names():
    names = [ex.name for ex in GALLERY]
    assert len(GALLERY) >= 34
    assert len(set(names)) == len(names), "gallery names must be unique"


def test_gallery_covers_the_constructs():
    tags = set().union(*(ex.tags for ex in GALLERY))
    for tag in ("2d", "3d", "periodic", "branch", "recurrence", "ode", "newton", "while",
                "sparse", "scatter", "gather", "returns", "helper", "tuple", "scratch",
                "float32", "break", "continue", "early_return", "inplace", "parallel",
                "int_args", "minmax", "wrt"):
        assert tag in tags, f"no gallery kernel tagged {tag!r}"


@pytest.mark.parametrize("ex", GALLERY, ids=IDS)
def test_kernel_runs_under_numba(ex):
    args = fresh_args(ex)
    again = fresh_args(ex)
    for a, b in zip(args, again):                  # make_args is deterministic
        np.testing.assert_array_equal(a, b)
    for a in args:
        if isinstance(a, np.ndarray):
            assert (a.size >= 5 or a.shape == (1,)) and max(a.shape) <= 40, \
                f"{ex.name}: array {a.shape}"
    has32 = any(isinstance(a, (np.ndarray, np.floating)) and a.dtype == np.float32
                for a in args)
    assert has32 == ("float32" in ex.tags)
    assert hasattr(ex.kernel, "py_func"), "gallery kernels are plain @njit dispatchers"
    r = ex.kernel(*copy_args(args))
    assert (r is not None) == ("returns" in ex.tags)
    if r is not None:
        assert math.isfinite(float(r))
    for a in args:
        if is_float_array(a):
            assert np.all(np.isfinite(a))


@pytest.mark.parametrize("ex", GALLERY, ids=IDS)
def test_example_point_is_smooth(ex):
    """Finite differences at two step sizes agree: no kink or branch flip nearby."""
    args = fresh_args(ex)
    rng = np.random.default_rng(SEED + 1)
    names = list(inspect.signature(ex.kernel.py_func).parameters)
    wrt = [i for i, a in enumerate(args)
           if is_float_array(a) or (is_float_scalar(a) and (ex.wrt is None or names[i] in ex.wrt))]
    seeds = {i: rng.standard_normal(a.shape) for i, a in enumerate(args) if is_float_array(a)}
    ret = RET_COTANGENT if "returns" in ex.tags else None
    fn = float64_kernel(ex)
    fine = reference_vjp(fn, args, wrt, seeds, ret, rel_eps=1e-6)
    coarse = reference_vjp(fn, args, wrt, seeds, ret, rel_eps=1e-4)
    for i in wrt:
        assert_close(fine[i], coarse[i], 1e-4, 1e-6, f"{ex.name}: arg {i}")


# --------------------------------------------------------------------------- kadj

@pytest.mark.parametrize("ex", GALLERY, ids=IDS)
def test_forward_unchanged(ex):
    k = differentiated(ex)
    ref_args, args, fwd_args = fresh_args(ex), fresh_args(ex), fresh_args(ex)
    r_ref = ex.kernel(*ref_args)
    r = k(*args)
    r_fwd = k.forward(*fwd_args)
    for got in (r, r_fwd):
        if r_ref is None:
            assert got is None
        else:
            assert got == r_ref
    for a, b, c in zip(ref_args, args, fwd_args):
        np.testing.assert_array_equal(b, a)
        np.testing.assert_array_equal(c, a)


@pytest.mark.parametrize("ex", GALLERY, ids=IDS)
def test_check_grad(ex):
    from kadj.testing import check_grad

    k = differentiated(ex)
    args = fresh_args(ex)
    if "float32" in ex.tags:
        check_grad(k, args, wrt=ex.wrt, rtol=2e-2, atol=2e-3)
    else:
        check_grad(k, args, wrt=ex.wrt, rtol=1e-5, atol=1e-6)


def _modes():
    """Every entry in both modes; the "accumulate" mode of every second entry runs with
    -m slow (as CI does)."""
    for i, ex in enumerate(GALLERY):
        yield pytest.param(ex, "fresh", id=f"{ex.name}-fresh")
        yield pytest.param(ex, "accumulate", id=f"{ex.name}-accumulate",
                           marks=[pytest.mark.slow] if i % 2 else [])


@pytest.mark.parametrize("ex,mode", list(_modes()))
def test_adjoint_matches_finite_differences(ex, mode):
    """kernel.adjoint against the independent reference above.

    fresh:       written arrays carry a random cotangent, read-only ones zeros,
                 scalar slots zeros.
    accumulate:  every array slot carries a random cotangent and scalar slots
                 start at SCALAR_SLOT_START: read-only elements and scalars must
                 get their contributions added to what is there.
    """
    k = differentiated(ex)
    args = fresh_args(ex)
    before = copy_args(args)
    plan = k.adjoint_plan(*args)
    rng = np.random.default_rng(SEED + 2)

    adjoints, seeds, start = [], {}, {}
    for i in plan.adjoint_args:
        a = args[i]
        if isinstance(a, np.ndarray):
            if i in plan.written or mode == "accumulate":
                c = rng.standard_normal(a.shape).astype(a.dtype)
            else:
                c = np.zeros_like(a)
            seeds[i] = c.copy()
            adjoints.append(c)
        else:
            s0 = SCALAR_SLOT_START if mode == "accumulate" else 0.0
            adjoints.append(np.full(1, s0, dtype=np.asarray(a).dtype))
            start[i] = s0
    ret = RET_COTANGENT if plan.returns_value else None

    if plan.returns_value:
        k.adjoint(*args, *adjoints, adj_return=ret)
    else:
        k.adjoint(*args, *adjoints)

    for i, (a, b) in enumerate(zip(args, before)):
        np.testing.assert_array_equal(
            a, b, err_msg=f"{ex.name}: adjoint modified forward argument {i}")

    ref = reference_vjp(float64_kernel(ex), args, plan.adjoint_args, seeds, ret)
    float32 = "float32" in ex.tags
    rtol, atol_rel = (1e-3, 1e-3) if float32 else (1e-5, 1e-7)
    for i, got in zip(plan.adjoint_args, adjoints):
        name = f"{ex.name}: adj_{plan.arg_names[i]}"
        assert got.dtype == np.asarray(args[i]).dtype, name
        if isinstance(args[i], np.ndarray):
            assert got.shape == args[i].shape, name
            assert_close(got, ref[i], rtol, atol_rel, name)
        else:
            assert got.shape == (1,), name
            assert_close(got[0], start[i] + ref[i], rtol, atol_rel, name)


@pytest.mark.parametrize("ex", GALLERY, ids=IDS)
def test_adjoint_plan(ex):
    """Slots: every float argument (or the wrt ones plus written float arrays); ints
    never.  Arrays the forward visibly changes are listed as written."""
    args = fresh_args(ex)
    plan = differentiated(ex).adjoint_plan(*args)
    floats = {i for i, a in enumerate(args) if is_float_array(a) or is_float_scalar(a)}
    after = copy_args(args)
    ex.kernel(*after)
    changed = {i for i, (a, b) in enumerate(zip(args, after))
               if isinstance(a, np.ndarray) and not np.array_equal(a, b)}
    assert changed <= set(plan.written), (ex.name, changed, plan.written)
    slots = set(plan.adjoint_args)
    assert list(plan.adjoint_args) == sorted(slots)
    if ex.wrt is None:
        assert slots == floats, ex.name
    else:
        named = {plan.arg_names.index(n) for n in ex.wrt}
        assert named <= slots <= floats, ex.name
        assert slots - named <= {i for i in plan.written if is_float_array(args[i])}
        assert {i for i in changed if is_float_array(args[i])} <= slots
    assert plan.returns_value == ("returns" in ex.tags)
