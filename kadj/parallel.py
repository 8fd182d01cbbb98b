"""Parallel CPU adjoints: reversed loops whose iterations run on all threads.

A reversed loop runs as ``numba.prange`` (and the adjoint is compiled with
``parallel=True``) when all of these hold; otherwise it stays a serial loop, which is
always correct:

* the analysis found its iterations independent (strategy "ascending": nothing on a
  tape, no active value carried from one iteration to the next, every store into an
  array with an adjoint indexed by the loop variable, :func:`kadj.analysis.loops.order_free`);
* it was asked for: the kernel wrote the loop with ``prange`` (unless
  ``differentiate(..., parallel=False)``), or ``differentiate(..., parallel=True)``
  asked for every independent loop (the outermost one of a nest);
* every write of its reversed body is private to the iteration or a reduction, decided
  on the adjoint IR as printed (:func:`race_free`):

  - an element of an array (``adj_x[i] += ...``, ``adj_out[i, j] = 0.0``) is written
    only where one index position is the loop variable, and every access of that array
    in the body has the loop variable at that same position: iterations touch disjoint
    elements.  An array the body only adds into at other elements too (a neighbour,
    ``adj_u[i - 1] += ...``, a gather, ``adj_x[idx[i]] += ...``; never read, never
    assigned: :func:`_summed_array`) makes a reversed loop run in parts, one per
    thread, each adding into a copy of its own (:mod:`kadj.thread_parts`); any other
    access at another element keeps the loop serial;
  - a scalar written only by ``+=`` and otherwise unread in the body (``adj_alpha``,
    a local sum) is a reduction: numba sums the threads' partial sums after the loop;
  - a kernel's own sum, ``s = s + value`` (``value`` not reading it), with ``s`` not
    mentioned otherwise in the body, is a reduction too;
  - any other scalar is private: each iteration assigns it before reading it, or it is
    an adjoint that is zero at the start of every iteration of the serial loop (reset at
    the end of the body, never touched outside it but for its zero initialisation), and
    is then set to zero at the top of the parallel body; it is not read after the loop
    (for a loop at the function's top level: the statements after it may not read it
    before assigning it, :func:`_exposed`; elsewhere: not mentioned after it);
  - nothing on a tape (pushes, pops, reservations), no ``break``/``return``.

The forward sweep's own copies of the kernel's loops at the top level get the same
decision (:func:`parallelise_primal`): a loss summed over ``prange`` is recomputed in
parallel before the reverse sweep.

A reduction adds the threads' partial sums in another order than the serial loop: the
gradient equals the serial adjoint's to rounding.  Everything else is exactly the
serial result.

A stencil nest asked to be parallel, whose reversed loop would scatter into neighbours,
takes the gather form (:mod:`kadj.cpu_gather`); :func:`parallelise_loops` applies the
same decision (:func:`race_free`) to that form's outermost loops: the loop over the
elements (each adds only into its own element ``adj_u[p, ...]``; in 1-D the interior
loop, the few edge elements' loop stays serial) and the loop of the iterations' sums
(scalars' sums: reductions; each iteration consumes its own outputs' adjoints).
"""
from __future__ import annotations

import ast

import numba

from . import adj_ir as A
from . import ir
from .adj_refs import free_name, names
from .counter_hint import _at_least
from .thread_parts import split_into_parts

PRANGE = "numba.prange"
SLOTS = "_slots_"           # a loop's rows of the tape (kadj.iteration_slots)
AT_LEAST = "_at_least"     # the loop counter's bound (kadj.counter_hint)
BLOCK = 4096               # iterations per block of a parallel loop (kadj.row_outline)
# reversed loops that may run in parallel when their body is race-free (replayed and
# checkpointed ones keep one iteration's state on a tape: never)
_STRATEGIES = ("ascending", "recomputed", "taped")
_NOTE = "# iterations run in parallel (numba.prange): each writes only its own elements"


def parallel_loops(kernel, option):
    """uids of the primal loops whose reversed loops may run in parallel: those written
    with ``prange`` (``option`` None or True) and, with ``option`` True, every ``for``."""
    if option is False:
        return frozenset()
    return frozenset(s.uid for s in ir.walk(kernel.body)
                     if isinstance(s, ir.ForRange) and (s.parallel or option is True))


def parallelise(fn, ns, wanted, array_sums=True):
    """Turn the reversed loops of ``fn`` (an adjoint IR function, simplified) whose
    primal loop is in ``wanted`` and whose body is race-free into ``numba.prange``
    loops; binds ``numba`` in ``ns``.  ``array_sums``: iterations that add into shared
    elements of arrays run in parts (:mod:`kadj.thread_parts`).  Returns the uids of
    the loops made parallel."""
    def pick(x, seq, in_loop):
        return isinstance(x, A.ReverseLoop) and x.loop in wanted and \
            x.strategy in _STRATEGIES and _make_parallel(fn, ns, x, in_loop, array_sums)
    return tuple(x.loop for x in _visit(fn, ns, pick))


def parallelise_primal(fn, ns, wanted):
    """Turn the kernel's own loops that the forward sweep runs, outside any loop (a
    loss summed over ``prange`` before the reverse sweep) or directly in the bodies of
    such loops (a ``prange`` in a time loop), whose loop is in ``wanted`` and whose
    body is race-free (:func:`race_free`: ``s = s + ...`` is a reduction) into
    ``numba.prange`` loops; binds ``numba`` in ``ns``.  Returns the number made
    parallel."""
    forward = {id(x) for x, _seq in forward_loops(fn.body)}

    def pick(x, seq, in_loop):
        if not (isinstance(x, A.For) and x.primal and x.loop in wanted) or \
                in_loop and id(x) not in forward:
            return False
        bounds = _range_bounds(x)
        return bounds is not None and _to_prange(fn, x, seq, x, bounds, in_loop)
    return len(_visit(fn, ns, pick))


def forward_loops(seq):
    """(loop, its sequence) of the forward sweep's ``for`` loops at the top level and
    directly in the bodies of such loops (not under a branch)."""
    for x in list(seq):
        if isinstance(x, A.For) and x.primal:
            yield x, seq
            yield from forward_loops(x.body)


def parallelise_loops(fn, ns, loops):
    """Turn those of the plain loops ``loops`` (:class:`A.For` nodes of ``fn``, over
    ``range(lo, hi)``, written by the adjoint's writer itself: the gather form's loops,
    :mod:`kadj.cpu_gather`) whose body is race-free into ``numba.prange`` loops, as
    :func:`parallelise` does with reversed loops; binds ``numba`` in ``ns``.  Returns
    the number made parallel."""
    chosen = {id(x) for x in loops}

    def pick(x, seq, in_loop):
        if not (isinstance(x, A.For) and id(x) in chosen):
            return False
        bounds = _range_bounds(x)
        return bounds is not None and _to_prange(fn, x, seq, x, bounds, in_loop)
    return len(_visit(fn, ns, pick))


def _visit(fn, ns, pick):
    """The nodes of ``fn`` (outside loops made parallel) for which ``pick(node, its
    sequence, inside a loop)`` made a loop parallel; binds ``numba`` in ``ns`` if any."""
    done = []

    def visit(seq, in_loop):
        for x in list(seq):
            if pick(x, seq, in_loop):
                done.append(x)
                continue       # (a loop nested in a parallel one stays serial)
            inner = in_loop or isinstance(x, (A.For, A.While))
            for body in x.children():
                visit(body, inner)
    visit(fn.prologue, False)
    visit(fn.body, False)
    if done:
        ns["numba"] = numba
        ns[AT_LEAST] = _at_least
    return done


def serial_where_numba_refuses(fn):
    """Turn back into serial loops the ``prange`` loops left in ``fn`` (not moved into
    a function by :mod:`kadj.row_outline`) whose body updates one of its sums over the
    threads in two statements (``_acc += a`` then ``_acc += b``): numba refuses such a
    reduction ("Use of reduction variable ... other than in a supported reduction
    function").  Returns the number turned back."""
    from .adj_refs import lists
    turned = 0
    for seq in lists(fn):
        for x in [x for x in seq if is_parallel_for(x) and _updated_twice(x.body)]:
            call = ast.parse(x.iter, mode="eval").body
            x.iter = f"range({', '.join(ast.unparse(a) for a in call.args)})"
            k = next(j for j, y in enumerate(seq) if y is x)
            first = k
            while first > 0 and isinstance(seq[first - 1], A.Comment):
                first -= 1      # (the comments right above the loop)
            notes = [j for j in range(first, k) if seq[j].text == _NOTE or
                     seq[j].text.startswith("# (summed over")]
            for j in reversed(notes):
                del seq[j]
            seq.insert(k - len(notes), A.Comment(
                "# (serial: numba refuses a sum over the threads updated twice)"))
            turned += 1
    return turned


def _updated_twice(body):
    """Does a scalar that the statements ``body`` add into, and may read before
    assigning it, get two updates?"""
    counts = {}
    for y in A.walk(body):
        name = None
        if isinstance(y, A.Accumulate) and isinstance(y.target, (A.AdjVar, A.Local)) \
                and y.op in ("+=", "-="):
            name = y.target.name
        elif isinstance(y, A.Assign) and isinstance(y.target, str) and \
                y.target.isidentifier() and (y.op == "+=" or (
                    y.op == "=" and _adds_to(y.target, y.value))):
            name = y.target
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
    twice = {n for n, c in counts.items() if c > 1}
    # (a scalar each iteration assigns before adding into it is the iteration's own,
    # not a sum over the threads: adj_r = g, then adj_r += g * s)
    return bool(twice and _read_before_defined(body, twice, set()))


def is_parallel_for(x):
    """Is ``x`` a loop made parallel (a ``for`` over ``numba.prange``)?"""
    return isinstance(x, A.For) and x.iter.startswith(f"{PRANGE}(")


def is_parallel_source(source):
    """Does an adjoint's source (as :func:`parallelise` leaves it printed) run a loop
    in parallel?  (Its compiler options then include ``parallel=True``.)"""
    return any(line.lstrip().startswith("for ") and f" in {PRANGE}(" in line
               for line in source.splitlines())


# ---- deciding one loop ----------------------------------------------------------------
def _the_for(rl, besides=()):
    """The reversed loop's ``for`` over ``range(lo, hi, 1)`` and its (lo, hi) texts;
    ``besides``: types of other nodes its body may hold."""
    loops = [x for x in rl.body if isinstance(x, A.For)]
    if len(loops) != 1 or any(not isinstance(x, (A.For, A.Comment) + tuple(besides))
                              for x in rl.body):
        return None
    bounds = _range_bounds(loops[0])
    return None if bounds is None else (loops[0], *bounds)


def _range_bounds(loop):
    """(lo, hi) texts of the values of a ``for`` over ``range(a, b)`` or
    ``range(a, b, ±1)``, else None."""
    try:
        call = ast.parse(loop.iter, mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and
            call.func.id == "range" and len(call.args) in (2, 3) and not call.keywords):
        return None
    try:
        step = ast.literal_eval(call.args[2]) if len(call.args) == 3 else 1
    except ValueError:
        return None
    if not isinstance(step, int) or isinstance(step, bool) or step not in (1, -1):
        return None
    a, b = (ast.unparse(x) for x in call.args[:2])
    lo, hi = (a, b) if step == 1 else (_plus_one(b), _plus_one(a))
    # (range(a, b, -1): the values of range(b+1, a+1))
    try:
        lowest = int(lo)
    except ValueError:
        return None
    # a negative value indexes from the end (y[-1] is y[n - 1]): two iterations could
    # write one element, so the counter must start at a constant 0 or above
    return (lo, hi) if lowest >= 0 else None


def _plus_one(text):
    """``text + 1``, spelled simply: "t2 - 1" -> "t2", "-1" -> "0"."""
    try:
        return str(int(text) + 1)
    except ValueError:
        pass
    if text.endswith(" - 1"):
        return text[:-4]
    return f"{text} + 1" if text.isidentifier() else f"({text}) + 1"


def _make_parallel(fn, ns, rl, in_loop, array_sums):
    found = _the_for(rl)
    if found is None:
        return False
    loop, lo, hi = found
    if not _to_prange(fn, rl, rl.body, loop, (lo, hi), in_loop,
                      ns=ns if array_sums else None):
        return False
    rl.parallel = True
    return True


def _to_prange(fn, owner, seq, loop, bounds, in_loop, ns=None):
    """Make ``loop`` (in the statement list ``seq``, the outermost statement of it
    being ``owner``: the loop itself or its reversed loop) a ``numba.prange`` loop
    over ``bounds`` when :func:`race_free` allows it.  With ``ns`` (a reversed loop),
    iterations that add into shared elements of arrays run in parts, each adding into
    a copy of its own (:mod:`kadj.thread_parts`)."""
    verdict = race_free(fn, owner, loop, in_loop, array_sums=ns is not None)
    if verdict is None:
        return False
    reductions, zeroed, summed = verdict
    lo, hi = bounds
    inits = [A.Assign(name, zero) for name, zero in zeroed]
    if summed:
        prefix = _counter_from_start(fn, loop, lo) + inits
        parts = split_into_parts(fn, ns, seq, loop, bounds, summed, prefix)
        if reductions:
            at = next(k for k, x in enumerate(seq) if x is parts)
            seq.insert(at, A.Comment(f"# (summed over the threads: "
                                     f"{', '.join(reductions)})"))
        return True
    loop.body[:0] = _counter_from_start(fn, loop, lo) + inits
    at = next(k for k, x in enumerate(seq) if x is loop)
    note = [A.Comment(_NOTE)]
    if reductions:
        note.append(A.Comment(f"# (summed over the threads: {', '.join(reductions)})"))
    loop.iter = f"{PRANGE}({lo}, {hi})"
    seq[at:at] = note
    return True


def in_blocks(fn, loop):
    """A ``prange`` loop ``loop`` of ``fn`` over ``(lo, hi)`` as a ``prange`` loop over
    blocks of :data:`BLOCK` iterations, each block running ``loop``'s iterations in a
    serial loop (``loop`` itself, now over ``range``).  Returns the loop over the
    blocks (for :mod:`kadj.row_outline`, which makes a block a function of its own)."""
    call = ast.parse(loop.iter, mode="eval").body
    lo, hi = (ast.unparse(x) for x in call.args)
    block = free_name(fn, "_blk")
    start = free_name(fn, "_lo", taken={block})
    first = _plus_zero(lo)
    loop.iter = f"range({start}, min({start} + {BLOCK}, {hi}))"
    last = _plus_zero(hi)
    count = f"({last} - {first} + {BLOCK - 1}) // {BLOCK}" if first != "0" else \
        f"({last} + {BLOCK - 1}) // {BLOCK}"
    offset = f"{first} + {block} * {BLOCK}" if first != "0" else f"{block} * {BLOCK}"
    return A.For(block, f"{PRANGE}(0, {count})", [A.Assign(start, offset), loop])


def _plus_zero(text):
    """``text`` as an operand of ``+`` and ``-`` (parenthesised unless a name or a
    number)."""
    stripped = text.strip()
    if stripped.isidentifier() or stripped.lstrip("-").isdigit():
        return stripped
    return f"({stripped})"


def _counter_from_start(fn, loop, lo):
    """For a loop from a constant start ``lo >= 0``: the counter renamed (to a name
    ``fn`` does not use) and bound as ``_at_least(counter, lo)`` (the same value, with
    an LLVM assumption that it is not below ``lo``: :mod:`kadj.counter_hint`).  numba's
    parallel region hands the loop its start at run time; without the assumption LLVM
    cannot tell the indices are not negative, keeps numba's negative-index checks and
    does not vectorise the body (a 1-D stencil's parallel gather took five times the
    serial one's time on one thread).  Only for innermost loops: an outer loop of a
    2-D or 3-D gather ran no faster with it, and its 3-D form slower on two threads."""
    if any(isinstance(x, (A.For, A.While)) for x in A.walk(loop.body)):
        return []   # an outer loop: its inner loops' own starts let LLVM vectorise them
    try:
        start = int(str(lo))
    except ValueError:
        return []
    if start < 0:
        return []
    var = loop.var
    fresh = loop.var = free_name(fn, f"{var}_")
    return [A.Assign(var, f"{AT_LEAST}({fresh}, {start})")]


_SCALAR_NODES = (A.Assign, A.Accumulate, A.Consume, A.If, A.For, A.Comment, A.Pass,
                 A.Block, A.ReverseLoop)


def race_free(fn, rl, loop, in_loop, array_sums=False):
    """(reduction names, [(name, zero)] to set at the top of each iteration, {array:
    rank} of the arrays summed over the iterations) when the reversed body of ``loop``
    may run its iterations in parallel, else None.  The last is empty unless
    ``array_sums``: then an array the body only adds into (:func:`_summed_array`) may
    be written at elements other iterations write too."""
    var = loop.var
    body = loop.body
    nodes = list(A.walk(body))
    if any(not isinstance(x, _SCALAR_NODES) for x in nodes):
        return None     # tape traffic, break, return, barriers, ...
    writes, reads, accesses = _occurrences(nodes)
    if var in writes:
        return None
    bounds = _range_bounds(loop)
    lowest = int(bounds[0]) if bounds is not None else 0
    # arrays: every element written is the iteration's own
    summed = {}
    for base in {b for b, kind in writes.items() if kind == "elem"} | _elem_bases(nodes):
        idx = accesses.get(base, [])
        if idx and _shared_position(idx, var, lowest if base.startswith(SLOTS) else 0):
            continue
        rank = _summed_array(fn, rl, base, nodes, reads) if array_sums else None
        if rank is None:
            return None
        summed[base] = rank
    scalars = {n for n, kind in writes.items() if kind != "elem"}
    reductions = sorted(n for n in scalars if _is_reduction(n, nodes, reads) or
                        _is_primal_sum(n, nodes))
    private = scalars - set(reductions)
    outside = _outside_uses(fn, rl, in_loop)
    after = outside["after"]
    top = next((k for k, x in enumerate(fn.body) if x is rl), None)
    if top is not None:     # at the top level: what the rest may read before assigning
        after = _exposed(fn.body[top + 1:], private)
    else:
        # nested in a statement of the top level: what that statement mentions outside
        # the loop (the loops around run it again), and what the rest may read before
        # assigning; the forward sweep and the prologue ran before
        top = next((k for k, x in enumerate(fn.body)
                    if any(y is rl for y in A.walk([x]))), None)
        if top is not None:
            inside = {id(y) for y in A.walk([rl])}
            after = {n for y in A.walk([fn.body[top]]) if id(y) not in inside
                     for t in _texts(y) for n in names(t)}
            after |= _exposed(fn.body[top + 1:], private)
    if private & after:
        return None     # a value of the last iteration read after the loop
    zeroed = []
    exposed = _read_before_defined(body, private | {var}, {var})
    for name in sorted(exposed):
        zero = _zero_at_start(fn, rl, loop, name, outside)
        if zero is None:
            return None
        zeroed.append((name, zero))
    return reductions, zeroed, dict(sorted(summed.items()))


def _summed_array(fn, rl, base, nodes, reads):
    """The rank of the array ``base`` when the statements ``nodes`` only add into its
    elements (``base[...] += value``, every index of the same length) and never read it
    or assign it whole, and it is an argument of ``fn`` or assigned outside ``rl``
    (so that its copies can be made before the loop); else None."""
    if reads.get(base, 0) or base == "?":
        return None
    ranks = set()
    for x in nodes:
        t = getattr(x, "target", None)
        if isinstance(t, A.AdjElem) and t.base == base:
            if not (isinstance(x, A.Accumulate) and x.op == "+="):
                return None
            ranks.add(len(t.index_texts))
        elif isinstance(x, (A.Assign, A.Accumulate)) and isinstance(t, str) and \
                names(t)[:1] == (base,):
            return None     # a subscripted text target, or the name itself
        elif isinstance(x, A.For) and x.var == base:
            return None
    if len(ranks) != 1:
        return None
    inside = {id(y) for y in A.walk([rl])}
    defined = base in {p.split("=")[0].strip() for p in fn.params} or any(
        id(y) not in inside and base in _assigned(y)
        for y in A.walk(fn.prologue + fn.body) if isinstance(y, (A.Assign, A.Accumulate)))
    return ranks.pop() if defined else None


def _elem_bases(nodes):
    return {x.target.base for x in nodes
            if isinstance(x, (A.Accumulate, A.Assign, A.Consume)) and
            isinstance(x.target, A.AdjElem)}


def _occurrences(nodes):
    """writes {name: "elem" | "scalar"}, reads {name: count}, accesses {array: [index
    texts]} of the statements ``nodes``."""
    writes, reads, accesses = {}, {}, {}

    def read_text(text):
        if not isinstance(text, str):
            return
        for n in names(text):
            reads[n] = reads.get(n, 0) + 1
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError:
            return
        for sub in ast.walk(tree):
            if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name):
                sl = sub.slice
                elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
                accesses.setdefault(sub.value.id, []).append(
                    tuple(ast.unparse(e) for e in elts))

    def target(t, op):
        if isinstance(t, A.AdjElem):
            writes[t.base] = "elem"
            accesses.setdefault(t.base, []).append(tuple(t.index_texts))
            for text in t.index_texts:
                read_text(text)
        elif isinstance(t, (A.AdjVar, A.Local)):
            writes.setdefault(t.name, "scalar")
        elif isinstance(t, str) and t.isidentifier():
            writes.setdefault(t, "scalar")
        else:   # a subscripted target text: its array written at that index
            try:
                sub = ast.parse(t, mode="eval").body
            except SyntaxError:
                sub = None
            if not (isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name)):
                writes["?"] = "elem"          # unknown: never private
                return
            writes[sub.value.id] = "elem"
            read_text(t)

    for x in nodes:
        if isinstance(x, (A.Assign, A.Accumulate)):
            target(x.target, x.op)
            read_text(x.value)
        elif isinstance(x, A.Consume):
            target(x.target, "=")
            read_text(x.zero)
        elif isinstance(x, A.If):
            read_text(x.cond)
        elif isinstance(x, A.For):
            writes.setdefault(x.var, "scalar")
            read_text(x.iter)
    return writes, reads, accesses


def _shared_position(indices, var, shift=0):
    """Is there one index position holding ``var`` in every access, or ``var - c``
    with one constant ``0 < c <= shift`` in every access (a tape's rows of a loop from
    ``shift``, :mod:`kadj.iteration_slots`: ``var - c`` is never negative there)?"""
    if "?" in indices:
        return False
    n = len(indices[0])
    for p in range(n):
        texts = {ix[p].strip() if len(ix) == n else None for ix in indices}
        if texts == {var}:
            return True
        if shift and len(texts) == 1 and None not in texts:
            head, _, c = next(iter(texts)).partition(" - ")
            if head == var and c.isdigit() and 0 < int(c) <= shift:
                return True
    return False


def _is_reduction(name, nodes, reads):
    """Written only by ``name += value`` (with ``value`` not reading it) and not read
    otherwise in the body."""
    adds = [x for x in nodes if isinstance(x, A.Accumulate) and
            isinstance(x.target, (A.AdjVar, A.Local)) and x.target.name == name]
    if not adds or any(x.op != "+=" for x in adds):
        return False
    for x in nodes:
        if isinstance(x, A.Assign) and (x.target == name or getattr(
                x.target, "name", None) == name):
            return False
        if isinstance(x, A.For) and x.var == name:
            return False
    return reads.get(name, 0) == 0


def _is_primal_sum(name, nodes):
    """Written only by ``name = name + value`` (a kernel's ``s += ...`` as the sweeps
    print it; ``value`` not reading it), and not mentioned otherwise in the body."""
    sums = 0
    for x in nodes:
        if isinstance(x, A.Assign) and x.target == name:
            if x.op != "=" or not _adds_to(name, x.value):
                return False
            sums += 1
            continue
        if isinstance(x, A.For) and x.var == name:
            return False
        if name in _mentioned(x):
            return False
    return sums > 0


def _adds_to(name, text):
    """Is ``text`` ``name + <something without name>``?"""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return False
    return (isinstance(tree, ast.BinOp) and isinstance(tree.op, ast.Add) and
            isinstance(tree.left, ast.Name) and tree.left.id == name and
            name not in names(ast.unparse(tree.right)))


def _mentioned(x):
    """The names node ``x`` itself (not its children) mentions."""
    return {n for text in _texts(x) for n in names(text)}


def _outside_uses(fn, rl, in_loop):
    """Names read outside the reversed loop ``rl``: "after" it (everything outside when
    it is nested in another loop), and "inner": every name occurring outside it other
    than in the prologue's initialisations."""
    after, inner = set(), set()
    state = {"seen": False}

    def visit(seq, top):
        for x in seq:
            if x is rl:
                state["seen"] = True
                continue
            texts = _texts(x)
            found = {n for t in texts for n in names(t)}
            if state["seen"] or in_loop:
                after.update(found)
            if not (top and isinstance(x, A.Assign) and isinstance(x.value, str) and
                    _is_zero(x.value)):
                inner.update(found)
            for body in x.children():
                visit(body, False)
    visit(fn.prologue, True)
    visit(fn.body, False)
    return {"after": after, "inner": inner}


def _texts(x):
    out = []
    if isinstance(x, (A.Assign, A.Accumulate)):
        t = x.target
        out.append(t if isinstance(t, str) else
                   t.name if isinstance(t, (A.AdjVar, A.Local)) else
                   " ".join((t.base,) + tuple(t.index_texts)))
        out.append(x.value)
    elif isinstance(x, A.Consume):
        out += [x.target.base, *x.target.index_texts, x.zero]
    elif isinstance(x, (A.If, A.While)):
        out.append(x.cond)
    elif isinstance(x, A.For):
        out += [x.var, x.iter]
    elif isinstance(x, A.Return):
        out.append(x.value)
    elif isinstance(x, A.Pop):
        out += [x.target, x.cond or ""]
    elif isinstance(x, A.Push):
        out.append(x.value)
    elif isinstance(x, (A.PushArray, A.PopArray)):
        out += [x.var, x.elem]
    elif isinstance(x, A.FinishScalar):
        out += list(x.names)
    return [t for t in out if isinstance(t, str)]


def _is_zero(text):
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        v = None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return v == 0
    # a typed zero: _float32(0.0)
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return False
    return isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords and \
        isinstance(call.args[0], ast.Constant) and call.args[0].value == 0


def _read_before_defined(body, tracked, defined):
    """Names of ``tracked`` that an iteration of ``body`` may read before assigning."""
    out = set()

    def reads_of(x):
        texts = []
        if isinstance(x, (A.Assign, A.Accumulate)):
            texts.append(x.value)
            t = x.target
            if isinstance(t, A.AdjElem):
                texts += list(t.index_texts)
            elif isinstance(t, (A.AdjVar, A.Local)) and x.op not in ("=", "= -"):
                texts.append(t.name)
            elif isinstance(t, str) and (not t.isidentifier() or x.op != "="):
                texts.append(t)
        elif isinstance(x, A.Consume):
            texts += list(x.target.index_texts)
        elif isinstance(x, A.If):
            texts.append(x.cond)
        elif isinstance(x, A.For):
            texts.append(x.iter)
        return {n for t in texts if isinstance(t, str) for n in names(t)}

    def defines(x):
        if isinstance(x, (A.Assign, A.Accumulate)):
            t = x.target
            if isinstance(t, (A.AdjVar, A.Local)):
                return t.name
            if isinstance(t, str) and t.isidentifier():
                return t
        if isinstance(x, A.Pop) and x.cond is None:
            return x.target
        return None

    def visit(seq, defined, guards):
        # guards: {condition variable: ((names defined at the end of its if's
        # then-arm, the guards known there), (the same for its else-arm))}, for an
        # earlier ``if c:`` whose ``c`` nothing assigned since: a later ``if c:``
        # takes the same arm (``if t6: t8 = 1.0 / r``, then the reverse's ``if t6:
        # ... t8``), tests nested in its arms included.  Returns (defined, guards)
        # at the end of ``seq``.
        defined, guards = set(defined), dict(guards)
        for x in seq:
            out.update((reads_of(x) & tracked) - defined)
            if isinstance(x, A.If):
                key = x.cond.strip() if isinstance(x.cond, str) else None
                key = key if key and key.isidentifier() else None
                known = guards.get(key)
                arms = []
                for k, arm in enumerate((x.then, x.orelse)):
                    d0, g0 = known[k] if known else (set(), {})
                    arms.append(visit(arm, defined | d0, {**guards, **g0}))
                (d1, g1), (d2, g2) = arms
                defined |= d1 & d2
                assigned = _assigned(x)
                guards = _purged(guards, assigned)
                if key is not None and key not in assigned:
                    guards[key] = ((d1, g1), (d2, g2))
            elif isinstance(x, A.For):
                inner, _ = visit(x.body, defined | {x.var}, guards)
                if _runs(x):    # (a constant range of at least one trip)
                    defined |= inner
                guards = _purged(guards, _assigned(x))
            elif isinstance(x, (A.Block, A.ReverseLoop)):
                defined, guards = visit(x.body, defined, guards)
            else:
                d = defines(x)
                if d is not None:
                    defined.add(d)
                    guards = _purged(guards, {d})
        return defined, guards

    visit(body, defined, {})
    return out


def _runs(loop):
    """Does the ``for`` loop ``loop`` run its whole body at least once (a range of
    integer constants that is not empty, no ``break``, ``continue`` or ``return``)?"""
    if any(isinstance(y, (A.Break, A.Continue, A.Return)) for y in A.walk(loop.body)):
        return False
    try:
        call = ast.parse(loop.iter, mode="eval").body
        bounds = [ast.literal_eval(a) for a in call.args]
    except (SyntaxError, ValueError, AttributeError):
        return False
    return isinstance(call, ast.Call) and getattr(call.func, "id", None) == "range" \
        and 1 <= len(bounds) <= 3 and all(type(b) is int for b in bounds) and \
        len(range(*bounds)) > 0


def _assigned(x):
    """The names assigned by ``x`` or anywhere inside it (plain targets, loop
    counters)."""
    out = set()
    for y in A.walk([x]):
        if isinstance(y, (A.Assign, A.Accumulate)):
            t = _plain_target(y.target)
            if t is not None:
                out.add(t)
        elif isinstance(y, A.For):
            out.add(y.var)
        elif isinstance(y, A.Pop):
            out.add(y.target)
    return out


def _purged(guards, assigned):
    """``guards`` (see :func:`_read_before_defined`) without the tests of the variables
    ``assigned``, also where they are nested in another test's arms: a later test of
    such a variable may take either arm."""
    out = {}
    for key, arms in guards.items():
        if key not in assigned:
            out[key] = tuple((d, _purged(g, assigned)) for d, g in arms)
    return out


def _exposed(seq, tracked):
    """Names of ``tracked`` that running ``seq`` may read before assigning them (an
    assignment inside a loop or one branch does not count; a statement the analysis
    does not know reads every name it mentions): :func:`kadj.simplify_scopes.exposed`,
    every ``if`` taken on its own."""
    from .simplify_scopes import exposed
    return exposed(seq, correlate=False)[0] & set(tracked)


def _plain_target(t):
    """The scalar an assignment's target names, or None (an element)."""
    if isinstance(t, (A.AdjVar, A.Local)):
        return t.name
    if isinstance(t, str) and t.isidentifier():
        return t
    return None


def _zero_at_start(fn, rl, loop, name, outside):
    """The zero ``name`` holds at the start of every iteration of the serial loop, or
    None: it is initialised to that zero in the prologue, occurs nowhere else outside
    the loop, and the body's last statement naming it, at the body's top level, sets it
    to that zero again."""
    if name in outside["inner"]:
        return None
    init = [x for x in fn.prologue if isinstance(x, A.Assign) and
            getattr(x.target, "name", x.target) == name and x.op == "="]
    if len(init) != 1 or not _is_zero(init[0].value):
        return None
    zero = init[0].value
    last = None
    for x in loop.body:
        if name in {n for t in _texts(x) for n in names(t)} or any(
                name in {n for t in _texts(y) for n in names(t)}
                for body in x.children() for y in A.walk(body)):
            last = x
    if not (isinstance(last, A.Assign) and last.op == "=" and last.value == zero and
            getattr(last.target, "name", last.target) == name):
        return None
    return zero
