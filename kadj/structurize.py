"""Structure: typed Numba IR -> kadj's region tree (:mod:`kadj.ir`).

The CFG numba builds from the bytecode is walked from the entry block.  A branch becomes
an :class:`~kadj.ir.If` whose arms end at the branch's immediate post-dominator (computed
on a graph where loop exits, loop back edges and returns all lead to one virtual exit);
a natural loop (numba's ``CFGraph.loops()``) becomes a :class:`~kadj.ir.ForRange` when
its header iterates a ``range``/``prange``, and a ``while True`` :class:`~kadj.ir.Loop`
otherwise, with ``break``/``continue`` where the body jumps to the loop's follow block
or header.  Arms that leave by ``break``/``continue``/``return`` are closed there, so
those statements are always last in their sequence (code after such an ``if`` moves
into its other arm).  A ``return`` inside a loop is lowered to a flag and ``break``s.

A loop with several exits (``while True`` left by several ``break``s, some with code
of their own, beside ``return``s) leaves by a ``break`` after setting an exit selector;
the code of each exit runs after the loop, dispatched on the selector, up to the block
where the exits meet.  When short-circuit conditions (``if a and b: break``) would
copy the rest of a loop once per operand, the kernel is structured again with each
such condition decided into a flag first (:mod:`kadj.condition_flags`).

``raise`` and ``assert``: the adjoint differentiates the path that does not raise.  A
branch arm from which every path raises is dropped (the branch disappears); a raise
reached unconditionally is kept as a marker until loop returns are lowered, then its
enclosing ``if`` keeps the other arm.  A raise left on every path of the kernel or of a
loop body is refused.

Anything it cannot structure raises :class:`~kadj.DifferentiationError`.
"""
from __future__ import annotations

import math
import operator
from dataclasses import replace

import numpy as np
from numba import literal_unroll, prange
from numba.core import ir as nir
from numba.core import types
from numba.core.analysis import compute_cfg_from_blocks
from numba.np import numpy_support

from . import array_lowering
from . import ir
from . import rules
from . import view_webs
from .complex_parts import METHODS, PARTS, method_call
from .condition_flags import flag_condition
from .errors import DifferentiationError, InternalError
from .frontend import resolve_value

ALLOCATORS = {np.empty, np.zeros, np.ones, np.empty_like, np.zeros_like, np.ones_like}
_RANGE = {range, prange}
_EXIT = "<exit>"
_MAX_BLOCK_VISITS = 16


class _Ctx:
    __slots__ = ("header", "follow", "stop", "header_alt", "exits")

    def __init__(self, header=None, follow=None, stop=None, header_alt=None, exits=None):
        self.header, self.follow, self.stop = header, follow, stop
        self.header_alt = header_alt if header_alt is not None else header
        self.exits = exits or {}  # other loop exits: label -> (selector var, value)

    def sub(self, stop):
        return _Ctx(self.header, self.follow, stop, self.header_alt, self.exits)


class _Tangled(Exception):
    """Some block was copied too often: structure again with condition flags."""


class Structurizer:
    flag_conditions = False  # short-circuit conditions as flags (kadj.condition_flags)

    def __init__(self, tk, extra_callee_ok=None):
        self.tk = tk
        self.fir = tk.func_ir
        self.blocks = self.fir.blocks
        self.cfg = compute_cfg_from_blocks(self.blocks)
        self.loops = self.cfg.loops()
        self.types = {k: types.unliteral(v) for k, v in tk.typemap.items()}
        self.tuples = {}  # scalarized tuple variable -> element count
        self.visits = {}
        self.uid = 0
        self.prelude = []  # statements run first (constant tables)
        self._tables = {}  # (dtype, bytes) -> the prelude variable holding that table
        self.extra_callee_ok = extra_callee_ok or (lambda fn: False)
        self._refuse_unstructured()
        view_webs.split(self)
        self._find_array_aliases()
        self._find_scalarized_tuples()

    # ---- errors -------------------------------------------------------------------
    def error(self, msg, loc=None, construct=None, remedy=None):
        raise DifferentiationError(msg, kernel=self.tk.name, loc=loc, construct=construct,
                                   remedy=remedy)

    def _refuse_unstructured(self):
        """try/except and literal_unroll, which numba lowers to control flow of its
        own, are refused where they occur."""
        from numba.core.unsafe import eh

        for label in sorted(self.blocks):
            for stmt in self.blocks[label].body:
                if not (isinstance(stmt, nir.Assign) and
                        isinstance(stmt.value, (nir.Global, nir.FreeVar))):
                    continue
                v = stmt.value.value
                if v is eh.mark_try_block:
                    self.error("try/except blocks are not supported in differentiated "
                               "kernels", loc=stmt.loc, construct="try/except",
                               remedy="remove the try/except: check the inputs before "
                                      "calling the kernel, or branch with if/else on "
                                      "the condition that would raise")
                if v is literal_unroll:
                    self.error("loops over literal_unroll() are not supported",
                               loc=stmt.loc, construct="literal_unroll loop",
                               remedy="loop over range(n) and index an array (or a "
                                      "module-level tuple) of the values, or write the "
                                      "iterations out")

    # ---- entry ----------------------------------------------------------------------
    def run(self):
        entry = self.cfg.entry_point()
        body = self.seq(entry, _Ctx())
        body = _lower_loop_returns(body, self)
        body = self.drop_raising(body)
        body = self.prelude + body
        array_lowering.check_no_views(self, body)
        if "_retflag" in self.__dict__:
            body.insert(0, ir.Assign(self._retflag, ir.Copy(ir.Const(False))))
        for _ in range(3):  # $it -> $phi -> i
            body = _rename_loop_indices(body)
        first_loc = self.blocks[entry].loc
        raises = any(isinstance(b.terminator, (nir.StaticRaise, nir.DynamicRaise))
                     for b in self.blocks.values())
        return ir.Kernel(name=self.tk.name, args=self.tk.arg_names, body=tuple(body),
                         types=self.types, return_type=self.tk.return_type, loc=first_loc,
                         raises=raises)

    def fresh(self, base, typ):
        self.uid += 1
        name = f"_{base}{self.uid}"
        self.types[name] = typ
        return name

    # ---- control flow -----------------------------------------------------------
    def resolve_trivial(self, label):
        seen = set()
        while label not in seen:
            seen.add(label)
            blk = self.blocks[label]
            body = [s for s in blk.body if not isinstance(s, nir.Del)]
            if len(body) == 1 and isinstance(body[0], nir.Jump):
                label = body[0].target
            else:
                break
        return label

    def seq(self, label, ctx, entering=None):
        out = []
        while True:
            if label is None:
                return out
            rl = self.resolve_trivial(label)
            if ctx.stop is not None and (label == ctx.stop or rl == ctx.stop):
                return out
            if ctx.header is not None and label in (ctx.header, ctx.header_alt) and \
                    label != entering:
                out.append(ir.Continue())
                return out
            if ctx.follow is not None and rl == ctx.follow:
                out.append(ir.Break())
                return out
            if rl in ctx.exits:
                sel, value = ctx.exits[rl]
                out.append(ir.Assign(sel, ir.Copy(ir.Const(value))))
                out.append(ir.Break())
                return out
            if (label in self.loops or self.is_range_header(label)) and label != entering:
                loop_stmt, follow = self.loop(label, ctx)
                out.extend(loop_stmt)
                label = follow
                continue
            entering = None
            self.visits[label] = self.visits.get(label, 0) + 1
            if self.visits[label] > _MAX_BLOCK_VISITS:
                if not self.flag_conditions:
                    raise _Tangled()
                self.error("the control flow is too tangled to structure",
                           loc=self.blocks[label].loc, construct="control flow",
                           remedy="simplify the nesting of break/continue/return")
            block = self.blocks[label]
            for stmt in block.body[:-1]:
                out.extend(self.convert(stmt))
            term = block.terminator
            if isinstance(term, nir.Return):
                out.append(ir.Return(self.operand(term.value), loc=term.loc))
                return out
            if isinstance(term, nir.Jump):
                label = term.target
                continue
            if isinstance(term, nir.Branch):
                merge = self.ipdom(label, ctx)
                stop = None if merge == _EXIT else self.resolve_trivial(merge)
                sub = ctx.sub(stop)
                raising = [self.raises_only(t) for t in (term.truebr, term.falsebr)]
                if any(raising):  # ``if bad: raise ...``: keep the other path only
                    if all(raising):
                        out.append(_Raises(term.loc))
                        return out
                    out.extend(self.seq(term.falsebr if raising[0] else term.truebr, sub))
                    if stop is None:
                        return out
                    label = stop
                    continue
                flagged = flag_condition(self, term, sub, stop) \
                    if self.flag_conditions else None
                if flagged is not None:  # ``if a and b: break``: decide, then branch
                    decide, flag, on_true, on_false = flagged
                    out.extend(decide)
                    cond, on_true, on_false = ir.Var(flag), on_true, on_false
                else:
                    cond, on_true, on_false = self.operand(term.cond), term.truebr, \
                        term.falsebr
                then = self.seq(on_true, sub)
                orelse = self.seq(on_false, sub)
                out.append(ir.If(cond, tuple(then), tuple(orelse), loc=term.loc))
                if stop is None:
                    return out
                label = stop
                continue
            if isinstance(term, (nir.StaticRaise, nir.DynamicRaise)):
                out.append(_Raises(term.loc))
                return out
            self.error(f"unsupported terminator {type(term).__name__}", loc=term.loc,
                       construct=type(term).__name__,
                       remedy="rewrite this control flow with if/for/while")

    def succs(self, label, ctx):
        term = self.blocks[label].terminator
        if isinstance(term, (nir.Return, nir.StaticRaise, nir.DynamicRaise)) or \
                self.raises_only(label):
            return [_EXIT]
        out = []
        for t in term.get_targets():
            if self.raises_only(t):  # a raising arm does not decide where arms merge
                continue
            rt = self.resolve_trivial(t)
            if (ctx.header is not None and t in (ctx.header, ctx.header_alt)) or \
                    (ctx.follow is not None and rt == ctx.follow) or rt in ctx.exits:
                out.append(_EXIT)
            else:
                out.append(t)
        return out

    def ipdom(self, label, ctx):
        return self.common_pdom([label], ctx, strict=True)

    def common_pdom(self, labels, ctx, strict=False):
        """Nearest block post-dominating all ``labels`` (``strict``: other than the
        label itself), on the sub-graph reachable from them."""
        # the reachable blocks, each after its successors where the graph allows
        # (depth-first post-order): the iteration then settles in a pass or two
        nodes, order, succ = set(), [], {}
        for root in labels:
            if root == _EXIT or root in nodes:
                continue
            nodes.add(root)
            succ[root] = self.succs(root, ctx)
            stack = [(root, iter(succ[root]))]
            while stack:
                n, rest = stack[-1]
                for s in rest:
                    if s != _EXIT and s not in nodes:
                        nodes.add(s)
                        succ[s] = self.succs(s, ctx)
                        stack.append((s, iter(succ[s])))
                        break
                else:
                    stack.pop()
                    order.append(n)
        allnodes = nodes | {_EXIT}
        pdom = {n: set(allnodes) for n in nodes}
        pdom[_EXIT] = {_EXIT}
        changed = True
        while changed:
            changed = False
            for n in order:
                ss = succ[n]
                new = set.intersection(*(pdom[s] for s in ss)) if ss else set()
                new = new | {n}
                if new != pdom[n]:
                    pdom[n], changed = new, True
        cands = set.intersection(*(pdom[lb] for lb in labels))
        if strict:
            cands -= set(labels)
        if not cands:
            return _EXIT
        return max(cands, key=lambda c: len(pdom[c]))

    def returns_only(self, label):
        """Does every path from ``label`` run straight into a ``return``?"""
        seen = set()
        while label not in seen:
            seen.add(label)
            term = self.blocks[label].terminator
            if isinstance(term, nir.Return):
                return True
            if isinstance(term, nir.Jump):
                label = term.target
                continue
            return False
        return False

    def raises_only(self, label):
        """Does every path from ``label`` end in a ``raise`` (or a failed assert)?"""
        if "_raising" not in self.__dict__:
            raise_terms = (nir.StaticRaise, nir.DynamicRaise)
            work = [lb for lb, b in self.blocks.items()
                    if isinstance(b.terminator, raise_terms)]
            raising = set(work)
            while work:  # a block all of whose successors raise raises (cycles do not)
                for pred, _ in self.cfg.predecessors(work.pop()):
                    term = self.blocks[pred].terminator
                    if pred not in raising and isinstance(term, (nir.Jump, nir.Branch)) \
                            and all(t in raising for t in term.get_targets()):
                        raising.add(pred)
                        work.append(pred)
            self._raising = raising
        return label in self._raising

    def drop_raising(self, stmts):
        """Keep the non-raising path: an ``if`` one of whose arms always raises becomes
        its other arm; a raise on every path of the kernel or of a loop body is
        refused."""
        body, raises = _drop_raising(stmts)
        if raises:
            self._refuse_raise(body[-1].loc, "on every path through the kernel")
        for s in ir.walk(body):
            if isinstance(s, (ir.ForRange, ir.Loop)) and s.body and \
                    isinstance(s.body[-1], _Raises):
                self._refuse_raise(s.body[-1].loc, "in every iteration of its loop")
            if isinstance(s, ir.Loop) and not any(
                    isinstance(t, (ir.Break, ir.Return)) for t in ir.walk_level(s.body)):
                self.error("this loop ends only by raising an exception, so the path "
                           "that does not raise never ends", loc=s.loc,
                           construct="loop left only by raise",
                           remedy="give the loop an exit (break or a condition) and "
                                  "raise after it, or raise outside the kernel")
        return body

    def _refuse_raise(self, loc, where):
        self.error(f"this raise statement (or failing assert) is reached {where}, so "
                   "there is no path without an exception to differentiate", loc=loc,
                   construct="raise",
                   remedy="make the raise conditional (if ...: raise) or check the "
                          "inputs before calling the kernel, outside it")

    def is_range_header(self, label):
        body = [x for x in self.blocks[label].body if not isinstance(x, nir.Del)]
        return bool(body) and isinstance(body[0], nir.Assign) and \
            isinstance(body[0].value, nir.Expr) and body[0].value.op == "iternext"

    def loop(self, header, outer=None):
        outer = outer or _Ctx()
        info = self.loops.get(header)
        if info is None:  # a for loop whose body never reaches a second iteration
            from types import SimpleNamespace
            info = SimpleNamespace(body={header}, exits=set())
            term = self.blocks[header].terminator
            info.body.add(term.truebr)  # (so that only the exit counts as outside)
        body = set(info.body)
        follow = None
        cands = []
        # (the header may be a block that only jumps to the loop's test: numba's
        # ``for`` after a statement that ends a block; its test is the exit to take)
        real = self.resolve_trivial(header)
        if real not in body:
            real = header
        hterm = self.blocks[real].terminator
        if isinstance(hterm, nir.Branch):
            outs = [t for t in hterm.get_targets() if t not in body]
            if len(outs) == 1:
                cands.append(outs[0])
        for b in sorted(body):
            term = self.blocks[b].terminator
            if {header, real} & set(term.get_targets()) and isinstance(term, nir.Branch):
                outs = [t for t in term.get_targets() if t not in body]
                if len(outs) == 1:
                    cands.append(outs[0])
        for c in cands:  # the exit the loop condition takes, not an early return
            if not self.returns_only(c) and not self.raises_only(c):
                follow = c
                break
        if follow is None and cands:
            follow = cands[0]
        fallback = follow is None
        if fallback:  # ``while True`` left only by breaks (and returns, raises)
            follow = self._break_target(header, info, outer)
        follow = self.resolve_trivial(follow)
        # other exits that rejoin the code after the loop (an inlined helper's return
        # inside its loop): leave by a selector value and a break, dispatch after it
        others = []
        for e in sorted(info.exits):
            re_ = self.resolve_trivial(e)
            if re_ != follow and re_ not in others and not self.raises_only(re_) and (
                    not self.returns_only(re_) or
                    fallback and self._runs_into(re_, follow)):
                others.append(re_)
        exits, sel = {}, None
        if others:
            sel = self.fresh("exit", types.int64)
            exits = {e: (sel, j + 1) for j, e in enumerate(others)}
        ctx = _Ctx(header=header, follow=follow, stop=None, header_alt=real, exits=exits)
        rng = self.range_header(real)
        loc = self.blocks[header].loc
        self.uid += 1
        uid = self.uid
        if rng is not None:
            index, start, stop_, step, extra, body_entry, parallel = rng
            stmts = list(extra) + self.seq(body_entry, ctx)
            stmts = _strip_trailing_continue(stmts)
            pre, start, stop_, step = self.freeze_bounds(start, stop_, step, stmts, loc)
            loop_stmts = pre + [ir.ForRange(index, start, stop_, step, tuple(stmts),
                                            loc=loc, uid=uid, parallel=parallel)]
        else:
            stmts = self.seq(real, ctx, entering=real)
            stmts = _strip_trailing_continue(stmts)
            loop_stmts = [ir.Loop(tuple(stmts), loc=loc, uid=uid)]
        if not exits:
            return loop_stmts, follow
        merge = self.common_pdom([follow] + others, outer)
        stop = None if merge == _EXIT else self.resolve_trivial(merge)
        chain = tuple(self.seq(follow, outer.sub(stop)))
        for e in reversed(others):
            _, value = exits[e]
            cond = self.fresh("took_exit", types.boolean)
            arm = tuple(self.seq(e, outer.sub(stop)))
            chain = (ir.Assign(cond, ir.Op(operator.eq, (ir.Var(sel), ir.Const(value))),
                               loc=loc),
                     ir.If(ir.Var(cond), arm, chain, loc=loc))
        return ([ir.Assign(sel, ir.Copy(ir.Const(0)), loc=loc)] + loop_stmts +
                list(chain)), stop

    def _break_target(self, header, info, outer):
        """The block after a loop whose condition is no branch of its own: the block
        where its exits (after jump-only blocks) meet, else the first exit that neither
        returns nor raises; the other exits are dispatched after the loop by an exit
        selector."""
        exits = []
        for e in sorted(info.exits):
            re_ = self.resolve_trivial(e)
            if re_ not in exits:
                exits.append(re_)
        if not exits:
            self.error("this loop never ends: no break, return or condition leaves it",
                       loc=self.blocks[header].loc, construct="endless loop",
                       remedy="give the loop a condition or a break")
        kept = [e for e in exits if not self.raises_only(e)]
        if len(kept) > 1:
            meet = self.common_pdom(kept, outer)
            if meet != _EXIT and meet not in info.body:
                return meet
        normal = [e for e in kept if not self.returns_only(e)]
        return (normal or kept or exits)[0]

    def _runs_into(self, label, target):
        """Does ``label`` reach ``target`` through straight-line blocks (jumps)?"""
        seen = set()
        while label not in seen:
            if label == target:
                return True
            seen.add(label)
            term = self.blocks[label].terminator
            if not isinstance(term, nir.Jump):
                return False
            label = term.target
        return False

    def freeze_bounds(self, start, stop, step, body, loc):
        """Loop bounds are evaluated once at loop entry: copy any bound variable the
        body reassigns, so the reverse sweep sees the entry values."""
        pre = []
        written = ir.assigned(body)
        out = []
        for nm, b in (("lo", start), ("hi", stop), ("st", step)):
            if isinstance(b, ir.Var) and b.name in written:
                fresh = self.fresh(nm, self.types[b.name])
                pre.append(ir.Assign(fresh, ir.Copy(b), loc=loc))
                b = ir.Var(fresh)
            out.append(b)
        return (pre, *out)

    def range_header(self, header):
        blk = self.blocks[header]
        body = [s for s in blk.body if not isinstance(s, nir.Del)]
        first = body[0]
        if not (isinstance(first, nir.Assign) and isinstance(first.value, nir.Expr)
                and first.value.op == "iternext"):
            return None
        it = first.value.value
        defn = self._chase(it)
        if not (isinstance(defn, nir.Expr) and defn.op == "getiter"):
            self.error("only loops over range() or prange() are supported",
                       loc=first.loc, construct="for loop over an iterable",
                       remedy="loop over range(len(x)) and index x instead")
        call = self._chase(defn.value)
        callee = None
        if isinstance(call, nir.Expr) and call.op == "call":
            try:
                callee = resolve_value(self.fir, call.func)
            except (LookupError, AttributeError):
                callee = None
        if callee not in _RANGE:
            self.error("only loops over range() or prange() are supported",
                       loc=first.loc, construct="for loop over an iterable",
                       remedy="loop over range(len(x)) and index x instead")
        args = [self.operand(a) for a in call.args]
        if len(args) == 1:
            start, stop, step = ir.Const(0), args[0], ir.Const(1)
        elif len(args) == 2:
            start, stop, step = args[0], args[1], ir.Const(1)
        else:
            start, stop, step = args
        pf = ps = None
        extra = []
        for s in body[1:-1]:
            if isinstance(s, nir.Assign) and isinstance(s.value, nir.Expr) \
                    and s.value.op == "pair_first":
                pf = s.target.name
            elif isinstance(s, nir.Assign) and isinstance(s.value, nir.Expr) \
                    and s.value.op == "pair_second":
                ps = s.target.name
            else:
                extra.extend(self.convert(s))
        term = body[-1]
        if not (isinstance(term, nir.Branch) and term.cond.name == ps and pf):
            raise InternalError("unexpected range-loop header shape")
        return pf, start, stop, step, extra, term.truebr, callee is prange

    def _chase(self, var):
        for _ in range(20):
            try:
                d = self.fir.get_definition(var)
            except Exception:
                return None
            if isinstance(d, nir.Var):
                var = d
                continue
            return d
        return None

    # ---- statements -------------------------------------------------------------
    def _find_array_aliases(self):
        """Array variables defined once as a copy of another array (a helper's array
        parameter after inlining, ``a = x``) are replaced by the array they name, when
        that array is never rebound (``$t = un; un = u; u = $t``, a buffer swap, keeps
        its temporary: :mod:`kadj.buffer_swap`)."""
        defs = {}
        for blk in self.blocks.values():
            for s in blk.body:
                if isinstance(s, nir.Assign):
                    defs.setdefault(s.target.name, []).append(s.value)
        self.alias = {}
        for name, vals in defs.items():
            if len(vals) == 1 and isinstance(vals[0], nir.Var) and \
                    isinstance(self.types.get(name), types.Array) and \
                    len(defs.get(vals[0].name, ())) <= 1:
                self.alias[name] = vals[0].name

        def chase(n):
            seen = 0
            while n in self.alias and seen < 50:
                n = self.alias[n]
                seen += 1
            return n

        self.alias = {k: chase(k) for k in self.alias}

    def _find_direct_index_tuples(self):
        """Index tuples built right before a single array access are used directly:
        ``u[i, j]`` rather than a tuple of copies."""
        counts = {}
        for blk in self.blocks.values():
            for s in blk.body:
                for v in s.list_vars():
                    counts[v.name] = counts.get(v.name, 0) + 1
        self.direct_index = {}
        for blk in self.blocks.values():
            body = blk.body
            for pos, s in enumerate(body):
                if not (isinstance(s, nir.Assign) and isinstance(s.value, nir.Expr)
                        and s.value.op == "build_tuple"):
                    continue
                name = s.target.name
                if counts.get(name) != 2:  # its definition and one use
                    continue
                items = s.value.items
                item_names = {v.name for v in items}
                for later in body[pos + 1:]:
                    used = {v.name for v in later.list_vars()}
                    if name in used:
                        idx = None
                        if isinstance(later, (nir.SetItem,)) and later.index.name == name:
                            idx = True
                        elif isinstance(later, nir.Assign) and isinstance(later.value,
                                                                          nir.Expr) and \
                                later.value.op in ("getitem", "static_getitem") and \
                                getattr(later.value, "index", None) is not None and \
                                isinstance(later.value.index, nir.Var) and \
                                later.value.index.name == name:
                            idx = True
                        if idx:
                            self.direct_index[name] = tuple(items)
                        break
                    if isinstance(later, nir.Assign) and later.target.name in item_names:
                        break

    def _find_scalarized_tuples(self):
        self._find_direct_index_tuples()
        call_args = set()
        for blk in self.blocks.values():
            for s in blk.body:
                if isinstance(s, nir.Assign) and isinstance(s.value, nir.Expr) and \
                        s.value.op == "call":
                    call_args.update(v.name for v in s.value.args)
                    call_args.update(v.name for _, v in s.value.kws)
        self.tuple_values = set()
        for blk in self.blocks.values():
            for s in blk.body:
                if isinstance(s, nir.Assign) and isinstance(s.value, nir.Expr) and \
                        s.value.op == "build_tuple":
                    if s.target.name in call_args:
                        self.tuple_values.add(s.target.name)  # e.g. a shape
                    else:
                        self.tuples[s.target.name] = len(s.value.items)
        changed = True
        while changed:
            changed = False
            for blk in self.blocks.values():
                for s in blk.body:
                    if not isinstance(s, nir.Assign) or s.target.name in self.tuples:
                        continue
                    src = None
                    if isinstance(s.value, nir.Var):
                        src = s.value.name
                    elif isinstance(s.value, nir.Expr) and s.value.op in ("exhaust_iter",
                                                                           "cast"):
                        src = s.value.value.name
                    elif isinstance(s.value, nir.Expr) and \
                            s.value.op in ("static_getitem", "getitem") and \
                            isinstance(self.types.get(s.target.name), types.BaseTuple):
                        src = s.value.value.name  # a tuple taken out of a tuple
                    if src in self.tuples:
                        typ = self.types.get(s.target.name)
                        self.tuples[s.target.name] = len(typ) if isinstance(
                            typ, types.BaseTuple) else self.tuples[src]
                        changed = True
        # element variables; elements that are tuples themselves are flattened too
        work = list(self.tuples.items())
        while work:
            t, n = work.pop()
            typ = self.types.get(t)
            for k in range(n):
                et = typ[k] if isinstance(typ, types.BaseTuple) else types.float64
                self.types[f"{t}__{k}"] = et
                if isinstance(et, types.BaseTuple):
                    self.tuples[f"{t}__{k}"] = len(et)
                    work.append((f"{t}__{k}", len(et)))

    def constant_table(self, var, vtype, loc):
        """A read-only array holding the values of ``var``, a tuple of numbers known
        when the kernel is compiled (a module-level or closure tuple, or a tuple of
        literals), for indexing it with a variable; None if it is not one."""
        if not isinstance(vtype, types.UniTuple) or \
                not isinstance(vtype.dtype, (types.Integer, types.Float)):
            return None
        d = self._chase(var)
        try:
            values = resolve_value(self.fir, var)
        except (LookupError, AttributeError, KeyError):
            items = [self.const_of(v) for v in d.items] if isinstance(d, nir.Expr) and \
                d.op == "build_tuple" else [None]
            if any(c is None for c in items):
                return None
            values = tuple(c.value for c in items)
        if not isinstance(values, tuple) or len(values) != len(vtype) or not all(
                isinstance(v, (int, float, np.integer, np.floating)) and
                not isinstance(v, bool) for v in values):
            return None
        hint = d.name if isinstance(d, (nir.Global, nir.FreeVar)) else "table"
        array = np.array(values, dtype=np.dtype(str(vtype.dtype)))
        key = (array.dtype.str, array.tobytes())
        if key not in self._tables:
            name = self.fresh("table", types.Array(vtype.dtype, 1, "C", readonly=True))
            self._tables[key] = name
            self.prelude.append(ir.Assign(name, ir.Copy(ir.GlobalRef(array, name=hint)),
                                          loc=loc))
        return self._tables[key]

    def const_of(self, var):
        try:
            d = self.fir.get_definition(var)
        except Exception:
            return None
        if isinstance(d, nir.Const):
            if d.value is None or isinstance(d.value, (bool, int, float, complex, str, np.number,
                                                       np.bool_)):
                return ir.Const(d.value)
            return None
        if isinstance(d, (nir.Global, nir.FreeVar)):
            v = d.value
            if isinstance(v, (bool, int, float, complex, str, np.number, np.bool_)):
                return ir.Const(v)
        if isinstance(d, nir.Expr) and d.op == "getattr":
            try:
                v = resolve_value(self.fir, var)
            except (LookupError, AttributeError):
                return None
            if isinstance(v, (bool, int, float, str, np.number, np.bool_)):
                return ir.Const(v)
        return None

    def operand(self, var):
        if var is None:
            return None
        c = self.const_of(var)
        if c is not None:
            return c
        return ir.Var(self.alias.get(var.name, var.name))

    def avar(self, var):
        return ir.Var(self.alias.get(var.name, var.name))

    def index_operands(self, index_var):
        direct = self.direct_index.get(index_var.name)
        if direct is not None:
            return tuple(self.operand(v) for v in direct)
        if index_var.name in self.tuples:
            return tuple(ir.Var(f"{index_var.name}__{k}")
                         for k in range(self.tuples[index_var.name]))
        typ = self.types.get(index_var.name)
        if isinstance(typ, types.BaseTuple):
            return (ir.Var(index_var.name),)
        return (self.operand(index_var),)

    def convert(self, stmt):
        loc = stmt.loc
        if isinstance(stmt, nir.Del):
            return []
        if isinstance(stmt, (nir.SetItem, nir.StaticSetItem)):
            arr = stmt.target
            if not isinstance(self.types.get(arr.name), types.Array):
                self.error("item assignment to a non-array", loc=loc,
                           construct="setitem")
            if array_lowering.is_view(self, arr.name) or isinstance(
                    self.types.get(stmt.value.name), types.Array) or \
                    isinstance(stmt.index, slice) or (isinstance(stmt.index, tuple) and any(
                        isinstance(i, slice) for i in stmt.index)) or (
                    isinstance(stmt.index, nir.Var) and _has_slice(self.types.get(
                        stmt.index.name))):   # u[1:-1] = ..., view[i] = ...
                return array_lowering.lowering(self).setitem(stmt, loc)
            if isinstance(stmt, nir.StaticSetItem):
                idx = stmt.index
                if isinstance(idx, tuple) and not all(
                        isinstance(i, (int, np.integer)) for i in idx) and \
                        getattr(stmt, "index_var", None) is not None:
                    # numba took attributes (cuda.threadIdx.x) for constants
                    idx = None
                if isinstance(idx, tuple):
                    index = tuple(ir.Const(i) for i in idx)
                elif isinstance(idx, (int, np.integer)):
                    index = (ir.Const(int(idx)),)
                elif getattr(stmt, "index_var", None) is not None and not isinstance(
                        idx, slice):
                    # numba took an attribute (cuda.threadIdx.x) for a constant
                    self._check_index(stmt.index_var, loc)
                    index = self.index_operands(stmt.index_var)
                else:
                    self.error("slice assignment is not supported", loc=loc,
                               construct="slice assignment",
                               remedy="write the elements in a loop")
            else:
                self._check_index(stmt.index, loc)
                index = self.index_operands(stmt.index)
            return [ir.Store(self.avar(arr), index, self.operand(stmt.value), loc=loc)]
        if isinstance(stmt, nir.Print):
            return []
        if isinstance(stmt, (nir.StaticRaise, nir.DynamicRaise)):
            self.error("raise statements (and asserts) are not supported inside "
                       "differentiated kernels", loc=loc, construct="raise",
                       remedy="validate the inputs before calling the kernel, outside it")
        if not isinstance(stmt, nir.Assign):
            self.error(f"unsupported statement {type(stmt).__name__}", loc=loc,
                       construct=type(stmt).__name__)
        tgt = stmt.target.name
        val = stmt.value
        ttype = self.types.get(tgt)
        if isinstance(val, nir.Arg) or tgt in self.alias:
            return []
        if isinstance(ttype, (types.RangeType, types.RangeIteratorType, types.Module,
                              types.Function, types.Dispatcher, types.NumberClass,
                              types.DType)) or \
                type(ttype).__name__ in ("Module", "Function", "Dispatcher", "NumberClass",
                                         "DType"):
            return []
        if isinstance(val, (nir.Const, nir.Global, nir.FreeVar)):
            if self.const_of(stmt.target) is not None or val.value is None:
                return []
            v = val.value
            if isinstance(v, (bool, int, float, complex, np.number, np.bool_)):
                return [ir.Assign(tgt, ir.Copy(ir.Const(v)), loc=loc)]
            if isinstance(v, np.ndarray):
                return [ir.Assign(tgt, ir.Copy(ir.GlobalRef(v, name=getattr(val, "name",
                                                                              "glob"))),
                                  loc=loc)]
            if isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v):
                return [ir.Assign(tgt, ir.Copy(ir.Const(v)), loc=loc)]
            return []  # modules, functions: resolved where they are called
        if tgt in self.direct_index:
            return []
        if tgt in getattr(self, "tuple_values", ()):
            for v in val.items:
                if isinstance(self.types.get(v.name), types.Float):
                    self.error("a tuple of floats passed to a function is not supported",
                               loc=loc, construct="tuple argument",
                               remedy="pass the values as separate arguments")
            return [ir.Assign(tgt, ir.Op(ir.make_tuple, tuple(self.operand(v)
                                                            for v in val.items)), loc=loc)]
        if tgt in self.tuples:
            return self.convert_tuple(tgt, val, loc)
        if isinstance(val, nir.Var):
            if isinstance(ttype, types.Array) and self.operand(val) == ir.Var(tgt):
                return []   # y = y.1 after an in-place y += x
            return [ir.Assign(tgt, ir.Copy(self.operand(val)), loc=loc)]
        if not isinstance(val, nir.Expr):
            self.error(f"unsupported value {val}", loc=loc)
        return self.convert_expr(tgt, val, loc)

    def copy_tuple(self, dst, src, loc):
        """Element-wise copies ``dst = src`` of a flattened (possibly nested) tuple."""
        if isinstance(self.types.get(dst), types.SliceType):
            return []   # (a slice is read where it indexes an array, never as a value)
        if dst not in self.tuples:
            return [ir.Assign(dst, ir.Copy(ir.Var(src)), loc=loc)]
        if src not in self.tuples:
            self.error("this tuple cannot be followed through the kernel", loc=loc,
                       construct="tuple", remedy="unpack the tuple into scalars first")
        out = []
        for k in range(self.tuples[dst]):
            out += self.copy_tuple(f"{dst}__{k}", f"{src}__{k}", loc)
        return out

    def convert_tuple(self, tgt, val, loc):
        if isinstance(val, nir.Expr) and val.op == "build_tuple":
            out = []
            for k, v in enumerate(val.items):
                if isinstance(self.types.get(v.name), types.SliceType):
                    continue    # read where the tuple indexes an array (a view)
                if f"{tgt}__{k}" in self.tuples:
                    out += self.copy_tuple(f"{tgt}__{k}", v.name, loc)
                else:
                    out.append(ir.Assign(f"{tgt}__{k}", ir.Copy(self.operand(v)), loc=loc))
            return out
        if isinstance(val, nir.Expr) and val.op in ("static_getitem", "getitem"):
            k = val.index if val.op == "static_getitem" else None
            if k is None:
                c = self.const_of(val.index)
                k = c.value if c is not None else None
            if not isinstance(k, (int, np.integer)):
                self.error("tuples must be indexed with constant integers", loc=loc,
                           construct="tuple index")
            return self.copy_tuple(tgt, f"{val.value.name}__{int(k)}", loc)
        src = val.name if isinstance(val, nir.Var) else val.value.name
        return self.copy_tuple(tgt, src, loc)

    def _check_index(self, index_var, loc):
        typ = self.types.get(index_var.name)
        elems = list(typ) if isinstance(typ, types.BaseTuple) else [typ]
        for t in elems:
            if not isinstance(t, (types.Integer, types.Boolean)):
                self.error("only integer indices are supported (no slices or array "
                           "indices)", loc=loc, construct=f"index of type {typ}",
                           remedy="index elements with integers inside a loop")

    def convert_expr(self, tgt, e, loc):
        op = e.op
        ttype = self.types.get(tgt)
        if op in ("binop", "inplace_binop", "unary"):
            fn = e.immutable_fn if op == "inplace_binop" else e.fn
            args = (e.lhs, e.rhs) if op != "unary" else (e.value,)
            if fn in (operator.is_, operator.is_not) and op == "binop":
                same = _identity_by_type(*(self.types.get(a.name) for a in args))
                if same is not None:      # ``w is None`` for an array w: False
                    value = same if fn is operator.is_ else not same
                    return [ir.Assign(tgt, ir.Copy(ir.Const(value)), loc=loc)]
            if any(isinstance(self.types.get(a.name), types.Array) for a in args):
                return array_lowering.lowering(self).binop(tgt, e, loc)
            return [ir.Assign(tgt, ir.Op(fn, tuple(self.operand(a) for a in args)),
                              loc=loc)]
        if op == "call":
            return self.convert_call(tgt, e, loc)
        if op == "getattr":
            vtype = self.types.get(e.value.name)
            if isinstance(vtype, types.Array) and (array_lowering.is_view(
                    self, e.value.name) or e.attr in array_lowering.METHODS):
                return array_lowering.lowering(self).attr(tgt, e, loc)
            if isinstance(vtype, types.Array) and e.attr in ("shape", "size", "ndim"):
                return [ir.Assign(tgt, ir.Attr(self.avar(e.value), e.attr), loc=loc)]
            if isinstance(vtype, types.Complex) and e.attr in PARTS:  # z.real, z.imag
                return [ir.Assign(tgt, ir.Op(PARTS[e.attr], (self.operand(e.value),)),
                                  loc=loc)]
            if isinstance(vtype, types.Float) and e.attr in ("real", "imag"):
                # a real number's parts (x.real is x, x.imag is 0): what a tangent of
                # complex(a, b).real along a real direction reads
                part = ir.Copy(self.operand(e.value)) if e.attr == "real" else \
                    ir.Copy(ir.Const(np.float32(0.0) if vtype.bitwidth == 32 else 0.0))
                return [ir.Assign(tgt, part, loc=loc)]
            if isinstance(vtype, types.Complex) and e.attr in METHODS:  # z.conjugate
                return []                                 # (read where it is called)
            if self.const_of(ir_var(tgt, loc)) is not None:
                return []
            try:
                obj = resolve_value(self.fir, ir_var(tgt, loc))
            except (LookupError, AttributeError):
                obj = None
            if isinstance(obj, np.ndarray):
                return [ir.Assign(tgt, ir.Copy(ir.GlobalRef(obj, name=e.attr)), loc=loc)]
            try:
                base = resolve_value(self.fir, e.value)
            except (LookupError, AttributeError):
                pass
            else:
                v = getattr(base, e.attr, None)
                if isinstance(v, (bool, int, float, complex, np.number, np.bool_)):
                    # a module's number (math.inf, np.pi) given to a variable assigned
                    # elsewhere too (m = math.inf, then m = min(m, x[i]) in a loop)
                    return [ir.Assign(tgt, ir.Copy(ir.Const(v)), loc=loc)]
                return []   # a module's function: resolved where it is called
            self.error(f"attribute '.{e.attr}' is not supported", loc=loc,
                       construct=f"getattr {e.attr}", remedy=_attr_remedy(e.attr))
        if op in ("static_getitem", "getitem", "typed_getitem"):
            vtype = self.types.get(e.value.name)
            if isinstance(vtype, types.Array):
                if isinstance(ttype, types.Array) or \
                        array_lowering.is_view(self, e.value.name):   # x[1:-1], x[i, :]
                    return array_lowering.lowering(self).getitem(tgt, e, loc)
                if op == "static_getitem" and (e.index_var is None or (
                        isinstance(e.index, (int, np.integer)) or
                        (isinstance(e.index, tuple) and all(
                            isinstance(i, (int, np.integer)) for i in e.index)))):
                    idx = e.index if isinstance(e.index, tuple) else (e.index,)
                    if not all(isinstance(i, (int, np.integer)) for i in idx):
                        self.error("slices are not supported", loc=loc, construct="slice")
                    index = tuple(ir.Const(int(i)) for i in idx)
                else:
                    iv = e.index_var if op == "static_getitem" else e.index
                    self._check_index(iv, loc)
                    index = self.index_operands(iv)
                return [ir.Assign(tgt, ir.Load(self.avar(e.value), index), loc=loc)]
            if isinstance(vtype, types.BaseTuple):
                k = e.index if op == "static_getitem" else None
                if k is None:
                    c = self.const_of(e.index)
                    k = c.value if c is not None else None
                if not isinstance(k, (int, np.integer)):
                    table = None if op != "getitem" else \
                        self.constant_table(e.value, vtype, loc)
                    if table is not None:  # COEFFS[k] with COEFFS a constant tuple
                        return [ir.Assign(tgt, ir.Load(ir.Var(table),
                                                       (self.operand(e.index),)), loc=loc)]
                    self.error("tuples must be indexed with constant integers", loc=loc,
                               construct="tuple index",
                               remedy="pass the values as an array and index the array, "
                                      "or index the tuple with constant integers")
                if e.value.name in self.tuples:
                    return [ir.Assign(tgt, ir.Copy(ir.Var(f"{e.value.name}__{int(k)}")),
                                      loc=loc)]
                return [ir.Assign(tgt, ir.Item(ir.Var(e.value.name), int(k)), loc=loc)]
            self.error(f"indexing a value of type {vtype} is not supported", loc=loc,
                       construct="getitem")
        if op in ("cast", "exhaust_iter"):
            return [ir.Assign(tgt, ir.Copy(self.operand(e.value)), loc=loc)]
        if op in ("getiter", "iternext", "pair_first", "pair_second"):
            self.error("only loops over range() or prange() are supported", loc=loc,
                       construct="iterator",
                       remedy="loop over range(len(x)) and index x instead")
        if op in ("build_list", "build_set", "build_map", "list_comprehension"):
            self.error("lists, sets and dicts are not supported in differentiated "
                       "kernels", loc=loc, construct=op.replace("build_", ""),
                       remedy="use a tuple of constants, a scratch array (np.empty) "
                              "allocated outside loops, or an array argument")
        self.error(f"the expression '{op}' is not supported", loc=loc, construct=op,
                   remedy="rewrite it with scalar operations and element-wise loops")

    def convert_call(self, tgt, e, loc):
        method = method_call(self.fir, self.types, e.func)
        if method is not None and not e.args and not e.kws:   # z.conjugate()
            return [ir.Assign(tgt, ir.Op(method[0], (self.operand(method[1]),)),
                              loc=loc)]
        try:
            fn = resolve_value(self.fir, e.func)
        except (LookupError, AttributeError):
            lowered = array_lowering.lowering(self).method(tgt, e, loc)   # a.sum()
            if lowered is not None:
                return lowered
            self.error("cannot resolve the called function statically (a function "
                       "passed as an argument, or chosen at run time)", loc=loc,
                       construct="dynamic call",
                       remedy="call the function by its name in the kernel: make the "
                              "kernel in a factory that closes over the function "
                              "(def make(f): @njit def k(...): ... f(...) ...; return k), "
                              "one kernel per function, and differentiate that")
        if fn in _RANGE:
            return []
        if fn is slice:
            return []   # read where the slice indexes an array
        if e.vararg is not None:
            self.error("star-arguments are not supported", loc=loc, construct="*args")
        if fn in ALLOCATORS:
            # (shape or array, then dtype and order: resolved statically, never emitted)
            args = (self.operand(e.args[0]),) + tuple(
                self._kw_operand(a) for a in e.args[1:]) if e.args else ()
            kws = tuple((k, self._kw_operand(v)) for k, v in e.kws)
            return [ir.Assign(tgt, ir.Alloc(fn, args, kws), loc=loc)]
        args = tuple(self.operand(a) for a in e.args)
        kws = tuple((k, self._kw_operand(v)) for k, v in e.kws)
        fname = getattr(fn, "__name__", str(fn))
        if any(fn is f for f in (enumerate, zip, reversed, iter)):
            self.error("only loops over range() or prange() are supported", loc=loc,
                       construct=f"for loop over {fname}()",
                       remedy="loop over range(len(x)) and index x instead")
        if _is_random(fn):
            self.error(f"random numbers ({fname}()) cannot be differentiated: the "
                       "adjoint would draw different ones", loc=loc,
                       construct=f"call to {fname}",
                       remedy="draw the random numbers outside the kernel and pass them "
                              "in as an array")
        arg_types = [self.types.get(a.name) for a in e.args]
        if any(isinstance(t, types.Array) for t in arg_types) and (
                fn is not len or array_lowering.is_view(self, e.args[0].name)):
            lowered = array_lowering.lowering(self).call(tgt, e, fn, fname, loc)
            if lowered is None:
                array_lowering.lowering(self).refuse(f"whole-array call {fname}()", loc)
            return lowered
        ttype = self.types.get(tgt)
        if isinstance(ttype, types.Array):
            msg, remedy = _array_call_refusal(fn, fname)
            self.error(msg, loc=loc, construct=f"call to {fname}", remedy=remedy)
        if rules.lookup(fn) is not None or fn in rules.NONDIFFERENTIABLE or \
                self.extra_callee_ok(fn):
            return [ir.Assign(tgt, ir.Op(fn, args, kws), loc=loc)]
        float_involved = isinstance(ttype, types.Float) or any(
            isinstance(t, types.Float) for t in arg_types)
        if not float_involved:
            return [ir.Assign(tgt, ir.Op(fn, args, kws), loc=loc)]
        remedy = (f"register a derivative with @kadj.register_adjoint({fname}), or mark "
                  "the arguments that flow into it non-differentiable (wrt=...)")
        if isinstance(ttype, types.Complex):
            remedy = "complex-valued kernels are not supported yet"
        self.error(f"no derivative rule for {fname}()", loc=loc,
                   construct=f"call to {fname}", remedy=remedy)

    def _kw_operand(self, var):
        c = self.const_of(var)
        if c is not None:
            return c
        t = self.types.get(var.name)
        if isinstance(t, (types.DType, types.NumberClass)):  # x.dtype, np.int64
            scalar = numpy_support.as_dtype(t.dtype).type
            return ir.GlobalRef(scalar, name=f"np.{scalar.__name__}")
        try:
            obj = resolve_value(self.fir, var)
            return ir.GlobalRef(obj, name=_qualname(obj))
        except (LookupError, AttributeError):
            return ir.Var(var.name)


def _has_slice(typ):
    elems = list(typ) if isinstance(typ, types.BaseTuple) else [typ]
    return any(isinstance(t, types.SliceType) for t in elems)


def _attr_remedy(attr):
    """What to do instead of an unsupported attribute (``.T``, ``.reshape``...)."""
    if attr in ("T", "transpose"):
        return ("index the element of the transpose directly: x[j, i] instead of "
                "x.T[i, j]")
    if attr in ("reshape", "ravel", "flatten", "flat"):
        return ("index the original array with computed indices (y[i // n, i % n] for "
                "the i-th element of a flattened y), or pass the array in with the shape "
                "the kernel needs")
    return ("read array elements by index, and .shape, .size or .ndim; compute other "
            "values outside the kernel and pass them in as arguments")


def _array_call_refusal(fn, fname):
    """(message, remedy) for a call that creates an array other than the allocators."""
    if fn in (np.arange, np.linspace):
        return (f"np.{fname}() is not supported in differentiated kernels",
                "loop over range(...) and use the loop index directly, or build the "
                "index array outside the kernel and pass it in as an argument")
    if fn in (np.full, np.full_like):
        return (f"np.{fname}() is not supported in differentiated kernels",
                "allocate the array with np.empty(...) (outside loops) and fill it in a "
                "loop: for i in range(n): w[i] = value")
    return (f"{fname}() creates an array, which is not supported in differentiated "
            "kernels (only np.empty/zeros/ones and their _like forms)",
            "allocate a scratch array with np.empty or np.zeros (outside loops) and fill "
            "it in a loop, or pass the array in as an argument")


def _is_random(fn):
    import random

    module = getattr(fn, "__module__", None) or ""
    return module.startswith("numpy.random") or module == "random" or \
        isinstance(getattr(fn, "__self__", None), random.Random)


def ir_var(name, loc):
    return nir.Var(None, name, loc)


def _qualname(obj):
    for mod, prefix in ((np, "np"), (math, "math")):
        name = getattr(obj, "__name__", None)
        if name and getattr(mod, name, None) is obj:
            return f"{prefix}.{name}"
    return getattr(obj, "__name__", "obj")


def _identity_by_type(a, b):
    """``x is y`` decided by the types alone (as numba types it): True for two Nones,
    False for None and a value that cannot be None (an array, a number); None when
    the values decide (an optional, objects)."""
    none = [isinstance(t, types.NoneType) for t in (a, b)]
    if all(none):
        return True
    if any(none):
        other = b if none[0] else a
        if isinstance(other, (types.Array, types.Number, types.Boolean, types.BaseTuple)):
            return False
    return None


class _Raises:
    """Marker, during structuring only: the path reaching it raises an exception."""

    __slots__ = ("loc",)

    def __init__(self, loc):
        self.loc = loc


def _drop_raising(stmts):
    """(statements without the raising paths, whether the sequence always raises)."""
    out = []
    for s in stmts:
        if isinstance(s, _Raises):
            return out + [s], True
        if isinstance(s, ir.If):
            then, t_raises = _drop_raising(s.then)
            orelse, e_raises = _drop_raising(s.orelse)
            if t_raises and e_raises:
                return out + [_Raises(s.loc)], True
            if t_raises or e_raises:
                out.extend(orelse if t_raises else then)
                continue
            out.append(replace(s, then=tuple(then), orelse=tuple(orelse)))
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            body, _ = _drop_raising(s.body)  # (a body that always raises is refused)
            out.append(replace(s, body=tuple(body)))
        else:
            out.append(s)
    return out, False


def _strip_trailing_continue(stmts):
    if stmts and isinstance(stmts[-1], ir.Continue):
        return stmts[:-1]
    return stmts


def _has_return(stmts):
    return any(isinstance(s, ir.Return) for s in ir.walk(stmts))


def _lower_loop_returns(stmts, st, in_loop=False):
    """Rewrite ``return`` inside loops as (result, flag, break), with a check of the
    flag after each loop."""
    out = []
    state = {}
    for idx, s in enumerate(stmts):
        if isinstance(s, ir.If):
            s = replace(s, then=tuple(_lower_loop_returns(s.then, st, in_loop)),
                        orelse=tuple(_lower_loop_returns(s.orelse, st, in_loop)))
            out.append(s)
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            body = _lower_loop_returns(s.body, st, True)
            if _has_return(body) and _returns_as_after(body, stmts[idx + 1:]):
                # the loop is followed by the very return its returns make (Python
                # 3.12 copies ``return total`` to the end of a ``break``): breaks
                out.append(replace(s, body=tuple(_returns_to_breaks(body, None, None))))
                continue
            if _has_return(body):
                flag = st.__dict__.setdefault("_retflag", st.fresh("returned", types.boolean))
                rv = st.__dict__.setdefault(
                    "_retval", st.fresh("result", st.tk.return_type)
                    if isinstance(st.tk.return_type, (types.Number, types.Boolean)) else None)
                body = _returns_to_breaks(body, flag, rv)
                s = replace(s, body=tuple(body))
                rest = _lower_loop_returns(list(stmts[idx + 1:]), st, in_loop)
                ret = ir.Return(ir.Var(rv) if rv else None, loc=s.loc)
                out.append(s)
                out.append(ir.If(ir.Var(flag), (ret,), tuple(rest), loc=s.loc))
                state["done"] = True
                break
            out.append(replace(s, body=tuple(body)))
        else:
            out.append(s)
    return out


def _returned(seq, k):
    """What ``seq[k]`` (a ``return``) returns: None, or the name of the variable, seen
    through a copy into a temporary just before it (``$ret = total; return $ret``)."""
    value = seq[k].value
    if value is None:
        return None
    if not isinstance(value, ir.Var):
        return False
    prev = seq[k - 1] if k > 0 else None
    if isinstance(prev, ir.Assign) and prev.target == value.name and \
            isinstance(prev.expr, ir.Copy) and isinstance(prev.expr.src, ir.Var):
        return prev.expr.src.name
    return value.name


def _body_returns(stmts):
    """What each ``return`` of a loop body returns (:func:`_returned`); its nested
    loops' returns were lowered already."""
    out = []
    for k, s in enumerate(stmts):
        if isinstance(s, ir.Return):
            out.append(_returned(stmts, k))
        elif isinstance(s, ir.If):
            out += _body_returns(s.then) + _body_returns(s.orelse)
    return out


def _returns_as_after(body, after):
    """Whether every ``return`` in the loop body ``body`` returns what the statements
    ``after`` the loop return when they are that one return (and a copy into its
    temporary): the same variable, unchanged by a break, or nothing; then each
    ``return`` may be a ``break``."""
    after = list(after)
    if not after or not isinstance(after[-1], ir.Return) or len(after) > 2:
        return False
    value = _returned(after, len(after) - 1)
    if value is False or (len(after) == 2 and not (
            isinstance(after[0], ir.Assign) and after[-1].value is not None
            and after[0].target == after[-1].value.name)):
        return False
    return all(v == value for v in _body_returns(body))


def _returns_to_breaks(stmts, flag, rv):
    """Each ``return`` becomes a break, after setting ``flag`` (and the result ``rv``)
    when ``flag`` is given."""
    out = []
    for s in stmts:
        if isinstance(s, ir.Return):
            if rv is not None and s.value is not None and s.value != ir.Var(rv):
                out.append(ir.Assign(rv, ir.Copy(s.value), loc=s.loc))
            if flag is not None:
                out.append(ir.Assign(flag, ir.Copy(ir.Const(True)), loc=s.loc))
            out.append(ir.Break(loc=s.loc))
        elif isinstance(s, ir.If):
            out.append(replace(s, then=tuple(_returns_to_breaks(s.then, flag, rv)),
                               orelse=tuple(_returns_to_breaks(s.orelse, flag, rv))))
        else:
            out.append(s)  # nested loops were lowered already
    return out


def _rename_loop_indices(stmts):
    """``for $it in range(..): i = $it`` -> ``for i in range(..)`` (keeps the user's loop
    variable name).  A name reused by several loops (``for i`` twice) is renamed in each
    when it is read only inside those loops."""
    counts = {}
    for s in ir.walk(stmts):
        if isinstance(s, ir.Assign):
            counts[s.target] = counts.get(s.target, 0) + 1
    reads = {}
    for s in ir.walk(stmts):
        for v in ir.stmt_reads(s):
            reads[v] = reads.get(v, 0) + 1
    loops_of = {}
    for s in ir.walk(stmts):
        if isinstance(s, ir.ForRange) and s.body:
            first = s.body[0]
            if isinstance(first, ir.Assign) and first.expr == ir.Copy(ir.Var(s.index)) and \
                    reads.get(s.index, 0) == 1 and not first.target.startswith("_"):
                loops_of.setdefault(first.target, []).append(s)
    ok = set()
    for v, loops in loops_of.items():
        if counts.get(v) != len(loops):
            continue
        inside = set()
        for lp in loops:
            inside |= set(map(id, ir.walk(lp.body)))
        if all(id(s) in inside for s in ir.walk(stmts) if v in ir.stmt_reads(s)):
            ok.add(v)

    def fix(seq):
        out = []
        for s in seq:
            if isinstance(s, ir.ForRange):
                body = list(fix(s.body))
                index = s.index
                if body and isinstance(body[0], ir.Assign) and \
                        body[0].expr == ir.Copy(ir.Var(index)) and body[0].target in ok:
                    index = body[0].target
                    body.pop(0)
                out.append(replace(s, index=index, body=tuple(body)))
            elif isinstance(s, ir.Loop):
                out.append(replace(s, body=tuple(fix(s.body))))
            elif isinstance(s, ir.If):
                out.append(replace(s, then=tuple(fix(s.then)), orelse=tuple(fix(s.orelse))))
            else:
                out.append(s)
        return out

    return fix(stmts)


def run_structurizer(cls, *args):
    """``cls(*args).run()``; when the control flow copies some block too often (a loop
    with several ``if a and b: break``), structured again with short-circuit
    conditions computed into flags (:mod:`kadj.condition_flags`).  An ``if`` whose
    condition variable its own arms assign is then decided by a copy of it
    (:mod:`kadj.if_conditions`)."""
    from .if_conditions import copy_self_assigned_conditions
    try:
        return copy_self_assigned_conditions(cls(*args).run())
    except _Tangled:
        pass
    st = cls(*args)
    st.flag_conditions = True
    return copy_self_assigned_conditions(st.run())


def structurize(tk, extra_callee_ok=None):
    """Typed kernel -> :class:`kadj.ir.Kernel` (scratch arrays allocated inside loops
    hoisted before them: :mod:`kadj.scratch_loops`)."""
    from . import scratch_loops
    return scratch_loops.hoist(run_structurizer(Structurizer, tk, extra_callee_ok))
