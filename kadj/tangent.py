"""The tangent pass (forward mode): region tree + analysis facts + rules -> the
tangent function, as adjoint IR (:mod:`kadj.adj_ir`), printed by :mod:`kadj.printer`.

The tangent function runs the kernel's own statements in their own order and, beside
each active one, its tangent: ``dot_v = sum_i d f/d a_i * dot_a_i`` for an active
assignment ``v = f(a_1, ...)``, ``dot_u[i] = dot_v`` for a store ``u[i] = v`` into an
active array.  Loops, branches, ``while``/``break``/``continue`` and early returns are
copied as they are: nothing is recorded, nothing runs backwards.

The partial derivatives come from the same rule table as the adjoint's
(:mod:`kadj.rules`): a rule's contribution for argument ``a_i`` is linear in the
cotangent ``g`` (real scalars), so with ``g = dot_a_i`` it is that argument's term of
the tangent.  Which values are active is the analysis' ``varied`` / ``varied_arrays``
(:mod:`kadj.analysis`): a value that is not active has a zero tangent, never read.

Order within one statement: the tangent of ``v = f(...)`` is computed before ``v`` is
assigned when its rule does not read the result (so ``x = x * y`` gives
``dot_x = dot_x * y + x * dot_y`` with the old ``x``); a rule that reads the result
(``exp``: ``g * out``) has the result computed first, into a temporary when the
statement also reads ``v``.  A store's tangent is stored next to it, so an array both
read and written (``u[i] = u[i - 1] + ...``) has its tangent read in the state the
primal reads.  In a sum of tangent terms, the term that reads the tangent being assigned
(a recurrence's carried tangent) is added last (:mod:`kadj.tangent_sums`).

The writer is target-neutral: what a target spells or lowers differently (a GPU's
intrinsics, barriers, shared and local arrays, the forward's atomics) comes in a
:class:`TangentContext` (the CUDA target's: :func:`kadj.cuda.context.tangent_context`).
"""
from __future__ import annotations

import ast
import linecache
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Mapping

from numba.core import types

from . import adj_ir as A
from . import ir, ops, rules
from .adj_naming import Naming, _strip
from .errors import DifferentiationError
from .printer import Syntax, render
from .reverse import AdjointSource
from .expr_text import combine, parse
from .simplify_expr import (drop_bool_casts, drop_orphan_comments, fold_single_uses,
                            inline_index_offsets)
from .source_header import self_contained
from .tangent_sums import carried_terms_last


def refuse_barrier(w, s, out):
    """A CPU kernel has no block of threads to meet."""
    raise DifferentiationError("barriers exist only in GPU kernels", kernel=w.k.name,
                               loc=s.loc, construct="barrier")


@dataclass(frozen=True)
class TangentContext:
    """A target's part in building one tangent function (:class:`TangentWriter`): what
    differs from the host's, as data and lowerings.  The host's is :data:`HOST_TANGENT`;
    the CUDA target's, :func:`kadj.cuda.context.tangent_context`.

    syntax:      the printer's spelling of barriers and atomic adds.
    intrinsics:  the target's :class:`kadj.targets.base.Intrinsics` (how its callables
                 and special registers are spelled), or None.
    namespace:   objects the source names besides ``math`` and ``np``.
    barrier:     ``(writer, barrier statement, out)``: a primal barrier's tangent code
                 (the host refuses it).
    declare:     ``(writer, assignment of an Alloc, out) -> bool``: an array the target
                 declares itself (``cuda.shared.array``...), written with its tangent's
                 declaration; False leaves it to the host's (``np.zeros_like``).
    accumulate:  ``(writer, accumulating store, out)``: a store ``x[i] += v`` of the
                 forward (an atomic add) and its tangent, or None: plain ``+=``.
    op_tangent:  ``(writer, assignment of an Op) -> text or None``: the tangent of an
                 operation across threads (a warp shuffle), None for the rule table's.
    """

    syntax: Syntax = Syntax()
    intrinsics: object = None
    namespace: Mapping = field(default_factory=lambda: MappingProxyType({}))
    barrier: Callable = refuse_barrier
    declare: Callable = None
    accumulate: Callable = None
    op_tangent: Callable = None


HOST_TANGENT = TangentContext()


class TangentWriter(Naming):
    """Builds the tangent function of one kernel (``build``) for any target; the
    target's :class:`TangentContext` gives its spellings and lowerings."""

    def __init__(self, kernel, facts, slot_args, returns_value, fname, tangent_only=False,
                 context=HOST_TANGENT):
        """``returns_value``: the kernel returns a float, and the tangent function returns
        ``(value, tangent)``, or only the tangent with ``tangent_only`` (the directional
        derivative :mod:`kadj.hessian` differentiates again)."""
        self.ctx = context
        self.k = kernel
        self.a = facts
        self.T = kernel.types
        self.slot_args = tuple(slot_args)
        self.returns_value = returns_value
        self.tangent_only = tangent_only
        self.init_names(kernel, fname)
        self.ns.update(context.namespace)
        self._last_loc = None
        self._g = None

    # ---- the target's intrinsics in the source ------------------------------------------
    def bind(self, obj, hint):
        table = self.ctx.intrinsics
        text = table.name(obj) if table is not None else None
        return text if text is not None else super().bind(obj, hint)

    def expr(self, e):
        table = self.ctx.intrinsics
        if table is not None and isinstance(e, ir.Op):
            text = table.value(e.fn)
            if text is not None:
                return text
        return super().expr(e)

    # ---- names ----------------------------------------------------------------------
    def arr(self, var):
        """Arrays are the user's own: the tangent function runs the forward on them."""
        return self.n(var)

    def dot(self, var):
        """Name of the tangent of ``var`` (``dot_<name>``)."""
        name = self._derived("dot", var, lambda n: "dot_" + n)
        if self.n(var) in self.temp_names:     # a temporary's tangent may be folded too
            self.temp_names.add(name)
        return name

    def tangent_names(self):
        """The names of the tangents (``dot_<name>``) given so far."""
        return {name for name, (kind, _) in self.derived_of.items() if kind == "dot"}

    def dot_buf(self, var):
        """Name of the 1-element tangent buffer of the scalar argument ``var``."""
        return self._derived("dotbuf", var, lambda n: f"dot_{n}_buf")

    def active(self, x):
        return isinstance(x, ir.Var) and x.name in self.a.varied

    def active_array(self, name):
        return name in self.a.varied_arrays

    # ---- the function -------------------------------------------------------------------
    def params(self):
        """The forward's parameters, then one tangent per slot (a scalar's is a
        1-element ``dot_<name>_buf``)."""
        out = [self.n(x) for x in self.k.args]
        for name in self.slot_args:
            out.append(self.dot(name) if isinstance(self.T.get(name), types.Array)
                       else self.dot_buf(name))
        return out

    def build(self):
        k = self.k
        params = self.params()
        prologue = []
        for name in k.args:
            t = self.T.get(name)
            if not isinstance(t, (types.Float, types.Complex)) or \
                    name not in self.a.varied:
                continue
            if name in self.slot_args:
                prologue.append(A.Assign(self.dot(name), f"{self.dot_buf(name)}[0]"))
            else:   # (not differentiated, but reassigned with an active value)
                prologue.append(A.Assign(self.dot(name), self.zero(t)))
        # ``return`` of a kernel that returns nothing reads a constant None: say None
        self.returned_none = set() if self.returns_value else {
            s.value.name for s in ir.walk(k.body)
            if isinstance(s, ir.Return) and isinstance(s.value, ir.Var)} - {
            v for s in ir.walk(k.body) if not isinstance(s, ir.Return)
            for v in ir.stmt_reads(s)}
        body = self.seq(k.body)
        if not self.returns_value and (not body or not isinstance(body[-1], A.Return)):
            body.append(A.Return("None"))
        doc = (f"Tangent (forward mode) of {k.name}: the forward, each active value "
               f"followed by its tangent (generated by kadj).")
        return A.Function(self.fname, tuple(params), doc, prologue, body,
                          temps=self.temp_names)

    # ---- statements ---------------------------------------------------------------------
    def seq(self, stmts):
        out = []
        for s in stmts:
            self.stmt(s, out)
        if all(isinstance(x, A.Comment) for x in out):
            out.append(A.Pass())
        return out

    def stmt(self, s, out):
        if isinstance(s, ir.Assign):
            self.assign(s, out)
        elif isinstance(s, ir.Store):
            self.store(s, out)
        elif isinstance(s, ir.If):
            self.comment(s.loc, out)
            node = A.If(self.o(s.cond))
            out.append(node)
            node.then = self.seq(s.then)
            node.orelse = self.seq(s.orelse) if s.orelse else []
            self._last_loc = None
        elif isinstance(s, ir.ForRange):
            self.comment(s.loc, out)
            bounds = f"{self.o(s.start)}, {self.o(s.stop)}, {self.o(s.step)}"
            node = A.For(self.n(s.index), f"range({bounds})", primal=True)
            out.append(node)
            node.body = self.seq(s.body)
            self._last_loc = None
        elif isinstance(s, ir.Loop):
            self.comment(s.loc, out)
            node = A.While("True", primal=True)
            out.append(node)
            node.body = self.seq(s.body)
            self._last_loc = None
        elif isinstance(s, ir.Break):
            out.append(A.Break())
        elif isinstance(s, ir.Continue):
            out.append(A.Continue())
        elif isinstance(s, ir.Return):
            if self.returns_value:
                self.comment(s.loc, out)
            out.append(A.Return(self._ret_text(s.value)))
        elif isinstance(s, ir.Barrier):
            self.ctx.barrier(self, s, out)
        else:
            raise DifferentiationError(
                f"forward mode does not support the statement {type(s).__name__}",
                kernel=self.k.name, loc=getattr(s, "loc", None),
                construct=type(s).__name__.lower(),
                remedy="use kernel.adjoint (reverse mode) for this kernel")

    def _ret_text(self, value):
        if not self.returns_value:
            return "None" if value is None or value.name in self.returned_none \
                else self.o(value)
        if value is None:
            raise DifferentiationError(
                "a path of the kernel ends without returning its float value",
                kernel=self.k.name, construct="missing return",
                remedy="return a value on every path")
        t = self.k.return_type
        tangent = self.cast(self.dot(value.name), t) if self.active(value) \
            else self.zero(t)
        return tangent if self.tangent_only else f"({self.o(value)}, {tangent})"

    def assign(self, s, out):
        v, e = s.target, s.expr
        if isinstance(e, ir.Alloc) and self.ctx.declare is not None and \
                self.ctx.declare(self, s, out):
            return
        if v not in self.a.varied:
            none = e.src if isinstance(e, ir.Copy) else e
            if v in self.returned_none and isinstance(none, ir.Const) and \
                    none.value is None:
                return
            if isinstance(e, ir.Item) and self.active(e.value):
                self._refuse_item(s)
            out.append(A.Assign(self.n(v), self.expr(e)))
            if isinstance(e, ir.Alloc) and self.active_array(v):
                out.append(A.Assign(self.dot(v), f"np.zeros_like({self.n(v)})"))
            return
        self.comment(s.loc, out)
        t = self.T[v]
        reads_self = any(isinstance(x, ir.Var) and x.name == v for x in ir.operands(e))
        terms, uses_out = self.terms(s, None)
        primal = self.expr(e)
        if uses_out and reads_self:
            tmp = self.fresh("out")
            self.names.setdefault(tmp, tmp)
            terms, _ = self.terms(s, tmp)
            out.append(A.Assign(tmp, primal))
            out.append(A.Assign(self.dot(v), self._sum(terms, t)))
            out.append(A.Assign(self.n(v), tmp))
        elif uses_out:
            out.append(A.Assign(self.n(v), primal))
            out.append(A.Assign(self.dot(v), self._sum(terms, t)))
        else:
            out.append(A.Assign(self.dot(v), self._sum(terms, t)))
            out.append(A.Assign(self.n(v), primal))

    def _sum(self, terms, t):
        if not terms:
            return self.zero(t)
        terms = [_strip(x) for x in terms]
        text = terms[0]
        for term in terms[1:]:
            negated = parse(term)
            if isinstance(negated, ast.UnaryOp) and isinstance(negated.op, ast.USub):
                inner = term[negated.operand.col_offset:negated.operand.end_col_offset]
                joined = combine(text, "-", inner)
            else:
                joined = combine(text, "+", term)
            text = joined or f"({text}) + ({term})"
        return self.cast(text, t)

    def terms(self, s, out_name):
        """The tangent terms (texts) of an active assignment, and whether they read the
        assignment's result (``out_name``: the name standing for it, or the target)."""
        e = s.expr
        if isinstance(e, ir.Copy):
            return ([self.dot(e.src.name)] if self.active(e.src) else []), False
        if isinstance(e, ir.Load):
            arr = e.array.name
            if not self.active_array(arr):
                return [], False
            return [self.elem(self.dot(arr), [self.o(i) for i in e.index])], False
        if isinstance(e, ir.Op):
            term = None if self.ctx.op_tangent is None else self.ctx.op_tangent(self, s)
            if term is not None:
                return [term], False
            return self._op_terms(s, out_name)
        if isinstance(e, ir.Item) and self.active(e.value):
            self._refuse_item(s)
        return [], False    # Attr, Item, Alloc: no derivative flows through them

    def _op_terms(self, s, out_name):
        e = s.expr
        active = [x for x in e.args if self.active(x)]
        for name, x in e.kws:
            if self.active(x):
                raise DifferentiationError(
                    f"the keyword argument {name}= carries a derivative, which forward "
                    "mode does not differentiate", kernel=self.k.name, loc=s.loc,
                    construct=f"keyword argument {name}=",
                    remedy="pass the value positionally")
        if not active or e.fn in rules.NONDIFFERENTIABLE:
            return [], False
        out_var = out_name or s.target
        contribs = rules.expand_call(e, out_var, kernel=self.k.name, loc=s.loc)
        terms, uses_out = [], False
        for x, c in zip(e.args, contribs):
            if c is None or not self.active(x):
                continue
            c = ops._lift(c)
            if out_var in c.variables():
                uses_out = True
            self._g = self.dot(x.name)
            self.sym_g_type = self.T.get(x.name)
            self.sym_out_types = {out_var: self.T.get(s.target)}
            if self._has_complex():
                # a rule gives g * conj(f'(z)) (the conjugate cotangent): the tangent
                # term is f'(z) * dot_z, its conjugate at g = conj(dot_z)
                c = ops.conj_rule(c)
            terms.append(self.sym(c, self.T[s.target]))
        return terms, uses_out

    def _refuse_item(self, s):
        raise DifferentiationError(
            "an element of an active tuple is read by position, which forward mode does "
            "not follow", kernel=self.k.name, loc=s.loc, construct="tuple item",
            remedy="unpack the tuple into separate variables")

    def store(self, s, out):
        if s.accumulate and self.ctx.accumulate is not None:
            return self.ctx.accumulate(self, s, out)
        arr = s.array.name
        index = [self.o(i) for i in s.index]
        op = {"add": "+=", "sub": "-="}.get(s.accumulate, "=")
        if self.active_array(arr):
            self.comment(s.loc, out)
            dtype = self.T[arr].dtype
            tangent = self.dot(s.value.name) if self.active(s.value) else self.zero(dtype)
            out.append(A.Assign(self.elem(self.dot(arr), index), tangent, op))
        out.append(A.Assign(self.elem(self.n(arr), index), self.o(s.value), op))

    def comment(self, loc, out):
        if loc is None or loc == self._last_loc or getattr(loc, "line", None) is None:
            return
        self._last_loc = loc
        try:
            src = linecache.getline(loc.filename, loc.line).strip()
        except Exception:
            src = ""
        fname = (loc.filename or "").split("/")[-1]
        out.append(A.Comment(f"# {fname}:{loc.line}: {src}".rstrip()))


def check_target(target, kernel_name):
    """Forward mode needs the target's tangent writer (:attr:`Target.write_tangent`), or
    is the host's (CPU kernels): refuse the others."""
    if target.name != "cpu" and target.write_tangent is None:
        raise DifferentiationError(
            f"forward mode (jvp) is not available for {target.title} kernels yet",
            kernel=kernel_name, construct="jvp",
            remedy="use the adjoint (reverse mode), or differentiate the kernel's "
                   "@njit version on the CPU")


def build_tangent(kernel, facts, slot_args, returns_value, context=HOST_TANGENT):
    """The tangent function of a kernel as adjoint IR: (Function, writer); the writer
    holds the namespace the source needs.  ``context``: the target's
    (:class:`TangentContext`), the host's by default."""
    w = TangentWriter(kernel, facts, slot_args, returns_value, f"{kernel.name}_jvp",
                      context=context)
    fn = w.build()
    return A.built(readable(fn, w.tangent_names()), "tangent"), w


def readable(fn, tangent_names=()):
    """The readability passes of :mod:`kadj.simplify` that apply to straight-line
    primal code: ``bool()`` of a comparison dropped, single-use temporaries (and their
    tangents) folded into their use, index offsets spelled out; then the sums assigned
    to ``tangent_names`` add their loop-carried term last
    (:func:`kadj.tangent_sums.carried_terms_last`)."""
    drop_bool_casts(fn)
    fold_single_uses(fn)
    inline_index_offsets(fn)
    fold_single_uses(fn)
    drop_orphan_comments(fn)
    carried_terms_last(fn, tangent_names)
    return fn


def write_tangent(kernel, facts, slot_args, returns_value, context=HOST_TANGENT):
    """The :class:`kadj.reverse.AdjointSource` of the tangent function."""
    fn, w = build_tangent(kernel, facts, slot_args, returns_value, context)
    source, supplied = self_contained(render(fn, context.syntax), w.ns)
    return AdjointSource(name=fn.name, source=source, namespace=supplied,
                         param_names=fn.params)
