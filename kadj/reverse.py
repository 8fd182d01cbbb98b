"""Reverse: region tree + analyses + rules -> the adjoint, as adjoint IR, then source.

The adjoint function has three parts:

1. set-up: adjoint accumulators for scalars, work copies of arrays the kernel both
   reads and writes (the user's arrays are never modified), tapes;
2. the forward sweep (:mod:`kadj.forward_sweep`): the kernel's statements (dead ones
   removed), pushing on a tape each value the reverse sweep needs before the forward
   overwrites it, and the iteration count of loops that can exit early;
3. the reverse sweep (:mod:`kadj.reverse_sweep`): statements in reverse order, each
   adding its partial derivatives (from :mod:`kadj.rules`) times its adjoint into its
   operands' adjoints, popping overwritten values back.  ``for`` loops run backwards,
   recomputing at the top of each iteration the values :mod:`kadj.analysis` found
   recomputable.

The pass builds the adjoint IR (:mod:`kadj.adj_ir`); :mod:`kadj.tape_plan` decides the
tape reservations; :mod:`kadj.printer` makes the source.

The in/out rule of the adjoint buffers (API.md) falls out of this: a store consumes
the element's adjoint (sets it to zero after passing it on), a load accumulates.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from numba.core import types

from . import adj_ir as A
from . import ir
from .adj_naming import Naming
from .checkpoint_reverse import CheckpointedLoops
from .forward_sweep import ForwardSweep
from .memory_liveness import MemoryLiveness
from .dead_saves import drop_dead_saves
from .lowering import HOST_CONTEXT, POLICIES, lower_declarations
from .printer import Syntax, render
from .reverse_sweep import ReverseSweep
from .simplify import simplify
from .source_header import self_contained
from .tape_plan import plan_tape


@dataclass(frozen=True)
class AdjointSource:
    """A generated adjoint function: ``source`` runs as printed (it begins with its
    imports, :mod:`kadj.source_header`); ``namespace`` holds only the objects it names
    that have no importable name, which its header's comment lists."""
    name: str
    source: str
    namespace: dict
    param_names: tuple


def adjoint_source(fn, syntax, ns):
    """The :class:`AdjointSource` of the adjoint IR function ``fn`` printed with
    ``syntax``; ``ns`` binds every name the printed body uses that it does not define."""
    source, supplied = self_contained(render(fn, syntax), ns)
    return AdjointSource(name=fn.name, source=source, namespace=supplied,
                         param_names=fn.params)


class Writer(Naming, MemoryLiveness, CheckpointedLoops, ForwardSweep, ReverseSweep):
    """Builds the adjoint IR of one kernel (``build``) for any target; the target's
    :class:`kadj.lowering.Context` gives its policies, lowerings and state.  The sweeps
    place nodes by indentation depth (:class:`adj_ir.Builder`); each node placed goes
    through the context's ``lowerings`` first (functions ``(writer, node) -> node |
    None``); the declaration nodes are lowered after the build (:mod:`kadj.lowering`).
    :func:`kadj.printer.render` prints the IR with the context's ``syntax``."""
    syntax = Syntax()

    def __init__(self, kernel, an, slot_args, returns_value, fname, context=HOST_CONTEXT):
        self.ctx = context
        for policy in POLICIES:
            setattr(self, policy, getattr(context, policy))
        self.state = context.state
        self.k = kernel
        self.a = an
        self.T = kernel.types
        self.slot_args = tuple(slot_args)
        self.returns_value = returns_value
        self.init_names(kernel, fname)
        self.ns.update(context.namespace)
        self.allocs = {x.target: x for x in ir.walk(kernel.body)
                       if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Alloc)}
        self._live_arrays = set()
        self.b = A.Builder()
        self.body = self.b.targets[1]   # the function's body
        self.tapes = set()
        self.frames = []
        self._push_seq = 0
        self._cond_level = 0
        self.nopush = False
        self.skip_stores = False
        self.suppressed = frozenset()
        self.accumulators = {}
        self._last_loc = None
        self.slot_arrays = []      # checkpoint slots, declared in the prologue
        self.loop_report = []      # loops reversed from checkpoints
        self._replay_shared = set()   # shared tiles the replayed loop rewrites

    @contextmanager
    def mode(self, **flags):
        """Set the writer's mode flags (``nopush``, ``skip_stores``, ``suppressed``,
        ``kept``, ...) for the statements written inside the ``with``."""
        saved = {k: getattr(self, k) for k in flags}
        for k, v in flags.items():
            setattr(self, k, v)
        try:
            yield
        finally:
            for k, v in saved.items():
                setattr(self, k, v)

    # ---- the target's intrinsics in the source ----------------------------------------
    def bind(self, obj, hint):
        text = self.intrinsics.name(obj) if self.intrinsics is not None else None
        return text if text is not None else super().bind(obj, hint)

    def expr(self, e):
        for hook in self.ctx.expressions:
            text = hook(self, e)
            if text is not None:
                return text
        if self.intrinsics is not None and isinstance(e, ir.Op):
            text = self.intrinsics.value(e.fn)
            if text is not None:
                return text
        return super().expr(e)

    # ---- putting nodes ------------------------------------------------------------
    def put(self, depth, node):
        """Place ``node`` at ``depth``, lowered; an accumulation no lowering decided
        is plain."""
        for lower in self.lowerings:
            node = lower(self, node)
            if node is None:
                return None
        if isinstance(node, A.Accumulate) and node.how is None:
            node.how = "plain"
        return self.b.put(depth, node)

    def comment(self, depth, loc):
        if loc is None or loc == self._last_loc:
            return
        self._last_loc = loc
        src = ""
        try:
            src = _source_line(loc)
        except Exception:
            src = ""
        fname = (loc.filename or "").split("/")[-1]
        self.put(depth, A.Comment(f"# {fname}:{loc.line}: {src}".rstrip()))

    # ---- the function ------------------------------------------------------------
    def check(self):
        """The target's refusals of a kernel it cannot differentiate."""
        for check in self.ctx.checks:
            check(self)

    def build(self):
        """The adjoint IR of the kernel: an :class:`adj_ir.Function`, tape planned."""
        k, a = self.k, self.a
        self.check()
        if a.carried_replay:
            self.check_replayed_stores()
        self.liveness()
        self.find_single_use()
        params = self.adjoint_params()
        main = self.body
        self.put(1, A.Comment("# ---- forward sweep ----"))
        self.open_frame(1)
        self.fwd(k.body, 1, loop_depth=0)
        self.close_frame()
        self.put(1, A.Comment("# ---- reverse sweep ----"))
        self._last_loc = None
        self.rev(k.body, 1, loop_depth=0)
        self.put(1, A.FinishScalar(self.scalar_adjoints()))
        self.put(1, A.Return("_retval" if self.has_retval else "None"))
        prologue = [A.Assign(self.arr(name), self.work_copy(name))
                    for name in sorted(a.work_arrays)]
        prologue += self.declarations()
        for v in sorted(sorted(a.varied), key=self.n):  # unnamed ones: in a fixed order
            if isinstance(self.T.get(v), (types.Float, types.Complex)) and \
                    v not in self.single_use:
                prologue.append(A.Assign(self.adj_var(v), self.zero(self.T[v])))
        for v in sorted(sorted(self.declare), key=self.n):
            prologue.append(A.Assign(self.n(v), self.zero(self.T.get(v))))
        if self.has_retval:
            prologue.append(A.Assign("_retval", self.zero(k.return_type)))
        from .runtime_helpers import _reserve, _trips
        self.ns["_reserve"] = _reserve
        self.ns["_trips"] = _trips
        fn = A.Function(self.fname, tuple(params),
                        f"Adjoint of {k.name}: forward sweep, then reverse sweep "
                        f"(generated by kadj).", prologue, main, temps=self.temp_names)
        drop_dead_saves(fn)     # (a restore nothing reads: kadj.dead_saves)
        self.tape_size = plan_tape([fn], self.growable_tape, k.name)
        return fn

    def work_copy(self, name):
        """The work copy of argument array ``name``: a copy, or uninitialised memory
        when only replayed iterations read it, each after restoring its own row
        (analysis.rewrites.own_rows) and the forward sweep never reads it."""
        if name in self.replay_rewritten() and name not in self._replay_live:
            return f"np.empty_like({self.n(name)})"
        return f"{self.n(name)}.copy()"

    def adjoint_params(self):
        """The adjoint's parameters: the forward's, one adjoint per slot (a scalar's is a
        1-element ``adj_<name>_buf``), then ``adj_return`` for a returned value."""
        params = [self.n(a) for a in self.k.args]
        for name in self.slot_args:
            params.append(self.adj(name) if isinstance(self.T.get(name), types.Array)
                          else self.adj_buf(name))
        if self.returns_value:
            params.append("adj_return")
        return params

    def scalar_adjoints(self):
        """The scalar arguments whose adjoints go into their buffers at the end."""
        return tuple(name for name in self.slot_args
                     if not isinstance(self.T.get(name), types.Array) and
                     name in self.a.varied)

    def declarations(self):
        """The prologue's declaration nodes, lowered by the target
        (:mod:`kadj.lowering`): the tapes, the checkpoint slots, the kernel's own
        scratch arrays when the target declares them up front (``space``; a block
        zeroes a shared array's adjoint together, then meets), the local sums."""
        policy = "growable" if self.growable_tape else "bounded"
        out = [A.TapeDecl(kind, policy) for kind in sorted(self.tapes)]
        out += self.slot_arrays
        if self.declares_allocations:
            out += self._allocations()
        return out + [A.LocalSums()]

    def _allocations(self):
        out = []
        shared = False
        for name, s in self.allocs.items():
            shape, dtype = s.expr.args
            space = self.space[name]
            shp = shape.value

            def decl(n):
                return A.LocalArray(n, shp, dtype.value, space, dtype.name or "dtype")
            if name in self.a.loaded or name in self.a.varied_arrays:
                out.append(decl(self.n(name)))
            if name not in self.a.varied_arrays:
                continue
            adj = self.adj(name)
            dims = shp if isinstance(shp, tuple) else (shp,)
            out += [decl(adj), A.ZeroArray(adj, dims, self.zero(self.T[name].dtype), space)]
            shared = shared or space == "shared"
        if shared:
            out.append(A.Barrier())
        return out

    @property
    def has_retval(self):
        return isinstance(self.k.return_type, (types.Number, types.Boolean))

    @property
    def declare(self):
        # variables pushed (may be read before their first assignment in a loop), and
        # the scalars saved around loops or in checkpoints (a loop counter read after
        # its loop, saved before an enclosing checkpointed loop before any assignment)
        a = self.a
        saved = set(a.pushed)
        for group in (a.replay, a.loop_saved, a.checkpoint):
            for names in group.values():
                saved.update(names)
        return {v for v in saved if v not in self.k.args and
                isinstance(self.T.get(v), (types.Number, types.Boolean))}


def _source_line(loc):
    import linecache
    line = linecache.getline(loc.filename, loc.line).strip()
    return line


def build_adjoint(kernel, an, slot_args, returns_value, slots=None, lowered=True):
    """The adjoint IR of a CPU kernel, before printing: (Function, Writer); the
    writer holds the namespace the source needs and its ``syntax``.  ``slots``: the
    checkpoint slots of each loop the analysis chose to reverse from checkpoints.
    ``lowered=False``: the IR as the reverse pass built it, its declaration nodes not
    yet lowered (:mod:`kadj.lowering`) nor simplified."""
    w = Writer(kernel, an, slot_args, returns_value, f"{kernel.name}_adjoint")
    w.slots = slots
    fn = w.build()
    if not lowered:
        return fn, w
    fn = lower_declarations(fn, w, w.ctx.declarations)
    return A.built(simplify(fn, w.T, joins=w.ctx.join_names), "scatter"), w


def write_adjoint(kernel, an, slot_args, returns_value, slots=None):
    fn, w = build_adjoint(kernel, an, slot_args, returns_value, slots)
    return adjoint_source(fn, w.syntax, w.ns)
