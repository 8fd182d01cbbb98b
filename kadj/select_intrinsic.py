"""``_select(c, a, b)``: ``a if c else b`` as one ``select`` instruction.

A CPU adjoint chooses between two values in its derivatives: a strong zero
(``0.0 if g == 0.0 else g * partial``: a zero cotangent contributes nothing even where
the partial is infinite), the branches of ``abs``, ``min``, ``max`` and ``where``.
Written as Python's conditional expression, numba lowers each into three blocks, a
branch and a variable stored in each (LLVM turns them back into a ``select``);
``_select`` is a numba builtin (a typing template and a lowering, like
:mod:`kadj.sum_intrinsic`) lowered in place to the ``select``, with both values
computed first.  Its type is the one numba gives the conditional expression's
variable, the unification of the two values' types (``0.0`` and a float32 value:
float64).  Both values are computed, as LLVM computes them after it has turned the
branch into a ``select``: the derivatives it chooses between are arithmetic on values
the adjoint already holds (an adjoint is compiled with ``error_model='numpy'``: a
division by zero gives an infinity, not an exception), so computing the one not chosen
changes nothing.  Called from Python it returns what the conditional expression
returns, both values computed; where kadj runs an adjoint's source as Python (to
measure its tape, :mod:`kadj.tape_measure`) each call is written back as the
conditional expression (:func:`as_conditional`), which computes only the value it
chooses (a Python float divided by zero raises).  The CUDA target keeps the
conditional expression.
"""
from __future__ import annotations

import ast
import types as types_

from numba.core import types
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature

__all__ = ["_select", "as_conditional"]

_VALUES = (types.Float, types.Integer, types.Boolean)


def _select(c, a, b):
    """``a if c else b`` (in compiled code: one ``select`` of the two, both computed)."""
    return a if c else b


@infer_global(_select)
class _SelectTyping(AbstractTemplate):
    """``_select(c, a, b)`` of a boolean or number ``c`` and two real scalars has the
    type numba gives ``a if c else b``: the unification of ``a``'s and ``b``'s."""

    def generic(self, args, kws):
        if kws or len(args) != 3:
            return None
        c, a, b = args
        if not isinstance(c, (types.Boolean, types.Number)) or not all(
                isinstance(t, _VALUES) for t in (a, b)):
            return None
        rt = self.context.unify_types(a, b)
        if rt is None or not isinstance(rt, _VALUES):
            return None
        return signature(types.unliteral(rt), c, a, b)


@lower_builtin(_select, types.Any, types.Any, types.Any)
def _select_lowered(context, builder, sig, args):
    rt = sig.return_type
    cond = context.is_true(builder, sig.args[0], args[0])
    a = context.cast(builder, args[1], sig.args[1], rt)
    b = context.cast(builder, args[2], sig.args[2], rt)
    return builder.select(cond, a, b)


class _AsConditional(ast.NodeTransformer):
    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "_select" and \
                len(node.args) == 3 and not node.keywords:
            c, a, b = node.args
            return ast.copy_location(ast.IfExp(test=c, body=a, orelse=b), node)
        return node


def as_conditional(fn, source):
    """The Python function ``fn`` (defined by ``source``) with each ``_select(c, a, b)``
    written back as ``a if c else b``, for running an adjoint's source as Python: there
    a value not chosen is not computed (a Python float divided by zero raises).  Same
    globals, same line numbers; ``fn`` itself where ``source`` has no ``_select``."""
    if "_select(" not in source:
        return fn
    tree = _AsConditional().visit(ast.parse(source))
    module = compile(ast.fix_missing_locations(tree), fn.__code__.co_filename, "exec")
    code = next(c for c in module.co_consts
                if isinstance(c, types_.CodeType) and c.co_name == fn.__name__)
    return types_.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__,
                               fn.__closure__)
