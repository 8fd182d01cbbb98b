"""Replayed loops of a CPU adjoint run in parallel, in blocks with a tape each.

A loop whose reverse replays each iteration (the adjoint of iteration ``i`` first runs
that iteration's forward part again, recording what it overwrites on a small tape,
then reverses it: an element-wise body that reassigns a local under a branch,
``v = x[i]; if v > hi: v = hi + log(1 + v - hi)``) keeps one iteration's values on a
tape that every iteration reuses from the same stack position.  The tape is the only
thing its iterations share, so when the loop was asked to run in parallel (``prange``,
``parallel=True``) and its reversed body is otherwise race-free, it runs over blocks of
:data:`kadj.parallel.BLOCK` iterations in ``numba.prange``, each block a function of
its own (:mod:`kadj.row_outline`) that allocates its own tape, for one iteration, and
runs its iterations serially::

    for _blk in numba.prange(0, (t2 + 4095) // 4096):
        adj_hi += _row1(_blk, t2, x, hi, lo, adj_out, adj_x)

Race-free means, as in :func:`kadj.parallel.race_free`: every array element the body
writes is the iteration's own, every scalar it adds into and does not read is a sum
over the threads (returned by the block's function), and every other scalar is the
iteration's own: assigned before any statement other than a push reads it (a push
saves a value the replay is about to overwrite, and at the start of an iteration that
value is an earlier iteration's, which the matching pop restores and nothing reads),
or an adjoint zero at the start of every iteration, and not read after the loop.  The
block's function starts those scalars from their declared zeros.  The arrays'
gradients are bit for bit those of the serial loop; the sums over the threads equal
them to rounding.
"""
from __future__ import annotations

import numba

from . import adj_ir as A
from .adj_refs import free_name, names, roles_of
from .parallel import (BLOCK, PRANGE, _SCALAR_NODES, _elem_bases, _exposed,
                       in_blocks,
                       _is_primal_sum, _is_reduction, _occurrences, _outside_uses,
                       _range_bounds, _read_before_defined, _shared_position,
                       _summed_array, _zero_at_start)
from .lane_jam import jam_within
from .thread_parts import split_into_parts

_TAPE_NODES = (A.Push, A.Pop, A.CapacityCheck, A.Reserve)


def parallel_replays(fn, ns, wanted):
    """Run the replayed loops at the top level of ``fn`` whose primal loop is in
    ``wanted`` in parallel blocks where race-free.  Returns the number made parallel."""
    made = 0
    for rl in list(fn.body):
        if isinstance(rl, A.ReverseLoop) and rl.strategy == "replayed" and \
                rl.loop in wanted and not rl.parallel and _blocks(fn, ns, rl):
            rl.parallel = True
            made += 1
    if made:
        ns["numba"] = numba
    return made


def _parts(rl):
    """(tape allocations, the reversed ``for``) of a replayed loop, or None."""
    allocs, loops = [], []
    for x in rl.body:
        if isinstance(x, A.For):
            loops.append(x)
        elif isinstance(x, A.Assign) and isinstance(x.target, str) and \
                x.target.startswith("_tape_") and not loops:
            allocs.append(x)
        elif A.reserves_nothing(x) and not loops:
            continue        # (a reservation of nothing: a replay that records nothing)
        elif not isinstance(x, A.Comment) or loops:
            return None
    return (allocs, loops[0]) if len(loops) == 1 else None


def _blocks(fn, ns, rl):
    parts = _parts(rl)
    if parts is None:
        return False
    allocs, r = parts
    bounds = _range_bounds(r)
    if bounds is None:
        return False
    lo, hi = bounds
    var = r.var
    nodes = list(A.walk(r.body))
    for x in nodes:
        if isinstance(x, A.Push) and x.once or isinstance(x, A.CapacityCheck) and \
                x.needed:
            return False
        if not isinstance(x, _SCALAR_NODES + _TAPE_NODES):
            return False    # break, return, arrays pushed whole, ...
    plain = [x for x in nodes if not isinstance(x, _TAPE_NODES)]
    writes, reads, accesses = _occurrences(plain)
    popped = {x.target for x in nodes if isinstance(x, A.Pop)}
    if var in writes or var in popped:
        return False
    summed = {}         # arrays the iterations add into at shared elements: in parts
    for base in {b for b, kind in writes.items() if kind == "elem"} | _elem_bases(plain):
        idx = accesses.get(base, [])
        if idx and _shared_position(idx, var):
            continue
        rank = _summed_array(fn, rl, base, plain, reads)
        if rank is None:
            return False
        summed[base] = rank
    scalars = {n for n, kind in writes.items() if kind != "elem"} | popped
    reductions = {n for n in scalars if n not in popped and (
        _is_reduction(n, plain, reads) or _is_primal_sum(n, plain))}
    private = scalars - reductions
    outside = _outside_uses(fn, rl, False)
    top = next(k for k, x in enumerate(fn.body) if x is rl)
    if private & _exposed(fn.body[top + 1:], private):
        return False        # a value of the last iteration read after the loop
    declared = {}
    for x in fn.prologue:
        if isinstance(x, A.Assign) and x.op == "=":
            name = x.target if isinstance(x.target, str) else getattr(x.target, "name", None)
            if name:
                declared.setdefault(name, x.value)
    starts = []
    for name in sorted(_read_before_defined(r.body, private | {var}, {var})):
        zero = _zero_at_start(fn, rl, r, name, outside)
        if zero is None:
            return False
        starts.append(A.Assign(name, zero))
    # what pushes read before the iteration assigns it: an earlier iteration's value,
    # which the block's first iteration takes from the declarations
    stale = sorted({n for x in nodes if isinstance(x, A.Push)
                    for n in names(x.value)} & private)
    firsts = []
    for name in stale:
        if name not in declared:
            return False
        firsts.append(A.Assign(name, declared[name]))
    # the adjoints the iteration assigns before reading them, under branches too, set
    # at its top: the block's function then holds them as its own, not as sums
    started = {a.target for a in starts}
    for name in sorted({x.target.name for x in nodes if isinstance(x, A.Accumulate) and
                        isinstance(x.target, (A.AdjVar, A.Local))} & private - started):
        if name in declared:
            starts.append(A.Assign(name, declared[name]))
    kinds = sorted({x.kind for x in nodes if isinstance(x, (A.Push, A.Pop))})
    if {a.target for a in allocs} != {f"_tape_{k}" for k in kinds}:
        return False
    # each block (or part) allocates a tape of its own; an allocation that is also the
    # tape's first for the rest of the adjoint (a later loop reserves room on it)
    # stays where it was
    inside = {id(y) for y in A.walk([rl])}
    later = set()
    for y in A.walk(fn.prologue + fn.body):
        if id(y) in inside:
            continue
        later.update(n for n, _role in roles_of(y))
        if isinstance(y, (A.Push, A.Pop, A.CapacityCheck)):
            later.add(f"_tape_{y.kind}")
        elif isinstance(y, A.Reserve):
            later.update(f"_tape_{k}" for k in (y.amounts or {}))
            later.update(f"_tape_{k}" for k in ((y.hoist or {}).get("amounts") or {}))
    kept = [a for a in allocs if a.target in later]
    own_tape = [A.Assign(a.target, a.value) for a in allocs] + \
        [A.Assign(f"_sp_{k}", "0") for k in kinds] + firsts
    at = next(k for k, x in enumerate(rl.body) if x is r)
    before = [x for x in rl.body[:at] if isinstance(x, A.Comment)] + kept
    if summed:
        # one part per thread, each with its own tape and copies (kadj.thread_parts)
        rl.body[:] = before + [r]
        parts = split_into_parts(fn, ns, rl.body, r, (lo, hi), dict(sorted(
            summed.items())), starts)
        parts.body[-1:-1] = own_tape
        jam_within(fn, parts.body, r, starts)
        return True
    # the loop over blocks (kadj.parallel.in_blocks), each block with its own tape
    blocks = in_blocks(fn, A.For(var, f"{PRANGE}({lo}, {hi})", starts + r.body))
    blocks.body[1:1] = own_tape
    jam_within(fn, blocks.body, blocks.body[-1], starts)
    rl.body[:] = before + [
        A.Comment(f"# in blocks of {BLOCK} iterations run in parallel, each with a tape "
                  "of its own for its replayed iterations"),
        blocks]
    return True


def serial_unless_outlined(fn):
    """Turn back into serial loops the parallel blocks of replayed iterations that
    :mod:`kadj.row_outline` did not move into a function of their own: their tape and
    stack pointer are the function's own only there.  Returns the number turned back."""
    turned = 0
    for x in A.walk(fn.prologue + fn.body):
        if isinstance(x, A.For) and x.iter.startswith(f"{PRANGE}(") and any(
                isinstance(y, A.Assign) and isinstance(y.target, str) and
                y.target.startswith("_tape_") for y in x.body):
            x.iter = "range(" + x.iter[len(PRANGE) + 1:]
            x.body.insert(0, A.Comment("# (serial: the block's tape is not its own "
                                       "outside a function)"))
            turned += 1
    return turned
