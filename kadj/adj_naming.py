"""Names and expression text of the adjoint: one registry of identifiers, operands,
primal expressions and the symbolic derivatives of kadj.rules, as Python text."""
from __future__ import annotations

import builtins
import cmath
import keyword
import math
import operator
import re
import warnings

import numpy as np
from numba.core import types

from . import ir
from . import ops

_INFIX = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
    operator.floordiv: "//", operator.mod: "%", operator.pow: "**",
    operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=",
    operator.eq: "==", operator.ne: "!=", operator.and_: "&", operator.or_: "|",
    operator.xor: "^", operator.lshift: "<<", operator.rshift: ">>",
}
_UNARY = {operator.neg: "-", operator.pos: "+", operator.not_: "not ", operator.invert: "~"}
# Names the generated code relies on: a user's name never shadows them.
RESERVED_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {
    "math", "np", "cuda", "numba", "float32", "float64", "int64", "_reserve", "_trips",
    "_push", "_sign", "_retval", "adj_return", "_tape_f64", "_tape_f32", "_tape_i64",
    "_sp_f64", "_sp_f32", "_sp_i64", "_p0", "_p1", "_p2", "_g0", "_g1", "_g2",
    "_keep_need", "_keep_bytes", "_kept_array", "_kept_zeros", "_kept_copy", "_kept_like",
    "_kept_zeros_like"}
_SYM_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_SYM_CMP = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
_SYM_FUNCS = {"sin": "math.sin", "cos": "math.cos", "tan": "math.tan", "sinh": "math.sinh",
              "cosh": "math.cosh", "tanh": "math.tanh", "exp": "math.exp",
              "log": "math.log", "sqrt": "math.sqrt", "pow": "math.pow",
              "copysign": "math.copysign", "sign": "_sign", "floor": "math.floor",
              "trunc": "math.trunc"}
# functions whose complex version is cmath's (numba compiles cmath.<name> on complex
# scalars on the CPU and in CUDA kernels; numba-cuda has no np.sqrt/np.exp of them)
_COMPLEX_FUNCS = frozenset(["sin", "cos", "tan", "sinh", "cosh", "tanh", "exp", "log",
                            "sqrt"])


class Naming:
    """Every identifier of the generated source is taken from one registry
    (``self.used``), seeded with the names the generated code itself relies on (Python
    keywords and builtins, ``math``, ``np``, ``cuda``, kadj's helpers, tape names): a
    user's name that collides with any of them, or with a generated name (``adj_x``
    beside ``x``, ``t1``, ``u_work``), gets a suffix instead."""

    def init_names(self, kernel, fname):
        # a lambda's name (``<lambda>_adjoint``) as an identifier: ``_lambda__adjoint``
        fname = re.sub(r"\W", "_", fname)
        self.fname = fname if fname[:1].isalpha() or fname[:1] == "_" else f"_{fname}"
        fname = self.fname
        self.ns = {"math": math, "np": np}
        self.names = {}
        self.tmp = 0
        self.used = set(RESERVED_NAMES) | {fname}
        self.derived = {}
        self.derived_of = {}
        self.counter = 0
        self.temp_names = set()    # the temporaries' names: simplify may fold them
        for arg in kernel.args:
            self.names[arg] = self.unique(re.sub(r"\W", "_", arg) or "arg")
        self.name_temporaries(kernel)

    @staticmethod
    def is_temporary(var):
        """Whether ``var`` is a Numba temporary (``$...``, or an inlined helper's)."""
        helper = re.match(r"^(?P<fn>[A-Za-z_]\w*?)_v\d+_(?P<rest>[\w.]+)$", var)
        return var.startswith("$") or bool(helper and helper.group("rest").startswith("_v"))

    def name_temporaries(self, kernel):
        """Names after what they hold, handed out once, in source order: a temporary
        loaded from ``u[i]`` is ``u_i``; one stored into ``u_new[i]`` is ``u_new_i``
        (its adjoint ``adj_u_new_i``).  Only plain indices (a kernel variable or a
        small non-negative literal) give a name; any other temporary stays ``t<n>``,
        and so does one whose name a kernel variable has."""
        user = {re.sub(r"\W", "_", v).strip("_") for v in kernel.types
                if not self.is_temporary(v)}
        user |= {re.sub(r"\W", "_", v).strip("_") for s in ir.walk(kernel.body)
                 for v in [getattr(s, "target", None) or getattr(s, "index", None)]
                 if isinstance(v, str) and not self.is_temporary(v)}
        stmts = list(ir.walk(kernel.body))
        loaded = {s.expr.array.name for s in stmts
                  if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load)}
        stores = [s.array.name for s in stmts if isinstance(s, ir.Store)]
        for s in stmts:
            # an element the kernel both reads and writes holds different values in
            # turn: its temporaries keep t<n>
            if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load) and \
                    s.expr.array.name not in stores:
                self._name_after(s.target, s.expr.array, s.expr.index, user)
            elif isinstance(s, ir.Store) and s.accumulate is None and \
                    isinstance(s.value, ir.Var) and stores.count(s.array.name) == 1 and \
                    s.array.name not in loaded:
                self._name_after(s.value.name, s.array, s.index, user)

    def _name_after(self, var, array, index, user):
        if var in self.names or not self.is_temporary(var) or not index or \
                self.is_temporary(array.name):
            return
        parts = [self.n(array.name)]
        for x in index:
            if isinstance(x, ir.Var) and not self.is_temporary(x.name):
                parts.append(self.n(x.name))
            elif isinstance(x, ir.Const) and type(x.value) in (int, np.int64) and \
                    0 <= x.value < 100:
                parts.append(str(int(x.value)))
            else:
                return
        base = "_".join(parts)
        if len(base) > 20 or base in user or not base.isidentifier():
            return
        self.names[var] = self.unique(base)
        self.temp_names.add(self.names[var])

    def unique(self, base):
        """``base``, or ``base_2``, ``base_3``, ...: the first name not yet used."""
        name, k = base, 1
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def _derived(self, kind, var, make):
        key = (kind, var)
        if key not in self.derived:
            self.derived[key] = self.unique(make(self.n(var)))
            self.derived_of[self.derived[key]] = key
        return self.derived[key]

    def n(self, var):
        if var in self.names:
            return self.names[var]
        helper = re.match(r"^(?P<fn>[A-Za-z_]\w*?)_v\d+_(?P<rest>[\w.]+)$", var)
        if var.startswith("$") or (helper and helper.group("rest").startswith("_v")):
            self.tmp += 1
            base = f"t{self.tmp}"
        elif helper:
            rest = re.sub(r"\W", "_", helper.group("rest"))  # t.1: numba's versions
            base = f"{rest}_{helper.group('fn').strip('_')}"
        else:
            base = re.sub(r"\W", "_", var).strip("_") or "v"
            if base[0].isdigit():
                base = "v" + base
        name = self.unique(base)
        self.names[var] = name
        if base.startswith("t") and base[1:].isdigit():
            self.temp_names.add(name)
        return name

    def arr(self, var):
        """Name of an array as the forward sweep sees it (work copy if written)."""
        if var in self.a.work_arrays:
            return self._derived("work", var, lambda n: n + "_work")
        return self.n(var)

    def adj(self, var):
        """Name of the adjoint of ``var`` (``adj_<name>``)."""
        return self._derived("adj", var, lambda n: "adj_" + n)

    def adj_buf(self, var):
        """Name of the 1-element adjoint buffer of the scalar argument ``var``."""
        return self._derived("buf", var, lambda n: f"adj_{n}_buf")

    def fresh(self, base):
        while True:
            self.counter += 1
            name = f"_{base}{self.counter}"
            if name not in self.used:
                break
        self.used.add(name)
        return name

    @staticmethod
    def elem(base, index_texts):
        """``base[i, j]``; ``base[()]`` for a 0-d array."""
        return f"{base}[{', '.join(index_texts) or '()'}]"

    def o(self, x):
        if isinstance(x, ir.Var):
            t = self.T.get(x.name)
            if isinstance(t, types.Array):
                return self.arr(x.name)
            return self.n(x.name)
        if isinstance(x, ir.Const):
            v = x.value
            if isinstance(v, (bool, np.bool_)):
                return repr(bool(v))
            if isinstance(v, (float, np.floating)) and (math.isinf(v) or math.isnan(v)):
                text = "math.nan" if math.isnan(v) else (
                    "math.inf" if v > 0 else "(-math.inf)")
                if isinstance(v, np.float32):
                    return f"np.float32({text})"
                return text
            if isinstance(v, np.floating):
                return f"np.{type(v).__name__}({float(v)!r})"
            if isinstance(v, np.integer):
                return repr(int(v))
            return repr(v)
        if isinstance(x, ir.GlobalRef):
            return self.bind(x.value, x.name or "g")
        raise TypeError(x)

    def bind(self, obj, hint):
        nm = getattr(obj, "__name__", None)
        if isinstance(nm, str) and getattr(builtins, nm, None) is obj:
            return nm  # builtins' names are reserved: no kernel name shadows them
        for mod, prefix in ((np, "np"), (math, "math")):
            with warnings.catch_warnings():  # e.g. numpy's FutureWarning for np.str
                warnings.simplefilter("ignore")
                found = getattr(mod, nm, None) if isinstance(nm, str) else None
            if found is obj:
                return f"{prefix}.{nm}"
        for k, v in self.ns.items():
            if v is obj:
                return k
        base = "_" + re.sub(r"\W", "_", hint.split(".")[-1])
        name = base
        i = 1
        while name in self.ns or name in self.used:
            i += 1
            name = f"{base}{i}"
        self.used.add(name)
        self.ns[name] = obj
        return name

    def expr(self, e):
        if isinstance(e, ir.Copy):
            return self.o(e.src)
        if isinstance(e, ir.Load):
            # a value the array had on entry: the user's array holds it, always
            base = self.n(e.array.name) if e.entry else self.arr(e.array.name)
            return self.elem(base, [self.o(i) for i in e.index])
        if isinstance(e, ir.Attr):
            return f"{self.n(e.value.name)}.{e.attr}"
        if isinstance(e, ir.Item):
            return f"{self.n(e.value.name)}[{e.index}]"
        if isinstance(e, (ir.Op, ir.Alloc)):
            if isinstance(e, ir.Op) and e.fn in _INFIX and len(e.args) == 2 and not e.kws:
                return f"{self.o(e.args[0])} {_INFIX[e.fn]} {self.o(e.args[1])}"
            if isinstance(e, ir.Op) and e.fn is ir.make_tuple:
                items = [self.o(x) for x in e.args]
                return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
            if isinstance(e, ir.Op) and e.fn in _UNARY and len(e.args) == 1:
                return f"{_UNARY[e.fn]}{self.o(e.args[0])}"
            f = self.bind(e.fn, getattr(e.fn, "__name__", "f"))
            args = [self.o(x) for x in e.args] + [f"{k}={self.o(v)}" for k, v in e.kws]
            return f"{f}({', '.join(args)})"
        raise TypeError(e)

    def zero(self, var_type):
        if isinstance(var_type, types.Complex):
            return "0j" if var_type.bitwidth == 128 else "np.complex64(0j)"
        if isinstance(var_type, types.Float):
            return "0.0" if var_type.bitwidth == 64 else f"np.{var_type}(0.0)"
        if isinstance(var_type, types.Boolean):
            return "False"
        if isinstance(var_type, types.Integer):
            return "0"
        return "0.0"

    def sym(self, s, dtype):
        """The text of the rule expression ``s`` written into a value of type ``dtype``:
        a complex expression written into a real value keeps its real part (the
        adjoint of a real variable stays real)."""
        text = self._sym(s, dtype)
        if not isinstance(dtype, types.Complex) and self.sym_is_complex(s):
            return f"({text}).real"
        return text

    # types of the rule's placeholders: the cotangent and a stand-in for the result
    sym_g_type = None
    sym_out_types = None

    def sym_is_complex(self, s):
        """Whether the rule expression ``s`` has a complex value (its variables' types:
        the kernel's, the cotangent's ``sym_g_type``, a result stand-in's)."""
        if s.kind == "const":
            return isinstance(s.value, complex)
        if s.kind == "var":
            if s.name == ir.COTANGENT:
                t = self.sym_g_type
                if t is None:
                    t = self._g_type()
            else:
                t = self.T.get(s.name)
                if t is None:
                    t = (self.sym_out_types or {}).get(s.name)
            if t is None and self._has_complex():
                from .errors import DifferentiationError
                raise DifferentiationError(
                    f"the type of '{s.name}' in a derivative on complex values is not "
                    "known", construct="complex derivative",
                    remedy="split the computation into real and imaginary parts")
            return isinstance(t, types.Complex)
        if s.name in ("real", "imag", "abs") or s.name in _SYM_CMP or \
                s.name in ("eq", "ne", "land"):
            return False
        if s.name == "where":
            return any(self.sym_is_complex(a) for a in s.args[1:])
        return any(self.sym_is_complex(a) for a in s.args)

    def _g_type(self):
        """The type of the cotangent ``self._g`` (an adjoint's or a tangent's name)."""
        key = getattr(self, "derived_of", {}).get(self._g)
        return self.T.get(key[1]) if key is not None else None

    def _has_complex(self):
        if not hasattr(self, "_complex_kernel"):
            self._complex_kernel = any(
                isinstance(t, types.Complex) or isinstance(getattr(t, "dtype", None),
                                                           types.Complex)
                for t in self.T.values())
        return self._complex_kernel

    def _sym(self, s, dtype):
        if s.kind == "var":
            return self.n(s.name) if s.name != ir.COTANGENT else self._g
        if s.kind == "const":
            v = s.value
            if isinstance(v, complex):
                return repr(v)
            if isinstance(dtype, types.Float) and dtype.bitwidth == 32:
                return f"np.float32({v!r})"
            return repr(v)
        args = [self._sym(x, dtype) for x in s.args]
        if s.name in ("conj", "real", "imag", "sign", "pow") or s.name in _SYM_FUNCS:
            complex_arg = any(self.sym_is_complex(x) for x in s.args)
            if s.name == "conj":
                return f"np.conj({args[0]})" if complex_arg else args[0]
            if s.name in ("real", "imag"):
                return f"({args[0]}).{s.name}" if complex_arg else (
                    args[0] if s.name == "real" else "0.0")
            if complex_arg and s.name == "sign":
                return f"({args[0]} / abs({args[0]}) if {args[0]} != 0 else 0j)"
            if complex_arg and s.name == "pow":
                return f"({args[0]} ** {args[1]})"
            if complex_arg and s.name in _COMPLEX_FUNCS:
                return f"{self.bind(getattr(cmath, s.name), s.name)}({args[0]})"
            if complex_arg and s.name != "sign":
                from .errors import DifferentiationError
                raise DifferentiationError(
                    f"{s.name}() of a complex value has no derivative code",
                    construct=f"complex {s.name}",
                    remedy="split the computation into real and imaginary parts")
        if s.name in _SYM_INFIX:
            return f"({args[0]} {_SYM_INFIX[s.name]} {args[1]})"
        if s.name == "neg":
            return f"(-{args[0]})"
        if s.name in ("eq", "ne"):
            return f"({args[0]} {'==' if s.name == 'eq' else '!='} {args[1]})"
        if s.name in _SYM_CMP:
            return f"({args[0]} {_SYM_CMP[s.name]} {args[1]})"
        if s.name == "land":
            return f"({args[0]} and {args[1]})"
        if s.name == "where":
            select = getattr(getattr(self, "syntax", None), "select", "")
            if select and not any(self.sym_is_complex(a) for a in s.args[1:]):
                from .select_intrinsic import _select
                name = self.bind(_select, select.lstrip("_"))
                return f"{name}({_strip(args[0])}, {_strip(args[1])}, {_strip(args[2])})"
            return f"({args[1]} if {args[0]} else {args[2]})"
        if s.name == "sign":
            one = self._sym(ops.const(1.0), dtype)
            zero = self._sym(ops.const(0.0), dtype)
            x = args[0]
            return f"({one} if {x} > 0 else (-{one} if {x} < 0 else {zero}))"
        if s.name in ops.HELPERS:  # a target's helper function (kadj.ops.HELPERS)
            return f"{self.bind(ops.HELPERS[s.name](), s.name)}({', '.join(args)})"
        return f"{_SYM_FUNCS[s.name]}({', '.join(args)})"

    def cast(self, text, target_type):
        if isinstance(target_type, types.Complex) and target_type.bitwidth == 64:
            return _call_once("np.complex64", _strip(text))
        if isinstance(target_type, types.Float) and target_type.bitwidth == 32:
            return _call_once("np.float32", _strip(text))
        return _strip(text)


def _call_once(func, text):
    """``func(text)``, or ``text`` itself when it is already one call of ``func`` (a
    cast of a cast is the same cast)."""
    if text.startswith(func + "(") and _strip(text[len(func):]) != text[len(func):]:
        return text
    return f"{func}({text})"



def _add(a, b):
    """Render a + b with small constant folding."""
    try:
        return str(int(a) + int(b))
    except ValueError:
        pass
    if b.startswith("-"):
        return f"{a} - {b[1:]}"
    return f"{a} + {b}"


def _strip(text):
    if text.startswith("(") and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0 and i < len(text) - 1:
                return text
        return text[1:-1]
    return text


