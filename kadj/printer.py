"""Adjoint IR -> Python source: the one place that makes the adjoint's text.

The target's spelling of its few intrinsics (a barrier, an atomic add) comes in a
:class:`Syntax`; everything else is plain Python.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import adj_ir as A


@dataclass(frozen=True)
class Syntax:
    barrier: str = ""           # the statement a barrier prints as
    atomic_add: str = ""        # the function an atomic accumulation calls
    sum_add: str = "_sum_add"   # the function a reassociable sum ("sum") calls
    select: str = "_select"     # the function a choice of two values calls ("" for
    #                             Python's conditional expression)


def render(fn, syntax=Syntax()):
    """The source of the adjoint function ``fn`` (an :class:`adj_ir.Function`)."""
    lines = []
    for decorator, helper in fn.helpers:
        lines.append(decorator)
        _function(helper, syntax, lines)
        lines += ["", ""]
    _function(fn, syntax, lines)
    return "\n".join(lines) + "\n"


def _function(fn, syntax, lines):
    lines += [f"def {fn.name}({', '.join(fn.params)}):", f'    """{fn.doc}"""']
    p = _Printer(lines, syntax)
    p.block(fn.prologue, 1)
    p.block(fn.body, 1)


def target_text(t):
    if isinstance(t, A.AdjElem):
        return f"{t.base}[{', '.join(t.index_texts) or '()'}]"
    return t.name


class _Printer:
    def __init__(self, lines, syntax):
        self.lines = lines
        self.syntax = syntax

    def emit(self, depth, text):
        self.lines.append("    " * depth + text)

    def block(self, nodes, depth):
        for x in nodes:
            getattr(self, "p_" + type(x).__name__)(x, depth)

    def suite(self, nodes, depth):
        """The body of a compound statement: ``pass`` where it prints no statement (its
        nodes all print nothing: an empty reservation, a declaration block, comments)."""
        start = len(self.lines)
        self.block(nodes, depth)
        if all(line.lstrip().startswith("#") for line in self.lines[start:]):
            self.emit(depth, "pass")

    def p_Comment(self, x, d):
        self.emit(d, x.text)

    def p_Assign(self, x, d):
        t = x.target if isinstance(x.target, str) else target_text(x.target)
        self.emit(d, f"{t} {x.op} {x.value}")

    def p_Call(self, x, d):
        self.emit(d, x.text)

    def p_If(self, x, d):
        self.emit(d, f"if {x.cond}:")
        self.suite(x.then, d + 1)
        if x.orelse:
            self.emit(d, "else:")
            self.suite(x.orelse, d + 1)

    def p_For(self, x, d):
        self.emit(d, f"for {x.var} in {x.iter}:")
        self.suite(x.body, d + 1)

    def p_While(self, x, d):
        self.emit(d, f"while {x.cond}:")
        self.suite(x.body, d + 1)

    def p_Break(self, x, d):
        self.emit(d, "break")

    def p_Continue(self, x, d):
        self.emit(d, "continue")

    def p_Pass(self, x, d):
        self.emit(d, "pass")

    def p_Return(self, x, d):
        self.emit(d, f"return {x.value}")

    def p_Barrier(self, x, d):
        self.emit(d, self.syntax.barrier + (f"  # {x.note}" if x.note else ""))

    def p_Accumulate(self, x, d):
        t = x.target
        if x.how == "atomic":
            index = ", ".join(t.index_texts) or "()"
            if len(t.index_texts) > 1:
                index = f"({index})"
            self.emit(d, f"{self.syntax.atomic_add}({t.base}, {index}, {x.value})")
        elif x.how == "sum":
            t = target_text(t)
            self.emit(d, f"{t} = {self.syntax.sum_add}({t}, {x.value})")
        else:
            self.emit(d, f"{target_text(t)} {x.op} {x.value}")

    def p_Consume(self, x, d):
        self.emit(d, f"{target_text(x.target)} = {x.zero}")

    def p_Push(self, x, d):
        if x.note:
            self.emit(d, f"# {x.note}")
        self.emit(d, f"_tape_{x.kind}[_sp_{x.kind}] = {x.value}")
        self.emit(d, f"_sp_{x.kind} += 1")

    def p_Pop(self, x, d):
        if x.note:
            self.emit(d, f"# {x.note}")
        self.emit(d, f"_sp_{x.kind} -= 1")
        val = f"_tape_{x.kind}[_sp_{x.kind}]"
        if x.cond is not None:
            self.emit(d, f"if {x.cond}:")
            d += 1
        self.emit(d, f"{x.target} = {val}" + (" != 0" if x.boolean else ""))

    def p_PushArray(self, x, d):
        self.emit(d, f"for {x.var} in range({x.size}):")
        self.emit(d + 1, f"_tape_{x.kind}[_sp_{x.kind} + {x.var}] = {x.elem}")
        self.emit(d, f"_sp_{x.kind} += {x.size}")

    def p_PopArray(self, x, d):
        self.emit(d, f"_sp_{x.kind} -= {x.size}")
        self.emit(d, f"for {x.var} in range({x.size}):")
        self.emit(d + 1, f"{x.elem} = _tape_{x.kind}[_sp_{x.kind} + {x.var}]")

    def p_Reserve(self, x, d):
        assert x.amounts is not None, "tape reservations are planned before printing"
        for kind, amount in sorted(x.amounts.items()):
            self.emit(d, f"if _sp_{kind} + {amount} > _tape_{kind}.shape[0]:")
            self.emit(d + 1, f"_tape_{kind} = _reserve(_tape_{kind}, _sp_{kind} + {amount})")

    def p_CapacityCheck(self, x, d):
        assert x.needed is not None, "capacity checks are planned before printing"
        if x.needed:
            self.p_Reserve(A.Reserve(frame=None, amounts={x.kind: "1"}), d)

    def p_ReverseLoop(self, x, d):
        self.block(x.body, d)

    def p_Block(self, x, d):
        self.block(x.body, d)
