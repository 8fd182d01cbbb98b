"""The steps of a :func:`kadj.checkpointed_loop`: run unrecorded, and reversed.

While the loop runs a step, a stand-in takes the place of the active tape
(:func:`kadj.tape_threads.swap_stack`): a :class:`Runner` in the forward sweeps (it
runs each launch and has the loop check and note it), a :class:`Reverser` when a step
is reversed (it records the step's launches on a private :class:`kadj.Tape`, each run
when the next one comes, the last one not run at all: a kadj adjoint recomputes its
own forward), and the loop replays that tape's adjoints (:mod:`kadj.checkpointing`).

Most steps are one launch of one differentiated kernel.  Its launch does not run, so
every array it passes holds its pre-call contents (a copy the private tape keeps of an
array the launch reads and writes equals the array, and adjoints never modify their
forward arguments), and what the tape checks of the launch (arguments that share
memory without being the same view, a written array passed twice, a value holding
arrays) depends on nothing but the arguments' memory keys
(:func:`kadj.arrays.memory_key`, which fix the elements exactly) and the launch's
plan.  :class:`StepReplay` remembers, for one backward, the launches (kernel, plan,
argument keys) that a private tape recorded and replayed once; a later step with the
same launch replays its adjoint directly: the same
:meth:`kadj.tape_backward.Backward._replay` over the same arguments and buffers,
without building a tape and checking the launch again.  A launch seen for the first
time, a step of several launches and a launch that returns a value go through the
private tape.
"""
from __future__ import annotations

import numpy as np

from . import arrays
from . import tape as _tape
from .errors import DifferentiationError
from .fingerprint import fingerprint
from .kernel import DifferentiatedKernel
from .tape_backward import Backward
from .tape_index import ArrayIndex
from .tape_threads import restore_stack, swap_stack
from .tape_versions import _PLAIN, TrackedArray, make_launch

__all__ = ["Reverser", "Runner", "StepReplay", "next_roles", "roles_of"]


def next_roles(step, i, cur, base):
    """Run ``step(i, *cur)``; return the next state as the index in ``base`` of each of
    its arrays (checked to be ``base``'s arrays, each once)."""
    out = step(i, *cur)
    roles = roles_of(out, base)
    if roles is None:
        what, remedy = _returned(out, base)
        raise DifferentiationError(
            f"The step function of checkpointed_loop returned {what} at step {i}; it "
            f"must return the next state: the {len(cur)} state arrays it was given, in "
            f"any order{remedy}.")
    return roles


def _returned(out, base):
    """(what a step returned instead of the next state, a remedy) for the message."""
    if not isinstance(out, (tuple, list)):
        return type(out).__name__, ""
    kind = type(out).__name__
    if len(out) != len(base):
        return f"a {kind} of {len(out)} values", ""
    others = [o for o in out if not any(o is b for b in base)]
    new = sum(1 for o in others if arrays.is_array(o))
    if new:
        one = new == 1
        return (f"a {kind} holding {new} new array{'' if one else 's'} (not "
                f"{'one of ' if one else ''}the state arrays it was given: "
                f"{'a copy' if one else 'copies'}, for example)",
                ". Return the given arrays themselves, having written the new values "
                "into them")
    if others:
        return f"a {kind} holding {arrays.describe(others[0])}, not a state array", ""
    return f"a {kind} holding one state array twice", ""


def roles_of(out, base):
    """The index in ``base`` of each array of ``out``; None unless ``out`` is a tuple
    or list of ``base``'s arrays, each once."""
    if not isinstance(out, (tuple, list)) or len(out) != len(base):
        return None
    roles = []
    for o in out:
        for a, b in enumerate(base):
            if b is o:
                if a in roles:
                    return None
                roles.append(a)
                break
        else:
            return None
    return tuple(roles)


class Runner:
    """Stands in for the active tape while steps run unrecorded: runs each launch,
    checks that it writes only state arrays, and notes the other arrays and the float
    scalars it reads."""

    def __init__(self, loop, state, first_run):
        self.loop, self.state = loop, state
        self.keys = None        # the state arrays' memory keys, when first needed
        self.first_run = first_run
        self.position = 0
        # first sweep: each state array's fingerprint as the launches left it, to
        # catch a change the step function makes outside them (recomputing the step
        # would replay only the launches: a wrong gradient)
        self.prints = {} if first_run else None
        self.input_prints = {} if first_run else None   # the other arrays read
        self.recent = {}        # those first read since the last check, by key
        self.step = 0
        self.launched = []      # this step's launches (kadj.step_log.launch_parts)
        self.current = ()       # the state as this step was given it

    def record(self, kernel, args, config=None):
        args = tuple(args)
        plan = self.loop.checked_plan(kernel, args, self, self.position, self.first_run)
        self.position += 1
        self.check()
        try:
            if isinstance(kernel, DifferentiatedKernel):
                # its forward is compiled code, which launches nothing kadj could record
                return kernel.forward(*args) if config is None else \
                    kernel.forward(config, *args)
            saved = swap_stack(())      # a custom step's Python runs unrecorded
            try:
                return kernel.forward(*args) if config is None else \
                    kernel.forward(config, *args)
            finally:
                restore_stack(saved)
        finally:
            self.note([args[i] for i in plan.written])

    def note(self, written=None):
        """First sweep: fingerprint the state arrays as they are now (only those among
        ``written``, the arrays a launch wrote, or a view of one: :meth:`check` has
        just compared the others, which the launch left alone)."""
        if self.prints is None:
            return
        key = self.loop.memo.key
        wrote = None if written is None else {key(a) for a in written}
        for j, a in enumerate(self.state):
            if wrote is None or key(a) in wrote or j not in self.prints:
                self.prints[j] = fingerprint(a)

    def check_inputs(self, final=False):
        """First sweep: refuse an array the steps read but do not write (a parameter:
        the loop takes it for a constant) whose contents changed since a launch first
        read it (fingerprinted then: :meth:`kadj.checkpointing._Loop._note_other`).
        At a step's start, the arrays first read in the step before (a change made
        right after the read, by the step's own Python); at the end (``final``), every
        one.  Each step costs what it read, not what the loop has read so far (a
        step reading its own row ``forcing[i]``)."""
        if self.input_prints is None:
            return
        checked = self.loop.inputs if final else self.recent
        self.recent = {}
        a = _changed(checked, self.input_prints)
        if a is not None:
            raise DifferentiationError(
                f"checkpointed_loop: an array the steps read but do not write "
                f"({arrays.describe(a)}) was changed "
                f"{'during the loop' if final else f'at or before step {self.step}'} "
                "(by Python code in the step function). The loop takes "
                "the arrays that are not its state for constants; a parameter "
                "that changes from step to step must be a state array, or be "
                "indexed by the step number inside the kernel (one array holding "
                "every step's values).")

    def check(self):
        """First sweep: refuse a state array whose contents differ from what the
        launches left (a change made by the step function's own Python)."""
        if not self.prints:
            return
        a = _changed(dict(enumerate(self.state)), self.prints)
        if a is not None:
            j = next(j for j, b in enumerate(self.state) if b is a)
            raise DifferentiationError(
                f"checkpointed_loop: state array {j} ({arrays.describe(a)}) was "
                f"changed at or after step {self.step} outside the kernels the step "
                "function launched (by Python code in the step function, between "
                "or after its launches). The loop recomputes and reverses only "
                "the launches, so it would take the change for no change: a wrong "
                "gradient. Make the change in a differentiated kernel, or launch "
                "it as kadj.custom_step(forward, adjoint, ...) with its own "
                "adjoint (docs/API.md).")


def _changed(arrays_by_key, prints):
    """The first array of ``arrays_by_key`` whose fingerprint differs from the one
    ``prints`` holds for its key (keys without one, and scalars, are skipped), or
    None."""
    for key, a in arrays_by_key.items():
        was = prints.get(key)
        if was is not None and (type(a) is np.ndarray or arrays.is_array(a)) and \
                fingerprint(a) != was:
            return a
    return None


class Reverser:
    """Stands in for the active tape while a step is reversed: records its launches on
    a private tape, each run when the next one comes, the last one not run at all."""

    def __init__(self, loop, state):
        self.loop, self.state = loop, state
        self.keys = None        # the state arrays' memory keys, when first needed
        self.inner = None       # the private tape, made at the first launch it records
        self.pending = None     # (kernel, args, config, plan): the launch not recorded
        self.position = 0
        self.launched = []      # the step's launches (kadj.step_log.launch_parts)
        self.current = ()       # the state as the step was given it

    def record(self, kernel, args, config=None):
        args = tuple(args)
        plan = self.loop.checked_plan(kernel, args, self, self.position, False)
        self.position += 1
        self.flush()
        if plan.returns_value:
            return self._record(kernel, args, config, True)
        self.pending = (kernel, args, config, plan)
        return None

    def flush(self, run=True):
        if self.pending is not None:
            kernel, args, config, _ = self.pending
            self.pending = None
            self._record(kernel, args, config, run)

    def _record(self, kernel, args, config, run):
        if self.inner is None:
            self.inner = _tape.Tape(check_unrecorded_changes=False)
            self.inner._index = ArrayIndex(self.loop.memo)  # the loop's keys, once
        # the private tape alone is active while it records
        saved = swap_stack((self.inner,))
        try:
            return self.inner.record(kernel, args, config, run=run)
        finally:
            restore_stack(saved)


class _Arrays:
    """The part of a tape that :meth:`Backward._replay` reads: ``_arrays``."""

    __slots__ = ("_arrays",)
    _replay = Backward._replay
    _pre_call_args = Backward._pre_call_args
    _pre_call = Backward._pre_call

    def __init__(self, tracked):
        self._arrays = tracked


class StepReplay:
    """One backward's one-launch steps, checked once by a private tape."""

    def __init__(self, memo):
        self.memo = memo          # the loop's :class:`kadj.arrays.KeyMemo`
        self.checked = set()      # (id(kernel), id(plan), keys) of checked launches
        self._held = []           # the kernels and plans of ``checked`` (ids kept valid)

    def signature(self, kernel, args, plan, canon=None):
        """(keys, signature) of a launch, or None when it must go through a tape (a
        kernel-like object other than a differentiated kernel, a value that may hold
        arrays).  ``canon``: {memory key: the key it stands for} (a snapshot's arrays
        reversed in place of the working state's, of the same layout)."""
        if getattr(kernel, "adjoint_trusted", None) is None:
            return None
        key = self.memo.key
        keys = []
        for a in args:
            if type(a) in _PLAIN:
                keys.append(None)
            elif arrays.is_array(a):
                k = key(a)
                keys.append(canon.get(k, k) if canon else k)
            else:
                return None
        keys = tuple(keys)
        return keys, (id(kernel), id(plan), keys)

    def note_checked(self, kernel, plan, signature):
        """A private tape recorded and replayed the launch of ``signature``."""
        if signature[1] not in self.checked:
            self.checked.add(signature[1])
            self._held.append((kernel, plan))

    def replay(self, kernel, args, config, plan, keys, buffers, scalars):
        """Run the adjoint of the launch (recorded without running, as launch 0 of a
        private tape) over ``buffers`` and ``scalars`` as that tape's replay would;
        return the launch."""
        versions, tracked = [], {}
        for k, a in zip(keys, args):
            if k is None:
                versions.append(None)
            else:
                versions.append(0)
                if k not in tracked:
                    tracked[k] = TrackedArray(a)
        launch = make_launch(kernel, args, config, plan, 0, keys, tuple(versions))
        _Arrays(tracked)._replay(launch, buffers, scalars)
        return launch
