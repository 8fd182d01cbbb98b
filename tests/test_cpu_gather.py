"""The gather form of CPU stencil adjoints (kadj.gather_plan, kadj.cpu_gather).

Every gradient is checked against float64 central finite differences of the kernel
(tests/fdcheck.py), at several sizes down to the smallest (a 1-wide interior, an empty
loop), on non-square grids; the gather and scatter (``gather=False``) forms are
compared with each other; kernels that do not qualify keep the scatter form, for the
reason the plan gives.
"""
import numpy as np
import pytest
from numba import njit, prange

import kadj
from kadj.demo.kernels_cpu import diffuse
from kadj.targets.cpu import gather_form

from fdcheck import fd_check


@njit
def heat1d(u, u_new, alpha):
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@njit
def nine_point(u, v, c):
    n, m = u.shape
    for i in range(1, n - 1):
        for j in range(1, m - 1):
            s = (u[i - 1, j - 1] + u[i - 1, j + 1] + u[i + 1, j - 1] + u[i + 1, j + 1])
            e = u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
            v[i, j] = c * (0.25 * s + 0.5 * e - 3.0 * u[i, j]) + u[i, j] * u[i, j + 1]


@njit
def wide(x, y, a):
    n = x.shape[0]
    for i in range(2, n - 3):
        y[i] = a * x[i - 2] * x[i + 3] - np.sin(x[i + 1]) + x[i] * x[i]


@njit
def own_and_scalar(x, w, coef, y, s):
    """Reads a scalar (s), an array at the iteration's own index only (w) and an array
    at a fixed index (coef[1]: summed outside the gathered arrays)."""
    for i in range(1, x.shape[0] - 1):
        y[i] = s * w[i] * (x[i + 1] - x[i - 1]) + coef[1] * w[i] * x[i] + np.exp(s * x[i])


@njit
def prelude_scalar(x, y, a):
    """A value computed from a scalar before the loop, used by every iteration."""
    c = a * a + 1.0
    for i in range(1, x.shape[0] - 1):
        y[i] = c * (x[i + 1] - x[i - 1]) + a * x[i]


@njit
def transposed(u, v, a):
    """The inner loop runs over the array's first dimension."""
    n, m = u.shape
    for j in range(1, m - 1):
        for i in range(0, n - 1):
            v[i, j] = a * (u[i + 1, j] - u[i, j]) * u[i, j - 1] + u[i, j + 1]


@njit
def ahead_only(x, y, a):
    """Reads ahead only (offsets 1 and 2: no pass at offset 0 adds the sums)."""
    for i in range(0, x.shape[0] - 2):
        y[i] = a * x[i + 1] * x[i + 2] + x[i + 2]


@njit
def two_outputs(u, v, w, a):
    """Two arrays written per iteration, each consumed once."""
    for i in range(1, u.shape[0] - 1):
        v[i] = a * (u[i - 1] + u[i + 1])
        w[i] = u[i] * u[i + 1] * a


def _rng(seed):
    return np.random.default_rng(seed)


def make_own_and_scalar(r, n):
    return [r.standard_normal(n), r.standard_normal(n), r.standard_normal(3),
            r.standard_normal(n), 0.4]


CASES = [
    ("heat1d", heat1d, lambda r, n: [r.standard_normal(n), r.standard_normal(n), 0.3],
     [3, 4, 9]),
    ("diffuse", diffuse,
     lambda r, s: [r.standard_normal(s), r.standard_normal(s), r.random(s) + 0.5, 0.2],
     [(3, 3), (3, 5), (6, 4)]),
    ("nine_point", nine_point,
     lambda r, s: [r.standard_normal(s), r.standard_normal(s), 0.7],
     [(3, 3), (4, 6)]),
    ("wide", wide, lambda r, n: [r.standard_normal(n), r.standard_normal(n), 1.3],
     [5, 6, 9]),
    ("own_and_scalar", own_and_scalar,
     lambda r, n: [r.standard_normal(n), r.standard_normal(n), r.standard_normal(3),
                   r.standard_normal(n), 0.4], [3, 7]),
    ("prelude_scalar", prelude_scalar,
     lambda r, n: [r.standard_normal(n), r.standard_normal(n), 0.8], [3, 6]),
    ("transposed", transposed,
     lambda r, s: [r.standard_normal(s), r.standard_normal(s), 0.9], [(3, 3), (5, 4)]),
    ("ahead_only", ahead_only,
     lambda r, n: [r.standard_normal(n), r.standard_normal(n), 0.6], [3, 4, 5, 8]),
    ("two_outputs", two_outputs,
     lambda r, n: [r.standard_normal(n), r.standard_normal(n), r.standard_normal(n),
                   1.1], [3, 4, 5, 9]),
]


def _kernel(fn, **options):
    options.setdefault("gather", True)      # wherever the kernel qualifies
    return fn if isinstance(fn, kadj.DifferentiatedKernel) else \
        kadj.differentiate(fn, **options)


@pytest.mark.parametrize("name,fn,make,sizes", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(name, fn, make, sizes):
    k = _kernel(fn)
    for t, size in enumerate(sizes):
        args = make(_rng(t), size)
        assert "gather form" in k.adjoint_source(*args), name
        fd_check(k, args, seed=t)


def _adjoint(k, args, seed):
    """The adjoint buffers after one call with random incoming cotangents."""
    r = _rng(seed)
    plan = k.adjoint_plan(*args)
    bufs = [r.standard_normal(args[i].shape) if isinstance(args[i], np.ndarray)
            else np.zeros(1) for i in plan.adjoint_args]
    k.adjoint(*args, *bufs)
    return bufs


@pytest.mark.parametrize("name,fn,make,sizes", CASES, ids=[c[0] for c in CASES])
def test_gather_and_scatter_agree(name, fn, make, sizes):
    py = fn.dispatcher if isinstance(fn, kadj.DifferentiatedKernel) else fn
    gather = _kernel(fn)
    scatter = kadj.differentiate(py, wrt=gather.wrt, gather=False)
    args = make(_rng(5), sizes[-1])
    assert "gather form" not in scatter.adjoint_source(*args)
    for g, s in zip(_adjoint(gather, args, 1), _adjoint(scatter, args, 1)):
        np.testing.assert_allclose(g, s, rtol=1e-12, atol=1e-12)


def test_scalar_sums_in_the_gather_loop_and_consumption_behind_it():
    """Serial 1-D: a pass adds the scalar sums, and the interior consumes the outputs'
    adjoints of the iteration no later element reads; an iteration that also adds into
    another array's element (coef[1]) keeps its sums in the loop after."""
    r = _rng(0)
    for fn, args in ((heat1d, [r.standard_normal(9), np.zeros(9), 0.3]),
                     (ahead_only, [r.standard_normal(9), np.zeros(9), 0.6])):
        src = kadj.differentiate(fn, gather=True).adjoint_source(*args)
        assert "_sum_add(adj_" in src and "each iteration's sums" not in src, src
        assert "# the iteration no later element reads" in src, src
    args = make_own_and_scalar(r, 7)
    src = kadj.differentiate(own_and_scalar, gather=True).adjoint_source(*args)
    assert "each iteration's sums" in src and "no later element" not in src, src
    # 2-D: the sums in the gather loop, consumption after it (rows read later)
    args = [r.standard_normal((4, 5)), r.standard_normal((4, 5)), 0.7]
    src = kadj.differentiate(nine_point, gather=True).adjoint_source(*args)
    assert "each iteration's sums" not in src and "no later element" not in src, src


@pytest.mark.parametrize("n", range(3, 12))
def test_lagged_consumption_at_every_small_size(n):
    """Every size from the empty interior up: gradients equal the scatter form's, and
    every incoming output adjoint is consumed (zero after the call)."""
    r = _rng(n)
    for fn in (heat1d, ahead_only):
        args = [r.standard_normal(n), r.standard_normal(n), 0.45]
        g = _adjoint(kadj.differentiate(fn, gather=True), args, n)
        s = _adjoint(kadj.differentiate(fn, gather=False), args, n)
        for a, b in zip(g, s):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        written = g[1]
        lo, hi = (1, n - 1) if fn is heat1d else (0, n - 2)
        assert np.all(written[lo:hi] == 0.0)


@njit
def in_place(u, a):
    for i in range(1, u.shape[0]):
        u[i] = u[i] + a * u[i - 1]


@njit
def wraps(x, y):
    for i in range(x.shape[0]):
        y[i] = x[i - 1] * x[i]


@njit
def conditional(x, y):
    for i in range(1, x.shape[0] - 1):
        if x[i] > 0.0:
            y[i] = x[i - 1] * x[i + 1]


@njit
def overwritten(x, y, a):
    # (a regression: the gather form sent y[i]'s adjoint to x[i - 1] as well)
    for i in range(1, x.shape[0]):
        y[i] = x[i - 1]
        y[i] = x[i] * a


@njit(parallel=True)
def parallel_stencil(x, y):
    for i in prange(1, x.shape[0] - 1):
        y[i] = x[i - 1] * x[i + 1]


@pytest.mark.parametrize("fn,args,why", [
    (in_place, lambda r: [r.standard_normal(6), 0.5], "both read and written"),
    (wraps, lambda r: [r.standard_normal(6), r.standard_normal(6)], "below index 0"),
    (conditional, lambda r: [r.standard_normal(6), r.standard_normal(6)],
     "written under a condition"),
], ids=["in_place", "wraps", "conditional"])
def test_kernels_that_do_not_qualify_keep_the_scatter_form(fn, args, why):
    k = kadj.differentiate(fn)
    a = args(_rng(0))
    out = k.stages(*a, until="facts")
    nest, reason = gather_form(out["prepared"].kernel, out["facts"], k.options)
    assert nest is None and why in reason, reason
    assert "gather form" not in k.adjoint_source(*a)
    fd_check(k, a)


def test_an_overwritten_store_goes_and_the_stencil_takes_the_gather_form():
    """``y[i] = x[i - 1]`` is overwritten by the next statement, with nothing reading
    ``y`` between (kadj.store_forwarding drops it): one store per iteration, the gather
    form, and no adjoint reaches ``x[i - 1]`` (the regression: it did)."""
    k = kadj.differentiate(overwritten)
    a = [_rng(0).standard_normal(6), _rng(1).standard_normal(6), 0.6]
    src = k.adjoint_source(*a)
    assert "gather form" in src and "- 1]" not in src.split("# ---- reverse")[1], src
    fd_check(k, a)
    fd_check(kadj.differentiate(overwritten, gather=False), a)


def test_a_prange_stencil_takes_the_gather_form_in_parallel():
    """Its scatter form would race (adj_x[i - 1] += ...): the gather form is used,
    its loop over the elements run in parallel (tests/test_parallel_gather.py)."""
    k = kadj.differentiate(parallel_stencil)
    args = [_rng(2).standard_normal(7), np.zeros(7)]
    src = k.adjoint_source(*args)
    assert "gather form" in src and "numba.prange" in src
    fd_check(k, args)


def test_gather_option_is_checked():
    with pytest.raises(ValueError, match="gather must be True or False"):
        kadj.differentiate(heat1d, gather="yes").adjoint_source(
            np.zeros(4), np.zeros(4), 0.1)


def _bench_script():
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "bench_cpu.py"
    spec = importlib.util.spec_from_file_location("bench_cpu_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_expert_gather_adjoints_of_the_benchmark_agree_with_the_hand_written_ones():
    """scripts/bench_cpu.py's expert adjoints (gather form) against perf/cases_cpu.py's
    hand-written ones (checked against finite differences in test_perf_cases.py), down
    to the smallest grids, where the edges overlap."""
    from perf.cases_cpu import get_case
    bench = _bench_script()
    r = _rng(3)
    for name, shapes in (("heat1d", [(3,), (4,), (5,), (8,)]),
                         ("heat2d", [(3, 3), (3, 6), (5, 4), (7, 7)])):
        hand = get_case(name).hand_adjoint
        for shape in shapes:
            args = (r.standard_normal(shape), r.standard_normal(shape), 0.3)
            seeds = (r.standard_normal(shape), r.standard_normal(shape),
                     r.standard_normal(1))
            want = [s.copy() for s in seeds]
            hand(*args, *want)
            got = [s.copy() for s in seeds]
            bench.EXPERT[name](*args, *got)
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


# ---- stencil nests inside other loops (the steps of a time loop) -----------------------
from kernels.cpu.stencils import heat_steps_scratch as heat_steps  # noqa: E402


@njit
def heat2d_steps(u, c, nsteps):
    n, m = u.shape
    tmp = np.zeros((n, m))
    for step in range(nsteps):
        for i in range(1, n - 1):
            for j in range(1, m - 1):
                tmp[i, j] = u[i, j] + c * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1]
                                           + u[i, j + 1] - 4.0 * u[i, j])
        for i in range(1, n - 1):
            for j in range(1, m - 1):
                u[i, j] = tmp[i, j]


@njit
def alternating(u, w, a, nsteps):
    # two stencils, one per branch, and a while loop of steps
    n = u.shape[0]
    v = np.zeros(n)
    step = 0
    while step < nsteps:
        if step % 2 == 0:
            for i in range(1, n - 1):
                v[i] = a * u[i - 1] + u[i] * w[i] - a * u[i + 1]
        else:
            for i in range(2, n - 2):
                v[i] = u[i + 2] * a + u[i - 2] * w[i]
        for i in range(1, n - 1):
            u[i] = v[i]
        step += 1


@njit
def limited_steps(u, kappa, nsteps):
    # a nonlinear stencil (a division per iteration): its passes would recompute it
    n = u.shape[0]
    f = np.zeros(n)
    for step in range(nsteps):
        for i in range(1, n):
            d = u[i] - u[i - 1]
            f[i] = kappa * d / (1.0 + d * d)
        for i in range(1, n - 1):
            u[i] += f[i + 1] - f[i]


NESTED = [
    ("heat_steps", heat_steps, lambda r, n: [r.standard_normal(n), 0.2, 3], [3, 4, 5, 40],
     1),
    ("heat2d_steps", heat2d_steps, lambda r, s: [r.standard_normal(s), 0.1, 2],
     [(3, 3), (4, 6), (9, 7)], 1),
    ("alternating", alternating,
     lambda r, n: [r.standard_normal(n), r.standard_normal(n), 0.3, 3], [3, 4, 5, 6, 30],
     2),
]


@pytest.mark.parametrize("name,fn,make,sizes,nests", NESTED, ids=[c[0] for c in NESTED])
def test_stencil_nests_inside_a_time_loop(name, fn, make, sizes, nests):
    # each stencil nest of a step is reversed in the gather form, the rest scatter;
    # gradients against finite differences down to an empty interior, and the same
    # adjoint buffers as the scatter form
    k = kadj.differentiate(fn)
    scatter = kadj.differentiate(fn, gather=False)
    for t, size in enumerate(sizes):
        args = make(_rng(t), size)
        assert k.adjoint_source(*args).count("# gather form") == nests, name
        fd_check(k, args, seed=t)
        for g, s in zip(_adjoint(k, args, t), _adjoint(scatter, args, t)):
            np.testing.assert_allclose(g, s, rtol=1e-12, atol=1e-12)


def test_nested_nest_with_divisions_keeps_the_scatter_form():
    args = [_rng(0).standard_normal(12), 0.3, 3]
    k = kadj.differentiate(limited_steps)
    assert "gather form" not in k.adjoint_source(*args)
    fd_check(k, args)


def _scatter_by_default(fn, args, seed):
    """``fn``'s default adjoint is the scatter form, ``gather=True`` the gather form;
    both against finite differences and each other."""
    default = kadj.differentiate(fn)
    forced = kadj.differentiate(fn, gather=True)
    assert "gather form" not in default.adjoint_source(*args)
    assert "gather form" in forced.adjoint_source(*args)
    for k in (default, forced):
        fd_check(k, args)
    g, s = (_adjoint(k, [a.copy() if isinstance(a, np.ndarray) else a for a in args],
                     seed) for k in (forced, default))
    for a, b in zip(g, s):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


@njit
def sixth_laplacian(u, out, c):
    """A 9-point stencil whose iterations divide (``/ 6.0``)."""
    for i in range(1, u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            out[i, j] = (u[i - 1, j - 1] + u[i - 1, j + 1] + u[i + 1, j - 1] +
                         u[i + 1, j + 1] + 4.0 * (u[i - 1, j] + u[i + 1, j] +
                                                  u[i, j - 1] + u[i, j + 1]) -
                         20.0 * u[i, j]) * c / 6.0


@njit(parallel=True)
def sixth_laplacian_parallel(u, out, c):
    for i in prange(1, u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            out[i, j] = (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] -
                         4.0 * u[i, j]) * c / 6.0


def test_default_keeps_the_scatter_form_where_iterations_divide():
    """Each element's pass recomputes the adjoint of every iteration that reads it: nine
    divisions per element for a 9-point stencil that divides, where the scatter form
    makes one.  By default such a serial stencil keeps the scatter form; gather=True
    takes the gather form; a parallel one takes it by default (its scatter form would
    race).  Gradients against finite differences and equal to each other."""
    r = _rng(6)
    args = [r.standard_normal((7, 9)), np.zeros((7, 9)), 0.8]
    _scatter_by_default(sixth_laplacian, args, seed=3)
    par = kadj.differentiate(sixth_laplacian_parallel)
    src = par.adjoint_source(*args)
    assert "gather form" in src and "numba.prange" in src
    fd_check(par, args)


@njit
def seven_point(u, out, c):
    for i in range(1, u.shape[0] - 1):
        for j in range(1, u.shape[1] - 1):
            for k in range(1, u.shape[2] - 1):
                out[i, j, k] = c * (u[i - 1, j, k] + u[i + 1, j, k] + u[i, j - 1, k] +
                                    u[i, j + 1, k] + u[i, j, k - 1] + u[i, j, k + 1] -
                                    6.0 * u[i, j, k])


def test_default_keeps_the_scatter_form_of_a_serial_3d_stencil():
    """A serial 3-D stencil measured slower in the gather form than in the scatter
    form: the default keeps the scatter form, gather=True takes the gather form; both
    against finite differences and each other."""
    r = _rng(7)
    args = [r.standard_normal((4, 5, 6)), np.zeros((4, 5, 6)), 0.6]
    _scatter_by_default(seven_point, args, seed=5)
