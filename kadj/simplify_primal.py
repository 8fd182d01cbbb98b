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
from .adj_refs import IDENT, index, lists, names, pure

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


def remove_unused_primal(fn):
    """Drop the assignments of primal values read nowhere (see the module docstring),
    then the ``if`` statements left without code and the source comments left without
    statements; repeated until no more go (a value read only by a dropped one, or
    only by the condition of a dropped ``if``, goes next)."""
    params = set(fn.params)
    touched = {}
    while True:
        occ, _ = index(fn)
        dead = set()
        for name, rows in occ.items():
            if name in params or name.startswith("_"):
                continue
            defs = [node for _, node in rows if _removable(node) == name]
            if not defs:
                continue
            ids = {id(n) for n in defs}
            # every occurrence is one of these assignments' own target (their values
            # do not read it: :func:`_removable`)
            if all(id(node) in ids for _, node in rows):
                dead |= ids
        if not dead:
            break
        for seq in lists(fn):
            kept = [x for x in seq if id(x) not in dead]
            if len(kept) < len(seq):
                seq[:] = kept
                touched[id(seq)] = seq
        _drop_empty_ifs(fn, touched)
    for seq in touched.values():
        _drop_trailing_comments(seq)
    return fn


def _no_code(seq):
    return all(isinstance(x, (A.Comment, A.Pass)) for x in seq)


def _drop_empty_ifs(fn, touched):
    """An ``if`` of a pure condition whose branches lost all their code goes; one whose
    ``then`` branch lost it tests the negated condition (a plain name's)."""
    while True:
        changed = False
        for seq in lists(fn):
            if not any(isinstance(x, A.If) and id(x.then) in touched
                       or isinstance(x, A.If) and id(x.orelse) in touched for x in seq):
                continue
            out = []
            for x in seq:
                if isinstance(x, A.If) and _no_code(x.then) and _pure(x.cond):
                    if _no_code(x.orelse):
                        changed = True
                        continue
                    if IDENT.match(x.cond) and id(x.then) in touched:
                        x.cond, x.then, x.orelse = f"not {x.cond}", x.orelse, []
                        touched[id(x.then)] = x.then
                out.append(x)
            if len(out) < len(seq):
                seq[:] = out
                touched[id(seq)] = seq
        if not changed:
            return


_SOURCE_LINE = re.compile(r"# [^\s:]+:\d+: ")


def _drop_trailing_comments(seq):
    """Source-line comments at the end of a statement list lost their statements."""
    while seq and isinstance(seq[-1], A.Comment) and _SOURCE_LINE.match(seq[-1].text):
        seq.pop()
