"""The derivative-rule table: one entry per function family, keyed by the Python object
Numba's typed IR resolves a call or operator to (``operator.mul``, ``math.sin``,
``np.sin``...).

A rule is ``rule(g, out, *args) -> tuple`` giving, for each argument, the contribution
``g * d out / d arg`` (or ``None`` where the argument is not differentiable).  ``g`` is
the incoming adjoint and ``out`` the primal output; both, and ``args``, are plain
numbers or :class:`kadj.ops.Sym` expressions, so the same entry is evaluated on numbers
by the tests (against finite differences, over the entry's own ``domain``) and applied
to the kernel's variables by the reverse pass.  Calling a rule with ``g = 1`` yields the
local partials, which is what forward mode will multiply by tangents.

Adding a derivative touches exactly this module: add one ``@register`` entry.
Users add their own through :func:`kadj.register_adjoint`, which uses the same table.
"""
from __future__ import annotations

import cmath
import functools
import inspect
import math
import operator
from dataclasses import dataclass, field

import numpy as np
from numba.core import types as nbtypes

from . import ops as o
from .complex_parts import imag_part, real_part
from .errors import DifferentiationError


@dataclass(frozen=True)
class Rule:
    """One table entry.

    name:   a readable name for reports and test ids.
    vjp:    ``vjp(g, out, *args) -> tuple`` of per-argument contributions.
    domain: per argument, the (low, high) interval tests sample from; ``None`` for an
            argument that the tests pass as the integer in ``int_args``.
    complex_domain: for an entry that also holds on complex values, per argument the
            rectangle ((re low, re high), (im low, im high)) tests sample from.
    int_args: sample integer values for arguments that must be integers.
    nargs:  number of arguments the tests call it with.
    """

    name: str
    vjp: object
    domain: tuple = ()
    int_args: dict = field(default_factory=dict)
    nargs: int = 1
    complex_domain: tuple = ()


RULES: dict = {}
# rules registered by users (kadj.register_adjoint): key -> vjp; part of the cache key
CUSTOM: dict = {}

# Functions whose result carries no derivative (integer-valued, boolean, or piecewise
# constant): their outputs are inactive.
from .ir import make_tuple as _make_tuple  # noqa: E402
from .fused_ops import x_sqrt_x  # noqa: E402

NONDIFFERENTIABLE = {
    _make_tuple,
    math.floor, math.ceil, math.trunc, np.floor, np.ceil, np.trunc, np.sign, np.rint,
    math.isnan, math.isinf, math.isfinite, np.isnan, np.isinf, np.isfinite,
    round, int, bool, len, range,
    operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
    operator.not_, operator.and_, operator.or_, operator.xor,
    operator.floordiv, operator.lshift, operator.rshift, operator.invert, operator.truth,
    np.floor_divide, np.round, np.around, np.fix,
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.intp, np.uintp, np.bool_,
}


_generation = 0


def generation():
    """A counter bumped by every registration: an adjoint built under an older table
    must be rebuilt (the differentiated kernels' in-memory caches check it)."""
    return _generation


def register(*keys, domain=((-2.0, 2.0),), int_args=None, name=None, arities=None,
             complex_domain=()):
    """Register ``vjp`` for every key in ``keys`` (aliases share one entry).

    ``vjp`` must accept ``(g, out, *args)`` for every number of arguments in
    ``arities`` (user rules: those of the function), checked here when its signature can
    be read; each call must return one contribution per argument, checked when the rule
    is expanded.  (The table's own entries are checked against their ``domain`` by the
    tests.)
    """

    def deco(vjp):
        global _generation
        rule_name = name or getattr(keys[0], "__name__", str(keys[0]))
        for n in arities or ():
            if not _accepts(vjp, n):
                raise DifferentiationError(
                    f"the derivative rule {_rule_label(vjp)} for {rule_name}"
                    f"{_signature_text(keys[0])} cannot be called as rule(g, out, *args) "
                    f"with {n} argument(s)",
                    construct=f"rule for {rule_name}",
                    remedy=f"give the rule the parameters (g, out, "
                           f"{', '.join(f'x{k}' for k in range(n))}): the incoming "
                           "adjoint, the primal output and one per argument")
        rule = Rule(name=rule_name, vjp=_checked(vjp, rule_name), domain=tuple(domain),
                    int_args=dict(int_args or {}), nargs=len(domain),
                    complex_domain=tuple(complex_domain))
        for k in keys:
            RULES[k] = rule
        _generation += 1
        return vjp

    return deco


def unregister(fn):
    """Remove ``fn``'s rule (and a user rule's record); adjoints built with it rebuild."""
    global _generation
    RULES.pop(fn, None)
    CUSTOM.pop(fn, None)
    _generation += 1


def _signature(fn):
    """``fn``'s signature (a jitted function's Python one), or None if unreadable."""
    try:
        return inspect.signature(getattr(fn, "py_func", fn))
    except (TypeError, ValueError):
        return None


def arities_of(fn):
    """The numbers of arguments ``fn`` can be called with, or None when its signature
    cannot be read (builtins) or is unbounded (``*args``)."""
    sig = _signature(fn)
    if sig is None:
        return None
    params = sig.parameters.values()
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                  p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    required = sum(p.default is p.empty for p in positional)
    return tuple(range(required, len(positional) + 1))


def _signature_text(fn):
    sig = _signature(fn)
    return "" if sig is None else str(sig)


def _accepts(vjp, n):
    try:
        sig = inspect.signature(vjp)
    except (TypeError, ValueError):
        return True  # unreadable: checked when the rule is expanded
    try:
        sig.bind(*range(n + 2))
    except TypeError:
        return False
    return True


def _rule_label(vjp):
    code = getattr(vjp, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code is not None else ""
    return f"'{getattr(vjp, '__qualname__', repr(vjp))}'{where}"


def _rule_error(message, rule_name, remedy):
    """A DifferentiationError about a rule; ``detail`` keeps the bare message so that
    :func:`expand` can restate it with the kernel and line of the call."""
    err = DifferentiationError(message, construct=f"rule for {rule_name}", remedy=remedy)
    err.detail = message
    return err


_SYMBOLIC_REMEDY = (
    "write the rule with + - * / ** and the functions of kadj.ops (exp, log, sqrt, pow, "
    "where, ...) on its parameters: kadj evaluates it once, on symbolic expressions "
    "standing for the kernel's values, so math/numpy functions, float() and Python "
    "`if`/`and`/`or`/min/max cannot take them; write a condition with kadj.ops.where, "
    "e.g. kadj.ops.where(out == x, g, 0.0) (comparisons, kadj.ops.eq/gt/... and "
    "kadj.ops.land build conditions)")


def _checked(vjp, rule_name):
    """``vjp`` refusing (DifferentiationError) a call it cannot take, an error it raises
    on symbolic arguments, or a result that is not one contribution per argument, which
    would silently drop gradients."""
    @functools.wraps(vjp)
    def checked(g, out, *args):
        symbolic = any(isinstance(x, o.Sym) for x in (g, out, *args))
        try:
            contribs = vjp(g, out, *args)
        except Exception as exc:
            if isinstance(exc, TypeError) and not _accepts(vjp, len(args)):
                raise _rule_error(
                    f"the derivative rule {_rule_label(vjp)} for {rule_name} cannot be "
                    f"called as rule(g, out, *args) with the {len(args)} argument(s) of "
                    "this call", rule_name,
                    "give the rule one parameter per argument after (g, out)") from None
            if not symbolic:  # (numbers: the tests' own evaluation, errors unchanged)
                raise
            raise _failed(vjp, rule_name, exc) from exc
        if not isinstance(contribs, (tuple, list)) or len(contribs) != len(args):
            got = f"{len(contribs)} contribution(s)" if isinstance(
                contribs, (tuple, list)) else f"a {type(contribs).__name__}, not a tuple"
            raise _rule_error(
                f"the derivative rule {_rule_label(vjp)} for {rule_name} returned {got} "
                f"for a call with {len(args)} argument(s)", rule_name,
                "return a tuple with one contribution per argument (None for an "
                "argument without one), e.g. (g * dx,) for one argument")
        return contribs

    checked.unchecked = vjp
    return checked


def _failed(vjp, rule_name, exc):
    """The error for a rule that raised ``exc`` on symbolic arguments."""
    if isinstance(exc, DifferentiationError) and exc.construct == o.TRUTH_CONSTRUCT:
        what = ("branches on its arguments (a Python `if`, `and`, `or`, min or max on "
                "them), whose outcome is only known when the adjoint runs")
    else:
        first = (str(exc).splitlines() or [""])[0]
        what = f"raised {type(exc).__name__}: {first}"
    return _rule_error(
        f"the derivative rule {_rule_label(vjp)} for {rule_name} {what}", rule_name,
        _SYMBOLIC_REMEDY)


def expand(rule, g, out, args, kernel=None, loc=None):
    """``rule.vjp(g, out, *args)``, its errors restated with the kernel and the line of
    the call being differentiated."""
    try:
        return rule.vjp(g, out, *args)
    except DifferentiationError as exc:
        detail = getattr(exc, "detail", None)
        if detail is None or exc.kernel is not None or kernel is None:
            raise
        raise DifferentiationError(detail, kernel=kernel, loc=loc, construct=exc.construct,
                                   remedy=exc.remedy) from exc.__cause__


def expand_call(e, out_var, kernel=None, loc=None):
    """The rule contributions of the call ``e`` (a :class:`kadj.ir.Op`) whose result is
    named ``out_var``, one per argument, with the cotangent as the symbol
    ``ir.COTANGENT``; a located :class:`DifferentiationError` when ``e.fn`` has no
    rule."""
    from . import ir
    rule = lookup(e.fn)
    if rule is None:
        name = getattr(e.fn, "__name__", str(e.fn))
        raise DifferentiationError(
            f"no derivative rule for {name}()", kernel=kernel, loc=loc,
            construct=f"call to {name}",
            remedy=f"register one with @kadj.register_adjoint({name})")
    args = []
    for x in e.args:
        if isinstance(x, ir.Var):
            args.append(o.var(x.name))
        elif isinstance(x, ir.Const) and isinstance(x.value, (int, float, complex,
                                                              np.number)):
            args.append(o.const(x.value))
        else:
            args.append(o.const(0.0))
    return expand(rule, o.var(ir.COTANGENT), o.var(out_var), args, kernel=kernel, loc=loc)


def lookup(fn):
    """The rule for ``fn``, or None."""
    try:
        return RULES.get(fn)
    except TypeError:  # unhashable callee
        return None


# Singular points.  Adjoints are compiled with IEEE arithmetic (numba's "numpy" error
# model): a partial derivative that is infinite or undefined at a point (sqrt at 0,
# 1 / b at b = 0) gives inf or NaN there, never an exception.  Entries whose partial can
# be singular wrap their contribution in ``_sz`` (strong zero): a zero cotangent then
# contributes exactly 0, so a masked or zero-weighted singular point does not turn the
# gradient into NaN.  Only those entries pay for the test.
_sz = o.strong_zero


def _may_be_zero(x):
    """False only for a known non-zero constant (``x / 2.0`` needs no guard)."""
    c = o.constant(x)
    return c is None or c == 0.0


_PM = ((-2.0, 2.0), (-2.0, 2.0))
# Entries that also hold on complex values give ``complex_domain``: per argument, the
# rectangle ((re low, re high), (im low, im high)) the tests sample it from.
_PMC = (((-2.0, 2.0), (-1.5, 1.5)),)
_UNITC = (((-0.6, 0.6), (-0.6, 0.6)),)
_POSC = (((0.2, 3.0), (-1.5, 1.5)),)
_cj = o.conj
_POS = ((0.2, 3.0),)
_UNIT = ((-0.9, 0.9),)

# ---- arithmetic ------------------------------------------------------------------
_PMC2 = _PMC * 2
register(operator.add, operator.iadd, np.add, domain=_PM, name="add", complex_domain=_PMC2)(
    lambda g, out, a, b: (g, g))
register(operator.sub, operator.isub, np.subtract, domain=_PM, name="sub",
         complex_domain=_PMC2)(
    lambda g, out, a, b: (g, -g))
register(operator.mul, operator.imul, np.multiply, domain=_PM, name="mul",
         complex_domain=_PMC2)(
    lambda g, out, a, b: (g * _cj(b), g * _cj(a)))


@register(operator.truediv, operator.itruediv, np.divide, np.true_divide,
          domain=((-2.0, 2.0), (0.5, 2.0)), name="truediv",
          complex_domain=(_PMC[0], ((0.5, 2.0), (-1.0, 1.0))))
def _truediv(g, out, a, b):
    # d/db (a / b) = -out / b; for a == 1 that is -out * out, with no division
    da = g / _cj(b)
    db = (-(g * _cj(out) * _cj(out)) if o.constant(a) == 1.0 else
          -(g * _cj(out)) / _cj(b))
    if _may_be_zero(b):
        return (_sz(g, da), _sz(g, db))
    return (da, db)


register(operator.neg, np.negative, name="neg", complex_domain=_PMC)(lambda g, out, a: (-g,))
register(operator.pos, np.positive, name="pos", complex_domain=_PMC)(lambda g, out, a: (g,))
# on a complex value, sign(a) is a / |a| (0 at 0: the kink of |z| gets a zero gradient)
register(abs, np.abs, np.absolute, np.fabs, math.fabs, name="abs",
         complex_domain=(((0.3, 2.0), (-1.5, 1.5)),))(lambda g, out, a: (g * o.sign(a),))


@register(operator.pow, operator.ipow, math.pow, np.power, pow,
          domain=((0.3, 2.0), (-2.0, 2.0)), name="pow")
def _pow(g, out, a, b):
    # d/da a**b = b * a**(b-1); d/db = a**b * log(a) (only used when b is active).
    # At a = 0 (as JAX and PyTorch): d/da is 0 where b == 0 and d/db is 0 where b >= 0
    # (the limit of a**b * log(a) as a -> 0+); elsewhere IEEE arithmetic of the formula.
    da = g * _cj(b) * _cj(o.pow(a, b - 1.0))
    c = o.constant(b)
    if c is None:
        da = o.where(o.eq(b, 0.0), 0.0, _sz(g, da))
    elif c < 1.0:  # a constant exponent >= 1 has a finite d/da everywhere
        da = _sz(g, da)
    db = o.where(o.land(o.eq(a, 0.0), o.ge(b, 0.0)), 0.0, _sz(g, g * _cj(out) * _cj(o.log(a))))
    return (da, db)


# ---- min / max / clip ---------------------------------------------------------------
# ties go to the first argument (the convention of JAX's max)
def _extremum(first_wins):
    def vjp(g, out, *args):
        if len(args) == 2:
            a, b = args
            c = first_wins(a, b)
            return (o.where(c, g, 0.0), o.where(c, 0.0, g))
        # n arguments: the adjoint goes to the first argument equal to the result
        contribs, taken = [], None
        for x in args:
            hit = o.eq(x, out) if taken is None else o.land(o.eq(x, out), o.ne(taken, 1.0))
            contribs.append(o.where(hit, g, 0.0))
            taken = o.where(o.eq(x, out), 1.0, 0.0) if taken is None else \
                o.where(o.eq(x, out), 1.0, taken)
        return tuple(contribs)
    return vjp


# ties go to the first argument (the convention of JAX's max)
register(max, np.maximum, np.fmax, domain=_PM, name="max")(_extremum(o.ge))
register(min, np.minimum, np.fmin, domain=_PM, name="min")(_extremum(o.le))


@register(np.clip, domain=((-2.0, 2.0), (-1.0, -0.5), (0.5, 1.0)), name="clip")
def _clip(g, out, x, lo, hi):
    inside = o.land(o.ge(x, lo), o.le(x, hi))
    return (o.where(inside, g, 0.0), o.where(o.lt(x, lo), g, 0.0),
            o.where(o.gt(x, hi), g, 0.0))


# ---- trigonometric and hyperbolic -------------------------------------------------
register(math.sin, np.sin, cmath.sin, name="sin", complex_domain=_PMC)(
    lambda g, out, x: (g * _cj(o.cos(x)),))
register(math.cos, np.cos, cmath.cos, name="cos", complex_domain=_PMC)(
    lambda g, out, x: (-(g * _cj(o.sin(x))),))
register(math.tan, np.tan, cmath.tan, domain=((-1.2, 1.2),), name="tan",
         complex_domain=_UNITC)(
    lambda g, out, x: (g * _cj(1.0 + out * out),))
register(math.asin, np.arcsin, cmath.asin, domain=_UNIT, complex_domain=_UNITC, name="asin")(
    lambda g, out, x: (_sz(g, g / _cj(o.sqrt(1.0 - x * x))),))
register(math.acos, np.arccos, cmath.acos, domain=_UNIT, complex_domain=_UNITC, name="acos")(
    lambda g, out, x: (_sz(g, -(g / _cj(o.sqrt(1.0 - x * x)))),))
register(math.atan, np.arctan, cmath.atan, complex_domain=_UNITC, name="atan")(
    lambda g, out, x: (g / _cj(1.0 + x * x),))
register(math.atan2, np.arctan2, domain=((-2.0, 2.0), (0.3, 2.0)), name="atan2")(
    lambda g, out, y, x: (_sz(g, g * x / (x * x + y * y)),
                          _sz(g, -(g * y) / (x * x + y * y))))
register(math.sinh, np.sinh, cmath.sinh, name="sinh", complex_domain=_PMC)(
    lambda g, out, x: (g * _cj(o.cosh(x)),))
register(math.cosh, np.cosh, cmath.cosh, name="cosh", complex_domain=_PMC)(
    lambda g, out, x: (g * _cj(o.sinh(x)),))
register(math.tanh, np.tanh, cmath.tanh, name="tanh", complex_domain=_UNITC)(
    lambda g, out, x: (g * _cj(1.0 - out * out),))
register(math.asinh, np.arcsinh, cmath.asinh, name="asinh", complex_domain=_UNITC)(
    lambda g, out, x: (g / _cj(o.sqrt(x * x + 1.0)),))
register(math.acosh, np.arccosh, domain=((1.2, 3.0),), name="acosh")(
    lambda g, out, x: (_sz(g, g / o.sqrt(x * x - 1.0)),))
register(math.atanh, np.arctanh, cmath.atanh, domain=_UNIT, complex_domain=_UNITC, name="atanh")(
    lambda g, out, x: (_sz(g, g / _cj(1.0 - x * x)),))

# ---- exponentials and logarithms -------------------------------------------------
register(math.exp, np.exp, cmath.exp, name="exp", complex_domain=_PMC)(
    lambda g, out, x: (g * _cj(out),))
register(math.expm1, np.expm1, name="expm1", complex_domain=_PMC)(
    lambda g, out, x: (g * _cj(out + 1.0),))
register(np.exp2, name="exp2", complex_domain=_PMC)(
    lambda g, out, x: (g * _cj(out) * math.log(2.0),))
register(math.log1p, np.log1p, domain=((-0.5, 2.0),), name="log1p")(
    lambda g, out, x: (_sz(g, g / (1.0 + x)),))
register(math.log2, np.log2, domain=_POS, name="log2")(
    lambda g, out, x: (_sz(g, g / (x * math.log(2.0))),))
register(math.log10, np.log10, domain=_POS, name="log10")(
    lambda g, out, x: (_sz(g, g / (x * math.log(10.0))),))
register(cmath.log10, domain=(), complex_domain=_POSC, name="cmath.log10")(
    lambda g, out, x: (_sz(g, g / (_cj(x) * math.log(10.0))),))
register(np.log, domain=_POS, complex_domain=_POSC, name="np.log")(lambda g, out, x: (_sz(g, g / _cj(x)),))


@register(math.log, cmath.log, domain=_POS, complex_domain=_POSC, name="log")
def _log(g, out, x, base=None):
    # math.log(x) or math.log(x, base) = log(x) / log(base)
    if base is None:
        return (_sz(g, g / _cj(x)),)
    lb = o.log(base)
    return (_sz(g, g / _cj(x * lb)), _sz(g, -(g * _cj(out)) / _cj(base * lb)))


register(math.sqrt, np.sqrt, cmath.sqrt, domain=_POS, complex_domain=_POSC, name="sqrt")(
    lambda g, out, x: (_sz(g, g / _cj(2.0 * out)),))
# x * sqrt(x) written by the kernel, differentiated as x ** 1.5 (kadj.fused_ops)
register(x_sqrt_x, domain=_POS, name="x_sqrt_x")(
    lambda g, out, x: (g * (1.5 * o.sqrt(x)),))
register(np.cbrt, domain=_POS, name="cbrt")(
    lambda g, out, x: (_sz(g, g / (3.0 * out * out)),))
register(math.hypot, np.hypot, domain=((0.3, 2.0), (-2.0, -0.3)), name="hypot")(
    lambda g, out, x, y: (_sz(g, g * x / out), _sz(g, g * y / out)))
register(math.erf, name="erf")(
    lambda g, out, x: (g * (2.0 / math.sqrt(math.pi)) * o.exp(-(x * x)),))
register(math.erfc, name="erfc")(
    lambda g, out, x: (-(g * (2.0 / math.sqrt(math.pi)) * o.exp(-(x * x))),))
def _digamma(x):
    """psi(x) = d/dx lgamma(x) as an expression (x not 0 or a negative integer): the
    recurrence psi(z) = psi(z + 6) - sum_k 1 / (z + k), then the asymptotic series at
    y = z + 6 >= 6 (relative error below 1e-11), and for x < 0.5 the reflection
    psi(x) = psi(1 - x) - pi / tan(pi x).  Written in kadj's operations, so forward mode
    and second order differentiate it as any expression."""
    def shifted(z):
        y = z + 6.0
        inv2 = 1.0 / (y * y)
        series = o.log(y) - 0.5 / y - inv2 * (1.0 / 12.0 - inv2 * (
            1.0 / 120.0 - inv2 * (1.0 / 252.0 - inv2 * (1.0 / 240.0 - inv2 / 132.0))))
        return series - (1.0 / z + 1.0 / (z + 1.0) + 1.0 / (z + 2.0) + 1.0 / (z + 3.0)
                         + 1.0 / (z + 4.0) + 1.0 / (z + 5.0))
    low = o.lt(x, 0.5)
    psi = shifted(o.where(low, 1.0 - x, x))    # (z >= 0.5 either way: no pole, no log < 0)
    return o.where(low, psi - math.pi / o.tan(math.pi * x), psi)


# (the domains cross 0.5, where the reflection takes over)
register(math.lgamma, name="lgamma", domain=((0.2, 8.0),))(
    lambda g, out, x: (g * _digamma(x),))
register(math.gamma, name="gamma", domain=((0.2, 5.0),))(
    lambda g, out, x: (g * out * _digamma(x),))
register(math.copysign, np.copysign, domain=((0.3, 2.0), (-2.0, -0.3)), name="copysign")(
    lambda g, out, x, y: (g * o.copysign(1.0, x) * o.copysign(1.0, y), None))
register(operator.mod, operator.imod, np.remainder, np.mod,
         domain=((0.1, 0.9), (1.1, 2.0)), name="mod")(
    # a % b = a - b * floor(a / b) (Python's sign convention), so d/db = -floor(a / b)
    # = -(a - out) / b: a float (floor would convert to an integer, which overflows for
    # a / b beyond 2**63 and at b = 0)
    lambda g, out, a, b: (g, _sz(g, -(g * (a - out)) / b)))
register(math.fmod, np.fmod, domain=((0.1, 0.9), (1.1, 2.0)), name="fmod")(
    # a fmod b = a - b * trunc(a / b): d/db = -trunc(a / b) = -(a - out) / b
    lambda g, out, a, b: (g, _sz(g, -(g * (a - out)) / b)))
register(np.square, name="square", complex_domain=_PMC)(lambda g, out, x: (2.0 * g * _cj(x),))
register(float, np.float64, np.float32, name="float")(lambda g, out, x: (g,))
# numba's own type objects used as casts (``from numba import float32; float32(x)``)
RULES[nbtypes.float32] = RULES[nbtypes.float64] = RULES[float]

if hasattr(math, "cbrt"):
    RULES[math.cbrt] = RULES[np.cbrt]
if hasattr(math, "exp2"):
    RULES[math.exp2] = RULES[np.exp2]

# ---- complex values ---------------------------------------------------------------------
# Convention: the adjoint of a complex z = x + iy holds dL/dx + i dL/dy (a real loss L),
# so a holomorphic w = f(z) gives g * conj(f'(z)) (the entries above, with ``_cj``); a
# complex cotangent flowing into a real value keeps its real part (done where the
# contribution is written, :meth:`kadj.adj_naming.Naming.sym`).
register(np.conj, np.conjugate, name="conj", domain=(), complex_domain=_PMC)(
    lambda g, out, z: (o.conj(g),))
register(real_part, np.real, name="real", domain=(), complex_domain=_PMC)(lambda g, out, z: (g,))
register(imag_part, np.imag, name="imag", domain=(), complex_domain=_PMC)(
    lambda g, out, z: (1j * g,))
register(cmath.phase, np.angle, name="phase", domain=(), complex_domain=(((0.3, 2.0), (-1.5, 1.5)),))(
    # phase = atan2(y, x): dL/dx + i dL/dy = g * (-y + i x) / |z|^2 = g * i / conj(z)
    lambda g, out, z: (_sz(g, g * 1j / o.conj(z)),))


@register(complex, np.complex128, np.complex64, nbtypes.complex128, nbtypes.complex64,
          domain=(), name="complex")
def _complex(g, out, x, y=None):
    # complex(x) or complex(x, y) = x + i y
    if y is None:
        return (g,)
    return (g, -1j * g)
