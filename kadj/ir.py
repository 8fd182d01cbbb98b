"""kadj's region tree: the kernel as structured statements.

Operands are :class:`Var` (a kernel variable), :class:`Const` (a literal) or
:class:`GlobalRef` (a module-level object such as a constant array).  Expressions
are the right-hand sides of :class:`Assign`; statements nest into :class:`If`,
:class:`ForRange` (``for i in range(start, stop, step)``) and :class:`Loop`
(``while True`` with :class:`Break` / :class:`Continue`).  After structuring,
``Break``, ``Continue`` and ``Return`` occur only as the last statement of a sequence,
and ``Return`` never inside a loop.

Every node carries the numba ``ir.Loc`` of the user's source line.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


# ---- operands -------------------------------------------------------------------
# The name under which derivative rules see the incoming adjoint (not a Python
# identifier, so no variable of a kernel can be called this).
COTANGENT = "<g>"


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Const:
    value: Any


@dataclass(frozen=True)
class GlobalRef:
    value: Any = field(compare=False)
    name: str = ""


# ---- expressions ---------------------------------------------------------------
@dataclass(frozen=True)
class Copy:
    src: Any


@dataclass(frozen=True)
class Op:
    """A call of ``fn`` (operator, math/numpy function, builtin, or user function with
    a registered rule) on operands; ``kws`` is a tuple of (name, operand)."""

    fn: Any = field(compare=False)
    args: tuple = ()
    kws: tuple = ()


@dataclass(frozen=True)
class Load:
    """``array[index]``.  ``entry``: the element read still holds the value the array
    had when the kernel was called (:mod:`kadj.entry_loads`): an adjoint reads it from
    the user's array, which it never writes, at any time."""

    array: Var
    index: tuple
    entry: bool = False


@dataclass(frozen=True)
class Attr:
    value: Var
    attr: str


@dataclass(frozen=True)
class Item:
    value: Var
    index: int


@dataclass(frozen=True)
class Alloc:
    """A scratch array allocated inside the kernel (np.empty, np.zeros, ...)."""

    fn: Any = field(compare=False)
    args: tuple = ()
    kws: tuple = ()


def make_tuple(*items):
    """Marker callee of ``Op``: builds a tuple (of integers, e.g. a shape)."""
    return items


# ---- statements ------------------------------------------------------------------
@dataclass(frozen=True)
class Assign:
    target: str
    expr: Any
    loc: Any = field(compare=False, default=None)


@dataclass(frozen=True)
class Store:
    """``array[index] = value``; with ``accumulate`` "add" or "sub", an increment
    ``array[index] += value`` (``-=``) that never reads the element (CUDA's
    ``cuda.atomic.add``/``sub``): its adjoint reads the element's adjoint and consumes
    nothing.  ``accumulate="claim"``: the store of the thread that won a
    ``cuda.atomic.max``/``min`` (:mod:`kadj.cuda.atomic_extrema`), reversed as a plain
    store."""

    array: Var
    index: tuple
    value: Any
    loc: Any = field(compare=False, default=None)
    accumulate: Any = None


@dataclass(frozen=True)
class If:
    cond: Any
    then: tuple
    orelse: tuple
    loc: Any = field(compare=False, default=None)


@dataclass(frozen=True)
class ForRange:
    index: str
    start: Any
    stop: Any
    step: Any
    body: tuple
    loc: Any = field(compare=False, default=None)
    uid: int = 0
    parallel: bool = field(compare=False, default=False)   # written with prange()


def never_negative(loop):
    """Does ``loop``'s counter stay at 0 or above?  (A negative index wraps around onto
    the end of the array, an element another iteration may own; a counter of -1 is no
    "no iteration" mark.)  A constant step up from a constant start at least 0, or a
    constant step down to a constant stop at least -1."""
    def const(x):
        return isinstance(x, Const) and isinstance(x.value, int) and \
            not isinstance(x.value, bool)
    if not const(loop.step) or loop.step.value == 0:
        return False
    if loop.step.value > 0:
        return const(loop.start) and loop.start.value >= 0
    return const(loop.stop) and loop.stop.value >= -1


@dataclass(frozen=True)
class Loop:
    body: tuple
    loc: Any = field(compare=False, default=None)
    uid: int = 0


@dataclass(frozen=True)
class Break:
    loc: Any = field(compare=False, default=None)


@dataclass(frozen=True)
class Continue:
    loc: Any = field(compare=False, default=None)


@dataclass(frozen=True)
class Barrier:
    """A barrier among the threads of a block (``cuda.syncthreads()``); the adjoint
    mirrors it."""

    loc: Any = field(compare=False, default=None)


@dataclass(frozen=True)
class Return:
    value: Any = None
    loc: Any = field(compare=False, default=None)


@dataclass(frozen=True)
class Kernel:
    name: str
    args: tuple  # argument names
    body: tuple
    types: dict = field(compare=False, default_factory=dict)  # variable -> numba type
    return_type: Any = field(compare=False, default=None)
    loc: Any = field(compare=False, default=None)
    raises: bool = field(compare=False, default=False)  # a raise left out (structurize)


# ---- helpers -----------------------------------------------------------------------
def operands(expr):
    """The operands an expression reads."""
    if isinstance(expr, Copy):
        return (expr.src,)
    if isinstance(expr, (Op, Alloc)):
        return tuple(expr.args) + tuple(v for _, v in expr.kws)
    if isinstance(expr, Load):
        return (expr.array,) + tuple(expr.index)
    if isinstance(expr, (Attr, Item)):
        return (expr.value,)
    raise TypeError(expr)


def var_names(xs):
    return {x.name for x in xs if isinstance(x, Var)}


def walk(stmts):
    """Every statement in a sequence, nested ones included (pre-order)."""
    for s in stmts:
        yield s
        if isinstance(s, If):
            yield from walk(s.then)
            yield from walk(s.orelse)
        elif isinstance(s, (ForRange, Loop)):
            yield from walk(s.body)


def walk_level(stmts):
    """Statements of a sequence and of its if-arms, not descending into loops."""
    for s in stmts:
        yield s
        if isinstance(s, If):
            yield from walk_level(s.then)
            yield from walk_level(s.orelse)


def stmt_reads(s):
    """Variables a single statement reads (not counting nested bodies)."""
    if isinstance(s, Assign):
        return var_names(operands(s.expr))
    if isinstance(s, Store):
        return var_names((s.array,) + tuple(s.index) + (s.value,))
    if isinstance(s, If):
        return var_names((s.cond,))
    if isinstance(s, ForRange):
        return var_names((s.start, s.stop, s.step))
    if isinstance(s, Return):
        return var_names((s.value,)) if s.value is not None else set()
    return set()


def assigned(stmts):
    """Variables assigned anywhere in a sequence (nested included; loop indices too)."""
    out = set()
    for s in walk(stmts):
        if isinstance(s, Assign):
            out.add(s.target)
        elif isinstance(s, ForRange):
            out.add(s.index)
    return out


def stored_arrays(stmts):
    return {s.array.name for s in walk(stmts) if isinstance(s, Store)}


def same_index(a, b):
    """Do two indices (tuples of operands) have the same text?  (A constant's type
    counts: ``True`` is not ``1``.)"""
    return len(a) == len(b) and all(
        x == y and type(getattr(x, "value", None)) is type(getattr(y, "value", None))
        for x, y in zip(a, b))


def map_nested(s, seq):
    """Statement ``s`` with each statement sequence it nests (an ``if``'s arms, a
    loop's body) replaced by ``seq(sequence)``, as a tuple."""
    if isinstance(s, If):
        return replace(s, then=tuple(seq(s.then)), orelse=tuple(seq(s.orelse)))
    if isinstance(s, (ForRange, Loop)):
        return replace(s, body=tuple(seq(s.body)))
    return s


def renamed_reads(stmts, names):
    """The statements (nested ones included) reading ``names[v]`` wherever they read a
    variable ``v`` of ``names``; assignments' targets and loop counters unchanged."""
    def sub(x):
        return Var(names[x.name]) if isinstance(x, Var) and x.name in names else x

    def expr(e):
        if isinstance(e, Copy):
            return replace(e, src=sub(e.src))
        if isinstance(e, (Op, Alloc)):
            return replace(e, args=tuple(map(sub, e.args)),
                           kws=tuple((k, sub(v)) for k, v in e.kws))
        if isinstance(e, Load):
            return replace(e, index=tuple(map(sub, e.index)))
        if isinstance(e, (Attr, Item)):
            return replace(e, value=sub(e.value))
        raise TypeError(e)

    out = []
    for s in stmts:
        if isinstance(s, Assign):
            s = replace(s, expr=expr(s.expr))
        elif isinstance(s, Store):
            s = replace(s, index=tuple(map(sub, s.index)), value=sub(s.value))
        elif isinstance(s, If):
            s = replace(s, cond=sub(s.cond), then=renamed_reads(s.then, names),
                        orelse=renamed_reads(s.orelse, names))
        elif isinstance(s, ForRange):
            s = replace(s, start=sub(s.start), stop=sub(s.stop), step=sub(s.step),
                        body=renamed_reads(s.body, names))
        elif isinstance(s, Loop):
            s = replace(s, body=renamed_reads(s.body, names))
        elif isinstance(s, Return) and s.value is not None:
            s = replace(s, value=sub(s.value))
        out.append(s)
    return type(stmts)(out)


def loaded_arrays(stmts):
    """Arrays whose current contents a sequence reads (not counting loads of values an
    array had on entry: :attr:`Load.entry`)."""
    return {s.expr.array.name for s in walk(stmts)
            if isinstance(s, Assign) and isinstance(s.expr, Load) and not s.expr.entry}


def loaded_elsewhere(stmts):
    """:func:`loaded_arrays`, and the arrays an entry load of the sequence reads at an
    index other than that of every store of the sequence into them.  A load's adjoint
    adds into the element it read; a store's adjoint takes the element's adjoint: an
    array in this set may have an element one iteration's reverse adds into and
    another's takes (``y[i] = f(y[i + 1])``, whose ``y[i + 1]`` is read on entry), an
    array out of it only its own element (``y[i] = f(y[i])``)."""
    stores = {}
    for s in walk(stmts):
        if isinstance(s, Store):
            stores.setdefault(s.array.name, []).append(s.index)
    return {s.expr.array.name for s in walk(stmts)
            if isinstance(s, Assign) and isinstance(s.expr, Load) and (
                not s.expr.entry or any(not same_index(ix, s.expr.index)
                                        for ix in stores.get(s.expr.array.name, ())))}


def fmt(stmts, indent=0, locs=False):
    """The statements as indented Python-like text, one statement a line (loops with
    their index and range, ``while True`` for :class:`Loop`); with ``locs``, each line
    that has a source location ends with ``# file.py:line``."""
    pad = "    " * indent
    lines = []

    def add(text, s):
        where = loc_text(getattr(s, "loc", None)) if locs else ""
        lines.append(f"{pad}{text}  # {where}" if where else f"{pad}{text}")

    for s in stmts:
        if isinstance(s, (If, ForRange, Loop)):
            add(header(s), s)
            if isinstance(s, If):
                lines.append(fmt(s.then, indent + 1, locs) or pad + "    pass")
                if s.orelse:
                    lines.append(f"{pad}else:")
                    lines.append(fmt(s.orelse, indent + 1, locs))
            else:
                lines.append(fmt(s.body, indent + 1, locs) or pad + "    pass")
        else:
            add(header(s), s)
    return "\n".join(lines)


def header(s):
    """One line for a statement: a simple statement's text, a compound one's header
    (``for i in range(1, n):``, ``while True:``, ``if c:``)."""
    if isinstance(s, If):
        return f"if {_o(s.cond)}:"
    if isinstance(s, ForRange):
        bounds = [s.start, s.stop] + ([] if s.step == Const(1) else [s.step])
        if s.start == Const(0) and s.step == Const(1):
            bounds = [s.stop]
        return f"for {s.index} in range({', '.join(map(_o, bounds))}):"
    if isinstance(s, Loop):
        return "while True:"
    if isinstance(s, Assign):
        return f"{s.target} = {_e(s.expr)}"
    if isinstance(s, Store):
        op = {"add": "+=", "sub": "-="}.get(s.accumulate, "=")
        return f"{s.array.name}[{', '.join(map(_o, s.index))}] {op} {_o(s.value)}"
    if isinstance(s, Return):
        return f"return {_o(s.value)}" if s.value is not None else "return"
    return type(s).__name__.lower()


def loc_text(loc):
    """``file.py:line`` of a numba ``Loc`` (the file's base name), or ``""``."""
    line = getattr(loc, "line", None)
    if line is None:
        return ""
    name = (getattr(loc, "filename", "") or "").replace("\\", "/").rsplit("/", 1)[-1]
    return f"{name}:{line}" if name else f"line {line}"


def _o(x):
    if isinstance(x, Var):
        return x.name
    if isinstance(x, Const):
        return repr(x.value)
    if isinstance(x, GlobalRef):
        return x.name or "<global>"
    return repr(x)


_INFIX = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//",
          "mod": "%", "pow": "**", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
          "eq": "==", "ne": "!=", "and_": "&", "or_": "|", "xor": "^",
          "lshift": "<<", "rshift": ">>", "matmul": "@"}
_PREFIX = {"neg": "-", "pos": "+", "not_": "not ", "invert": "~"}
_MODULES = {"math": "math", "numpy": "np", "cmath": "cmath"}


def fn_name(fn):
    """A callee as the source would spell it: ``math.exp``, ``np.sqrt``, ``abs``."""
    name = getattr(fn, "__name__", None) or repr(fn)
    module = getattr(fn, "__module__", None) or ""
    if isinstance(fn, type(abs)) and module == "_operator":
        return name
    prefix = _MODULES.get(module.split(".")[0]) if module else None
    if prefix is None and type(fn).__name__ == "ufunc":
        prefix = "np"
    return f"{prefix}.{name}" if prefix else name


def _e(e):
    if isinstance(e, Copy):
        return _o(e.src)
    if isinstance(e, Op) and e.fn is make_tuple:
        items = [_o(a) for a in e.args]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    if isinstance(e, Op) and not e.kws and \
            getattr(e.fn, "__module__", None) in ("_operator", "operator"):
        name = getattr(e.fn, "__name__", "")
        if len(e.args) == 2 and name in _INFIX:
            return f"{_o(e.args[0])} {_INFIX[name]} {_o(e.args[1])}"
        if len(e.args) == 1 and name in _PREFIX:
            return f"{_PREFIX[name]}{_o(e.args[0])}"
    if isinstance(e, (Op, Alloc)):
        args = [_o(a) for a in e.args] + [f"{k}={_o(v)}" for k, v in e.kws]
        return f"{fn_name(e.fn)}({', '.join(args)})"
    if isinstance(e, Load):
        text = f"{e.array.name}[{', '.join(map(_o, e.index))}]"
        return text + " (on entry)" if e.entry else text
    if isinstance(e, Attr):
        return f"{e.value.name}.{e.attr}"
    if isinstance(e, Item):
        return f"{e.value.name}[{e.index}]"
    return repr(e)
