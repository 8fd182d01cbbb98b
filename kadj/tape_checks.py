"""The check of a :class:`kadj.Tape` for changes made to recorded arrays outside
recorded launches (``Tape(check_unrecorded_changes=True)``, the default).

The tape keeps a fingerprint (:mod:`kadj.fingerprint`) of each tracked array's newest
contents, taken when a recorded launch writes it or first sees it, and compares it
with the array's contents before every later launch that passes the array and, for
every tracked array, at ``backward``.  A mismatch means a change the tape did not see,
which it would treat as the identity: a wrong gradient.

Host arrays (NumPy, and the CUDA simulator's arrays) are fingerprinted and compared
on the host, at once; the first change found is noted and ``backward`` raises
:class:`DifferentiationError` naming the array, before it runs anything.

Device arrays (numba device arrays, CuPy arrays) are fingerprinted and compared on
their device, on the default stream, so that recording a launch and ``backward``
never copy to the host nor wait for the device.  Each fingerprint stays on the device
(:func:`kadj.fingerprint.device_print`); each comparison is a tiny kernel that, on a
mismatch, raises the tape's device flag (:class:`kadj.device_ops.ChangeFlag`) with the
comparison's number, and the host keeps, per number, the array, the launch that last
used it and where the comparison was made.  At the end of ``backward`` a kernel per
device gradient buffer (scalar gradients included) fills it with NaN when the flag is
raised, and a last kernel copies the flag to mapped host memory, followed by an event.
The rule, then: a gradient of a device array is either right, or NaN (never a
plausible wrong number), and the named error is raised as soon as the host can see
the flag without waiting:

- ``tape.grad(x)`` / ``grad_or_none`` of a device array raise it when the backward's
  event has completed (``event.query()``), and otherwise return the gradient, which
  the device fills with NaN first if an array was changed;
- ``tape.grad(x)`` of a NumPy array, ``tape.scalar_grads()`` and ``scalar_grad`` (which
  hand results to the host and wait anyway) wait for the event and raise it;
- ``tape.check()`` waits for every comparison enqueued so far and raises it;
- the next ``tape.backward()`` raises it (before running anything) when the previous
  backward's event has completed.

Recording a launch never raises it (a change seen at a launch is raised by the calls
above), and leaving the ``with`` block does not wait.  Once raised, the error is
raised again by each of these calls until ``tape.reset()``.

In the CUDA simulator, whose arrays are host memory, the tape fingerprints them on the
host, unless :data:`SIMULATOR_ON_DEVICE` is set (the tests of the device path do).
"""
from __future__ import annotations

import numpy as np

from . import arrays
from .errors import DifferentiationError
from .fingerprint import device_print, fingerprint

__all__ = ["Checks", "DevicePrint", "Prints", "SIMULATOR_ON_DEVICE"]

SIMULATOR_ON_DEVICE = False     # fingerprint simulator arrays with the device kernels


class DevicePrint:
    """A fingerprint kept on the device: ``buffer``, two uint64 being computed there."""

    __slots__ = ("buffer",)

    def __init__(self, a):
        self.buffer = device_print(a)


def take(a):
    """The fingerprint of ``a`` (a host tuple, a :class:`DevicePrint`, or None)."""
    if type(a) is np.ndarray:
        return fingerprint(a)
    k = arrays.kind(a)
    if k == "device" or k == "cupy" or (k == "simulator" and SIMULATOR_ON_DEVICE):
        return DevicePrint(a)
    return fingerprint(a)


class Prints:
    """The fingerprints of one launch's array arguments, each computed once for all
    the tapes recording it: before the launch, and after it for the written ones."""

    __slots__ = ("args", "pre", "post", "changed", "_places")

    def __init__(self, args):
        self.args = args
        self.pre = {}
        self.post = {}
        self.changed = frozenset()
        self._places = None     # id(argument) -> its indices, when first needed

    def before(self, i):
        pre = self.pre.get(i)
        if pre is None:
            a = self.args[i]
            pre = take(a)
            if self._places is None:    # (a launch of many arrays: a loop's inputs)
                self._places = {}
                for j, b in enumerate(self.args):
                    self._places.setdefault(id(b), []).append(j)
            for j in self._places.get(id(a), (i,)):
                self.pre[j] = pre
        return pre

    def written(self, written):
        self.changed = written

    def after(self, i):
        post = self.post.get(i)
        if post is None:
            post = self.post[i] = take(self.args[i]) if i in self.changed \
                else self.before(i)
        return post


class Checks:
    """The check for unrecorded changes of :class:`kadj.Tape` (a part of the class;
    state set up by ``Tape.reset``: ``_unrecorded``, ``_flag``, ``_checks``,
    ``_published``)."""

    def _reset_checks(self):
        self._unrecorded = None          # the first unrecorded change known on the host
        self._flag = None                # the device flag, once a device array is checked
        self._checks = []                # per device comparison: (last use, array, where)
        self._published = 0              # comparisons covered by the latest publish

    def _verify(self, pending, prints):
        """Compare the launch's tracked arrays with their fingerprints: host arrays at
        once (the first change is noted; ``backward`` raises it), device arrays on
        the device."""
        if self._unrecorded is not None:
            return
        for i, tracked in enumerate(pending.entries):
            if tracked is None or tracked.fingerprint is None:
                continue
            kept, now = tracked.fingerprint, prints.before(i)
            if isinstance(kept, DevicePrint):
                if isinstance(now, DevicePrint):
                    self._compare(tracked, kept, now, f"at {pending.launch.describe()}")
            elif now != kept:
                self._unrecorded = self._changed_error(
                    tracked, f"at {pending.launch.describe()}", tracked.last)
                return

    def _refresh(self, pending, prints):
        """Fingerprint the newest contents of the arrays the launch wrote or showed
        the tape first."""
        written = pending.launch.plan.written
        for i, tracked in enumerate(pending.entries):
            if tracked is not None and (i in written or tracked.fingerprint is None):
                tracked.fingerprint = prints.after(i)

    def _compare(self, tracked, kept, now, where):
        if self._flag is None:
            from .device_ops import ChangeFlag
            self._flag = ChangeFlag()
        self._checks.append((tracked.last, tracked, where))
        self._flag.compare(kept.buffer, now.buffer, len(self._checks) - 1)

    def _check_fingerprints(self):
        """At ``backward``: compare every tracked array's newest contents with its
        fingerprint, and raise a change known on the host."""
        if self.check_unrecorded_changes and self._unrecorded is None:
            where = "at tape.backward(), after the last recorded launch"
            for tracked in self._arrays.values():
                kept = tracked.fingerprint
                if isinstance(kept, DevicePrint):
                    self._compare(tracked, kept, DevicePrint(tracked.array), where)
                elif kept is not None and fingerprint(tracked.array) != kept:
                    self._unrecorded = self._changed_error(tracked, where, tracked.last)
                    break
        self._raise_known(wait=False)

    def _finish_checks(self):
        """After ``backward``: poison the device gradients when the flag is raised, and
        publish the flag (no copy, no wait)."""
        flag = self._flag
        if flag is None:
            return
        for buffer in self._grads.values():
            if arrays.kind(buffer) != "host":
                flag.poison(buffer)
        for _, buffer in self._pending_scalars:
            flag.poison(buffer)
        self._publish()

    def _publish(self):
        self._flag.publish()
        self._published = len(self._checks)

    def _raise_known(self, wait=False):
        """Raise the first unrecorded change the host knows of: noted on the host, or
        read from the published device flag (after waiting for it with ``wait``)."""
        if self._unrecorded is None and self._flag is not None:
            number = self._flag.read(wait)
            if number is not None:
                last, tracked, where = self._checks[number]
                self._unrecorded = self._changed_error(tracked, where, last, True)
        if self._unrecorded is not None:
            raise self._unrecorded

    def _check_all(self):
        """``tape.check()``: wait for every comparison enqueued so far, and raise."""
        if self._flag is not None and (self._flag.event is None or
                                       self._published < len(self._checks)):
            self._publish()
        self._raise_known(wait=True)

    def _changed_error(self, tracked, where, last, device=False):
        launch = self._launches[last[0]]
        nan = (" The gradients of device arrays computed since were filled with NaN "
               "on the device.") if device else ""
        return DifferentiationError(
            f"Argument '{launch.arg_name(last[1])}' of {launch.describe()} "
            f"({arrays.describe(tracked.array)}) was changed outside the recorded "
            f"launches after that launch (detected {where}). The tape sees only "
            "recorded launches and would treat the change as the identity, giving a "
            "wrong gradient." + nan + " Record the change with its adjoint, with "
            "tape.record_custom(forward, adjoint, reads=..., writes=...) "
            "(kadj.custom_step inside kadj.checkpointed_loop), or make it on a copy "
            "of the array and pass the copy to later launches; then record the "
            "sequence again.")
