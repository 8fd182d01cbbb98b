"""Versions of the arrays a :class:`kadj.Tape` records: which launch read which
contents, and the copies kept for the adjoints (the fingerprints that detect
unrecorded changes are :mod:`kadj.tape_checks`).

:class:`Versions` is the part of :class:`kadj.Tape` that checks a launch against the
tape (:meth:`Versions._prepare`, which changes nothing), commits it (tracks its new
arrays, keeps the copies its adjoint or an earlier one needs) and registers it once
it ran.  Per array: every recorded write starts a new version; a version is copied
before it is overwritten when this launch or an earlier one reads it; the newest
version is the live array.  Lookups go through :class:`kadj.tape_index.ArrayIndex`,
so the cost of a launch does not grow with the number of arrays the tape has seen.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from . import arrays, tape_report
from .tape_index import ArrayIndex
from .errors import DifferentiationError

__all__ = ["Launch", "Versions"]


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


_new_launch = Launch.__new__


def make_launch(kernel, args, config, plan, index, keys, versions):
    """``Launch(...)`` without the frozen dataclass's per-field ``__setattr__`` calls
    (the same object, built in a fraction of the time)."""
    launch = _new_launch(Launch)
    launch.__dict__.update(kernel=kernel, args=args, config=config, plan=plan,
                           index=index, keys=keys, versions=versions)
    return launch


class Reader(NamedTuple):
    """A recorded launch that reads one version of an array, as argument ``arg``."""

    launch: int
    arg: int


class TrackedArray:
    """Mutable bookkeeping for one array the tape has seen."""

    __slots__ = ("array", "version", "snapshots", "readers", "fingerprint", "first",
                 "last")

    def __init__(self, array):
        self.array = array        # the live array (a reference keeps its memory)
        self.version = 0          # bumped by every recorded launch that writes it
        self.snapshots = {}       # version -> copy of the contents of that version
        self.readers = {}         # version -> [Reader]
        self.fingerprint = None   # of the newest version's contents, when checked
        self.first = None         # (launch, arg): the first recorded use
        self.last = None          # (launch, arg): the latest recorded use

    def contents(self, version):
        if version in self.snapshots:
            return self.snapshots[version]
        if version == self.version:
            return self.array
        return None


class Pending:
    """A launch checked against one tape, not yet recorded on it.

    new:     key -> array, for the arrays this launch shows the tape first.
    copies:  keys of the written arrays whose current contents must be kept.
    entries: per argument, its :class:`TrackedArray` (None for a value; for a new
             array, None until the launch is committed)."""

    __slots__ = ("launch", "new", "copies", "entries")

    def __init__(self, launch, new, copies, entries):
        self.launch, self.new, self.copies, self.entries = launch, new, copies, entries


# the types of values that are certainly not arrays and hold none
_PLAIN = frozenset([int, float, complex, bool, np.bool_, np.float16, np.float32,
                    np.float64, np.complex64, np.complex128, np.int8, np.int16, np.int32,
                    np.int64, np.uint8, np.uint16, np.uint32, np.uint64])


class Versions:
    """The array bookkeeping of :class:`kadj.Tape` (state set up by ``Tape.reset``:
    ``_arrays`` key -> :class:`TrackedArray`, ``_index``, ``_launches``, ...)."""

    def _prepare(self, kernel, args, config, plan):
        """Check the launch against this tape without changing the tape."""
        index = len(self._launches)
        new = {}
        fresh = []          # an index of ``new``'s arrays, made at the second one
        keys, entries = [], []
        for i, a in enumerate(args):
            if type(a) in _PLAIN:
                key = entry = None
            elif arrays.is_array(a):
                key, entry = self._track(plan, index, i, a, new, fresh)
            else:
                key = entry = _check_value(plan, index, i, a)
            keys.append(key)
            entries.append(entry)
        keys = tuple(keys)
        _check_aliasing(plan, index, keys)
        _check_self_overlap(plan, index, args)
        versions = tuple(None if k is None else e.version if e is not None else 0
                         for k, e in zip(keys, entries))
        launch = make_launch(kernel, args, config, plan, index, keys, versions)
        copies = []
        for i in sorted(plan.written):
            key = self._to_preserve(launch, i, entries[i])
            if key is not None:
                copies.append(key)
        return Pending(launch, new, tuple(copies), entries)

    def _track(self, plan, index, i, a, new, fresh):
        """The key of array argument ``i`` and its :class:`TrackedArray` (None for
        an array the tape has not seen: it goes in ``new``, and in the index of them
        ``fresh`` holds once there are two, so that a launch of many new arrays, the
        inputs of a checkpointed loop's steps, tests each against those it meets, not
        against every other)."""
        key, entry = self._index.find(a)
        if entry is None:
            entry = self._arrays.get(key)
        if entry is not None or key in new:
            return key, entry
        other = self._index.overlapping(a)
        if other is None and new:
            if not fresh:
                fresh.append(ArrayIndex(self._index._memo))
                for k, b in new.items():
                    fresh[0].add(k, b, None)
            other = fresh[0].overlapping(a)
        if other is not None:
            raise DifferentiationError(
                f"Launch #{index} of kernel '{plan.kernel_name}' passes argument "
                f"'{plan.arg_names[i]}' ({arrays.describe(a)}), which overlaps in "
                f"memory an array the tape has already seen "
                f"({arrays.describe(other)}) "
                "without being the same view of it. The tape tracks arrays by "
                "their exact memory view: pass the same array (or an identical "
                "view) every time, e.g. the whole array and the index of the row or "
                "column, read inside the kernel (forcing and i, not forcing[i]). A "
                "copy of the view is a new array: its gradient does not flow back "
                "to the array it was copied from.")
        new[key] = a
        if fresh:
            fresh[0].add(key, a, None)
        return key, None

    def _to_preserve(self, launch, i, tracked):
        """The key of written argument ``i`` if its pre-call contents must be kept
        (``tracked``: its :class:`TrackedArray`, None for a new array)."""
        key = launch.keys[i]
        if key is None:
            return None
        version = launch.versions[i]
        if tracked is not None and version in tracked.snapshots:
            return None
        needs = list(tracked.readers.get(version, ())) if tracked is not None else []
        if i in launch.plan.read:
            needs.append(Reader(launch.index, i))
        if not needs:
            return None
        if not self.copy_inputs:
            raise self._overwrite_error(launch, i, needs[0])
        return key

    def _overwrite_error(self, launch, i, reader):
        what = f"argument '{launch.arg_name(i)}' ({arrays.describe(launch.args[i])})"
        if reader.launch == launch.index:
            head = (f"{sentence(launch.describe())} reads and overwrites {what} "
                    "in place, and its adjoint needs the contents from before the "
                    "call.")
        else:
            earlier = self._launches[reader.launch]
            head = (f"{sentence(launch.describe())} would overwrite {what}, which "
                    f"{earlier.describe()} read as argument "
                    f"'{earlier.arg_name(reader.arg)}' and needs for its adjoint.")
        return DifferentiationError(
            head + " The tape was created with copy_inputs=False, so it keeps no "
            "copies: use kadj.Tape() to let it copy, or write into a different array.")

    # -- committing and registering
    def _commit(self, pending, copies):
        """Track the new arrays and keep the copies; ``copies`` (key -> copy) is
        shared by the tapes recording the same launch."""
        listeners = getattr(pending.launch.kernel, "memory_listeners", None)
        if listeners is not None and self._note_bytes not in listeners:
            listeners.append(self._note_bytes)
            self._loops.append(pending.launch.kernel)
        if pending.new:
            for key, a in pending.new.items():
                self._arrays[key] = entry = TrackedArray(a)
                self._index.add(key, a, entry)
            entries, keys = pending.entries, pending.launch.keys
            for i, key in enumerate(keys):
                if key is not None and entries[i] is None:
                    entries[i] = self._arrays[key]
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
        now = self._snapshot_bytes
        if self._loops:
            now += sum(loop.snapshot_bytes for loop in self._loops)
        if now > self._peak_bytes:
            self._peak_bytes = now

    def _advance(self, pending):
        """Every array the launch writes starts a new version."""
        entries = pending.entries
        done = set()
        for i in pending.launch.plan.written:
            tracked = entries[i]
            if tracked is not None and id(tracked) not in done:
                tracked.version += 1
                done.add(id(tracked))

    def _register(self, pending):
        launch, entries = pending.launch, pending.entries
        plan, index = launch.plan, launch.index
        for i, t in enumerate(entries):
            if t is not None:
                t.last = (index, i)
                if t.first is None:
                    t.first = (index, i)
        for i in plan.read:
            t = entries[i]
            if t is not None:
                readers = t.readers
                version = launch.versions[i]
                if version in readers:
                    readers[version].append(Reader(index, i))
                else:
                    readers[version] = [Reader(index, i)]
        differentiable = self._differentiable
        for i in plan.adjoint_args:
            if entries[i] is not None:
                differentiable.add(launch.keys[i])
        self._launches.append(launch)


def sentence(text):
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


def _check_self_overlap(plan, index, args):
    """Refuse a written array several of whose elements share memory (a broadcast
    view, a 0 stride), as the adjoint call does: its elements' adjoints would be
    kept apart where the memory is one."""
    for i in sorted(plan.written):
        if i < len(args) and arrays.is_array(args[i]) and \
                arrays.self_overlapping(args[i]):
            raise DifferentiationError(
                f"Launch #{index} of kernel '{plan.kernel_name}' writes argument "
                f"'{plan.arg_names[i]}' ({arrays.describe(args[i])}), several of whose "
                "elements share memory (a broadcast view or a 0 stride): each element "
                "would get its own adjoint where the memory is one. Pass a separate "
                f"array ({plan.arg_names[i]}.copy()).")


def _check_aliasing(plan, index, keys):
    """Refuse one launch passing the same array twice when it writes it."""
    for i in plan.written:
        for j, key in enumerate(keys):
            if j != i and key is not None and key == keys[i] and \
                    0 not in key[2]:     # (empty views hold nothing to alias)
                raise DifferentiationError(
                    f"Launch #{index} of kernel '{plan.kernel_name}' passes the same "
                    f"array as arguments '{plan.arg_names[min(i, j)]}' and "
                    f"'{plan.arg_names[max(i, j)]}' and writes it; the adjoint "
                    "assumes written arrays are distinct from the other arguments. "
                    "Pass a copy for one of them.")
