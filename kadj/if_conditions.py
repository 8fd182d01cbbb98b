"""An ``if`` whose condition variable its own arms assign (the structurizer's
early-return flag: ``if returned: pass else: <loop that may return>``) is decided by a
copy of the condition taken just before it.

The reverse sweep re-decides each ``if`` with its condition's value; a variable the
arms assign holds, at the ``if``'s reverse, what the arms left in it (the forward
restores its older value only inside the arm, after that arm's reverse), so the
reverse would take the other arm.  The copy is assigned once, before the arms, and is
recorded or recomputed like any other condition.
"""
from __future__ import annotations

import dataclasses

from . import ir


def copy_self_assigned_conditions(kernel):
    """``kernel`` with such conditions copied (the kernel itself when there is none)."""
    types = dict(kernel.types)
    count = [0]

    def visit(seq):
        out = []
        for s in seq:
            if isinstance(s, ir.If):
                s = dataclasses.replace(s, then=tuple(visit(s.then)),
                                        orelse=tuple(visit(s.orelse)))
                cond = s.cond
                if isinstance(cond, ir.Var) and cond.name in ir.assigned(s.then + s.orelse):
                    count[0] += 1
                    name = f"$ifcond{count[0]}.{cond.name}"
                    types[name] = kernel.types.get(cond.name)
                    out.append(ir.Assign(name, ir.Copy(cond), loc=s.loc))
                    s = dataclasses.replace(s, cond=ir.Var(name))
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                s = dataclasses.replace(s, body=tuple(visit(s.body)))
            out.append(s)
        return out

    body = tuple(visit(kernel.body))
    if not count[0]:
        return kernel
    return dataclasses.replace(kernel, body=body, types=types)
