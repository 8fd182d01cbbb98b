"""Replayed iterations run in lanes on the CPU (unroll-and-jam of a replayed loop).

A replayed loop (strategy "replayed": each reversed iteration replays its own forward
part, recording a tape, then reverses it) spends its time in short dependent chains:
the replayed recurrence (``p = p * xi + coeffs[j]``) and its reversal.  One iteration
at a time, the processor waits on each chain.  :func:`jam_replayed` runs four or
eight consecutive iterations together (:func:`lanes_for`): each statement of the iteration is written once per
lane (the lane's own copies of the iteration's variables, ``xi_l1``...), and an inner
loop whose bounds are the same for every lane is written once with the lanes' bodies
jammed in it, so the lanes' chains are independent instructions side by side.  Values
the same for every lane (``t5 = k - 2``, a branch on an inner loop's counter) are
computed once; a sum of every lane into the same element or scalar adjoint is written
once, the lanes' terms added first (``adj_coeffs[j] += (a3 + a2) + (a1 + a0)``).  The
iterations left over (the trip count modulo the lanes) run as before, in a second loop.

The tape holds the lanes' values side by side: the replay part pushes lane by lane and
the reverse part pops in the opposite lane order, each jammed push or pop unit of all
lanes at once, so every pop reads what its mirrored push wrote (checked: the pushes'
loop structure mirrors the pops').  The addresses come from the loop counters where
:mod:`kadj.lane_tape` can lay them out; otherwise the stack pointer moves once per unit
and is set back to its value at the loop's start at the top of each jammed iteration
(an iteration pops what it pushes).

Exact, not a reordering of the arithmetic within an iteration: each lane computes its
iteration as written.  What changes is the order of statements *between* iterations,
so a loop qualifies only when that order cannot matter:

* no statement stores into a primal array (nor restores one) or calls anything but
  builtins without effects and ``math``/``np`` functions; no break, continue,
  return, nested replay, checkpoint or tape growth (a reservation or capacity check
  that is not already covered); tape pushes and pops, and inner loops, only under
  branches that go the same way for every lane;
* each variable the iteration assigns is either defined before any read in the
  iteration (on every path), or an adjoint reset at the end of the iteration to its
  initial value (then zero at each iteration's start); none is used after the loop.
  A value an inner loop assigns in every step counts as defined where only a later
  step reads it (the save ``if k > 0:`` of the previous step's value) and in a loop
  over the same counter values after it (its reverse, which runs only when that loop
  ran); an adjoint whose last mention is its reset at the end of an inner loop's step,
  with no assignment before that loop, is back at its initial value after the loop;
  the adjoints it only adds into (``adj_b += ...``) are shared by the lanes;
* an adjoint array that the iteration reads or consumes is not added into by it, and
  each element read is indexed by the loop counter, which starts at a constant 0 or
  more (iterations touch distinct ones: ``y[-1]`` would be ``y[n - 1]``);
  adjoint arrays it only adds into are added to in another order (exact up to the
  rounding of the sums, as any reordering of commutative sums).
"""
from __future__ import annotations

import ast
import copy
import re
from dataclasses import fields

from . import adj_ir as A
from . import lane_tape
from .adj_refs import free_name, names
from .lane_check import SKIP_FIELDS, _mentions, _range, analyse, no_op, parts, target_name

#: iterations run side by side: ``WIDE`` where the iteration keeps at most
#: ``FEW_VALUES`` values of its own (eight lanes of them fit AVX-512's 32 vector
#: registers), else ``LANES``
LANES = 4
WIDE = 8
FEW_VALUES = 4


def lanes_for(p):
    """How many iterations to run side by side, from the jam's plan ``p``.  Each
    iteration is a dependent chain (the replayed recurrence, then its reverse); the more
    lanes, the more chains in flight, until the lanes' values no longer fit the
    processor's registers.  The same on every machine: the generated adjoint does not
    depend on the host.  (Horner's rule per element, 9 coefficients, one thread: 4
    lanes 1.17-1.22x an expert's adjoint, 8 lanes 1.04-1.07x; a per-element
    recurrence 0.45x -> 0.41x; with code for a 16-register AVX2 processor, 1.22x ->
    1.10x.)"""
    return WIDE if len(p.private) <= FEW_VALUES else LANES


def jam_replayed(fn, lanes=None):
    """Run the iterations of each qualifying replayed loop of ``fn`` (an adjoint IR
    function, simplified) ``lanes`` at a time (None: :func:`lanes_for` each loop).
    Returns the number of loops jammed."""
    done = 0
    for rl in [x for x in A.walk(fn.body) if isinstance(x, A.ReverseLoop)]:
        if rl.strategy == "replayed" and not rl.parallel and _jam(fn, rl, lanes):
            done += 1
    return done


def jam_within(fn, seq, loop, starts, lanes=None):
    """Run ``lanes`` at a time the iterations of ``loop``: the serial loop of one block
    or part of a replayed loop run in parallel (:mod:`kadj.replay_blocks`), found in the
    statement list ``seq`` after the block's own tape allocations.  ``starts``: the
    statements at the top of ``loop``'s body that set the iteration's own values to
    their zeros.

    The jam is planned on a copy: the loop and its tapes as a replayed loop of a
    function whose prologue sets ``starts`` (and ``fn``'s declarations), so the jam's
    own analysis decides, and proves that an iteration leaves each value it reads before
    assigning as it found it.  Then those values, every lane's, are set once before the
    loop instead of at every iteration.  Returns whether ``loop`` was jammed (otherwise
    ``seq`` is unchanged)."""
    if loop.body[:len(starts)] != starts or not all(
            isinstance(x, A.Assign) and isinstance(x.target, str) for x in starts):
        return False
    bounds = _range(loop.iter, simple=False)
    if bounds is None or bounds[2] != 1:
        return False
    allocs = [x for x in seq[:seq.index(loop)] if isinstance(x, A.Assign) and
              isinstance(x.target, str) and x.target.startswith("_tape_")]
    taken = {n for x in A.walk(fn.prologue + fn.body) for n in _mentions(x)} | set(fn.params)
    for _decorator, helper in fn.helpers:
        taken |= {n for x in A.walk(helper.prologue + helper.body) for n in _mentions(x)}
    # the block's bounds as names (the jammed loops and their split point read them)
    bound_assigns = []
    first, last = bounds[:2]
    if not first.isidentifier():
        first = _bound_name(fn, "_first", first, taken, bound_assigns)
    if not last.isidentifier():
        last = _bound_name(fn, "_last", last, taken, bound_assigns)
    trial = A.For(loop.var, f"range({first}, {last})",
                  copy.deepcopy(loop.body[len(starts):]), loop.primal, loop.trip)
    trial_allocs = [copy.deepcopy(x) for x in allocs]
    rl = A.ReverseLoop("replayed", None, trial_allocs + [trial])
    declared = [copy.deepcopy(x) for x in fn.prologue] + [copy.deepcopy(x) for x in starts]
    scratch = A.Function(fn.name, fn.params, "", declared, [rl])
    p = _jam(scratch, rl, lanes, nonneg=True, taken=taken)
    if p is None:
        return False
    if {target_name(x) for x in starts} - p.private - p.invariant:
        return False        # (a value the lanes share: left as it was)
    lanes_of = {n: [m.get(n, n) for m in p.maps] for n in p.private}
    inits = {}
    for x in scratch.prologue:      # the lanes' values read before assigned, set once
        n = target_name(x)
        if isinstance(x, A.Assign) and n in p.private:
            inits[n] = x.value
    at = seq.index(loop)
    already = {(x.target, x.value) for x in seq[:at] if isinstance(x, A.Assign)}
    before = [A.Assign(m, v) for n, v in sorted(inits.items()) for m in lanes_of[n]
              if (m, v) not in already]
    before += [copy.deepcopy(x) for x in starts if target_name(x) in p.invariant]
    for real, planned in zip(allocs, trial_allocs):
        real.value = planned.value
    seq[at:at + 1] = before + bound_assigns + rl.body[len(trial_allocs):]
    return True


def _bound_name(fn, base, text, taken, assigns):
    """A fresh name for the bound ``text``, its assignment appended to ``assigns``."""
    name = free_name(fn, base, taken=taken)
    taken.add(name)
    assigns.append(A.Assign(name, text))
    return name


# ---- the jammed loop ---------------------------------------------------------------------
def _jam(fn, rl, lanes, nonneg=False, taken=frozenset()):
    """Jam ``rl`` in place; returns its plan, or None when it does not qualify (then
    ``fn`` is unchanged).  ``taken``: names in use besides ``fn``'s."""
    found = parts(rl)
    if found is None:
        return None
    loop, block, k = found
    p = analyse(fn, rl, loop, block, k, nonneg)
    if p is None:
        return None
    p.all_names |= set(taken)
    if lanes is None:
        lanes = lanes_for(p)
    suffix = [""] + [f"_l{n}" for n in range(1, lanes)]
    renamed = p.private | {p.var}
    if any(n + s in p.all_names for n in renamed for s in suffix[1:]):
        return None
    maps = [{}] + [{n: n + s for n in renamed} for s in suffix[1:]]
    start, stop, step = p.range
    stop_name = _fresh("_lanes_stop", p.all_names)
    p.renamed = renamed
    p.layout = lane_tape.layout(block.body, loop.body[k + 1:], lanes, p.all_names)
    base = {} if p.layout is not None else {
        kind: _fresh(f"_sp_start_{kind}", p.all_names) for kind in p.tapes}

    fwd_lanes = list(range(lanes))
    rev_lanes = fwd_lanes[::-1]
    jammed = [A.Assign(f"_sp_{kind}", base[kind]) for kind in sorted(base)]
    jammed += [A.Assign(maps[n][p.var], f"{p.var} {'-' if step < 0 else '+'} {n}")
               for n in range(1, lanes)]
    jammed += _jam_seq(loop.body[:k], rev_lanes, maps, p, lanes)
    jammed.append(A.Block(block.what, _jam_seq(block.body, fwd_lanes, maps, p, lanes)))
    jammed += _jam_seq(loop.body[k + 1:], rev_lanes, maps, p, lanes)

    trip = f"max(0, ({stop}) - ({start}))" if step > 0 else f"max(0, ({start}) - ({stop}))"
    sign = "+" if step > 0 else "-"
    head = [A.Comment(f"# iterations {lanes} at a time, side by side (the rest after)"),
            A.Assign(stop_name, f"{start} {sign} {trip} // {lanes} * {lanes}")]
    head += [A.Assign(base[kind], f"_sp_{kind}") for kind in sorted(base)]
    main = A.For(loop.var, f"range({start}, {stop_name}, {lanes * step})", jammed)
    rest = A.For(loop.var, f"range({stop_name}, {stop}" + (", -1)" if step < 0 else ")"),
                 loop.body, loop.primal, None)
    at = rl.body.index(loop)
    rl.body[at:at + 1] = head + [main, rest]
    for kind, (decl, size, dtype) in p.tapes.items():
        decl.value = f"np.empty(({lanes} * {_atom(size)},), {dtype})"
    for x in list(fn.prologue):
        n = target_name(x)
        if isinstance(x, A.Assign) and n in p.private:
            at = fn.prologue.index(x) + 1
            fn.prologue[at:at] = [_renamed(x, maps[m]) for m in range(1, lanes)]
    p.maps = maps
    return p


def _fresh(name, taken):
    k, out = 1, name
    while out in taken:
        k += 1
        out = f"{name}{k}"
    taken.add(out)
    return out


def _atom(text):
    node = ast.parse(text, mode="eval").body
    return text if isinstance(node, (ast.Name, ast.Call, ast.Constant)) else f"({text})"


def _jam_seq(seq, order, maps, p, lanes):
    """``seq`` with each statement written once per lane in ``order``: loops (the same
    bounds for every lane) once with their bodies jammed, pushes and pops of all lanes
    with one move of the stack pointer, lane-invariant values and comments once."""
    out = []
    for x in seq:
        if isinstance(x, A.Comment) or no_op(x):
            out.append(copy.copy(x))
        elif isinstance(x, A.Assign) and isinstance(x.target, str) and x.target in p.invariant:
            out.append(copy.copy(x))
        elif isinstance(x, A.For):
            if p.layout is not None:
                out.extend(p.layout.before.get(id(x), ()))
            out.append(A.For(x.var, x.iter, _jam_seq(x.body, order, maps, p, lanes),
                             x.primal, x.trip))
        elif isinstance(x, A.If) and not set(names(x.cond)) & p.varying:
            out.append(A.If(x.cond, _jam_seq(x.then, order, maps, p, lanes),
                            _jam_seq(x.orelse, order, maps, p, lanes)))
        elif isinstance(x, A.ReverseLoop):
            out.append(A.ReverseLoop(x.strategy, x.loop,
                                     _jam_seq(x.body, order, maps, p, lanes), x.parallel))
        elif isinstance(x, A.Push):
            if x.note:
                out.append(A.Comment(f"# {x.note}"))
            at = _slots(x, p)
            for n in sorted(order):
                v = _renamed(x, maps[n]).value
                out.append(A.Assign(f"_tape_{x.kind}[{at(n)}]", v))
            if p.layout is None:
                out.append(A.Assign(f"_sp_{x.kind}", str(lanes), "+="))
        elif isinstance(x, A.Pop):
            if x.note:
                out.append(A.Comment(f"# {x.note}"))
            if p.layout is None:
                out.append(A.Assign(f"_sp_{x.kind}", str(lanes), "-="))
            at = _slots(x, p)
            for n in order:
                out.append(A.Assign(_renamed(x, maps[n]).target, f"_tape_{x.kind}[{at(n)}]"))
        elif _same_element(x, p):
            y = copy.deepcopy(x)
            y.value = _tree([_atom(_renamed(x, maps[n]).value) for n in order])
            out.append(y)
        else:
            out.extend(_renamed(x, maps[n]) for n in order)
    return out


def _slots(x, p):
    """lane -> the address text of ``x``'s value in the tape."""
    if p.layout is not None:
        return p.layout.index[id(x)]
    return lambda lane: f"_sp_{x.kind} + {lane}" if lane else f"_sp_{x.kind}"


def _same_element(x, p):
    """A sum into the same element (or scalar adjoint) for every lane: written once,
    with the lanes' terms added first (merged accumulations)."""
    if not (isinstance(x, A.Accumulate) and x.op == "+="):
        return False
    t = x.target
    if isinstance(t, A.AdjElem):
        return not any(set(names(i)) & p.renamed for i in t.index_texts)
    return isinstance(t, (A.AdjVar, A.Local)) and t.name not in p.renamed


def _tree(terms):
    """``(a + b) + (c + d)``: the lanes' terms summed pairwise."""
    while len(terms) > 1:
        pairs = [f"{terms[i]} + {terms[i + 1]}" for i in range(0, len(terms) - 1, 2)]
        pairs = [f"({t})" if len(terms) > 2 else t for t in pairs]
        terms = pairs + ([terms[-1]] if len(terms) % 2 else [])
    return terms[0]


def _renamed(x, mapping):
    """A deep copy of ``x`` with the names of ``mapping`` renamed."""
    y = copy.deepcopy(x)
    if not mapping:
        return y
    pattern = re.compile(r"(?<![\w.])(" + "|".join(
        re.escape(n) for n in sorted(mapping, key=len, reverse=True)) + r")(?!\w)")

    def r(text):
        return pattern.sub(lambda m: mapping[m.group(1)], text)
    for z in A.walk([y]):
        for f in fields(z):
            if f.name in SKIP_FIELDS:
                continue
            v = getattr(z, f.name)
            if isinstance(v, str):
                setattr(z, f.name, r(v))
            elif isinstance(v, A.AdjVar):
                setattr(z, f.name, A.AdjVar(v.var, mapping.get(v.name, v.name)))
            elif isinstance(v, A.Local):
                setattr(z, f.name, A.Local(mapping.get(v.name, v.name), v.array, v.index))
            elif isinstance(v, A.AdjElem):
                setattr(z, f.name, A.AdjElem(v.array, v.index, v.base,
                                             tuple(r(t) for t in v.index_texts)))
    return y


