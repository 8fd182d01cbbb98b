"""The forward sweep of the adjoint: the kernel's live statements, as adjoint IR, with
pushes of the values the reverse sweep needs (and the tape frames they belong to)."""
from __future__ import annotations

from numba.core import types

from . import adj_ir as A
from . import ir
from .analysis import fresh_definitions
from .tape_plan import Frame, FramePlanner


class ForwardSweep:
    # ---- tapes -------------------------------------------------------------------
    growable_tape = True     # the tape grows (reservations, capacity checks)

    def tape_of(self, t):
        """The tape kind of values of type ``t`` (f64, f32, i64)."""
        if isinstance(t, types.Float):
            kind = "f32" if t.bitwidth == 32 else "f64"
        else:
            kind = "i64"
        self.tapes.add(kind)
        return kind

    def push(self, depth, value_text, t, saves=None, counted=True, site=None):
        """Push ``value_text`` (of type ``t``); ``saves``: the location of the statement
        about to overwrite it (a ``# save`` comment names its line); ``counted``: False
        when the frame's reservation already covers it (``push_exit``); ``site``: the
        kernel assignment whose old value this saves (:mod:`kadj.dead_saves`)."""
        if self.nopush:
            return
        if isinstance(t, types.Complex):   # its real and imaginary parts, in turn
            for part in ("real", "imag"):
                self.push(depth, f"({value_text}).{part}", t.underlying_float, saves,
                          counted)
            return
        kind = self.tape_of(t)
        what = value_text
        if not isinstance(t, types.Float) and t != types.int64:
            # an int64 is stored as it is (``int()`` of it is numba's overload, compiled
            # once per process for nothing)
            value_text = f"int({value_text})"
        frame = self.frames[-1]
        if self.growable_tape:
            self._push_seq += 1
            self.put(depth, A.CapacityCheck(kind=kind, frame=frame, seq=self._push_seq))
        note = None
        if saves is not None and getattr(saves, "line", None) is not None:
            where = f"{(saves.filename or '').split('/')[-1]}:{saves.line}"
            note = f"save {what} (overwritten at {where})"
        self.put(depth, A.Push(kind, value_text, loc=self._last_loc, note=note, site=site))
        if counted:
            frame.counts[kind] = frame.counts.get(kind, 0) + 1

    def pop(self, depth, target_text, t, restores=False, site=None):
        if isinstance(t, types.Complex):   # (pushed as its real, then imaginary part)
            im, re = self.fresh("im"), self.fresh("re")
            self.pop(depth, im, t.underlying_float)
            self.pop(depth, re, t.underlying_float)
            self.put(depth, A.Assign(target_text, self.cast(f"complex({re}, {im})", t)))
            return
        self.put(depth, A.Pop(self.tape_of(t), target_text,
                              boolean=isinstance(t, types.Boolean),
                              note=f"restore {target_text}" if restores else None,
                              site=site))

    def open_frame(self, depth, trip=None, operands=(), hoist=None, assigned=None,
                   body=(), trip_src=None, per_trip=False):
        """Start a frame (kadj.tape_plan).  ``trip``: the trip-count text of a ``for``
        loop; ``operands``: the variables it reads; ``assigned``: the variables the
        loop body assigns (None: nothing can be absorbed); ``hoist``: a replayed
        iteration, whose reservation goes in front of the reversed loop (the tape is
        back at the same height after each reversed iteration).  ``body``: the loop
        body (its loop-invariant definitions let a nested trip count be computed
        before the loop); ``trip_src``: the (start, stop, step) operands;
        ``per_trip``: a ``while`` loop's frame, opened at each iteration."""
        parent = self.frames[-1] if self.frames else None
        if hoist is not None:
            assigned = hoist["assigned"]
        fr = Frame(depth=depth, trip=trip, operands=set(operands), hoist=hoist,
                   assigned=assigned, parent=parent, cond=self._cond_level,
                   body=tuple(body), trip_src=trip_src, per_trip=per_trip)
        if parent is not None:
            parent.children.append(fr)
        self.frames.append(fr)
        self.put(depth, A.Reserve(frame=fr))

    def close_frame(self):
        fr = self.frames.pop()
        fr.closed = self._push_seq
        if not self.frames:
            FramePlanner(self.o).plan(fr)

    # ---- liveness of the forward sweep ------------------------------------------
    def liveness(self):
        a = self.a
        rvars = set()
        for rv in a.recompute_vars.values():
            rvars |= rv
        from .analysis import _reads_outside
        checkpointed = set()
        for s in ir.walk(self.k.body):
            if isinstance(s, (ir.ForRange, ir.Loop)) and s.uid in a.replay:
                carried = a.checkpoint.get(s.uid, ())  # restored from checkpoints
                for v in ir.assigned(s.body):
                    if v not in carried and not _reads_outside(a, s, {v}):
                        rvars.add(v)
                checkpointed |= set(carried)
        live_out = (set(a.needed) - rvars) | checkpointed
        self.kept = set()
        self._nopush_live = False
        self._live(self.k.body, live_out, None)

    def _stmt_needed(self, s):
        a = self.a
        if isinstance(s, ir.Assign):
            if s.target in a.pushed and not self._nopush_live:
                return True
            if isinstance(s.expr, ir.Alloc):
                return s.target in a.loaded or s.target in a.varied_arrays
            return False
        if isinstance(s, ir.Store):
            return s.array.name in a.loaded
        if isinstance(s, ir.Return):
            return True
        return False

    def _live(self, stmts, live, ctx):
        for s in reversed(stmts):
            if isinstance(s, ir.Assign):
                if s.target in live or self._stmt_needed(s) or (
                        isinstance(s.expr, ir.Alloc) and s.target in live):
                    self.kept.add(id(s))
                    live = (live - {s.target}) | ir.stmt_reads(s)
                    if s.target in self.a.pushed and not self._nopush_live:
                        live = live | {s.target}
            elif isinstance(s, ir.Store):
                if self._stmt_needed(s):
                    self.kept.add(id(s))
                    live = live | ir.stmt_reads(s)
            elif isinstance(s, ir.Return):
                self.kept.add(id(s))
                live = live | (ir.stmt_reads(s) if self.has_retval else set())
            elif isinstance(s, ir.Barrier):
                if self.keep_barriers:
                    self.kept.add(id(s))
            elif isinstance(s, ir.Break):
                self.kept.add(id(s))
                live = set(ctx[0])
            elif isinstance(s, ir.Continue):
                self.kept.add(id(s))
                live = set(ctx[1])
            elif isinstance(s, ir.If):
                l1 = self._live(s.then, live, ctx)
                l2 = self._live(s.orelse, live, ctx)
                inner = any(id(x) in self.kept for x in ir.walk(s.then + s.orelse))
                if inner:
                    self.kept.add(id(s))
                    live = l1 | l2 | ir.stmt_reads(s)
            elif isinstance(s, (ir.ForRange, ir.Loop)):
                live = self._live_loop(s, live)
        return live

    def _live_loop(self, s, live):
        out = set(live)
        head = set(live)
        with self.mode(_nopush_live=self._nopush_live or s.uid in self.a.replay):
            for _ in range(4):
                body_in = self._live(s.body, head, (out, head))
                new_head = head | body_in
                if isinstance(s, ir.ForRange):
                    new_head.discard(s.index)
                if new_head == head:
                    break
                head = new_head
            inner = any(id(x) in self.kept for x in ir.walk(s.body))
        counted = self.a.has_rev.get(id(s)) and (
            not self._nopush_live or s.uid in self.a.checkpoint) and (
            isinstance(s, ir.Loop) or self._counted(s))
        if inner or counted:
            self.kept.add(id(s))
            live = head | out | ir.stmt_reads(s)
            if isinstance(s, ir.ForRange):
                live.discard(s.index)
        return live

    def find_single_use(self):
        """Variables defined once and read once, later in the same statement sequence:
        their adjoint is assigned (not accumulated) at the use and read at the def."""
        a = self.a
        uses, where_def, where_use = {}, {}, {}

        def visit(seq):
            for pos, s in enumerate(seq):
                if isinstance(s, ir.Assign):
                    where_def[s.target] = (id(seq), pos)
                    ops_ = ir.operands(s.expr)
                elif isinstance(s, ir.Store):
                    ops_ = (s.array,) + tuple(s.index) + (s.value,)
                elif isinstance(s, ir.If):
                    ops_ = (s.cond,)
                    visit(s.then)
                    visit(s.orelse)
                elif isinstance(s, ir.ForRange):
                    ops_ = (s.start, s.stop, s.step)
                    visit(s.body)
                elif isinstance(s, ir.Loop):
                    ops_ = ()
                    visit(s.body)
                elif isinstance(s, ir.Return):
                    ops_ = (s.value,) if s.value is not None else ()
                else:
                    ops_ = ()
                for x in ops_:
                    if isinstance(x, ir.Var):
                        uses[x.name] = uses.get(x.name, 0) + 1
                        where_use[x.name] = (id(seq), pos)

        visit(self.k.body)
        out = set()
        for v in a.varied:
            if v in self.k.args or v in a.pushed or a.assign_count.get(v) != 1:
                continue
            if uses.get(v) == 1 and v in where_def and v in where_use and \
                    where_def[v][0] == where_use[v][0] and where_def[v][1] < where_use[v][1]:
                out.add(v)
        self.single_use = out

    # ---- statements that depend on the target ----------------------------------------
    def replay_store(self, s):
        """Does a replayed iteration execute this store?  Into the thread's local
        scratch arrays and the shared tiles the replayed loop rewrites, yes; not into
        other arrays: they hold their final contents, which the reverse sweep reads;
        nor into an array nothing reads (whose allocation the adjoint leaves out)."""
        arr = s.array.name
        if arr not in self.a.loaded and arr not in self.a.varied_arrays:
            return False
        return self.space.get(arr) == "local" or arr in self._replay_shared

    def alloc(self, s, depth):
        """A scratch array allocated by the kernel, and its adjoint (zeros)."""
        self.put(depth, A.Assign(self.n(s.target), self.expr(s.expr)))
        if s.target in self.a.varied_arrays:
            self.put(depth, A.Assign(self.adj(s.target), f"np.zeros_like({self.n(s.target)})"))

    keep_barriers = False      # the forward sweep runs the barriers

    # ---- forward sweep -------------------------------------------------------------
    def fwd(self, stmts, depth, loop_depth):
        a = self.a
        start = self.b.mark(depth)
        for s in stmts:
            if id(s) not in self.kept:
                continue
            if isinstance(s, ir.Assign):
                self.comment(depth, s.loc)
                if s.target in a.pushed and s.target not in self.suppressed and \
                        id(s) not in a.replay_fresh and id(s) not in self.moved_saves():
                    self.push(depth, self.n(s.target), self.T[s.target], saves=s.loc,
                              site=id(s))
                if isinstance(s.expr, ir.Alloc):
                    self.alloc(s, depth)
                    continue
                self.put(depth, A.Assign(self.n(s.target), self.expr(s.expr)))
            elif isinstance(s, ir.Store):
                if self.skip_stores and not self.replay_store(s):
                    continue
                self.comment(depth, s.loc)
                ref = self.elem(self.arr(s.array.name), [self.o(i) for i in s.index])
                if s.array.name in a.restore_arrays:
                    self.push(depth, ref, self.T[s.array.name].dtype, saves=s.loc)
                op = {"add": "+=", "sub": "-="}.get(s.accumulate, "=")
                self.put(depth, A.Assign(ref, self.o(s.value), op))
            elif isinstance(s, ir.If):
                self.put(depth, A.If(self.o(s.cond)))
                with self.mode(_cond_level=self._cond_level + 1):
                    self.fwd(s.then, depth + 1, loop_depth)
                    if any(id(x) in self.kept for x in s.orelse):
                        self.b.put_else(depth)
                        self.fwd(s.orelse, depth + 1, loop_depth)
            elif isinstance(s, ir.ForRange):
                self.fwd_for(s, depth, loop_depth)
            elif isinstance(s, ir.Loop):
                self.fwd_loop(s, depth, loop_depth)
            elif isinstance(s, ir.Break):
                self.put(depth, A.Break())
            elif isinstance(s, ir.Continue):
                self.put(depth, A.Continue())
            elif isinstance(s, ir.Return):
                if s.value is not None and self.has_retval:
                    self.put(depth, A.Assign("_retval", self.o(s.value)))
            elif isinstance(s, ir.Barrier):
                self.put(depth, A.Barrier(replayed=self.skip_stores, loc=s.loc))
        if self.b.only_comments(start):
            self.put(depth, A.Pass())

    def _counted(self, loop):
        return any(isinstance(x, ir.Break) for x in ir.walk_level(loop.body))

    def fwd_for(self, s, depth, loop_depth):
        a = self.a
        idx = self.n(s.index)
        if s.uid in a.index_saved:
            self.push(depth, idx, self.T[s.index], site=(s.uid, "index"))
        self.comment(depth, s.loc)
        counted = self._counted(s) and a.has_rev.get(id(s))
        if counted:
            cnt = self._count_name(s)
            self.put(depth, A.Assign(cnt, "0"))
        for v in a.loop_saved.get(s.uid, ()):
            self.push(depth, self.n(v), self.T[v], site=(s.uid, "loop", v))
        replay = s.uid in a.replay and not self.nopush
        if replay:
            for v in self.replay_pushes(s):
                self.push(depth, self.n(v), self.T[v], site=(s.uid, "replay", v))
        lo, hi, st = self.o(s.start), self.o(s.stop), self.o(s.step)
        self.open_frame(depth, trip=f"_trips({lo}, {hi}, {st})",
                        operands=ir.var_names((s.start, s.stop, s.step)),
                        assigned=ir.assigned(s.body) | {s.index}, body=s.body,
                        trip_src=(s.start, s.stop, s.step))
        if replay:
            self.put(depth, A.Comment("# (not recorded here: each reversed iteration "
                                      "replays its own forward part)", of_next=True))
        trip = None
        if all(isinstance(x, ir.Const) and isinstance(x.value, int)
               for x in (s.start, s.stop, s.step)) and s.step.value != 0:
            trip = len(range(s.start.value, s.stop.value, s.step.value))
        self.put(depth, A.For(idx, f"range({lo}, {hi}, {st})", primal=True, trip=trip,
                              loop=s.uid))
        if counted:
            self.put(depth + 1, A.Assign(cnt, "1", "+="))
        if not replay:
            self.push_fresh(s, depth + 1, self.not_first(s))
        with self.mode(nopush=self.nopush or replay,
                       suppressed=self.suppressed | set(a.unrecorded(s.uid))):
            self.fwd(s.body, depth + 1, loop_depth + 1)
        self.close_frame()
        if not replay:
            self.push_exit(s, depth)
        if counted and loop_depth > 0:
            self.push(depth, cnt, types.int64)

    def fwd_loop(self, s, depth, loop_depth):
        counted = self.a.has_rev.get(id(s))
        cnt = self._count_name(s)
        self.comment(depth, s.loc)
        for v in self.a.loop_saved.get(s.uid, ()):
            self.push(depth, self.n(v), self.T[v], site=(s.uid, "loop", v))
        if counted:
            self.put(depth, A.Assign(cnt, "0"))
        self.put(depth, A.While("True", primal=True))
        if counted:
            self.put(depth + 1, A.Assign(cnt, "1", "+="))
        self.open_frame(depth + 1, assigned=ir.assigned(s.body), body=s.body,
                        per_trip=True)
        self.push_fresh(s, depth + 1, self.not_first(s))
        with self.mode(suppressed=self.suppressed | set(self.a.unrecorded(s.uid))):
            self.fwd(s.body, depth + 1, loop_depth + 1)
        self.close_frame()
        self.push_exit(s, depth)
        if counted and loop_depth > 0:
            self.push(depth, cnt, types.int64)

    def replay_saves(self, s):
        """The values saved before replayed loop ``s``, as (restored after its reverse,
        checkpointed): the carried state (analysis ``checkpoint``) and the other values
        the loop overwrites that the reverse sweep of the rest of the kernel may read.
        A value the loop defines afresh in every iteration and nothing outside the loop
        reads or assigns is not saved at all."""
        cache = self.__dict__.setdefault("_replay_saves", {})
        if s.uid not in cache:
            carried = tuple(self.a.checkpoint.get(s.uid, ()))
            inside = set(map(id, ir.walk(s.body)))
            outside = set()
            for x in ir.walk(self.k.body):
                if id(x) not in inside and x is not s:
                    outside |= ir.stmt_reads(x)
                    if isinstance(x, ir.Assign):
                        outside.add(x.target)
                    elif isinstance(x, ir.ForRange):
                        outside.add(x.index)
            after = tuple(v for v in self.a.replay[s.uid]
                          if v not in carried and v in outside)
            cache[s.uid] = (after, carried)
        return cache[s.uid]

    def replay_pushes(self, s):
        """What the forward sweep pushes right before replayed loop ``s``, in order."""
        after, carried = self.replay_saves(s)
        return after + carried

    def _count_name(self, loop):
        key = ("count", loop.uid)
        if key not in self.names:
            self.names[key] = self.fresh("trips")
        return self.names[key]

    # ---- values a loop defines afresh in each iteration (analysis.first_def) ----------
    def moved_saves(self):
        """Ids of the fresh definitions whose saves are not made at the definition
        (moved to the top of the iteration, or not needed)."""
        if "_moved_saves" not in self.__dict__:
            self._fresh = fresh_definitions(self.k, self.a)
            self._moved_saves = frozenset(
                id(x) for defs, form in self._fresh.values() if form is not None
                for x in defs)
        return self._moved_saves

    def fresh_saves(self, loop):
        """(the fresh definitions of ``loop`` whose values this sweep saves at the top
        of an iteration, form); form None: none moved."""
        self.moved_saves()
        a = self.a
        defs, form = self._fresh.get(loop.uid, ((), None))
        if form not in ("guarded", "guarded+exit"):
            return (), form
        skip = set(self.suppressed) | set(a.unrecorded(loop.uid))
        return tuple(x for x in defs if id(x) in self.kept and x.target not in skip and
                     id(x) not in a.replay_fresh), form

    def not_first(self, loop, k=None):
        """Condition text: this is not the loop's first iteration (forward), or, with
        ``k`` (the reversed while loop's counter), not its first forward iteration."""
        if isinstance(loop, ir.ForRange):
            idx, lo = self.n(loop.index), self.o(loop.start)
            step = loop.step.value if isinstance(loop.step, ir.Const) else None
            op = "!=" if not isinstance(step, int) else (">" if step > 0 else "<")
            return f"{idx} {op} {lo}"
        cnt = self._count_name(loop)
        return f"{cnt} > 1" if k is None else f"{k} < {cnt} - 1"

    def loop_ran(self, loop):
        """Condition text, right after ``loop`` (or before its reverse): it ran at least
        one iteration (None: always, a ``while True`` loop)."""
        if isinstance(loop, ir.Loop):
            return None
        if self._counted(loop):
            return f"{self._count_name(loop)} > 0"
        lo, hi, st = self.o(loop.start), self.o(loop.stop), self.o(loop.step)
        step = loop.step.value if isinstance(loop.step, ir.Const) else None
        if isinstance(step, int) and step != 0:
            return f"{hi} {'>' if step > 0 else '<'} {lo}"
        return f"_trips({lo}, {hi}, {st}) > 0"

    def push_fresh(self, loop, depth, cond):
        """From the second iteration of ``loop`` on, at the top of the iteration: the
        previous iteration's values that this one defines afresh (nothing is saved
        before the loop computed it)."""
        defs, form = self.fresh_saves(loop)
        if not defs or self.nopush:
            return
        self.put(depth, A.If(cond, fresh=True))
        self.put(depth + 1, A.Comment("# the previous iteration's values, before this "
                                      "one redefines them"))
        for x in defs:
            self.push(depth + 1, self.n(x.target), self.T[x.target], saves=x.loc,
                      site=id(x))

    def push_exit(self, loop, depth):
        """After ``loop`` when an enclosing loop records its iterations: the values the
        loop defined afresh as it left them (the reverse of this run of the loop starts
        from them).  A ``for`` loop's reservation counted a save in its first
        iteration, which is not made: it covers these."""
        defs, form = self.fresh_saves(loop)
        if not defs or form != "guarded+exit" or self.nopush:
            return
        cond = self.loop_ran(loop)
        if cond is not None:
            self.put(depth, A.If(cond))
            depth += 1
        self.put(depth, A.Comment("# its last iteration's values (the reverse of this "
                                  "run of the loop starts from them)"))
        for x in defs:
            self.push(depth, self.n(x.target), self.T[x.target],
                      counted=isinstance(loop, ir.Loop), site=id(x))
