"""Where tapes are active: the tapes of each thread, in order, and every active tape
of the process with its thread.

A launch is recorded on every tape active in the thread that launches it
(:func:`recording`); a differentiated kernel launched where no tape is active, or
not recorded on some active tape, is refused when it touches an array that a tape
active in another thread has recorded (:func:`check_unrecorded`,
:func:`check_other_threads`), since that tape would silently miss it.  :func:`enter`
and :func:`leave` are ``Tape.__enter__`` and ``Tape.__exit__``.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

from . import arrays
from .errors import DifferentiationError

__all__ = ["TapeError", "active", "check_other_threads", "check_unrecorded", "enter",
           "entered", "leave", "others_entered", "recording", "restore_stack", "stack",
           "swap_stack", "swapped_stack"]


class TapeError(DifferentiationError):
    """A tape used in a way that would lose launches: entered twice, entered in two
    threads at once, or an array it recorded touched by a launch it cannot see."""


_local = threading.local()         # .stack: the tapes active in this thread, in order
_registry_lock = threading.Lock()
entered = {}                       # every active tape in the process -> its thread


def stack():
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def active():
    """The innermost active :class:`Tape` of this thread, or None."""
    tapes = stack()
    return tapes[-1] if tapes else None


@contextmanager
def swapped_stack(tapes):
    """Make ``tapes`` (objects with ``record``) this thread's active tapes for a while:
    :func:`kadj.checkpointed_loop` runs steps unrecorded by the tapes around it."""
    saved = stack()
    _local.stack = list(tapes)
    try:
        yield
    finally:
        _local.stack = saved


def swap_stack(tapes):
    """Make ``tapes`` this thread's active tapes; return the previous ones, for
    :func:`restore_stack` (:func:`swapped_stack` without a context manager, for loops
    that run it per step)."""
    saved = stack()
    _local.stack = list(tapes)
    return saved


def restore_stack(saved):
    """Make ``saved`` (from :func:`swap_stack`) this thread's active tapes again."""
    _local.stack = saved


def check_unrecorded(kernel, args):
    """Refuse an unrecorded launch that a tape active in another thread would miss.

    Called by a differentiated kernel launched while no tape is active in its
    thread: raises :class:`TapeError` when an array argument is (or overlaps) an
    array that a tape active in another thread has recorded.  Costs nothing while no
    tape is active anywhere.
    """
    if entered:
        check_other_threads(kernel, tuple(args), ())


def check_other_threads(kernel, args, recorders):
    """Refuse the launch if it touches an array recorded by an active tape that is
    not among ``recorders`` (the tapes this launch is recorded on)."""
    here = threading.current_thread()
    with _registry_lock:
        for tape in [t for t, thread in entered.items() if not thread.is_alive()]:
            del entered[tape]   # entered by a thread that ended without leaving it
        others = [(t, thread) for t, thread in entered.items()
                  if thread is not here and all(t is not r for r in recorders)]
    for tape, owner in others:
        index = tape._index
        if not len(index):
            continue
        for i, arg in enumerate(args):
            for a in arrays.arrays_in(arg):
                if index.touches(a):
                    raise _unseen_launch_error(kernel, i, a, owner, here)


def others_entered(recorders):
    """Is a tape that is not among ``recorders`` active (in any thread)?"""
    return any(all(t is not r for r in recorders) for t in tuple(entered))


def _unseen_launch_error(kernel, i, a, owner, here):
    name = getattr(kernel, "__name__", type(kernel).__name__)
    names = tuple(getattr(kernel, "arg_names", ()))
    arg = names[i] if i < len(names) else f"#{i}"
    return TapeError(
        f"Kernel '{name}' was launched in thread '{here.name}' with argument "
        f"'{arg}' ({arrays.describe(a)}), an array that the kadj.Tape active in thread "
        f"'{owner.name}' has recorded; that tape does not see launches from other "
        "threads, so its gradient would silently miss this one, and the launch was "
        f"not run. Launch the kernel in thread '{owner.name}' inside the tape's "
        "'with' block, or record it on that tape explicitly with "
        "tape.record(kernel, args); if the launch must stay unrecorded (it only "
        "reads the array and its results never reach the tape), call "
        f"{name}.forward(...) instead.")


def recording(tape):
    """The tapes a launch recorded on ``tape`` goes on: ``tape`` and every tape
    active in the calling thread, in a fixed order (the order their locks are
    taken in, so that two threads never wait on each other)."""
    tapes = list(stack())
    if all(t is not tape for t in tapes):
        tapes.append(tape)
    tapes.sort(key=lambda t: t._serial)
    return tapes


def enter(tape):
    """Make ``tape`` active in this thread (``Tape.__enter__``)."""
    here = threading.current_thread()
    with _registry_lock:
        owner = entered.get(tape)
        if owner is not None and owner.is_alive():
            raise _entered_error(owner, here)
        entered[tape] = here
    stack().append(tape)


def leave(tape):
    """Make ``tape`` inactive (``Tape.__exit__``)."""
    tapes = stack()
    with _registry_lock:
        if entered.get(tape) is threading.current_thread():
            del entered[tape]
    innermost = bool(tapes) and tapes[-1] is tape
    for j in range(len(tapes) - 1, -1, -1):
        if tapes[j] is tape:
            del tapes[j]
            break
    else:
        raise TapeError(
            "This tape is not active in this thread, so it cannot be exited "
            "here; leave a tape in the thread that entered it.")
    if not innermost:
        raise TapeError(
            "Tapes were exited in a different order than they were entered; "
            "nest 'with tape:' blocks instead of calling __enter__ and __exit__.")


def _entered_error(owner, here):
    if owner is here:
        return TapeError(
            "This tape is already active in this thread; a tape cannot be "
            "entered again while it is recording. A launch is recorded on every "
            "tape active in its thread, so the outer 'with tape:' block already "
            "records a nested block's launches: use a new kadj.Tape() for the "
            "nested block, or none.")
    return TapeError(
        f"This tape is already active in thread '{owner.name}' and cannot be "
        f"entered in thread '{here.name}' as well: a tape records the launches "
        "of the one thread that entered it, in order. Use one kadj.Tape() per "
        "thread, or record a launch of this thread on that tape explicitly with "
        "tape.record(kernel, args).")
