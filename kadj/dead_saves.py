"""Saves that no restore needs: a kernel assignment whose old value every restore
leaves unread is not saved.

The analysis decides per variable which values the reverse sweep needs
(:mod:`kadj.analysis.needed`, "to be recorded"): a needed variable that the kernel
assigns more than once, or in a loop, is saved before each of its assignments and
restored at each assignment's reverse.  The old value one assignment overwrites is not
always read again.  ``logsumexp`` reads ``m`` in the reverse of its sum, but the value
``m = x[0]`` that the running maximum overwrites is read by nothing the reverse sweep
runs after restoring it; a per-row softmax written in place restores ``s`` at the
reverse of every ``s += x[r, j]`` and never reads it again (the sum's adjoint was
computed from the final ``s`` before).  Each such value cost a tape entry in the forward
sweep and a load and a store in the reverse one.

The sweeps mark each save and each restore of a variable's old value with the kernel
assignment it belongs to (``site`` of :class:`adj_ir.Push` and :class:`adj_ir.Pop`).
After the build, a liveness pass over the whole adjoint IR (loops to a fixpoint,
``break``, ``continue`` and ``return`` followed) finds the restores whose variable
nothing reads before it is assigned again.  An assignment whose restores are all such,
with as many saves as restores, loses its saves and restores together: the sweeps mirror
each other, so every restore of the assignment read the value its own save recorded, and
taking both away leaves every other value at its place on the stack.  A value nothing
reads is the only thing that changes: the gradient is the same, bit for bit.  The
tape's reservations, planned while the sweeps were built, keep room for the values no
longer saved.  Restores of array elements, and values saved in parts (complex numbers)
or by checkpoints, are not marked and stay as they are.
"""
from __future__ import annotations

import dataclasses

from . import adj_ir as A
from .adj_refs import IDENT, names

__all__ = ["drop_dead_saves", "dead_restores"]


def drop_dead_saves(fn):
    """Remove from ``fn`` (adjoint IR as built, before lowering) the saves and
    restores of every kernel assignment whose restores are all dead.  Returns the
    number of assignments whose saves were removed."""
    dead = dead_restores(fn)
    pushes, pops = {}, {}
    for x in A.walk(fn.prologue + fn.body):
        if isinstance(x, A.Push) and x.site is not None:
            pushes.setdefault(x.site, []).append(x)
        elif isinstance(x, A.Pop) and x.site is not None:
            pops.setdefault(x.site, []).append(x)
    gone, sites = set(), 0
    for site, restores in pops.items():
        saves = pushes.get(site, [])
        if len(saves) == len(restores) and all(id(p) in dead for p in restores):
            gone.update(id(x) for x in saves + restores)
            sites += 1
    if gone:
        _remove(fn.prologue, gone)
        _remove(fn.body, gone)
        _drop_unused_tapes(fn)
    return sites


def _drop_unused_tapes(fn):
    """A tape of a kind nothing is saved on any more: its declaration, its
    reservations and its capacity checks go."""
    nodes = list(A.walk(fn.prologue + fn.body))
    used = {x.kind for x in nodes if isinstance(x, _TAPE_TRAFFIC)}
    unused = {x.kind for x in nodes if isinstance(x, A.TapeDecl)} - used
    if not unused:
        return
    for x in nodes:
        if isinstance(x, A.Reserve):
            for amounts in (getattr(x.frame, "amounts", None),
                            (x.hoist or {}).get("amounts")):
                for kind in unused:
                    if amounts:
                        amounts.pop(kind, None)
    drop = {id(x) for x in nodes if isinstance(x, (A.TapeDecl, A.CapacityCheck))
            and x.kind in unused}
    _remove(fn.prologue, drop)
    _remove(fn.body, drop)


_TAPE_TRAFFIC = (A.Push, A.Pop, A.PushArray, A.PopArray)


def _remove(seq, gone):
    """Take the nodes ``gone`` (with the capacity check just before a save) out of
    ``seq`` and the lists inside it; an ``if`` left with nothing but comments goes
    too.  Returns whether ``seq`` lost anything."""
    lost = False
    out = []
    for x in seq:
        if id(x) in gone:
            if out and isinstance(out[-1], A.CapacityCheck) and isinstance(x, A.Push) \
                    and out[-1].kind == x.kind:
                out.pop()
            lost = True
            continue
        changed = False
        for child in x.children():
            changed |= _remove(child, gone)
        if changed and isinstance(x, A.If) and _only_comments(x.then) and \
                _only_comments(x.orelse):
            lost = True
            continue    # (its condition: a comparison the sweeps wrote, no call)
        lost |= changed
        out.append(x)
    seq[:] = out
    return lost


def _only_comments(seq):
    return all(isinstance(x, A.Comment) for x in seq)


# ---- liveness over the adjoint IR ------------------------------------------------------
def dead_restores(fn):
    """The ids of the marked restores (:class:`adj_ir.Pop` with a ``site``) of a
    variable that nothing reads after the restore before assigning it again."""
    live = _Liveness()
    live.seq(fn.prologue + fn.body, frozenset())
    return {k for k, dead in live.dead.items() if dead}


class _Liveness:
    def __init__(self):
        self.dead = {}          # id(Pop) -> its value is read by nothing (last pass)
        self.loops = []         # (live at the loop's exit, live at its head)

    def seq(self, nodes, after):
        live = after
        for x in reversed(nodes):
            live = self.node(x, live)
        return live

    def node(self, x, after):
        if isinstance(x, A.If):
            return self.seq(x.then, after) | self.seq(x.orelse, after) | _names(x.cond)
        if isinstance(x, A.For):
            return self.loop(x.body, after, frozenset(), frozenset({x.var})) | \
                _names(x.iter)
        if isinstance(x, A.While):
            return self.loop(x.body, after, _names(x.cond), frozenset())
        if isinstance(x, (A.ReverseLoop, A.Block)):
            return self.seq(x.body, after)
        if isinstance(x, A.Break):
            return self.loops[-1][0] if self.loops else after
        if isinstance(x, A.Continue):
            return self.loops[-1][1] if self.loops else after
        if isinstance(x, A.Return):
            return _names(x.value)
        if isinstance(x, A.Pop):
            target = x.target.strip()
            if x.site is not None:
                self.dead[id(x)] = target not in after
            uses = _names(x.cond)
            if IDENT.match(target):
                return (after - {target} if x.cond is None else after) | uses
            return after | uses | _names(target)
        if isinstance(x, (A.Assign, A.Accumulate)):
            return _assigned(x.target, x.op, after) | _names(x.value)
        if isinstance(x, (A.Comment, A.Pass, A.Barrier, A.CapacityCheck)):
            return after
        if isinstance(x, A.Push):
            return after | _names(x.value)
        if isinstance(x, A.Reserve):
            # what its amounts read, planned or not yet (the frame's amounts and the
            # variables they read, a replayed iteration's hoisted amounts)
            fr = x.frame
            texts = [x.amounts, (x.hoist or {}).get("amounts"),
                     getattr(fr, "amounts", None), getattr(fr, "trip", None)]
            read = {n for t in texts for n in _names(str(t))}
            read |= {str(v) for v in getattr(fr, "ops", ()) or ()}
            read |= {str(v) for v in getattr(fr, "operands", ()) or ()}
            return after | read
        if x.children():    # a compound node this pass does not know: read all it names
            return after | {n for y in A.walk([x]) for n in _all_names(y)}
        return after | _all_names(x)

    def loop(self, body, after, cond, var):
        """Live at the head of a loop (before its counter is assigned): what leaving
        it needs, and what its body needs (iterated until nothing is added)."""
        head = after | cond
        while True:
            self.loops.append((after, head))
            try:
                inside = self.seq(body, head)
            finally:
                self.loops.pop()
            new = after | cond | (inside - var)
            if new == head:
                return head
            head = new


def _assigned(t, op, after):
    """Live before an assignment to ``t`` with ``op``, not counting its value."""
    plain = op in ("=", "= -")
    if isinstance(t, (A.AdjVar, A.Local)):
        return after - {t.name} if plain else after | {t.name}
    if isinstance(t, A.AdjElem):
        return after | {t.base} | {n for text in t.index_texts for n in _names(text)}
    text = t.strip() if isinstance(t, str) else ""
    if IDENT.match(text):
        return after - {text} if plain else after | {text}
    return after | _names(text)


def _names(text):
    return frozenset(names(text)) if isinstance(text, str) else frozenset()


def _all_names(x):
    """Every name in the texts of node ``x``'s own fields (not its statement lists)."""
    out = set()
    for f in dataclasses.fields(x):
        v = getattr(x, f.name)
        if isinstance(v, str):
            out |= _names(v)
        elif isinstance(v, (tuple, frozenset, set)):
            out |= {n for item in v if isinstance(item, str) for n in _names(item)}
        elif isinstance(v, dict):
            out |= {n for item in v.values() if isinstance(item, str) for n in _names(item)}
        elif isinstance(v, (A.AdjVar, A.Local)):
            out.add(v.name)
        elif isinstance(v, A.AdjElem):
            out |= {v.base} | {n for t in v.index_texts for n in _names(t)}
    return frozenset(out)
