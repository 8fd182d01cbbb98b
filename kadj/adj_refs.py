"""Where the names of an adjoint IR occur: each statement's reads and definitions, the
statement lists of a function, and the rewriting of reads (for the readability passes
of :mod:`kadj.simplify` and :mod:`kadj.simplify_expr`).

Every identifier of the generated code comes from one registry
(:class:`kadj.adj_naming.Naming`), so a name found in an expression's text (not after a
dot) is that variable.
"""
from __future__ import annotations

import dataclasses
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
    return _NAME.findall(text) if isinstance(text, str) else ()


def _target_refs(t, op, stmt):
    if isinstance(t, (A.AdjVar, A.Local)):
        yield t.name, DEF, stmt
        if op not in ("=", "= -"):
            yield t.name, FIXED, stmt
    elif isinstance(t, A.AdjElem):
        yield t.base, USE, stmt
        for text in t.index_texts:
            for n in names(text):
                yield n, USE, stmt
    else:  # a plain target's text: assigned and read, not rewritten
        for n in names(t):
            yield n, FIXED, stmt


def refs(x):
    """(name, role, node) of every name ``x`` itself (not its children) mentions."""
    def uses(*texts):
        for text in texts:
            for n in names(text):
                yield n, USE, x
    if isinstance(x, (A.Assign, A.Accumulate)):
        yield from _target_refs(x.target, x.op, x)
        yield from uses(x.value)
    elif isinstance(x, (A.If, A.While)):
        yield from uses(x.cond)
    elif isinstance(x, A.For):
        yield from _target_refs(x.var, "=", x)
        yield from uses(x.iter)
    elif isinstance(x, A.Return):
        yield from uses(x.value)
    elif isinstance(x, A.Consume):
        yield from _target_refs(x.target, "=", x)
        yield from uses(x.zero)
    elif isinstance(x, A.Push):
        yield from uses(x.value)
    elif isinstance(x, A.Pop):
        yield from _target_refs(x.target, "=", x)
        yield from uses(x.cond)
    elif isinstance(x, (A.PushArray, A.PopArray)):
        for n in names(x.var) + names(x.elem):
            yield n, FIXED, x
    elif isinstance(x, A.Reserve):
        texts = list((x.amounts or {}).values())
        texts += list(((x.hoist or {}).get("amounts") or {}).values())
        for n in names(" ".join(str(t) for t in texts)):
            yield n, FIXED, x
    elif isinstance(x, (A.Comment, A.Barrier, A.Break, A.Continue, A.Pass,
                        A.CapacityCheck, A.ReverseLoop, A.Block, A.Function)):
        return
    else:  # a node this module does not know: every name in it is left alone
        for f in dataclasses.fields(x):
            v = getattr(x, f.name)
            if isinstance(v, str):
                for n in names(v):
                    yield n, FIXED, x


def index(fn):
    """name -> [(role, node)], and node -> its path [(id(list), position), ...]."""
    occ, path = {}, {}

    def visit(seq, prefix):
        for pos, x in enumerate(seq):
            here = prefix + [(id(seq), pos)]
            path[id(x)] = here
            for name, role, node in refs(x):
                occ.setdefault(name, []).append((role, node))
            for child in x.children():
                visit(child, here)
    visit(fn.prologue, [])
    visit(fn.body, [])
    return occ, path


def lists(fn):
    """Every statement list of ``fn``."""
    out = [fn.prologue, fn.body]
    for x in A.walk(fn.prologue + fn.body):
        out.extend(x.children())
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


def pure(text):
    return all(c in _PURE_CALLS or c.startswith(_PURE_PREFIXES) for c in _CALL.findall(text))
