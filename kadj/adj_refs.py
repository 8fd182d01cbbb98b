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
import re

from . import adj_ir as A

_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_CALL = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\s*\(")
_PURE_CALLS = {"abs", "min", "max", "float", "int", "bool", "_sign"}
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


def _roles_of(x):
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


def refs(x):
    """(name, role, node) of every name ``x`` itself (not its children) mentions."""
    return [(name, role, x) for name, role in _roles_of(x)]


def index(fn, memo=None):
    """name -> [(role, node)], and node -> its path ((id(list), position), ...).

    ``memo`` (a dict kept by the caller between calls on one function): the names of
    each assignment and accumulation, used again while its target, operator and value
    are the same objects (the passes replace a target or a text, never change one)."""
    occ, path = {}, {}
    memo = {} if memo is None else memo
    simple = (A.Assign, A.Accumulate)

    def visit(seq, prefix):
        key = id(seq)
        for pos, x in enumerate(seq):
            here = prefix + ((key, pos),)
            path[id(x)] = here
            if type(x) in simple:
                seen = memo.get(id(x))
                if seen is not None and seen[0] is x and seen[1] is x.target and \
                        seen[2] is x.value and seen[3] == x.op:
                    roles = seen[4]
                else:
                    roles = _roles_of(x)
                    memo[id(x)] = (x, x.target, x.value, x.op, roles)
            else:
                roles = _roles_of(x)
            for name, role in roles:
                rows = occ.get(name)
                if rows is None:
                    occ[name] = [(role, x)]
                else:
                    rows.append((role, x))
            for child in x.children():
                visit(child, here)
    visit(fn.prologue, ())
    visit(fn.body, ())
    return occ, path


class Index:
    """:func:`index` of one function, kept between passes: computed when first asked
    for, and again only after a pass said it changed the function (:meth:`changed`).
    A pass that made no change leaves the next one its index."""

    def __init__(self, fn):
        self.fn = fn
        self._now = None
        self._memo = {}

    def get(self):
        """(occurrences, paths) of the function as it is now."""
        if self._now is None:
            self._now = index(self.fn, self._memo)
        return self._now

    def changed(self):
        self._now = None


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
    return all(c in _PURE_CALLS or c.startswith(_PURE_PREFIXES) for c in _CALL.findall(text))
