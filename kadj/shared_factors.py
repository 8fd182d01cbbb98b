"""Adjoint sums that share a factor, computed once (CPU adjoints).

The reverse of ``ax += m * dx * s; ay += m * dy * s; az += m * dz * s`` (n-body's
accelerations, any weighted sum over components) adds three products into the adjoint
of ``s`` and three into that of ``m``::

    adj_s = adj_az * t15 + adj_ay * t13 + adj_ax * t11      # t15 = m * dz, ...
    adj_m += adj_t15 * dz + adj_t13 * dy + adj_t11 * dx     # adj_t15 = adj_az * s, ...

Both are ``m`` (or ``s``) times the one sum ``adj_az * dz + adj_ay * dy + adj_ax * dx``,
which an expert writes once::

    _shared1 = adj_az * dz + adj_ay * dy + adj_ax * dx
    adj_s = m * _shared1
    adj_m += s * _shared1

:func:`share_factors` finds such sums in a statement list: it reads each sum of
products in an adjoint accumulation with the products of the list's temporaries written
out (``t15`` as ``m * dz`` where the list computed it and nothing between changed what
it read), takes out the factors every product has, and where two or more
accumulations are left with the same sum, computes that sum once before the first of
them.  Exact steps prepare it: adjacent ``if`` statements on the same condition
become one (the recomputed values and the adjoint statements of a branch of the
kernel then share a list), an element the list loads twice is read under one name
(:mod:`kadj.reused_loads`), and the contributions to a scalar adjoint that a list
assigns and then adds to, with nothing reading it in between, become one sum
(``adj_s = a; ...; adj_s += b`` is ``adj_s = a + b``: the same additions in the same
order; only where the sum fits a line of 70 characters, and only in a float64
adjoint: numba gives a variable one type, so in a float32 adjoint ``adj_s = a``
rounds ``a`` to float32 before ``b`` is added), and a float64 sum that starts with one
term twice starts with it doubled (:func:`double_repeated_terms`).

Taking a factor out of a sum changes how it rounds (``m * (a + b)`` against ``m * a +
m * b``), as a hand-written adjoint does; nothing else changes.  It is done only in
float64 adjoints (a float32 or complex kernel keeps its products as written: numba
types a product of mixed precisions by its operands), only for products of names and
array elements (no constants, no calls), and only where a sum is shared, so that it
saves work.  Temporaries left unread go (:func:`kadj.simplify_primal.remove_unused_primal`).
"""
from __future__ import annotations

import ast

from . import adj_ir as A
from . import expr_text as E
from .adj_refs import IDENT, lists, names, pure
from .reused_loads import (defining, first_load, node_names, reuse_loads,
                           sum_of_products)
from .simplify_expr import WIDTH, _stable, _writes
from .simplify_primal import remove_unused_primal

__all__ = ["share_factors", "join_same_condition_ifs", "merge_scalar_sums",
           "double_repeated_terms"]

#: how deep a temporary's product is written out (a temporary of temporaries)
_DEPTH = 3


def share_factors(fn, factor=True):
    """``fn`` and the functions it defines (:class:`adj_ir.Function`), their shared
    sums computed once (see the module docstring); ``factor=False`` (an adjoint with
    float32 or complex values): only the ifs joined.  Returns ``fn``."""
    for f in [fn] + [h for _dec, h in fn.helpers]:
        join_same_condition_ifs(f)
        reuse_loads(f)
        if factor:
            merge_scalar_sums(f)
            double_repeated_terms(f)
            used = _all_names(f)
            if any(_factor_list(seq, used) for seq in lists(f)):
                remove_unused_primal(f)
    return fn


# ---- adjacent ifs on one condition ------------------------------------------------------
def join_same_condition_ifs(fn):
    """``if c: A`` directly followed by ``if c: B`` becomes ``if c: A; B`` (and their
    ``else`` branches likewise) when ``c`` is pure and neither branch of the first
    may change what ``c`` reads (a name, memory, the tape)."""
    for seq in lists(fn):
        k = 0
        while k + 1 < len(seq):
            x, y = seq[k], seq[k + 1]
            if _joinable(x, y):
                x.then.extend(y.then)
                x.orelse.extend(y.orelse)
                del seq[k + 1]
                continue
            k += 1


def _joinable(x, y):
    if not (isinstance(x, A.If) and isinstance(y, A.If) and x.cond == y.cond
            and x.fresh == y.fresh and pure(x.cond)):
        return False
    first = x.then + x.orelse
    return _stable(first, 0, len(first), x.cond)    # (names, memory it reads, the tape)


# ---- contributions to one scalar adjoint ------------------------------------------------
def _scalar_contribution(x, op):
    return (isinstance(x, A.Accumulate) and x.op == op and x.how == "plain"
            and isinstance(x.target, A.AdjVar) and isinstance(x.value, str))


def merge_scalar_sums(fn):
    """``adj_v = a`` followed in the same list by ``adj_v += b``, with nothing between
    reading or writing ``adj_v``, changing what ``a`` reads or leaving the block: one
    ``adj_v = a + b`` in the place of the second."""
    for seq in lists(fn):
        pos = 0
        while pos < len(seq):
            x = seq[pos]
            if _scalar_contribution(x, "=") and pure(x.value) and \
                    _merge_into_later(seq, pos, x):
                continue        # (x is gone: seq[pos] is the next statement)
            pos += 1


def _merge_into_later(seq, pos, x):
    name = x.target.name
    if name in names(x.value):
        return False
    for at in range(pos + 1, len(seq)):
        y = seq[at]
        if _scalar_contribution(y, "+=") and y.target.name == name:
            if name in names(y.value) or not pure(y.value) or \
                    not _stable(seq, pos + 1, at, x.value):
                return False
            value = _sum_of(x.value, y.value)
            if value is None or len(value) > WIDTH:
                return False
            y.op, y.value = "=", value
            del seq[pos]
            return True
        if name in _mentioned(y) or _leaves(y):
            return False
    return False


def double_repeated_terms(fn):
    """An adjoint accumulation whose sum starts with the same term twice, ``t + t +
    ...`` (two loads of one element read under one name, :mod:`kadj.reused_loads`),
    starts with ``t * 2.0`` instead: the same number (doubling is exact), one operation
    fewer.  Only the first two terms: ``(a + t) + t`` is not ``a + t * 2.0`` in
    floating point."""
    for seq in lists(fn):
        for x in seq:
            if isinstance(x, A.Accumulate) and x.how == "plain" and \
                    isinstance(x.value, str) and pure(x.value):
                x.value = _doubled(x.value)


def _doubled(text):
    """``text`` with the innermost left ``t + t`` of its chain of additions written
    ``t * 2.0`` (a product binds tighter than the sum around it: no parentheses)."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return text
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and \
            isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Add):
        node = node.left
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)) or \
            ast.dump(node.left) != ast.dump(node.right):
        return text
    put = E.combine(text[node.left.col_offset:node.left.end_col_offset], "*", "2.0")
    return text if put is None else \
        text[:node.col_offset] + put + text[node.end_col_offset:]


def _leaves(x):
    """May ``x`` leave the block (a ``break``, ``continue`` or ``return`` in it)?  The
    first contribution must not be moved past that: the block may end before the
    second."""
    return any(isinstance(y, (A.Break, A.Continue, A.Return)) for y in A.walk([x]))


def _sum_of(a, b):
    """``a + b`` (``a - c`` where ``b`` is ``-c``: :func:`kadj.expr_text.add`)."""
    return E.add(a, b)


def _mentioned(x):
    """Every name ``x`` or a statement inside it reads or writes."""
    out = set()
    for y in A.walk([x]):
        out |= _writes(y) | node_names(y)
    return out


# ---- factors taken out of shared sums ---------------------------------------------------
def _expand(seq, pos, factor, depth):
    """The factors ``factor`` stands for at ``seq[pos]``: a name the list assigned a
    product of factors earlier, with nothing between writing the name or changing what
    the product reads, is that product (written out again, ``depth`` levels); a name
    the list loaded an array element into is the first name the list loaded that
    element into, while both hold it (:func:`_first_holder`); anything else stands for
    itself."""
    if not IDENT.match(factor):
        return [factor]
    got = _nearest_def(seq, pos, factor)
    if got is None:
        return [factor]
    q, value = got
    terms = sum_of_products(value)
    if terms is None or len(terms) != 1 or factor in names(value):
        return [factor]
    if len(terms[0]) == 1 and not IDENT.match(terms[0][0]):      # a load: x = a[i]
        return [_first_holder(seq, q, pos, factor, value)]
    if depth == 0 or not pure(value) or not _stable(seq, q + 1, pos, value):
        return [factor]
    out = []
    for f in terms[0]:
        out.extend(_expand(seq, q, f, depth - 1))
    # each factor holds at q what the product read there; it must hold it until pos
    # (a name another load was reduced to, a temporary's factor)
    if not all(_stable(seq, q + 1, pos, f) for f in out):
        return [factor]
    return out


def _nearest_def(seq, pos, name):
    """``(position, value)`` of the statement before ``seq[pos]`` that last assigned
    ``name`` a value, when that is a plain assignment in ``seq`` itself; else None."""
    for q in range(pos - 1, -1, -1):
        x = seq[q]
        got = defining(x)
        if got is not None and got[0] == name:
            return q, got[1]
        w = _writes(x)
        if name in w or "<all>" in w:
            return None
    return None


def _first_holder(seq, q, pos, name, load):
    """The first name ``seq`` loaded the element ``load`` into, when it loaded the same
    value as ``seq[q]`` (``name = load``) and still holds it at ``seq[pos]``."""
    got = first_load(seq, q, load, name=name, until=pos)
    return name if got is None else got[1]


def _common(terms):
    """The factors every term has (with multiplicity, in the first term's order) and
    each term without them; None when there are none or a term would be left empty."""
    common = []
    rest = [list(t) for t in terms]
    for f in terms[0]:
        if all(f in r for r in rest[1:]) and f in rest[0]:
            common.append(f)
            for r in rest:
                r.remove(f)
    if not common or any(not r for r in rest):
        return None
    return common, rest


def _product_text(factors):
    text = factors[0]
    for f in factors[1:]:
        text = E.combine(text, "*", f)
    return text


def _sum_text(terms):
    text = _product_text(terms[0])
    for t in terms[1:]:
        text = E.combine(text, "+", _product_text(t))
    return text


def _candidate(seq, pos):
    """``(common factors, inner sum's text)`` of the adjoint accumulation at
    ``seq[pos]`` whose value is a sum of two or more products with a common factor."""
    x = seq[pos]
    if not (isinstance(x, A.Accumulate) and x.how == "plain" and x.op in ("=", "+=")
            and isinstance(x.target, (A.AdjVar, A.AdjElem)) and isinstance(x.value, str)):
        return None
    terms = sum_of_products(x.value)
    if terms is None or len(terms) < 2:
        return None
    expanded = []
    for t in terms:
        out = []
        for f in t:
            out.extend(_expand(seq, pos, f, _DEPTH))
        expanded.append(out)
    got = _common(expanded)
    if got is None:
        return None
    common, rest = got
    inner = _sum_text(rest)
    if inner is None or _target_name(x.target) in names(inner) + tuple(common):
        return None
    return common, inner


def _target_text(t):
    return t.name if isinstance(t, A.AdjVar) else f"{t.base}[{', '.join(t.index_texts)}]"


def _target_name(t):
    return t.name if isinstance(t, A.AdjVar) else t.base


def _factor_list(seq, used):
    """Compute each sum that two or more accumulations of ``seq`` share once, before
    the first of them; True when something changed."""
    changed = False
    while _factor_one(seq, used):
        changed = True
    return changed


def _factor_one(seq, used):
    found = {}
    for pos in range(len(seq)):
        got = _candidate(seq, pos)
        if got is not None:
            found.setdefault(got[1], []).append((pos, got[0]))
    for inner, members in found.items():
        first = members[0][0]
        members = [(p, c) for p, c in members if _stable(seq, first, p, inner)]
        if len(members) < 2:
            continue
        values = [E.combine(_product_text([_spell(seq, p, f) for f in common]), "*",
                            "_shared")
                  for p, common in members]
        if any(v is None for v in values):
            continue
        tmp = _fresh("_shared", used)
        for (p, _common), v in zip(members, values):
            seq[p].value = E.substitute(v, "_shared", tmp)
        shared = " and ".join(_target_text(seq[p].target) for p, _c in members)
        seq[first:first] = [A.Comment(f"# the sum {shared} share", of_next=True),
                            A.Assign(tmp, inner)]
        return True
    return False


def _spell(seq, pos, factor):
    """``factor`` (an array element) as the name the list loaded it into before
    ``seq[pos]``, when that name still holds it there; else as it is."""
    if IDENT.match(factor):
        return factor
    for q in range(pos - 1, -1, -1):
        got = defining(seq[q])
        if got is not None and got[1] == factor and \
                _stable(seq, q + 1, pos, got[0]) and _stable(seq, q + 1, pos, factor):
            return got[0]
    return factor


def _fresh(base, used):
    k = 1
    while f"{base}{k}" in used:
        k += 1
    name = f"{base}{k}"
    used.add(name)
    return name


def _all_names(fn):
    """Every name ``fn`` mentions (each statement looked at once)."""
    out = set(fn.params)
    for y in A.walk(fn.prologue + fn.body):
        out |= _writes(y)
        out |= node_names(y)
    return out
