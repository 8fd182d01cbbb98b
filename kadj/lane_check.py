"""Which replayed loops may run their iterations side by side (kadj.lane_jam).

:func:`analyse` checks that the order of statements *between* the iterations of a
replayed loop cannot matter (the conditions are listed in :mod:`kadj.lane_jam`) and
sorts the iteration's names: private to a lane (renamed per lane), the same for every
lane (computed once), sums shared by the lanes.  Conservative: anything it cannot
prove (a read that only a branch guards, a store into an array, a call it does not
know) leaves the loop as it is.
"""
from __future__ import annotations

import ast
import re
from dataclasses import fields

from . import adj_ir as A
from .adj_refs import names

_ALLOWED = (A.Comment, A.Assign, A.Accumulate, A.Consume, A.Push, A.Pop, A.For,
            A.ReverseLoop, A.If, A.Reserve, A.CapacityCheck, A.Block)
SKIP_FIELDS = {"note", "text", "what", "kind", "how", "op", "strategy", "var"}


# ---- the loop's parts ------------------------------------------------------------------
def parts(rl):
    """(the For, the replay Block, its index in the For's body) or None."""
    loops = [x for x in rl.body if isinstance(x, A.For)]
    others = [x for x in rl.body if not isinstance(x, (A.For, A.Comment))]
    if len(loops) != 1 or any(not (isinstance(x, A.Assign) and isinstance(x.target, str)
                                   and x.target.startswith("_tape_")) for x in others):
        return None
    loop = loops[0]
    if rl.body.index(loop) < max((rl.body.index(x) for x in others), default=-1):
        return None
    for k, x in enumerate(loop.body):
        if isinstance(x, A.Block):
            if x.what != "replayed iteration":
                return None
            if any(not (isinstance(y, A.Comment) or no_op(y)) for y in loop.body[:k]):
                return None
            return loop, x, k
        if not (isinstance(x, A.Comment) or no_op(x)):
            return None
    return None


def no_op(x):
    return A.reserves_nothing(x) or (
        isinstance(x, A.CapacityCheck) and x.needed is False)


def _range(text, simple=True):
    """(start, stop, step) texts of ``range(a, b[, s])`` with s = +-1, or None (also
    when ``simple`` and a bound is not a plain operand of a sum)."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "range" and len(node.args) in (2, 3) and not node.keywords):
        return None
    step = 1
    if len(node.args) == 3:
        try:
            step = ast.literal_eval(node.args[2])
        except ValueError:
            return None
        if step not in (1, -1):
            return None
    operands = (ast.Name, ast.Constant, ast.Call, ast.BinOp, ast.UnaryOp, ast.Subscript,
                ast.Attribute)
    if simple and not all(isinstance(a, operands) for a in node.args[:2]):
        return None     # (written into sums below without parentheses)
    return ast.unparse(node.args[0]), ast.unparse(node.args[1]), step


def _texts(x):
    """The expression texts of ``x``'s own fields (targets' index texts included)."""
    out = []
    for f in fields(x):
        if f.name in SKIP_FIELDS:
            continue
        v = getattr(x, f.name)
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, A.AdjElem):
            out.extend(v.index_texts)
    return out


def _mentions(x):
    """Names ``x`` mentions in its own fields (targets included)."""
    found = set()
    for t in _texts(x):
        found.update(names(t))
    t = getattr(x, "target", None)
    if isinstance(t, (A.AdjVar, A.Local)):
        found.add(t.name)
    elif isinstance(t, A.AdjElem):
        found.add(t.base)
    if isinstance(x, A.For):
        found.add(x.var)
    return found


def target_name(x):
    t = getattr(x, "target", None)
    if isinstance(t, str):
        return t
    if isinstance(t, (A.AdjVar, A.Local)):
        return t.name
    return None


# ---- legality ----------------------------------------------------------------------------
class _Plan:
    pass


def analyse(fn, rl, loop, block, k, nonneg=False):
    """The plan of the jam of ``rl`` (see the module's doc), or None.  ``nonneg``: the
    loop's counter is known not to be negative whatever its start's text (a block's or
    part's loop of a parallel replayed loop over a range from a constant 0 or more)."""
    body = loop.body
    nodes = list(A.walk(body))
    if any(not isinstance(x, _ALLOWED) for x in nodes):
        return None
    if any(isinstance(x, A.Block) and x is not block for x in nodes):
        return None
    for x in nodes:
        if isinstance(x, (A.Reserve, A.CapacityCheck)) and not no_op(x):
            return None
        if isinstance(x, A.Push) and x.once:
            return None
        if isinstance(x, A.Pop) and (x.cond is not None or x.boolean
                                     or not x.target.isidentifier()):
            return None     # (an array element restored: a store into a primal array)
        if isinstance(x, A.Accumulate) and x.how not in (None, "plain"):
            return None
        if isinstance(x, A.Assign) and isinstance(x.target, str) and (
                not x.target.isidentifier() or x.op != "="):
            return None
        if any(not _pure(t) for t in _texts(x) if not isinstance(x, A.For)):
            return None
        if isinstance(x, A.For) and (_range(x.iter) is None or not _pure(x.iter[5:])):
            return None
    var = loop.var
    rng = _range(loop.iter)
    if rng is None or not (nonneg or _never_negative(rng)):
        return None
    inner_vars = {x.var for x in nodes if isinstance(x, A.For)}
    adj_bases = {x.target.base for x in A.walk(fn.prologue + fn.body)
                 if isinstance(getattr(x, "target", None), A.AdjElem)}
    # names written in the iteration
    assigned = {}
    for x in nodes:
        n = target_name(x)
        if n is not None and not isinstance(x, A.Consume):
            assigned.setdefault(n, []).append(x)
    if var in assigned or inner_vars & (set(assigned) | {var}):
        return None
    # shared sums: adjoints (scalars, local sums) only added into
    shared = set()
    for n, xs in assigned.items():
        if all(isinstance(x, A.Accumulate) and x.op in ("+=", "-=")
               and isinstance(x.target, (A.AdjVar, A.Local)) and n not in names(x.value)
               for x in xs) and not any(
                n in _mentions(y) for y in nodes if y not in xs):
            shared.add(n)
    private = set(assigned) - shared
    # lane-invariant values: every assignment from invariant names (the loop counters
    # of inner loops included), none under a branch that may differ between lanes,
    # never read before assigned in the iteration
    conds = _enclosing_conds(body)
    invariant = set()
    changed = True
    while changed:
        changed = False
        varying_now = (private - invariant) | shared | {var} | adj_bases
        for n in sorted(private - invariant):
            xs = assigned[n]
            if all(isinstance(x, A.Assign) and isinstance(x.target, str)
                   and not set(names(x.value)) & varying_now
                   and not any(set(names(c)) & varying_now for c in conds[id(x)])
                   for x in xs) and not _exposed(body, n, False)[0]:
                invariant.add(n)
                changed = True
    lane_private = private - invariant
    # each private variable: defined afresh first, or reset at the end to its start
    prologue = {target_name(x): x for x in fn.prologue if isinstance(x, A.Assign)}
    for n in lane_private:
        if not _exposed(body, n, False)[0]:
            continue
        init = prologue.get(n)
        if init is None or not _reset_at_end(body, n, init.value):
            return None
    # nothing private (nor the loop counter) is used after the loop
    outside = set()
    inside = {id(x) for x in A.walk([rl])}
    for x in A.walk(fn.body):
        if id(x) not in inside:
            outside |= _mentions(x)
    for x in rl.body:
        if x is not loop:
            outside |= _mentions(x)
    if outside & (private | {var} | inner_vars):
        return None
    if any(n in fn.params for n in private):
        return None
    # inner loops: the same bounds for every lane; tape or loops under a branch only
    # where it goes the same way for every lane
    varying = lane_private | shared | {var}
    if any(isinstance(x, A.For) and set(names(x.iter)) & varying for x in nodes):
        return None
    if any(isinstance(x, A.If) and set(names(x.cond)) & varying and any(
            isinstance(y, (A.Push, A.Pop, A.For)) for y in A.walk(x.then + x.orelse))
           for x in nodes):
        return None
    # adjoint arrays written here: one read or consumed is not added into, and each of
    # its elements touched is the counter's (iterations touch distinct ones)
    added = {x.target.base for x in nodes
             if isinstance(x, A.Accumulate) and isinstance(x.target, A.AdjElem)}
    consumed = set()
    for x in nodes:
        if isinstance(x, A.Consume):
            consumed.add(x.target.base)
            if var not in x.target.index_texts:
                return None
    read = set()
    for x in nodes:
        for text in _texts(x):
            for b in set(names(text)) & (added | consumed):
                read.add(b)
                if not _indexed_by(text, b, var):
                    return None
    if added & (read | consumed):
        return None
    # the tape: pushes only in the replay, pops only after it, mirrored loop by loop
    kinds = {x.kind for x in nodes if isinstance(x, (A.Push, A.Pop))}
    if any(isinstance(x, A.Pop) for x in A.walk(block.body)) or any(
            isinstance(x, A.Push) for x in A.walk(body[k + 1:])):
        return None
    if _mirror(_shape(block.body)) != _shape(body[k + 1:]):
        return None
    tapes = {}
    for kind in kinds:
        decl = [x for x in rl.body if isinstance(x, A.Assign)
                and x.target == f"_tape_{kind}"]
        m = re.fullmatch(r"np\.empty\(\((.+),\), (np\.\w+)\)", decl[0].value) \
            if len(decl) == 1 else None
        if m is None:
            return None
        tapes[kind] = (decl[0], m.group(1), m.group(2))
    p = _Plan()
    p.var, p.range, p.private, p.invariant = var, rng, lane_private, invariant
    p.varying = varying
    p.prologue, p.tapes = prologue, tapes
    p.all_names = set()
    for x in A.walk(fn.prologue + fn.body):
        p.all_names |= _mentions(x)
    p.all_names |= set(fn.params)
    return p


def _never_negative(rng):
    """Is the counter of ``range`` texts (start, stop, step) a constant 0 or more at its
    lowest?  (``y[-1]`` is ``y[n - 1]``: lanes at -1 and n - 1 would touch one element.)"""
    start, stop, step = rng
    try:
        lowest = int(start) if step == 1 else int(stop) + 1
    except ValueError:
        return False
    return lowest >= 0


def _enclosing_conds(seq, outer=()):
    """{id(node): the conditions of the branches around it}."""
    out = {}
    for x in seq:
        out[id(x)] = outer
        inner = outer + (x.cond,) if isinstance(x, A.If) else outer
        for c in x.children():
            out.update(_enclosing_conds(c, inner))
    return out


def _reads(x):
    """Names ``x`` reads (an accumulation reads its target)."""
    out = set()
    for f in fields(x):
        if f.name in SKIP_FIELDS or f.name == "target":
            continue
        v = getattr(x, f.name)
        if isinstance(v, str):
            out.update(names(v))
    t = getattr(x, "target", None)
    if isinstance(t, A.AdjElem):
        for text in t.index_texts:
            out.update(names(text))
    if isinstance(x, A.Accumulate) and x.op in ("+=", "-="):
        out.add(target_name(x))
    if isinstance(x, A.Consume):
        out.add(t.base)
    return out


def _defines(x, n):
    return target_name(x) == n and (isinstance(x, (A.Assign, A.Pop)) or (
        isinstance(x, A.Accumulate) and x.op in ("=", "= -")))


def _not_first(loop):
    """The condition texts that say an iteration of ``loop`` is not its first
    (``k > 0`` of ``range(0, m)``, as the sweeps write it: ``ForwardSweep.not_first``)."""
    rng = _range(loop.iter, simple=False)
    if rng is None:
        return ()
    start, _stop, step = rng
    return (f"{loop.var} {'>' if step > 0 else '<'} {start}", f"{loop.var} != {start}")


def _plus_one(text):
    """``text + 1`` for ``m - 1`` and integer literals, else None."""
    if text.endswith(" - 1"):
        return text[:-4]
    try:
        return str(int(text) + 1)
    except ValueError:
        return None


def _counts(loop):
    """The counter values of ``loop`` as (first, end) of an ascending range, the same
    for ``range(0, m, 1)`` and its reverse ``range(m - 1, -1, -1)``; None if unknown."""
    rng = _range(loop.iter, simple=False)
    if rng is None:
        return None
    start, stop, step = rng
    if step > 0:
        return start, stop
    first, end = _plus_one(stop), _plus_one(start)
    return None if first is None or end is None else (first, end)


def _exposed(seq, n, defined, later=(), ran=None):
    """(whether ``seq`` may read ``n`` before assigning it, whether ``n`` is assigned
    after ``seq`` whatever its path), ``defined``: assigned before ``seq``.

    Two facts about loops let a value that only a loop defines count as defined:
    ``later``, the conditions under which ``n`` holds the previous iteration's value of
    an enclosing loop that assigns it on every path (``if k > 0:`` around the save of a
    value the iteration before defined); ``ran`` (shared along one path), the counter
    ranges of loops before that assign ``n`` in every iteration: a loop over the same
    counter values (the reverse of such a loop) runs only when that one ran, so it
    reads the value that loop left."""
    ran = set() if ran is None else ran
    for x in seq:
        if isinstance(x, A.For):
            if n in names(x.iter) and not defined:
                return True, defined
            inner = later
            counts = _counts(x)
            always = not defined and _always_defines(x.body, n)
            if always:
                inner = later + _not_first(x)
            if _exposed(x.body, n, defined or (counts is not None and counts in ran),
                        inner, set(ran))[0]:
                return True, defined
            _forget(ran, x)
            if always and counts is not None and not _assigns(x.body, _bound_names(counts)):
                ran.add(counts)
            continue
        elif isinstance(x, (A.ReverseLoop, A.Block)):
            bad, defined = _exposed(x.body, n, defined, later, ran)
            if bad:
                return True, defined
            continue        # (its statements updated ``ran`` one by one)
        elif isinstance(x, A.If) and x.cond in later and not x.orelse:
            # the then-branch runs only after the previous iteration defined n
            if _exposed(x.then, n, True, later, set(ran))[0]:
                return True, defined
        elif isinstance(x, A.If):
            if n in names(x.cond) and not defined:
                return True, defined
            b1, d1 = _exposed(x.then, n, defined, later, set(ran))
            b2, d2 = _exposed(x.orelse, n, defined, later, set(ran))
            if b1 or b2:
                return True, defined
            defined = d1 and d2
        else:
            if n in _reads(x) and not defined:
                return True, defined
            if _defines(x, n):
                defined = True
        _forget(ran, x)
    return False, defined


def _bound_names(counts):
    return {m for text in counts for m in names(text)}


def _assigns(seq, wanted):
    """Does a statement of ``seq`` (at any depth) assign one of ``wanted``?"""
    return any(target_name(y) in wanted or isinstance(y, A.For) and y.var in wanted
               for y in A.walk(seq))


def _forget(ran, x):
    """Drop the ranges whose bounds ``x`` may change (a later loop over the same text
    would not run over the same counter values)."""
    for counts in list(ran):
        if _assigns([x], _bound_names(counts)):
            ran.discard(counts)


def _reset_at_end(seq, n, value):
    """Whether ``seq``, entered with ``n == value``, leaves ``n == value``: the last
    statement that mentions ``n`` assigns it ``value``, or is a loop (or a block around
    one) whose body does so, with no assignment of ``n`` before it (a loop that runs
    no iteration then leaves ``n`` as it found it)."""
    mentions = [k for k, x in enumerate(seq)
                if n in {m for y in A.walk([x]) for m in _mentions(y)}]
    if not mentions:
        return True
    last = seq[mentions[-1]]
    if isinstance(last, A.Assign) and target_name(last) == n:
        return last.value == value
    if not isinstance(last, (A.For, A.ReverseLoop, A.Block)):
        return False
    if _assigns(seq[:mentions[-1]], {n}):
        return False
    return _reset_at_end(last.body, n, value)


def _always_defines(seq, n):
    """Whether every path through ``seq`` assigns ``n`` (loops inside may run no
    iteration: they do not count)."""
    for x in seq:
        if isinstance(x, (A.ReverseLoop, A.Block)):
            if _always_defines(x.body, n):
                return True
        elif isinstance(x, A.If):
            if _always_defines(x.then, n) and _always_defines(x.orelse, n):
                return True
        elif not isinstance(x, A.For) and _defines(x, n):
            return True
    return False


_PURE_CALLS = {"abs", "min", "max", "float", "int", "bool", "_sign", "range", "_select"}
_PURE_MODULES = {"math", "np", "cmath"}


def _pure(text):
    """Only calls of builtins without effects and of ``math``/``np`` functions."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            while isinstance(f, ast.Attribute):
                f = f.value
            if not (isinstance(f, ast.Name) and (
                    f.id in _PURE_MODULES if isinstance(node.func, ast.Attribute)
                    else f.id in _PURE_CALLS)):
                return False
    return True


def _indexed_by(text, base, var):
    """Every mention of ``base`` in ``text`` is ``base[...]`` with ``var`` as an index."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return False
    subs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id == base:
            idx = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if not any(isinstance(i, ast.Name) and i.id == var for i in idx):
                return False
            subs.add(id(node.value))
    return all(id(n) in subs for n in ast.walk(tree)
               if isinstance(n, ast.Name) and n.id == base)


def _shape(seq):
    """The tape structure of ``seq``: pushes/pops by kind, loops that hold any."""
    out = []
    for x in seq:
        if isinstance(x, A.Push):
            out.append(("t", x.kind))
        elif isinstance(x, A.Pop):
            out.append(("t", x.kind))
        elif isinstance(x, A.For):
            inner = _shape(x.body)
            if inner:
                out.append(("loop", tuple(inner)))
        else:
            for c in x.children():
                out.extend(_shape(c))
    return out


def _mirror(shape):
    return [("loop", tuple(_mirror(list(s[1])))) if s[0] == "loop" else s
            for s in reversed(shape)]
