"""One reservation for several straight-line loops of a growable (host) tape.

The planning pass (:mod:`kadj.tape_plan`) absorbs a nested loop's reservation into
the enclosing frame's when its trip count is known where that frame reserves; loops
that follow one another at the top level of the function each reserve for
themselves (softmax: three loops, three reservations, and a tape grown by
``_reserve`` at the later ones).  :func:`merge_later_reserves` joins a later
unconditional reservation of a kind to an earlier one of that kind when nothing
between them reserves or checks that kind and its amount has the same value at the
earlier one, so that :func:`kadj.tape_alloc.allocate_at_first_reserve` then
allocates the tape once, with room for all of them, and the adjoint does not name
``_reserve`` (which numba compiles into every adjoint that calls it).
"""
from __future__ import annotations

import dataclasses
import re

from . import adj_ir as A
from .adj_refs import names, roles_of
from .tape_alloc import straight_line

#: names a reservation's amount may call besides the adjoint's variables
_AMOUNT_GLOBALS = frozenset({"max", "min", "abs", "int", "_trips"})

#: statements that assign nothing themselves
_READ_ONLY = (A.Comment, A.Barrier, A.Break, A.Continue, A.Pass, A.CapacityCheck,
              A.ReverseLoop, A.Block, A.Function, A.If, A.While, A.Return, A.Push,
              A.Reserve)


def _target_names(t):
    if isinstance(t, (A.AdjVar, A.Local)):
        return {t.name}
    if isinstance(t, A.AdjElem):
        return {t.base}
    return set(names(t))   # a plain target: a name, or an element (its names, all)


def assigned_by(x):
    """The names node ``x`` itself (not its children) may assign or write elements of
    (conservative: every name in a node of another kind)."""
    if isinstance(x, _READ_ONLY):
        return set()
    if isinstance(x, (A.Assign, A.Accumulate, A.Consume, A.Pop)):
        return _target_names(x.target)
    if isinstance(x, A.For):
        return set(names(x.var))
    if isinstance(x, (A.PushArray, A.PopArray)):
        return set(names(x.var)) | (set(names(x.elem)) if isinstance(x, A.PopArray)
                                    else set())
    return {n for n, _ in roles_of(x)} | {
        n for f in dataclasses.fields(x) for v in [getattr(x, f.name)]
        if isinstance(v, str) for n in names(v)}


def _written(x):
    """The names a node and its children may assign (or write elements of)."""
    return set().union(*(assigned_by(y) for y in A.walk([x])))


def _defined(x):
    """The name a straight-line node surely defines (an ``=`` of a plain name)."""
    if isinstance(x, A.Assign) and isinstance(x.target, str) and x.op == "=" and \
            x.target.isidentifier():
        return x.target
    return None


def _blocks_kind(x, kind):
    """Does ``x`` (or a node in it) reserve or check room for ``kind``?"""
    for y in A.walk([x]):
        if isinstance(y, A.Reserve) and (kind in (y.amounts or {}) or
                                         y.hoist is not None):
            return True
        if isinstance(y, A.CapacityCheck) and y.kind == kind and y.needed:
            return True
    return False


#: a shape expression of parameters: ``x.shape[0]``, ``t.shape[1] - 2``, ...
_SHAPE_TEXT = re.compile(r"[\w\s.\[\]()+\-*,]*\Z")


def merge_later_reserves(fn):
    """Move each later reservation's amount of a kind into an earlier unconditional
    reservation of that kind, at the function's top level, when

    * the earlier one reserves that kind (so the pushes of the kind between the two
      are its frame's, which it counted: nothing between reserves or checks the kind);
    * the later amount has the same value at the earlier one: each of its names is a
      parameter or is surely defined before the earlier one, and nothing between the
      two assigns it; or it is a variable assigned once in the function, in between,
      to a shape of parameters the function never assigns (``n = x.shape[0]``), which
      the amount then reads in its place.

    The earlier reservation then asks for both amounts at once: the tape holds, at the
    later point, at least what the later reservation would have made it hold."""
    order = list(straight_line(fn.body))
    writes = {}
    for x in A.walk(fn.prologue + fn.body):
        for n in assigned_by(x):
            writes[n] = writes.get(n, 0) + 1
    defined = set(fn.params) | {d for x in fn.prologue for d in [_defined(x)] if d}
    open_ = {}      # kind -> (index in order, reservation, names defined there)
    for i, (x, _) in enumerate(order):
        if isinstance(x, A.Reserve) and x.hoist is None and x.amounts:
            for kind in sorted(x.amounts):
                at = open_.get(kind)
                amount = None if at is None else _joined_amount(
                    fn, order, writes, at[0], i, kind, x.amounts[kind], at[2])
                if amount is not None:
                    first = at[1]
                    first.amounts = dict(first.amounts)
                    first.amounts[kind] = f"{first.amounts[kind]} + {amount}"
                    x.amounts = {k: v for k, v in x.amounts.items() if k != kind}
                else:
                    open_[kind] = (i, x, frozenset(defined))
        d = _defined(x)
        if d:
            defined.add(d)


def _joined_amount(fn, order, writes, lo, hi, kind, amount, defined_at):
    """The text of reservation ``order[hi]``'s ``amount`` of ``kind`` computed at
    ``order[lo]``, or None when it cannot join that reservation."""
    used = set(names(amount)) - _AMOUNT_GLOBALS
    between = [x for x, _ in order[lo + 1:hi]
               # a container's statements come next in ``order``, each on its own
               if not isinstance(x, (A.Block, A.ReverseLoop))]
    if any(_blocks_kind(x, kind) for x in between):
        return None
    subst = {}
    for name in sorted(used - defined_at):
        text = _shape_of_params(fn, between, writes, name, defined_at)
        if text is None:
            return None
        subst[name] = text
    written = set().union(*(_written(x) for x in between)) if between else set()
    if (used - set(subst)) & written:
        return None
    if not subst:
        return amount
    return _substitute(amount, subst)


def _shape_of_params(fn, between, writes, name, defined_at, depth=0):
    """The text ``name`` is assigned, when its one assignment in the function is one of
    the straight-line statements ``between`` and is a shape expression of parameters
    the function never assigns (or of such variables: ``t1 = x.shape; n = t1[0]``; or
    of variables assigned once, before the earlier reservation: ``defined_at``, kept
    as they are: ``t16 = n - 2``); else None."""
    if writes.get(name) != 1 or depth > 4:
        return None
    found = [x for x in between if _defined(x) == name]
    if len(found) != 1:
        return None
    text = found[0].value
    if not isinstance(text, str) or not _SHAPE_TEXT.match(text) or "(" in text or \
            re.search(r"\.(?!shape\b)", text):   # ``.shape`` is the only attribute
        return None
    subst = {}
    for m in re.finditer(r"(?<![\w.])[A-Za-z_]\w*", text):
        n = m.group(0)
        if n in defined_at and n not in fn.params and writes.get(n) == 1:
            continue        # its one assignment precedes the earlier reservation
        if n in fn.params:
            # a parameter's shape only (its elements may change), of one never assigned
            if writes.get(n) or not text.startswith(".shape", m.end()):
                return None
            continue
        sub = _shape_of_params(fn, between, writes, n, defined_at, depth + 1)
        if sub is None:
            return None
        subst[n] = sub
    return _substitute(text, subst)


def _substitute(text, subst):
    """``text`` with each name of ``subst`` replaced by its text (grouped unless it is
    an item or attribute chain)."""
    def one(m):
        t = subst.get(m.group(0))
        if t is None:
            return m.group(0)
        return t if re.fullmatch(r"[\w.\[\]]+", t) else f"({t})"
    return re.sub(r"(?<![\w.])[A-Za-z_]\w*", one, text)
