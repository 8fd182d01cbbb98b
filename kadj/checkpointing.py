"""Bounded-memory time loops on a :class:`kadj.Tape`: :func:`checkpointed_loop`.

The forward sweep runs the steps unrecorded, keeping only the snapshots of the binomial
schedule (:mod:`kadj.schedules`).  The active tapes get two entries standing for the
loop: the *loop* itself, which reads and writes the state arrays (so the tape keeps the
initial state's contents: that copy is the schedule's snapshot of state 0), and after it
the loop's *inputs*: the other arrays and the scalars the steps read.  In the backward,
the inputs' entry runs first and hands the loop the tape's adjoint buffers of those
inputs; the loop's entry then follows the schedule: it restores snapshots into a
working copy of the state, advances unrecorded, and reverses step ``i`` by recording it
on a private tape (its last launch recorded without running: a kadj adjoint recomputes
its own forward) and replaying that tape's adjoints in reverse directly over the loop's
adjoint buffers of the state arrays and the buffers of the inputs handed over (so the
step's gradients of the inputs add into them, once per step).  How steps run and are
reversed, and the reversal of one-launch steps without a private tape once one has
checked their launch: :mod:`kadj.tape_step`.

Kinds of arrays.  The state and the inputs may be any arrays :mod:`kadj.arrays` accepts
(NumPy arrays for CPU kernels; NumPy, numba device, CuPy or simulator arrays for CUDA
kernels launched as ``k[grid, block](...)``).  Snapshots and the working state are
copies of each state array's kind on its device (:func:`kadj.arrays.copy`), restores
copy device to device, and the reversal accumulates into the tape's buffers where they
live: the loop itself moves no array to the host.
"""
from __future__ import annotations

import functools

import numpy as np

from . import arrays, schedules
from . import tape as _tape
from .fingerprint import fingerprint
from .tape_step import Reverser, Runner, StepReplay, next_roles
from .tape_threads import restore_stack, swap_stack
from .tape_report import nbytes
from .tape_versions import _PLAIN
from .kernel import DifferentiatedKernel
from .errors import DifferentiationError
from .plan import AdjointPlan
from .step_log import StepLog, launch_parts, relative

__all__ = ["checkpointed_loop"]


def checkpointed_loop(step, state, steps=None, snapshots=None, *, until=None):
    """Run ``state = step(i, *state)`` for ``i in range(steps)``; return the final state.

    With ``until`` (and ``steps=None``, or ``steps`` as a maximum), the loop's length is
    not known in advance: after step ``i`` it stops when ``until(i, *state)`` (the state
    after the step) is true.  The snapshots then follow the online schedule
    (:func:`kadj.schedules.online`): at most ``binomial_cost(n, snapshots // 2 + 1) +
    n - 1`` step executions for ``n`` steps.

    Inside an active :class:`kadj.Tape` the loop is recorded with at most ``snapshots``
    copies of the state held (the copy of the initial state counts as one; one working
    copy of the state comes on top), and the backward recomputes steps on the binomial
    (Revolve) schedule: ``t*n - C(s+t, s+1) + 1`` step executions in all, first sweep
    included.  ``step(i, *state)`` launches differentiated kernels (CPU kernels, or
    CUDA kernels as ``k[grid, block](...)``) that write only the state arrays passed to
    it and read other arrays that no launch inside the loop writes, and returns the
    next state: the same arrays, in any order.  The state arrays may be NumPy arrays or
    device arrays (numba, CuPy); the loop's copies of them stay on their device.
    """
    state = tuple(state)
    if until is None:
        if steps is None:
            raise DifferentiationError(
                "checkpointed_loop needs steps= (the number of steps) or until= (a "
                "function of (i, *state) telling when to stop).")
        # no steps: the state as it is (a length computed as 0 is a loop, not an error)
        schedules._check_args(1 if steps == 0 and isinstance(steps, int) else steps,
                              snapshots)
    else:
        if not callable(until):
            raise DifferentiationError("checkpointed_loop's until= must be callable.")
        schedules._check_args(1 if steps is None else steps, snapshots)
    if not state or not all(arrays.is_array(a) for a in state):
        raise DifferentiationError(
            "checkpointed_loop needs the state as a non-empty tuple of arrays (NumPy "
            "arrays, or device arrays for CUDA kernels); pass state=(u, v, ...).")
    for a in state:
        if arrays.kind(a) != "host" and not _contiguous(a):
            raise DifferentiationError(
                f"checkpointed_loop got a state array that is not contiguous "
                f"({arrays.describe(a)}); its snapshots are copied device to device, "
                "which needs contiguous arrays: pass a contiguous copy of the view.")
    for j, a in enumerate(state):
        if any(a is b for b in state[:j]):
            raise DifferentiationError(
                "checkpointed_loop got the same array twice in its state; pass distinct "
                "arrays.")
    outer = _tape.active()
    if outer is None or steps == 0:
        cur, i = state, 0
        while steps is None or i < steps:
            roles = next_roles(step, i, cur, cur)
            cur = tuple([cur[a] for a in roles])
            if until is not None and until(i, *cur):
                break
            i += 1
        return cur
    loop = _Loop(step, state, steps, snapshots, until)
    outer.record(loop, state)
    if loop.inputs:
        outer.record(_LoopInputs(loop), tuple(loop.inputs.values()))
    return tuple(state[a] for a in loop.final_roles)


@functools.lru_cache(maxsize=32, typed=True)
def _binomial(steps, snapshots):
    """:func:`kadj.schedules.binomial` (an immutable schedule), computed once per
    length and number of snapshots (a gradient per optimizer iteration asks for the
    same schedule every time)."""
    return schedules.binomial(steps, snapshots)


class _Loop:
    """The tape entry standing for the whole loop (a kernel-like object)."""

    __name__ = "checkpointed_loop"

    def __init__(self, step, state, steps, snapshots, until=None):
        self.step, self.n, self.k = step, steps, len(state)
        self.user, self.until, self.limit = state, until, snapshots
        self.schedule = None if until is not None else _binomial(steps, snapshots)
        self.memory_listeners = []  # the recording tapes' byte counters
        self.snapshot_bytes = 0     # bytes of self.snaps
        self.peak_bytes = 0
        self.inputs = {}            # memory key (or scalar slot name) -> array / value
        self.buffers = None         # key -> the tape's adjoint buffer, during backward
        self.snaps = {}             # step -> (copies by array index, roles)
        self.spare = None           # freed snapshots' NumPy arrays, during a backward
        self.work = None            # working copy of the state, by array index
        self.fresh = True           # snapshots still as the forward sweep left them
        self.executions = 0         # forward step executions (first sweep included)
        self.peak_snapshots = 1     # snapshots held at once, the tape's state 0 included
        self.final_roles = tuple(range(self.k))
        self.runner = None            # the Runner of the latest steps run
        self.step_log = StepLog()      # what each step did when it first ran
        self.memo = arrays.KeyMemo()  # keys of the arrays the steps launch on
        self.checked = {}             # launch key -> (kernel, plan, state), see checked_plan
        self.step_replay = None       # one-launch steps checked, during a backward
        self.replay_base = None       # key -> adjoint buffer, during a backward
        self.work_keys = None         # the working state's memory keys, then
        self.plan = AdjointPlan(
            kernel_name="checkpointed_loop",
            arg_names=tuple(f"state{j}" for j in range(self.k)),
            adjoint_args=tuple(j for j, a in enumerate(state)
                               if np.dtype(a.dtype).kind in "fc"),
            written=frozenset(range(self.k)), read=frozenset(range(self.k)),
            returns_value=False)

    # -- what the steps touch
    def checked_plan(self, kernel, args, runner, position, forward):
        """The plan of a launch of a step, checked and noted (:meth:`note_launch`).
        A launch of a differentiated kernel with the same state arrays, the same
        argument memory keys and the same scalar types as one checked before in this
        sweep (in the first sweep, at the same position in its step) is not checked
        again: the checks depend on nothing else, and noting it again would note
        nothing new (:meth:`_launch_key`)."""
        runner.launched.append((getattr(kernel, "__name__", "custom step"),
                                launch_parts(position, args, _PLAIN, runner.current)))
        key = self._launch_key(kernel, args, runner, position if forward else None)
        if key is not None:
            hit = self.checked.get(key)
            if hit is not None:
                return hit[1]
        plan = kernel.adjoint_plan(*args)
        self.note_launch(kernel, args, plan, runner, position, forward)
        if key is not None:
            self.checked[key] = (kernel, plan, runner.state)   # the ids stay valid
        return plan

    def _launch_key(self, kernel, args, runner, position):
        """What :meth:`note_launch` does with a launch depends on: the kernel, the
        state arrays (by identity), each array's memory key (elements, layout, dtype),
        each scalar's type (its value is not checked; the first sweep notes the value
        of the first launch at a position, later ones change nothing) and, in the first
        sweep, the launch's position in its step (which names its scalars); None for a
        kernel-like object other than a differentiated kernel (custom steps are new
        objects at every step) or an argument of another kind."""
        if not isinstance(kernel, DifferentiatedKernel):
            return None
        key = self.memo.key
        parts = [id(kernel), id(runner.state), position]
        for a in args:
            t = type(a)
            if t in _PLAIN:
                parts.append(t)
            elif t is np.ndarray or arrays.is_array(a):
                parts.append(key(a))
            else:
                return None
        return tuple(parts)

    def note_launch(self, kernel, args, plan, runner, position, forward=True):
        """Check a launch of a step (``runner``: the :class:`kadj.tape_step.Runner` or
        ``Reverser`` it is made on, whose ``state`` are the state arrays) and, in
        the forward sweep, note the arrays and scalars it reads."""
        name = plan.kernel_name
        state = runner.state
        for i, a in enumerate(args):
            if type(a) is not np.ndarray and not arrays.is_array(a):
                if forward and i in plan.adjoint_args:
                    slot = f"{name}[{position}].{plan.arg_names[i]}"
                    self.inputs.setdefault(slot, a)
                continue
            for b in state:
                if a is b:
                    break
            else:
                self._note_other(name, i, a, plan, runner, forward)

    def _note_other(self, name, i, a, plan, runner, forward):
        """Check (and note) array argument ``i``, not one of the state array objects."""
        key = self.memo.key(a)
        if runner.keys is None:
            runner.keys = {self.memo.key(b) for b in runner.state}
        if key in runner.keys:
            return          # an identical view of a state array
        if i in plan.written:
            raise DifferentiationError(
                f"Kernel '{name}', launched by the step function of "
                f"checkpointed_loop, writes argument '{plan.arg_names[i]}' "
                f"({arrays.describe(a)}), which is not a state array it was given. "
                "A step may write only the state arrays passed to it (return them "
                "as the next state); the other arrays it reads must stay unchanged "
                "during the loop.")
        if forward:
            if key not in self.inputs:
                self._check_input(name, plan.arg_names[i], a)
                self.inputs[key] = a
                prints = getattr(runner, "input_prints", None)
                if prints is not None:      # (the first sweep's runner)
                    prints[key] = fingerprint(a)
                    runner.recent[key] = a
        elif key not in self.inputs:
            raise DifferentiationError(
                f"Kernel '{name}' read argument '{plan.arg_names[i]}' "
                f"({arrays.describe(a)}) when checkpointed_loop ran a step again, and "
                "that array is none the steps passed when they first ran (an array the "
                "step function makes anew at each call?). The loop runs a step again "
                "by calling the step function with the same step number and takes the "
                "arrays that are not its state for constants it has seen: make such an "
                "array once, before the loop (all steps' values in one array indexed "
                "by the step number inside the kernel), or pass a scalar computed from "
                "the step number.")

    def _check_input(self, name, arg, a):
        """Refuse an array read by a step that shares memory with a state array
        without being one (a view of it): the loop would take it for a constant."""
        for b in self.user:
            try:
                hit = arrays.overlap(a, b)
            except arrays.Undecided:
                hit = True
            if hit:
                raise DifferentiationError(
                    f"Kernel '{name}', launched by the step function of "
                    f"checkpointed_loop, reads argument '{arg}' "
                    f"({arrays.describe(a)}), which overlaps in memory the state array "
                    f"{arrays.describe(b)} without being it (a view of it). The loop "
                    "takes arrays that are not state arrays for constants, but this one "
                    "changes with the state. Pass the state arrays themselves to the "
                    "kernels (index them inside the kernel), or make the view a state "
                    "array of its own.")

    # -- kernel-like interface for the tape
    def adjoint_plan(self, *args):
        return self.plan

    def forward(self, *state):
        if self.schedule is None:
            self._online(state)
        else:
            self._sweep(state, observe=True)
        if self.runner is not None:
            self.runner.check()     # (the last step's Python after its launches)
            self.runner.check_inputs(final=True)
        self.memo.clear()
        self.checked.clear()
        self.runner = None

    def _online(self, base):
        """The first forward sweep of a loop of unknown length."""
        online = schedules.online(self.limit)
        roles, i = tuple(range(self.k)), 0
        while self.n is None or i < self.n:
            for act in online.step():
                if act[0] == schedules.STORE and act[1] != 0:
                    self._store(act[1], base, roles)
                elif act[0] == schedules.FREE:
                    self._free(act[1])
                elif act[0] == schedules.ADVANCE:
                    roles = self._run(i, base, roles, True)
            if self.until(i, *(base[a] for a in roles)):
                break
            i += 1
        if self.runner is not None:
            self.runner.check()     # (the last step's Python after its launches)
            self.runner.check_inputs(final=True)
        self.schedule = online.finish()
        self.n = self.schedule.steps
        self.final_roles = self.work_roles = roles
        self.work = tuple(arrays.copy(a) for a in base)
        self.memo.clear()
        self.checked.clear()
        self.runner = None

    def _free(self, i):
        snap = self.snaps.pop(i, None)
        if snap is not None:
            self.snapshot_bytes -= sum(nbytes(a) for a in snap[0])
            self._note()
            if self.spare is not None:
                self.spare.extend(a for a in snap[0] if type(a) is np.ndarray)

    def _copy(self, a):
        """A copy of state array ``a`` for a snapshot: into a NumPy array a freed
        snapshot left (same shape, strides and dtype) during a backward, where the
        binomial schedule stores and frees snapshots again and again, else a new one
        (:func:`kadj.arrays.copy`).  The spare arrays never outnumber the snapshots
        freed, so the memory held stays within the peak the loop reports."""
        spare = self.spare
        if spare and type(a) is np.ndarray:
            for j, b in enumerate(spare):
                if b.shape == a.shape and b.strides == a.strides and b.dtype == a.dtype:
                    del spare[j]
                    np.copyto(b, a)
                    return b
        return arrays.copy(a)

    def _note(self):
        self.peak_bytes = max(self.peak_bytes, self.snapshot_bytes)
        for listener in self.memory_listeners:
            listener()

    def report(self):
        from .tape_report import LoopReport
        return LoopReport(
            steps=self.n or 0, snapshot_limit=self.limit,
            snapshots_now=len(self.snaps) + 1, peak_snapshots=self.peak_snapshots,
            snapshot_bytes=self.snapshot_bytes, peak_snapshot_bytes=self.peak_bytes,
            working_bytes=sum(nbytes(a) for a in self.work or ()),
            forward_executions=self.executions,
            recomputed_steps=max(0, self.executions - (self.n or 0)))

    def _sweep(self, base, observe):
        """The forward sweep on ``base`` (arrays by index), from state 0."""
        roles = tuple(range(self.k))
        for act in self.schedule.forward:
            kind = act[0]
            if kind == schedules.STORE and act[1] != 0:   # the tape keeps state 0
                self._store(act[1], base, roles)
            elif kind == schedules.FREE:
                self._free(act[1])
            elif kind == schedules.ADVANCE:
                for i in range(act[1], act[2]):
                    roles = self._run(i, base, roles, observe)
            elif kind == schedules.LAST:
                if self.work is None:
                    self.work = tuple(arrays.copy(a) for a in base)
                elif base is not self.work:
                    for w, a in zip(self.work, base):
                        arrays.copy_into(w, a)
                self.work_roles = roles
                if observe:
                    self.final_roles = self._run(act[1], base, roles, observe)

    def _store(self, i, base, roles):
        self.snaps[i] = (tuple(self._copy(a) for a in base), roles)
        self.snapshot_bytes += sum(nbytes(a) for a in self.snaps[i][0])
        self.peak_snapshots = max(self.peak_snapshots, len(self.snaps) + 1)
        self._note()

    def _run(self, i, base, roles, observe):
        cur = tuple([base[a] for a in roles])
        runner = self.runner
        if runner is None or runner.state is not base or runner.first_run != observe:
            runner = self.runner = Runner(self, base, observe)
        runner.position = 0
        runner.launched, runner.current = [], cur
        if observe:   # (the first sweep: a change the step makes outside its launches)
            runner.check()
            runner.step = i
            runner.check_inputs()
            if not runner.prints:
                runner.note()
        saved = swap_stack((runner,))
        try:
            out = next_roles(self.step, i, cur, base)
        finally:
            restore_stack(saved)
        self.step_log.done(i, runner.launched, relative(roles, out), observe)
        self.executions += 1
        return out

    def adjoint(self, *args):
        initial, adjoints = args[:self.k], args[self.k:]
        adj = dict(zip(self.plan.adjoint_args, adjoints))
        buffers, self.buffers = self.buffers, None
        if self.inputs and buffers is None:
            raise DifferentiationError(
                "The tape ran the adjoint of checkpointed_loop without that of its "
                "inputs; replay the whole tape with tape.backward().")
        self.spare = []
        try:
            self._backward(initial, adj, buffers)
        finally:
            self.spare = None

    def _backward(self, initial, adj, buffers):
        if not self.fresh:     # a second backward: redo the forward sweep first
            for w, a in zip(self.work, initial):
                arrays.copy_into(w, a)
            for i in list(self.snaps):
                self._free(i)
            self._sweep(self.work, observe=False)
        self.fresh = False
        self.step_replay = StepReplay(self.memo)
        # the buffers each reversal starts from: the tape's of the inputs and the
        # loop's of the working state, by memory key
        key = self.memo.key
        self.work_keys = {key(w) for w in self.work}
        self.replay_base = {k: b for k, b in (buffers or {}).items()
                            if not isinstance(k, str)}
        self.replay_base.update({key(self.work[a]): adj[a] for a in adj})
        roles = self.work_roles
        totals = {}            # scalar slot -> its gradient summed over the steps
        acts = self.schedule.backward
        skip = 0
        for at, act in enumerate(acts):
            if skip:
                skip -= 1
                continue
            kind, i = act[0], act[1]
            if kind == schedules.RESTORE and i != 0 and _reversed_then_freed(acts, at):
                canon = self._as_work(self.snaps[i][0])
                if canon is not None:
                    # restore i, reverse i, free i, then a restore: step i is reversed
                    # on the snapshot itself, not on a copy of it in the working state
                    # (which the next restore overwrites anyway)
                    snap, snap_roles = self.snaps[i]
                    self._reverse(i, snap_roles, buffers or {}, totals, (snap, canon))
                    self._free(i)
                    skip = 2
                    continue
            if kind == schedules.RESTORE:
                copies, roles = (initial, tuple(range(self.k))) if i == 0 else self.snaps[i]
                for w, a in zip(self.work, copies):
                    arrays.copy_into(w, a)
            elif kind == schedules.STORE:
                self._store(i, self.work, roles)
            elif kind == schedules.FREE:
                self._free(i)
            elif kind == schedules.ADVANCE:
                for j in range(i, act[2]):
                    roles = self._run(j, self.work, roles, observe=False)
            elif kind == schedules.REVERSE:
                self._reverse(i, roles, buffers or {}, totals)
        for slot, total in totals.items():
            _add_scalar(buffers[slot], total)
        for i in list(self.snaps):
            self._free(i)
        self.memo.clear()
        self.checked.clear()
        self.runner = None
        self.step_replay = self.replay_base = self.work_keys = None

    def _as_work(self, snap):
        """{memory key of each array of ``snap``: the key of the working state's array
        at its index}, when each has the working array's kind, shape, strides and
        dtype (a launch on them is checked as the same launch on the working state);
        else None."""
        key = self.memo.key
        canon = {}
        for b, w in zip(snap, self.work):
            kb, kw = key(b), key(w)
            if kb[0] != kw[0] or kb[2:] != kw[2:]:
                return None
            canon[kb] = kw
        return canon

    def _reverse(self, i, roles, buffers, totals, snapshot=None):
        """Reverse step ``i`` (the working state holds state ``i`` in ``roles``):
        record it on a private tape and replay that tape's adjoints over
        ``replay_base`` (the loop's adjoint buffers of the state and the tape's of the
        inputs, by memory key); ``buffers``: the tape's buffers of the inputs, by
        memory key or scalar slot.  Add its scalar
        gradients into ``totals`` (by slot, kept where the replay put them: on the
        device for launches on device arrays).  A step of one launch that a private
        tape already checked in this backward is replayed without one
        (:mod:`kadj.tape_step`).  ``snapshot``: (state arrays holding state ``i``
        other than the working state, {their memory keys: the working arrays'}), a
        snapshot about to be freed; its arrays stand for the working state's, in the
        adjoint buffers and in the launches a private tape checked."""
        # buffers of arrays not in replay_base are made by the replay and dropped
        replay_buffers = dict(self.replay_base)
        base, keys, canon = self.work, self.work_keys, None
        if snapshot is not None:
            base, canon = snapshot
            keys = set(canon)
            replay_buffers.update({k: self.replay_base[w] for k, w in canon.items()
                                   if w in self.replay_base})
        cur = tuple([base[a] for a in roles])
        reverser = Reverser(self, base)
        reverser.keys, reverser.current = keys, cur
        saved = swap_stack((reverser,))
        try:
            out = next_roles(self.step, i, cur, base)
        finally:
            restore_stack(saved)
        self.step_log.done(i, reverser.launched, relative(roles, out), False)
        scalars = {}
        steps = self.step_replay
        one = reverser.pending if reverser.inner is None else None
        sig = None if one is None else steps.signature(one[0], one[1], one[3], canon)
        if sig is not None and sig[1] in steps.checked:
            # a one-launch step whose launch a private tape checked in this backward
            reverser.pending = None
            launches = [steps.replay(one[0], one[1], one[2], one[3], sig[0],
                                     replay_buffers, scalars)]
        else:
            reverser.flush(run=False)
            if reverser.inner is None:
                return
            launches = reverser.inner._launches
            _replay_into(reverser.inner, launches, replay_buffers, scalars)
            if sig is not None:
                steps.note_checked(one[0], one[3], sig)
        for (index, j), value in scalars.items():
            launch = launches[index]
            slot = f"{launch.plan.kernel_name}[{index}].{launch.arg_name(j)}"
            if slot not in buffers:
                continue
            if slot in totals:
                arrays.add_into(totals[slot], value)
            else:
                totals[slot] = value


def _reversed_then_freed(acts, at):
    """Is ``acts[at]`` (a restore) followed by the reversal of its step and the freeing
    of its snapshot, and then by nothing or a restore?"""
    i = acts[at][1]
    return at + 2 < len(acts) and acts[at + 1][:2] == (schedules.REVERSE, i) and \
        acts[at + 2][:2] == (schedules.FREE, i) and \
        (at + 3 == len(acts) or acts[at + 3][0] == schedules.RESTORE)


def _add_scalar(buffer, total):
    """Add a scalar slot's total (a 1-element array of any kind) into the tape's
    1-element buffer: where the buffer lives when both live in the same place, else
    through the host, once per slot and backward."""
    if arrays.kind(buffer) == arrays.kind(total) and \
            np.dtype(buffer.dtype) == np.dtype(total.dtype):
        arrays.add_into(buffer, total)
    else:
        buffer[0] += arrays.to_host(total)[0]


def _replay_into(inner, launches, buffers, scalars):
    """Replay the adjoints of ``inner``'s ``launches`` in reverse over ``buffers``
    (memory key -> adjoint buffer, updated in place where each array lives; buffers
    of arrays not in it are made and dropped) and ``scalars`` ((launch, argument) ->
    1-element buffer, filled in)."""
    with inner._lock:
        for launch in reversed(launches):
            inner._replay(launch, buffers, scalars)


def _contiguous(a):
    """Is ``a`` C- or F-contiguous (any kind)?"""
    _, _, shape, strides, dtype = arrays.memory_key(a)
    item = np.dtype(dtype).itemsize

    def dense(shape, strides):
        want = item
        for n, st in zip(reversed(shape), reversed(strides)):
            if n > 1 and st != want:
                return False
            want *= n
        return True
    return dense(shape, strides) or dense(shape[::-1], strides[::-1])


class _LoopInputs:
    """The tape entry for the arrays and scalars the loop's steps read (recorded after
    the loop, so its adjoint runs first and hands the loop the adjoint buffers)."""

    __name__ = "checkpointed_loop"

    def __init__(self, loop):
        self.loop = loop
        self.keys = tuple(loop.inputs)
        values = tuple(loop.inputs.values())
        names = tuple(k if isinstance(k, str) else f"input{j}"
                      for j, k in enumerate(self.keys))
        self.plan = AdjointPlan(
            kernel_name="checkpointed_loop", arg_names=names,
            adjoint_args=tuple(j for j, v in enumerate(values) if _is_float(v)),
            written=frozenset(),
            read=frozenset(j for j, v in enumerate(values) if arrays.is_array(v)),
            returns_value=False)

    def adjoint_plan(self, *args):
        return self.plan

    def forward(self, *args):
        return None

    def adjoint(self, *args):
        n = len(self.keys)
        values, adjoints = args[:n], args[n:]
        for j, key in enumerate(self.keys):
            live = self.loop.inputs[key]
            if arrays.is_array(live) and arrays.memory_key(values[j]) != key:
                raise DifferentiationError(
                    f"An array read by the steps of checkpointed_loop "
                    f"({arrays.describe(live)}) was overwritten by a later recorded "
                    "launch; the loop recomputes its steps from the live arrays, so "
                    "their gradient would be wrong. Write into a different array after "
                    "the loop.")
        self.loop.buffers = {self.keys[j]: b
                             for j, b in zip(self.plan.adjoint_args, adjoints)}


def _is_float(v):
    """Floating point or complex (what kernels differentiate)."""
    if arrays.is_array(v):
        return np.dtype(v.dtype).kind in "fc"
    return isinstance(v, (float, complex, np.floating, np.complexfloating))
