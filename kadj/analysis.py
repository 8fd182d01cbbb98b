"""Analyses on the region tree that the reverse pass relies on.

- **activity** (``varied``): which float variables and arrays depend on a
  differentiable input; only those get adjoint code.  Flow-insensitive fixpoint over
  the whole kernel (conservative: a variable is varied if any assignment to it is).
- **arrays**: which arrays are read, written, read-and-written (the adjoint runs its
  forward sweep on a work copy of those, never on the user's array), which have
  adjoint arrays.
- **recomputation** (``recompute``): per ``for ... in range`` loop, the statements at
  the top of its body whose values depend only on the loop index, on variables the loop
  does not assign and on arrays the loop does not write.  The reverse sweep recomputes
  them at the start of each reversed iteration instead of storing them: a loop whose
  reverse needs only such values (stencils, maps, most reductions) needs no tape.
- **needed / pushed** (TBR, "to be recorded", as in Tapenade): the values the reverse
  sweep reads; of those, the ones the forward overwrites (assigned in a loop or more than
  once) and cannot recompute are pushed on a tape before being overwritten and popped
  in the reverse sweep.  Arrays are restored the same way only when a recomputed
  statement later reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from numba.core import types

from . import ir
from . import rules
from .errors import DifferentiationError


@dataclass
class Analysis:
    kernel: ir.Kernel
    slot_args: tuple            # argument names with adjoint slots
    varied: set = field(default_factory=set)        # varied float scalar variables
    varied_arrays: set = field(default_factory=set)  # arrays with adjoint arrays
    param_arrays: set = field(default_factory=set)
    scratch_arrays: set = field(default_factory=set)
    loaded: set = field(default_factory=set)
    stored: set = field(default_factory=set)
    work_arrays: set = field(default_factory=set)    # params read and written
    assign_count: dict = field(default_factory=dict)
    in_loop: set = field(default_factory=set)        # variables assigned inside a loop
    recompute: dict = field(default_factory=dict)    # loop uid -> tuple of stmts
    recompute_vars: dict = field(default_factory=dict)  # loop uid -> set of vars
    needed: set = field(default_factory=set)
    pushed: set = field(default_factory=set)
    restore_arrays: set = field(default_factory=set)
    has_rev: dict = field(default_factory=dict)      # id(stmt) -> bool
    index_saved: set = field(default_factory=set)    # loop uids whose index is saved
    ascending: set = field(default_factory=set)      # loops reversible in forward order
    replay: dict = field(default_factory=dict)       # loop uid -> vars saved around it
    loop_saved: dict = field(default_factory=dict)   # loop uid -> vars saved around it
    replay_fresh: set = field(default_factory=set)   # ids of first defs in replayed loops
    checkpoint: dict = field(default_factory=dict)   # loop uid -> carried vars (CUDA)
    carried_replay: bool = False   # replay loops that carry state (from checkpoints)
    private_scratch: frozenset = frozenset()  # per-thread scratch arrays (CUDA local)
    unwritten: frozenset = frozenset()   # arrays the adjoint never writes (CUDA cells)
    shared_scratch: frozenset = frozenset()  # block-shared arrays (CUDA shared)
    owned_shared: frozenset = frozenset()  # shared arrays each thread writes only at
    #                                        its own element (CUDA: sm[threadIdx.x])
    checkpoint_owned: dict = field(default_factory=dict)  # loop uid -> such arrays
    force_replay: set = field(default_factory=set)   # loops replayed for their arrays
    replay_shared: dict = field(default_factory=dict)  # loop uid -> shared arrays
    checkpoint_arrays: dict = field(default_factory=dict)  # loop uid -> such arrays

    def is_float(self, name):
        return isinstance(self.kernel.types.get(name), types.Float)

    def active(self, x):
        return isinstance(x, ir.Var) and x.name in self.varied


def analyze(kernel, slot_args, returns_value=True, carried_replay=False,
            private_scratch=(), unwritten=(), shared_scratch=(), owned_shared=()):
    """``carried_replay``: loops whose iterations carry state are replayed too, each
    reversed iteration starting from that state restored from a checkpoint
    (:attr:`Analysis.checkpoint`; the CUDA writer, whose tape is bounded per thread)."""
    a = Analysis(kernel=kernel, slot_args=tuple(slot_args), carried_replay=carried_replay,
                 private_scratch=frozenset(private_scratch),
                 unwritten=frozenset(unwritten), shared_scratch=frozenset(shared_scratch),
                 owned_shared=frozenset(owned_shared))
    T = kernel.types
    body = kernel.body
    for name, t in T.items():
        if isinstance(t, types.Complex) or (isinstance(t, types.Array) and
                                            isinstance(t.dtype, types.Complex)):
            raise DifferentiationError(
                f"'{name}' is complex ({t}); complex-valued kernels are not supported yet",
                kernel=kernel.name, construct="complex value",
                remedy="split the computation into real and imaginary parts")
    for name in kernel.args:
        if isinstance(T.get(name), types.Array):
            a.param_arrays.add(name)
    for s in ir.walk(body):
        if isinstance(s, ir.Assign):
            a.assign_count[s.target] = a.assign_count.get(s.target, 0) + 1
            if isinstance(s.expr, ir.Alloc):
                a.scratch_arrays.add(s.target)
            elif isinstance(T.get(s.target), types.Array) and not (
                    isinstance(s.expr, ir.Copy) and isinstance(s.expr.src, ir.GlobalRef)):
                raise DifferentiationError(
                    "array variables may not be rebound or aliased",
                    kernel=kernel.name, loc=s.loc, construct="array alias",
                    remedy="index the original array directly")
    for name in a.param_arrays:
        if name in a.assign_count:
            raise DifferentiationError(
                f"the array argument '{name}' is rebound inside the kernel",
                kernel=kernel.name, construct="array rebinding",
                remedy="use a new name for the new array")
    _check_scratch_placement(kernel, a)
    a.loaded = ir.loaded_arrays(body)
    a.stored = ir.stored_arrays(body)
    a.work_arrays = a.param_arrays & a.loaded & a.stored
    _loop_assigned(body, a, False)
    _activity(kernel, a)
    _usefulness(kernel, a, returns_value)
    _recompute(body, a)
    _needed(body, a)
    loop_indices = {s.index for s in ir.walk(body) if isinstance(s, ir.ForRange)}
    while True:
        for v in a.needed:
            if v in loop_indices and a.assign_count.get(v, 0) == 0:
                continue
            if any(v in rv for rv in a.recompute_vars.values()):
                continue
            defs = a.assign_count.get(v, 0) + (1 if v in kernel.args else 0)
            if defs > 1 or v in a.in_loop:
                a.pushed.add(v)
        # an `if` that records values must be re-decided in the reverse sweep to pop
        # them: its condition is needed too
        extra = set()
        for s in ir.walk(body):
            if isinstance(s, ir.If) and isinstance(s.cond, ir.Var) and \
                    s.cond.name not in a.needed and any(
                        isinstance(x, ir.Assign) and x.target in a.pushed
                        for x in ir.walk(s.then + s.orelse)):
                extra.add(s.cond.name)
        if not extra:
            break
        a.needed |= extra
    for s in ir.walk(body):
        if isinstance(s, ir.ForRange) and _order_free(s, a):
            a.ascending.add(s.uid)
    while True:
        forced = set(a.force_replay)
        a.replay = {}
        a.replay_fresh = set()
        a.checkpoint = {}
        a.checkpoint_arrays = {}
        a.checkpoint_owned = {}
        a.replay_shared = {}
        _find_replay(body, a, False)
        # a replayed iteration reads arrays as they were: restore those written elsewhere
        extra = set()
        for st in ir.walk(body):
            if isinstance(st, (ir.ForRange, ir.Loop)) and st.uid in a.replay and \
                    not stale_loads_harmless(st, a):
                extra |= (ir.loaded_arrays(st.body) & a.stored) - a.unwritten
        if extra <= a.restore_arrays and a.force_replay == forced:
            break
        a.restore_arrays |= extra
    _find_loop_saved(body, a, frozenset(), False)
    for v in a.pushed:
        t = T.get(v)
        if not isinstance(t, (types.Number, types.Boolean)):
            raise DifferentiationError(
                f"the value of '{v}' ({t}) is overwritten but needed by the reverse sweep",
                kernel=kernel.name, construct="overwritten non-scalar value",
                remedy="assign the value to a new variable instead of overwriting it")
    # the adjoint never writes an unwritten array (a CUDA cell's): no work copy of it,
    # nothing of it to restore
    a.work_arrays -= a.unwritten
    a.restore_arrays -= a.unwritten
    return a


def _check_scratch_placement(kernel, a):
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


def _loop_assigned(stmts, a, inside):
    for s in stmts:
        if isinstance(s, ir.Assign) and inside:
            a.in_loop.add(s.target)
        elif isinstance(s, ir.If):
            _loop_assigned(s.then, a, inside)
            _loop_assigned(s.orelse, a, inside)
        elif isinstance(s, ir.ForRange):
            if inside:
                a.in_loop.add(s.index)
            _loop_assigned(s.body, a, True)
        elif isinstance(s, ir.Loop):
            _loop_assigned(s.body, a, True)


# ---- activity ------------------------------------------------------------------------
def _activity(kernel, a):
    T = kernel.types
    for name in a.slot_args:
        if isinstance(T.get(name), types.Array):
            a.varied_arrays.add(name)
        elif isinstance(T.get(name), types.Float):
            a.varied.add(name)
    stmts = list(ir.walk(kernel.body))
    changed = True
    while changed:
        changed = False
        for s in stmts:
            if isinstance(s, ir.Assign):
                if s.target in a.varied or not isinstance(T.get(s.target), types.Float):
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
                if arr not in a.varied_arrays and a.active(s.value) and \
                        isinstance(T.get(arr), types.Array) and \
                        isinstance(T[arr].dtype, types.Float):
                    a.varied_arrays.add(arr)
                    changed = True


def _usefulness(kernel, a, returns_value):
    """Backward fixpoint: variables whose adjoint can reach an output (a store into an
    array with an adjoint, or the returned value).  Active = varied and useful."""
    from . import ops
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


# ---- recomputation ------------------------------------------------------------------
def _recompute(stmts, a):
    for s in stmts:
        if isinstance(s, ir.If):
            _recompute(s.then, a)
            _recompute(s.orelse, a)
        elif isinstance(s, ir.Loop):
            _recompute(s.body, a)
        elif isinstance(s, ir.ForRange):
            _recompute(s.body, a)
            _recompute_loop(s, a)


def _reads_outside(a, loop, names):
    inside = set(map(id, ir.walk(loop.body)))
    for s in ir.walk(a.kernel.body):
        if id(s) in inside or s is loop:
            continue
        if ir.stmt_reads(s) & names:
            return True
    return False


def _index_read_outside(a, loop):
    """Is the loop variable read outside the loop, other than inside another loop that
    binds the same name (``for i`` twice)?"""
    own = set()
    for s in ir.walk(a.kernel.body):
        if isinstance(s, ir.ForRange) and s.index == loop.index:
            own |= set(map(id, ir.walk(s.body)))
    for s in ir.walk(a.kernel.body):
        if id(s) in own or s is loop:
            continue
        if loop.index in ir.stmt_reads(s):
            return True
    return False


def _recompute_loop(loop, a):
    assigned_in = ir.assigned(loop.body)
    stored_in = ir.stored_arrays(loop.body)
    rvars = set()
    chosen = []

    def ok_operand(x):
        if not isinstance(x, ir.Var):
            return True
        n = x.name
        return n == loop.index or n in rvars or n not in assigned_in

    def ok_assign(s, allowed_count):
        e = s.expr
        if isinstance(e, ir.Alloc):
            return False
        if a.assign_count.get(s.target, 0) != allowed_count.get(s.target, 0):
            return False
        if isinstance(e, ir.Load) and e.array.name in stored_in:
            return False
        if isinstance(e, ir.Op) and getattr(e.fn, "_kadj_impure", False):
            return False
        return all(ok_operand(x) for x in ir.operands(e))

    for s in loop.body:
        if isinstance(s, ir.Assign):
            if ok_assign(s, {s.target: 1}) and not _reads_outside(a, loop, {s.target}):
                chosen.append(s)
                rvars.add(s.target)
        elif isinstance(s, ir.If):
            inner = list(ir.walk((s,)))
            if any(isinstance(x, (ir.ForRange, ir.Loop, ir.Return)) for x in inner):
                continue
            if not ok_operand(s.cond):
                continue
            counts = {}
            for x in inner:
                if isinstance(x, ir.Assign):
                    counts[x.target] = counts.get(x.target, 0) + 1
            multi = set()
            for arm in _arms(s):
                arm_counts = {}
                for x in ir.walk(arm):
                    if isinstance(x, ir.Assign):
                        arm_counts[x.target] = arm_counts.get(x.target, 0) + 1
                multi |= {t for t, c in arm_counts.items() if c > 1}
            rejected = {t for t in counts if a.assign_count.get(t, 0) != counts[t]
                        or t in multi or _reads_outside(a, loop, {t})}
            while True:
                accepted, bad = set(), set()

                def visit(seq, avail):
                    avail = set(avail)
                    for x in seq:
                        if isinstance(x, ir.Assign):
                            saved_r = set(rvars)
                            rvars.update(avail)
                            good = x.target not in rejected and ok_assign(x, counts)
                            rvars.clear()
                            rvars.update(saved_r)
                            if good:
                                avail.add(x.target)
                                accepted.add(x.target)
                            else:
                                bad.add(x.target)
                        elif isinstance(x, ir.If):
                            c = x.cond
                            if isinstance(c, ir.Var) and c.name in assigned_in and \
                                    c.name not in avail and c.name not in rvars and \
                                    c.name != loop.index:
                                bad.update(y.target for y in ir.walk((x,))
                                           if isinstance(y, ir.Assign))
                                continue
                            a1 = visit(x.then, avail)
                            a2 = visit(x.orelse, avail)
                            avail |= (a1 | a2)
                    return avail

                visit(s.then, set())
                visit(s.orelse, set())
                newly = bad - rejected
                if not newly:
                    break
                rejected |= newly
            accepted -= rejected
            if accepted:
                chosen.append(_assigns_only(s, accepted))
                rvars |= accepted
    a.recompute[loop.uid] = tuple(chosen)
    a.recompute_vars[loop.uid] = rvars


def _arms(s):
    yield s.then
    yield s.orelse


def _max_assign_count(seq):
    counts = {}
    for x in ir.walk(seq):
        if isinstance(x, ir.Assign):
            counts[x.target] = counts.get(x.target, 0) + 1
    return max(counts.values(), default=0)


def _assigns_only(s, keep_targets=None):
    """The If with only its (kept) assignments: what the reverse sweep recomputes."""
    from dataclasses import replace

    def keep(seq):
        out = []
        for x in seq:
            if isinstance(x, ir.Assign):
                if keep_targets is None or x.target in keep_targets:
                    out.append(x)
            elif isinstance(x, ir.If):
                sub = _assigns_only(x, keep_targets)
                if sub.then or sub.orelse:
                    out.append(sub)
        return tuple(out)

    return replace(s, then=keep(s.then), orelse=keep(s.orelse))


# ---- needed values ------------------------------------------------------------------
def partial_reads(s, a):
    """Variables the adjoint of Assign ``s`` reads (it must be active)."""
    e = s.expr
    out = set()
    if isinstance(e, ir.Load):
        if e.array.name in a.varied_arrays:
            out |= ir.var_names(e.index)
    elif isinstance(e, ir.Op):
        rule = rules.lookup(e.fn)
        if rule is not None:
            from . import ops
            args = [ops.var(x.name) if isinstance(x, ir.Var) else ops.const(
                x.value if isinstance(x, ir.Const) and isinstance(x.value, (int, float))
                else 0.0) for x in e.args]
            contribs = rules.expand(rule, ops.var(ir.COTANGENT), ops.var(s.target), args)
            for x, c in zip(e.args, contribs):
                if c is not None and a.active(x):
                    out |= ops._lift(c).variables()
            out.discard(ir.COTANGENT)
    return out


def _needed(body, a):
    needed = set()

    def visit(stmts):
        any_rev = False
        for s in stmts:
            r = False
            if isinstance(s, ir.Assign):
                if s.target in a.varied:
                    needed.update(partial_reads(s, a))
                    r = True
            elif isinstance(s, ir.Store):
                if s.array.name in a.varied_arrays:
                    needed.update(ir.var_names(s.index))
                    r = True
            elif isinstance(s, ir.If):
                r1 = visit(s.then)
                r2 = visit(s.orelse)
                r = r1 or r2
                if r:
                    needed.update(ir.var_names((s.cond,)))
            elif isinstance(s, ir.ForRange):
                r = visit(s.body)
                if r:
                    needed.update(ir.var_names((s.start, s.stop, s.step)))
            elif isinstance(s, ir.Loop):
                r = visit(s.body)
            elif isinstance(s, ir.Return):
                r = s.value is not None and a.active(s.value)
            elif isinstance(s, ir.Barrier):
                r = True  # mirrored in the reverse sweep
            a.has_rev[id(s)] = r
            any_rev = any_rev or r
        return any_rev

    visit(body)
    # recomputed statements read their operands at reverse time
    core = _recompute_closure(a, set(needed))
    changed = True
    while changed:
        changed = False
        for uid, stmts in a.recompute.items():
            for s in ir.walk(stmts):
                reads = ir.stmt_reads(s)
                for v in reads:
                    if v not in needed:
                        needed.add(v)
                        changed = True
                if isinstance(s, ir.Assign) and isinstance(s.expr, ir.Load) and \
                        s.expr.array.name not in a.unwritten and (
                        not a.carried_replay or (
                            s.target in core and
                            _stored_during_or_after(a, uid, s.expr.array.name))):
                    owner = _rewriting_loop(a, uid, s.expr.array.name)
                    if owner is not None:
                        # a tile rewritten at each iteration of an enclosing loop:
                        # replaying that iteration rewrites it (shared memory)
                        a.force_replay.add(owner)
                        continue
                    a.restore_arrays.add(s.expr.array.name)
    a.restore_arrays &= (a.stored & a.loaded)
    # loop indices are re-created by the reversed loop; save them when read outside it
    for s in ir.walk(body):
        if isinstance(s, ir.ForRange) and s.index in needed and \
                _index_read_outside(a, s):
            a.index_saved.add(s.uid)
    needed.discard(None)
    a.needed = needed


def _replayed_tile(a, loop, arr):
    """Is ``arr`` a shared tile that a loop enclosing ``loop`` rewrites at each
    iteration?  Then that loop is replayed (forced), and ``loop``, replayed inside its
    replayed iteration, reads the tile of that iteration."""
    if not a.carried_replay:
        return False
    owner = _rewriting_loop(a, loop.uid, arr)
    if owner is None:
        return False
    a.force_replay.add(owner)
    return True


def _recompute_closure(a, needed):
    """The variables the reverse sweep reads, with the recomputed statements that define
    them and what those read, transitively: a recomputed load outside this set is never
    emitted (kadj.reverse: _needed_recompute), so its array needs no restoring."""
    core = set(needed)
    changed = True
    while changed:
        changed = False
        for stmts in a.recompute.values():
            for x in ir.walk(stmts):
                if isinstance(x, ir.Assign) and x.target in core:
                    new = ir.stmt_reads(x) - core
                elif isinstance(x, ir.If) and any(
                        isinstance(y, ir.Assign) and y.target in core
                        for y in ir.walk(x.then + x.orelse)):
                    new = ir.stmt_reads(x) - core
                else:
                    continue
                if new:
                    core |= new
                    changed = True
    return core


def rewritten_each_iteration(loop, arr):
    """Does every iteration of ``loop`` write shared array ``arr`` (a statement of the
    body itself, not under a branch) before reading it?  Then an iteration reads what
    it wrote (after a barrier: a tile), never an earlier iteration's contents."""
    first_store = None
    for k, x in enumerate(loop.body):
        if isinstance(x, ir.Store) and x.array.name == arr:
            first_store = k
            break
    if first_store is None:
        return False
    for x in ir.walk(loop.body[:first_store]):
        if isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load) and \
                x.expr.array.name == arr:
            return False
    return True


def _rewriting_loop(a, uid, arr):
    """The uid of a loop enclosing loop ``uid`` that rewrites shared array ``arr`` at
    each iteration (CUDA tiles), or None."""
    if arr not in a.shared_scratch:
        return None
    found = None

    def visit(stmts, stack):
        nonlocal found
        for x in stmts:
            if isinstance(x, ir.If):
                visit(x.then, stack)
                visit(x.orelse, stack)
            elif isinstance(x, (ir.ForRange, ir.Loop)):
                if x.uid == uid:
                    for outer in reversed(stack):
                        if rewritten_each_iteration(outer, arr):
                            found = outer.uid
                            return
                    return
                visit(x.body, stack + [x])

    visit(a.kernel.body, [])
    return found


def _stored_during_or_after(a, uid, arr):
    """Can a store into ``arr`` run after (or during) loop ``uid`` in the forward
    sweep?  If not, a load that the loop's reverse recomputes reads the value the
    forward read, and ``arr`` need not be restored."""
    order = list(ir.walk(a.kernel.body))
    pos = next(k for k, x in enumerate(order)
               if isinstance(x, (ir.ForRange, ir.Loop)) and x.uid == uid)
    for x in order[pos:]:
        if isinstance(x, ir.Store) and x.array.name == arr:
            return True
    # enclosing loops run their whole body again
    for x in order[:pos]:
        if isinstance(x, (ir.ForRange, ir.Loop)) and any(
                y is order[pos] for y in ir.walk(x.body)) and arr in ir.stored_arrays(x.body):
            return True
    return False


def _order_free(loop, a):
    """True when the reversed iterations of ``loop`` may run in forward order: nothing
    is recorded on a tape inside it, no active value is carried from one iteration to
    the next, every store into an array with an adjoint hits an element indexed by the
    loop variable (distinct per iteration), and no array the loop stores is also loaded
    in it.  Then each iteration's adjoint reads only adjoints of its own stored elements
    and only adds (commutatively) into others."""
    inner = list(ir.walk(loop.body))
    if loop.uid in a.index_saved:
        return False
    stored = ir.stored_arrays(loop.body)
    if stored & ir.loaded_arrays(loop.body):
        return False
    if stored & a.restore_arrays:
        return False
    active_assigned = set()
    for s in inner:
        if isinstance(s, (ir.Loop, ir.Break, ir.Continue, ir.Return, ir.Barrier)):
            return False
        if isinstance(s, ir.Assign):
            if s.target in a.pushed:
                return False
            if s.target in a.varied:
                active_assigned.add(s.target)
        if isinstance(s, ir.Store) and s.array.name in a.varied_arrays:
            if ir.Var(loop.index) not in s.index:
                return False
    # an active value carried from one iteration into the next orders the adjoints
    if active_assigned & upward_exposed(loop):
        return False
    if _reads_outside(a, loop, active_assigned):
        return False
    return True


def upward_exposed(loop):
    """Variables the loop assigns that an iteration may read before assigning them
    (values carried in from the previous iteration)."""
    assigned_in = ir.assigned(loop.body)
    out = set()

    def visit(seq, defined):
        defined = set(defined)
        for x in seq:
            out.update((ir.stmt_reads(x) & assigned_in) - defined - {getattr(loop, "index", None)})
            if isinstance(x, ir.Assign):
                defined.add(x.target)
            elif isinstance(x, ir.If):
                d1 = visit(x.then, defined)
                d2 = visit(x.orelse, defined)
                defined |= (d1 & d2)
            elif isinstance(x, ir.ForRange):
                visit(x.body, defined | {x.index})
                visit(x.body, defined | {x.index} | ir.assigned(x.body))
            elif isinstance(x, ir.Loop):
                visit(x.body, defined)
        return defined

    visit(loop.body, set())
    return out


def _find_replay(stmts, a, inside_replay):
    """Loops whose iterations carry no state into the next one but record values on the
    tape inside them (an inner recurrence, a Newton iteration per element) are reversed
    by checkpointing each iteration: the forward sweep runs them without recording, and
    each reversed iteration first replays its own forward part, recording, then reverses
    it.  The tape then holds one iteration's values instead of the whole loop's."""
    for s in stmts:
        if isinstance(s, ir.If):
            _find_replay(s.then, a, inside_replay)
            _find_replay(s.orelse, a, inside_replay)
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            # (with checkpoints, a loop nested in a replayed one is replayed within
            # each replayed iteration of the outer loop)
            ok = (not inside_replay or a.carried_replay) and _replayable(s, a)
            scratch = tuple(sorted(a.private_scratch & ir.stored_arrays(s.body)))
            # shared arrays that carry state through the loop, each thread's own element
            # checkpointed by that thread
            owned = tuple(sorted(x for x in a.owned_shared & ir.stored_arrays(s.body)
                                 if not rewritten_each_iteration(s, x)))
            if ok:
                a.replay_shared[s.uid] = tuple(sorted(
                    x for x in a.shared_scratch & ir.stored_arrays(s.body)
                    if rewritten_each_iteration(s, x) or x in owned))
                a.checkpoint_owned[s.uid] = owned
            if isinstance(s, ir.Loop):
                if ok:
                    saved = {v for v in a.pushed if v in ir.assigned(s.body)}
                    carried = upward_exposed(s)
                    a.checkpoint[s.uid] = tuple(sorted(carried))
                    a.checkpoint_arrays[s.uid] = scratch
                    a.replay[s.uid] = tuple(sorted(saved | carried))
                _find_replay(s.body, a, inside_replay or ok)
                continue
            if ok:
                body_assigned = ir.assigned(s.body)
                saved = {v for v in a.pushed if v in body_assigned}
                carried = upward_exposed(s)
                if carried or scratch or owned or any(
                        isinstance(x, (ir.Break, ir.Continue))
                        for x in ir.walk_level(s.body)):
                    # (scratch arrays the loop writes are state too: checkpointed)
                    a.checkpoint[s.uid] = tuple(sorted(carried))
                    a.checkpoint_arrays[s.uid] = scratch
                    saved |= carried
                a.replay[s.uid] = tuple(sorted(saved))
                # a value defined afresh at the top of each replayed iteration need not
                # be recorded there: the replay of the earlier iteration redefines it
                seen = set()
                exposed = upward_exposed(s)
                for x in s.body:
                    if isinstance(x, ir.Assign) and x.target not in seen and \
                            x.target not in exposed and x.target not in ir.stmt_reads(x):
                        a.replay_fresh.add(id(x))
                    for y in ir.walk((x,)):
                        seen |= ir.stmt_reads(y)
                        if isinstance(y, ir.Assign):
                            seen.add(y.target)
            _find_replay(s.body, a, inside_replay or ok)


def _replayable(loop, a):
    if isinstance(loop, ir.Loop) and not a.carried_replay:
        return False
    if loop.uid in a.ascending or loop.uid in a.index_saved or not a.has_rev.get(id(loop)):
        return False
    inner = list(ir.walk(loop.body))
    needs_tape = any(isinstance(x, ir.Loop) for x in inner) or any(
        isinstance(x, ir.Assign) and x.target in a.pushed for x in inner) or any(
        isinstance(x, ir.ForRange) and x.uid in a.index_saved for x in inner) or \
        loop.uid in a.force_replay
    if not needs_tape:
        return False
    for x in ir.walk_level(loop.body):
        # (with checkpoints, each replayed iteration runs in a one-trip loop that its
        # break/continue leave)
        if isinstance(x, (ir.Break, ir.Continue)) and not a.carried_replay:
            return False
    if any(isinstance(x, ir.Return) for x in inner):
        return False
    stored = ir.stored_arrays(loop.body)
    if (stored & ir.loaded_arrays(loop.body) or stored & a.restore_arrays) and \
            not stale_loads_harmless(loop, a):
        return False
    if any(isinstance(x, ir.Assign) and isinstance(x.expr, ir.Alloc) for x in inner):
        return False
    return a.carried_replay or not upward_exposed(loop)


def stale_loads_harmless(loop, a):
    """With checkpoints (``a.carried_replay``): may a replayed iteration of ``loop``
    read arrays the kernel writes, although they then hold later contents?  Yes when
    no value loaded from them reaches anything the replay must get right: a value the
    reverse sweep reads, the carried state, a recorded value, a branch condition, an
    index or a loop bound (an in-place sum ``sm[t] += sm[t + s]`` in a shared-memory
    reduction: its adjoint needs no values)."""
    if not a.carried_replay:
        return False
    body = list(ir.walk(loop.body))
    stored_in = ir.stored_arrays(loop.body)
    # per-thread scratch arrays that the loop writes are checkpointed with its state;
    # those nobody writes during or after the loop still hold what the loop read
    fresh = {x for x in a.stored
             if (x in a.private_scratch and x in stored_in) or x in a.unwritten or
             (x in a.shared_scratch and rewritten_each_iteration(loop, x)) or
             (x in a.owned_shared and x in stored_in) or
             _replayed_tile(a, loop, x) or
             not _stored_during_or_after(a, loop.uid, x)}
    tainted = set()
    changed = True
    while changed:
        changed = False
        for x in body:
            if isinstance(x, ir.Assign) and x.target not in tainted:
                e = x.expr
                if (isinstance(e, ir.Load) and e.array.name in a.stored and
                        e.array.name not in fresh) or \
                        ir.var_names(ir.operands(e)) & tainted:
                    tainted.add(x.target)
                    changed = True
    if not tainted:
        return True
    critical = set(a.needed) | set(a.pushed) | upward_exposed(loop)
    for x in body:
        if isinstance(x, ir.If):
            critical |= ir.var_names((x.cond,))
        elif isinstance(x, ir.ForRange):
            critical |= ir.var_names((x.start, x.stop, x.step))
        elif isinstance(x, ir.Store):
            critical |= ir.var_names(x.index)
        elif isinstance(x, ir.Assign) and isinstance(x.expr, ir.Load):
            critical |= ir.var_names(x.expr.index)
    return not (tainted & critical)


def reverse_reads(stmts, a):
    """Variables the reverse sweep of ``stmts`` reads (replayed loops: everything their
    bodies read, since they re-execute)."""
    out = set()
    for s in ir.walk(stmts):
        if isinstance(s, ir.Assign):
            if s.target in a.varied:
                out |= partial_reads(s, a)
        elif isinstance(s, ir.Store):
            if s.array.name in a.varied_arrays:
                out |= ir.var_names(s.index)
        elif isinstance(s, ir.If):
            if a.has_rev.get(id(s)):
                out |= ir.var_names((s.cond,))
        elif isinstance(s, ir.ForRange):
            if a.has_rev.get(id(s)):
                out |= ir.var_names((s.start, s.stop, s.step))
            for r in ir.walk(a.recompute.get(s.uid, ())):
                out |= ir.stmt_reads(r)
            if s.uid in a.replay:
                for r in ir.walk(s.body):
                    out |= ir.stmt_reads(r)
    return out


def _find_loop_saved(stmts, a, suppressed, inside_replay):
    """A variable a loop overwrites but whose values the loop's own reverse never reads
    (an accumulator ``s += ...`` read only after the loop) is not recorded at each
    iteration: its value before the loop is saved once and restored after the loop's
    reverse sweep."""
    for s in stmts:
        if isinstance(s, ir.If):
            _find_loop_saved(s.then, a, suppressed, inside_replay)
            _find_loop_saved(s.orelse, a, suppressed, inside_replay)
        elif isinstance(s, (ir.ForRange, ir.Loop)):
            is_replay = s.uid in a.replay
            inner_supp = suppressed
            if not (is_replay or inside_replay):
                assigned_in = ir.assigned(s.body)
                cand = {v for v in a.pushed if v in assigned_in} - suppressed
                cand -= reverse_reads(s.body, a)
                if isinstance(s, ir.ForRange):
                    cand.discard(s.index)
                if cand:
                    a.loop_saved[s.uid] = tuple(sorted(cand))
                    inner_supp = suppressed | cand
            _find_loop_saved(s.body, a, inner_supp, inside_replay or is_replay)
