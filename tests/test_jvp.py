"""Forward mode on the CPU: ``kernel.jvp`` and ``kernel.jvp_source``.

For gallery kernels (kernels/cpu), against independent references:

- the tangents ``jvp`` leaves in its buffers (and the tangent of a returned float) match
  central finite differences in float64 of the undecorated kernel along the same
  direction, and ``jvp`` changes the forward arguments exactly as a forward call;
- the dot-product test between ``jvp`` and ``.adjoint``: ``<J v, w> == <v, J^T w>`` for
  random ``v`` (tangents of the pre-call state) and ``w`` (cotangents of the post-call
  state), relative 1e-10 in float64.

A representative subset runs by default (stencils, carried loops, while/break,
branches, helpers, in-place updates, float32, returned floats); the rest of the gallery
is marked slow.  Then the call's own rules (launches compose, keyword tangents, wrong
buffers refused) and a kernel whose construct forward mode refuses with a located error.
"""
from __future__ import annotations

import math

import numba
import numpy as np
import pytest

import kadj
from kernels.cpu import GALLERY

SEED = 20240707
DEFAULT = {"heat_step", "heat_steps_scratch", "gauss_seidel_1d", "burgers_step",
           "heat_step_f32", "linear_recurrence", "rk4_pendulum", "newton_cbrt_converge",
           "euler_until", "csr_spmv_transpose", "huber_loss", "budget_sum",
           "first_crossing", "inplace_update_f32", "clip"}
CASES = [pytest.param(ex, id=ex.name,
                      marks=() if ex.name in DEFAULT else pytest.mark.slow)
         for ex in GALLERY]

_KERNELS, _F64 = {}, {}


def differentiated(ex):
    if ex.name not in _KERNELS:
        _KERNELS[ex.name] = kadj.differentiate(ex.kernel, wrt=ex.wrt)
    return _KERNELS[ex.name]


def float64_kernel(ex):
    if "float32" not in ex.tags:
        return ex.kernel
    if ex.name not in _F64:
        _F64[ex.name] = numba.njit(ex.kernel.py_func)
    return _F64[ex.name]


def copy_args(args):
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)


def to64(a):
    if isinstance(a, np.ndarray) and a.dtype.kind == "f":
        return a.astype(np.float64)
    if isinstance(a, (float, np.floating)):
        return float(a)
    return a.copy() if isinstance(a, np.ndarray) else a


def directions(args, plan, rng):
    """A random tangent per slot (arrays shaped like their argument, scalars as
    1-element arrays), in slot order."""
    out = []
    for i in plan.adjoint_args:
        a = args[i]
        if isinstance(a, np.ndarray):
            out.append(rng.standard_normal(a.shape).astype(a.dtype))
        else:
            out.append(rng.standard_normal(1).astype(np.asarray(a).dtype))
    return out


def fd_tangents(fn, args, plan, v, rel_eps=1e-6):
    """Central differences in float64 along ``v``: the post-call state of every array
    slot, and the returned value (or None)."""
    base = [to64(a) for a in args]
    h = rel_eps * max(1.0, max(float(np.max(np.abs(np.asarray(base[i], float))))
                               for i in plan.adjoint_args))

    def run(sign):
        a = [x.copy() if isinstance(x, np.ndarray) else x for x in base]
        for i, d in zip(plan.adjoint_args, v):
            d64 = np.asarray(d, np.float64)
            if isinstance(a[i], np.ndarray):
                a[i] = a[i] + sign * h * d64
            else:
                a[i] = a[i] + sign * h * float(d64[0])
        r = fn(*a)
        return a, r

    (ap, rp), (am, rm) = run(1.0), run(-1.0)
    out = {i: (ap[i] - am[i]) / (2 * h) for i in plan.adjoint_args
           if isinstance(base[i], np.ndarray)}
    ret = None if rp is None else (float(rp) - float(rm)) / (2 * h)
    return out, ret


def close(got, ref, rtol, what):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale, err_msg=what)


@pytest.mark.parametrize("ex", CASES)
def test_jvp_matches_finite_differences(ex):
    k = differentiated(ex)
    args = tuple(ex.make_args(np.random.default_rng(SEED)))
    plan = k.adjoint_plan(*args)
    v = directions(args, plan, np.random.default_rng(SEED + 1))
    ref_fwd = copy_args(args)
    r_ref = ex.kernel(*ref_fwd)
    fd, fd_ret = fd_tangents(float64_kernel(ex), args, plan, v)

    run_args, tangents = copy_args(args), [d.copy() for d in v]
    r = k.jvp(*run_args, *tangents)

    for a, b in zip(run_args, ref_fwd):     # the forward ran, as a forward call
        np.testing.assert_array_equal(a, b)
    f32 = "float32" in ex.tags
    rtol = 2e-3 if f32 else 1e-5
    for i, d0, d in zip(plan.adjoint_args, v, tangents):
        name = f"{ex.name}: dot_{plan.arg_names[i]}"
        assert d.dtype == np.asarray(args[i]).dtype, name
        if isinstance(args[i], np.ndarray):
            close(d, fd[i], rtol, name)
        else:
            np.testing.assert_array_equal(d, d0, err_msg=name + " (read, not written)")
    if plan.returns_value:
        value, tangent = r
        assert value == r_ref
        close(tangent, fd_ret, rtol, f"{ex.name}: tangent of the returned value")
    else:
        assert r is None


@pytest.mark.parametrize("ex", CASES)
def test_jvp_is_the_transpose_of_the_adjoint(ex):
    """<J v, w> == <v, J^T w>: jvp and .adjoint are the same linear map, transposed."""
    k = differentiated(ex)
    args = tuple(ex.make_args(np.random.default_rng(SEED)))
    plan = k.adjoint_plan(*args)
    rng = np.random.default_rng(SEED + 2)
    v = directions(args, plan, rng)
    w = directions(args, plan, rng)
    w_ret = 0.7

    tangents = [d.copy() for d in v]
    r = k.jvp(*copy_args(args), *tangents)
    adjoints = [c.copy() for c in w]
    if plan.returns_value:
        k.adjoint(*args, *adjoints, adj_return=w_ret)
    else:
        k.adjoint(*args, *adjoints)

    def dot(a, b):
        return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))

    lhs = sum(dot(jv, wi) for jv, wi in zip(tangents, w))    # scalars: J v is v
    if plan.returns_value:
        lhs += float(r[1]) * w_ret
    rhs = sum(dot(vi, jtw) for vi, jtw in zip(v, adjoints))
    tol = 1e-4 if "float32" in ex.tags else 1e-10
    scale = max(1.0, sum(abs(dot(a, a)) for a in tangents) ** 0.5 *
                sum(abs(dot(b, b)) for b in w) ** 0.5)
    assert abs(lhs - rhs) <= tol * max(abs(lhs), abs(rhs), 1e-3 * scale), \
        (ex.name, lhs, rhs)


# ---- the call ------------------------------------------------------------------------
@numba.njit
def _step(u, u_new, alpha):
    for i in range(1, u.shape[0] - 1):
        u_new[i] = u[i] + alpha * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@numba.njit
def _chain(x, y, out):
    """A value overwritten by rules that read their result (exp, sqrt) and by itself,
    and an array updated in place from its own previous element."""
    for i in range(x.shape[0]):
        s = x[i] * y[0]
        s = s * s
        s = math.exp(s)
        s = math.sqrt(s + out[i])
        out[i] = s
    for i in range(1, out.shape[0]):
        out[i] = out[i] * out[i - 1] + 0.5 * out[i]


def _fd(fn, args, slots, v, h=1e-6):
    plus = [a + h * d if i in slots else a.copy() for i, (a, d) in
            enumerate(zip(args, v))]
    minus = [a - h * d if i in slots else a.copy() for i, (a, d) in
             enumerate(zip(args, v))]
    fn(*plus)
    fn(*minus)
    return [(p - m) / (2 * h) for p, m in zip(plus, minus)]


def test_overwritten_values_and_in_place_updates():
    k = kadj.differentiate(_chain)
    rng = np.random.default_rng(3)
    x, y, out = rng.uniform(-1, 1, 7), np.array([0.8]), rng.uniform(0.1, 1, 7)
    v = [rng.standard_normal(7), rng.standard_normal(1), rng.standard_normal(7)]
    ref = _fd(_chain, (x, y, out), {0, 1, 2}, v)
    dx, dy, dout = (d.copy() for d in v)
    k.jvp(x, y, out, dx, dy, dout)
    close(dout, ref[2], 1e-6, "dot_out")
    np.testing.assert_array_equal(dx, v[0])   # read-only arrays: tangents unchanged
    src = k.jvp_source()
    assert "def _chain_jvp(x, y, out, dot_x, dot_y, dot_out):" in src
    assert "math.exp(" in src and "dot_out[i] = " in src


@numba.njit
def _scale_column(w, c):
    for k in range(w.shape[0]):
        w[k] = w[k] * c * w[k]


@numba.njit
def _through_column_views(m, a):
    # a helper writing into column views (m[:, 1], m[1:, 2]): the slices of the views'
    # index tuples are no values of the kernel (the tangent read one never defined)
    _scale_column(m[:, 1], a)
    w = m[1:, 2]
    for k in range(w.shape[0]):
        w[k] = w[k] + a * w[k - 1]


def test_views_of_columns_written_by_a_helper():
    k = kadj.differentiate(_through_column_views)
    rng = np.random.default_rng(8)
    m, a = rng.uniform(0.5, 1.0, (5, 3)), 0.7
    v = [rng.standard_normal((5, 3)), np.array([0.3])]
    ref = _fd(lambda mm, aa: _through_column_views(mm, aa[0]), (m, np.array([a])),
              {0, 1}, v)
    dm = v[0].copy()
    got = m.copy()
    k.jvp(got, a, dm, v[1].copy())
    expected = m.copy()
    _through_column_views(expected, a)
    np.testing.assert_array_equal(got, expected)
    close(dm, ref[0], 1e-6, "dot_m")
    # and the Hessian-vector product of a loss through them (kadj.hvp built on the
    # tangent), against central differences of the gradient
    hv = kadj.hvp(_loss_of_views, argnums=0)(m, a, v[0])
    grad = kadj.grad(_loss_of_views, argnums=0)
    h = 1e-6
    ref = (grad(m + h * v[0], a) - grad(m - h * v[0], a)) / (2 * h)
    close(hv, ref, 1e-6, "hvp")


@numba.njit
def _loss_of_views(m, a):
    c = np.empty((m.shape[0], m.shape[1]))
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            c[i, j] = m[i, j]
    _through_column_views(c, a)
    s = 0.0
    for i in range(c.shape[0]):
        for j in range(c.shape[1]):
            s += c[i, j] * c[i, j]
    return s


def test_launches_compose_over_the_same_tangent_buffers():
    """Two steps ping-ponging between u and w, jvp called in the same order over the
    same tangent buffers, against finite differences of the two-step map."""
    k = kadj.differentiate(_step)
    rng = np.random.default_rng(4)
    u, w = rng.standard_normal(9), rng.standard_normal(9)
    alpha = 0.3
    du, dw, da = rng.standard_normal(9), rng.standard_normal(9), rng.standard_normal(1)

    def two_steps(u, w, alpha):
        _step(u, w, alpha)
        _step(w, u, alpha)

    h = 1e-6
    up, wp, um, wm = u + h * du, w + h * dw, u - h * du, w - h * dw
    two_steps(up, wp, alpha + h * da[0])
    two_steps(um, wm, alpha - h * da[0])
    tu, tw = du.copy(), dw.copy()
    k.jvp(u, w, alpha, tu, tw, da)
    k.jvp(w, u, alpha, tw, tu, da)
    close(tu, (up - um) / (2 * h), 1e-6, "dot_u after two launches")
    close(tw, (wp - wm) / (2 * h), 1e-6, "dot_w after two launches")


def test_tangents_by_keyword_and_checked_buffers():
    k = kadj.differentiate(_step)
    u, un = np.linspace(0, 1, 6), np.zeros(6)
    du, dun = np.ones(6), np.zeros(6)
    k.jvp(u, un, 0.5, dot_u=du, dot_u_new=dun, dot_alpha=np.zeros(1))
    np.testing.assert_allclose(dun[1:-1], du[1:-1])      # alpha * (1 - 2 + 1) = 0
    with pytest.raises(ValueError, match="dot_u_new"):
        k.jvp(u, un, 0.5, du, np.zeros(5), np.zeros(1))
    with pytest.raises(ValueError, match="dot_alpha"):
        k.jvp(u, un, 0.5, du, dun, np.zeros(2))
    with pytest.raises(TypeError, match="tangent"):
        k.jvp(u, un, 0.5, du, dun)
    with pytest.raises(TypeError, match="dot_alpha"):
        k.jvp(u, un, 0.5, du, dun, dot_alhpa=np.zeros(1))


def test_repeated_calls_of_one_signature_keep_every_check():
    """A repeated call skips only the checks its signature decides: changed shapes,
    shared memory and a wrong scalar buffer are still refused, and a repeated call
    computes what a first call does (analytic tangent of the heat step)."""
    k = kadj.differentiate(_step)
    rng = np.random.default_rng(8)
    u, du = rng.standard_normal(7), rng.standard_normal(7)
    un, dun, da = np.zeros(7), np.zeros(7), np.array([0.7])
    for _ in range(2):
        k.jvp(u, un, 0.5, du, dun, da)
        lap = u[:-2] - 2.0 * u[1:-1] + u[2:]
        dlap = du[:-2] - 2.0 * du[1:-1] + du[2:]
        np.testing.assert_allclose(dun[1:-1], du[1:-1] + 0.7 * lap + 0.5 * dlap,
                                   rtol=1e-14, atol=1e-14)
    with pytest.raises(ValueError, match="dot_u_new"):
        k.jvp(u, un, 0.5, du, np.zeros(8), da)               # shape
    with pytest.raises(ValueError, match="share"):
        k.jvp(u, un, 0.5, du, du, da)                        # one buffer twice
    with pytest.raises(ValueError, match="share"):
        k.jvp(u, un, 0.5, du, un, da)                        # a buffer is an argument
    with pytest.raises(ValueError, match="dot_alpha"):
        k.jvp(u, un, 0.5, du, dun, np.zeros(2))              # scalar buffer
    base = rng.standard_normal(14)                 # views of one array: apart, then not
    k.jvp(base[:7], base[7:], 0.5, du, dun, da)
    with pytest.raises(ValueError, match="overlaps"):
        k.jvp(base[:7], base[3:10], 0.5, du, dun, da)


def test_tangent_refusals_speak_of_tangents():
    """The buffer checks k.jvp shares with k.adjoint name jvp and tangents, not the
    adjoint, and leave the arguments and tangents as they were."""
    from numpy.lib.stride_tricks import as_strided
    k = kadj.differentiate(_step)
    u, un = np.linspace(0, 1, 6), np.zeros(6)
    du, dun, da = np.ones(6), np.zeros(6), np.zeros(1)
    ro = np.zeros(6)
    ro.flags.writeable = False
    cases = [
        ((u, un, 0.5, u, dun, da), "dot_u shares memory with the forward argument 'u', "
                                   "which jvp would then modify; tangents must be "
                                   "separate arrays"),
        ((u, un, 0.5, du, du, da), "the tangents dot_u and dot_u_new share memory"),
        ((u, un, 0.5, du, ro, da), "dot_u_new is read-only, and jvp updates the tangents "
                                   "in place"),
        ((u, un, 0.5, du, dun, np.zeros(2)), r"dot_alpha \(the tangent of the scalar "
                                             r"alpha\) must be a 1-element array"),
        ((u, un, 0.5, as_strided(np.ones(1), (6,), (0,)), dun, da),
         "several elements of dot_u share memory .*, so their tangents would be mixed"),
    ]
    for args, match in cases:
        before = [np.array(a, copy=True) for a in args]
        with pytest.raises(ValueError, match=r"^_step.jvp: " + match) as info:
            k.jvp(*args)
        assert "adjoint" not in str(info.value), info.value
        for a, b in zip(args, before):
            np.testing.assert_array_equal(a, b)


def test_jvp_and_adjoint_are_cached_apart():
    from kadj import jvp_call, pipeline
    k = kadj.differentiate(_step)
    args = (np.zeros(5), np.zeros(5), 0.1)
    req = k.request(k._arg_types(args))
    assert jvp_call.cache_key(k.target, req) != pipeline.cache_key(k.target, req)
    assert "def _step_jvp(" in k.jvp_source(*args)
    assert "def _step_adjoint(" in k.adjoint_source(*args)
    assert "def _step_jvp(" in k.show_stage("tangent", *args)


@numba.njit
def _no_rule(x, out):
    for i in range(x.shape[0]):
        out[i] = np.logaddexp(x[i], 0.5)


def test_a_call_without_a_rule_is_refused_with_its_line():
    k = kadj.differentiate(_no_rule)
    x, out = np.full(4, 1.5), np.zeros(4)
    with pytest.raises(kadj.DifferentiationError) as info:
        k.jvp(x, out, np.ones(4), np.zeros(4))
    msg = str(info.value)
    line = _no_rule.py_func.__code__.co_firstlineno + 3
    assert "'_no_rule'" in msg and f"test_jvp.py:{line}" in msg and "logaddexp" in msg
    assert "register_adjoint" in msg
    np.testing.assert_array_equal(out, 0.0)      # nothing ran


@numba.njit
def _loss(x, w, n):
    s = 0.0
    for i in range(n):
        s += w * math.sin(x[i]) ** 2
    return s


def test_functional_jvp_of_a_function_returning_a_float():
    x, w = np.linspace(0.1, 1.0, 5), 1.7
    dx, dw = np.random.default_rng(5).standard_normal(5), -0.4
    value, tangent = kadj.jvp(_loss, (x, w, 5), (dx, dw, None))
    assert value == _loss(x, w, 5)
    ref = float(np.sum(2 * w * np.sin(x) * np.cos(x) * dx) + dw * np.sum(np.sin(x) ** 2))
    assert abs(tangent - ref) <= 1e-12 * max(1.0, abs(ref))
    with pytest.raises(TypeError, match="'n' has no tangent"):
        kadj.jvp(_loss, (x, w, 5), (dx, dw, 1.0))


# ---- the carried tangent of a recurrence is added last ---------------------------------
@numba.njit
def _horner_rows(c, x, y):
    k = c.shape[0]
    for i in range(x.shape[0]):
        xi = x[i]
        p = c[k - 1]
        for j in range(k - 2, -1, -1):
            p = p * xi + c[j]
        y[i] = p


def test_recurrence_tangent_adds_its_carried_term_last():
    k = kadj.differentiate(_horner_rows)
    rng = np.random.default_rng(11)
    c, x = rng.standard_normal(6), rng.uniform(-1.2, 1.2, 7)
    y = np.zeros(7)
    dc, dx, dy = rng.standard_normal(6), rng.standard_normal(7), rng.standard_normal(7)
    src = k.jvp_source(c, x, y)
    line = [ln.strip() for ln in src.splitlines() if ln.strip().startswith("dot_p =")][-1]
    assert line.endswith("+ dot_p * xi"), src       # the chain through dot_p: * then +
    k.jvp(c, x, y, dc, dx, dy)
    # analytic: y = P(x) = sum c_j x^j, dy = P'(x) dx + sum_j dc_j x^j
    poly, dpoly = np.polynomial.Polynomial(c), np.polynomial.Polynomial(c).deriv()
    np.testing.assert_allclose(y, poly(x), rtol=1e-13, atol=1e-13)
    ref = dpoly(x) * dx + np.polynomial.Polynomial(dc)(x)
    np.testing.assert_allclose(dy, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("text, expected", [
    ("dot_x * a + dot_a * x + dot_b", "dot_a * x + dot_b + dot_x * a"),
    ("dot_a * x - dot_x * a + dot_b", "dot_a * x + dot_b - dot_x * a"),
    ("dot_x * a + (dot_a * x + dot_b) - dot_c", "dot_a * x + dot_b - dot_c + dot_x * a"),
    ("dot_x + dot_a * x", None),                      # two terms: the chain is one add
    ("dot_x * a - dot_a * x + dot_b", None),          # would start with a subtraction
    ("dot_x * a + dot_x * b + dot_c", None),          # the carried tangent twice
    ("dot_a * x + dot_b + dot_x * a", None),          # already last
    ("(dot_x * a + dot_b) * c", None),                # not a sum
])
def test_reorder_moves_the_carried_term_and_keeps_the_sum(text, expected):
    from kadj.tangent_sums import reorder
    got = reorder(text, "dot_x")
    assert got == expected
    if got is not None:
        rng = np.random.default_rng(3)
        for _ in range(20):
            env = dict(zip(("dot_x", "dot_a", "dot_b", "dot_c", "a", "x", "c"),
                           rng.standard_normal(7)))
            want = eval(text, {}, env)
            assert abs(eval(got, {}, env) - want) <= 1e-12 * max(1.0, abs(want))
