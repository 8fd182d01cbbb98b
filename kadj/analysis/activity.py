"""Activity: which float variables and arrays depend on a differentiable input
(``varied``) and can reach an output (usefulness); only those get adjoint code.  Also
the checks on the kernel's values and arrays the other analyses rely on, and which
variables are assigned inside a loop."""
from __future__ import annotations

from numba.core import types

from .. import ir, ops, rules
from ..errors import DifferentiationError


_INEXACT = (types.Float, types.Complex)   # the values that carry derivatives


def check_values(kernel):
    """(Complex values are differentiable on the CPU; other targets refuse them when
    the plan is made, :func:`kadj.complex_check.check_target`.)"""


def count_assignments(kernel, a):
    """Fill ``param_arrays``, ``assign_count`` and ``scratch_arrays``; refuse rebinding
    or aliasing an array."""
    T = kernel.types
    for name in kernel.args:
        if isinstance(T.get(name), types.Array):
            a.param_arrays.add(name)
    for s in ir.walk(kernel.body):
        if isinstance(s, ir.Assign):
            a.assign_count[s.target] = a.assign_count.get(s.target, 0) + 1
            if isinstance(s.expr, ir.Alloc):
                a.scratch_arrays.add(s.target)
            elif isinstance(T.get(s.target), types.Array) and not (
                    isinstance(s.expr, ir.Copy) and isinstance(s.expr.src, ir.GlobalRef)):
                raise DifferentiationError(
                    "array variables may not be rebound or aliased",
                    kernel=kernel.name, loc=s.loc, construct="array alias",
                    remedy="index the original array directly.  A buffer swap "
                           "(`u, un = un, u`) is supported as the last statement of a "
                           "`for t in range(...)` loop at the kernel's top level (no "
                           "break, continue or return in it, the names rebound nowhere "
                           "else); otherwise copy the new values back (`u[:] = un`), "
                           "or keep the time levels in one array indexed by the step's "
                           "parity (`u2[t % 2, i]`)")
    for name in a.param_arrays:
        if name in a.assign_count:
            raise DifferentiationError(
                f"the array argument '{name}' is rebound inside the kernel",
                kernel=kernel.name, construct="array rebinding",
                remedy="use a new name for the new array")


def check_scratch_placement(kernel):
    def visit(stmts, depth):
        for s in stmts:
            if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Alloc) and depth:
                raise DifferentiationError(
                    "scratch arrays allocated inside a loop are not supported",
                    kernel=kernel.name, loc=s.loc, construct="np.empty/np.zeros in a loop",
                    remedy="allocate the scratch array once, before the loop")
            if isinstance(s, ir.If):
                visit(s.then, depth)
                visit(s.orelse, depth)
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                visit(s.body, depth + 1)

    visit(kernel.body, 0)


def loop_assigned(stmts, a, inside):
    for s in stmts:
        if isinstance(s, ir.Assign) and inside:
            a.in_loop.add(s.target)
        elif isinstance(s, ir.If):
            loop_assigned(s.then, a, inside)
            loop_assigned(s.orelse, a, inside)
        elif isinstance(s, ir.ForRange):
            if inside:
                a.in_loop.add(s.index)
            loop_assigned(s.body, a, True)
        elif isinstance(s, ir.Loop):
            loop_assigned(s.body, a, True)


def activity(kernel, a):
    T = kernel.types
    for name in a.slot_args:
        if isinstance(T.get(name), types.Array):
            a.varied_arrays.add(name)
        elif isinstance(T.get(name), _INEXACT):
            a.varied.add(name)
    stmts = list(ir.walk(kernel.body))
    # a scratch array the kernel never loads from: what is stored into it reaches
    # nothing, so it gets no adjoint (a diagnostics array written and never read)
    unread = {s.target for s in stmts if isinstance(s, ir.Assign) and
              isinstance(s.expr, ir.Alloc)} - a.loaded
    changed = True
    while changed:
        changed = False
        for s in stmts:
            if isinstance(s, ir.Assign):
                if s.target in a.varied or not isinstance(T.get(s.target), _INEXACT):
                    continue
                e = s.expr
                hit = False
                if isinstance(e, ir.Load):
                    hit = e.array.name in a.varied_arrays
                elif isinstance(e, ir.Copy):
                    hit = a.active(e.src)
                elif isinstance(e, ir.Op):
                    if e.fn not in rules.NONDIFFERENTIABLE:
                        hit = any(a.active(x) for x in e.args)
                if hit:
                    a.varied.add(s.target)
                    changed = True
            elif isinstance(s, ir.Store):
                arr = s.array.name
                if arr not in a.varied_arrays and arr not in unread and \
                        a.active(s.value) and \
                        isinstance(T.get(arr), types.Array) and \
                        isinstance(T[arr].dtype, _INEXACT):
                    a.varied_arrays.add(arr)
                    changed = True


def usefulness(kernel, a, returns_value):
    """Backward fixpoint: variables whose adjoint can reach an output (a store into an
    array with an adjoint, or the returned value).  Active = varied and useful."""
    useful = set()
    stmts = list(ir.walk(kernel.body))
    for s in stmts:
        if isinstance(s, ir.Store) and s.array.name in a.varied_arrays and \
                isinstance(s.value, ir.Var):
            useful.add(s.value.name)
        elif isinstance(s, ir.Return) and returns_value and isinstance(s.value, ir.Var):
            useful.add(s.value.name)
    # what each varied variable's adjoint flows into: its defining statements' operands
    # that get a contribution (computed once), then a worklist over that graph
    feeds = {}
    for s in stmts:
        if not isinstance(s, ir.Assign) or s.target not in a.varied:
            continue
        e = s.expr
        into = feeds.setdefault(s.target, set())
        if isinstance(e, ir.Copy) and isinstance(e.src, ir.Var):
            into.add(e.src.name)
        elif isinstance(e, ir.Op):
            rule = rules.lookup(e.fn)
            if rule is not None:
                args = [ops.var(x.name) if isinstance(x, ir.Var) else ops.const(0.0)
                        for x in e.args]
                try:
                    contribs = rules.expand(rule, ops.var(ir.COTANGENT), ops.var(s.target),
                                            args, kernel=kernel.name, loc=s.loc)
                except TypeError:
                    contribs = [1.0] * len(args)
                for x, c in zip(e.args, contribs):
                    if c is not None and isinstance(x, ir.Var):
                        into.add(x.name)
    work = list(useful)
    while work:
        v = work.pop()
        for w in feeds.get(v, ()):
            if w not in useful:
                useful.add(w)
                work.append(w)
    a.varied &= useful
