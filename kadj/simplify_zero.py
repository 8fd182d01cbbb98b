"""The first contribution to an adjoint known to be zero assigns it (a pass over the
adjoint IR, run by :func:`kadj.simplify.simplify` before copy propagation).

``adj_v += e`` where ``adj_v`` is zero on every path that reaches the statement
becomes ``adj_v = e`` (``adj_v -= e``: ``adj_v = -(e)``).  ``adj_v`` is zero there when
each path comes from its zero initialisation or from a reset ``adj_v = 0.0`` (the
adjoint consumed by the statement that defined ``v``: in a reversed loop, at the end
of the previous iteration) with nothing assigning ``adj_v`` in between.  That is a
must-analysis over the structured IR: the known-zero set meets (intersects) where
branches join, a loop's head takes the meet of its entry, the end of its body and its
``continue`` statements (iterated to a fixed point), its exit the meet of its head
and its ``break`` statements; after ``break``, ``continue`` or ``return`` nothing
flows on.  A statement this pass does not know forgets every name it mentions.

``0.0 + e`` is ``e`` for every ``e`` but ``-0.0`` (which gives ``+0.0``), so an adjoint
is at most a zero of the other sign, never another value.  LLVM may not drop the
addition itself (without fast-math ``0.0 + e`` is not ``e``); in a reversed loop of
scalar algebra each such addition is one more operation per iteration (n-body's pair
loop had five, with the chains behind them).  The resets stay as built.

A contribution assigned in place of the zero must have the zero's type, or the variable
would change type: an adjoint reset to ``0.0`` (a float64) is rewritten only in kernels
whose floating-point values are all float64 (:func:`float64_only`), and one reset to
``np.float32(0.0)`` only where the contribution is one ``np.float32(...)`` cast, as
the reverse pass writes every contribution to a float32 adjoint.
"""
from __future__ import annotations

import ast

from numba.core import types

from . import adj_ir as A
from .adj_refs import DEF, FIXED, mentioned, names, roles_of
from .expr_text import substitute

_ZERO = "0.0"
_F32_ZERO = "np.float32(0.0)"
_OPS = ("+=", "-=")


def float64_only(typemap):
    """True when every floating-point type in ``typemap`` (name -> numba type, nested
    in arrays and tuples too) is float64 and none is complex."""
    return all(_f64(t) for t in typemap.values())


def _f64(t):
    if isinstance(t, types.Complex):
        return False
    if isinstance(t, types.Float):
        return t.bitwidth == 64
    dtype = getattr(t, "dtype", None)
    if isinstance(dtype, types.Type) and dtype is not t and not _f64(dtype):
        return False
    inner = getattr(t, "types", None)
    if isinstance(inner, tuple):
        return all(_f64(u) for u in inner if isinstance(u, types.Type))
    return True


def assign_first_contributions(fn, float64=False):
    """Rewrite ``fn`` (an :class:`adj_ir.Function`) in place; returns it.  ``float64``:
    the kernel's floating-point values are all float64 (:func:`float64_only`), so an
    adjoint reset to ``0.0`` may take any contribution; one reset to
    ``np.float32(0.0)`` takes only a contribution cast to float32 as a whole."""
    zeros = {}
    for x in A.walk(fn.prologue + fn.body):
        if _is_reset(x):
            zeros.setdefault(x.target.name, set()).add(x.value)
    flow = _Flow(zeros, float64)
    state = flow.seq(fn.prologue, set())
    flow.seq(fn.body, state)
    return fn


def _meet(a, b):
    """None: no path reaches (the identity of the meet)."""
    if a is None:
        return None if b is None else set(b)
    return set(a) if b is None else a & b


class _Flow:
    def __init__(self, zeros, float64):
        self.zeros = zeros      # name -> the zero texts it is reset to
        self.float64 = float64
        self.loops = []     # per enclosing loop: [breaks' states, continues' states]

    def seq(self, nodes, z):
        for x in nodes:
            z = self.node(x, set() if z is None else z)
        return z

    def node(self, x, z):
        if isinstance(x, A.If):
            return _meet(self.seq(x.then, set(z)), self.seq(x.orelse, set(z)))
        if isinstance(x, (A.For, A.While)):
            return self.loop(x, z)
        if isinstance(x, (A.ReverseLoop, A.Block)):
            return self.seq(x.body, z)
        if isinstance(x, (A.Break, A.Continue)):
            if not self.loops:
                return set()
            self.loops[-1][isinstance(x, A.Continue)].append(set(z))
            return None
        if isinstance(x, A.Return):
            return None
        if x.children():        # a compound statement this pass does not know
            return z - mentioned(x)
        if _contribution(x, z) and self.same_type(x):
            if x.op == "-=":
                x.value = substitute("-_v", "_v", x.value) or f"-({x.value})"
            x.op = "="
        z = z - {n for n, role in roles_of(x) if role in (DEF, FIXED)}
        if _is_reset(x):
            z.add(x.target.name)
        return z

    def same_type(self, x):
        """Is the contribution ``x`` of the type of its target's zero?"""
        zero = self.zeros.get(x.target.name, set())
        if zero == {_ZERO}:
            return self.float64
        return zero == {_F32_ZERO} and _is_f32_cast(x.value)

    def loop(self, x, entry):
        if isinstance(x, A.For) and "prange" in x.iter:
            return entry - mentioned(x)    # iterations on other threads: nothing known
        entry = entry - set(names(x.var)) if isinstance(x, A.For) else entry
        head = set(entry)
        built = [(y, y.op, y.value) for y in A.walk(x.body) if isinstance(y, A.Accumulate)]
        while True:
            for y, op, value in built:  # (a round's rewrites undone: the next starts anew)
                y.op, y.value = op, value
            self.loops.append(([], []))
            end = self.seq(x.body, set(head))
            breaks, continues = self.loops.pop()
            back = end
            for c in continues:
                back = _meet(back, c)
            new = _meet(entry, back)
            if new == head:
                break
            head = new
        out = set(head)
        for b in breaks:
            out = _meet(out, b)
        return out


def _contribution(x, z):
    """``x`` is ``adj_v += e`` (or ``-=``) into a plain adjoint variable in ``z``."""
    return (isinstance(x, A.Accumulate) and x.op in _OPS and x.how in (None, "plain")
            and isinstance(x.target, A.AdjVar) and x.target.name in z
            and isinstance(x.value, str) and x.target.name not in names(x.value))


def _is_reset(x):
    return (isinstance(x, A.Assign) and isinstance(x.target, A.AdjVar) and x.op == "="
            and x.value in (_ZERO, _F32_ZERO))


def _is_f32_cast(text):
    """``text`` is one call ``np.float32(...)`` (a float32 value, whatever is inside)."""
    try:
        e = ast.parse(text, mode="eval").body
    except SyntaxError:
        return False
    return (isinstance(e, ast.Call) and ast.unparse(e.func) == "np.float32"
            and len(e.args) == 1 and not e.keywords)


