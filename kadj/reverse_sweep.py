"""The reverse sweep of the adjoint, as adjoint IR: statements in reverse order, each
accumulating its partial derivatives (kadj.rules) times its adjoint into its operands'
adjoints, popping overwritten values back; loops reversed by the strategy the analysis
chose (taped, recomputed, ascending, replayed per iteration)."""
from __future__ import annotations

from numba.core import types

from . import adj_ir as A
from . import ir
from . import ops
from . import rules
from .adj_naming import _add
from .analysis import partial_reads
from .analysis.rewrites import own_rows
from .printer import target_text


class ReverseSweep:
    merge_repeated_loads = False   # see repeated_loads

    def rev(self, stmts, depth, loop_depth, recomputed=frozenset()):
        keys = self.open_accumulators(self.repeated_loads(stmts), depth) \
            if self.merge_repeated_loads else ()
        self.rev_seq(stmts, depth, loop_depth, recomputed)
        self.close_accumulators(keys, depth)

    def rev_seq(self, stmts, depth, loop_depth, recomputed):
        a = self.a
        start = self.b.mark(depth)
        for s in reversed(stmts):
            if isinstance(s, (ir.ForRange, ir.Loop)) and not a.has_rev.get(id(s)) and \
                    id(s) in self.kept:
                self.pop_loop_saves(s, depth)  # values the forward saved around it
                continue
            if not self.needs_reverse(s):
                continue
            if isinstance(s, ir.Assign):
                self.rev_assign(s, depth, recomputed)
            elif isinstance(s, ir.Store):
                self.rev_store(s, depth)
            elif isinstance(s, ir.If):
                self.rev_if(s, depth, loop_depth, recomputed)
            elif isinstance(s, ir.ForRange):
                self.rev_for(s, depth, loop_depth)
            elif isinstance(s, ir.Loop):
                self.rev_loop(s, depth, loop_depth)
            elif isinstance(s, ir.Barrier):
                self.comment(depth, s.loc)
                self.put(depth, A.Barrier("mirrors the forward barrier", loc=s.loc))
            elif isinstance(s, ir.Return):
                if a.active(s.value) and self.returns_value:
                    self.comment(depth, s.loc)
                    t = self.T[s.value.name]
                    op = "=" if s.value.name in self.single_use else "+="
                    self.accumulate(depth, self.adj_var(s.value.name), op,
                                    self.cast("adj_return", t))
        if self.b.only_comments(start):
            self.put(depth, A.Pass())

    def rev_if(self, s, depth, loop_depth, recomputed):
        def has(seq):
            return any(self.needs_reverse(x) for x in seq)
        if not has(s.then) and has(s.orelse):
            self.put(depth, A.If(f"not {self.o(s.cond)}"))
            self.rev(s.orelse, depth + 1, loop_depth, recomputed)
            return
        self.put(depth, A.If(self.o(s.cond)))
        self.rev(s.then, depth + 1, loop_depth, recomputed)
        if has(s.orelse):
            self.b.put_else(depth)
            self.rev(s.orelse, depth + 1, loop_depth, recomputed)

    def adj_var(self, v):
        return A.AdjVar(v, self.adj(v))

    def adj_elem(self, arr, index):
        return A.AdjElem(arr, tuple(index), self.adj(arr), tuple(self.o(i) for i in index))

    def rev_assign(self, s, depth, recomputed):
        a = self.a
        v = s.target
        active = v in a.varied
        if active:
            self.comment(depth, s.loc)
            adjv = self.adj_var(v)
            self_ref = any(isinstance(x, ir.Var) and x.name == v for x in ir.operands(s.expr))
            if self_ref:
                # v = f(v): the rule needs the new v (out) and the old v (operand)
                g = self.fresh("g")
                self.put(depth, A.Assign(g, adjv.name))
                self.put(depth, A.Assign(adjv, self.zero(self.T[v])))
                out_name = self.fresh("out")
                self.put(depth, A.Assign(out_name, self.n(v)))
                if v in a.pushed and v not in recomputed and v not in self.suppressed:
                    self.pop(depth, self.n(v), self.T[v], restores=True, site=id(s))
                for target, text in self.contributions(s, g=g, out_name=out_name):
                    op = "=" if self._is_single_adj(target) else "+="
                    self.accumulate(depth, target, op, text)
                return
            contribs = self.contributions(s)
            reset = v not in self.single_use and (
                self._reassigned(v) or v in a.in_loop or any(
                    isinstance(x, ir.Var) and x.name == v for x in ir.operands(s.expr)))
            if contribs:
                self._g = adjv.name
                if reset and any(isinstance(t, A.AdjVar) and t.var == v
                                 for t, _ in contribs):
                    self._g = self.fresh("g")
                    self.put(depth, A.Assign(self._g, adjv.name))
                    self.put(depth, A.Assign(adjv, self.zero(self.T[v])))
                    reset = False
                for target, text in contribs:
                    op = "=" if self._is_single_adj(target) else "+="
                    self.accumulate(depth, target, op, text)
            if reset:
                self.put(depth, A.Assign(adjv, self.zero(self.T[v])))
        if v in a.pushed and v not in recomputed and v not in self.suppressed and \
                id(s) not in a.replay_fresh and id(s) not in self.moved_saves():
            self.pop(depth, self.n(v), self.T[v], restores=True, site=id(s))

    def contributions(self, s, g=None, out_name=None):
        """(adjoint target, contribution text) pairs for an active assignment."""
        a = self.a
        e = s.expr
        v = s.target
        out = []
        if isinstance(e, ir.Copy):
            if a.active(e.src):
                t = self.T[e.src.name]
                out.append((self.adj_var(e.src.name),
                            self.cast(_real_part(g or self.adj(v), self.T.get(v), t), t)))
        elif isinstance(e, ir.Load):
            arr = e.array.name
            if arr in a.varied_arrays:
                ref = self.adj_elem(arr, e.index)
                ref = self.accumulators.get((arr, tuple(e.index)), ref)
                out.append((ref, self.cast(g or self.adj(v), self.T[arr].dtype)))
        elif isinstance(e, ir.Op) and e.fn in rules.NONDIFFERENTIABLE:
            pass    # piecewise constant (floor, sign, //): no contribution, as in the
            # tangent; such a value is active only where another assignment of its
            # variable is (``v = y // 2.0`` in one branch, ``v = 2.0 * y`` in the other)
        elif isinstance(e, ir.Op):
            contribs = rules.expand_call(e, out_name or v, kernel=self.k.name, loc=s.loc)
            self._g = g or self.adj(v)
            self.sym_g_type, self.sym_out_types = self.T.get(v), {out_name: self.T.get(v)}
            if out_name:
                self.names.setdefault(out_name, out_name)
            merged = {}         # an operand used twice (x * x) gets one contribution
            for x, c in zip(e.args, contribs):
                if c is None or not a.active(x):
                    continue
                c, prev = ops._lift(c), merged.get(x.name)
                merged[x.name] = c if prev is None else \
                    ops.doubled(prev) if ops.same(prev, c) else prev + c
            for name, c in merged.items():
                t = self.T[name]
                out.append((self.adj_var(name), self.cast(self.sym(c, t), t)))
        return out

    def consume(self, depth, ref, dtype):
        """A stored element's incoming adjoint, read, is consumed (API.md)."""
        self.put(depth, A.Consume(ref, self.zero(dtype)))

    def accumulate(self, depth, target, op, text):
        """``target op text``: ``op`` is "=" (a single-use adjoint) or "+="."""
        self.put(depth, A.Accumulate(target, op, text))

    def _reassigned(self, v):
        """Does ``v`` hold more than one value in the kernel: assigned more than once,
        or an argument assigned (``s = 2.0 * s`` on a parameter: its adjoint must be
        consumed at the assignment, before the old value's contributions)."""
        return self.a.assign_count.get(v, 0) + (v in self.k.args) > 1

    def _is_single_adj(self, target):
        """Is ``target`` the adjoint of a variable used once (assigned, not added to)?"""
        return isinstance(target, A.AdjVar) and target.var in self.single_use

    def rev_store(self, s, depth):
        a = self.a
        arr = s.array.name
        if arr not in a.varied_arrays:
            if arr in a.restore_arrays:   # no adjoint: only the overwritten element
                self.comment(depth, s.loc)
                fref = self.elem(self.arr(arr), [self.o(i) for i in s.index])
                self.pop(depth, fref, self.T[arr].dtype, restores=True)
            return
        self.comment(depth, s.loc)
        ref = self.adj_elem(arr, s.index)
        if s.accumulate in ("add", "sub"):  # an increment: the adjoint flows into the value
            if a.active(s.value):
                t = self.T[s.value.name]
                op = {"add": "+=", "sub": "-="}[s.accumulate]
                if s.value.name in self.single_use:
                    op = "=" if op == "+=" else "= -"
                self.accumulate(depth, self.adj_var(s.value.name), op,
                                self.cast(_real_part(target_text(ref), self.T[arr].dtype,
                                                     t), t))
            return
        if a.active(s.value):
            t = self.T[s.value.name]
            op = "=" if s.value.name in self.single_use else "+="
            self.accumulate(depth, self.adj_var(s.value.name), op,
                            self.cast(_real_part(target_text(ref), self.T[arr].dtype, t),
                                      t))
        self.consume(depth, ref, self.T[arr].dtype)
        if arr in a.restore_arrays:
            fref = self.elem(self.arr(arr), [self.o(i) for i in s.index])
            self.pop(depth, fref, self.T[arr].dtype, restores=True)

    # ---- local sums of adjoints -------------------------------------------------------
    def invariant_loads(self, loop):
        """Loads inside ``loop`` whose element does not change during it (index
        variables the loop does not assign, array the loop does not write): their
        adjoints are summed in a local and added to the array once, after the loop."""
        a = self.a
        assigned_in = ir.assigned(loop.body) | {loop.index}
        stored_in = ir.stored_arrays(loop.body)
        found = []
        for x in ir.walk(loop.body):
            if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load) and \
                    x.target in a.varied:
                e = x.expr
                key = (e.array.name, tuple(e.index))
                if e.array.name in a.varied_arrays and e.array.name not in stored_in and \
                        not (ir.var_names(e.index) & assigned_in) and \
                        key not in self.accumulators and key not in found:
                    found.append(key)
        return found

    def repeated_loads(self, stmts):
        """Loads of one element repeated in a statement sequence (``u[i]`` twice in a
        stencil): their adjoints are summed in a local, added to the array once at the
        end of the sequence (a target whose accumulations are atomic merges them: one
        atomic per element and thread instead of one per load)."""
        a = self.a
        if any(isinstance(x, ir.Barrier) for x in ir.walk(stmts)):
            return []  # an accumulation may not move across a barrier
        count = {}
        for x in stmts:
            if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load) and \
                    x.target in a.varied and self.needs_reverse(x):
                e = x.expr
                arr = e.array.name
                if arr not in a.varied_arrays or arr in a.stored or any(
                        not isinstance(v, (ir.Var, ir.Const)) or
                        (isinstance(v, ir.Var) and self._reassigned(v.name))
                        for v in e.index):
                    continue
                key = (arr, tuple(e.index))
                if key not in self.accumulators:
                    count[key] = count.get(key, 0) + 1
        return [k for k, c in count.items() if c > 1]

    def open_accumulators(self, keys, depth):
        for key in keys:
            local = A.Local(self.fresh("acc_" + self.n(key[0])), key[0], key[1])
            self.accumulators[key] = local
            self.put(depth, A.Assign(local, self.zero(self.T[key[0]].dtype)))
        return keys

    def close_accumulators(self, keys, depth, guarded=False):
        """Add each local sum to its element.  ``guarded``: only when the sum is not
        zero, because the loads it sums may not have run (a loop of no trips, a load
        under a branch in the loop): then the element may lie outside the array (a
        thread past the end, ``if i < n`` inside the loop), and the forward never
        touched it."""
        for key in keys:
            arr, index = key
            local = self.accumulators.pop(key)
            if guarded:
                self.put(depth, A.If(f"{local.name} != 0"))
            self.accumulate(depth + guarded, self.adj_elem(arr, index), "+=", local.name)

    # ---- loops ---------------------------------------------------------------------
    def restore_own_rows(self, s, depth):
        """Before replaying an iteration of ``s``: the rows of argument arrays that
        only this iteration touches (analysis.rewrites.own_rows), as the caller passed
        them (the forward sweep left the iteration's results there)."""
        idx = self.n(s.index)
        for x in self.a.replay_shared.get(s.uid, ()):
            if x in self.a.work_arrays and own_rows(self.a, s, x):
                self.put(depth, A.Comment(f"# {self.n(x)}'s row as this iteration "
                                          f"found it"))
                # (element loops: cheaper than a slice copy for short rows)
                index = [idx]
                for axis in range(1, self.T[x].ndim):
                    j = self.fresh("j")
                    self.put(depth + axis - 1,
                             A.For(j, f"range({self.n(x)}.shape[{axis}])"))
                    index.append(j)
                ref = ", ".join(index)
                self.put(depth + self.T[x].ndim - 1,
                         A.Assign(f"{self.arr(x)}[{ref}]", f"{self.n(x)}[{ref}]"))

    def rev_for(self, s, depth, loop_depth):
        keys = self.open_accumulators(self.invariant_loads(s), depth)
        self._rev_for(s, depth, loop_depth)
        self.close_accumulators(keys, depth, guarded=True)

    def strategy(self, s):
        """How loop ``s``'s iterations are reversed."""
        a = self.a
        if s.uid in a.replay:
            return "replayed"
        if isinstance(s, ir.ForRange) and not self._counted(s):
            if s.uid in a.ascending:
                return "ascending"
            taped = any(isinstance(x, ir.Assign) and x.target in a.pushed or
                        isinstance(x, ir.Store) and x.array.name in a.restore_arrays
                        for x in ir.walk(s.body))
            if not taped and self._needed_recompute(a.recompute.get(s.uid, ()), s):
                return "recomputed"
        return "taped"

    def _rev_for(self, s, depth, loop_depth):
        node = A.ReverseLoop(self.strategy(s), s.uid)
        with self.b.group(depth, node):
            self._rev_for_body(s, depth, loop_depth)

    def _rev_for_body(self, s, depth, loop_depth):
        a = self.a
        replay = s.uid in a.replay
        if replay:
            hoist = {"assigned": ir.assigned(s.body) | {s.index}, "amounts": {}}
            self.put(depth, A.Reserve(frame=None, hoist=hoist))
        idx = self.n(s.index)
        lo, hi, st = self.o(s.start), self.o(s.stop), self.o(s.step)
        self.comment(depth, s.loc)
        self.put(depth, A.Comment(f"# reversed: for {idx} in range({lo}, {hi}, {st})"))
        counted = self._counted(s)
        if counted and loop_depth > 0:
            self.pop(depth, self._count_name(s), types.int64)
        self.pop_exit(s, depth)  # (what the loop left, if the forward saved it)
        if counted:
            cnt = self._count_name(s)
            k = self.fresh("k")
            self.put(depth, A.For(k, f"range({cnt} - 1, -1, -1)"))
            self.put(depth + 1, A.Assign(idx, _add(lo, f'{k} * {st}' if st != '1' else k)))
        elif s.uid in a.ascending:
            self.put(depth, A.Comment("# (iterations are independent: their adjoints run "
                                      "in forward order)"))
            self.put(depth, A.For(idx, f"range({lo}, {hi}, {st})"))
        elif st == "1":
            self.put(depth, A.For(idx, f"range({_add(hi, '-1')}, {_add(lo, '-1')}, -1)"))
        elif st == "-1":
            self.put(depth, A.For(idx, f"range({_add(hi, '1')}, {_add(lo, '1')})"))
        else:
            k = self.fresh("k")
            self.put(depth, A.For(k, f"range(_trips({lo}, {hi}, {st}) - 1, -1, -1)"))
            self.put(depth + 1, A.Assign(idx, f"{lo} + {k} * {st}"))
        if replay:
            self.put(depth + 1, A.Comment("# replay this iteration's forward part, "
                                          "recording"))
            self.open_frame(depth + 1, hoist=hoist, body=s.body)
            self._last_loc = None
            self.restore_own_rows(s, depth + 1)
            with self.mode(kept=set(map(id, ir.walk(s.body))), skip_stores=True,
                           nopush=False), \
                    self.b.group(depth + 1, A.Block("replayed iteration")):
                self.fwd(s.body, depth + 1, loop_depth + 1)
            self.close_frame()
            self._last_loc = None
            with self.mode(kept=set(map(id, ir.walk(s.body)))):  # what the replay recorded
                self.rev(s.body, depth + 1, loop_depth + 1, frozenset())
            if id(s) in self.kept:  # the forward sweep saved these before the loop
                for v in reversed(self.replay_pushes(s)):
                    self.pop(depth, self.n(v), self.T[v], site=(s.uid, "replay", v))
            return
        rec = a.recompute.get(s.uid, ())
        recomputed = a.recompute_vars.get(s.uid, set())
        needed_rec = self._needed_recompute(rec, s)
        if needed_rec:
            self.put(depth + 1, A.Comment("# recompute"))
            self.recompute(needed_rec, depth + 1)
        with self.mode(suppressed=self.suppressed | set(a.unrecorded(s.uid))):
            self.rev(s.body, depth + 1, loop_depth + 1, frozenset(recomputed))
        self.pop_fresh(s, depth + 1, self.not_first(s))
        if id(s) in self.kept:
            self.pop_loop_saves(s, depth)

    def needs_reverse(self, s):
        """Does statement ``s`` have reverse code or values to pop?"""
        a = self.a
        if a.has_rev.get(id(s)):
            return True
        if isinstance(s, ir.Assign):
            return (s.target in a.pushed and id(s) in self.kept and
                    s.target not in self.suppressed and id(s) not in a.replay_fresh and
                    id(s) not in self.moved_saves())
        if isinstance(s, ir.If):
            return any(self.needs_reverse(x) for x in s.then + s.orelse)
        if isinstance(s, (ir.ForRange, ir.Loop)):
            return id(s) in self.kept and (
                s.uid in a.loop_saved or
                (isinstance(s, ir.ForRange) and s.uid in a.index_saved))
        return False

    def pop_loop_saves(self, s, depth):
        """Restore what the forward sweep saved before a loop without reverse code."""
        if self.nopush:
            return
        for v in reversed(self.a.loop_saved.get(s.uid, ())):
            self.pop(depth, self.n(v), self.T[v], site=(s.uid, "loop", v))
        if isinstance(s, ir.ForRange) and s.uid in self.a.index_saved:
            self.pop(depth, self.n(s.index), self.T[s.index], site=(s.uid, "index"))

    def _needed_recompute(self, rec, loop):
        """The recomputable statements whose values the reversed body reads."""
        reads = set()
        for x in ir.walk(loop.body):
            if isinstance(x, ir.If):
                # (re-decided in reverse also when it only pops: needs_reverse)
                if self.needs_reverse(x):
                    reads |= ir.var_names((x.cond,))
                continue
            if not self.a.has_rev.get(id(x)):
                continue
            if isinstance(x, ir.Assign) and x.target in self.a.varied:
                reads |= partial_reads(x, self.a)
            elif isinstance(x, ir.Store):
                reads |= ir.var_names(x.index)
            elif isinstance(x, ir.ForRange):
                reads |= ir.var_names((x.start, x.stop, x.step))
        for x in ir.walk(loop.body):
            if isinstance(x, ir.ForRange):
                for r in ir.walk(self.a.recompute.get(x.uid, ())):
                    reads |= ir.stmt_reads(r)
            if isinstance(x, (ir.ForRange, ir.Loop)) and x.uid in self.a.replay:
                # (a replayed loop re-executes its body in reverse: ``w += u / ...``
                # from checkpoints reads this iteration's ``u``)
                for r in ir.walk(x.body):
                    reads |= ir.stmt_reads(r)
        keep = []
        for x in reversed(rec):
            defs = {y.target for y in ir.walk((x,)) if isinstance(y, ir.Assign)}
            if defs & reads:
                keep.append(x)
                for y in ir.walk((x,)):
                    reads |= ir.stmt_reads(y)
        return list(reversed(keep))

    def recompute(self, stmts, depth):
        for s in stmts:
            if isinstance(s, ir.Assign):
                self.put(depth, A.Assign(self.n(s.target), self.expr(s.expr)))
            elif isinstance(s, ir.If):
                if not s.then:
                    self.put(depth, A.If(f"not {self.o(s.cond)}"))
                    self.recompute(s.orelse, depth + 1)
                    continue
                self.put(depth, A.If(self.o(s.cond)))
                self.recompute(s.then, depth + 1)
                if s.orelse:
                    self.b.put_else(depth)
                    self.recompute(s.orelse, depth + 1)

    def rev_loop(self, s, depth, loop_depth):
        with self.b.group(depth, A.ReverseLoop("taped", s.uid)):
            cnt = self._count_name(s)
            self.comment(depth, s.loc)
            self.put(depth, A.Comment("# reversed: while loop, replayed for its recorded "
                                      "trip count"))
            if loop_depth > 0:
                self.pop(depth, cnt, types.int64)
            self.pop_exit(s, depth)
            k = self.fresh("k")
            self.put(depth, A.For(k, f"range({cnt})"))
            with self.mode(suppressed=self.suppressed | set(self.a.unrecorded(s.uid))):
                self.rev(s.body, depth + 1, loop_depth + 1)
            self.pop_fresh(s, depth + 1, self.not_first(s, k))
            if id(s) in self.kept:
                self.pop_loop_saves(s, depth)

    # ---- values a loop defines afresh in each iteration (analysis.first_def) ----------
    def pop_fresh(self, loop, depth, cond):
        """At the end of a reversed iteration of ``loop`` but the first forward one:
        restore the previous iteration's values (ForwardSweep.push_fresh)."""
        defs, form = self.fresh_saves(loop)
        if not defs:
            return
        self.put(depth, A.If(cond))
        for x in reversed(defs):
            self.pop(depth + 1, self.n(x.target), self.T[x.target], restores=True,
                     site=id(x))

    def pop_exit(self, loop, depth):
        """Before reversing ``loop``: the values it left (ForwardSweep.push_exit)."""
        defs, form = self.fresh_saves(loop)
        if not defs or form != "guarded+exit":
            return
        cond = self.loop_ran(loop)
        if cond is not None:
            self.put(depth, A.If(cond))
            depth += 1
        for x in reversed(defs):
            self.pop(depth, self.n(x.target), self.T[x.target], restores=True,
                     site=id(x))


def _real_part(text, of, to):
    """The adjoint ``text`` of a complex value (type ``of``) flowing into a real one
    (type ``to``: a real value stored into a complex array, or copied into a complex
    variable) is its real part; otherwise ``text``."""
    if isinstance(of, types.Complex) and not isinstance(to, types.Complex):
        return f"({text}).real"
    return text
