"""The small vocabulary derivative rules are written in.

Every function here works on plain numbers (so a rule can be evaluated and checked
against finite differences) and on :class:`Sym` expression nodes (so the same rule,
applied to the kernel's variables, yields the expression codegen prints).  A rule never
sees codegen, atomics, CPU or GPU: only these operations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


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

    def __neg__(self):
        return _op("neg", self)

    def __pos__(self):
        return self

    def variables(self):
        """Names of the variables this expression reads."""
        if self.kind == "var":
            return {self.name}
        out = set()
        for a in self.args:
            out |= a.variables()
        return out


def var(name):
    return Sym("var", name=name)


def const(value):
    return Sym("const", value=float(value))


def _lift(x):
    return x if isinstance(x, Sym) else const(x)


def _op(name, *args):
    args = tuple(_lift(a) for a in args)
    # light algebraic simplification keeps generated adjoints readable
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
    if name == "add" and _is_const(args[1], 0.0):
        return args[0]
    if name == "sub" and args[1].kind == "op" and args[1].name == "neg":
        return args[0] + args[1].args[0]
    return Sym("op", name=name, args=args)


def _is_const(s, v):
    return s.kind == "const" and s.value == v


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


def _sign(x):
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


sin = _fn("sin", math.sin)
cos = _fn("cos", math.cos)
tan = _fn("tan", math.tan)
sinh = _fn("sinh", math.sinh)
cosh = _fn("cosh", math.cosh)
tanh = _fn("tanh", math.tanh)
exp = _fn("exp", math.exp)
log = _fn("log", math.log)
sqrt = _fn("sqrt", math.sqrt)
pow = _fn("pow", math.pow)  # noqa: A001 - the vocabulary mirrors math's names
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
