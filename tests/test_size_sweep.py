"""Gradients at many sizes: capacity bugs of the CPU adjoint's tape.

Every other test uses small arguments, where a tape (1024 entries at first, reserved
ahead of loops, doubled when short) never grows.  Here each kernel is compiled once
(argument types do not change with size) and checked at many sizes with the
inner-product test of :func:`kadj.testing.check_grad` (one random direction per
argument; float64 central differences against ``<adjoint(ct), d>``).  Kernels are
re-jitted with ``boundscheck=True``, which kadj passes on to the adjoint, so an
overrun tape raises ``IndexError`` instead of corrupting memory.

- Gallery kernels (kernels/cpu, ``Example.sized``): odd sizes, primes, powers of two
  and their neighbours, up to 40009, plus the sizes whose pushes land on and around
  1024, 2048, ... 32768 entries (pushes counted by running the adjoint source as
  Python, see tests/sweep.py).  A representative set runs by default, the rest with
  ``-m slow``.  Every gallery adjoint's tapes are audited by default (its source run
  as Python with tapes reserved exactly: each push covered, each push popped).
- Nested-loop recorders (kernels/cpu/recorders.py): an outer loop and the loops inside
  it both record; swept over (outer, inner) shapes where inner loops end exactly at a
  capacity, e.g. (147, 6) for ``carried_inner``.
- A batched Thomas solve over thousands of systems, softmax cross-entropy over
  (batch, classes) such as 64 x 17.
- Random kernels drawn as in tests/test_random_kernels.py, at sizes in the hundreds
  to thousands.
"""
import math
import os
import sys

import numpy as np
import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

import kadj
from kernels.cpu import GALLERY
from kernels.cpu.recorders import SHAPED
from kernels.cpu.recurrences import thomas_batched, thomas_batched_shaped
from kernels.cpu.reductions import softmax_cross_entropy, softmax_cross_entropy_shaped

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402
from test_random_kernels import SETTINGS, _compile, kernel_source  # noqa: E402

# The default run: kernels that record on a tape, and one of each other family (the
# whole gallery with -m slow, as CI runs it).
DEFAULT_GALLERY = {
    "heat_steps_scratch", "linear_recurrence", "thomas_batched", "softmax_f32",
    "logsumexp", "inplace_update_f32", "csr_spmv_transpose", "newton_cbrt_converge",
    "euler_until", "first_crossing",
}
# float32 sums over many terms lose the digits central differences need
FLOAT32_MAX_SIZE = 4099


def _gallery_params():
    params = []
    for ex in GALLERY:
        marks = () if ex.name in DEFAULT_GALLERY else (pytest.mark.slow,)
        params.append(pytest.param(ex, id=ex.name, marks=marks))
    return params


def test_every_gallery_kernel_has_a_size():
    missing = [ex.name for ex in GALLERY if ex.sized is None]
    assert not missing, f"gallery kernels without sized(rng, n): {missing}"
    names = {ex.name for ex in GALLERY}
    assert DEFAULT_GALLERY <= names, DEFAULT_GALLERY - names


@pytest.mark.parametrize("ex", GALLERY, ids=[ex.name for ex in GALLERY])
def test_sized_arguments_scale(ex):
    """sized(rng, n) keeps make_args' argument kinds and dtypes, grows with n, is
    deterministic and finite (no compilation: this is cheap)."""
    small = ex.make_args(np.random.default_rng(0))
    args = {n: ex.sized(np.random.default_rng(1), n) for n in (60, 960)}
    again = ex.sized(np.random.default_rng(1), 960)
    for n, a in args.items():
        assert len(a) == len(small), ex.name
        for got, ref in zip(a, small):
            assert type(got) is type(ref), (ex.name, n, type(got), type(ref))
            if isinstance(ref, np.ndarray):
                assert got.dtype == ref.dtype and got.ndim == ref.ndim, (ex.name, n)
                if got.dtype.kind == "f":
                    assert np.all(np.isfinite(got)), (ex.name, n)
    for x, y in zip(args[960], again):
        np.testing.assert_array_equal(x, y)
    elements = {n: sum(a.size for a in args[n] if isinstance(a, np.ndarray))
                for n in args}
    assert elements[960] >= 3 * elements[60], (ex.name, elements)


# the tape audit's size: loops of a few dozen trips, every gallery adjoint in seconds
AUDIT_SIZE = 40


@pytest.mark.parametrize("ex", GALLERY, ids=[ex.name for ex in GALLERY])
def test_gallery_tapes_audited(ex):
    """Every gallery adjoint (default run), its source run as Python with strict tapes
    (sweep.check_tapes): a push that no reservation or capacity check covers fails at
    any size, and so does a push that no pop matches (tape pointer not back at 0 at
    return), which the gradient checks miss until the tape overflows, at sizes the
    sweep may never reach (a scan inside a loop over elements records O(n^2))."""
    k = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    args = ex.sized(sweep.rng_for(ex.name, AUDIT_SIZE), AUDIT_SIZE)
    if not sweep.check_tapes(k, args):
        pytest.fail(f"{ex.name}: its adjoint source does not run as Python; audit it "
                    f"another way or mark it here")


# check_grad's step is relative to each input's size.  bracket_interp's knots sit at
# 0 .. m (m = n / 8) with unit spacing, and the output bends on the scale of that
# spacing: at n = 40009 the default step (6e-6 of 5000) leaves central differences a
# truncation error of 0.3 % (an adjoint exact to 1e-5 by Richardson extrapolation
# failed); 1e-7 keeps the step a small fraction of the spacing at every size.
SWEEP_EPS = {"bracket_interp": 1e-7}


@pytest.mark.parametrize("ex", _gallery_params())
def test_gallery_kernel_across_sizes(ex):
    k = kadj.differentiate(sweep.bounds_checked(ex.kernel), wrt=ex.wrt)
    cap = FLOAT32_MAX_SIZE if "float32" in ex.tags else None
    sizes, _model = sweep.sizes_for(k, ex.sized, max_size=cap)
    cases = ((f"n={n}", ex.sized(sweep.rng_for(ex.name, n), n)) for n in sizes)
    eps = {"eps": SWEEP_EPS[ex.name]} if ex.name in SWEEP_EPS else {}
    assert sweep.check_many(k, cases, wrt=ex.wrt, **eps) == len(sizes)


# ------------------------------------------------------------ nested-loop recorders

INNER = range(0, 13)
LONG_INNER = (0, 1, 2, 3, 5, 8, 12)
# Hundreds of chained tanh steps have large third derivatives: check_grad's default
# relative step (6e-6) leaves central differences a truncation error of ~1e-6 relative
# (an adjoint exact to 1e-12 by Richardson extrapolation failed at (2, 1500)); a step of
# 1e-6 keeps it ~40 times smaller.  Rounding noise is allowed for by check_grad.
RECORDER_EPS = 1e-6
# (outer, inner): carried_inner's (k + 1) * (inner + 1) == 1022 landing (inner 6,
# outer >= 147), inner loops longer than a whole tape, single trips, and outer loops
# long enough to pass 1024, 2048 and 4096 entries; to these each kernel adds, for
# every inner size 0 .. 12, the shapes where its outer trips end exactly at 1024 or
# 2048 entries (sweep.landing_shapes, from its push counts)
RECORDER_SHAPES = (
    {(146, 6), (147, 6), (300, 6), (1, 0), (5, 0), (1, 1), (2, 1500), (3, 1022),
     (1, 3000), (7, 333), (1023, 1), (64, 17), (17, 64)}
    | {(math.ceil(5000 / (d + 2)), d) for d in LONG_INNER})


@pytest.mark.parametrize("rec", SHAPED, ids=[r.name for r in SHAPED])
def test_nested_recorders_across_shapes(rec):
    k = kadj.differentiate(sweep.bounds_checked(rec.kernel))
    landings = sweep.landing_shapes(k, rec.shaped, INNER, sweep.CAPACITIES[:2])
    shapes = sorted(RECORDER_SHAPES | landings)
    cases = ((f"(outer, inner)={s}", rec.shaped(sweep.rng_for(rec.name, *s), *s))
             for s in shapes)
    assert sweep.check_many(k, cases, eps=RECORDER_EPS) == len(shapes)


# ------------------------------------------------- Thomas batches and cross-entropy

# (systems, unknowns); to these the test adds the shapes where a system ends with the
# tape exactly at 1024, 2048 or 4096 entries
THOMAS_SHAPES = {(1, 1), (1, 2000), (333, 1), (700, 8), (1999, 4), (2000, 4),
                 (2001, 6), (2048, 5), (4099, 3), (4100, 3), (64, 17)}
XENT_SHAPES = [(1, 1), (64, 17), (63, 17), (65, 17), (64, 16), (17, 64), (1000, 3),
               (3, 1000), (4099, 5), (257, 33)]


def test_thomas_batched_many_systems():
    k = kadj.differentiate(sweep.bounds_checked(thomas_batched))
    landings = sweep.landing_shapes(k, thomas_batched_shaped, (2, 3, 4, 5, 6, 8),
                                    sweep.CAPACITIES[:3])
    shapes = sorted(THOMAS_SHAPES | landings)
    cases = ((f"(systems, n)={s}", thomas_batched_shaped(sweep.rng_for("thomas", *s), *s))
             for s in shapes)
    assert sweep.check_many(k, cases) == len(shapes)


def test_thomas_batched_solves():
    """The kernel itself: x solves every system (an independent check of the args)."""
    lower, diag, upper, rhs, x = thomas_batched_shaped(np.random.default_rng(2), 50, 7)
    thomas_batched(lower, diag, upper, rhs, x)
    for s in range(50):
        a = np.diag(diag[s]) + np.diag(lower[s, 1:], -1) + np.diag(upper[s, :-1], 1)
        np.testing.assert_allclose(a @ x[s], rhs[s], rtol=1e-12, atol=1e-12)


def test_softmax_cross_entropy_batches():
    k = kadj.differentiate(sweep.bounds_checked(softmax_cross_entropy))
    cases = ((f"(batch, classes)={s}",
              softmax_cross_entropy_shaped(sweep.rng_for("xent", *s), *s))
             for s in XENT_SHAPES)
    assert sweep.check_many(k, cases) == len(XENT_SHAPES)


def test_softmax_cross_entropy_gradient_formula():
    """Against the analytic gradient (softmax - onehot) / batch at 64 x 17."""
    logits, labels = softmax_cross_entropy_shaped(np.random.default_rng(3), 64, 17)
    g = kadj.grad(softmax_cross_entropy)(logits, labels)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(64), labels] -= 1.0
    np.testing.assert_allclose(g, p / 64, rtol=1e-10, atol=1e-13)


# ------------------------------------------------------------------ random kernels

RANDOM_SIZES = (97, 1021, 1024, 1025, 4099)


def _random_data(seed, n):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.3, 1.5, n) * rng.choice([-1.0, 1.0], n)   # |x| >= 0.3: no ties
    return x, rng.uniform(-1.5, 1.5, n), float(rng.uniform(0.2, 1.2)), \
        rng.uniform(-1.0, 1.0, n)


@settings(max_examples=6, **SETTINGS)
@given(spec=kernel_source(), seed=st.integers(0, 2**16))
def test_random_kernels_at_large_sizes(private_cache_dir, spec, seed):
    lines, _returns = spec
    k, src = _compile(lines)
    note(src)
    sizes = set(RANDOM_SIZES)
    model = sweep.linear_push_model(k, lambda rng, n: _random_data(seed, n))
    if model:
        sizes |= {n for n in sweep.capacity_sizes(model, sweep.CAPACITIES[:3])
                  if n <= 40000}
    cases = ((f"n={n}", _random_data(seed + n, n)) for n in sorted(sizes))
    assert sweep.check_many(k, cases, wrt=k.wrt) == len(sizes)
