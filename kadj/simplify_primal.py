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

The same holds for an array the adjoint allocates and only stores into: a forward
sweep that recomputes ``y[idx[k]] += w[k] * x[k]`` into a work copy of ``y`` whose
elements nothing reads afterwards (the adjoint of an accumulation needs no value of
``y``), or a Gauss-Seidel sweep ``u[i] = 0.5 * (u[i - 1] + u[i + 1] + h2 * f[i])``
into a work copy of ``u`` (linear in ``u``: its adjoint needs no value of ``u``).
When every occurrence of the array's name is its allocation (``y.copy()``,
``np.empty_like(y)``, ``np.zeros(n)``, ...) or a store ``y_work[e] = value`` of a pure
value at a pure index (which may read any of the array's elements: what they read
flows only into the array again), those statements go (:func:`_unread_arrays`), and
with them what only they read; a primal loop left without code goes too when its
counter is read nowhere else.
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
        dead |= _unread_arrays(idx, params)
        if not dead:
            break
        touched.update(idx.drop(dead))
        _drop_empty_ifs(fn, touched, idx)
        _drop_empty_loops(fn, touched, idx)
    _drop_dead_loops(fn, idx, touched)
    for seq in touched.values():
        if _drop_trailing_comments(seq):
            idx.shortened(seq)
    return fn


_ELEMENT = re.compile(r"^(\w+)\[(.+)\]$")
_ALLOCATION = re.compile(r"^(?:np\.(?:empty|zeros|ones|empty_like|zeros_like|ones_like)"
                         r"\(.*\)|\w+\.copy\(\))$")


def _unread_arrays(idx, params):
    """ids of the statements that allocate an array of the adjoint's own, or store into
    it, when no other statement mentions it (see the module docstring)."""
    stores, allocations = {}, {}
    for x in idx.nodes():
        if not (isinstance(x, A.Assign) and isinstance(x.target, str)):
            continue
        target = x.target.strip()
        m = _ELEMENT.match(target)
        if m and x.op in ("=", "+=", "-="):
            array, at = m.group(1), m.group(2)
            if _pure(x.value) and _pure(at):
                stores.setdefault(array, set()).add(id(x))
        elif IDENT.match(target) and x.op == "=" and _ALLOCATION.match(x.value.strip()):
            allocations.setdefault(target, set()).add(id(x))
    occ = idx.occ()
    dead = set()
    for array, ids in allocations.items():
        if array in params or array.startswith("_"):
            continue
        ids = ids | stores.get(array, set())
        if all(id(node) in ids for _, node in occ[array]):
            dead |= ids
    return dead


def _drop_empty_loops(fn, touched, idx):
    """A primal ``for`` over a ``range`` whose body lost all its code goes, when its
    counter occurs nowhere else (a later statement could read its last value)."""
    occ = idx.occ()
    for seq in list(touched.values()):
        gone = {id(x) for x in seq if isinstance(x, A.For) and x.primal and
                _no_code(x.body) and _pure_range(x.iter) and
                all(node is x or id(node) in {id(y) for y in A.walk(x.body)}
                    for _, node in occ.get(x.var, ()))}
        if gone:
            idx.drop_from(seq, gone)
            touched[id(seq)] = seq


def _drop_dead_loops(fn, idx, touched):
    """A primal ``for`` at the function's top level whose body only assigns plain names
    pure values (a forward sweep's loop left with the loads of its dropped stores), also
    under ``if`` and in inner ``for``/``while`` loops left by ``break`` and ``continue``
    (a Newton iteration per element whose every reversed iteration replays it), when
    nothing after it may read one of those names (or its counter) before assigning it:
    it computes nothing that is used.  (Its loops end as the kernel's own did: the
    forward ran them, and the reverse replays them.)"""
    from .simplify_scopes import exposed
    body = fn.body
    gone = set()
    for k, x in enumerate(body):
        if not (isinstance(x, A.For) and x.primal and _pure_range(x.iter)):
            continue
        assigned = _assigns_only(x.body, {x.var})
        if assigned is not None and not assigned & exposed(body[k + 1:], loops=True)[0]:
            gone.add(id(x))
            if k and isinstance(body[k - 1], A.Comment) and body[k - 1].of_next:
                gone.add(id(body[k - 1]))   # (what it said of the loop)
    if gone:
        idx.drop_from(body, gone)
        touched[id(body)] = body



def _assigns_only(seq, assigned):
    """``assigned`` with every name the statements of ``seq`` assign, when all they do
    is assign plain names pure values (in branches and loops on pure conditions, left
    by ``break`` and ``continue``); None otherwise."""
    for y in A.walk(seq):
        if isinstance(y, (A.Comment, A.Pass, A.Break, A.Continue)) or \
                A.reserves_nothing(y):
            continue        # (a reservation of nothing prints nothing)
        if isinstance(y, A.For) and _pure_range(y.iter):
            assigned.add(y.var)
        elif isinstance(y, (A.If, A.While)) and isinstance(y.cond, str) and \
                _pure(y.cond):
            continue
        elif isinstance(y, A.Assign) and isinstance(y.target, str) and \
                IDENT.match(y.target) and y.op in ("=", "+=", "-=") and _pure(y.value):
            assigned.add(y.target)
        else:
            return None
    return assigned


def _pure_range(text):
    """Is ``text`` ``range(...)`` of pure arguments?"""
    return text.startswith("range(") and _pure(text[len("range"):])


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
