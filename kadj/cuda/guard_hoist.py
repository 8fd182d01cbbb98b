"""Guards evaluated once per thread in the gather form (:mod:`kadj.cuda.gather`).

Each pass of a gather kernel replays the forward's guards with another thread's
coordinates, and a guard chain such as ``0 < i < n - 1 and 0 < j < m - 1`` is written
as nested branches, each computing its next comparison inside the previous one::

    t6 = 0 < i
    if t6:
        t13 = bool(i < u.shape[0] - 1)
        if t13:
            ...

A comparison computed inside a branch does not dominate the same comparison in the
next pass, so the compiler evaluates it again there (the 3-D Laplacian's gather kernel
compiled to 66 comparisons against 21 in the hand-written one).  This pass moves such
assignments in front of their branch when that cannot change what the kernel computes:

- the value is pure integer and boolean arithmetic that cannot fail: names, integer and
  boolean constants, ``+ - *``, comparisons, ``not``/``and``/``or``, unary minus,
  ``bool(...)`` and ``name.shape[k]`` (no division, no call, no element load);
- every name it reads is certainly assigned where it moves to: a parameter, or assigned
  before the branch in the same or an enclosing statement list;
- every read of the assigned variable anywhere in the function lies inside a branch on
  the same condition (so where it is read, the branch ran, and the value is the one
  computed in it, from the same operands: only such assignments precede it there).

Only leading assignments of a branch without ``else`` move; a branch's own nested
branches are treated first, so a chain moves out level by level.  A branch left with
nothing to do (comments only) is dropped.
"""
from __future__ import annotations

import ast
import dataclasses
import re

from .. import adj_ir as A

_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_OPS = (ast.Add, ast.Sub, ast.Mult, ast.USub, ast.UAdd, ast.Not, ast.And, ast.Or,
        ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)


def hoist_guards(fn):
    """``fn`` with the movable guard assignments moved (in place); returns ``fn``."""
    reads = {}
    _collect_reads(fn.body, (), reads)
    fn.body = _hoist(fn.body, set(fn.params), reads)
    return fn


def _texts(node):
    """The text fields of a node (not its child statement lists)."""
    out = []
    for f in dataclasses.fields(node):
        v = getattr(node, f.name)
        if isinstance(v, list):
            continue
        out.extend(_value_texts(v))
    return out


def _value_texts(v):
    if isinstance(v, str):
        return [v]
    if isinstance(v, (A.AdjVar, A.AdjElem, A.Local)):
        return [x for f in dataclasses.fields(v)
                for x in _value_texts(getattr(v, f.name))]
    if isinstance(v, tuple):
        return [x for e in v for x in _value_texts(e)]
    return []


def _collect_reads(seq, conds, reads):
    """{name: [frozenset of the enclosing branches' conditions, per occurrence]} of
    every name a node's text mentions, but for a plain assignment's own target."""
    for node in seq:
        texts = _texts(node)
        if isinstance(node, A.Assign) and isinstance(node.target, str) and \
                node.op == "=":
            texts = [node.value]
        if isinstance(node, A.Comment):
            texts = []
        for t in texts:
            for name in _NAME.findall(t):
                reads.setdefault(name, []).append(frozenset(conds))
        inner = conds + (node.cond,) if isinstance(node, A.If) else conds
        if isinstance(node, A.If):
            _collect_reads(node.then, inner, reads)
            _collect_reads(node.orelse, conds, reads)
        else:
            for child in node.children():
                _collect_reads(child, conds, reads)


def _pure(text):
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    names = set()

    def ok(e):
        if isinstance(e, ast.Name):
            names.add(e.id)
            return True
        if isinstance(e, ast.Constant):
            return isinstance(e.value, (bool, int))
        if isinstance(e, ast.BinOp):
            return isinstance(e.op, _OPS) and ok(e.left) and ok(e.right)
        if isinstance(e, ast.UnaryOp):
            return isinstance(e.op, _OPS) and ok(e.operand)
        if isinstance(e, ast.BoolOp):
            return all(ok(v) for v in e.values)
        if isinstance(e, ast.Compare):
            return all(isinstance(o, _OPS) for o in e.ops) and ok(e.left) and \
                all(ok(c) for c in e.comparators)
        if isinstance(e, ast.Call):
            return isinstance(e.func, ast.Name) and e.func.id == "bool" and \
                len(e.args) == 1 and not e.keywords and ok(e.args[0])
        if isinstance(e, ast.Subscript):
            # name.shape[k]
            v, s = e.value, e.slice
            return isinstance(v, ast.Attribute) and v.attr == "shape" and \
                isinstance(v.value, ast.Name) and isinstance(s, ast.Constant) and \
                isinstance(s.value, int) and ok(v.value)
        return False

    return names if ok(tree) else None


def _hoist(seq, defined, reads):
    """``seq`` with movable assignments moved; ``defined``: the names certainly
    assigned before it (updated with its own unconditional assignments)."""
    out = []
    defined = set(defined)
    for node in seq:
        if isinstance(node, A.If):
            node.then = _hoist(node.then, defined, reads)
            node.orelse = _hoist(node.orelse, defined, reads)
            if not node.orelse:
                moved, kept = _leading(node, defined, reads)
                out.extend(moved)
                node.then = kept
                for m in moved:
                    defined.add(m.target)
                if all(isinstance(x, (A.Comment, A.Pass)) for x in node.then):
                    continue        # nothing left to guard

        else:
            inner = defined | {node.var} if isinstance(node, A.For) else defined
            for field in dataclasses.fields(node):
                v = getattr(node, field.name)
                if isinstance(v, list) and v and isinstance(v[0], A.Node):
                    setattr(node, field.name, _hoist(v, inner, reads))
        out.append(node)
        if isinstance(node, A.Assign) and isinstance(node.target, str) and \
                node.op == "=":
            defined.add(node.target)
    return out


def _leading(node, defined, reads):
    """(assignments moved in front of the branch ``node``, its remaining body)."""
    moved, known = [], set(defined)
    body = list(node.then)
    k = 0
    while k < len(body):
        x = body[k]
        if isinstance(x, A.Comment):
            k += 1
            continue
        if not (isinstance(x, A.Assign) and isinstance(x.target, str) and x.op == "="):
            break
        names = _pure(x.value)
        if names is None or not names <= known or x.target in names:
            break
        if not all(node.cond in c for c in reads.get(x.target, ())):
            break
        moved.append(x)
        known.add(x.target)
        k += 1
    if not moved:
        return [], node.then
    keep = [x for x in body if not any(x is m for m in moved)]
    return moved, keep
