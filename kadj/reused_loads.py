"""One name per element a block loads (CPU adjoints).

The reverse of ``ax += mass[j] * dx * s; ay += mass[j] * dy * s`` recomputes each
product with its own load of ``mass[j]``::

    mass_j = mass[j]
    ...
    mass_j_2 = mass[j]

:func:`reuse_loads` reads ``mass_j`` where the block read ``mass_j_2`` and drops the
second load, when both load the same value (the same element text, with nothing in
between that may change it: a name it reads, memory, the tape) and ``mass_j`` still
holds it wherever ``mass_j_2`` is read.  It is exact: the same value under one name.
Only a load assigned once in the whole function, read nowhere but later in its own
block (in statements whose expressions :func:`kadj.adj_refs.rewrite` rewrites), is
replaced.
"""
from __future__ import annotations

import ast

from . import adj_ir as A
from .adj_refs import IDENT, lists, names, pure, rewrite
from .simplify_expr import _mentioned, _stable, _target_writes, _writes

__all__ = ["defining", "first_load", "node_names", "reuse_loads", "sum_of_products"]

#: statements whose expressions rewrite() renames in (their children aside)
_REWRITTEN = (A.Assign, A.Accumulate, A.Return, A.If, A.While, A.For, A.Consume,
              A.Push, A.Pop, A.Comment)


def reuse_loads(fn):
    """``fn`` (an :class:`adj_ir.Function`; not the functions it defines), each
    repeated load of an element read under the name of its first load (see the module
    docstring).  Returns ``fn``."""
    defs = _definitions(fn)       # (a rename only drops the renamed load's one def)
    if defs is None:
        return fn
    for seq in lists(fn):
        q = 0
        while q < len(seq):
            x = seq[q]
            load = _load(x)
            if load is not None and defs.get(x.target) == 1 and \
                    x.target not in fn.params:
                first = first_load(seq, q, load, name=x.target)
                if first is not None and _rename(fn, seq, q, x.target, first):
                    continue        # (seq[q] is gone: the next statement is there)
            q += 1
    return fn


def _load(x):
    """The element text ``x`` (``name = a[i]``) loads, else None."""
    got = defining(x)
    if got is None or not isinstance(x, A.Assign):
        return None
    terms = sum_of_products(got[1])
    if terms is None or len(terms) != 1 or len(terms[0]) != 1 or \
            IDENT.match(terms[0][0]) or not pure(got[1]) or got[0] in names(got[1]):
        return None
    return got[1]


def first_load(seq, q, load, name=None, until=None):
    """``(position, name)`` of the first statement of ``seq`` before ``seq[q]`` that
    loaded ``load`` into a name other than ``name``, with the same value as ``load``
    has at ``seq[q]`` (nothing in between may change it) and, given ``until``, that
    name unchanged before ``seq[until]``; else None."""
    for q0 in range(q):
        got = defining(seq[q0])
        if got is not None and isinstance(seq[q0], A.Assign) and got[1] == load and \
                got[0] != name and _stable(seq, q0 + 1, q, load) and \
                (until is None or _stable(seq, q0 + 1, until, got[0])):
            return q0, got[0]
    return None


def _rename(fn, seq, q, name, first):
    q0, holder = first
    last = None
    inside = set()
    for r in range(q + 1, len(seq)):
        for y in A.walk([seq[r]]):
            if name in _own_names(y):
                if not isinstance(y, _REWRITTEN) or _in_plain_target(y, name):
                    return False
                last = r
                inside.add(id(y))
    outside = [y for y in A.walk(_all(fn)) if name in _own_names(y)
               and id(y) not in inside and y is not seq[q]]
    if outside:
        return False
    if last is not None and not _stable(seq, q0 + 1, last + 1, holder):
        return False
    if last is not None:
        for r in range(q + 1, last + 1):
            for y in A.walk([seq[r]]):
                if id(y) in inside:
                    rewrite(y, name, holder)
    del seq[q]
    return True


def _all(fn):
    return fn.prologue + fn.body


def _in_plain_target(y, name):
    """Does ``name`` occur in a plain target's text (``x_work[k] = ...``), which
    rewrite() leaves as it is?"""
    t = getattr(y, "target", None)
    return isinstance(t, str) and name in names(t)


def node_names(y):
    """The names ``y``'s own expressions, target and text mention (not its
    children's)."""
    out = _mentioned(y)
    text = getattr(y, "text", None)
    if isinstance(text, str):
        out |= set(names(text))
    return out


def _own_names(y):
    """:func:`node_names` of code (a comment mentions none), and all a statement of a
    kind this module does not rewrite may write."""
    if isinstance(y, A.Comment):
        return set()
    out = node_names(y)
    if not isinstance(y, _REWRITTEN + (A.Break, A.Continue, A.Pass, A.Barrier,
                                       A.ReverseLoop, A.Block)):
        out |= _writes(y)
    return out


_NO_WRITES = (A.If, A.While, A.Comment, A.Break, A.Continue, A.Pass, A.Return,
              A.ReverseLoop, A.Block, A.Push, A.Reserve, A.CapacityCheck, A.Barrier)


def _own_writes(y):
    """The names statement ``y`` itself (not a statement inside it) may assign."""
    if isinstance(y, (A.Assign, A.Accumulate, A.Consume, A.Pop)):
        return _target_writes(y.target)
    if isinstance(y, A.For):
        return _target_writes(y.var)
    if isinstance(y, _NO_WRITES):
        return set()
    return {"<all>"}


def _definitions(fn):
    """How many statements assign each name; None where one of kind this module does
    not know may write anything."""
    count = {}
    for y in A.walk(_all(fn)):
        w = _own_writes(y)
        if "<all>" in w:
            return None
        for n in w:
            count[n] = count.get(n, 0) + 1
    return count


# ---- statements read as values ------------------------------------------------------
def defining(x):
    """``(name, value)`` when ``x`` assigns a plain name a value (a primal value or an
    adjoint variable's first contribution), else None."""
    if isinstance(x, A.Assign) and isinstance(x.target, str) and x.op == "=" and \
            IDENT.match(x.target) and isinstance(x.value, str):
        return x.target, x.value
    if isinstance(x, A.Accumulate) and x.op == "=" and x.how == "plain" and \
            isinstance(x.target, A.AdjVar) and isinstance(x.value, str):
        return x.target.name, x.value
    return None


def sum_of_products(text):
    """``text`` as a sum of products: a list of terms, each the list of its factors'
    texts (names and array elements only); None for any other expression."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    terms = []

    def add(node):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return add(node.left) and add(node.right)
        factors = []
        if not mul(node, factors):
            return False
        terms.append(factors)
        return True

    def mul(node, out):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return mul(node.left, out) and mul(node.right, out)
        if _atom(node):
            out.append(ast.unparse(node))
            return True
        return False

    return terms if add(tree) else None


def _atom(node):
    """A name, or an element ``a[i, j]`` of an array name at indices that are names
    or integers."""
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        idx = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return all(isinstance(i, ast.Name) or (isinstance(i, ast.Constant) and
                                               type(i.value) is int) for i in idx)
    return False
