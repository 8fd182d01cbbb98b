"""The adjoint IR: what the reverse pass builds, before any source text exists.

A tree of statement nodes.  Expressions are still the text of one Python expression
(:class:`str`), but everything a later pass needs to know about the adjoint is
structured: an accumulation names its target (the adjoint of a variable, an element
of an adjoint array given as array + index operands, or a local sum), a consume names
the stored element, tape pushes and pops name their tape kind, a reversed loop
carries its strategy, and tape reservations are nodes that a planning pass
(:mod:`kadj.tape_plan`) decides before printing.  :mod:`kadj.printer` is the only place
that turns the tree into source.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import MISSING, dataclass, field, fields

# the strategies of a reversed loop
STRATEGIES = ("taped", "recomputed", "ascending", "replayed", "checkpointed")


# ---- accumulation targets --------------------------------------------------------------
@dataclass(eq=False)
class AdjVar:
    """The adjoint of the primal variable ``var`` (named ``name``)."""
    var: str
    name: str


@dataclass(eq=False)
class AdjElem:
    """An element of the adjoint array of ``array``: ``base[index_texts]``."""
    array: str
    index: tuple            # the primal index operands (kadj.ir values)
    base: str               # the adjoint array's name
    index_texts: tuple


@dataclass(eq=False)
class Local:
    """A local sum standing for an adjoint (a loop-invariant element, a merged load)."""
    name: str
    array: object = None    # what it sums: (array, index) or None
    index: tuple = ()


# ---- statements ---------------------------------------------------------------------------
@dataclass(eq=False)
class Node:
    def children(self):
        return ()


@dataclass(eq=False)
class Function(Node):
    name: str
    params: tuple
    doc: str
    prologue: list = field(default_factory=list)
    body: list = field(default_factory=list)
    temps: object = frozenset()   # names of the kernel's temporaries (simplify may fold)
    # module-level functions printed before this one: [(decorator line, Function)]
    # (:mod:`kadj.row_outline`)
    helpers: list = field(default_factory=list)

    def children(self):
        return (self.prologue, self.body)


@dataclass(eq=False)
class Comment(Node):
    """``of_next``: the comment says something of the statement after it (a pass that
    drops that statement drops the comment too)."""
    text: str
    of_next: bool = False


@dataclass(eq=False)
class Assign(Node):
    """``target op value`` of primal or bookkeeping values (``op``: = += -=); an
    adjoint's target (reset to zero) is structured like an accumulation's."""
    target: object          # str | AdjVar | AdjElem | Local
    value: str
    op: str = "="


@dataclass(eq=False)
class If(Node):
    """``fresh``: the branch that saves, from a loop's second iteration on, the previous
    iteration's values that each iteration assigns before reading them
    (:meth:`kadj.forward_sweep.ForwardSweep.push_fresh`): it reads only what the
    previous iteration of its loop assigned."""
    cond: str
    then: list = field(default_factory=list)
    orelse: list = field(default_factory=list)
    fresh: bool = False

    def children(self):
        return (self.then, self.orelse)


@dataclass(eq=False)
class For(Node):
    """``primal``: the kernel's own loop (not one the adjoint adds), ``trip`` its
    constant trip count when its bounds are constants."""
    var: str
    iter: str               # the iterable's text: range(...)
    body: list = field(default_factory=list)
    primal: bool = False
    trip: object = None
    loop: object = None     # the kernel loop's uid, for the forward sweep's own loops

    def children(self):
        return (self.body,)


@dataclass(eq=False)
class While(Node):
    cond: str
    body: list = field(default_factory=list)
    primal: bool = False

    def children(self):
        return (self.body,)


@dataclass(eq=False)
class Break(Node):
    pass


@dataclass(eq=False)
class Continue(Node):
    pass


@dataclass(eq=False)
class Pass(Node):
    pass


@dataclass(eq=False)
class Return(Node):
    value: str


@dataclass(eq=False)
class Call(Node):
    """A call whose result is not kept (``_row1(i, u, adj_u)``)."""
    text: str


@dataclass(eq=False)
class Barrier(Node):
    """The block of threads meets here; ``note`` says why (or None).  ``replayed``:
    the primal's barrier met again in a replayed forward part; ``loc``: the primal
    barrier's location (None for the adjoint's own barriers)."""
    note: object = None
    replayed: bool = False
    loc: object = None


@dataclass(eq=False)
class Accumulate(Node):
    """``target op value``: ``op`` is "+=", "=" (the adjoint of a single-use variable),
    "-=" or "= -".  ``how``: "plain", "atomic" (an element other threads may add to)
    or "local" (summed in a local first), decided by the target's accumulation
    lowering (plain where it has none); "sum": a plain ``+=`` LLVM may reassociate
    (:mod:`kadj.vector_sums`)."""
    target: object          # AdjVar | AdjElem | Local
    op: str
    value: str
    how: object = None      # None: not decided yet


@dataclass(eq=False)
class Consume(Node):
    """A stored element's incoming adjoint, read, is set to zero."""
    target: AdjElem
    zero: str


@dataclass(eq=False)
class Push(Node):
    """``once``: pushed once per adjoint run whatever loops enclose it (the state a
    checkpointed loop saves); ``loc``: the primal statement it belongs to."""
    kind: str               # f64 | f32 | i64
    value: str
    once: bool = False
    loc: object = None
    note: object = None     # a comment: "save p (overwritten at f.py:19)"
    site: object = None     # the kernel assignment whose old value it saves
                            # (kadj.dead_saves)


@dataclass(eq=False)
class Pop(Node):
    """Pop into ``target`` (only where ``cond`` holds, when given)."""
    kind: str
    target: str
    boolean: bool = False
    cond: object = None
    note: object = None     # a comment: "restore p"
    site: object = None     # the kernel assignment whose old value it restores


@dataclass(eq=False)
class PushArray(Node):
    """Push ``size`` elements: ``elem`` (the text of element ``var``) for ``var`` in
    range(size).  ``key`` names what is saved (the loop and the array), shared with the
    :class:`PopArray` that restores it: a target that gives each save a buffer of its
    own pairs them by key (the reverse sweep visits branches in their forward order)."""
    kind: str
    size: int
    var: str
    elem: str
    key: object = None


@dataclass(eq=False)
class PopArray(Node):
    kind: str
    size: int
    var: str
    elem: str
    key: object = None


@dataclass(eq=False)
class Reserve(Node):
    """Tape room for the pushes of one frame (kadj.tape_plan); ``amounts``
    ({kind: text}) are decided by the planning pass; None until then."""
    frame: object
    amounts: object = None
    hoist: object = None    # a replayed iteration's reservation, made before the loop


def reserves_nothing(x):
    """Is ``x`` a reservation of no tape (it prints nothing)?"""
    return isinstance(x, Reserve) and not x.amounts


@dataclass(eq=False)
class CapacityCheck(Node):
    """Room for one push of ``kind`` not covered by any reservation, if
    ``needed`` (decided by the planning pass)."""
    kind: str
    frame: object
    seq: int
    needed: object = None


@dataclass(eq=False)
class ReverseLoop(Node):
    """A primal loop reversed: its statements (header comments, the loop, pops after
    it) are in ``body``; ``strategy`` says how its iterations are reversed;
    ``parallel``: its iterations run on all threads (:mod:`kadj.parallel`)."""
    strategy: str
    loop: object            # the primal loop's uid
    body: list = field(default_factory=list)
    parallel: bool = False

    def __post_init__(self):
        assert self.strategy in STRATEGIES, self.strategy

    def children(self):
        return (self.body,)


# ---- declarations: target-neutral, lowered by the target (kadj.lowering) -----------------
@dataclass(eq=False)
class TapeDecl(Node):
    """The tape of ``kind`` values (f64 | f32 | i64) and its stack pointer.  ``policy``:
    "growable" (a heap array that grows: reservations, capacity checks) or "bounded"
    (sized before the run: ``size`` entries, decided by :func:`kadj.tape_plan.plan_tape`
    from the pushes)."""
    kind: str
    policy: str = "growable"
    size: object = None


@dataclass(eq=False)
class LocalArray(Node):
    """A scratch array the adjoint declares in its prologue: ``size`` (an int or a
    shape tuple) elements of ``dtype`` (a numba type or dtype object; ``hint`` names it
    in the source when it has no name there), in memory ``space``: "local" (private to
    the running thread) or "shared" (shared by a block of threads)."""
    name: str
    size: object
    dtype: object
    space: str = "local"
    hint: object = None


@dataclass(eq=False)
class ZeroArray(Node):
    """Every element of the declared array ``name`` (shape ``dims``) set to ``zero``;
    a shared array is zeroed by its block of threads together."""
    name: str
    dims: tuple
    zero: str
    space: str = "local"


@dataclass(eq=False)
class LocalSums(Node):
    """The local sums that the target's accumulation lowering introduced, set to zero."""


@dataclass(eq=False)
class FinishScalar(Node):
    """The adjoints of the scalar arguments ``names`` added into their 1-element
    buffers (``adj_<name>_buf[0]``), with the local sums the target's accumulation
    lowering keeps for array elements every thread adds to."""
    names: tuple = ()


DECLARATIONS = (TapeDecl, LocalArray, ZeroArray, LocalSums, FinishScalar)


@dataclass(eq=False)
class Block(Node):
    """A group of statements at the level of its surroundings (``what`` names it): a
    replayed iteration's forward part, or a part filled when its content is known (a
    prologue, initialisations)."""
    what: str
    body: list = field(default_factory=list)

    def children(self):
        return (self.body,)


def walk(nodes):
    for x in nodes:
        yield x
        for seq in x.children():
            yield from walk(seq)


# ---- building by indentation depth -----------------------------------------------------
class Builder:
    """Puts nodes in the tree by indentation depth, as Python reads indented lines: a
    node at depth d goes into the body opened by the last compound node at depth
    d - 1 (or the innermost open group at depth d)."""

    def __init__(self, body=None, depth=1):
        self.targets = {depth: body if body is not None else []}
        self.last = {}

    def put(self, depth, node):
        self.targets[depth].append(node)
        self.last[depth] = node
        for d in [d for d in self.targets if d > depth]:
            del self.targets[d]
        if isinstance(node, If):
            self.targets[depth + 1] = node.then
        elif isinstance(node, (For, While)):
            self.targets[depth + 1] = node.body
        return node

    def put_else(self, depth):
        node = self.last[depth]
        assert isinstance(node, If), node
        self.targets[depth + 1] = node.orelse

    @contextmanager
    def group(self, depth, node):
        """Nodes put at ``depth`` inside the ``with`` go into ``node``'s body."""
        self.put(depth, node)
        saved = self.targets[depth]
        self.targets[depth] = node.body
        try:
            yield node
        finally:
            self.targets[depth] = saved
            self.last[depth] = node

    def mark(self, depth):
        seq = self.targets[depth]
        return seq, len(seq)

    @staticmethod
    def only_comments(mark):
        seq, start = mark
        return all(isinstance(x, Comment) for x in seq[start:])


# ---- a structural dump -----------------------------------------------------------------
def _field_text(v):
    if isinstance(v, AdjVar):
        return f"AdjVar({v.name})"
    if isinstance(v, AdjElem):
        return f"AdjElem({v.base}[{', '.join(v.index_texts)}])"
    if isinstance(v, Local):
        return f"Local({v.name})"
    return repr(v)


def dump(node, indent=0):
    """One node per line with its fields, children indented."""
    out = []
    nodes = node if isinstance(node, list) else [node]
    for x in nodes:
        pad = "  " * indent
        parts = []
        for f in fields(x):
            v = getattr(x, f.name)
            if isinstance(v, list) or f.name in ("frame", "loc", "site") or (
                    isinstance(x, For) and f.name == "loop") or (
                    f.default is not MISSING and v == f.default):
                continue  # (bodies below; fields at their defaults left out)
            parts.append(f"{f.name}={_field_text(v)}")
        out.append(f"{pad}{type(x).__name__}({', '.join(parts)})")
        for f in fields(x):
            v = getattr(x, f.name)
            if f.name == "helpers":     # [(decorator, Function)]: printed before it
                for decorator, helper in v:
                    out.append(f"{pad}  .helper: {decorator}")
                    out.append(dump(helper, indent + 2))
            elif isinstance(v, list) and (v or f.name in ("body", "then")):
                out.append(f"{pad}  .{f.name}:")
                out.append(dump(v, indent + 2)) if v else None
    return "\n".join(s for s in out if s)


# ---- observing the stage ---------------------------------------------------------------
_observers = []


def built(fn, form):
    """Called by the reverse pass with each adjoint IR it builds (``form``: scatter,
    gather, zero), for :func:`capture`."""
    for seen in _observers:
        seen.append((form, fn))
    return fn


@contextmanager
def capture():
    """``with capture() as seen:`` collects the (form, Function) of every adjoint IR
    built inside (an adjoint served from the disk cache is not built)."""
    seen = []
    _observers.append(seen)
    try:
        yield seen
    finally:
        _observers.remove(seen)
