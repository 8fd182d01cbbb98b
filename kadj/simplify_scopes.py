"""Names reused by independent top-level blocks, told apart while the readability passes
run (:func:`kadj.simplify.simplify`).

The gather form of a CUDA adjoint repeats the kernel's forward and reverse code once
per neighbouring thread, each copy in its own ``if`` at the top of the function,
reusing the same names; and the reverse of a loop recomputes the values its forward
sweep computed, under the same names (a helper's branches returning a value: ``t9 =
t8`` in the forward loop and again in the reversed one).  A name that such a block (a
top-level ``if`` or loop) defines before any read of it, and that nothing after the
block reads before defining it again, is the block's own variable (in a loop: defined
before any read in each iteration, so that no value passes from one iteration to the
next): :func:`split_scopes` renames it there, so that the passes (which treat a
name defined in several places as one variable) simplify each block as they simplify
a single one; :func:`join_scopes` gives the names back afterwards, where the block
still holds only its own copy (else it keeps a ``_2``-style name).
"""
from __future__ import annotations

import dataclasses
import re

from . import adj_ir as A
from .adj_refs import IDENT, USE, mentioned, names, refs

_HANDLED = (A.Assign, A.Accumulate, A.If, A.For, A.While, A.Return, A.Consume,
            A.Push, A.Pop, A.Comment, A.Break, A.Continue, A.Pass, A.Barrier,
            A.Block, A.ReverseLoop)


# ---- which names a block reads before defining them ------------------------------------
def _target_defs(t):
    if isinstance(t, (A.AdjVar, A.Local)):
        return {t.name}, set()
    if isinstance(t, A.AdjElem):
        reads = {t.base}
        for s in t.index_texts:
            reads |= set(names(s))
        return set(), reads
    if isinstance(t, str) and IDENT.match(t):
        return {t}, set()
    return set(), set(names(t))


def exposed(seq, defined=frozenset(), held=None, correlate=True, in_loop=False,
            loops=False, _shared=False, _memo=None):
    """(names read before being defined, names defined on every path) of ``seq``.

    A condition that is one name (``if t5:``, ``if not t5:``) is remembered with what
    each of its branches defines, as long as nothing assigns that name: a later ``if``
    on the same condition takes that branch exactly when the earlier one did, so the
    names its branch defined are defined there (a reverse sweep's recomputation ``if
    t5: t7 = i - 1``, then its reverse ``if t5: adj_x[t7] += ...``).  ``held``: {(name,
    truth): names defined when the condition had that truth} from the enclosing code.
    ``correlate=False``: no condition is remembered (every ``if`` stands alone).

    ``loops=True`` also knows what only the running of loops shows: a ``while True:``
    loop defines what its body defines before anything in it may leave the iteration
    (its first iteration always runs that far), and inside a loop (``in_loop``) a
    branch that saves the previous iteration's values (``A.If.fresh``) reads only what
    that iteration assigned.  (Not for renaming: numba, which does not know this,
    needs such names declared before the loop.)"""
    out, defined = set(), set(defined)
    # (a block at the level of its surroundings shares their conditions: ``_shared``)
    held = held if _shared and held is not None else dict(held or {})
    memo = {} if _memo is None else _memo     # id(statement) -> what it may assign

    def read(ns):
        out.update(set(ns) - defined)

    for x in seq:
        if loops and in_loop and isinstance(x, A.If) and x.fresh:
            continue    # (reads what the loop's previous iteration assigned)
        changed = _assigned_in(x, memo) if correlate and isinstance(
            x, (A.If, A.For, A.While, A.Block, A.ReverseLoop)) else None
        if changed:     # (a loop's body may assign it before a later iteration's test)
            _forget(held, changed)
        if isinstance(x, (A.Assign, A.Accumulate)):
            d, r = _target_defs(x.target)
            read(names(x.value))
            read(r)
            if x.op not in ("=", "= -"):
                read(d)
            defined |= d
            _forget(held, d)
        elif isinstance(x, A.If):
            read(names(x.cond))
            test = _test(x.cond) if correlate else None
            known = (lambda truth: held.get((test[0], test[1] == truth), set())) \
                if test else (lambda truth: set())
            e1, d1 = exposed(x.then, defined | known(True), held, correlate, in_loop, loops,
                             _memo=memo)
            e2, d2 = exposed(x.orelse, defined | known(False), held, correlate, in_loop,
                             loops, _memo=memo)
            out |= e1 | e2
            defined |= d1 & d2
            if test and test[0] not in changed:
                held[(test[0], test[1])] = d1
                held[(test[0], not test[1])] = d2
        elif isinstance(x, A.For):
            read(names(x.iter))
            d, r = _target_defs(x.var)
            read(r)
            e, _ = exposed(x.body, defined | d, held, correlate, True, loops, _memo=memo)
            out |= e
        elif isinstance(x, A.While):
            read(names(x.cond))
            e, _ = exposed(x.body, defined, held, correlate, True, loops, _memo=memo)
            out |= e
            if loops and x.cond.strip() == "True":
                defined |= _first_run(x.body, defined, held, memo)
        elif isinstance(x, (A.Block, A.ReverseLoop)):
            e, defined = exposed(x.body, defined, held, correlate, in_loop, loops, True,
                                 memo)
            out |= e
        elif isinstance(x, A.Pop):
            read(names(x.cond))
            d, r = _target_defs(x.target)
            read(r)
            if x.cond is None:      # (a pop under a condition may leave it as it was)
                defined |= d
            _forget(held, d)
        else:  # any other node reads every name it mentions
            read(n for n, _, _ in refs(x))
            for child in x.children():
                out |= exposed(child, defined, None, correlate, in_loop, loops)[0]
            if held:
                _forget(held, _assigned_in(x, memo))
    return out, defined


def _first_run(body, defined, held, memo):
    """What a ``while True:`` body defines before its first statement that may leave the
    iteration (a ``break``, ``continue`` or ``return`` in it)."""
    prefix = []
    for x in body:
        if any(isinstance(y, (A.Break, A.Continue, A.Return)) for y in A.walk([x])):
            break
        prefix.append(x)
    return exposed(prefix, defined, held, True, True, True, _memo=memo)[1]


def _test(cond):
    """(name, truth) of a condition that is a name or ``not`` a name, else None."""
    if not isinstance(cond, str):
        return None
    text = cond.strip()
    truth = True
    while text.startswith("not ") or text.startswith("(") and text.endswith(")"):
        if text.startswith("not "):
            text, truth = text[4:].strip(), not truth
        else:
            text = text[1:-1].strip()
    return (text, truth) if IDENT.match(text) else None


def _assigned_in(x, memo):
    """Every name a statement of ``x`` (itself or nested) may assign: each name in a
    target, in a loop header's counter, or in a node this module does not know.
    ``memo``: id(statement) -> that set, filled here."""
    found = memo.get(id(x))
    if found is None:
        found = {n for n, role, _ in refs(x) if role != USE}
        for child in x.children():
            for y in child:
                found |= _assigned_in(y, memo)
        memo[id(x)] = found
    return found


def _forget(held, changed):
    for key in [k for k in held if k[0] in changed]:
        del held[key]


def _unhandled(x):
    return {n for y in A.walk([x]) if not isinstance(y, _HANDLED)
            for n, _, _ in refs(y)}


# ---- renaming inside one block -----------------------------------------------------------
def _renamer(mapping):
    """A function renaming every name of ``mapping`` (old -> new) in an expression text
    at once (the same matches as :func:`kadj.adj_refs.rename` of each pair)."""
    pattern = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, mapping)) + r")(?!\w)")
    old = frozenset(mapping)

    def r(text):
        # a text none of whose names is renamed is left as it is, unscanned (a match
        # of the pattern is one of the names :func:`names` finds)
        if old.isdisjoint(names(text)):
            return text
        return pattern.sub(lambda m: mapping[m.group(1)], text)
    return r


def _rename_target(t, r):
    if isinstance(t, (A.AdjVar, A.Local)):
        return dataclasses.replace(t, name=r(t.name))
    if isinstance(t, A.AdjElem):
        return dataclasses.replace(t, base=r(t.base), index_texts=tuple(
            r(s) for s in t.index_texts))
    return r(t) if isinstance(t, str) else t


def _rename(block, mapping):
    """Rename the names of ``mapping`` (old -> new, all at once) inside ``block``."""
    if not mapping:
        return
    r = _renamer(mapping)
    for x in A.walk([block]):
        if isinstance(x, (A.Assign, A.Accumulate)):
            x.target = _rename_target(x.target, r)
            x.value = r(x.value)
        elif isinstance(x, (A.If, A.While)):
            x.cond = r(x.cond)
        elif isinstance(x, A.For):
            x.var = r(x.var)
            x.iter = r(x.iter)
        elif isinstance(x, (A.Return, A.Push)):
            x.value = r(x.value)
        elif isinstance(x, A.Consume):
            x.target = _rename_target(x.target, r)
            x.zero = r(x.zero)
        elif isinstance(x, A.Pop):
            x.target = r(x.target)
            if isinstance(x.cond, str):
                x.cond = r(x.cond)


# ---- the passes --------------------------------------------------------------------------
_SCOPES = (A.If, A.For, A.While, A.ReverseLoop)
def split_scopes(fn, correlate=True):
    """Rename each top-level ``if`` block's or loop's own variables that other top-level
    statements reuse; returns what :func:`join_scopes` needs.  ``correlate``: see
    :func:`exposed`."""
    body = fn.body
    if not any(isinstance(x, _SCOPES) for x in body):
        return []       # (no block to rename in)
    params = set(fn.params)
    mentions = [mentioned(x) for x in body]
    count = {}
    for m in mentions:
        for n in m:
            count[n] = count.get(n, 0) + 1
    taken = {n for m in mentions for n in m} | {
        n for x in fn.prologue for n in mentioned(x)} | params
    renamed = []
    # the names each later statement reads before writing: asked for from blocks before
    # it only, so before that statement is renamed itself
    reads_first = {}
    for k, x in enumerate(body):
        if not isinstance(x, _SCOPES):
            continue
        reused = {n for n in mentions[k] if count[n] > 1} - params
        if not reused:
            continue
        reads, _ = exposed([x], correlate=correlate)
        own = reused - reads - _unhandled(x)
        mapping = {}    # (the new names are fresh, so renaming all at once is the same)
        for n in sorted(own):
            if not _dead_after(body, mentions, k, n, reads_first, correlate):
                continue
            new = mapping[n] = _fresh(n, taken)
            renamed.append((x, n, new))
            if n in fn.temps:   # (a temporary stays one: the passes may fold it)
                fn.temps = frozenset(fn.temps) | {new}
        _rename(x, mapping)
    return renamed


def _dead_after(body, mentions, k, n, reads_first, correlate=True):
    for j in range(k + 1, len(body)):
        if n in mentions[j]:
            if j not in reads_first:
                reads_first[j] = exposed([body[j]], correlate=correlate)[0]
            return n not in reads_first[j]
    return True


def _fresh(n, taken):
    i = 2
    while f"{n}_{i}" in taken:
        i += 1
    taken.add(f"{n}_{i}")
    return f"{n}_{i}"


def join_scopes(fn, renamed):
    """Give the renamed variables their names back where that cannot confuse them."""
    if not renamed:
        return fn
    top = set(map(id, fn.body))
    where = {}
    for x in fn.prologue + fn.body:
        for n in mentioned(x):
            where.setdefault(n, set()).add(id(x))
    back = {}           # id(block) -> (block, {new: old})
    for block, old, new in reversed(renamed):
        if id(block) in top and where.get(new, set()) <= {id(block)} and \
                id(block) not in where.get(old, ()):
            back.setdefault(id(block), (block, {}))[1][new] = old
            where.setdefault(old, set()).add(id(block))
    for block, mapping in back.values():
        _rename(block, mapping)
    return fn

