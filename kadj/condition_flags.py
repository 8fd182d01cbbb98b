"""Short-circuit conditions as a flag: ``if a and b: break`` inside a loop.

A branch whose arms meet nowhere (one leaves the loop) is structured with the code
after it moved into its other arm.  For a condition made of ``and``/``or``/conditional
expressions numba emits one branch per operand, and the code after the ``if`` is
reached from several of them, so moving it copies it into every one: a loop with a
few such tests grows exponentially.  Here the branches of such a condition are
replayed as nested ``if`` statements that set a fresh boolean flag, followed by one
``if flag:`` whose arms are the two outcomes; each outcome is then structured once.
The condition's *decision blocks* are those between the branch and the two blocks it
finally leads to that branch on the same source line (so each ``if`` statement is
decided on its own) and store nothing.

The decision blocks run exactly as in the kernel (same order, same paths), so values
they compute stay defined where they were.  A flag is assigned on several paths, so
the adjoint records it; :mod:`kadj.structurize` therefore uses flags only when
structuring without them has copied some block too often.
"""
from __future__ import annotations

from numba.core import ir as nir
from numba.core import types

from . import ir

_MAX_TREE = 64  # decision statements emitted for one condition


def _is_decision_block(st, label, ctx, stop, line):
    """A block of the condition on source line ``line``: ends in a branch on that
    line, stores nothing, and is no loop header, loop exit, merge point or raising
    block."""
    if label == stop or st.resolve_trivial(label) == stop:
        return False
    if ctx.header is not None and label in (ctx.header, ctx.header_alt):
        return False
    rl = st.resolve_trivial(label)
    if (ctx.follow is not None and rl == ctx.follow) or rl in ctx.exits:
        return False
    if label in st.loops or st.is_range_header(label) or st.raises_only(label):
        return False
    block = st.blocks[label]
    if not isinstance(block.terminator, nir.Branch) or \
            getattr(block.terminator.loc, "line", None) != line:
        return False
    return all(isinstance(s, (nir.Assign, nir.Del)) for s in block.body[:-1])


def _outcomes(st, term, ctx, stop):
    """The blocks the decision blocks below ``term`` finally lead to, first reached
    first (the true side first); None when they are too many to be decided here."""
    found, seen, stack = [], set(), [term.falsebr, term.truebr]
    while stack:
        label = stack.pop()
        if label in seen:
            continue
        seen.add(label)
        if _is_decision_block(st, label, ctx, stop, term.loc.line):
            t = st.blocks[label].terminator
            stack.extend((t.falsebr, t.truebr))
        elif all(st.resolve_trivial(f) != st.resolve_trivial(label) for f in found):
            found.append(label)
        if len(seen) > _MAX_TREE:
            return None
    return found


def flag_condition(st, term, ctx, stop):
    """(statements that set a flag, flag, outcome when true, outcome when false) for
    the branch ``term`` when its condition spans several blocks and leads to exactly
    two outcomes; else None."""
    leaves = _outcomes(st, term, ctx, stop)
    if leaves is None or len(leaves) != 2:
        return None
    if all(not _is_decision_block(st, t, ctx, stop, term.loc.line)
           for t in (term.truebr, term.falsebr)):
        return None  # a plain branch
    if any(st.raises_only(t) for t in leaves):
        return None
    on_true, on_false = leaves
    outcome = {st.resolve_trivial(on_true): True, st.resolve_trivial(on_false): False}
    flag = st.fresh("cond", types.boolean)
    budget = [_MAX_TREE]

    def decide(label):
        rl = st.resolve_trivial(label)
        if rl in outcome:
            return (ir.Assign(flag, ir.Copy(ir.Const(outcome[rl]))),)
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLarge
        block = st.blocks[label]
        stmts = []
        for s in block.body[:-1]:
            stmts.extend(st.convert(s))
        t = block.terminator
        stmts.append(ir.If(st.operand(t.cond), decide(t.truebr), decide(t.falsebr),
                           loc=t.loc))
        return tuple(stmts)

    try:
        tree = ir.If(st.operand(term.cond), decide(term.truebr), decide(term.falsebr),
                     loc=term.loc)
    except _TooLarge:
        return None
    return [tree], flag, on_true, on_false


class _TooLarge(Exception):
    pass
