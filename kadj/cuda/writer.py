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

DEFAULT_SLOTS = 24


class CudaWriter(Writer):
    def __init__(self, kernel, an, slot_args, fname, slots=DEFAULT_SLOTS):
        super().__init__(kernel, an, slot_args, False, fname)
        from numba import cuda
        self.ns["cuda"] = cuda
        self.slots = int(slots)
        self.index = ThreadIndex(kernel, an.assign_count)
        self.classes = {name: self.index.classify(name, idxs)
                        for name, idxs in array_accesses(kernel).items()
                        if name in an.varied_arrays}
        self.private_arrays = {n for n, c in self.classes.items() if c.cls == "private"}
        self.atomic_sites = {}      # array -> atomics written
        self.plain_sites = {}       # array -> plain accumulations written
        self.tape_size = {}
        self.local_arrays = []      # (name, size, dtype name) declared in the prologue
        self.loop_report = []
        self.scalar_report = {}
        self._ld = 0
        self._replay_ld = None

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
        buf, _, rest = target.partition("[")
        index = rest[:-1]
        if len(target.index) > 1:
            index = f"({index})"
        self.atomic_sites[arr] = self.atomic_sites.get(arr, 0) + 1
        self.emit(depth, f"cuda.atomic.add({buf}, {index}, {text})")

    def local_array(self, hint, size, dtype):
        name = self.fresh(hint)
        self.local_arrays.append((name, size, self.bind(dtype, str(dtype))))
        return name

    # ---- scalar adjoints: one atomic per block --------------------------------------
    def finish_scalar_adjoints(self, names):
        if not names:
            return
        self.emit(1, "# ---- scalar adjoints: summed over the block, one atomic per "
                     "block ----")
        tid = self.fresh("tid")
        self.emit(1, f"{tid} = cuda.threadIdx.x + cuda.blockDim.x * (cuda.threadIdx.y + "
                     f"cuda.blockDim.y * cuda.threadIdx.z)")
        reds = {}
        for name in names:
            dt = self.T[name]
            red = self.fresh(f"red_{self.n(name)}")
            reds[name] = red
            self.emit(1, f"{red} = cuda.shared.array(32, {self.bind(dt, str(dt))})")
            self.emit(1, f"if {tid} < 32:")
            self.emit(2, f"{red}[{tid}] = {self.zero(dt)}")
            self.scalar_report[name] = ("block-reduced: 32 shared-memory slots, "
                                        "one global atomic per block")
        self.emit(1, "cuda.syncthreads()")
        for name in names:
            self.emit(1, f"cuda.atomic.add({reds[name]}, {tid} % 32, "
                         f"{self.cast(self.adj(name), self.T[name])})")
        self.emit(1, "cuda.syncthreads()")
        self.emit(1, f"if {tid} == 0:")
        w = self.fresh("w")
        used = self.fresh("slots")
        self.emit(2, f"{used} = min(32, cuda.blockDim.x * cuda.blockDim.y * "
                     f"cuda.blockDim.z)")
        for name in names:
            red = reds[name]
            total = self.fresh("total")
            self.emit(2, f"{total} = {red}[0]")
            self.emit(2, f"for {w} in range(1, {used}):")
            self.emit(3, f"{total} += {red}[{w}]")
            self.emit(2, f"cuda.atomic.add(adj_{name}_buf, 0, {total})")
            self.atomic_sites[name] = self.atomic_sites.get(name, 0) + 1

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

    def push(self, depth, value_text, t):
        if self.nopush:
            return
        if self._ld > 0 and self._ld != self._replay_ld:
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
        self.tape_size[kind] = self.tape_size.get(kind, 0) + 1

    def _reserve_lines(self, amounts, depth):
        return []  # the per-thread tape is sized statically

    def tape_init_lines(self):
        lines = []
        for kind in sorted(self.tapes):
            dt = {"f64": types.float64, "f32": types.float32, "i64": types.int64}[kind]
            lines.append(f"_tape_{kind} = cuda.local.array({self.tape_size.get(kind, 1)}, "
                         f"{self.bind(dt, str(dt))})")
            lines.append(f"_sp_{kind} = 0")
        for name, size, dt in self.local_arrays:
            lines.append(f"{name} = cuda.local.array({size}, {dt})")
        return lines

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

    def _rev_for(self, s, depth, loop_depth):
        a = self.a
        if s.uid not in a.checkpoint:
            return super()._rev_for(s, depth, loop_depth)
        if loop_depth > 0:
            raise DifferentiationError(
                "a loop that carries state and overwrites values its adjoint needs is "
                "nested in another loop", kernel=self.k.name, loc=s.loc,
                construct="nested loop with carried state",
                remedy="carry the state in the outer loop only, or split the kernel")
        saved_vars = a.replay[s.uid]
        idx = self.n(s.index)
        lo, hi, st = self.o(s.start), self.o(s.stop), self.o(s.step)
        S = self.slots
        self.comment(depth, s.loc)
        self.emit(depth, f"# reversed from checkpoints ({S} slots, recursive bisection): "
                         f"for {idx} in range({lo}, {hi}, {st})")
        if id(s) in self.kept:
            for v in reversed(saved_vars):
                self.pop(depth, self.n(v), self.T[v])
        n, top, cur, r, mid = (self.fresh(x) for x in ("n", "top", "cur", "r", "mid"))
        ck_it = self.local_array("ck_iter", S, types.int64)
        ck = {v: self.local_array(f"ck_{self.n(v)}", S, self._slot_type(v))
              for v in saved_vars}

        def save(d, slot):
            for v in saved_vars:
                self.emit(d, f"{ck[v]}[{slot}] = {self.n(v)}")

        def load(d, slot):
            for v in saved_vars:
                val = f"{ck[v]}[{slot}]"
                if isinstance(self.T[v], types.Boolean):
                    val = f"{val} != 0"
                self.emit(d, f"{self.n(v)} = {val}")

        def at(k):
            return _index(lo, k, st)

        self.emit(depth, f"{n} = _trips({lo}, {hi}, {st})")
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
        self.emit(d3, f"{idx} = {at(cur)}")
        self._body(s, d3, loop_depth + 1, record=False)
        self.emit(d3, f"{cur} += 1")
        self.emit(d2, f"if {mid} < {r} and {top} + 1 < {S}:")
        self.emit(d3, f"{top} += 1")
        self.emit(d3, f"{ck_it}[{top}] = {cur}")
        save(d3, top)
        self.emit(d1, f"{idx} = {at(r)}")
        self.emit(d1, "# replay this iteration's forward part, recording")
        self.open_frame(d1)
        self._body(s, d1, loop_depth, record=True)
        self.close_frame()
        saved_kept = self.kept
        self.kept = set(map(id, ir.walk(s.body)))
        self.rev(s.body, d1, loop_depth + 1, frozenset())
        self.kept = saved_kept
        self.emit(depth, "# the state before the loop")
        load(depth, 0)
        self.loop_report.append({
            "line": getattr(s.loc, "line", None), "index": idx,
            "carried": [self.n(v) for v in a.checkpoint[s.uid]],
            "checkpointed": [self.n(v) for v in saved_vars],
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
                f"the kernel both reads and writes the array(s) {names}; the CUDA adjoint "
                "does not support this", kernel=k.name,
                construct="array read and written",
                remedy="write the result into a separate output array")
        if a.restore_arrays:
            raise DifferentiationError(
                "the adjoint would need earlier contents of overwritten arrays "
                f"({', '.join(sorted(a.restore_arrays))})", kernel=k.name,
                construct="overwritten array", remedy="write into a separate array")
        if a.scratch_arrays:
            raise DifferentiationError(
                "arrays allocated inside the kernel are not supported yet",
                kernel=k.name, construct="array allocation",
                remedy="pass scratch arrays as arguments")

    def write(self):
        self.check()
        return super().write()

    def report(self):
        arrays = {}
        for name, c in sorted(self.classes.items()):
            n_at = self.atomic_sites.get(name, 0)
            n_pl = self.plain_sites.get(name, 0)
            how = "atomic" if n_at else ("plain" if n_pl else "none")
            arrays[name] = {"class": c.cls, "accumulation": how, "why": c.why,
                            "atomic_sites": n_at, "plain_sites": n_pl}
        return {
            "atomics": sum(self.atomic_sites.values()),
            "plain_accumulations": sum(self.plain_sites.values()),
            "private_arrays": tuple(sorted(self.private_arrays)),
            "arrays": arrays,
            "scalars": dict(self.scalar_report),
            "loops": list(self.loop_report),
            "tape": dict(self.tape_size),
            "launch_ndim": self.index.ndim,
        }


def _index(lo, k, st):
    base = k if st == "1" else f"{k} * {st}"
    return base if lo == "0" else f"{lo} + {base}"


def write_cuda_adjoint(kernel, an, slot_args, slots=DEFAULT_SLOTS):
    fname = f"{kernel.name}_adjoint"
    w = CudaWriter(kernel, an, slot_args, fname, slots=slots)
    source, params = w.write()
    return AdjointSource(name=fname, source=source, namespace=w.ns,
                         param_names=params), w.report()
