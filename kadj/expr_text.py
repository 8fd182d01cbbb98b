"""Expression text put together by precedence: one name of an expression replaced by
another expression, parenthesised only where Python's grammar needs it.

The text outside the replaced name is kept byte for byte; the parse tree only says
where the name sits and how tightly its surroundings bind.  A right operand of the
same precedence keeps its parentheses (``a - (b - c)``, and ``a + (b + c)``, whose
floating-point rounding differs from ``a + b + c``); comparisons never chain.
"""
from __future__ import annotations

import ast
import functools

# binding strength, loosest first (the table of Python's language reference)
_BINOP = {ast.BitOr: 7, ast.BitXor: 8, ast.BitAnd: 9, ast.LShift: 10, ast.RShift: 10,
          ast.Add: 11, ast.Sub: 11, ast.Mult: 12, ast.Div: 12, ast.FloorDiv: 12,
          ast.Mod: 12, ast.MatMult: 12, ast.Pow: 14}
_ATOM = 17
_TRAILER = 16       # x.a, x[i], f(x)
_UNARY = 13


def precedence(node):
    """How tightly the top operator of ``node`` binds (higher: tighter)."""
    if isinstance(node, (ast.Tuple, ast.NamedExpr, ast.Starred, ast.Slice)):
        return 0
    if isinstance(node, ast.Lambda):
        return 1
    if isinstance(node, ast.IfExp):
        return 2
    if isinstance(node, ast.BoolOp):
        return 3 if isinstance(node.op, ast.Or) else 4
    if isinstance(node, ast.UnaryOp):
        return 5 if isinstance(node.op, ast.Not) else _UNARY
    if isinstance(node, ast.Compare):
        return 6
    if isinstance(node, ast.BinOp):
        return _BINOP[type(node.op)]
    if isinstance(node, ast.Await):
        return 15
    if isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        return _TRAILER
    return _ATOM


def parse(text):
    """The expression tree of ``text``, or None where it is not one ASCII expression.
    Trees are shared between calls with the same text: read them, never change them."""
    if not isinstance(text, str) or not text.isascii() or "\n" in text:
        return None
    return _parse(text)


@functools.lru_cache(maxsize=4096)   # bounded: every tree kept is objects the GC walks
def _parse(text):
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None


def _needs_parens(parent, child_field, inner):
    """Whether ``inner`` put as ``parent``'s ``child_field`` needs parentheses; None
    where this module does not put expressions (it then refuses)."""
    p = precedence(inner)
    if isinstance(parent, ast.BinOp):
        q = _BINOP[type(parent.op)]
        if child_field == "left":
            return p < q or (p == q and isinstance(parent.op, ast.Pow))
        return p < q or (p == q and not isinstance(parent.op, ast.Pow))
    if isinstance(parent, ast.UnaryOp):
        return p < precedence(parent)
    if isinstance(parent, ast.Compare):
        return p <= 6
    if isinstance(parent, ast.BoolOp):
        return p <= precedence(parent)
    if isinstance(parent, ast.IfExp):
        return p <= 2
    if isinstance(parent, (ast.Attribute, ast.Subscript, ast.Call)) and \
            child_field in ("value", "func"):
        return p < _TRAILER or isinstance(inner, ast.Constant)
    if isinstance(parent, ast.Subscript) and child_field == "slice":
        return p <= 0
    if isinstance(parent, ast.Call) and child_field == "args":
        return p <= 0
    if isinstance(parent, (ast.Tuple, ast.List, ast.Set)) and child_field == "elts":
        return p <= 0
    if isinstance(parent, ast.Slice):
        return p <= 2
    if isinstance(parent, ast.keyword):
        return p <= 0
    return None


def _find(tree, name):
    """[(parent, field, node)] of every load of ``name`` in ``tree``."""
    out = []

    def visit(node, parent, fld):
        if isinstance(node, ast.Name) and node.id == name:
            out.append((parent, fld, node))
        for f, value in ast.iter_fields(node):
            for child in (value if isinstance(value, list) else [value]):
                if isinstance(child, ast.AST):
                    visit(child, node, f)
    visit(tree, None, None)
    return out


def substitute(text, name, inner_text):
    """``text`` with its one occurrence of the variable ``name`` replaced by the
    expression ``inner_text``, parenthesised as needed; None where ``name`` does not
    occur exactly once or either text is not a plain expression."""
    outer, inner = parse(text), parse(inner_text)
    if outer is None or inner is None:
        return None
    text, inner_text = text.strip(), inner_text.strip()
    hits = _find(outer, name)
    if len(hits) != 1:
        return None
    parent, fld, node = hits[0]
    if parent is None:
        return inner_text
    if _same_cast(parent, inner):   # np.float32(np.float32(x)) is np.float32(x)
        new = text[:parent.col_offset] + inner_text + text[parent.end_col_offset:]
        return new if parse(new) is not None else None
    parens = _needs_parens(parent, fld, inner)
    if parens is None:
        return None
    put = f"({inner_text})" if parens else inner_text
    new = text[:node.col_offset] + put + text[node.end_col_offset:]
    # two unary minus signs side by side read as a decrement to a person: a space
    if put.startswith("-") and text[:node.col_offset].endswith("-"):
        new = text[:node.col_offset] + " " + put + text[node.end_col_offset:]
    return new if parse(new) is not None else None


_CASTS = ("np.float32", "np.complex64")


def _same_cast(outer, inner):
    """Are ``outer`` and ``inner`` both a one-argument call of the same cast to a
    32-bit type (the cast of a cast is that cast)?"""
    def cast(node):
        if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
            func = ast.unparse(node.func)
            return func if func in _CASTS else None
        return None
    return cast(outer) is not None and cast(outer) == cast(inner)


def combine(left, op, right):
    """``left op right`` (op: a binary operator's text), parenthesised as needed."""
    joined = substitute(f"_l {op} _r", "_l", left)
    return None if joined is None else substitute(joined, "_r", right)


def add(left, right):
    """``left + right``; ``left - c`` where ``right`` is ``-c``: a negation, or a chain
    of products and quotients whose first factor is negated (``-p * q`` is ``-(p * q)``,
    the same number: rounding is symmetric in the sign).  None where either text is not
    an expression."""
    text = right.strip()
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    c = _without_minus(text, tree)
    return combine(left, "+", right) if c is None else combine(left, "-", c)


def _without_minus(text, tree):
    """``text`` (of expression ``tree``) negated back: its leading minus taken away, or
    None where it has none the rule above takes away."""
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.USub):
        return _span(text, tree.operand)
    node = tree
    while isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
        node = node.left
    if node is tree or not (isinstance(node, ast.UnaryOp) and
                            isinstance(node.op, ast.USub)):
        return None
    if precedence(node.operand) < _BINOP[ast.Mult]:
        return None     # (-(a + b) * c: the sum keeps its minus)
    return text[:node.col_offset] + _span(text, node.operand) + text[node.end_col_offset:]


def _span(text, node):
    return text[node.col_offset:node.end_col_offset]
