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
configuration and replayed as ``k.adjoint[grid, block, ...]``; their arrays may be
of any kind :mod:`kadj.arrays` accepts (NumPy, numba device, CuPy arrays), and the
tape's copies and adjoint buffers live where each array lives (``tape.grad(x)`` is of
the same kind as ``x``).

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
unrecorded change would give, the tape keeps a fingerprint (:mod:`kadj.fingerprint`)
of each tracked array's newest contents, taken when a recorded launch writes it or
first sees it, compares it at the next launch that passes the array and at
``backward``, and ``backward`` then raises :class:`DifferentiationError` naming the
array.  Device arrays other than the simulator's are not checked;
``Tape(check_unrecorded_changes=False)`` turns the check off.

Limitations.  Arrays that overlap in memory without being the same view are refused.  A value returned by a recorded
launch cannot be seeded (write it into an array instead).
"""
from __future__ import annotations

import functools
import itertools
import threading
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import numpy as np

from . import arrays
from . import tape_report
from .custom import CustomStep
from .fingerprint import fingerprint
from .errors import DifferentiationError, InternalError

__all__ = ["Launch", "ScalarGrad", "Tape", "TapeError", "active", "check_unrecorded"]


class TapeError(DifferentiationError):
    """A tape used in a way that would lose launches: entered twice, entered in two
    threads at once, or an array it recorded touched by a launch it cannot see."""


_local = threading.local()         # .stack: the tapes active in this thread, in order
_registry_lock = threading.Lock()
_entered = {}                      # every active tape in the process -> its thread
_serials = itertools.count()       # a total order of tapes, to take their locks in


def _stack():
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def active():
    """The innermost active :class:`Tape` of this thread, or None."""
    stack = _stack()
    return stack[-1] if stack else None


@contextmanager
def swapped_stack(tapes):
    """Make ``tapes`` (objects with ``record``) this thread's active tapes for a while:
    :func:`kadj.checkpointed_loop` runs steps unrecorded by the tapes around it."""
    saved = _stack()
    _local.stack = list(tapes)
    try:
        yield
    finally:
        _local.stack = saved


def check_unrecorded(kernel, args):
    """Refuse an unrecorded launch that a tape active in another thread would miss.

    Called by a differentiated kernel launched while no tape is active in its
    thread: raises :class:`TapeError` when an array argument is (or overlaps) an
    array that a tape active in another thread has recorded.  Costs nothing while no
    tape is active anywhere.
    """
    if _entered:
        _check_other_threads(kernel, tuple(args), ())


def _check_other_threads(kernel, args, recording):
    """Refuse the launch if it touches an array recorded by an active tape that is
    not among ``recording`` (the tapes this launch is recorded on)."""
    here = threading.current_thread()
    with _registry_lock:
        for tape in [t for t, thread in _entered.items() if not thread.is_alive()]:
            del _entered[tape]   # entered by a thread that ended without leaving it
        others = [(t, thread) for t, thread in _entered.items()
                  if thread is not here and all(t is not r for r in recording)]
    for tape, owner in others:
        keys, seen = tape._seen
        if not keys:
            continue
        for i, arg in enumerate(args):
            for a in arrays.arrays_in(arg):
                if arrays.memory_key(a) in keys or any(_overlaps(a, b) for b in seen):
                    raise _unseen_launch_error(kernel, i, a, owner, here)


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


def _serialized(method):
    """Run a :class:`Tape` method under the tape's lock."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


def _recording(tape):
    """The tapes a launch recorded on ``tape`` goes on: ``tape`` and every tape
    active in the calling thread, in a fixed order (the order their locks are
    taken in, so that two threads never wait on each other)."""
    tapes = list(_stack())
    if all(t is not tape for t in tapes):
        tapes.append(tape)
    tapes.sort(key=lambda t: t._serial)
    return tapes


@dataclass(frozen=True)
class Launch:
    """One recorded launch.

    kernel:    the differentiated kernel.
    args:      the arguments as passed (arrays by reference, scalars by value).
    config:    the launch configuration (grid, block, stream); None on the CPU.
    plan:      the kernel's adjoint plan for these arguments.
    index:     position on the tape, from 0.
    keys:      per argument, the tracked array's key, or None for a scalar.
    versions:  per argument, the array's version before the call, or None.
    """

    kernel: object
    args: tuple
    config: object = None
    plan: object = field(default=None, kw_only=True)
    index: int = field(default=0, kw_only=True)
    keys: tuple = field(default=(), kw_only=True)
    versions: tuple = field(default=(), kw_only=True)

    def describe(self):
        return f"launch #{self.index} (kernel '{self.plan.kernel_name}')"

    def arg_name(self, i):
        return self.plan.arg_names[i]


@dataclass(frozen=True)
class ScalarGrad:
    """The gradient with respect to one scalar argument of one launch."""

    launch: int
    kernel_name: str
    arg_name: str
    value: float


@dataclass(frozen=True)
class _Reader:
    """A recorded launch that reads one version of an array, as argument ``arg``."""

    launch: int
    arg: int


class _TrackedArray:
    """Mutable bookkeeping for one array the tape has seen."""

    __slots__ = ("array", "version", "snapshots", "readers", "fingerprint", "first",
                 "last")

    def __init__(self, array):
        self.array = array        # the live array (a reference keeps its memory)
        self.version = 0          # bumped by every recorded launch that writes it
        self.snapshots = {}       # version -> copy of the contents of that version
        self.readers = {}         # version -> [_Reader]
        self.fingerprint = None   # of the newest version's contents, when checked
        self.first = None         # (launch, arg): the first recorded use
        self.last = None          # (launch, arg): the latest recorded use

    def contents(self, version):
        if version in self.snapshots:
            return self.snapshots[version]
        if version == self.version:
            return self.array
        return None


@dataclass(frozen=True)
class _Pending:
    """A launch checked against one tape, not yet recorded on it.

    new:    key -> array, for the arrays this launch shows the tape first.
    copies: keys of the written arrays whose current contents must be kept."""

    launch: Launch
    new: dict
    copies: tuple


class Tape:
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
    to recorded arrays outside recorded launches (about 50 us per MB of array
    arguments per launch, and per MB of tracked arrays at ``backward``).
    """

    def __init__(self, *, copy_inputs=True, check_unrecorded_changes=True):
        self.copy_inputs = bool(copy_inputs)
        self.check_unrecorded_changes = bool(check_unrecorded_changes)
        self._lock = threading.RLock()
        self._serial = next(_serials)
        self.reset()

    # ------------------------------------------------------------- activation

    def __enter__(self):
        here = threading.current_thread()
        with _registry_lock:
            owner = _entered.get(self)
            if owner is not None and owner.is_alive():
                raise self._entered_error(owner, here)
            _entered[self] = here
        _stack().append(self)
        return self

    def __exit__(self, *exc_info):
        stack = _stack()
        with _registry_lock:
            if _entered.get(self) is threading.current_thread():
                del _entered[self]
        innermost = bool(stack) and stack[-1] is self
        for j in range(len(stack) - 1, -1, -1):
            if stack[j] is self:
                del stack[j]
                break
        else:
            raise TapeError(
                "This tape is not active in this thread, so it cannot be exited "
                "here; leave a tape in the thread that entered it.")
        if not innermost:
            raise TapeError(
                "Tapes were exited in a different order than they were entered; "
                "nest 'with tape:' blocks instead of calling __enter__ and __exit__.")
        return False

    @staticmethod
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
        plan = kernel.adjoint_plan(*args)
        tapes = _recording(self)
        with ExitStack() as held:
            for tape in tapes:
                held.enter_context(tape._lock)
            if _entered:
                _check_other_threads(kernel, args, tapes)
            # every tape checks the launch before any of them changes
            pending = [tape._prepare(kernel, args, config, plan) for tape in tapes]
            prints = _Prints(args)
            for tape, p in zip(tapes, pending):
                if tape.check_unrecorded_changes:
                    tape._verify(p.launch, prints)
            copies = {}
            for tape, p in zip(tapes, pending):
                tape._commit(p, copies)
            try:
                result = None if not run else kernel.forward(*args) if config is None \
                    else kernel.forward(config, *args)
            finally:
                for tape, p in zip(tapes, pending):
                    tape._advance(p.launch)
            prints.written(plan.written)
            for tape, p in zip(tapes, pending):
                tape._register(p.launch)
                if tape.check_unrecorded_changes:
                    tape._refresh(p.launch, prints)
        return result

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

    def _prepare(self, kernel, args, config, plan):
        """Check the launch against this tape without changing the tape."""
        index = len(self._launches)
        new = {}
        keys = tuple(self._track(plan, index, i, a, new) if arrays.is_array(a)
                     else _check_value(plan, index, i, a) for i, a in enumerate(args))
        _check_aliasing(plan, index, keys)
        versions = tuple(None if k is None else
                         (self._arrays[k].version if k in self._arrays else 0)
                         for k in keys)
        launch = Launch(kernel, args, config, plan=plan, index=index, keys=keys,
                        versions=versions)
        copies = tuple(key for key in (self._to_preserve(launch, i)
                                       for i in sorted(plan.written))
                       if key is not None)
        return _Pending(launch, new, copies)

    def _track(self, plan, index, i, a, new):
        """The key of array argument ``i``; one the tape has not seen goes in ``new``."""
        key = arrays.memory_key(a)
        if key in self._arrays or key in new:
            return key
        for other in [t.array for t in self._arrays.values()] + list(new.values()):
            if _overlaps(a, other):
                raise DifferentiationError(
                    f"Launch #{index} of kernel '{plan.kernel_name}' passes argument "
                    f"'{plan.arg_names[i]}' ({arrays.describe(a)}), which overlaps in "
                    f"memory an array the tape has already seen "
                    f"({arrays.describe(other)}) "
                    "without being the same view of it. The tape tracks arrays by "
                    "their exact memory view: pass the same array (or an identical "
                    "view) every time, or copy the view before the launch.")
        new[key] = a
        return key

    def _to_preserve(self, launch, i):
        """The key of written argument ``i`` if its pre-call contents must be kept."""
        key = launch.keys[i]
        if key is None:
            return None
        tracked = self._arrays.get(key)
        version = launch.versions[i]
        if tracked is not None and version in tracked.snapshots:
            return None
        needs = list(tracked.readers.get(version, ())) if tracked is not None else []
        if i in launch.plan.read:
            needs.append(_Reader(launch.index, i))
        if not needs:
            return None
        if not self.copy_inputs:
            raise self._overwrite_error(launch, i, needs[0])
        return key

    def _verify(self, launch, prints):
        """Compare the launch's tracked arrays with their fingerprints; note the first
        change made outside recorded launches (``backward`` raises it)."""
        if self._unrecorded is not None:
            return
        for i, key in enumerate(launch.keys):
            tracked = self._arrays.get(key) if key is not None else None
            if tracked is not None and tracked.fingerprint is not None and \
                    prints.before(i) != tracked.fingerprint:
                self._unrecorded = self._changed_error(tracked, f"at {launch.describe()}")
                return

    def _refresh(self, launch, prints):
        """Fingerprint the newest contents of the arrays the launch wrote or showed
        the tape first."""
        for i, key in enumerate(launch.keys):
            if key is None:
                continue
            tracked = self._arrays[key]
            if i in launch.plan.written or tracked.fingerprint is None:
                tracked.fingerprint = prints.after(i)

    def _check_fingerprints(self):
        if self.check_unrecorded_changes and self._unrecorded is None:
            for tracked in self._arrays.values():
                if tracked.fingerprint is not None and \
                        fingerprint(tracked.array) != tracked.fingerprint:
                    self._unrecorded = self._changed_error(
                        tracked, "at tape.backward(), after the last recorded launch")
                    break
        if self._unrecorded is not None:
            raise self._unrecorded

    def _changed_error(self, tracked, where):
        launch = self._launches[tracked.last[0]]
        return DifferentiationError(
            f"Argument '{launch.arg_name(tracked.last[1])}' of {launch.describe()} "
            f"({arrays.describe(tracked.array)}) was changed outside the recorded "
            f"launches after that launch (detected {where}). The tape sees only "
            "recorded launches and would treat the change as the identity, giving a "
            "wrong gradient. Record the change with its adjoint, with "
            "tape.record_custom(forward, adjoint, reads=..., writes=...) "
            "(kadj.custom_step inside kadj.checkpointed_loop), or make it on a copy "
            "of the array and pass the copy to later launches; then record the "
            "sequence again.")

    def _commit(self, pending, copies):
        """Track the new arrays and keep the copies; ``copies`` (key -> copy) is
        shared by the tapes recording the same launch."""
        listeners = getattr(pending.launch.kernel, "memory_listeners", None)
        if listeners is not None and self._note_bytes not in listeners:
            listeners.append(self._note_bytes)
            self._loops.append(pending.launch.kernel)
        if pending.new:
            for key, a in pending.new.items():
                self._arrays[key] = _TrackedArray(a)
            keys, seen = self._seen
            self._seen = (keys | frozenset(pending.new),
                          seen + tuple(pending.new.values()))
        for key in pending.copies:
            tracked = self._arrays[key]
            if key not in copies:
                copies[key] = arrays.copy(tracked.array)
            tracked.snapshots[tracked.version] = copies[key]
            self._snapshot_bytes += tape_report.nbytes(copies[key])
        if pending.copies:
            self._note_bytes()

    def _note_bytes(self):
        """Update the peak of the snapshot bytes (the tape's and its loops')."""
        now = self._snapshot_bytes + sum(loop.snapshot_bytes for loop in self._loops)
        self._peak_bytes = max(self._peak_bytes, now)

    def _advance(self, launch):
        """Every array the launch writes starts a new version."""
        for key in {launch.keys[i] for i in launch.plan.written}:
            if key is not None:
                self._arrays[key].version += 1

    def _overwrite_error(self, launch, i, reader):
        what = f"argument '{launch.arg_name(i)}' ({arrays.describe(launch.args[i])})"
        if reader.launch == launch.index:
            head = (f"{_sentence(launch.describe())} reads and overwrites {what} "
                    "in place, and its adjoint needs the contents from before the "
                    "call.")
        else:
            earlier = self._launches[reader.launch]
            head = (f"{_sentence(launch.describe())} would overwrite {what}, which "
                    f"{earlier.describe()} read as argument "
                    f"'{earlier.arg_name(reader.arg)}' and needs for its adjoint.")
        return DifferentiationError(
            head + " The tape was created with copy_inputs=False, so it keeps no "
            "copies: use kadj.Tape() to let it copy, or write into a different array.")

    def _register(self, launch):
        plan = launch.plan
        for i, key in enumerate(launch.keys):
            if key is not None:
                tracked = self._arrays[key]
                tracked.last = (launch.index, i)
                if tracked.first is None:
                    tracked.first = (launch.index, i)
        for i in plan.read:
            key = launch.keys[i]
            if key is not None:
                readers = self._arrays[key].readers
                readers.setdefault(launch.versions[i], []).append(
                    _Reader(launch.index, i))
        for i in plan.adjoint_args:
            if launch.keys[i] is not None:
                self._differentiable.add(launch.keys[i])
        self._launches.append(launch)

    # --------------------------------------------------------------- backward

    @_serialized
    def backward(self, loss=None, *, seeds=None):
        """Replay the recorded adjoints in reverse and accumulate the gradients.

        ``loss`` is a recorded 1-element floating-point array, seeded with 1.0;
        ``seeds`` is a list of ``(array, cotangent)`` pairs, each cotangent the
        shape of its array.  Gradients add up over calls until :meth:`zero`.
        """
        if not self._launches:
            raise DifferentiationError(
                "The tape has recorded no launches; call kernels inside "
                "'with tape:' before calling tape.backward().")
        self._check_fingerprints()
        seeded = {}
        for key, cotangent in self._seeds(loss, seeds):
            array = self._arrays[key].array
            seeded.setdefault(key, np.zeros(tuple(array.shape), np.dtype(array.dtype)))
            seeded[key] += cotangent
        buffers = {key: arrays.like(self._arrays[key].array, host)
                   for key, host in seeded.items()}
        scalars = {}
        for launch in reversed(self._launches):
            self._replay(launch, buffers, scalars)
        for key, buffer in buffers.items():
            host = arrays.to_host(buffer)
            if key in self._grads:
                self._grads[key] = self._grads[key] + host
            else:
                self._grads[key] = host
        for slot, buffer in scalars.items():
            self._scalar_grads[slot] = self._scalar_grads.get(slot, 0.0) + buffer[0]
        self._has_gradients = True

    def _seeds(self, loss, seeds):
        if loss is None and seeds is None:
            raise DifferentiationError(
                "tape.backward() needs something to differentiate: pass a 1-element "
                "loss array, or seeds=[(array, cotangent), ...].")
        pairs = []
        if loss is not None:
            self._recorded_float_key(loss, "the loss")
            if int(np.prod(loss.shape)) != 1:
                raise DifferentiationError(
                    f"tape.backward(loss) needs a 1-element loss array, but got an "
                    f"array of shape {tuple(loss.shape)}; pass seeds=[(array, "
                    "cotangent)] to seed a larger output.")
            pairs.append((loss, np.ones(tuple(loss.shape), np.dtype(loss.dtype))))
        for pair in seeds or ():
            if len(pair) != 2:
                raise DifferentiationError(
                    "Each seed must be an (array, cotangent) pair.")
            array, cotangent = pair
            self._recorded_float_key(array, "a seeded array")
            cotangent = arrays.to_host(cotangent) if arrays.is_array(cotangent) else \
                np.asarray(cotangent)
            if tuple(cotangent.shape) != tuple(array.shape):
                raise DifferentiationError(
                    f"A seed's cotangent has shape {cotangent.shape}, but its array "
                    f"has shape {array.shape}; they must match.")
            pairs.append((array, cotangent.astype(array.dtype)))
        return [(arrays.memory_key(a), ct) for a, ct in pairs]

    def _recorded_float_key(self, array, what):
        if not arrays.is_array(array) or arrays.memory_key(array) not in self._arrays:
            raise DifferentiationError(
                f"The tape never saw {what} ({arrays.describe(array)}): seed only arrays "
                "that recorded launches wrote or read (the same array object or an "
                "identical view).")
        if np.dtype(array.dtype).kind != "f":
            raise DifferentiationError(
                f"{_sentence(what)} has dtype {array.dtype}; only floating-point "
                "arrays can be seeded.")

    def _replay(self, launch, buffers, scalars):
        plan = launch.plan
        args = tuple(self._pre_call(launch, i) for i in range(len(launch.args)))
        adjoints, extra, seen = [], [], set()
        for i in plan.adjoint_args:
            key = launch.keys[i]
            if key is None:
                buffer = np.zeros(1, dtype=np.asarray(launch.args[i]).dtype)
                scalars[(launch.index, i)] = buffer
            elif key in seen:
                # the same read-only array passed twice: its own buffer, added after
                buffer = arrays.zeros_like(buffers[key])
                extra.append((key, buffer))
            else:
                seen.add(key)
                buffer = buffers.get(key)
                if buffer is None:
                    buffer = buffers[key] = arrays.zeros_like(self._arrays[key].array)
            adjoints.append(buffer)
        kwargs = {"adj_return": 0.0} if plan.returns_value else {}
        if launch.config is None:
            launch.kernel.adjoint(*args, *adjoints, **kwargs)
        else:
            launch.kernel.adjoint[launch.config](*args, *adjoints)
        for key, buffer in extra:
            arrays.add_into(buffers[key], buffer)

    def _pre_call(self, launch, i):
        key = launch.keys[i]
        if key is None:
            return launch.args[i]
        tracked = self._arrays[key]
        contents = tracked.contents(launch.versions[i])
        if contents is not None:
            return contents
        if i not in launch.plan.read:
            return tracked.array  # the adjoint does not read it; any contents do
        raise InternalError(
            f"the tape lost the pre-call contents of argument '{launch.arg_name(i)}' "
            f"of {launch.describe()}")

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
            raise DifferentiationError(
                f"No recorded launch differentiates with respect to this array "
                f"({arrays.describe(x)}): it is not floating point, or every kernel that "
                "reads it excludes it with wrt=.")
        g = self._grads.get(key)
        shape = tuple(x.shape)
        g = np.zeros(shape, np.dtype(x.dtype)) if g is None else g.reshape(shape).copy()
        return arrays.like(x, g)

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
        return tuple(
            ScalarGrad(index, self._launches[index].plan.kernel_name,
                       self._launches[index].arg_name(i), float(value))
            for (index, i), value in sorted(self._scalar_grads.items()))

    @_serialized
    def scalar_grad(self, name, kernel=None):
        """The total gradient with respect to scalar argument ``name``: the sum over
        every recorded launch (and every step of checkpointed loops) that passes it.
        ``kernel`` (a kernel or its name) chooses among kernels whose arguments share
        the name; without it, a name used by several kernels is refused."""
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
        self._grads = {}
        self._scalar_grads = {}

    @_serialized
    def reset(self):
        """Forget the recorded launches, the arrays' copies and the gradients."""
        self._launches = []
        self._arrays = {}
        self._unrecorded = None          # the first unrecorded change detected
        self._snapshot_bytes = 0
        self._peak_bytes = 0
        for loop in getattr(self, "_loops", ()):
            if self._note_bytes in loop.memory_listeners:
                loop.memory_listeners.remove(self._note_bytes)
        self._loops = []                 # checkpointed loops recorded, for the report
        self._seen = (frozenset(), ())   # the arrays' keys and arrays, read unlocked
        self._differentiable = set()
        self._has_gradients = False
        self.zero()


# ------------------------------------------------------------------- arrays


class _Prints:
    """The fingerprints of one launch's array arguments, each computed once for all
    the tapes recording it: before the launch, and after it for the written ones."""

    def __init__(self, args):
        self.args = args
        self.pre = {}
        self.post = {}

    def before(self, i):
        if i not in self.pre:
            self.pre[i] = fingerprint(self.args[i])
            for j, a in enumerate(self.args):
                if a is self.args[i]:
                    self.pre[j] = self.pre[i]
        return self.pre[i]

    def written(self, written):
        self.changed = written

    def after(self, i):
        if i not in self.post:
            self.post[i] = fingerprint(self.args[i]) if i in self.changed \
                else self.before(i)
        return self.post[i]


def _overlaps(a, b):
    """Do ``a`` and ``b`` share memory?  An overlap the bounded test cannot rule out
    counts as one."""
    try:
        return arrays.overlap(a, b)
    except arrays.Undecided:
        return True


def _sentence(text):
    return text[:1].upper() + text[1:]


def _holds_array(a):
    return next(arrays.arrays_in(a), None) is not None


def _check_value(plan, index, i, a):
    """Refuse a non-array argument that holds arrays the tape could not track."""
    if _holds_array(a):
        raise DifferentiationError(
            f"The tape cannot record launch #{index} of kernel '{plan.kernel_name}': "
            f"argument '{plan.arg_names[i]}' is a {type(a).__name__} holding arrays, "
            "which the tape cannot track. Pass the arrays as separate arguments.")
    return None


def _check_aliasing(plan, index, keys):
    """Refuse one launch passing the same array twice when it writes it."""
    for i in plan.written:
        for j, key in enumerate(keys):
            if j != i and key is not None and key == keys[i]:
                raise DifferentiationError(
                    f"Launch #{index} of kernel '{plan.kernel_name}' passes the same "
                    f"array as arguments '{plan.arg_names[min(i, j)]}' and "
                    f"'{plan.arg_names[max(i, j)]}' and writes it; the adjoint "
                    "assumes written arrays are distinct from the other arguments. "
                    "Pass a copy for one of them.")
