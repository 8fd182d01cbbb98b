"""What each step of a :func:`kadj.checkpointed_loop` did when it first ran.

The loop recomputes and reverses a step by calling the step function again with the
same step number.  Arrays that are not state are checked (:mod:`kadj.tape_step`), but
a step function that decides from Python state advanced at each call (a clock ``t +=
dt``, a flag flipped at every call) or changed after the loop ran (a setting read by
the step) would, on the second call, pass other scalars, hand the state arrays to its
launches in other places, or return the next state in another order: the step would
be recomputed and reversed as another step, a wrong gradient.  :class:`StepLog` keeps,
for the first sweep, a digest of each step: every launch's scalar arguments and the
state array (by its place in the state the step was given) at each array argument,
with the launch's position in the step, and the order of the state it returned; one entry per step whose digest differs
from the previous step's, so a loop whose steps all look alike costs one entry.  Every
later run of the step must give the same digest.  Values computed from the step number
come out the same each time, and pass.
"""
from __future__ import annotations

import numpy as np

from .errors import DifferentiationError

__all__ = ["StepLog", "launch_parts", "relative"]


def relative(given, returned):
    """The next state's arrays as positions in the state the step was given (both
    roles tuples index the loop's base arrays): ``(1, 0)`` for a swap at every step."""
    return tuple(given.index(r) for r in returned)


def launch_parts(position, args, plain, state):
    """(position, argument index, value) of each scalar argument of a launch (the
    values of types in ``plain``; a NaN as the text "nan", equal to itself), and
    (position, argument index, "state", k) of each argument that is array k of the
    state the step was given (``state``, in the order it was passed)."""
    parts = []
    for j, a in enumerate(args):
        if type(a) in plain:
            parts.append((position, j, a if a == a else "nan"))
            continue
        for k, b in enumerate(state):
            if a is b:
                parts.append((position, j, "state", k))
                break
    return tuple(parts)


class StepLog:
    """Per step of the first sweep, its digest (stored where it changes), and the
    check of later runs against it."""

    def __init__(self):
        self.steps = np.empty(16, dtype=np.int64)
        self.digests = np.empty(16, dtype=np.int64)
        self.count = 0
        self.last_step = -1

    def done(self, i, launches, roles, first):
        """Step ``i`` ran ``launches`` ((kernel name, :func:`launch_parts`) each) and
        returned the state in ``roles``; ``first``: in the first sweep (noted), else
        checked."""
        digest = hash((tuple(parts for _, parts in launches), roles))
        if first and i > self.last_step:
            self.last_step = i
            if self.count == 0 or self.digests[self.count - 1] != digest:
                if self.count == len(self.steps):
                    self.steps = np.resize(self.steps, 2 * self.count)
                    self.digests = np.resize(self.digests, 2 * self.count)
                self.steps[self.count] = i
                self.digests[self.count] = digest
                self.count += 1
            return
        at = int(np.searchsorted(self.steps[:self.count], i, side="right")) - 1
        if at < 0 or self.digests[at] == digest:
            return
        names = ", ".join(sorted({f"'{n}'" for n, _ in launches})) or "no kernel"
        raise DifferentiationError(
            f"checkpointed_loop: step {i} did not do what it did when it first ran "
            f"(launches of {names}: other scalar arguments, the state arrays in other "
            "places, or the next state returned in another order). The loop recomputes "
            "and reverses a step by calling the step function again with the same step "
            "number, so what the step does must follow from the step number i and the "
            "state: a value computed from Python state that changes at each call (a "
            "clock t += dt, a flag flipped at every call) or a setting changed after "
            "the loop ran would make it another step, a wrong gradient. Compute such "
            "values from i (t = t0 + i * dt, the buffers by the parity of i), or pass "
            "them in an array indexed by i inside the kernel.")
