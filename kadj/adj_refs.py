"""Where the names of an adjoint IR occur: each statement's reads and definitions, the
statement lists of a function, and the rewriting of reads (for the readability passes
of :mod:`kadj.simplify` and :mod:`kadj.simplify_expr`).

Every identifier of the generated code comes from one registry
(:class:`kadj.adj_naming.Naming`), so a name found in an expression's text (not after a
dot) is that variable.
"""
from __future__ import annotations

import dataclasses
import functools
import keyword
import re

from . import adj_ir as A

_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_CALL = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\s*\(")
_PURE_CALLS = {"abs", "min", "max", "float", "int", "bool", "_sign", "_x_sqrt_x", "_select"}
_PURE_PREFIXES = ("math.", "np.")
IDENT = re.compile(r"[A-Za-z_]\w*\Z")

# roles of a name's occurrence: "use" (an expression this pass can rewrite), "def"
# (assigned: an adjoint variable or local sum), "fixed" (read or written in text this
# pass does not rewrite: a plain target's text, a tape amount)
USE, DEF, FIXED = "use", "def", "fixed"


# ---- occurrences --------------------------------------------------------------------------
def names(text):
    """The names ``text`` mentions, in order (a tuple; () for a non-text)."""
    return _names(text) if isinstance(text, str) else ()


@functools.lru_cache(maxsize=1 << 14)
def _names(text):
    # the passes ask for the names of the same texts again and again (every round
    # re-indexes the function): one regular-expression scan per distinct text
    return tuple(_NAME.findall(text))


def _target_roles(t, op, out):
    if isinstance(t, (A.AdjVar, A.Local)):
        out.append((t.name, DEF))
        if op not in ("=", "= -"):
            out.append((t.name, FIXED))
    elif isinstance(t, A.AdjElem):
        out.append((t.base, USE))
        for text in t.index_texts:
            if isinstance(text, str):
                out.extend(_roles(text, USE))
    elif isinstance(t, str):  # a plain target's text: assigned and read, not rewritten
        out.extend(_roles(t, FIXED))


@functools.lru_cache(maxsize=1 << 14)
def _roles(text, role):
    return tuple((n, role) for n in _names(text))


def _uses(text, out):
    if isinstance(text, str):
        out.extend(_roles(text, USE))


def roles_of(x):
    """[(name, role)] of every name ``x`` itself (not its children) mentions, in order."""
    out = []
    if isinstance(x, (A.Assign, A.Accumulate)):
        _target_roles(x.target, x.op, out)
        _uses(x.value, out)
    elif isinstance(x, (A.Comment, A.Barrier, A.Break, A.Continue, A.Pass,
                        A.CapacityCheck, A.ReverseLoop, A.Block, A.Function)):
        pass
    elif isinstance(x, (A.If, A.While)):
        _uses(x.cond, out)
    elif isinstance(x, A.For):
        _target_roles(x.var, "=", out)
        _uses(x.iter, out)
    elif isinstance(x, A.Return):
        _uses(x.value, out)
    elif isinstance(x, A.Consume):
        _target_roles(x.target, "=", out)
        _uses(x.zero, out)
    elif isinstance(x, A.Push):
        _uses(x.value, out)
    elif isinstance(x, A.Pop):
        _target_roles(x.target, "=", out)
        _uses(x.cond, out)
    elif isinstance(x, (A.PushArray, A.PopArray)):
        out.extend((n, FIXED) for n in names(x.var) + names(x.elem))
    elif isinstance(x, A.Reserve):
        texts = list((x.amounts or {}).values())
        texts += list(((x.hoist or {}).get("amounts") or {}).values())
        out.extend((n, FIXED) for n in names(" ".join(str(t) for t in texts)))
    else:  # a node this module does not know: every name in it is left alone
        for f in dataclasses.fields(x):
            v = getattr(x, f.name)
            if isinstance(v, str):
                out.extend((n, FIXED) for n in names(v))
    return out


def mentioned(x):
    """Every name ``x`` and the statements nested in it mention."""
    return {n for y in A.walk([x]) for n, _role in roles_of(y)}


def refs(x):
    """(name, role, node) of every name ``x`` itself (not its children) mentions."""
    return [(name, role, x) for name, role in roles_of(x)]


def _occurrences(fn, memo):
    """(name -> [(role, node)], id(node) -> (node, its roles), id(node) -> (its
    statement list, the list's owner)) of every statement of ``fn``."""
    occ, own, parent = {}, {}, {}

    def visit(seq, owner):
        for x in seq:
            parent[id(x)] = (seq, owner)
            roles = _memo_roles(x, memo)
            own[id(x)] = (x, roles)
            for name, role in roles:
                rows = occ.get(name)
                if rows is None:
                    occ[name] = [(role, x)]
                else:
                    rows.append((role, x))
            for child in x.children():
                visit(child, x)
    visit(fn.prologue, None)
    visit(fn.body, None)
    return occ, own, parent


def _paths(fn):
    """node -> its path ((id(list), position), ...) from the function's top."""
    path = {}

    def visit(seq, prefix):
        key = id(seq)
        for pos, x in enumerate(seq):
            here = prefix + ((key, pos),)
            path[id(x)] = here
            for child in x.children():
                visit(child, here)
    visit(fn.prologue, ())
    visit(fn.body, ())
    return path


def index(fn, memo=None):
    """name -> [(role, node)], and node -> its path ((id(list), position), ...).

    ``memo`` (a dict kept by the caller between calls on one function): the names of
    each assignment and accumulation, used again while its target, operator and value
    are the same objects (the passes replace a target or a text, never change one)."""
    return _occurrences(fn, {} if memo is None else memo)[0], _paths(fn)


_SIMPLE = (A.Assign, A.Accumulate)


def _memo_roles(x, memo):
    if type(x) in _SIMPLE:
        seen = memo.get(id(x))
        if seen is not None and seen[0] is x and seen[1] is x.target and \
                seen[2] is x.value and seen[3] == x.op:
            return seen[4]
        roles = roles_of(x)
        memo[id(x)] = (x, x.target, x.value, x.op, roles)
        return roles
    return roles_of(x)


class Index:
    """The occurrences of one function's names (:func:`index`), kept between passes and
    updated in place: a pass tells the index what it changed (:meth:`touch` for a
    statement whose own texts or target it replaced, :meth:`drop` and :meth:`delete`
    for statements it removed), and the index stays equal to one computed afresh
    (up to the order of each name's rows).  :meth:`changed` says the function changed
    in a way the index was not told of: it is computed again when next asked for.

    Positions: :meth:`at` and :meth:`where` (a statement's place in a statement list),
    from each statement's parent list and owner, which removals leave valid."""

    def __init__(self, fn):
        self.fn = fn
        self._memo = {}
        self.changed()

    def changed(self):
        self._occ = None        # name -> [(role, node)]
        self._own = {}          # id(node) -> (node, its roles)
        self._parent = {}       # id(node) -> (its statement list, the list's owner)
        self._pos = {}          # id(list) -> (the list, {id(node): position})
        self._lists = None
        self._now = None

    # ---- asking ---------------------------------------------------------------------
    def occ(self):
        """name -> [(role, node)] of the function as it is now."""
        if self._occ is None:
            self._build()
        return self._occ

    def nodes(self):
        """Every statement of the function as it is now (in no particular order)."""
        self.occ()
        return [x for x, _ in self._own.values()]

    def get(self):
        """(occurrences, paths) of the function as it is now (:func:`index`)."""
        if self._now is None or self._occ is None:
            self._now = (self.occ(), _paths(self.fn))
        return self._now

    def lists(self):
        """:func:`lists` of the function (kept until a removal takes lists away)."""
        if self._lists is None:
            self._lists = lists(self.fn)
        return self._lists

    def at(self, node, seq):
        """The position in ``seq`` of ``node`` or of the statement of ``seq`` that holds
        it; None where ``seq`` holds neither."""
        self.occ()
        parent = self._parent
        while True:
            lst, owner = parent[id(node)]
            if lst is seq:
                return self._positions(seq)[id(node)]
            if owner is None:
                return None
            node = owner

    def where(self, node, seq):
        """``node``'s position in ``seq`` when it is a statement of ``seq`` itself."""
        self.occ()
        return self._positions(seq)[id(node)] if self._parent[id(node)][0] is seq \
            else None

    def _positions(self, seq):
        got = self._pos.get(id(seq))
        if got is None or got[0] is not seq:
            got = self._pos[id(seq)] = (seq, {id(x): k for k, x in enumerate(seq)})
        return got[1]

    def _build(self):
        occ, own, parent = _occurrences(self.fn, self._memo)
        self._occ, self._own, self._parent, self._pos = occ, own, parent, {}
        self._now = None

    # ---- telling --------------------------------------------------------------------
    def touch(self, nodes):
        """The statements ``nodes`` had their own expressions or targets replaced."""
        if self._occ is None:
            return
        self._now = None
        for x in nodes:
            if id(x) not in self._own:
                continue
            self._unindex(x)
            roles = _memo_roles(x, self._memo)
            self._own[id(x)] = (x, roles)
            occ = self._occ
            for name, role in roles:
                rows = occ.get(name)
                if rows is None:
                    occ[name] = [(role, x)]
                else:
                    rows.append((role, x))

    def drop(self, ids):
        """Remove the statements whose ``id`` is in ``ids`` from every list of the
        function; the lists that lost one, {id(list): list}."""
        out = {}
        for seq in self.lists():
            if any(id(x) in ids for x in seq):
                self.drop_from(seq, ids)
                out[id(seq)] = seq
        return out

    def drop_from(self, seq, ids):
        """Remove the statements whose ``id`` is in ``ids`` from ``seq``."""
        kept = []
        for x in seq:
            if id(x) in ids:
                self._forget(x)
            else:
                kept.append(x)
        seq[:] = kept
        self._pos.pop(id(seq), None)

    def delete(self, seq, pos):
        """``del seq[pos]``."""
        self._forget(seq.pop(pos))
        self._pos.pop(id(seq), None)

    def shortened(self, seq):
        """Statements without names (comments) were removed from ``seq``."""
        self._pos.pop(id(seq), None)
        self._now = None

    def relisted(self):
        """A statement's lists were replaced (an ``if`` whose branches swapped)."""
        self._lists = None
        self._now = None

    def _forget(self, x):
        self._now = None
        for y in A.walk([x]):
            if y.children():
                self._lists = None
            if self._occ is not None:
                self._unindex(y)

    def _unindex(self, x):
        got = self._own.pop(id(x), None)
        if got is None:
            return
        occ = self._occ
        for name in {n for n, _ in got[1]}:
            rows = [r for r in occ[name] if r[1] is not x]
            if rows:
                occ[name] = rows
            else:
                del occ[name]


def drop(fn, ids):
    """Remove the statements whose ``id`` is in ``ids`` from every list of ``fn``."""
    for seq in lists(fn):
        seq[:] = [x for x in seq if id(x) not in ids]


def lists(fn):
    """Every statement list of ``fn``: the prologue, the body, then the lists of each
    statement in the order of a walk of the tree."""
    out = [fn.prologue, fn.body]

    def visit(seq):
        for x in seq:
            children = x.children()
            if children:
                out.extend(children)
                for child in children:
                    visit(child)
    visit(fn.prologue)
    visit(fn.body)
    return out


def free_name(fn, base, taken=()):
    """``base``, or ``base_2``, ``base_3``, ...: the first name that neither ``fn`` (its
    parameters and statements) nor ``taken`` uses."""
    used = set(index(fn)[0]) | {p.split("=")[0].strip() for p in fn.params} | set(taken)
    name, k = base, 1
    while name in used:
        k += 1
        name = f"{base}_{k}"
    return name


def rename(text, old, new):
    return re.sub(rf"(?<![\w.]){re.escape(old)}(?!\w)", new, text)


def rewrite(x, old, new):
    """Replace reads of ``old`` by ``new`` in ``x``'s own expressions (not children)."""
    def r(text):
        return rename(text, old, new) if isinstance(text, str) else text
    t = getattr(x, "target", None)
    if isinstance(t, A.AdjElem):   # targets may be shared: a new one, not mutated
        x.target = dataclasses.replace(t, base=r(t.base),
                                       index_texts=tuple(r(s) for s in t.index_texts))
    if isinstance(x, (A.Assign, A.Accumulate, A.Return)):
        x.value = r(x.value)
    elif isinstance(x, (A.If, A.While)):
        x.cond = r(x.cond)
    elif isinstance(x, A.For):
        x.iter = r(x.iter)
    elif isinstance(x, A.Consume):
        x.zero = r(x.zero)
    elif isinstance(x, A.Push):
        x.value = r(x.value)
    elif isinstance(x, A.Pop):
        x.cond = r(x.cond)


@functools.lru_cache(maxsize=1 << 14)
def pure(text):
    return all(c in _PURE_CALLS or c.startswith(_PURE_PREFIXES) or keyword.iskeyword(c)
               for c in _CALL.findall(text))
