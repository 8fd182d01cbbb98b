"""The scalar arguments of a :func:`kadj.checkpointed_loop`'s steps, as run first.

The loop recomputes and reverses a step by calling the step function again with the
same step number.  Arrays are checked (:mod:`kadj.tape_step`), but a scalar that the
step function computes from Python state advanced at each call (a clock ``t += dt``)
would come out different on the second call, and the step would be recomputed and
reversed as another step: a wrong gradient.  :class:`ScalarLog` keeps, for the first
sweep, a digest of each step's scalar arguments (every launch's, with its position in
the step), one entry per step whose digest differs from the previous step's, so a
loop whose scalars do not change costs one entry; then every later run of the step
must give the same digest.  Scalars computed from the step number give the same
values each time, and pass.
"""
from __future__ import annotations

import numpy as np

from .errors import DifferentiationError

__all__ = ["ScalarLog", "scalars_of"]


def scalars_of(position, args, plain):
    """(position, argument index, value) of each scalar argument of a launch (the
    values of types in ``plain``; a NaN as the text "nan", equal to itself)."""
    return tuple((position, j, a if a == a else "nan") for j, a in enumerate(args)
                 if type(a) in plain)


class ScalarLog:
    """Per step of the first sweep, the digest of its scalars (stored where it
    changes), and the check of later runs against it."""

    def __init__(self):
        self.steps = np.empty(16, dtype=np.int64)
        self.digests = np.empty(16, dtype=np.int64)
        self.count = 0
        self.last_step = -1

    def done(self, i, launches, first):
        """Step ``i`` ran with ``launches``: (kernel name, scalar parts) per launch;
        ``first``: in the first sweep (noted), else checked."""
        digest = hash(tuple(parts for _, parts in launches))
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
        names = ", ".join(sorted({f"'{n}'" for n, parts in launches if parts}))
        raise DifferentiationError(
            f"checkpointed_loop: step {i} passed other scalar arguments (to {names}) "
            "when the loop ran it again than when it first ran. The loop recomputes and "
            "reverses a step by calling the step function again with the same step "
            "number, so a value the step function computes from Python state that "
            "changes at each call (a clock t += dt) would make it another step: a "
            "wrong gradient. Compute such values from the step number i (t = t0 + "
            "i * dt), or pass them in an array indexed by i inside the kernel.")
