"""Readability passes over the adjoint IR, run between building it and printing it.

Each pass keeps the adjoint's meaning exactly; where it cannot be sure, it leaves the
code as built.  Every identifier of the generated code comes from one registry
(:class:`kadj.adj_naming.Naming`), so a name found in an expression's text (not after a
dot) is that variable.

* :func:`propagate_copies`: ``adj_a = adj_b`` (the adjoint of a single-use variable) is
  dropped and later reads of ``adj_a`` read ``adj_b``, when ``adj_a`` is assigned only
  there, every read of it follows the copy in the same statement list, and nothing
  assigns ``adj_b`` in between.
* :func:`remove_dead`: assignments to an adjoint variable that nothing ever reads.
* :func:`source_loop_headers`: ``# reversed: for i in range(1, t3, 1)`` spelled as the
  kernel's own loop header, when the header's source line is at hand.
"""
from __future__ import annotations

import dataclasses
import re

from . import adj_ir as A

_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_CALL = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)\s*\(")
_PURE_CALLS = {"abs", "min", "max", "float", "int", "bool", "_sign"}
_PURE_PREFIXES = ("math.", "np.")
_IDENT = re.compile(r"[A-Za-z_]\w*\Z")

# roles of a name's occurrence: "use" (an expression this pass can rewrite), "def"
# (assigned: an adjoint variable or local sum), "fixed" (read or written in text this
# pass does not rewrite: a plain target's text, a tape amount)
USE, DEF, FIXED = "use", "def", "fixed"


def simplify(fn):
    """``fn`` (an :class:`adj_ir.Function`) made easier to read; returns it."""
    propagate_copies(fn)
    remove_dead(fn)
    source_loop_headers(fn)
    _fill_empty_bodies([fn])
    return fn


# ---- occurrences --------------------------------------------------------------------------
def _names(text):
    return _NAME.findall(text) if isinstance(text, str) else ()


def _target_refs(t, op, stmt):
    if isinstance(t, (A.AdjVar, A.Local)):
        yield t.name, DEF, stmt
        if op not in ("=", "= -"):
            yield t.name, FIXED, stmt
    elif isinstance(t, A.AdjElem):
        yield t.base, USE, stmt
        for text in t.index_texts:
            for n in _names(text):
                yield n, USE, stmt
    else:  # a plain target's text: assigned and read, not rewritten
        for n in _names(t):
            yield n, FIXED, stmt


def _refs(x):
    """(name, role, node) of every name ``x`` itself (not its children) mentions."""
    def uses(*texts):
        for text in texts:
            for n in _names(text):
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
        for n in _names(x.var) + _names(x.elem):
            yield n, FIXED, x
    elif isinstance(x, A.Reserve):
        texts = list((x.amounts or {}).values())
        texts += list(((x.hoist or {}).get("amounts") or {}).values())
        for n in _names(" ".join(str(t) for t in texts)):
            yield n, FIXED, x
    elif isinstance(x, (A.Comment, A.Barrier, A.Break, A.Continue, A.Pass,
                        A.CapacityCheck, A.ReverseLoop, A.Block, A.Function)):
        return
    else:  # a node this module does not know: every name in it is left alone
        for f in dataclasses.fields(x):
            v = getattr(x, f.name)
            if isinstance(v, str):
                for n in _names(v):
                    yield n, FIXED, x


def _index(fn):
    """name -> [(role, node)], and node -> its path [(id(list), position), ...]."""
    occ, path = {}, {}

    def visit(seq, prefix):
        for pos, x in enumerate(seq):
            here = prefix + [(id(seq), pos)]
            path[id(x)] = here
            for name, role, node in _refs(x):
                occ.setdefault(name, []).append((role, node))
            for child in x.children():
                visit(child, here)
    visit(fn.prologue, [])
    visit(fn.body, [])
    return occ, path


def _lists(fn):
    """Every statement list of ``fn``."""
    out = [fn.prologue, fn.body]
    for x in A.walk(fn.prologue + fn.body):
        out.extend(x.children())
    return out


# ---- copy propagation ---------------------------------------------------------------------
def _is_copy(x):
    return (isinstance(x, A.Accumulate) and x.op == "=" and isinstance(x.target, A.AdjVar)
            and isinstance(x.value, str) and _IDENT.match(x.value) is not None
            and x.value != x.target.name)


def _rename(text, old, new):
    return re.sub(rf"(?<![\w.]){re.escape(old)}(?!\w)", new, text)


def _rewrite(x, old, new):
    """Replace reads of ``old`` by ``new`` in ``x``'s own expressions (not children)."""
    def r(text):
        return _rename(text, old, new) if isinstance(text, str) else text
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


def propagate_copies(fn):
    params = set(fn.params)
    while True:
        # copies dropped in one round are removed after it (positions stay valid); a
        # copy naming a name an earlier one of the round changed waits for the next
        occ, path = _index(fn)
        touched, dropped = set(), set()
        for seq in _lists(fn):
            for pos, x in enumerate(seq):
                if (_is_copy(x) and x.target.name not in touched and x.value not in touched
                        and _propagate(seq, pos, x, occ, path, params)):
                    touched.update((x.target.name, x.value))
                    dropped.add(id(x))
        if not dropped:
            return
        for seq in _lists(fn):
            seq[:] = [x for x in seq if id(x) not in dropped]


def _propagate(seq, pos, copy, occ, path, params):
    a, b = copy.target.name, copy.value
    if a in params:
        return False
    key = id(seq)
    uses, last = [], None
    for role, node in occ.get(a, ()):
        if node is copy:
            continue
        if role != USE:
            return False
        at = [p for lst, p in path[id(node)] if lst == key]
        if not at or at[0] <= pos:
            return False    # read outside the statements after the copy
        uses.append(node)
        last = at[0] if last is None else max(last, at[0])
    if last is None:
        return False        # never read: left to dead-code removal
    # ``b`` keeps its value from the copy to the last read: nothing between assigns it
    # (the statement of the last read may assign it after reading, if it is simple)
    for role, node in occ.get(b, ()):
        if role == USE:
            continue
        at = [p for lst, p in path[id(node)] if lst == key]
        if at and pos < at[0] < last:
            return False
        if at and at[0] == last and (seq[last] is not node or seq[last].children()):
            return False
    for node in uses:
        _rewrite(node, a, b)
    return True


# ---- dead code ----------------------------------------------------------------------------
def _pure(text):
    return all(c in _PURE_CALLS or c.startswith(_PURE_PREFIXES) for c in _CALL.findall(text))


def remove_dead(fn):
    params = set(fn.params)
    while True:
        occ, _ = _index(fn)
        dead = set()
        for name, rows in occ.items():
            if name in params:
                continue
            defs = [node for role, node in rows if role == DEF]
            if not defs or any(role == USE for role, _ in rows):
                continue
            # read nowhere: only ``name += ...`` into itself reads it
            if all(isinstance(n, (A.Assign, A.Accumulate)) and
                   isinstance(n.target, (A.AdjVar, A.Local)) and
                   n.target.name == name and getattr(n, "how", None) != "atomic"
                   and _pure(n.value) and name not in _names(n.value)
                   for n in defs):
                fixed = [node for role, node in rows if role == FIXED]
                if all(node in defs for node in fixed):
                    dead.update(id(n) for n in defs)
        if not dead:
            return
        for seq in _lists(fn):
            seq[:] = [x for x in seq if id(x) not in dead]


def _fill_empty_bodies(nodes):
    """A compound statement whose body lost every statement gets ``pass``."""
    def prints_code(seq):
        return any(prints_code(x.body) if isinstance(x, (A.ReverseLoop, A.Block))
                   else not isinstance(x, A.Comment) for x in seq)
    for x in A.walk(nodes):
        if isinstance(x, A.If):
            if not prints_code(x.then):
                x.then.append(A.Pass())
            if x.orelse and not prints_code(x.orelse):
                x.orelse.append(A.Pass())
        elif isinstance(x, (A.For, A.While)) and not prints_code(x.body):
            x.body.append(A.Pass())


# ---- loop headers from the source -------------------------------------------------------
_REVERSED = re.compile(r"# reversed: for (\w+) in range\(.*\)\Z")
_SOURCE_FOR = re.compile(r"# [^\s:]+:\d+: for (\w+) in (range\(.*\)):\Z")


def source_loop_headers(fn):
    for x in A.walk(fn.prologue + fn.body):
        if not isinstance(x, A.ReverseLoop):
            continue
        body = x.body
        for pos in range(1, len(body)):
            c, prev = body[pos], body[pos - 1]
            if not (isinstance(c, A.Comment) and isinstance(prev, A.Comment)):
                continue
            m, src = _REVERSED.match(c.text), _SOURCE_FOR.match(prev.text)
            if m and src and m.group(1) == src.group(1) and _balanced(src.group(2)):
                c.text = f"# reversed: for {m.group(1)} in {src.group(2)}"
            break


def _balanced(text):
    depth = 0
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if depth < 0:
            return False
    return depth == 0 and text.endswith(")")
