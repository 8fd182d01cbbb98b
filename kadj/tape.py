"""The Tape: record a sequence of kernel launches, replay their adjoints in reverse.

What it establishes.  After ``tape.backward(...)``, ``tape.grad(x)`` is the cotangent
of ``x``'s contents *before the first recorded launch that touched it*, for the map
from the initial state of every array the tape saw to the seeded final state.  This
is the composition rule of API.md: each adjoint maps the cotangent of its launch's
post-call state to that of its pre-call state, so replaying the adjoints in reverse
over one adjoint buffer per array yields the gradient of the whole sequence.

How.  Each adjoint must run on its launch's *pre-call* arguments.  Arrays are
tracked by their exact memory view (data pointer, shape, strides, dtype; the tape
keeps a reference, so the memory is not reused while it is recorded), and every
recorded write starts a new *version* of the array.  Before a launch writes an
array, the tape copies its current contents if they will be needed: when this
launch reads the array too (an in-place update), or when an earlier launch read
that version.  Versions that nobody reads are never copied, and the newest version
of an array is the live array itself.  ``Tape(copy_inputs=False)`` never copies and
instead refuses, before the forward runs, a launch that would overwrite what an
adjoint needs, naming both launches and the argument.  Scalars are kept as passed.

CUDA launches (``k[grid, block](...)`` inside ``with tape``) are recorded with their
configuration and replayed as ``k.adjoint[grid, block, stream]``; their arrays may be
of any kind :mod:`kadj.arrays` accepts (NumPy, numba device, CuPy arrays), and the
tape's copies and adjoint buffers live where each array lives (``tape.grad(x)`` is of
the same kind as ``x``): the backward of launches on device arrays copies nothing to
the host and does not wait for the device (:mod:`kadj.tape_streams`).  With
``Tape(streams=k)`` (or ``backward(..., streams=k)``) independent adjoints run on ``k``
streams joined by events, following :meth:`Tape.schedule`
(:mod:`kadj.tape_graph`); CPU launches run in order.  ``backward(loss, wrt=[...])``
runs only the adjoints that lead from the seeds to the listed arrays and scalars.

Nesting and threads.  A launch is recorded on every tape active in the thread that
launches it, so in ``with Tape() as outer: ... with Tape() as inner: ...`` the outer
tape records the inner block's launches too, and each tape's ``backward`` is that of
its own complete sequence (an inner tape sees the arrays as they were when it first
saw them).  A tape is active in one thread at a time, once: entering it again, in
the same thread or in another, raises :class:`TapeError`.  A tape does not see
launches from other threads, so a differentiated kernel launched in a thread where
the tape is not active, and touching an array that the tape has recorded (the same
array or an overlapping view), is refused with :class:`TapeError` before it runs;
launches on arrays that no active tape has seen (a data loader's) run unrecorded.
``tape.record(kernel, args)`` records a launch of another thread explicitly, and
``kernel.forward(...)`` runs one deliberately unrecorded.  ``record``, ``backward``,
``grad`` and the other methods of one tape are serialized by a lock: concurrent
records are recorded one at a time, in the order they get the lock.

Unrecorded changes.  Python code between launches (``u[0] = 0``, an FFT) is
invisible to the tape unless recorded with :meth:`Tape.record_custom` (or
:func:`kadj.custom_step`) with its own adjoint.  To catch the silent wrong gradient an
unrecorded change would give, the tape keeps a fingerprint of each tracked array's
newest contents and compares it at the next launch that passes the array and at
``backward`` (:mod:`kadj.tape_checks`).  A change to a host array makes ``backward``
raise :class:`DifferentiationError` naming the array.  Device arrays are compared on
their device, so that recording and ``backward`` neither copy to the host nor wait:
a change fills the device gradients with NaN, and the named error is raised by
``tape.check()`` (which waits), by ``tape.grad`` once the backward has completed on
the device, and by calls that return host results.
``Tape(check_unrecorded_changes=False)`` turns the check off.

Modules.  This module holds the tape's recording and results; which tapes are active
in which thread is :mod:`kadj.tape_threads`, the bookkeeping of array versions and
copies :mod:`kadj.tape_versions`, the fingerprints :mod:`kadj.tape_checks`, the lookup of
tracked arrays by identity and by memory span :mod:`kadj.tape_index`, and the replay
:mod:`kadj.tape_backward`.  Recording and replaying a launch cost a few microseconds of
Python each, independent of the number of launches and arrays on the tape.

Limitations.  Arrays that overlap in memory without being the same view are refused.  A value returned by a recorded
launch cannot be seeded (write it into an array instead).
"""
from __future__ import annotations

import functools
import itertools
import threading
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np

from . import arrays
from . import tape_report
from . import tape_threads
from .custom import CustomStep
from .errors import DifferentiationError
from .tape_backward import Backward, stream_count as _stream_count
from .tape_checks import Checks, Prints
from .tape_index import ArrayIndex
from .tape_threads import TapeError, active, check_unrecorded, swapped_stack
from .tape_versions import Launch, Versions

__all__ = ["Launch", "ScalarGrad", "Tape", "TapeError", "active", "check_unrecorded",
           "custom_step", "swapped_stack"]

_serials = itertools.count()       # a total order of tapes, to take their locks in


def _serialized(method):
    """Run a :class:`Tape` method under the tape's lock."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


@dataclass(frozen=True)
class ScalarGrad:
    """The gradient with respect to one scalar argument of one launch: a ``float``, or
    for a complex argument ``z = x + iy`` the ``complex`` dL/dx + i dL/dy."""

    launch: int
    kernel_name: str
    arg_name: str
    value: float | complex


def _scalar(value):
    """A scalar gradient as a Python number: complex for a complex argument."""
    return complex(value) if np.iscomplexobj(value) else float(value)


class Tape(Versions, Checks, Backward):
    """Records kernel launches and computes gradients through the whole sequence.

    Example::

        with kadj.Tape() as tape:
            heat_step(u0, u1, 0.1)
            heat_step(u1, u2, 0.1)
            loss_kernel(u2, target, loss)     # loss: a 1-element array
        tape.backward(loss)
        g_u0 = tape.grad(u0)

    ``copy_inputs=False`` makes the tape refuse, instead of copying, a launch that
    would overwrite an array that a recorded adjoint still needs.
    ``check_unrecorded_changes=False`` skips the fingerprints that detect changes made
    to recorded arrays outside recorded launches (on the host about 50 us per MB of
    array arguments per launch, and per MB of tracked arrays at ``backward``; device
    arrays are checked on their device, without waiting: :meth:`check`).
    ``streams=k`` runs the backward of CUDA launches on ``k`` streams
    (:meth:`schedule`); CPU launches run in order.
    """

    def __init__(self, *, copy_inputs=True, check_unrecorded_changes=True, streams=1):
        self.copy_inputs = bool(copy_inputs)
        self.check_unrecorded_changes = bool(check_unrecorded_changes)
        self.streams = _stream_count(streams)
        self._lock = threading.RLock()
        self._serial = next(_serials)
        self.reset()

    # ------------------------------------------------------------- activation

    def __enter__(self):
        tape_threads.enter(self)
        return self

    def __exit__(self, *exc_info):
        tape_threads.leave(self)
        return False

    def __repr__(self):
        with self._lock:
            return (f"Tape({len(self._launches)} launches, {len(self._arrays)} "
                    f"arrays, {self.snapshot_count} snapshots)")

    @property
    def launches(self):
        """The recorded launches, in order."""
        with self._lock:
            return tuple(self._launches)

    @property
    def snapshot_count(self):
        """How many array copies the tape keeps."""
        with self._lock:
            return sum(len(t.snapshots) for t in self._arrays.values())

    # -------------------------------------------------------------- recording

    def record(self, kernel, args, config=None, *, run=True):
        """Run ``kernel.forward(*args)`` once and record it; return its result.

        ``run=False`` records the launch without running it (its adjoint recomputes
        what it needs; the arrays it writes keep their old contents): for
        :func:`kadj.checkpointed_loop`, which reverses a step right after recording it.

        The launch is recorded on this tape and on every other tape active in the
        calling thread.  A differentiated kernel calls it on the innermost tape
        active in its thread; call it directly to record, on this tape, a launch
        made in another thread.  Launches are recorded one at a time.
        """
        args = tuple(args)
        try:
            plan = kernel.adjoint_plan(*args)
        except AttributeError:
            if hasattr(kernel, "adjoint_plan"):
                raise
            raise TypeError(
                f"tape.record takes a differentiated kernel (kadj.differentiate) or a "
                f"custom step, got {kernel!r}; decorate a numba kernel with "
                "@kadj.differentiate, and record Python code with "
                "tape.record_custom(forward, adjoint, reads=..., writes=...).") from None
        stack = tape_threads.stack()
        if len(stack) == 1 and stack[0] is self:
            with self._lock:                 # the common case: one tape, its thread
                return _record_on((self,), kernel, args, config, plan, run)
        tapes = tape_threads.recording(self)
        with ExitStack() as held:
            for tape in tapes:
                held.enter_context(tape._lock)
            return _record_on(tapes, kernel, args, config, plan, run)

    def record_custom(self, forward, adjoint, reads=(), writes=(), *, name=None,
                      values=False):
        """Run ``forward()`` now and record it as one step with its own adjoint.

        For Python code between launches that changes recorded arrays (a boundary
        condition, an FFT, a halo exchange).  ``reads`` and ``writes`` list the arrays
        ``forward`` reads and writes (an array updated in place goes in both).  At
        ``backward``, ``adjoint(*adjoints)`` gets one adjoint buffer per distinct array
        of ``reads + writes`` in that order (None for an array that is not floating
        point), with the convention of kernel adjoints: on entry each holds the
        cotangent of the array after ``forward``; on return, that of the array before
        it (overwritten elements consumed, read elements accumulated into).  With
        ``values=True`` the adjoint is called as ``adjoint(*before, *adjoints)``,
        ``before`` the arrays' contents from before ``forward`` (the tape keeps copies
        where needed, as for launches).  Returns what ``forward`` returns.
        """
        step = CustomStep(forward, adjoint, reads, writes, name=name, values=values)
        return self.record(step, step.arrays)

    # --------------------------------------------------------------- backward

    @_serialized
    def backward(self, loss=None, *, seeds=None, wrt=None, streams=None):
        """Replay the recorded adjoints in reverse and accumulate the gradients.

        ``loss`` is a recorded 1-element floating-point array, seeded with 1.0;
        ``seeds`` is a list of ``(array, cotangent)`` pairs, each cotangent the
        shape of its array (a NumPy array, or an array of its array's kind and dtype).
        Gradients add up over calls until :meth:`zero`.

        ``wrt``: a list of recorded arrays and scalar argument names; only the adjoints
        of launches on a path from the seeds back to them run, and only their
        gradients are kept (:meth:`grad` of another array is refused).  ``streams``:
        the number of CUDA streams for this backward (default: the tape's).

        On a tape of CUDA launches on device arrays, the buffers are allocated, zeroed
        and accumulated on the device, and ``backward`` copies nothing to the host and
        does not wait for the device, the check for unrecorded changes included (a
        change to a device array fills its gradients with NaN; :meth:`check`).
        """
        self._backward(loss, seeds, wrt, streams)

    @_serialized
    def schedule(self, streams=None, *, wrt=None, loss=None, seeds=None):
        """The backward's adjoints in the order they are issued, each a
        :class:`kadj.tape_graph.ScheduleNode` (launch index, kernel name, stream,
        the launches whose events it waits on, whether it records an event, whether
        it is a barrier run on the host).  With ``wrt`` (and ``loss`` or ``seeds``),
        only the adjoints that ``backward`` with the same arguments would run.  Needs
        no GPU: on a tape of CPU launches it shows how the graph would be split."""
        return self._schedule(streams, wrt, loss, seeds)

    # -------------------------------------------------------------- gradients

    @_serialized
    def grad(self, x):
        """The gradient with respect to ``x``'s contents before the tape first saw it.

        Same shape and dtype as ``x``; a copy, so changing it does not change the tape.
        """
        if not arrays.is_array(x) or arrays.memory_key(x) not in self._arrays:
            raise DifferentiationError(
                f"The tape never saw this array ({arrays.describe(x)}); ask for the "
                "gradient of an array that recorded launches wrote or read (the same "
                "array object or an identical view).")
        if not self._has_gradients:
            raise DifferentiationError(
                "The tape has no gradients yet; call tape.backward(...) before "
                "tape.grad(...).")
        key = arrays.memory_key(x)
        if key not in self._differentiable and key not in self._grads:
            raised = self._raised.get(key)
            why = ("it is not floating point, or every kernel that reads it excludes it "
                   "with wrt=." if raised is None else
                   f"the launch of kernel '{raised[0]}' that passed it raised "
                   f"{raised[1]}, and a launch that raises is not recorded. Record the "
                   "launch again with arguments it accepts.")
            raise DifferentiationError(
                f"No recorded launch differentiates with respect to this array "
                f"({arrays.describe(x)}): {why}")
        if self._requested is not None and key not in self._requested[0]:
            raise DifferentiationError(
                f"tape.backward(..., wrt=[...]) computed only the gradients of the "
                f"arrays and scalars it listed, and not this array's "
                f"({arrays.describe(x)}); add it to wrt=, or call tape.zero() and "
                "tape.backward(...) without wrt= for every gradient.")
        if self._flag is not None:       # NumPy results wait for the device's checks
            self._raise_known(wait=arrays.kind(x) == "host")
        g = self._grads.get(key)
        shape = tuple(x.shape)
        if g is None:
            return arrays.zeros_like(x)
        if arrays.kind(g) == arrays.kind(x) and arrays.kind(g) != "host":
            return arrays.copy(g)           # stays on the device
        return arrays.like(x, arrays.to_host(g).reshape(shape).copy())

    @_serialized
    def check(self):
        """Wait for the device and raise :class:`DifferentiationError`, naming the
        array, if a recorded array was changed outside the recorded launches: the
        comparisons made so far (at each recorded launch and each ``backward``) of
        the arrays' contents with their fingerprints.  Does nothing when none failed
        or when ``check_unrecorded_changes=False``.  (See :mod:`kadj.tape_checks` for
        when the other methods raise the error without waiting.)"""
        self._check_all()

    @_serialized
    def saw(self, x):
        """Did a recorded launch read or write ``x`` (the same memory view)?"""
        return arrays.is_array(x) and arrays.memory_key(x) in self._arrays

    @_serialized
    def grad_or_none(self, x):
        """``grad(x)``, or None when no recorded launch differentiates with respect to x."""
        key = arrays.memory_key(x)
        if key not in self._arrays or (key not in self._differentiable and
                                       key not in self._grads):
            return None
        return self.grad(x)

    @_serialized
    def scalar_grads(self):
        """Gradients with respect to each launch's floating-point scalar arguments."""
        if not self._has_gradients:
            raise DifferentiationError(
                "The tape has no gradients yet; call tape.backward(...) before "
                "tape.scalar_grads().")
        self._fold_scalars()
        if self._flag is not None:
            self._raise_known(wait=True)
        return tuple(
            ScalarGrad(index, self._launches[index].plan.kernel_name,
                       self._launches[index].arg_name(i), _scalar(value))
            for (index, i), value in sorted(self._scalar_grads.items()))

    @_serialized
    def scalar_grad(self, name, kernel=None):
        """The total gradient with respect to scalar argument ``name``: the sum over
        every recorded launch (and every step of checkpointed loops) that passes it.
        ``kernel`` (a kernel or its name) chooses among kernels whose arguments share
        the name; without it, a name used by several kernels is refused."""
        if self._has_gradients and self._requested is not None and \
                name not in self._requested[1]:
            raise DifferentiationError(
                f"tape.backward(..., wrt=[...]) computed only the gradients it listed, "
                f"and not that of scalar '{name}'; add '{name}' to wrt=, or call "
                "tape.zero() and tape.backward(...) without wrt= for every gradient.")
        return tape_report.scalar_total(self.scalar_grads(), name, kernel)

    @_serialized
    def memory_report(self):
        """A :class:`kadj.tape_report.MemoryReport` of what the tape holds: snapshot
        bytes now and at peak, per array and per memory level, the number of
        launches, and for each checkpointed loop its snapshots and recomputed steps.
        ``print(tape.memory_report())`` gives a readable summary."""
        return tape_report.build(self._launches, list(self._arrays.values()),
                                 self._snapshot_bytes, self._peak_bytes, self._loops)

    @_serialized
    def zero(self):
        """Clear the gradients; the recorded launches stay."""
        self._grads = {}                 # key -> gradient buffer, where the array lives
        self._scalar_grads = {}
        self._pending_scalars = []       # (slot, device buffer) not yet read back
        self._requested = None           # (keys, scalar names) of backward(wrt=...)
        self._since_zero = False         # a backward ran since the last zero()

    @_serialized
    def reset(self):
        """Forget the recorded launches, the arrays' copies and the gradients."""
        self._launches = []
        self._arrays = {}
        self._reset_checks()             # the check for unrecorded changes
        self._snapshot_bytes = 0
        self._peak_bytes = 0
        for loop in getattr(self, "_loops", ()):
            if self._note_bytes in loop.memory_listeners:
                loop.memory_listeners.remove(self._note_bytes)
        self._loops = []                 # checkpointed loops recorded, for the report
        self._index = ArrayIndex()       # the arrays by identity and by span
        self._differentiable = set()
        self._raised = {}                # key -> (kernel, error) of a launch that raised
        self._has_gradients = False
        self.zero()

    def _note_raised(self, launch, exc):
        """A launch raised, so it is not recorded: note its arrays, for :meth:`grad`'s
        message."""
        for key in launch.keys:
            if key is not None:
                self._raised[key] = (launch.plan.kernel_name, type(exc).__name__)




def _record_on(tapes, kernel, args, config, plan, run):
    """Record one launch on ``tapes`` (their locks held) and run it unless not ``run``."""
    entered = tape_threads.entered
    if entered and not (len(tapes) == 1 and len(entered) == 1 and tapes[0] in entered) \
            and tape_threads.others_entered(tapes):
        tape_threads.check_other_threads(kernel, args, tapes)
    if len(tapes) == 1:
        return _record_one(tapes[0], kernel, args, config, plan, run)
    # every tape checks the launch before any of them changes
    pending = [tape._prepare(kernel, args, config, plan) for tape in tapes]
    prints = Prints(args)
    for tape, p in zip(tapes, pending):
        if tape.check_unrecorded_changes:
            tape._verify(p, prints)
    copies = {}
    for tape, p in zip(tapes, pending):
        tape._commit(p, copies)
    try:
        result = None if not run else kernel.forward(*args) if config is None \
            else kernel.forward(config, *args)
    except BaseException as exc:
        for tape, p in zip(tapes, pending):
            tape._note_raised(p.launch, exc)
        raise
    finally:
        for tape, p in zip(tapes, pending):
            tape._advance(p)
    prints.written(plan.written)
    for tape, p in zip(tapes, pending):
        tape._register(p)
        if tape.check_unrecorded_changes:
            tape._refresh(p, prints)
    return result


def _record_one(tape, kernel, args, config, plan, run):
    """:func:`_record_on` for one tape, step for step."""
    pending = tape._prepare(kernel, args, config, plan)
    prints = Prints(args)
    checked = tape.check_unrecorded_changes
    if checked:
        tape._verify(pending, prints)
    tape._commit(pending, {})
    try:
        result = None if not run else kernel.forward(*args) if config is None \
            else kernel.forward(config, *args)
    except BaseException as exc:
        tape._note_raised(pending.launch, exc)
        raise
    finally:
        tape._advance(pending)
    prints.written(plan.written)
    tape._register(pending)
    if checked:
        tape._refresh(pending, prints)
    return result


def custom_step(forward, adjoint, reads=(), writes=(), *, name=None, values=False):
    """Run ``forward()`` and record it, with its adjoint, on the active tape (see
    :meth:`kadj.Tape.record_custom` for the arguments); without an active tape, just
    run ``forward()``.  Inside :func:`kadj.checkpointed_loop` steps, use this rather
    than ``tape.record_custom``: the loop re-runs the step when it recomputes it."""
    step = CustomStep(forward, adjoint, reads, writes, name=name, values=values)
    tape = active()
    if tape is None:
        return step.fn()
    return tape.record(step, step.arrays)
