"""The adjoint of a CUDA kernel: kadj.reverse's Writer, one GPU thread at a time.

Each thread of the adjoint kernel replays its forward part, then runs its reverse part
(DESIGN.md).  What changes from the CPU writer:

- **Accumulation into adjoint arrays** is chosen per array from its index expressions
  (:mod:`kadj.cuda.indexing`): plain ``+=`` for thread-private arrays, else
  ``cuda.atomic.add``.  Stores consume their element's adjoint with plain reads and
  writes (threads write disjoint elements: DESIGN.md's rule for GPU kernels); a forward
  ``cuda.atomic.add(a, i, v)`` is an increment whose adjoint reads ``adj_a[i]``.
- **Scalar arguments' adjoints** (``alpha``: the same for every thread) are summed
  over the block first: each thread adds its share into one of 32 shared-memory
  slots (lane ``tid % 32``, so a warp's threads hit distinct banks), then thread 0 adds
  the block's total with one global atomic.
- **The tape is per thread and bounded**: ``cuda.local.array`` stacks whose size is
  the number of values recorded outside loops plus those of one replayed iteration.
  Recording inside a loop that is not replayed is refused.
- **Loops that carry state** (per-thread time stepping, recurrences) are reversed from
  checkpoints: the state before the loop is checkpoint 0; reversing iteration ``r``
  restarts from the nearest checkpoint at or below ``r`` and runs forward, leaving new
  checkpoints at the midpoints (recursive bisection), then replays iteration ``r``
  recording and reverses it.  With ``slots`` checkpoints this costs O(log n) forward
  iterations per reversed one while n <= 2**slots, and stays exact beyond (longer
  segments are replayed).
"""
from __future__ import annotations

from numba.core import types

from .. import ir
from ..errors import DifferentiationError
from ..reverse import AdjRef, AdjointSource, Writer
from .indexing import ThreadIndex, array_accesses
from .intrinsics import SPECIAL_REGS, CudaIntrinsic
from .stores import check_single_writers

DEFAULT_SLOTS = 24


class CudaWriter(Writer):
    def __init__(self, kernel, an, slot_args, fname, slots=DEFAULT_SLOTS, cells=None):
        self.cells = dict(cells or {})
        super().__init__(kernel, an, slot_args, False, fname)
        from numba import cuda
        self.ns["cuda"] = cuda
        self.slots = int(slots)
        self.index = ThreadIndex(kernel, an.assign_count)
        self.allocs = {x.target: x for x in ir.walk(kernel.body)
                       if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Alloc)}
        self.space = {name: x.expr.fn.path.split(".")[0]
                      for name, x in self.allocs.items()
                      if isinstance(x.expr.fn, CudaIntrinsic)}
        self.classes = {name: self.index.classify(name, idxs,
                                                  self.space.get(name, "global"))
                        for name, idxs in array_accesses(kernel).items()
                        if name in an.varied_arrays}
        self._live_arrays = set()
        self.private_arrays = {n for n, c in self.classes.items() if c.cls == "private"}
        self.atomic_sites = {}      # array -> atomics written
        self.plain_sites = {}       # array -> plain accumulations written
        self.tape_size = {}
        self.local_arrays = []      # (name, size, dtype name) declared in the prologue
        self.loop_report = []
        self.scalar_report = {}
        self.uniform_acc = {}       # (array, constant index) -> local accumulator
        self.uniform_report = {}
        self._ld = 0
        self._replay_ld = None
        self._trip_at = {}
        self._replay_shared = set()   # shared tiles the replayed loop rewrites

    # ---- rendering ----------------------------------------------------------------
    def bind(self, obj, hint):
        if isinstance(obj, CudaIntrinsic):
            return "cuda." + obj.path
        return super().bind(obj, hint)

    def expr(self, e):
        if isinstance(e, ir.Op) and isinstance(e.fn, CudaIntrinsic) and \
                e.fn.path in SPECIAL_REGS:
            return "cuda." + e.fn.path
        return super().expr(e)

    def accumulate(self, depth, target, op, text):
        if not (isinstance(target, AdjRef) and op == "+="):
            return super().accumulate(depth, target, op, text)
        arr = target.array
        if arr in self.private_arrays:
            self.plain_sites[arr] = self.plain_sites.get(arr, 0) + 1
            return super().accumulate(depth, target, op, text)
        key = tuple(self.index.canonical(x) for x in target.index)
        if self.classes.get(arr) is not None and self.classes[arr].cls == "uniform" and \
                self.space.get(arr) is None and all(k and k[0] == "k" for k in key):
            # an element every thread may add to (a coefficient): summed in a local,
            # then over the block, then one atomic per block (finish_scalar_adjoints)
            values = tuple(k[1] for k in key)
            acc = self.uniform_acc.get((arr, values))
            if acc is None:
                acc = self.fresh(f"adj_{self.n(arr)}_" + "_".join(map(str, values)))
                self.uniform_acc[(arr, values)] = acc
            self.emit(depth, f"{acc} += {text}")
            return
        buf, _, rest = target.partition("[")
        index = rest[:-1]
        if len(target.index) > 1:
            index = f"({index})"
        self.atomic_sites[arr] = self.atomic_sites.get(arr, 0) + 1
        self.emit(depth, f"cuda.atomic.add({buf}, {index}, {text})")

    def liveness(self):
        # the forward sweep writes a shared/local array only if it later reads values
        # of it that the reverse sweep needs (an in-place sum needs none)
        a = self.a
        self._live_arrays = set()
        # read again in the reverse sweep: recomputed loads, replayed iterations
        for stmts in a.recompute.values():
            self._live_arrays |= ir.loaded_arrays(stmts)
        for x in ir.walk(self.k.body):
            if isinstance(x, (ir.ForRange, ir.Loop)) and x.uid in a.replay:
                self._live_arrays |= ir.loaded_arrays(x.body)
        while True:
            self.keep_barriers = any(self.space.get(v) == "shared"
                                     for v in self._live_arrays)
            super().liveness()
            loaded = {x.expr.array.name for x in ir.walk(self.k.body)
                      if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load) and
                      id(x) in self.kept}
            if loaded <= self._live_arrays:
                break
            self._live_arrays |= loaded
        # a kernel returns nothing: its returns (and branches holding only them) have
        # nothing to do in the forward sweep
        for x in ir.walk(self.k.body):
            if isinstance(x, ir.Return) or (
                    isinstance(x, ir.Assign) and isinstance(x.expr, ir.Alloc)):
                self.kept.discard(id(x))  # (arrays are declared up front)
        changed = True
        while changed:
            changed = False
            for x in ir.walk(self.k.body):
                if isinstance(x, ir.If) and id(x) in self.kept and not any(
                        id(y) in self.kept for y in ir.walk(x.then + x.orelse)
                        if not isinstance(y, ir.If)):
                    self.kept.discard(id(x))
                    changed = True

    def _live(self, stmts, live, ctx):
        # what the forward saves at a loop's entry (pushed state, checkpoint 0) is read
        # there, even where the loop's own updates of it are dead (a cell overwritten
        # after the loop): it must hold its value, not an unset (NaN) register
        a = self.a
        for s in reversed(stmts):
            live = super()._live((s,), live, ctx)
            if isinstance(s, (ir.ForRange, ir.Loop)) and id(s) in self.kept:
                live = live | set(a.loop_saved.get(s.uid, ())) | set(
                    a.replay.get(s.uid, ()))
        return live

    def _stmt_needed(self, s):
        if isinstance(s, ir.Store) and s.array.name in self.cells:
            return False  # later reads use the cell (kadj.cuda.cells)
        if isinstance(s, ir.Store) and s.array.name in self.space:
            return s.array.name in self._live_arrays
        return super()._stmt_needed(s)

    # ---- shared and local arrays, barriers -----------------------------------------
    def alloc(self, s, depth):
        pass  # declared at the top of the adjoint kernel (tape_init_lines)

    def fwd_barrier(self, s, depth):
        # a replayed iteration that rewrites shared tiles replays the block's barriers
        # too; other replays write no shared memory
        if not self.skip_stores or self._replay_shared:
            self.emit(depth, "cuda.syncthreads()")

    def rev_barrier(self, s, depth):
        self.comment(depth, s.loc)
        self.emit(depth, "cuda.syncthreads()  # mirrors the forward barrier")

    def _alloc_lines(self):
        lines = []
        tid = nthreads = None
        for name, s in self.allocs.items():
            shape, dtype = s.expr.args
            space = self.space[name]
            dt = self.bind(dtype.value, dtype.name or "dtype")
            shp = shape.value
            decl = f"cuda.{space}.array({shp!r}, {dt})"
            if name in self.a.loaded or name in self.a.varied_arrays:
                lines.append(f"{self.n(name)} = {decl}")
            if name not in self.a.varied_arrays:
                continue
            adj = self.adj(name)
            lines.append(f"{adj} = {decl}")
            dims = shp if isinstance(shp, tuple) else (shp,)
            size = 1
            for d in dims:
                size *= d
            z = self.fresh("z")
            idx = _unravel(z, dims)
            zero = self.zero(self.T[name].dtype)
            if space == "shared":
                if tid is None:
                    tid, nthreads = self.fresh("tid"), self.fresh("nthreads")
                    lines.append(f"{tid} = cuda.threadIdx.x + cuda.blockDim.x * ("
                                 f"cuda.threadIdx.y + cuda.blockDim.y * cuda.threadIdx.z)")
                    lines.append(f"{nthreads} = cuda.blockDim.x * cuda.blockDim.y * "
                                 f"cuda.blockDim.z")
                lines.append(f"for {z} in range({tid}, {size}, {nthreads}):")
            else:
                lines.append(f"for {z} in range({size}):")
            lines.append(f"    {adj}[{idx}] = {zero}")
        if tid is not None:
            lines.append("cuda.syncthreads()")
        return lines

    # ---- one accumulation per element and thread -------------------------------------
    def rev(self, stmts, depth, loop_depth, recomputed=frozenset()):
        """Loads of one element repeated in a statement sequence (``u[i]`` twice in a
        stencil) sum their adjoints in a local, added to the array once at the end of
        the sequence: one atomic per element and thread instead of one per load."""
        keys = self._merge_keys(stmts)
        for key in keys:
            name = self.fresh("acc_" + self.n(key[0]))
            self.accumulators[key] = name
            self.emit(depth, f"{name} = {self.zero(self.T[key[0]].dtype)}")
        super().rev(stmts, depth, loop_depth, recomputed)
        self.close_accumulators(keys, depth)

    def _merge_keys(self, stmts):
        a = self.a
        if any(isinstance(x, ir.Barrier) for x in ir.walk(stmts)):
            return []  # an accumulation may not move across a barrier
        count = {}
        for x in stmts:
            if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load) and \
                    x.target in a.varied and id(x) in self._rev_kept(x):
                e = x.expr
                arr = e.array.name
                if arr not in a.varied_arrays or arr in a.stored or any(
                        not isinstance(v, (ir.Var, ir.Const)) or
                        (isinstance(v, ir.Var) and a.assign_count.get(v.name, 0) > 1)
                        for v in e.index):
                    continue
                key = (arr, tuple(e.index))
                if key not in self.accumulators:
                    count[key] = count.get(key, 0) + 1
        return [k for k, c in count.items() if c > 1]

    def _rev_kept(self, x):
        return {id(x)} if self.needs_reverse(x) else set()

    def local_array(self, hint, size, dtype):
        name = self.fresh(hint)
        self.local_arrays.append((name, size, self.bind(dtype, str(dtype))))
        return name

    # ---- scalar adjoints: one atomic per block --------------------------------------
    def uniform_init_lines(self):
        return [f"{acc} = {self.zero(self.T[arr].dtype)}"
                for (arr, _), acc in self.uniform_acc.items()]

    def finish_scalar_adjoints(self, names):
        # (local value, dtype, buffer, index, what) of every sum to reduce over the block
        sinks = [(self.cast(self.adj(n), self.T[n]), self.T[n], self.adj_buf(n), "0", n)
                 for n in names]
        for (arr, values), acc in self.uniform_acc.items():
            idx = values[0] if len(values) == 1 else "(" + ", ".join(map(str, values)) + ")"
            sinks.append((acc, self.T[arr].dtype, self.adj(arr), str(idx), arr))
        if not sinks:
            return
        self.emit(1, "# ---- adjoints every thread adds to: summed over the block, one "
                     "atomic per block ----")
        tid = self.fresh("tid")
        self.emit(1, f"{tid} = cuda.threadIdx.x + cuda.blockDim.x * (cuda.threadIdx.y + "
                     f"cuda.blockDim.y * cuda.threadIdx.z)")
        reds = []
        for value, dt, buf, idx, what in sinks:
            red = self.fresh(f"red_{buf[4:]}")
            reds.append(red)
            self.emit(1, f"{red} = cuda.shared.array(32, {self.bind(dt, str(dt))})")
            self.emit(1, f"if {tid} < 32:")
            self.emit(2, f"{red}[{tid}] = {self.zero(dt)}")
            how = "block-reduced: 32 shared-memory slots, one global atomic per block"
            if what in names:
                self.scalar_report[what] = how
            else:
                self.uniform_report[f"{what}[{idx.strip('()')}]"] = how
        self.emit(1, "cuda.syncthreads()")
        for red, (value, dt, buf, idx, what) in zip(reds, sinks):
            self.emit(1, f"cuda.atomic.add({red}, {tid} % 32, {value})")
        self.emit(1, "cuda.syncthreads()")
        self.emit(1, f"if {tid} == 0:")
        w = self.fresh("w")
        used = self.fresh("slots")
        self.emit(2, f"{used} = min(32, cuda.blockDim.x * cuda.blockDim.y * "
                     f"cuda.blockDim.z)")
        for red, (value, dt, buf, idx, what) in zip(reds, sinks):
            total = self.fresh("total")
            self.emit(2, f"{total} = {red}[0]")
            self.emit(2, f"for {w} in range(1, {used}):")
            self.emit(3, f"{total} += {red}[{w}]")
            self.emit(2, f"cuda.atomic.add({buf}, {idx}, {total})")
            self.atomic_sites[what] = self.atomic_sites.get(what, 0) + 1

    # ---- bounded per-thread tape ----------------------------------------------------
    def fwd(self, stmts, depth, loop_depth):
        prev = self._ld, self._replay_ld
        if self.skip_stores and self._replay_ld is None:
            self._replay_ld = loop_depth  # a replayed iteration starts here
        self._ld = loop_depth
        try:
            super().fwd(stmts, depth, loop_depth)
        finally:
            self._ld, self._replay_ld = prev

    def _multiplicity(self):
        """How many times a push here runs before the tape is popped back: the product
        of the constant trip counts of the loops around it (since the replayed
        iteration, if any); None when one of them is not constant."""
        base = self._replay_ld if self._replay_ld is not None else 0
        m = 1
        for level in range(base + 1, self._ld + 1):
            trip = self._trip_at.get(level)
            if trip is None:
                return None
            m *= trip
        return m

    def push(self, depth, value_text, t):
        if self.nopush:
            return
        m = self._multiplicity()
        if m is None:
            raise DifferentiationError(
                "a loop overwrites values its adjoint needs, and this loop cannot be "
                "reversed from checkpoints (a while loop, a break/continue, a nested "
                "loop that records values, or an array both read and written in it); "
                "a GPU thread's tape must be bounded", kernel=self.k.name,
                loc=self._last_loc if hasattr(self, "_last_loc") else None,
                construct="unbounded tape in a loop",
                remedy="use `for ... in range(...)` loops without break, keep inner "
                       "loops free of overwritten values, or assign each value once")
        super().push(depth, value_text, t)
        kind = self.tape_of(t)[0][len("_tape_"):]
        self.tape_size[kind] = self.tape_size.get(kind, 0) + m

    growable_tape = False  # the per-thread tape is sized statically

    def _reserve_lines(self, amounts, depth):
        return []

    def tape_init_lines(self):
        lines = []
        for kind in sorted(self.tapes):
            dt = {"f64": types.float64, "f32": types.float32, "i64": types.int64}[kind]
            lines.append(f"_tape_{kind} = cuda.local.array({self.tape_size.get(kind, 1)}, "
                         f"{self.bind(dt, str(dt))})")
            lines.append(f"_sp_{kind} = 0")
        for name, size, dt in self.local_arrays:
            lines.append(f"{name} = cuda.local.array({size}, {dt})")
        return lines + self._alloc_lines() + self.uniform_init_lines()

    # ---- loops reversed from checkpoints --------------------------------------------
    def _body(self, s, depth, loop_depth, record):
        saved = self.kept, self.skip_stores, self.nopush
        self.kept = set(map(id, ir.walk(s.body)))
        self.skip_stores, self.nopush = True, not record
        self._last_loc = None
        self.fwd(s.body, depth, loop_depth + 1)
        self.kept, self.skip_stores, self.nopush = saved
        self._last_loc = None

    def _slot_type(self, v):
        t = self.T[v]
        if isinstance(t, types.Boolean):
            return types.int8
        return t

    # ---- per-thread scratch arrays that checkpointed loops write ----------------------
    def replay_store(self, s):
        return self.space.get(s.array.name) == "local" or \
            s.array.name in self._replay_shared

    def _scratch(self, s):
        """(array, flat size, dtype) of the local arrays loop ``s`` checkpoints."""
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
        own element each thread checkpoints for loop ``s`` (analysis.owned_shared)."""
        out = []
        for name in self.a.checkpoint_owned.get(s.uid, ()):
            key = None
            for x in ir.walk(self.k.body):
                if isinstance(x, ir.Store) and x.array.name == name:
                    key = self.index.owned_key(x.index, self.index.local,
                                               self.index.block_ndim)
                    break
            parts = [v if kind == "c" else str(v) for kind, v in key]
            conds = [f"{v} < {self.n(name)}.shape[{k}]"
                     for k, (kind, v) in enumerate(key) if kind == "c"]
            elem = f"{self.n(name)}[{', '.join(parts)}]"
            out.append((name, elem, " and ".join(conds) or "True",
                        self.T[name].dtype))
        return out

    def _copy_array(self, depth, name, dims, size, line):
        z = self.fresh("z")
        self.emit(depth, f"for {z} in range({size}):")
        self.emit(depth + 1, line(z, f"{self.n(name)}[{_unravel(z, dims)}]"))

    def _push_arrays(self, s, depth):
        for name, elem, cond, dt in self._owned(s):
            tape, sp = self.tape_of(dt)
            kind = tape[len("_tape_"):]
            self.tape_size[kind] = self.tape_size.get(kind, 0) + 1
            self.emit(depth, f"{tape}[{sp}] = {elem} if {cond} else {self.zero(dt)}")
            self.emit(depth, f"{sp} += 1")
        for name, dims, size, dt in self._scratch(s):
            tape, sp = self.tape_of(dt)
            kind = tape[len("_tape_"):]
            self.tape_size[kind] = self.tape_size.get(kind, 0) + size
            z = self.fresh("z")
            self.emit(depth, f"for {z} in range({size}):")
            self.emit(depth + 1, f"{tape}[{sp} + {z}] = "
                                 f"{self.n(name)}[{_unravel(z, dims)}]")
            self.emit(depth, f"{sp} += {size}")

    def _pop_arrays(self, s, depth):
        for name, dims, size, dt in reversed(self._scratch(s)):
            tape, sp = self.tape_of(dt)
            self.emit(depth, f"{sp} -= {size}")
            z = self.fresh("z")
            self.emit(depth, f"for {z} in range({size}):")
            self.emit(depth + 1, f"{self.n(name)}[{_unravel(z, dims)}] = "
                                 f"{tape}[{sp} + {z}]")
        owned = self._owned(s)
        if owned:
            self.emit(depth, "cuda.syncthreads()  # nobody reads the shared state now")
        for name, elem, cond, dt in reversed(owned):
            tape, sp = self.tape_of(dt)
            self.emit(depth, f"{sp} -= 1")
            self.emit(depth, f"if {cond}:")
            self.emit(depth + 1, f"{elem} = {tape}[{sp}]")
        if owned:
            self.emit(depth, "cuda.syncthreads()  # every thread restored its element")

    def fwd_for(self, s, depth, loop_depth):
        if s.uid in self.a.checkpoint and not self.nopush:
            self._push_arrays(s, depth)
        trip = None
        if all(isinstance(x, ir.Const) and isinstance(x.value, int)
               for x in (s.start, s.stop, s.step)) and s.step.value != 0:
            trip = len(range(s.start.value, s.stop.value, s.step.value))
        self._trip_at[loop_depth + 1] = trip  # (a small constant loop may record)
        super().fwd_for(s, depth, loop_depth)

    def fwd_loop(self, s, depth, loop_depth):
        self._trip_at[loop_depth + 1] = None
        if s.uid not in self.a.checkpoint:
            return super().fwd_loop(s, depth, loop_depth)
        self.comment(depth, s.loc)
        if not self.nopush:
            self._push_arrays(s, depth)
        for v in self.a.replay[s.uid]:
            self.push(depth, self.n(v), self.T[v])
        cnt = self._count_name(s)
        self.emit(depth, f"{cnt} = 0")
        self.emit(depth, "# (not recorded here: reversed from checkpoints)")
        self.emit(depth, "while True:")
        self.emit(depth + 1, f"{cnt} += 1")
        saved = self.nopush
        self.nopush = True
        self.fwd(s.body, depth + 1, loop_depth + 1)
        self.nopush = saved

    def _rev_for(self, s, depth, loop_depth):
        self._with_shared_replays(s, depth, lambda: super(CudaWriter, self)._rev_for(
            s, depth, loop_depth) if s.uid not in self.a.checkpoint else
            self._rev_checkpointed(s, depth, loop_depth))

    def rev_loop(self, s, depth, loop_depth):
        self._with_shared_replays(s, depth, lambda: super(CudaWriter, self).rev_loop(
            s, depth, loop_depth) if s.uid not in self.a.checkpoint else
            self._rev_checkpointed(s, depth, loop_depth))

    def _with_shared_replays(self, s, depth, reverse):
        """Reverse loop ``s``; when its replayed iterations rewrite shared memory, the
        block meets at a barrier before (threads may still be reading what the first
        replay overwrites) and after (what follows reads it again)."""
        shared = set(self.a.replay_shared.get(s.uid, ()))
        saved = self._replay_shared
        self._replay_shared = saved | shared
        try:
            if shared:
                self.emit(depth, "cuda.syncthreads()  # before replays rewrite shared "
                                 "memory")
            reverse()
            if shared:
                self.emit(depth, "cuda.syncthreads()  # after them")
        finally:
            self._replay_shared = saved

    def _iteration(self, s, depth, loop_depth, record):
        """One iteration of loop ``s``'s body; a body that may ``break``/``continue``
        runs in a one-trip loop that those leave."""
        if any(isinstance(x, (ir.Break, ir.Continue)) for x in ir.walk_level(s.body)):
            self.emit(depth, f"for {self.fresh('once')} in range(1):")
            depth += 1
        self._body(s, depth, loop_depth, record)

    def _rev_checkpointed(self, s, depth, loop_depth):
        a = self.a
        saved_vars = a.replay[s.uid]
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
        self.emit(depth, f"# reversed from checkpoints ({S} slots, recursive bisection): "
                         f"{header}")
        scratch = self._scratch(s)
        if isinstance(s, ir.ForRange) and self._counted(s) and loop_depth > 0 and \
                id(s) in self.kept:
            # (the forward recorded the trip count after the loop: fwd_for)
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
        ck_own = {name: self.local_array(f"ck_{self.n(name)}", S, dt)
                  for name, elem, cond, dt in owned}

        def save(d, slot):
            for v in saved_vars:
                self.emit(d, f"{ck[v]}[{slot}] = {self.n(v)}")
            for name, dims, size, dt in scratch:
                self._copy_array(d, name, dims, size,
                                 lambda z, ref: f"{ck_arr[name]}[{slot}, {z}] = {ref}")
            for name, elem, cond, dt in owned:  # each thread its own shared element
                self.emit(d, f"if {cond}:")
                self.emit(d + 1, f"{ck_own[name]}[{slot}] = {elem}")

        def load(d, slot):
            for v in saved_vars:
                val = f"{ck[v]}[{slot}]"
                if isinstance(self.T[v], types.Boolean):
                    val = f"{val} != 0"
                self.emit(d, f"{self.n(v)} = {val}")
            for name, dims, size, dt in scratch:
                self._copy_array(d, name, dims, size,
                                 lambda z, ref: f"{ref} = {ck_arr[name]}[{slot}, {z}]")
            if owned:
                self.emit(d, "cuda.syncthreads()  # nobody reads the shared state now")
            for name, elem, cond, dt in owned:
                self.emit(d, f"if {cond}:")
                self.emit(d + 1, f"{elem} = {ck_own[name]}[{slot}]")
            if owned:
                self.emit(d, "cuda.syncthreads()  # every thread restored its element")

        def set_index(d, k):
            if idx is not None:
                self.emit(d, f"{idx} = {_index(lo, k, st)}")

        self.emit(depth, f"{n} = {trips}")
        self.emit(depth, f"{top} = 0")
        self.emit(depth, f"{ck_it}[0] = 0")
        save(depth, 0)
        self.emit(depth, f"for {r} in range({n} - 1, -1, -1):")
        d1, d2, d3 = depth + 1, depth + 2, depth + 3
        self.emit(d1, f"while {ck_it}[{top}] > {r}:")
        self.emit(d2, f"{top} -= 1")
        self.emit(d1, f"{cur} = {ck_it}[{top}]")
        load(d1, top)
        self.emit(d1, f"while {cur} < {r}:")
        self.emit(d2, f"{mid} = {cur} + ({r} - {cur} + 1) // 2")
        self.emit(d2, f"while {cur} < {mid}:")
        set_index(d3, cur)
        self._iteration(s, d3, loop_depth + 1, record=False)
        self.emit(d3, f"{cur} += 1")
        self.emit(d2, f"if {mid} < {r} and {top} + 1 < {S}:")
        self.emit(d3, f"{top} += 1")
        self.emit(d3, f"{ck_it}[{top}] = {cur}")
        save(d3, top)
        set_index(d1, r)
        self.emit(d1, "# replay this iteration's forward part, recording")
        self.open_frame(d1)
        self._iteration(s, d1, loop_depth, record=True)
        self.close_frame()
        saved_kept = self.kept
        self.kept = set(map(id, ir.walk(s.body)))
        self.rev(s.body, d1, loop_depth + 1, frozenset())
        self.kept = saved_kept
        self.emit(depth, "# the state before the loop")
        load(depth, 0)
        self.loop_report.append({
            "line": getattr(s.loc, "line", None), "loop": header,
            "carried": [self.n(v) for v in a.checkpoint[s.uid]],
            "checkpointed": [self.n(v) for v in saved_vars] + [
                f"{self.n(name)}[{size}]" for name, _, size, _ in scratch] + [
                f"{elem} (each thread its own)" for _, elem, _, _ in owned],
            "slots": S,
            "recompute": f"<= ceil(log2(n)) + 1 forward iterations per reversed one "
                         f"(amortised) while n <= 2**{S}",
        })

    # ---- checks -------------------------------------------------------------------
    def check(self):
        a, k = self.a, self.k
        if a.work_arrays:
            names = ", ".join(sorted(a.work_arrays))
            raise DifferentiationError(
                f"the kernel both reads and writes the array(s) {names} at elements other "
                "threads may touch (in-place updates are supported only at the thread's "
                "own element, x[i] with i from cuda.grid)", kernel=k.name,
                loc=self._first_store(a.work_arrays), construct="array read and written",
                remedy="write the result into a separate output array")
        restore = {x for x in a.restore_arrays if self.space.get(x) != "local"}
        if restore:
            raise DifferentiationError(
                "the adjoint would need earlier contents of overwritten arrays "
                f"({', '.join(sorted(restore))}): values read from them are "
                "overwritten later in the kernel and the reverse sweep cannot recompute "
                "them", kernel=k.name, loc=self._first_store(restore),
                construct="overwritten array",
                remedy="write new values into a separate array (double buffering) "
                       "instead of overwriting ones still needed")
        other = sorted(v for v in a.scratch_arrays if v not in self.space)
        if other:
            raise DifferentiationError(
                f"array allocation ({', '.join(other)}) inside a CUDA kernel",
                kernel=k.name, construct="array allocation",
                remedy="use cuda.local.array or cuda.shared.array")
        check_single_writers(k, self.index, self.space, a)

    def _first_store(self, arrays):
        for x in ir.walk(self.k.body):
            if isinstance(x, ir.Store) and x.array.name in arrays:
                return x.loc
        return None

    def write(self):
        self.check()
        return super().write()

    def report(self):
        arrays = {}
        for name, c in sorted(self.classes.items()):
            n_at = self.atomic_sites.get(name, 0)
            n_pl = self.plain_sites.get(name, 0)
            how = "atomic" if n_at else ("plain" if n_pl else "none")
            if any(a == name for a, _ in self.uniform_acc):
                how = "block-reduced"
            arrays[name] = {"class": c.cls, "accumulation": how, "why": c.why,
                            "atomic_sites": n_at, "plain_sites": n_pl}
        shared = {n for n, sp in self.space.items() if sp == "shared"}
        return {
            # atomic instructions written, in global memory (arrays, and one per block
            # per scalar) and in shared memory (shared arrays, the scalars' slots)
            "atomics": sum(v for k, v in self.atomic_sites.items() if k not in shared),
            "shared_atomics": sum(v for k, v in self.atomic_sites.items() if k in shared)
            + len(self.scalar_report) + len(self.uniform_report),
            "plain_accumulations": sum(self.plain_sites.values()),
            "private_arrays": tuple(sorted(self.private_arrays)),
            "arrays": arrays,
            "scalars": dict(self.scalar_report),
            "uniform_elements": dict(self.uniform_report),
            "loops": list(self.loop_report),
            "tape": dict(self.tape_size),
            "launch_ndim": self.index.ndim,
            # the dimensions whose threadIdx / blockIdx the kernel reads: an adjoint
            # launch may extend only along those (kadj.cuda.threads.check_launch_dims)
            "thread_dims": {"block": "".join("xyz"[d] for d in self.index.block_dims),
                            "grid": "".join("xyz"[d] for d in self.index.grid_dims)},
            "in_place_cells": {a: "the thread's own element, updated in place, held in "
                                  "a scalar" for a in sorted(self.cells)},
        }


def _unravel(flat, dims):
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


def write_cuda_adjoint(kernel, an, slot_args, slots=DEFAULT_SLOTS, cells=None):
    fname = f"{kernel.name}_adjoint"
    w = CudaWriter(kernel, an, slot_args, fname, slots=slots, cells=cells)
    source, params = w.write()
    return AdjointSource(name=fname, source=source, namespace=w.ns,
                         param_names=params), w.report(), w
