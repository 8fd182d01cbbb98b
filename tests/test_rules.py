"""Tests driven by the derivative-rule table itself (kadj/rules.py).

1. Every rule with a ``domain`` is checked numerically: ``rule.vjp(1.0, out, *args)`` at
   random points of its domain against central finite differences of the primal (the
   first table key that plain Python can call on floats), and for linearity in ``g``.
2. Every rule applied to :func:`kadj.ops.var` symbols yields Sym expressions over
   ``{g, out, args}`` only, and those expressions evaluate to the numeric rule.
3. End to end: tiny ``@njit`` kernels generated from source text, one per supported math
   function (one- and two-argument, array and scalar operands, float32), checked with
   ``fdcheck.fd_check`` on inputs drawn from the rule's own domain.
"""
import math
import operator
import os
import sys
import zlib

import numpy as np
import pytest
from numba import njit

import kadj
from kadj import ops
from kadj.ops import Sym
from kadj.rules import RULES, lookup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fdcheck import fd_check  # noqa: E402


pytestmark = pytest.mark.usefixtures("private_cache_dir")


def _distinct_rules():
    seen, out = set(), []
    for r in RULES.values():
        if id(r) not in seen:
            seen.add(id(r))
            out.append(r)
    return out


ALL_RULES = _distinct_rules()
DOMAIN_RULES = [r for r in ALL_RULES if r.domain]


def _rng(rule, salt=0):
    return np.random.default_rng(zlib.crc32(f"{rule.name}/{salt}".encode()))


def _sample(rule, rng):
    """One point of the rule's domain: floats, and ``int_args`` for integer slots."""
    args = []
    for j, dom in enumerate(rule.domain):
        if dom is None:
            v = rule.int_args[j]
            if isinstance(v, (list, tuple)):
                v = v[int(rng.integers(len(v)))]
            args.append(int(v))
        else:
            lo, hi = dom
            args.append(float(rng.uniform(lo, hi)))
    return args


def _primal(rule, args):
    """The first key of the table mapping to ``rule`` that plain Python can call."""
    for key, r in RULES.items():
        if r is not rule or not callable(key):
            continue
        try:
            val = float(key(*args))
        except Exception:
            continue
        if math.isfinite(val):
            return key
    pytest.fail(f"no key of rule {rule.name} is callable on floats {args}")


def _float_slots(rule):
    return [j for j, dom in enumerate(rule.domain) if dom is not None]


@pytest.mark.parametrize("rule", DOMAIN_RULES, ids=[r.name for r in DOMAIN_RULES])
def test_rule_matches_finite_differences(rule):
    rng = _rng(rule)
    for _ in range(5):
        args = _sample(rule, rng)
        f = _primal(rule, args)
        out = float(f(*args))
        contribs = rule.vjp(1.0, out, *args)
        assert isinstance(contribs, tuple) and len(contribs) == len(args), (
            f"{rule.name}: vjp must return one contribution per argument, got {contribs!r}")
        for j in _float_slots(rule):
            c = contribs[j]
            if c is None:
                continue
            h = 1e-6 * max(1.0, abs(args[j]))
            ap, am = list(args), list(args)
            ap[j] += h
            am[j] -= h
            fd = (float(f(*ap)) - float(f(*am))) / (2 * h)
            assert np.isclose(float(c), fd, rtol=1e-5, atol=1e-8), (
                f"{rule.name} ({f!r}) d/d arg{j} at {args}: rule {float(c)!r}, "
                f"finite difference {fd!r}")


@pytest.mark.parametrize("rule", DOMAIN_RULES, ids=[r.name for r in DOMAIN_RULES])
def test_rule_is_linear_in_g(rule):
    rng = _rng(rule, salt=1)
    for _ in range(5):
        args = _sample(rule, rng)
        out = float(_primal(rule, args)(*args))
        c1 = rule.vjp(1.0, out, *args)
        c25 = rule.vjp(2.5, out, *args)
        for j, (a, b) in enumerate(zip(c1, c25)):
            assert (a is None) == (b is None), f"{rule.name}: arg{j} None-ness depends on g"
            if a is not None:
                assert np.isclose(float(b), 2.5 * float(a), rtol=1e-12, atol=1e-300), (
                    f"{rule.name} arg{j} at {args}: vjp(2.5) = {b}, 2.5 * vjp(1) = {2.5 * a}")


def test_rule_names_are_unique():
    names = [r.name for r in ALL_RULES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_nondifferentiable_and_rules_are_disjoint():
    both = [k for k in kadj.rules.NONDIFFERENTIABLE if k in RULES]
    assert not both, f"functions both with a rule and marked non-differentiable: {both}"


# ---- symbolic application ------------------------------------------------------------
def _nargs(rule):
    if rule.nargs and rule.domain:
        return rule.nargs
    import inspect
    params = [p for p in inspect.signature(rule.vjp).parameters.values()
              if p.default is inspect.Parameter.empty]
    return len(params) - 2


_ARITH = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
          "div": operator.truediv, "neg": operator.neg}


def _eval(s, env):
    """Evaluate a Sym on numbers with kadj.ops' own numeric definitions."""
    if not isinstance(s, Sym):
        return s
    if s.kind == "var":
        return env[s.name]
    if s.kind == "const":
        return s.value
    args = [_eval(a, env) for a in s.args]
    if s.name in _ARITH:
        return _ARITH[s.name](*args)
    fn = getattr(ops, s.name, None)
    assert callable(fn), f"Sym op {s.name!r} has no numeric counterpart in kadj.ops"
    return fn(*args)


@pytest.mark.parametrize("rule", ALL_RULES, ids=[r.name for r in ALL_RULES])
def test_rule_on_symbols(rule):
    n = _nargs(rule)
    names = [f"x{j}" for j in range(n)]
    res = rule.vjp(ops.var("g"), ops.var("out"), *[ops.var(v) for v in names])
    assert isinstance(res, tuple) and len(res) == n, res
    allowed = {"g", "out", *names}
    for j, e in enumerate(res):
        if e is None:
            continue
        assert isinstance(e, Sym), f"{rule.name} arg{j}: {e!r} is not a Sym"
        assert e.variables() <= allowed, (
            f"{rule.name} arg{j} reads {e.variables() - allowed}")
    if not rule.domain:
        return
    # the symbolic expression (what codegen prints) agrees with the numeric rule
    rng = _rng(rule, salt=2)
    for _ in range(3):
        args = _sample(rule, rng)
        out = float(_primal(rule, args)(*args))
        env = {"g": 0.75, "out": out, **dict(zip(names, args))}
        num = rule.vjp(0.75, out, *args)
        for j, (e, v) in enumerate(zip(res, num)):
            if e is None:
                assert v is None
                continue
            assert np.isclose(float(_eval(e, env)), float(v), rtol=1e-12, atol=1e-300), (
                f"{rule.name} arg{j}: symbolic {_eval(e, env)} vs numeric {v} at {args}")


# ---- end to end: generated kernels -----------------------------------------------------
# (label, expression over placeholders A/B, table key whose domain is used)
UNARY = [
    ("sin", "math.sin(A)", math.sin), ("cos", "math.cos(A)", math.cos),
    ("tan", "math.tan(A)", math.tan), ("asin", "math.asin(A)", math.asin),
    ("acos", "math.acos(A)", math.acos), ("atan", "math.atan(A)", math.atan),
    ("sinh", "math.sinh(A)", math.sinh), ("cosh", "math.cosh(A)", math.cosh),
    ("tanh", "math.tanh(A)", math.tanh), ("asinh", "math.asinh(A)", math.asinh),
    ("acosh", "math.acosh(A)", math.acosh), ("atanh", "math.atanh(A)", math.atanh),
    ("exp", "math.exp(A)", math.exp), ("expm1", "math.expm1(A)", math.expm1),
    ("log", "math.log(A)", math.log), ("log1p", "math.log1p(A)", math.log1p),
    ("log2", "math.log2(A)", math.log2), ("log10", "math.log10(A)", math.log10),
    ("sqrt", "math.sqrt(A)", math.sqrt), ("erf", "math.erf(A)", math.erf),
    ("erfc", "math.erfc(A)", math.erfc), ("abs", "abs(A)", abs),
    ("fabs", "math.fabs(A)", math.fabs), ("neg", "-A", operator.neg),
    ("np_cbrt", "np.cbrt(A)", np.cbrt), ("np_exp2", "np.exp2(A)", np.exp2),
    ("np_sin", "np.sin(A)", np.sin), ("np_exp", "np.exp(A)", np.exp),
    ("np_log", "np.log(A)", np.log), ("np_square", "np.square(A)", np.square),
    ("np_abs", "np.abs(A)", np.abs), ("np_tanh", "np.tanh(A)", np.tanh),
    ("np_arcsinh", "np.arcsinh(A)", np.arcsinh), ("np_sqrt", "np.sqrt(A)", np.sqrt),
]
if hasattr(math, "exp2"):
    UNARY.append(("exp2", "math.exp2(A)", math.exp2))
BINARY = [
    ("add", "A + B", operator.add), ("sub", "A - B", operator.sub),
    ("mul", "A * B", operator.mul), ("truediv", "A / B", operator.truediv),
    ("pow_op", "A ** B", operator.pow), ("math_pow", "math.pow(A, B)", math.pow),
    ("np_power", "np.power(A, B)", np.power),
    ("atan2", "math.atan2(A, B)", math.atan2), ("np_arctan2", "np.arctan2(A, B)", np.arctan2),
    ("hypot", "math.hypot(A, B)", math.hypot), ("np_hypot", "np.hypot(A, B)", np.hypot),
    ("min", "min(A, B)", min), ("max", "max(A, B)", max),
    ("np_minimum", "np.minimum(A, B)", np.minimum), ("np_maximum", "np.maximum(A, B)", np.maximum),
    ("copysign", "math.copysign(A, B)", math.copysign),
]


_counter = [0]


def _make_kernel(label, body_expr, params, out):
    """``def k_<label>(params..., out): for i: out[i] = expr`` compiled from source text."""
    _counter[0] += 1
    name = f"k_{label}_{_counter[0]}"
    src = (f"def {name}({', '.join(params)}, {out}):\n"
           f"    for i in range({params[0]}.shape[0]):\n"
           f"        {out}[i] = {body_expr}\n")
    # __name__ in the globals: see test_random_kernels for what happens without it
    ns = {"math": math, "np": np, "__name__": __name__}
    exec(compile(src, f"<kadj test_rules {name}>", "exec"), ns)
    return kadj.differentiate(njit(ns[name])), src


def _draw(rng, dom, n, dtype=np.float64):
    lo, hi = dom
    return rng.uniform(lo, hi, n).astype(dtype)


def _away_from_ties(label, a, b):
    """min/max: keep the two operands apart so finite differences are meaningful."""
    if label in ("min", "max", "np_minimum", "np_maximum"):
        b = np.where(np.abs(a - b) < 0.05, b + 0.2, b)
    return a, b


@pytest.mark.parametrize("label,expr,key", UNARY, ids=[u[0] for u in UNARY])
def test_unary_kernel_gradient(label, expr, key):
    rule = lookup(key)
    assert rule is not None, f"no rule for {key!r}"
    rng = np.random.default_rng(zlib.crc32(label.encode()))
    k, src = _make_kernel(label, expr.replace("A", "x[i]"), ["x"], "y")
    x = _draw(rng, rule.domain[0], 6)
    fd_check(k, (x, np.zeros(6)), rtol=1e-5, atol=1e-8)


# (the scalar-first form of every rule runs with -m slow, as CI does)
BIN_CASES = [pytest.param(*b, form, id=f"{b[0]}-{form}",
                          marks=[pytest.mark.slow] if form == "scalar_first" else [])
             for form in ("arrays", "scalar_second", "scalar_first") for b in BINARY]


@pytest.mark.parametrize("label,expr,key,form", BIN_CASES)
def test_binary_kernel_gradient(label, expr, key, form):
    rule = lookup(key)
    assert rule is not None, f"no rule for {key!r}"
    rng = np.random.default_rng(zlib.crc32(f"{label}/{form}".encode()))
    n = 6
    if form == "arrays":
        body, params = expr.replace("A", "x[i]").replace("B", "w[i]"), ["x", "w"]
        a, b = _away_from_ties(label, _draw(rng, rule.domain[0], n),
                               _draw(rng, rule.domain[1], n))
        args = (a, b, np.zeros(n))
    elif form == "scalar_second":
        body, params = expr.replace("A", "x[i]").replace("B", "s"), ["x", "s"]
        s = float(_draw(rng, rule.domain[1], 1)[0])
        a, _ = _away_from_ties(label, _draw(rng, rule.domain[0], n), np.full(n, s))
        args = (a, s, np.zeros(n))
    else:
        body, params = expr.replace("A", "s").replace("B", "x[i]"), ["x", "s"]
        s = float(_draw(rng, rule.domain[0], 1)[0])
        b = _draw(rng, rule.domain[1], n)
        if label in ("min", "max", "np_minimum", "np_maximum"):
            b = np.where(np.abs(b - s) < 0.05, b + 0.2, b)
        args = (b, s, np.zeros(n))
    k, src = _make_kernel(f"{label}_{form}", body, params, "z")
    fd_check(k, args, rtol=1e-5, atol=1e-8)


# A float scalar argument that gets no derivative contribution: its adjoint slot exists
# (float arguments are differentiable by default) and must come back as 0.
NO_CONTRIB = [
    ("unused", "2.0 * x[i]"),
    ("compared_only", "x[i] if x[i] > s else 0.5 * x[i]"),
    ("floor_only", "x[i] * math.floor(s)"),
    ("copysign_sign", "math.copysign(x[i], s)"),
]


# regression: adj_<scalar> was never defined when the scalar got no contribution
@pytest.mark.parametrize("label,body", NO_CONTRIB, ids=[c[0] for c in NO_CONTRIB])
def test_scalar_argument_without_contribution(label, body):
    k, src = _make_kernel(label, body, ["x", "s"], "y")
    x = np.array([0.4, -1.2, 1.7, 0.9])
    bufs = fd_check(k, (x, 0.3, np.zeros(4)), rtol=1e-5, atol=1e-8)
    assert bufs[1][0] == 0.0


F32 = [u for u in UNARY if u[0] in ("sin", "cos", "tan", "exp", "log", "sqrt", "tanh", "erf",
                                    "abs", "expm1", "log1p", "np_cbrt", "atan", "asinh")]
F32_BIN = [b for b in BINARY if b[0] in ("mul", "truediv", "pow_op", "atan2", "hypot", "max")]
F32_CASES = [pytest.param(*c, id=c[0]) for c in F32 + F32_BIN]


def _typemap(dispatcher, args):
    """numba's variable -> type map of ``dispatcher`` compiled for ``args``."""
    sig = tuple(dispatcher.typeof_pyval(a) for a in args)
    return dispatcher.overloads[sig].type_annotation.typemap


@pytest.mark.parametrize("label,expr,key", [  # every other case by default, the rest: -m slow
    c if i % 2 == 0 else pytest.param(*c.values, id=c.id, marks=pytest.mark.slow)
    for i, c in enumerate(F32_CASES)])
def test_float32_adjoint_stays_float32(label, expr, key):
    rule = lookup(key)
    rng = np.random.default_rng(zlib.crc32(f"f32/{label}".encode()))
    n = 5
    binary = "B" in expr
    if binary:
        body, params = expr.replace("A", "x[i]").replace("B", "w[i]"), ["x", "w"]
        a, b = _away_from_ties(label, _draw(rng, rule.domain[0], n),
                               _draw(rng, rule.domain[1], n))
        ins = [a, b]
    else:
        body, params = expr.replace("A", "x[i]"), ["x"]
        ins = [_draw(rng, rule.domain[0], n)]
    k, src = _make_kernel(f"{label}_f32", body, params, "y")
    args32 = [v.astype(np.float32) for v in ins] + [np.zeros(n, np.float32)]
    args64 = [v.astype(np.float64) for v in args32[:-1]] + [np.zeros(n)]
    ct = rng.standard_normal(n)
    bufs32 = [np.zeros(n, np.float32) for _ in ins] + [ct.astype(np.float32)]
    bufs64 = [np.zeros(n) for _ in ins] + [ct.astype(np.float32).astype(np.float64)]
    k.adjoint(*args32, *bufs32)
    k.adjoint(*args64, *bufs64)
    for b32, b64 in zip(bufs32, bufs64):
        assert b32.dtype == np.float32
        np.testing.assert_allclose(b32, b64, rtol=2e-4, atol=2e-5,
                                   err_msg=f"float32 adjoint of {src}")
    # the forward computes in float32 only (no float64 literal in these kernels), so the
    # adjoint must not widen to float64 either
    k.forward(*[a.copy() for a in args32])
    fwd_types = _typemap(k.dispatcher, args32)
    comp32 = k.compiled(*args32)
    adj_types = _typemap(comp32.function, args32 + bufs32 + comp32.fresh_memory())
    if not any(str(t) == "float64" for t in fwd_types.values()):
        wide = sorted(v for v, t in adj_types.items()
                      if str(t) == "float64" and not v.startswith("$const"))
        assert not wide, (f"float32 adjoint computes in float64 ({wide}) for {src}\n"
                          f"{k.adjoint_source(*args32)}")


# ---- the disk cache must follow the rule table ---------------------------------------------
@njit
def _sinc_kernel(x, y):
    for i in range(x.shape[0]):
        y[i] = np.sinc(x[i])


def test_changed_rule_is_not_served_from_disk_cache():
    x = np.array([1.3, 2.1])
    assert lookup(np.sinc) is None
    try:
        for scale in (1.0, 2.0):
            RULES.pop(np.sinc, None)

            @kadj.register_adjoint(np.sinc)
            def _sinc_vjp(g, out, v, scale=scale):    # deliberately scaled rule
                return (g * scale * out,)

            k = kadj.differentiate(_sinc_kernel)      # fresh object: no in-memory cache
            bufs = [np.zeros(2), np.ones(2)]
            k.adjoint(x, np.zeros(2), *bufs)
            want = scale * np.sinc(x)
            np.testing.assert_allclose(bufs[0], want, rtol=1e-12,
                                       err_msg=f"rule scaled by {scale}")
    finally:
        RULES.pop(np.sinc, None)


COMPLEX_RULES = [r for r in ALL_RULES if r.complex_domain]


@pytest.mark.parametrize("rule", COMPLEX_RULES, ids=[r.name for r in COMPLEX_RULES])
def test_rule_on_symbols_over_complex_domain(rule):
    """On complex arguments too, the symbolic expression agrees with the numeric rule
    (finite differences over complex domains: tests/test_complex.py)."""
    n = len(rule.complex_domain)
    names = [f"x{j}" for j in range(n)]
    res = rule.vjp(ops.var("g"), ops.var("out"), *[ops.var(v) for v in names])
    rng = _rng(rule, salt=3)
    for _ in range(3):
        args = [complex(rng.uniform(*re), rng.uniform(*im)) for re, im in rule.complex_domain]
        out = complex(1.3, -0.4)   # (linear in out or unused: any value checks the text)
        env = {"g": 0.75 - 0.25j, "out": out, **dict(zip(names, args))}
        num = rule.vjp(0.75 - 0.25j, out, *args)
        for j, (e, v) in enumerate(zip(res, num)):
            if e is None:
                assert v is None
                continue
            assert np.isclose(complex(_eval(e, env)), complex(v), rtol=1e-12), (
                f"{rule.name} arg{j}: symbolic {_eval(e, env)} vs numeric {v} at {args}")


@njit
def _log_gammas(x):
    s = 0.0
    for i in range(x.shape[0]):
        s += math.lgamma(x[i]) + 0.1 * math.gamma(0.25 * x[i])
    return s


def test_lgamma_and_gamma_off_the_table_domain():
    """psi on both sides of the reflection (negative non-integers, near 0 and 1, large
    values): gradients against central differences; the Hessian-vector product
    (trigamma, differentiated from the rule's own expression) against differences of
    the gradient."""
    x = np.array([-3.7, -2.3, -0.5, 0.05, 0.49, 0.51, 1.0, 2.5, 11.0, 150.0])
    g = kadj.grad(_log_gammas)(x)
    h = 1e-6

    def term(t):            # the sum is separable: each element's own term
        return math.lgamma(t) + 0.1 * math.gamma(0.25 * t)
    fd = np.array([(term(t + h * max(1.0, abs(t))) - term(t - h * max(1.0, abs(t))))
                   / (2 * h * max(1.0, abs(t))) for t in x])
    assert np.allclose(g, fd, rtol=1e-6, atol=1e-8), (g, fd)
    v = np.linspace(-1.0, 1.0, len(x))
    hv = kadj.hvp(_log_gammas)(x, v)
    fd2 = (kadj.grad(_log_gammas)(x + h * v) - kadj.grad(_log_gammas)(x - h * v)) / (2 * h)
    assert np.allclose(hv, fd2, rtol=1e-5, atol=1e-6), (hv, fd2)
