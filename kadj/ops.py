"""The small vocabulary derivative rules are written in.

Every function here works on plain numbers (so a rule can be evaluated and checked
against finite differences) and on :class:`Sym` expression nodes (so the same rule,
applied to the kernel's variables, yields the expression codegen prints).  A rule never
sees codegen, atomics, CPU or GPU: only these operations.
"""
from __future__ import annotations

import cmath
import math
import numbers
from dataclasses import dataclass

from .errors import DifferentiationError


@dataclass(frozen=True)
class Sym:
    """A symbolic expression: a variable, a constant, or an operation on Syms.

    kind: "var" (name = variable name), "const" (value), "op" (name = operator or
    function name, args = operand Syms).
    """

    kind: str
    name: str = ""
    value: float = 0.0
    args: tuple = ()

    def __add__(self, o):
        return _op("add", self, o)

    def __radd__(self, o):
        return _op("add", o, self)

    def __sub__(self, o):
        return _op("sub", self, o)

    def __rsub__(self, o):
        return _op("sub", o, self)

    def __mul__(self, o):
        return _op("mul", self, o)

    def __rmul__(self, o):
        return _op("mul", o, self)

    def __truediv__(self, o):
        return _op("div", self, o)

    def __rtruediv__(self, o):
        return _op("div", o, self)

    def __pow__(self, o):
        return pow(self, o)

    def __rpow__(self, o):
        return pow(o, self)

    def __neg__(self):
        return _op("neg", self)

    def __pos__(self):
        return self

    # Comparisons build symbolic conditions (for where()), never Python bools: a rule
    # is evaluated once on placeholders, so a structural answer would be silently wrong.
    def __eq__(self, o):
        return _cmp("eq", self, o)

    def __ne__(self, o):
        return _cmp("ne", self, o)

    def __lt__(self, o):
        return _cmp("lt", self, o)

    def __le__(self, o):
        return _cmp("le", self, o)

    def __gt__(self, o):
        return _cmp("gt", self, o)

    def __ge__(self, o):
        return _cmp("ge", self, o)

    def __hash__(self):
        return hash((self.kind, self.name, self.value, self.args))

    def __bool__(self):
        raise DifferentiationError(
            f"a derivative rule cannot branch on its arguments (Python `if`, `and`, "
            f"`or`, min, max): the condition {describe(self)} is only known when the "
            "adjoint runs",
            construct=TRUTH_CONSTRUCT,
            remedy="use kadj.ops.where(cond, a, b), with a comparison, kadj.ops.eq/ne/gt/"
                   "ge/lt/le or kadj.ops.land as the condition: "
                   "(kadj.ops.where(out == x, g, 0.0),)")

    def variables(self):
        """Names of the variables this expression reads."""
        if self.kind == "var":
            return {self.name}
        out = set()
        for a in self.args:
            out |= a.variables()
        return out


TRUTH_CONSTRUCT = "Python truth value of a symbolic expression"


def same(a, b):
    """Structural equality of two expressions (``==`` on Syms builds a condition)."""
    if isinstance(a, Sym) and isinstance(b, Sym):
        return a.kind == b.kind and a.name == b.name and a.value == b.value and \
            len(a.args) == len(b.args) and all(same(x, y) for x, y in zip(a.args, b.args))
    if isinstance(a, Sym) or isinstance(b, Sym):
        return False
    return a == b


def doubled(s):
    """``s * 2.0``, the doubling put on the first factor of a product: ``(g * x) * 2.0``
    is ``(g * 2.0) * x``, the same value (doubling is exact), and the adjoint of a
    sum of squares, ``dx * dx + dy * dy``, then doubles ``g`` once for all of them
    (LLVM computes the common ``g * 2.0`` once)."""
    if isinstance(s, Sym) and s.kind == "op" and s.name == "mul":
        return (s.args[0] * 2.0) * s.args[1]
    return s * 2.0


def describe(s):
    """A short readable text of an expression, for messages."""
    if not isinstance(s, Sym):
        return repr(s)
    if s.kind == "var":
        return s.name
    if s.kind == "const":
        return repr(s.value)
    return f"{s.name}({', '.join(describe(a) for a in s.args)})"


def _cmp(name, a, b):
    if not isinstance(b, (Sym, numbers.Complex)):
        return NotImplemented  # (an unrelated object: Python's default comparison)
    return _op(name, a, b)


def var(name):
    return Sym("var", name=name)


def const(value):
    if _is_complex(value):
        value = complex(value)
        if value.imag == 0.0:
            return Sym("const", value=value.real)
        return Sym("const", value=value)
    return Sym("const", value=float(value))


def _lift(x):
    return x if isinstance(x, Sym) else const(x)


def _op(name, *args):
    args = tuple(_lift(a) for a in args)
    # light algebraic simplification keeps generated adjoints readable
    if name in _FOLD and all(a.kind == "const" for a in args) and not (
            name == "div" and args[1].value == 0.0):
        folded = _FOLD[name](*(a.value for a in args))
        if cmath.isfinite(folded):  # (inf and nan have no literal in the source)
            return const(folded)
    if name == "mul":
        a, b = args
        if _is_const(a, 1.0):
            return b
        if _is_const(b, 1.0):
            return a
        if a.kind == "op" and a.name == "neg":
            return -(a.args[0] * b)
        if b.kind == "op" and b.name == "neg":
            return -(a * b.args[0])
    if name == "div" and _is_const(args[1], 1.0):
        return args[0]
    if name == "neg" and args[0].kind == "op" and args[0].name == "neg":
        return args[0].args[0]
    if name == "conj":
        return _conj(args[0])
    if name == "add" and _is_const(args[1], 0.0):
        return args[0]
    if name == "sub" and args[1].kind == "op" and args[1].name == "neg":
        return args[0] + args[1].args[0]
    return Sym("op", name=name, args=args)


def _conj(a):
    """conj(a), simplified: constants fold, conj(conj(x)) = x, conj(-x) = -conj(x)."""
    if a.kind == "const":
        v = a.value
        return const(v.conjugate()) if isinstance(v, complex) else a
    if a.kind == "op" and a.name == "conj":
        return a.args[0]
    if a.kind == "op" and a.name == "neg":
        return -_conj(a.args[0])
    if a.kind == "op" and a.name in ("real", "imag", "abs"):
        return a
    return Sym("op", name="conj", args=(a,))


# functions real on the real axis: conj(f(z)) = f(conj(z)) (off their branch cuts)
_REAL_ANALYTIC = frozenset(["sin", "cos", "tan", "sinh", "cosh", "tanh", "exp", "log",
                            "sqrt", "pow", "sign"])


def conj_rule(c, g_name=None):
    """``conj(c)`` with the cotangent replaced by its conjugate, conjugates pushed
    down to the leaves: for a rule contribution ``c = g * conj(f'(z))`` (linear in
    ``g``), the forward-mode term ``f'(z) * g``."""
    from .ir import COTANGENT
    g_name = g_name or COTANGENT
    return _push_conj(_subst_conj(_lift(c), g_name))


def _subst_conj(s, g_name):
    if s.kind == "var":
        return Sym("op", name="conj", args=(s,)) if s.name == g_name else s
    if s.kind == "const":
        return s
    return Sym("op", name=s.name, args=tuple(_subst_conj(a, g_name) for a in s.args))


def _push_conj(s):
    """conj(s), conjugates moved to the leaves and cancelled."""
    if s.kind in ("var", "const"):
        return _conj(s)
    if s.name == "conj":
        return _tidy(s.args[0])
    if s.name in ("add", "sub", "mul", "div", "neg", "where") or s.name in _REAL_ANALYTIC:
        if s.name == "where":
            return where(_tidy(s.args[0]), _push_conj(s.args[1]), _push_conj(s.args[2]))
        return _op(s.name, *(_push_conj(a) for a in s.args))
    if s.name in ("real", "imag") or s.name in (
            "eq", "ne", "gt", "ge", "lt", "le", "land"):
        return _tidy(s)
    return _conj(_tidy(s))


def _tidy(s):
    """``s`` with its inner conj(conj(x)) cancelled."""
    if s.kind in ("var", "const"):
        return s
    if s.name == "conj":
        return _push_conj(s.args[0])
    return _op(s.name, *(_tidy(a) for a in s.args)) if s.name in _FOLD or \
        s.name in ("mul", "div") else Sym("op", name=s.name,
                                          args=tuple(_tidy(a) for a in s.args))


_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
         "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "neg": lambda a: -a}


def _is_const(s, v):
    return s.kind == "const" and s.value == v


def constant(x):
    """The value of ``x`` when it is a real number or a real constant :class:`Sym`,
    else None (complex constants included)."""
    if isinstance(x, Sym):
        return x.value if x.kind == "const" and not isinstance(x.value, complex) else None
    if isinstance(x, numbers.Complex) and not isinstance(x, numbers.Real):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _symbolic(*xs):
    return any(isinstance(x, Sym) for x in xs)


def _fn(name, numeric):
    def f(*xs):
        if _symbolic(*xs):
            return _op(name, *xs)
        return numeric(*xs)

    f.__name__ = name
    f.__doc__ = f"{name} on numbers or symbolic expressions"
    return f


def _is_complex(x):
    return isinstance(x, numbers.Complex) and not isinstance(x, numbers.Real)


def _sign(x):
    if _is_complex(x):  # the unit vector x / |x| (0 at 0): the gradient of |x|
        return x / abs(x) if x != 0 else 0j
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


def _both(real_fn, complex_fn):
    """``real_fn`` on real numbers, ``complex_fn`` on complex ones."""
    def f(*xs):
        return complex_fn(*xs) if any(_is_complex(x) for x in xs) else real_fn(*xs)
    return f


def _pow(a, b):
    return a ** b if _is_complex(a) or _is_complex(b) else math.pow(a, b)


sin = _fn("sin", _both(math.sin, cmath.sin))
cos = _fn("cos", _both(math.cos, cmath.cos))
tan = _fn("tan", _both(math.tan, cmath.tan))
sinh = _fn("sinh", _both(math.sinh, cmath.sinh))
cosh = _fn("cosh", _both(math.cosh, cmath.cosh))
tanh = _fn("tanh", _both(math.tanh, cmath.tanh))
exp = _fn("exp", _both(math.exp, cmath.exp))
log = _fn("log", _both(math.log, cmath.log))
sqrt = _fn("sqrt", _both(math.sqrt, cmath.sqrt))
pow = _fn("pow", _pow)  # noqa: A001 - the vocabulary mirrors math's names
# complex values: the conjugate (the identity on real values), real and imaginary parts
conj = _fn("conj", lambda x: x.conjugate())
real = _fn("real", lambda x: x.real)
imag = _fn("imag", lambda x: x.imag)
sign = _fn("sign", _sign)
copysign = _fn("copysign", math.copysign)
# where(c, a, b) = a if c else b; the conditions below are numbers or Syms
where = _fn("where", lambda c, a, b: a if c else b)
gt = _fn("gt", lambda a, b: a > b)
ge = _fn("ge", lambda a, b: a >= b)
lt = _fn("lt", lambda a, b: a < b)
le = _fn("le", lambda a, b: a <= b)
land = _fn("land", lambda a, b: bool(a) and bool(b))
eq = _fn("eq", lambda a, b: a == b)
ne = _fn("ne", lambda a, b: a != b)
floor = _fn("floor", math.floor)
trunc = _fn("trunc", math.trunc)
square = lambda x: x * x  # noqa: E731


def strong_zero(g, contribution):
    """``contribution`` (the cotangent ``g`` times a partial derivative), or exactly 0
    where ``g == 0``: a zero cotangent contributes nothing even where the partial is
    infinite or NaN, so a masked or zero-weighted singular point (``sqrt`` at 0,
    ``x / 0``) does not poison the gradient.  Rules use it only for partials that can
    be singular; elsewhere ``g * partial`` is already 0 for ``g == 0``."""
    c = constant(g)
    if c is not None:  # a constant cotangent (``g = 1``: the local partials)
        return 0.0 if c == 0.0 else contribution
    return where(eq(g, 0.0), 0.0, contribution)


# Functions a target's rules call by name, for what the operations above cannot write
# (an operation across threads): name -> () -> the function, bound into the adjoint's
# namespace when it is printed (kadj.adj_naming).  A rule returns helper_call(name, ...).
HELPERS: dict = {}


def helper_call(name, *args):
    """A call of the registered helper ``name`` (:data:`HELPERS`) on rule values."""
    return Sym("op", name=name, args=tuple(_lift(a) for a in args))
