"""The dependency graph of a :class:`kadj.Tape`'s backward: which adjoints must run
(for ``backward(wrt=...)``) and in what order, on which stream (for ``streams=``).

What an adjoint touches.  During the backward the forward values an adjoint reads are
immutable (each launch reads its pre-call version: a kept copy or the live array, and
no adjoint writes a forward argument), so versions of arrays cause no hazard there.
What adjoints share is the tape's *adjoint buffers*, one per tracked array: the adjoint
of a launch reads the cotangents of the arrays it writes, consumes them (overwritten
elements) and adds into the cotangents of the arrays it reads, so it reads *and* writes
the buffer of every array in its adjoint slots (:attr:`AdjointPlan.adjoint_args`).
Scalar adjoints and the buffers of an array passed twice are private to the launch.
So the adjoints of launches ``i < j`` conflict (RAW, WAR and WAW all at once) exactly
when their adjoint slots share an array, and then the adjoint of ``j`` runs first, as
in the serial backward (the sums are then added in the same order, so the gradients
equal the one-stream backward's bit for bit).  Each array's adjoints thus form a chain;
a launch waits only for the newest earlier-scheduled adjoint of each of its arrays.

Opaque entries (kernel-like objects other than differentiated kernels and custom
steps: :func:`kadj.checkpointed_loop`'s entries, whose adjoints hand buffers to each
other and run Python on the host) are *barriers*: they run after every adjoint
scheduled before them and before every adjoint scheduled after them, on the host.

Which adjoints ``wrt`` needs.  Values are ``(array, version)`` pairs.  A launch makes
the new versions of the arrays it writes from the pre-call versions of its slot arrays
(a written array counts as read: elements it does not overwrite pass through).  The
adjoint of a launch is needed when a value it writes depends on a requested input (an
array's version 0, or a scalar argument of that name) and reaches a seed; the others
are skipped.  A skipped launch's buffers then hold wrong cotangents only for values
that depend on no requested input, whose cotangents flow only to such values again, so
the requested gradients are exact.  Opaque entries are always run, and everything they
write counts as depending on the requested inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ScheduleNode", "needed", "schedule", "slot_keys"]


@dataclass(frozen=True)
class ScheduleNode:
    """One adjoint in the backward's order.

    launch:   the launch's index on the tape.
    kernel:   its kernel's name.
    stream:   the stream it runs on (0 .. streams - 1).
    waits:    indices of launches (run earlier, on other streams) whose completion
              events this adjoint waits on before it starts.
    record:   whether an event is recorded after it (another stream waits on it).
    barrier:  an opaque entry, run on the host after every stream finished its work.
    """

    launch: int
    kernel: str
    stream: int
    waits: tuple
    record: bool
    barrier: bool


def is_opaque(launch):
    """Is the launch's dataflow unknown beyond its plan (a kernel-like object other
    than a differentiated kernel or a custom step)?"""
    from .custom import CustomStep
    kernel = launch.kernel
    return not (isinstance(kernel, CustomStep) or
                getattr(kernel, "adjoint_trusted", None) is not None)


def slot_keys(launch):
    """The tracked arrays whose adjoint buffers the launch's adjoint reads and writes."""
    keys = launch.keys
    out = []
    for i in launch.plan.adjoint_args:
        k = keys[i]
        if k is not None and k not in out:
            out.append(k)
    return out


def _slot_scalars(launch):
    """Names of the launch's differentiable scalar arguments."""
    from .tape_report import scalar_arg_name
    keys, plan = launch.keys, launch.plan
    return {scalar_arg_name(plan.arg_names[i]) for i in plan.adjoint_args
            if keys[i] is None}


def needed(launches, requested, names, seeded, final_versions):
    """The indices of the launches whose adjoints lead from the seeds to the requested
    inputs: ``requested`` array keys (their version 0), scalar ``names``; ``seeded``
    keys, seeded at ``final_versions[key]`` (None: every launch counts as reaching
    a seed)."""
    depends = {(k, 0) for k in requested}
    forward = []
    for launch in launches:
        keys, versions, plan = launch.keys, launch.versions, launch.plan
        opaque = is_opaque(launch)
        hit = opaque or any((keys[i], versions[i]) in depends
                            for i in plan.adjoint_args if keys[i] is not None) or \
            bool(names and _slot_scalars(launch) & names)
        if hit:
            for i in plan.written:
                if keys[i] is not None and (opaque or i in plan.adjoint_args):
                    depends.add((keys[i], versions[i] + 1))
        forward.append(hit)
    if seeded is None:
        return {launch.index for launch, hit in zip(launches, forward) if hit}
    position = {launch.index: j for j, launch in enumerate(launches)}
    reaches = {(k, final_versions[k]) for k in seeded}
    kept = set()
    for launch in reversed(launches):
        keys, versions, plan = launch.keys, launch.versions, launch.plan
        opaque = is_opaque(launch)
        if not opaque and not any(
                (keys[i], versions[i] + 1) in reaches for i in plan.written
                if keys[i] is not None and i in plan.adjoint_args):
            continue
        for i in plan.adjoint_args:
            if keys[i] is not None:
                reaches.add((keys[i], versions[i]))
        if forward[position[launch.index]]:
            kept.add(launch.index)
    return kept


def schedule(launches, streams=1, barrier=is_opaque):
    """The backward of ``launches`` (in tape order; their adjoints run in reverse) on
    ``streams`` streams: a list of :class:`ScheduleNode` in the order they are issued.

    A launch waits for the newest scheduled adjoint of each of its slot arrays
    (:func:`slot_keys`), and for the latest barrier; a barrier waits for everything.
    The launch continues the stream of one of those it waits for when that one is the
    stream's newest (no event needed); otherwise it takes a stream not used yet, or
    the stream that needs the fewest new waits (oldest work first).  A wait is left
    out when the stream already waited, directly or through another stream's event,
    for that launch or a later one of the same stream.
    """
    streams = max(1, int(streams))
    last = {}                 # array key -> the newest scheduled launch touching it
    tails = [None] * streams  # per stream, its newest launch
    order = {}                # launch index -> issue position
    where = {}                # launch index -> (stream, position in that stream)
    know = {}                 # launch index -> {stream: newest position known done}
    counts = [0] * streams
    latest_barrier = None
    since_barrier = []
    nodes = []
    for launch in reversed(launches):
        index = launch.index
        is_barrier = barrier(launch)
        if is_barrier:
            deps = set(since_barrier) | ({latest_barrier} - {None})
        else:
            deps = {last[k] for k in slot_keys(launch) if k in last}
            if latest_barrier is not None:
                deps.add(latest_barrier)
        if is_barrier:
            stream = 0
        else:
            stream = _choose(deps, tails, where, know, order, streams)
        known = dict(know[tails[stream]]) if tails[stream] is not None else {}
        waits = []
        for d in sorted(deps, key=lambda d: order[d]):
            s, pos = where[d]
            if s == stream or known.get(s, -1) >= pos:
                continue
            waits.append(d)
            for t, p in know[d].items():
                if known.get(t, -1) < p:
                    known[t] = p
        pos = counts[stream]
        counts[stream] += 1
        known[stream] = pos
        know[index] = known
        where[index] = (stream, pos)
        order[index] = len(nodes)
        tails[stream] = index
        nodes.append([index, launch.plan.kernel_name, stream, tuple(waits), False,
                      is_barrier])
        for k in slot_keys(launch):
            last[k] = index
        if is_barrier:
            latest_barrier, since_barrier = index, []
        else:
            since_barrier.append(index)
    waited = {d for node in nodes for d in node[3]}
    return [ScheduleNode(n[0], n[1], n[2], n[3], n[0] in waited, n[5]) for n in nodes]


def _choose(deps, tails, where, know, order, streams):
    for s in range(streams):              # continue the chain of a dependency
        if tails[s] is not None and tails[s] in deps:
            return s
    for s in range(streams):              # an idle stream
        if tails[s] is None:
            return s
    best, best_key = 0, None
    for s in range(streams):
        known = know[tails[s]]
        new = sum(1 for d in deps if where[d][0] != s and
                  known.get(where[d][0], -1) < where[d][1])
        key = (new, order[tails[s]])
        if best_key is None or key < best_key:
            best, best_key = s, key
    return best
