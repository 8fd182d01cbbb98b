"""First definitions in loops: values a loop defines afresh in every iteration.

A value overwritten in a loop is saved before each overwrite.  When the loop body
first assigns it unconditionally (at the top level of the body, no
``break``/``continue``/``return`` before the assignment), reads it only after that
assignment, and nothing outside the loop refers to it, the save made there in the
first iteration holds a value the loop never computed.  Such a first assignment is a
*fresh* definition here (the body may assign the value again later: those saves
stay).
How the writer uses it (kadj.forward_sweep, kadj.reverse_sweep):

- in a loop recorded iteration by iteration, the saves move to the top of the
  iteration and run from the second iteration on (the value of iteration k is saved
  at the top of iteration k + 1); the reversed loop restores them at the end of each
  reversed iteration but the first forward one;
- when the loop is nested directly in a loop whose iterations are recorded too (not
  replayed), the reverse of an earlier outer iteration starts from the value the
  inner loop ended with: it is saved once right after the inner loop instead of in
  the next entry's first iteration;
- in a replayed iteration (one iteration recorded on its own) the save is not needed
  at all: the replay defines the value before anything reads it.

Outside loops, the first assignment of a variable (nothing before it in the kernel
reads or assigns it) overwrites no value of the kernel's: it is not saved either.
"""
from __future__ import annotations

from .. import ir


def _refers(x, v):
    if v in ir.stmt_reads(x):
        return True
    if isinstance(x, ir.Assign):
        return x.target == v
    if isinstance(x, ir.ForRange):
        return x.index == v
    return False


def _exits(stmts):
    """Does a statement sequence leave the iteration early (break/continue/return)?"""
    return any(isinstance(x, (ir.Break, ir.Continue)) for x in ir.walk_level(stmts)) or \
        any(isinstance(x, ir.Return) for x in ir.walk(stmts))


def _parents(stmts, parent, out):
    """{loop uid: the innermost loop around it, or None}."""
    for s in stmts:
        if isinstance(s, ir.If):
            _parents(s.then, parent, out)
            _parents(s.orelse, parent, out)
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            out[s.uid] = parent
            _parents(s.body, s, out)
    return out


def _fresh_in(loop, kernel, a, everything):
    """The fresh definitions at the top level of ``loop``'s body, in order: the first
    mention of their variable in the body."""
    body = loop.body
    inside = set(map(id, ir.walk(body)))
    outside = [x for x in everything if id(x) not in inside]
    assigned_in = ir.assigned(body)
    if isinstance(loop, ir.ForRange):
        if loop.index in assigned_in:
            return []
        if isinstance(loop.start, ir.Var) and loop.start.name in assigned_in:
            return []
    found = []
    for pos, x in enumerate(body):
        if not isinstance(x, ir.Assign):
            continue
        v = x.target
        if v not in a.pushed or v in kernel.args or v in ir.stmt_reads(x):
            continue
        before = body[:pos]
        if _exits(before) or any(_refers(y, v) for y in ir.walk(before)):
            continue
        if any(_refers(y, v) for y in outside):
            continue
        found.append(x)
    return found


def _first_outside_loops(kernel, a):
    """The assignments outside loops that are the first mention of their variable."""
    top = set(map(id, ir.walk_level(kernel.body)))
    seen = set(kernel.args)
    found = []
    for x in ir.walk(kernel.body):
        reads = ir.stmt_reads(x)
        if id(x) in top and isinstance(x, ir.Assign) and x.target in a.pushed and \
                x.target not in seen and x.target not in reads:
            found.append(x)
        seen |= reads
        if isinstance(x, ir.Assign):
            seen.add(x.target)
        elif isinstance(x, ir.ForRange):
            seen.add(x.index)
    return tuple(found)


def fresh_definitions(kernel, a):
    """{loop uid: (fresh definitions, form)} for the loops that have any, and under
    the key None the first assignments outside loops (form "unneeded").  ``form``:
    "unneeded" (no save at all: the loop's iterations are replayed one at a time),
    "guarded" (saves from the second iteration on), "guarded+exit" (also the value
    the loop ends with, right after it: the enclosing loop's iterations are recorded)
    or None (the loop's saves stay as they are)."""
    everything = list(ir.walk(kernel.body))
    parents = _parents(kernel.body, None, {})
    out = {None: (_first_outside_loops(kernel, a), "unneeded")}
    for s in everything:
        if not isinstance(s, (ir.ForRange, ir.Loop)):
            continue
        defs = _fresh_in(s, kernel, a, everything)
        if not defs:
            continue
        parent = parents.get(s.uid)
        if s.uid in a.replay:
            form = "unneeded"
        elif not a.has_rev.get(id(s)):
            form = None
        elif parent is None or parent.uid in a.replay:
            form = "guarded"
        elif isinstance(s, ir.ForRange) and any(
                isinstance(x, ir.Var) and x.name in ir.assigned(s.body)
                for x in (s.stop, s.step)):
            form = None   # (the trip count is not known after the loop)
        else:
            form = "guarded+exit"
        out[s.uid] = (tuple(defs), form)
    return out
