"""Readability pass over the adjoint IR: primal values nothing reads are not computed.

:func:`remove_unused_primal` drops the assignments ``v = e`` of a forward or recomputed
primal value ``v`` that no statement of the adjoint ever reads (a CUDA gather form's
``t1 = cuda.threadIdx.x`` of a thread it does not need, a forward sweep's temporary
that every reversed iteration recomputes anyway).  The test is global, so it holds
whatever the control flow: ``v`` is read nowhere in the function, neither in an
expression, a loop header, a condition, a return, a tape push nor any text this
module does not understand; names an adjoint variable of the primal is never
assigned by a plain assignment.  ``e`` must be pure: a pure call (:func:`adj_refs.pure`,
CUDA's thread indexing) at most, no store (the target is a plain name).  The
generated bookkeeping (names beginning with ``_``: the tape, its stack pointer, trip
counts, local sums) and the function's parameters are left alone.
"""
from __future__ import annotations

import re

from . import adj_ir as A
from .adj_refs import IDENT, Index, names, pure

# CUDA's thread indexing reads where the thread is; nothing else
_INDEXING = re.compile(r"(?<![\w.])cuda\.(grid|gridsize)\(\s*[123]\s*\)")


def _pure(text):
    return pure(_INDEXING.sub("0", text))


def _removable(x):
    """``x`` assigns a plain name a pure value (reading the name itself at most via
    ``+=``/``-=``); the name, or None."""
    if not (isinstance(x, A.Assign) and isinstance(x.target, str)
            and IDENT.match(x.target) and x.op in ("=", "+=", "-=")):
        return None
    name = x.target
    if name.startswith("_") or not _pure(x.value) or name in names(x.value):
        return None
    return name


def _removable_memo(x, seen):
    got = seen.get(id(x))
    if got is None or got[0] is not x or got[1] is not getattr(x, "value", None) or \
            got[2] is not getattr(x, "target", None) or got[3] != getattr(x, "op", None):
        got = seen[id(x)] = (x, getattr(x, "value", None), getattr(x, "target", None),
                             getattr(x, "op", None), _removable(x))
    return got[4]


def remove_unused_primal(fn, idx=None):
    """Drop the assignments of primal values read nowhere (see the module docstring),
    then the ``if`` statements left without code and the source comments left without
    statements; repeated until no more go (a value read only by a dropped one, or
    only by the condition of a dropped ``if``, goes next).  ``idx``: the function's
    :class:`~kadj.adj_refs.Index`, when the caller keeps one (it is told of every
    change)."""
    idx = idx or Index(fn)
    params = set(fn.params)
    touched = {}
    seen = {}       # id(node) -> (node, value, target, op, _removable(node))
    while True:
        occ = idx.occ()
        dead = set()
        defs = {}       # name -> ids of the statements that assign it removably
        for x in idx.nodes():
            if isinstance(x, A.Assign) and isinstance(x.target, str):
                name = _removable_memo(x, seen)
                if name is not None:
                    defs.setdefault(name, set()).add(id(x))
        for name, ids in defs.items():
            if name in params or name.startswith("_"):
                continue
            # every occurrence is one of these assignments' own target (their values
            # do not read it: :func:`_removable`)
            if all(id(node) in ids for _, node in occ[name]):
                dead |= ids
        if not dead:
            break
        touched.update(idx.drop(dead))
        _drop_empty_ifs(fn, touched, idx)
    for seq in touched.values():
        if _drop_trailing_comments(seq):
            idx.shortened(seq)
    return fn


def _no_code(seq):
    return all(isinstance(x, (A.Comment, A.Pass)) for x in seq)


def _drop_empty_ifs(fn, touched, idx):
    """An ``if`` of a pure condition whose branches lost all their code goes; one whose
    ``then`` branch lost it tests the negated condition (a plain name's)."""
    while True:
        changed = False
        for seq in idx.lists():
            if not any(isinstance(x, A.If) and id(x.then) in touched
                       or isinstance(x, A.If) and id(x.orelse) in touched for x in seq):
                continue
            gone = set()
            for x in seq:
                if isinstance(x, A.If) and _no_code(x.then) and _pure(x.cond):
                    if _no_code(x.orelse):
                        changed = True
                        gone.add(id(x))
                        continue
                    if IDENT.match(x.cond) and id(x.then) in touched:
                        x.cond, x.then, x.orelse = f"not {x.cond}", x.orelse, []
                        idx.touch([x])
                        idx.relisted()
                        touched[id(x.then)] = x.then
            if gone:
                idx.drop_from(seq, gone)
                touched[id(seq)] = seq
        if not changed:
            return


_SOURCE_LINE = re.compile(r"# [^\s:]+:\d+: ")


def _drop_trailing_comments(seq):
    """Source-line comments at the end of a statement list lost their statements;
    whether some went."""
    n = len(seq)
    while seq and isinstance(seq[-1], A.Comment) and _SOURCE_LINE.match(seq[-1].text):
        seq.pop()
    return len(seq) < n
