"""Loops that carry state, reversed from checkpoints (recursive bisection), any target.

A target whose tape must stay bounded (``checkpoints=N``: a GPU thread's tape always,
a CPU kernel's when asked) lets the analysis replay loops whose iterations carry state
(``carried_replay``): a per-element time loop ``for t in range(T): v = f(v)``, a
recurrence.  The forward sweep runs such a loop without recording; the reverse sweep
reverses it from checkpoints of its carried state:

The state before the loop is checkpoint 0; reversing iteration ``r`` restarts from the
nearest checkpoint at or below ``r`` and runs forward, leaving new checkpoints at the
midpoints, then replays iteration ``r`` recording and reverses it.  With ``slots``
checkpoints this costs O(log n) forward iterations per reversed one while
n <= 2**slots, and stays exact beyond (longer segments are replayed).  The tape holds
one iteration's values at a time, whatever the trip count.  The checkpointed state is
the loop's carried scalars, the private scratch arrays the loop writes and, on a GPU,
each thread's own element of the shared arrays it rewrites (analysis
``checkpoint_owned``, the element from the target's ``own_element``,
:mod:`kadj.cuda.checkpoints`): the block meets at a barrier around restoring them,
since other threads read them.  Slots are arrays of ``slots`` entries the
target declares in the adjoint's prologue (``local_array``: :class:`adj_ir.LocalArray`
nodes, ``np.empty`` on a CPU).
"""
from __future__ import annotations

from contextlib import contextmanager

from numba.core import types

from . import adj_ir as A
from . import ir
from .errors import DifferentiationError


class CheckpointedLoops:
    """The part of a writer that reverses loops from checkpoints (``a.checkpoint``)."""

    slots = None           # checkpoint slots per loop (the target's ``checkpoints``)

    # ---- which loops: the analysis' checkpoint facts --------------------------------
    def fwd_for(self, s, depth, loop_depth):
        if s.uid in self.a.checkpoint and not self.nopush:
            self._push_entry(s, depth)
        super().fwd_for(s, depth, loop_depth)

    def replay_pushes(self, s):
        if s.uid in self.a.checkpoint:  # (the rest before: _push_entry)
            return self.replay_saves(s)[1]
        return super().replay_pushes(s)

    def _push_entry(self, s, depth):
        """Before checkpointed loop ``s``: the values restored after its reverse, then
        its scratch arrays (the carried state follows: ``replay_pushes``)."""
        for v in self.replay_saves(s)[0]:
            self.push(depth, self.n(v), self.T[v])
        self._push_arrays(s, depth)

    def fwd_loop(self, s, depth, loop_depth):
        if s.uid not in self.a.checkpoint:
            return super().fwd_loop(s, depth, loop_depth)
        self.comment(depth, s.loc)
        if not self.nopush:
            self._push_entry(s, depth)
        for v in self.replay_pushes(s):
            self.push(depth, self.n(v), self.T[v])
        cnt = self._count_name(s)
        self.put(depth, A.Assign(cnt, "0"))
        self.put(depth, A.Comment("# (not recorded here: reversed from checkpoints)",
                                  of_next=True))
        self.put(depth, A.While("True", primal=True))
        self.put(depth + 1, A.Assign(cnt, "1", "+="))
        with self.mode(nopush=True):
            self.fwd(s.body, depth + 1, loop_depth + 1)
        if loop_depth > 0:
            # (inside another loop: this run's trip count, for its reverse; the next
            # run of the loop reassigns the counter)
            self.push(depth, cnt, types.int64)

    def _rev_for(self, s, depth, loop_depth):
        with self._shared_replays(s, depth):
            if s.uid in self.a.checkpoint:
                self._rev_checkpointed(s, depth, loop_depth)
            else:
                super()._rev_for(s, depth, loop_depth)

    def rev_loop(self, s, depth, loop_depth):
        with self._shared_replays(s, depth):
            if s.uid in self.a.checkpoint:
                self._rev_checkpointed(s, depth, loop_depth)
            else:
                super().rev_loop(s, depth, loop_depth)

    @contextmanager
    def _shared_replays(self, s, depth):
        """Reverse loop ``s`` inside the ``with``; its replayed iterations execute their
        stores into the arrays of analysis ``replay_shared``.  When those are shared by
        a block of threads (never on a CPU, where they are the kernel's scratch arrays
        each iteration rewrites whole), the block meets at a barrier before (threads
        may still be reading what the first replay overwrites) and after (what follows
        reads it again)."""
        shared = set(self.a.replay_shared.get(s.uid, ()))
        block = shared & (self.a.shared_scratch | self.a.owned_shared)  # (CPU: none)
        with self.mode(_replay_shared=self._replay_shared | shared):
            if block:
                self.put(depth, A.Barrier("before replays rewrite shared memory"))
            yield
            if block:
                self.put(depth, A.Barrier("after them"))

    def check_replayed_stores(self):
        """A replayed iteration does not execute stores into arrays (they hold their
        final contents), so it cannot record the elements they overwrite: a replayed
        loop that overwrites array elements its adjoint needs is refused."""
        a = self.a
        for x in ir.walk(self.k.body):
            if not (isinstance(x, (ir.ForRange, ir.Loop)) and x.uid in a.replay):
                continue
            for y in ir.walk(x.body):
                if isinstance(y, ir.Store) and y.array.name in a.restore_arrays and \
                        not self.replay_store(y):
                    raise DifferentiationError(
                        f"a loop reversed from checkpoints overwrites elements of "
                        f"'{y.array.name}' whose earlier values its adjoint needs",
                        kernel=self.k.name, loc=y.loc,
                        construct="array overwritten in a checkpointed loop",
                        remedy="write new values into a separate array (double "
                               "buffering), or differentiate without checkpoints=")

    # ---- slots ------------------------------------------------------------------------
    def local_array(self, hint, size, dtype):
        """A slot array declared in the adjoint's prologue (``slot_arrays``: local
        arrays, which the target lowers: kadj.lowering)."""
        name = self.fresh(hint)
        self.slot_arrays.append(A.LocalArray(name, size, dtype, "local"))
        return name

    def _slot_type(self, v):
        t = self.T[v]
        if isinstance(t, types.Boolean):
            return types.int8
        return t

    # ---- state besides the carried scalars ------------------------------------------
    def _scratch(self, s):
        """(array, dims, flat size, dtype) of the private scratch arrays loop ``s``
        checkpoints."""
        out = []
        for name in self.a.checkpoint_arrays.get(s.uid, ()):
            shape = self.allocs[name].expr.args[0].value
            dims = shape if isinstance(shape, tuple) else (shape,)
            size = 1
            for d in dims:
                size *= d
            out.append((name, dims, size, self.T[name].dtype))
        return out

    def _owned(self, s):
        """(array, element text, bounds condition, dtype) of the shared arrays whose
        own element each thread checkpoints for loop ``s`` (analysis
        ``checkpoint_owned``; the element from the target's ``own_element``)."""
        out = []
        for name in self.a.checkpoint_owned.get(s.uid, ()):
            for key in _elements(self.ctx.own_element(self, name)):
                parts = [self._coordinate(v) if kind == "c" else str(v)
                         for kind, v in key]
                conds = [f"{self._coordinate(v)} < {self.n(name)}.shape[{k}]"
                         for k, (kind, v) in enumerate(key) if kind == "c"]
                elem = f"{self.n(name)}[{', '.join(parts)}]"
                out.append((name, elem, " and ".join(conds) or "True",
                            self.T[name].dtype))
        return out

    def _coordinate(self, text):
        """A coordinate of an own element (``tx``, ``tx + 1``: a kernel variable, plus
        a constant) with the variable named as the source names it (an inlined
        helper's variable has the helper's suffix there)."""
        root, plus, rest = text.partition(" + ")
        return self.n(root) + plus + rest

    def _owned_report(self, owned):
        return [f"{elem} (each thread its own)" for _, elem, _, _ in owned]

    def _push_owned(self, s, depth):
        for name, elem, cond, dt in self._owned(s):
            kind = self.tape_of(dt)
            self.put(depth, A.Push(kind, f"{elem} if {cond} else {self.zero(dt)}",
                                   once=True))

    def _pop_owned(self, s, depth):
        owned = self._owned(s)
        if owned:
            self.put(depth, A.Barrier("nobody reads the shared state now"))
        for name, elem, cond, dt in reversed(owned):
            kind = self.tape_of(dt)
            self.put(depth, A.Pop(kind, elem, cond=cond))
        if owned:
            self.put(depth, A.Barrier("every thread restored its element"))

    def _save_owned(self, depth, slot, owned, ck_own):
        for name, elem, cond, dt in owned:  # each thread its own shared element
            self.put(depth, A.If(cond))
            self.put(depth + 1, A.Assign(f"{ck_own[elem]}[{slot}]", elem))

    def _load_owned(self, depth, slot, owned, ck_own):
        if owned:
            self.put(depth, A.Barrier("nobody reads the shared state now"))
        for name, elem, cond, dt in owned:
            self.put(depth, A.If(cond))
            self.put(depth + 1, A.Assign(elem, f"{ck_own[elem]}[{slot}]"))
        if owned:
            self.put(depth, A.Barrier("every thread restored its element"))

    def _copy_array(self, depth, name, dims, size, line):
        z = self.fresh("z")
        self.put(depth, A.For(z, f"range({size})"))
        self.put(depth + 1, line(z, f"{self.n(name)}[{unravel(z, dims)}]"))

    def _push_arrays(self, s, depth):
        self._push_owned(s, depth)
        for name, dims, size, dt in self._scratch(s):
            kind = self.tape_of(dt)
            z = self.fresh("z")
            self.put(depth, A.PushArray(kind, size, z, f"{self.n(name)}[{unravel(z, dims)}]",
                                        key=(s.uid, name)))

    def _pop_arrays(self, s, depth):
        for name, dims, size, dt in reversed(self._scratch(s)):
            kind = self.tape_of(dt)
            z = self.fresh("z")
            self.put(depth, A.PopArray(kind, size, z, f"{self.n(name)}[{unravel(z, dims)}]",
                                       key=(s.uid, name)))
        self._pop_owned(s, depth)

    # ---- the reversed loop ----------------------------------------------------------
    def _body(self, s, depth, loop_depth, record):
        self._last_loc = None
        with self.mode(kept=set(map(id, ir.walk(s.body))), skip_stores=True,
                       nopush=not record), \
                self.b.group(depth, A.Block("replayed iteration")):
            self.fwd(s.body, depth, loop_depth + 1)
        self._last_loc = None

    def _iteration(self, s, depth, loop_depth, record):
        """One iteration of loop ``s``'s body; a body that may ``break``/``continue``
        runs in a one-trip loop that those leave."""
        if any(isinstance(x, (ir.Break, ir.Continue)) for x in ir.walk_level(s.body)):
            self.put(depth, A.For(self.fresh('once'), "range(1)"))
            depth += 1
        self._body(s, depth, loop_depth, record)

    def _rev_checkpointed(self, s, depth, loop_depth):
        if self.slots is None:
            raise AssertionError("a loop to reverse from checkpoints, but no slots")
        with self.b.group(depth, A.ReverseLoop("checkpointed", s.uid)):
            self._rev_checkpointed_body(s, depth, loop_depth)

    def _rev_checkpointed_body(self, s, depth, loop_depth):
        a = self.a
        restored, saved_vars = self.replay_saves(s)
        S = self.slots
        self.comment(depth, s.loc)
        if isinstance(s, ir.ForRange):
            idx = self.n(s.index)
            lo, hi, st = self.o(s.start), self.o(s.stop), self.o(s.step)
            header = f"for {idx} in range({lo}, {hi}, {st})"
            trips = self._count_name(s) if self._counted(s) else f"_trips({lo}, {hi}, {st})"
        else:
            idx = None
            header = "while loop"
            trips = self._count_name(s)
        self.put(depth, A.Comment(f"# reversed from checkpoints ({S} slots, recursive "
                                  f"bisection): {header}"))
        scratch = self._scratch(s)
        if (not isinstance(s, ir.ForRange) or self._counted(s)) and loop_depth > 0 and \
                id(s) in self.kept:
            # (the forward recorded the trip count after the loop: fwd_for, fwd_loop)
            self.pop(depth, self._count_name(s), types.int64)
        if id(s) in self.kept:
            for v in reversed(saved_vars):
                self.pop(depth, self.n(v), self.T[v])
            self._pop_arrays(s, depth)
        n, top, cur, r, mid = (self.fresh(x) for x in ("n", "top", "cur", "r", "mid"))
        ck_it = self.local_array("ck_iter", S, types.int64)
        ck = {v: self.local_array(f"ck_{self.n(v)}", S, self._slot_type(v))
              for v in saved_vars}
        ck_arr = {name: self.local_array(f"ck_{self.n(name)}", (S, size), dt)
                  for name, dims, size, dt in scratch}
        owned = self._owned(s)
        ck_own = {elem: self.local_array(f"ck_{self.n(name)}", S, dt)
                  for name, elem, cond, dt in owned}

        def save(d, slot):
            for v in saved_vars:
                self.put(d, A.Assign(f"{ck[v]}[{slot}]", self.n(v)))
            for name, dims, size, dt in scratch:
                self._copy_array(d, name, dims, size, lambda z, ref: A.Assign(
                    f"{ck_arr[name]}[{slot}, {z}]", ref))
            self._save_owned(d, slot, owned, ck_own)

        def load(d, slot):
            for v in saved_vars:
                val = f"{ck[v]}[{slot}]"
                if isinstance(self.T[v], types.Boolean):
                    val = f"{val} != 0"
                self.put(d, A.Assign(self.n(v), val))
            for name, dims, size, dt in scratch:
                self._copy_array(d, name, dims, size, lambda z, ref: A.Assign(
                    ref, f"{ck_arr[name]}[{slot}, {z}]"))
            self._load_owned(d, slot, owned, ck_own)

        def set_index(d, k):
            if idx is not None:
                self.put(d, A.Assign(idx, _index(lo, k, st)))

        put = self.put
        put(depth, A.Assign(n, trips))
        put(depth, A.Assign(top, "0"))
        put(depth, A.Assign(f"{ck_it}[0]", "0"))
        save(depth, 0)
        put(depth, A.For(r, f"range({n} - 1, -1, -1)"))
        d1, d2, d3 = depth + 1, depth + 2, depth + 3
        put(d1, A.While(f"{ck_it}[{top}] > {r}"))
        put(d2, A.Assign(top, "1", "-="))
        put(d1, A.Assign(cur, f"{ck_it}[{top}]"))
        load(d1, top)
        put(d1, A.While(f"{cur} < {r}"))
        put(d2, A.Assign(mid, f"{cur} + ({r} - {cur} + 1) // 2"))
        put(d2, A.While(f"{cur} < {mid}"))
        set_index(d3, cur)
        self._iteration(s, d3, loop_depth + 1, record=False)
        put(d3, A.Assign(cur, "1", "+="))
        put(d2, A.If(f"{mid} < {r} and {top} + 1 < {S}"))
        put(d3, A.Assign(top, "1", "+="))
        put(d3, A.Assign(f"{ck_it}[{top}]", cur))
        save(d3, top)
        set_index(d1, r)
        put(d1, A.Comment("# replay this iteration's forward part, recording"))
        self.open_frame(d1)
        self._iteration(s, d1, loop_depth, record=True)
        self.close_frame()
        with self.mode(kept=set(map(id, ir.walk(s.body)))):
            self.rev(s.body, d1, loop_depth + 1, frozenset())
        put(depth, A.Comment("# the state before the loop"))
        load(depth, 0)
        if id(s) in self.kept:
            for v in reversed(restored):
                self.pop(depth, self.n(v), self.T[v])
        self.loop_report.append({
            "line": getattr(s.loc, "line", None), "loop": header,
            "carried": [self.n(v) for v in a.checkpoint[s.uid]],
            "checkpointed": [self.n(v) for v in saved_vars] + [
                f"{self.n(name)}[{size}]" for name, _, size, _ in scratch] +
            self._owned_report(owned),
            "slots": S,
            "recompute": f"<= ceil(log2(n)) + 1 forward iterations per reversed one "
                         f"(amortised) while n <= 2**{S}",
        })


def unravel(flat, dims):
    """Index text of flat element ``flat`` of a C-ordered array of shape ``dims``."""
    if len(dims) == 1:
        return flat
    out = []
    for k, d in enumerate(dims):
        stride = 1
        for e in dims[k + 1:]:
            stride *= e
        term = f"{flat} // {stride}" if stride != 1 else flat
        out.append(f"({term}) % {d}" if k else term)
    return ", ".join(out)


def _index(lo, k, st):
    base = k if st == "1" else f"{k} * {st}"
    return base if lo == "0" else f"{lo} + {base}"


def _elements(key):
    """The elements of a thread's own-element key (``own_element``): a ``("r", n)``
    position (a ping-pong buffer's row, whichever the thread writes) stands for each
    of the rows 0 .. n-1."""
    keys = [()]
    for kind, v in key:
        opts = [("k", j) for j in range(v)] if kind == "r" else [(kind, v)]
        keys = [k + (o,) for k in keys for o in opts]
    return keys
