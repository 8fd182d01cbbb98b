"""Tape capacity, by construction: frames of pushes and the pass that plans them.

The pushes of a sweep are grouped in frames: the whole sweep, each loop (per loop
entry for ``for``, per iteration for ``while``) and each replayed iteration.  A frame
reserves, where it starts, room for its own pushes (trip count x pushes per iteration
for a ``for`` loop).  A nested frame whose trip count is known where the enclosing
frame starts (it reads no variable the enclosing loop assigns; never a ``while`` loop)
and that runs on every iteration is absorbed: its amount joins the enclosing reservation.  When a nested frame
that records cannot be absorbed, it reserves for itself where it starts, which moves
the pointers of the tapes it pushes to past what the enclosing reservation counted:
the enclosing frame is then *foreign* for those kinds from that point on, and each of
its pushes of those kinds not provably covered gets a capacity check (a push of a kind
the nested frame never pushes stays covered).  So every push is either inside a
reservation that covers it or checked.  The decisions need the whole frame tree: the reverse pass leaves
:class:`adj_ir.Reserve` and :class:`adj_ir.CapacityCheck` nodes, and :func:`plan_tape`
decides them before printing.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

from . import adj_ir as A
from . import ir
from .errors import DifferentiationError
from .lowering import GROWABLE_START
from .tape_alloc import allocate_at_first_reserve, unit_step_trips
from .tape_merge import merge_later_reserves

_ARITH = {operator.add: "+", operator.sub: "-", operator.mul: "*"}


@dataclass(eq=False)
class Frame:
    """A region of the forward sweep whose pushes are reserved for together.  The
    fields after ``trip_src`` are set while the frame is open (``counts``,
    ``children``, ``closed``) and when the tree is planned."""
    depth: int
    trip: object                 # trip-count text of a ``for`` loop, or None
    operands: set                # variables the trip count reads
    hoist: object                # a replayed iteration's hoisted reservation, or None
    assigned: object             # variables the loop body assigns; None: absorbs none
    parent: object
    cond: int                    # branch nesting where the frame opened
    body: tuple = ()
    trip_src: object = None      # the (start, stop, step) operands
    per_trip: bool = False       # a ``while`` loop's: it reserves at each iteration
    counts: dict = field(default_factory=dict)    # pushes per kind, per iteration
    children: list = field(default_factory=list)
    closed: object = None        # the push sequence number when the frame closed
    absorbed: bool = False       # its amount joined the parent's reservation
    foreign: object = None       # {kind: pushes of it after this sequence number are
    #                              not covered} (a nested frame reserved it for itself)
    records: bool = False        # the frame or a nested one pushes
    ops: set = field(default_factory=set)          # variables its amounts read
    terms: dict = field(default_factory=dict)      # per-iteration amounts, per kind
    amounts: dict = field(default_factory=dict)    # what it reserves, per kind
    _defs: object = None

    def single_defs(self):
        """The body's unconditional definitions of variables it assigns only once."""
        if self._defs is None:
            counts = {}
            for x in ir.walk(self.body):
                if isinstance(x, ir.Assign):
                    counts[x.target] = counts.get(x.target, 0) + 1
            self._defs = {x.target: x.expr for x in self.body
                          if isinstance(x, ir.Assign) and counts[x.target] == 1}
        return self._defs


def check_needed(frame, seq, kind):
    """Is push number ``seq`` (of ``kind``) of ``frame`` outside every reservation that
    could cover it?  A frame that reserves in place covers its pushes of a kind made
    before a nested frame that pushes that kind reserved for itself, except in a ``for``
    loop (its reservation is made once, at loop entry: later iterations run after the
    nested frame of an earlier one).  A nested frame that pushes only other kinds moves
    only their pointers: it leaves the frame's reservation of this kind whole."""
    f = frame
    while f is not None:
        at = f.foreign.get(kind) if f.foreign else None
        if at is not None and (f.trip is not None or seq > at):
            return True
        f = f.parent if f.absorbed else None
    return False


def pushed_kinds(fr):
    """The tape kinds ``fr`` and the frames nested in it push."""
    kinds = set(fr.counts)
    for c in fr.children:
        kinds |= pushed_kinds(c)
    return kinds


def amounts_of(terms, trip):
    """Tape entries per kind: the per-iteration terms, times the trip count."""
    amounts = {}
    for kind, ts in sorted(terms.items()):
        per = " + ".join(ts)
        if trip is None:
            amounts[kind] = per
        elif per == "1":
            amounts[kind] = trip
        else:
            amounts[kind] = f"{per if len(ts) == 1 else f'({per})'} * {trip}"
    return amounts


class FramePlanner:
    """Decides, bottom-up, which frames are absorbed, each frame's amounts, and where
    each frame stops covering its own pushes.  ``o`` renders a primal operand."""

    def __init__(self, o):
        self.o = o

    def plan(self, fr):
        for c in fr.children:
            self.plan(c)
        recording = [c for c in fr.children if c.records]
        fr.records = bool(fr.counts) or bool(recording)
        terms = {kind: [str(n)] for kind, n in fr.counts.items()}
        ops = set(fr.operands)
        absorbed = {}
        if fr.assigned is not None:
            for c in recording:
                found = self._absorbable(c, fr)
                if found is None:
                    break
                absorbed[id(c)] = found
        if recording and len(absorbed) == len(recording):
            for c in recording:
                c.absorbed = True
                amounts, c_ops = absorbed[id(c)]
                ops |= c_ops
                for kind, amount in amounts.items():
                    terms.setdefault(kind, []).append(amount)
        elif recording:
            fr.foreign = {}
            for c in recording:
                for kind in pushed_kinds(c):
                    fr.foreign[kind] = min(fr.foreign.get(kind, c.closed), c.closed)
        fr.ops = ops
        fr.terms = terms
        fr.amounts = amounts_of(terms, fr.trip)
        if fr.hoist is not None:
            for kind, amount in fr.amounts.items():
                fr.hoist["amounts"].setdefault(kind, []).append(amount)

    def _absorbable(self, c, fr):
        """The amounts of nested frame ``c`` as computed where ``fr`` reserves and the
        variables they read, or None when ``c`` cannot join ``fr``'s reservation: it
        checks its own pushes, runs under a branch, is a ``while`` loop's (its amount
        is per iteration, not per run of the loop), or its trip count depends on the
        loop's own variables (loop-invariant definitions such as ``n = x.shape[0]``
        in the loop body are computed again in front of the loop)."""
        if c.foreign or c.cond != fr.cond or c.per_trip:
            return None
        clash = c.ops & fr.assigned
        if not clash:
            return c.amounts, c.ops
        if c.trip_src is None or clash - c.operands or \
                (c.ops - c.operands) & fr.assigned:
            return None
        leaves = set()
        texts = [self._invariant(x, fr.single_defs(), fr.assigned, 0, leaves)
                 for x in c.trip_src]
        if any(t is None for t in texts):
            return None
        return (amounts_of(c.terms, f"_trips({', '.join(texts)})"),
                (c.ops - clash) | leaves)

    def _invariant(self, x, defs, assigned, depth, leaves):
        """Text of operand ``x`` computed in front of a loop: ``x`` itself when the
        loop does not assign it, else its single, unconditional definition in the
        body when that is a shape, a tuple item, or + - * of such values."""
        if not isinstance(x, ir.Var) or x.name not in assigned:
            leaves |= ir.var_names((x,))
            return self.o(x)
        e = defs.get(x.name)
        if e is None or depth > 8:
            return None

        def sub(y):
            return self._invariant(y, defs, assigned, depth + 1, leaves)
        if isinstance(e, ir.Copy):
            return sub(e.src)
        if isinstance(e, ir.Attr) and e.attr == "shape":
            base = sub(e.value)
            return None if base is None else f"{base}.shape"
        if isinstance(e, ir.Item) and isinstance(e.index, int):
            base = sub(e.value)
            return None if base is None else f"{base}[{e.index}]"
        if isinstance(e, ir.Op) and not e.kws and len(e.args) == 2 and e.fn in _ARITH:
            a, b = sub(e.args[0]), sub(e.args[1])
            if a is None or b is None:
                return None
            return f"({a} {_ARITH[e.fn]} {b})"
        return None


def plan_tape(nodes, growable, kernel_name=None):
    """Decide every reservation and capacity check of an adjoint IR whose frames are
    planned, and the size of each tape declared (:class:`adj_ir.TapeDecl`).  A bounded
    (statically sized) tape reserves nothing: its size is :func:`bounded_tape`'s, which
    this returns ({kind: entries}; {} for a growable tape).  A growable tape's
    reservations then get the cheaper forms of :mod:`kadj.tape_alloc`."""
    sizes = {} if growable else bounded_tape(nodes, kernel_name)
    for x in A.walk(nodes):
        if isinstance(x, A.Reserve):
            if not growable:
                x.amounts = {}
            elif x.hoist is not None:
                x.amounts = {k: " + ".join(v) for k, v in x.hoist["amounts"].items()}
            else:
                fr = x.frame
                x.amounts = fr.amounts if not fr.absorbed and fr.hoist is None else {}
            if growable:
                x.amounts = {k: unit_step_trips(v) for k, v in x.amounts.items()}
        elif isinstance(x, A.CapacityCheck):
            x.needed = growable and check_needed(x.frame, x.seq, x.kind)
        elif isinstance(x, A.TapeDecl):
            x.size = GROWABLE_START if growable else sizes.get(x.kind, 1)
    if growable:
        for fn in nodes:
            if isinstance(fn, A.Function):
                merge_later_reserves(fn)
                allocate_at_first_reserve(fn)
    return sizes


def bounded_tape(nodes, kernel_name):
    """The bounded per-thread tape: {kind: entries} for the pushes of ``nodes``.  A
    push runs, before the tape is popped back, as many times as the product of the
    constant trip counts of the kernel's loops around it since the replayed iteration
    it belongs to (if any); a loop without a constant trip count around a push makes
    the tape unbounded, which a GPU thread cannot have."""
    sizes = {}

    def add(kind, n):
        sizes[kind] = sizes.get(kind, 0) + n

    def visit(seq, m):
        for x in seq:
            if isinstance(x, A.Push):
                if x.once:
                    add(x.kind, 1)
                elif m is None:
                    raise DifferentiationError(
                        "a loop overwrites values its adjoint needs, and this loop cannot "
                        "be reversed from checkpoints (a while loop, a break/continue, a "
                        "nested loop that records values, or an array both read and "
                        "written in it); a GPU thread's tape must be bounded",
                        kernel=kernel_name, loc=x.loc,
                        construct="unbounded tape in a loop",
                        remedy="use `for ... in range(...)` loops without break, keep "
                               "inner loops free of overwritten values, or assign each "
                               "value once")
                else:
                    add(x.kind, m)
            elif isinstance(x, A.PushArray):
                add(x.kind, x.size)
            elif isinstance(x, A.Block) and x.what == "replayed iteration":
                visit(x.body, 1)
            elif isinstance(x, (A.For, A.While)) and x.primal:
                trip = x.trip if isinstance(x, A.For) else None
                visit(x.body, None if m is None or trip is None else m * trip)
            else:
                for body in x.children():
                    visit(body, m)
    visit(nodes, 1)
    return sizes
