"""Deterministic replay across ranks: every rank must run the same communicating
adjoints, in the same order, or the backward would hang.

Each communicator kadj.mpi uses is registered here (in the order the ranks use them,
which is the same on every rank: the calls that register them are collective;
congruent communicators count as one).  Every
communicating operation gets a signature ``(kind, communicator number, ordinal)``, the
ordinal counting the operations on that communicator in this process; when the
forward communicated without hanging, the ranks' ordinals agree.  A recorded operation
keeps its signature on its tape entry; an operation run by a
:func:`kadj.checkpointed_loop` in its first forward sweep is noted on the loop.

At the start of every ``Tape.backward`` (a hook of :mod:`kadj.tape_backward`), once
this process has registered a communicator, each rank lists the signatures of the
communicating steps its tape will replay and compares a digest of them with the
other ranks' (one small ``allgather`` per communicator).  On a mismatch every rank
raises the same :class:`kadj.DifferentiationError`, before any adjoint communicates.
The same allgather carries whether the rank's tape found an array changed outside
the recorded launches (its check for unrecorded changes, run here first), so that such
a change on some ranks only stops every rank.  So ``tape.backward`` is collective over
the communicators in use;
:func:`local` exempts a tape that only one rank runs.
"""
from __future__ import annotations

import hashlib
import weakref

from .. import tape_backward
from ..errors import DifferentiationError

__all__ = ["local", "note", "register", "signature"]

_comms = []                          # registered communicators, in order of use
_ordinals = []                       # per communicator: operations run so far
_loops = weakref.WeakKeyDictionary()  # checkpointed loop -> signatures of its sweep
_local = weakref.WeakSet()           # tapes exempted by local()


def register(comm):
    """The number of ``comm`` among the registered communicators (registering it); a
    communicator congruent to a registered one (the same ranks in the same order, as
    a Cartesian one made without reordering) shares its number and its check."""
    from mpi4py import MPI
    for i, c in enumerate(_comms):
        if c == comm or MPI.Comm.Compare(c, comm) in (MPI.IDENT, MPI.CONGRUENT):
            return i
    _comms.append(comm)
    _ordinals.append(0)
    if _check not in tape_backward.before_backward:
        tape_backward.before_backward.append(_check)
    return len(_comms) - 1


def signature(index, kind):
    """The signature of the next operation of ``kind`` on communicator ``index``."""
    _ordinals[index] += 1
    return (kind, index, _ordinals[index])


def note(recorder, sig):
    """An operation of signature ``sig`` ran under ``recorder`` (what
    ``kadj.tape.active()`` returned): note it on a checkpointed loop in its first
    forward sweep (a tape keeps it on its entry)."""
    loop = getattr(recorder, "loop", None)
    if loop is not None and getattr(recorder, "first_run", False):
        _loops.setdefault(loop, []).append(sig)


def local(tape):
    """Exempt ``tape`` from the check across ranks at its ``backward`` (for a tape
    that only this rank runs, which must record no communicating step); returns it."""
    _local.add(tape)
    return tape


def _signatures(tape):
    out = []
    for launch in tape.launches:
        sig = getattr(launch.kernel, "mpi_signature", None)
        if sig is not None:
            out.append(sig)
        else:
            try:
                out.extend(_loops.get(launch.kernel, ()))
            except TypeError:          # an entry that cannot be weakly referenced
                pass
    return out


def _check(tape):
    if tape in _local:
        if _signatures(tape):
            raise DifferentiationError(
                "A tape marked kadj.mpi.local(tape) recorded communicating steps "
                "(halo exchanges or reductions); their adjoints communicate, so call "
                "backward on every rank without local().")
        return
    # an unrecorded change found on one rank stops the backward on every rank
    error = None
    if tape.check_unrecorded_changes:
        try:
            tape._check_fingerprints()
        except DifferentiationError as e:
            error = e
    mine = _signatures(tape)
    for index, comm in enumerate(_comms):
        steps = [s for s in mine if s[1] == index]
        digest = hashlib.blake2b(repr(steps).encode(), digest_size=8).hexdigest()
        everyone = comm.allgather((len(steps), digest, error is not None))
        failed = [r for r, (_, _, bad) in enumerate(everyone) if bad]
        if failed:
            if error is not None:
                raise error
            raise DifferentiationError(
                f"tape.backward() stopped on every rank: the tape of rank(s) "
                f"{', '.join(map(str, failed))} found an array changed outside the "
                "recorded launches (the error raised there names it; a boundary "
                "condition set from Python on some ranks only is a common cause: "
                "record it with kadj.custom_step).")
        if len({(n, d) for n, d, _ in everyone}) == 1:
            continue
        counts = ", ".join(f"rank {r}: {n}" for r, (n, _, _) in enumerate(everyone))
        raise DifferentiationError(
            "tape.backward() found that the ranks recorded different communicating "
            f"steps (halo exchanges and reductions on communicator #{index}; steps per "
            f"rank: {counts}).  Their adjoints communicate, so every rank must record "
            "the same exchanges and reductions, in the same order, on its tape (inside "
            "or outside checkpointed_loop alike): run the same code on every rank, "
            "with the tape active around the same operations.  Without this check the "
            "backward would hang.")
