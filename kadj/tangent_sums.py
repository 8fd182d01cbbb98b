"""Term order of the tangent sums: the term that reads the tangent being assigned is
added last.

The tangent of a recurrence ``x = x * a + b`` is a sum of one term per active operand,
``dot_x = dot_x * a + dot_a * x + dot_b``, which Python (and Numba, without fastmath)
adds left to right: the loop-carried ``dot_x`` then waits for a multiply and two adds
per iteration, where the primal's ``x`` waits for one of each.  Written
``dot_x = dot_a * x + dot_b + dot_x * a``, the terms that do not depend on the previous
iteration's tangent are summed off the carried chain, and the chain of ``dot_x`` is one
multiply and one add, the primal's own length.  The sum is the same; only its rounding
may differ in the last bits.

Only tangent assignments (``dot_<name> = ...``) are reordered; the primal's statements
are the kernel's, unchanged.  A sum is reordered when exactly one of its top-level
terms reads the assigned name and moving that term to the end shortens its chain (a sum
of two terms is left as it is); the new first term must be added, not subtracted.
"""
from __future__ import annotations

import ast

from . import adj_ir as A
from .expr_text import combine, parse


def carried_terms_last(fn, tangent_names):
    """Reorder, in place, the sums assigned to the names ``tangent_names`` in ``fn``'s
    prologue and body (nested statements included)."""
    names = frozenset(tangent_names)
    for node in A.walk(list(fn.prologue) + list(fn.body)):
        if isinstance(node, A.Assign) and node.op == "=" and \
                isinstance(node.target, str) and node.target in names:
            new = reorder(node.value, node.target)
            if new is not None:
                node.value = new


def _terms(tree):
    """The top-level terms of a sum ``t0 + t1 - t2 ...`` (left-associated), as
    ``[(sign, node)]``: the first sign is ``+``."""
    out = []
    node = tree
    while isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        out.append(("+" if isinstance(node.op, ast.Add) else "-", node.right))
        node = node.left
    out.append(("+", node))
    out.reverse()
    return out


def _reads(node, name):
    return any(isinstance(x, ast.Name) and x.id == name for x in ast.walk(node))


def reorder(text, name):
    """``text`` (a sum) with its one term that reads ``name`` moved to the end, or None
    where that would not shorten the chain through ``name`` or cannot be written."""
    tree = parse(text)
    if tree is None:
        return None
    terms = _terms(tree)
    n = len(terms)
    reading = [k for k, (_, node) in enumerate(terms) if _reads(node, name)]
    if len(reading) != 1:
        return None
    p = reading[0]
    # adds on the chain from term p to the result: n - max(p, 1); at the end: 1
    if n - max(p, 1) <= 1:
        return None
    order = [t for k, t in enumerate(terms) if k != p] + [terms[p]]
    if order[0][0] != "+":
        return None
    source = text.strip()

    def segment(node):
        return source[node.col_offset:node.end_col_offset]

    out = segment(order[0][1])
    for sign, node in order[1:]:
        out = combine(out, sign, segment(node))
        if out is None:
            return None
    return out if parse(out) is not None else None
